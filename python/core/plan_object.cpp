// python/core/plan_object.cpp — accumplan._core.Plan: a plan read once by the C++ reader and held
// as the planner's own object, for accumplan.Plan to read its fields through.
//
// What it is: the plan reader (read_file / read_text refuse exactly what `accumplan run --plan`
// refuses, with the same message) and the rules a plan owns, asked of the object itself: the
// short-window split, the eval split, the re-plan after an out-of-memory (solved again from the
// plan's profile, as the executor does), the re-pack of a packed plan, the largest microbatch its
// line fits, the peak a packed window is predicted to reach. The document crosses into Python as
// Python objects (to_dict), never as text to parse again. Text is parsed only where the user gave
// text: a file, a string, a dict turned into JSON by accumplan.Plan.
// What it is not: Python's argument checks (accumplan/_args.py), nor the window loop
// (window_bindings.cpp), which re-plans this object in place.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "accumplan/errors.h"
#include "accumplan/json_io.h"
#include "accumplan/memory_model.h"
#include "accumplan/ranks.h"
#include "accumplan/replan.h"
#include "accumplan/schema.h"
#include "accumplan/solver.h"
#include "accumplan/token_model.h"
#include "bindings.h"

namespace py = pybind11;

namespace accumplan {

py::object python_of(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::null: return py::none();
    case nlohmann::json::value_t::boolean: return py::bool_(value.get<bool>());
    case nlohmann::json::value_t::number_integer: return py::int_(value.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: return py::int_(value.get<uint64_t>());
    case nlohmann::json::value_t::number_float: return py::float_(value.get<double>());
    case nlohmann::json::value_t::string: return py::str(value.get_ref<const std::string&>());
    case nlohmann::json::value_t::array: {
      py::list out;
      for (const auto& item : value) out.append(python_of(item));
      return std::move(out);
    }
    case nlohmann::json::value_t::object: {
      py::dict out;
      for (const auto& [key, item] : value.items()) out[py::str(key)] = python_of(item);
      return std::move(out);
    }
    default: throw InternalError("a plan held a JSON value of no JSON type");
  }
}

namespace {

using PlanPtr = std::shared_ptr<Plan>;

// (the plan, the schema_version its text states, "1.2"; the object is the writer's version) of
// plan JSON text, parsed once; messages start with `source`.
std::pair<PlanPtr, std::string> read_text(const std::string& text, const std::string& source) {
  std::string version;
  PlanPtr plan = std::make_shared<Plan>(plan_from_text(text, source, &version));
  return {plan, version};
}

// A plan file, with `accumplan run --plan`'s refusals and messages ("plan 'p.json': ..." where
// the CLI says "--plan 'p.json': ...").
std::pair<PlanPtr, std::string> read_file(const std::string& path) {
  return read_text(read_text_file(path, "plan"), "plan '" + path_for_message(path) + "'");
}

}  // namespace

void bind_plan_object(py::module_& m) {
  py::class_<Plan, PlanPtr>(m, "Plan", "a plan as the C++ planner holds it; accumplan.Plan reads it")
      .def_static("read_file", &read_file, py::arg("path"),
                  "(plan, the file's schema_version) of a plan file, or InputError as `accumplan run` gives")
      .def_static("read_text", &read_text, py::arg("text"), py::arg("source"),
                  "(plan, the text's schema_version) of plan JSON text; messages start with `source`")
      .def("to_dict", [](const Plan& p) { return python_of(to_json(p)); },
           "the document as the C++ writer writes it, as Python objects")
      .def("text", [](const Plan& p) { return to_json(p).dump(2) + "\n"; }, "the document's canonical JSON text")
      .def("describe", &describe_plan, "the summary the CLI prints to stderr after planning")
      .def("copy", [](const Plan& p) { return std::make_shared<Plan>(p); })
      .def_static("for_window", &plan_for_window, py::arg("sizes"),
                  "a plan of one window of exactly these microbatch sizes (accumplan.plan's measured windows)")
      .def_readonly("per_rank_batch", &Plan::per_rank_batch)
      .def_readonly("micro_batch", &Plan::micro_batch)
      .def_readonly("microbatch_sizes", &Plan::microbatch_sizes)
      .def("replan_below",
           [](Plan& p, int64_t failing_micro_batch) {
             std::string note;
             p = replan_below(p, failing_micro_batch, &note);
             return note;
           },
           py::arg("failing_micro_batch"),
           "re-plans in place after a microbatch of that size ran out of memory; returns how")
      .def("repack_below", [](Plan& p, int64_t failing_tokens) { p = repack_below(p, failing_tokens); },
           py::arg("failing_tokens"), "lowers the token budget in place below failing_tokens")
      .def("window_sizes",
           [](const Plan& p, int64_t samples, int64_t rank) {
             return window_sizes(p, samples, rank);
           },
           py::arg("samples"), py::arg("rank") = 0,
           "microbatch sizes of rank `rank`'s window of `samples` (its own where the ranks differ)")
      .def_static("for_ranks",
                  [](const std::vector<PlanPtr>& own) {
                    std::vector<Plan> plans;
                    for (const PlanPtr& p : own) plans.push_back(*p);
                    return std::make_shared<Plan>(plan_ranks(plans));
                  },
                  py::arg("own"), "the plan of ranks that differ from each rank's own plan (accumplan/ranks.h)")
      .def("rank_slice",
           [](const Plan& p, int64_t rank, int64_t samples) {
             const SampleSlice s = rank_slice(p, rank, samples);
             return py::make_tuple(s.start, s.stop, s.step);
           },
           py::arg("rank"), py::arg("samples"),
           "(start, stop, step) of rank `rank`'s part of a global window of `samples` (accumplan/ranks.h)")
      .def("eval_sizes", [](const Plan& p, int64_t samples) { return eval_sizes(p, samples); }, py::arg("samples"),
           "the eval microbatches of `samples` under the plan (plan.eval, else its microbatch)")
      .def("largest_fitting",
           [](const Plan& p) -> std::optional<int64_t> {
             if (!(p.fit.slope_bytes_per_sample > 0) || p.memory.usable_bytes <= 0) return std::nullopt;
             return MemoryModel::line_largest_fitting(p.fit, p.memory.usable_bytes);
           },
           "the largest microbatch whose predicted peak (the plan's fitted line) fits memory.usable_bytes; 0 if "
           "not even one sample; None when the plan has no memory line");
  // What `accumplan run` predicts for a packed window, the planner's rule (accumplan/token_model.h).
  py::class_<PackedPeakPredictor>(m, "PackedPeakPredictor")
      .def(py::init([](const Plan& plan) { return PackedPeakPredictor(plan.profile); }), py::arg("plan"))
      .def("window_peak_bytes",
           py::overload_cast<const std::vector<std::pair<int64_t, int64_t>>&, bool>(&PackedPeakPredictor::window_peak_bytes,
                                                                                   py::const_),
           py::arg("microbatches"), py::arg("optimizer_state_exists"),
           "the peak a window of (sequences, padded length) microbatches is predicted to reach; None without a token "
           "profile");
}

}  // namespace accumplan
