// python/core/profile_object.cpp — _core.Profile: the header of the profile accumplan.plan
// measures, built by typed calls and handed to the search as the object it is.
//
// What it is: the profile's header (accumplan/schema.h Profile) as Python fills it — the device,
// the module measured, the training setup (_core.Setup, _core.OptimizerGroup), the persistent
// memory, the budget in bytes, the persistent step's trials (_core.Trial, as _core.PersistentStep
// returns them), the sharded state and the gradient exchange — and `check_profile_header`, the
// plan reader's rules applied to what Python set, before any window runs.
// What it is not: the search (core.cpp's search_plan), nor Python's argument checks
// (accumplan/_args.py), which run first; no JSON text crosses here.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "accumplan/errors.h"
#include "accumplan/schema.h"
#include "accumplan/tensor_spec.h"
#include "bindings.h"

namespace py = pybind11;

namespace accumplan {

void check_profile_header(const Profile& header) {
  // The reader's rules are the one check of a profile's fields: what a plan file must hold, the
  // header Python built must hold before the search measures anything.
  profile_from_json(nlohmann::json(to_json(header)));
}

namespace {

void bind_setup(py::module_& m) {
  py::class_<OptimizerGroup>(m, "OptimizerGroup", "one parameter group of the optimizer a setup records")
      .def(py::init<>())
      .def_readwrite("lr", &OptimizerGroup::lr)
      .def_readwrite("hyperparameters", &OptimizerGroup::hyperparameters)
      .def_readwrite("flags", &OptimizerGroup::flags)
      .def_readwrite("parameter_count", &OptimizerGroup::parameter_count);
  py::class_<Setup>(m, "Setup", "what the windows trained with: optimizer, precision, loss, data specs")
      .def(py::init<>())
      .def_readwrite("optimizer", &Setup::optimizer)
      .def_readwrite("lr", &Setup::lr)
      .def_readwrite("hyperparameters", &Setup::hyperparameters)
      .def_readwrite("flags", &Setup::flags)
      .def_readwrite("param_groups", &Setup::param_groups)
      .def_readwrite("amp", &Setup::amp)
      .def_readwrite("max_grad_norm", &Setup::max_grad_norm)
      .def_readwrite("loss", &Setup::loss)
      .def_readwrite("normalization", &Setup::normalization)
      .def_readwrite("inputs", &Setup::inputs)
      .def_readwrite("target", &Setup::target)
      .def_readwrite("ignore_index", &Setup::ignore_index)
      .def_readwrite("padding_mask", &Setup::padding_mask)
      .def("set_seq_len", [](Setup& s, int64_t shortest, int64_t longest) { s.seq_len = SeqLenRange{shortest, longest}; },
           py::arg("shortest"), py::arg("longest"), "variable-length data: the lengths the (b, T) grid plans for");
}

void bind_trial(py::module_& m) {
  py::class_<Trial>(m, "Trial", "one real window the profiler ran, and what it cost")
      .def_readonly("kind", &Trial::kind)
      .def_readonly("micro_batch", &Trial::micro_batch)
      .def_readonly("fit", &Trial::fit)
      .def_readonly("peak_bytes", &Trial::peak_bytes)
      .def_readonly("seconds", &Trial::seconds)
      .def_readonly("window", &Trial::window);
}

void bind_header(py::module_& m) {
  py::class_<Profile>(m, "Profile", "the header of a profile accumplan.plan measures (accumplan/schema.h)")
      .def(py::init<>())
      .def(
          "set_device",
          [](Profile& p, const std::string& type, int index, const std::string& name, int64_t total_bytes) {
            p.device = DeviceInfo{type, index, name, total_bytes};
          },
          py::arg("type"), py::arg("index"), py::arg("name"), py::arg("total_bytes"))
      .def(
          "set_python_model",
          [](Profile& p, const std::string& class_name, int64_t parameter_count, std::vector<std::string> batch_dependent,
             bool hf_gradient_checkpointing) {
            p.model = ModelInfo{kPythonModelPrefix + class_name, "", parameter_count, std::move(batch_dependent),
                                hf_gradient_checkpointing};
          },
          py::arg("class_name"), py::arg("parameter_count"), py::arg("batch_dependent_layers"),
          py::arg("hf_gradient_checkpointing"), "the module measured in this process, by its class (no file, no SHA-256)")
      .def_readwrite("setup", &Profile::setup)
      .def_readwrite("libtorch_version", &Profile::libtorch_version)
      .def_readwrite("probe", &Profile::probe)
      .def_readwrite("budget_bytes", &Profile::budget_bytes)
      .def(
          "set_persistent",
          [](Profile& p, int64_t weights, int64_t gradients, int64_t optimizer_state) {
            p.persistent = Persistent{weights, gradients, optimizer_state};
          },
          py::arg("weights_bytes"), py::arg("gradients_bytes"), py::arg("optimizer_state_bytes"))
      .def_readwrite("trials", &Profile::trials)
      .def(
          "set_sharding",
          [](Profile& p, int64_t world_size, std::vector<int64_t> per_rank_state_bytes, int64_t measured_rank) {
            Sharding s;
            s.world_size = world_size;
            s.per_rank_state_bytes = std::move(per_rank_state_bytes);
            s.measured_rank = measured_rank;
            p.sharding = s;
          },
          py::arg("world_size"), py::arg("per_rank_state_bytes"), py::arg("measured_rank"),
          "the windows hold measured_rank's share of the optimizer state sharded over world_size ranks")
      .def_readwrite("gradient_exchange", &Profile::gradient_exchange)
      .def("check", &check_profile_header, "InputError naming the first field the plan reader would refuse");
}

}  // namespace

void bind_profile_object(py::module_& m) {
  bind_setup(m);
  bind_trial(m);
  bind_header(m);
}

}  // namespace accumplan
