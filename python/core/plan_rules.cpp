// python/core/plan_rules.cpp — rules the Python package asks the C++ planner for, beside the plan
// object (plan_object.cpp): the step cost's ranges and the persistent-memory step's protocol.
//
// What it is: _core.check_step_cost, the one check of a step cost's terms (accumplan/schema.h
// check_step_cost, which the plan reader and the run statistics reader call too), its message
// naming the term as Python's argument does (step_cost['per_token']); _core.PersistentStep, the profiler's protocol for the step
// before the search (accumplan/persistent_step.h): which budget each attempt runs under, each
// attempt's trial and its fit, whether persistent memory is over the budget, and the refusal when
// it does not fit even without one (accumplan.plan's _persistent reports what it measured).
// What it is not: Python's type checks (accumplan/_args.py), which run before a call reaches here.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>

#include "accumplan/persistent_step.h"
#include "accumplan/schema.h"

namespace py = pybind11;

namespace accumplan {
namespace {

// A trial as the profile's JSON writes one (the fields a persistent step's trial has).
py::dict trial_dict(const Trial& t) {
  py::dict d;
  d["kind"] = t.kind;
  d["micro_batch"] = t.micro_batch;
  d["fit"] = t.fit;
  d["peak_bytes"] = t.peak_bytes;
  d["seconds"] = t.seconds;
  d["window"] = t.window;
  return d;
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
             return trial_dict(s.measured(peak_bytes, seconds));
           }, py::arg("peak_bytes"), py::arg("seconds"), "the trial of an attempt that ran, its fit judged")
      .def("out_of_memory", [](PersistentStep& s, double seconds, const std::string& device_name) {
             return trial_dict(s.out_of_memory(seconds, device_name));
           }, py::arg("seconds"), py::arg("device_name"),
           "the trial of an attempt that ran out of memory; InfeasibleError when it ran without a budget");
}

}  // namespace accumplan
