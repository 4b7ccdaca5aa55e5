// python/core/plan_rules.cpp — rules the Python package asks the C++ planner for, beside the plan
// reader's bindings in core.cpp: the step cost's ranges and the largest microbatch a plan's line fits.
//
// What it is: _core.check_step_cost, the one check of a step cost's terms (accumplan/schema.h
// check_step_cost, which the plan reader and the run statistics reader call too), its message
// naming the term as Python's argument does (step_cost['per_token']); _core.plan_largest_fitting,
// MemoryModel::line_largest_fitting on a plan's fit summary under its usable bytes
// (accumplan.Plan.largest_fitting).
// What it is not: Python's type checks (accumplan/_args.py), which run before a call reaches here.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>

#include "accumplan/memory_model.h"
#include "accumplan/schema.h"

namespace py = pybind11;

namespace accumplan {

void bind_plan_rules(py::module_& m) {
  m.def("check_step_cost",
        [](int64_t per_microbatch, int64_t per_token, int64_t per_token_squared) {
          check_step_cost(TokenStepCost{per_microbatch, per_token, per_token_squared, 0}, "step_cost['", "']");
        },
        py::arg("per_microbatch"), py::arg("per_token"), py::arg("per_token_squared"),
        "InputError naming the first step-cost term outside its range, as the plan reader refuses it");
  m.def("plan_largest_fitting",
        [](const std::string& plan_text) -> std::optional<int64_t> {
          const Plan plan = plan_from_text(plan_text, "plan");
          if (!(plan.fit.slope_bytes_per_sample > 0) || plan.memory.usable_bytes <= 0) return std::nullopt;
          return MemoryModel::line_largest_fitting(plan.fit, plan.memory.usable_bytes);
        },
        py::arg("plan"),
        "the largest microbatch whose predicted peak (the plan's fitted line) fits memory.usable_bytes; 0 if not "
        "even one sample; None when the plan has no memory line");
}

}  // namespace accumplan
