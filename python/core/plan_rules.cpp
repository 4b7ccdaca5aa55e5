// python/core/plan_rules.cpp — rules the Python package asks the C++ planner for, beside the plan
// object (plan_object.cpp): the step cost's ranges and the persistent-memory step's protocol.
//
// What it is: _core.check_step_cost, the one check of a step cost's terms (accumplan/schema.h
// check_step_cost, which the plan reader and the run statistics reader call too), its message
// naming the term as Python's argument does (step_cost['per_token']); _core.PersistentStep, the profiler's protocol for the step
// before the search (accumplan/persistent_step.h): which budget each attempt runs under, each
// attempt's trial and its fit, whether persistent memory is over the budget, and the refusal when
// it does not fit even without one (accumplan.plan's _persistent reports what it measured);
// the optimizer-state sharding rules (accumplan/sharding.h): ZeroRedundancyOptimizer's partition,
// each rank's share, and what shard="auto" weighs.
// What it is not: Python's type checks (accumplan/_args.py), which run before a call reaches here.
#include <pybind11/pybind11.h>
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "accumplan/persistent_step.h"
#include "accumplan/sharding.h"
#include "accumplan/schema.h"

namespace py = pybind11;

namespace accumplan {
namespace {

// The sharding of `group_numels` over `world_size` ranks, as the profile header states it, with
// each parameter's rank (`partition`, group order) and what it frees on the largest share.
py::dict sharding_dict(const std::vector<std::vector<int64_t>>& group_numels, int64_t world_size,
                       const std::vector<int64_t>& state_bytes) {
  std::vector<int64_t> partition;
  const Sharding s = shard_state(group_numels, state_bytes, world_size, &partition);
  py::dict d;
  d["optimizer"] = true;
  d["world_size"] = s.world_size;
  d["per_rank_state_bytes"] = s.per_rank_state_bytes;
  d["measured_rank"] = s.measured_rank;
  d["partition"] = partition;
  d["freed_bytes"] = freed_state_bytes(s);
  return d;
}

void bind_sharding(py::module_& m) {
  m.def("shard_optimizer_state", &sharding_dict, py::arg("group_numels"), py::arg("world_size"), py::arg("state_bytes"),
        "{optimizer, world_size, per_rank_state_bytes, measured_rank, partition, freed_bytes}: ZeroRedundancyOptimizer's "
        "partition of the groups' parameters (each one's rank, group order), each rank's share of the state one step "
        "leaves on each parameter (state_bytes, group order), the largest share's rank and what sharding frees there");
  m.def("state_layout",
        [](int64_t one, int64_t two) {
          const StateLayout l = state_layout(one, two);
          return std::make_pair(l.bytes_per_element, l.bytes_per_parameter);
        },
        py::arg("state_bytes_one_element"), py::arg("state_bytes_two_elements"),
        "(bytes per element, bytes per parameter) of the state one step left on parameters of one and two elements");
  m.def("predicted_peak_of_rank", &predicted_peak_of_rank, py::arg("plan"), py::arg("rank"),
        "the peak the plan predicts on this rank: its own where the ranks differ, a sharded plan's per_rank_peak_bytes, "
        "otherwise memory.predicted_peak_bytes");
  m.attr("SHARD_MODES") = py::tuple(py::cast(shard_mode_names()));
  m.def("check_shard_mode", [](const std::string& shard, int64_t world_size) { parse_shard_mode(shard, world_size); },
        py::arg("shard"), py::arg("world_size"), "InputError naming a shard mode that is not one, or one without ranks");
  m.def(
      "plan_auto_sharding",
      [](const py::function& unsharded, const py::function& sharded, int64_t world_size, int64_t freed_bytes,
         const py::object& progress) {
        std::function<void(const std::string&)> say;
        if (!progress.is_none()) say = [progress](const std::string& line) { progress(line); };
        const Plan kept = plan_auto_sharding(
            [&]() -> std::optional<Plan> {
              const py::object plan = unsharded();
              if (plan.is_none()) return std::nullopt;
              return plan.cast<Plan>();
            },
            [&]() { return sharded().cast<Plan>(); }, world_size, [freed_bytes] { return freed_bytes; }, say);
        return std::make_shared<Plan>(kept);
      },
      py::arg("unsharded"), py::arg("sharded"), py::arg("world_size"), py::arg("freed_bytes"),
      py::arg("progress") = py::none(),
      "shard='auto': the unsharded search's plan (unsharded() returns None when not one sample fits) or, when "
      "sharding frees enough for a larger microbatch, sharded()'s; the reason says which");
}

}  // namespace

void bind_plan_rules(py::module_& m) {
  m.def("check_step_cost",
        [](int64_t per_microbatch, int64_t per_token, int64_t per_token_squared) {
          check_step_cost(TokenStepCost{per_microbatch, per_token, per_token_squared, 0}, "step_cost['", "']");
        },
        py::arg("per_microbatch"), py::arg("per_token"), py::arg("per_token_squared"),
        "InputError naming the first step-cost term outside its range, as the plan reader refuses it");
  py::class_<PersistentStep>(m, "PersistentStep")
      .def(py::init<std::optional<int64_t>, std::optional<int64_t>>(), py::arg("budget_bytes"),
           py::arg("lifted_cap_bytes") = py::none())
      .def_property_readonly("attempt_budget_bytes", &PersistentStep::attempt_budget_bytes,
                             "the budget the next attempt runs under (None: none)")
      .def_property_readonly("over_budget", &PersistentStep::over_budget,
                             "whether an attempt under the budget ran out of memory")
      .def("measured", [](const PersistentStep& s, int64_t peak_bytes, double seconds) {
             return s.measured(peak_bytes, seconds);
           }, py::arg("peak_bytes"), py::arg("seconds"), "the trial of an attempt that ran, its fit judged")
      .def_static("check_loss", &PersistentStep::check_loss, py::arg("loss"),
                  "InputError when the first window's loss is not finite (the optimizer could not step)")
      .def("out_of_memory", [](PersistentStep& s, double seconds, const std::string& device_name) {
             return s.out_of_memory(seconds, device_name);
           }, py::arg("seconds"), py::arg("device_name"),
           "the trial of an attempt that ran out of memory; InfeasibleError when it ran without a budget");
  bind_sharding(m);
}

}  // namespace accumplan
