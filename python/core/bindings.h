// python/core/bindings.h — what the files of accumplan._core share: each binds its part of the
// module, and JSON crosses into Python as Python objects (never as text to parse again).
// What it is not: a public header; only python/core/*.cpp include it.
#pragma once

#include <pybind11/pybind11.h>

#include <nlohmann/json.hpp>

#include "accumplan/schema.h"

namespace accumplan {

// A JSON value as the Python object json.loads would give for its text.
pybind11::object python_of(const nlohmann::json& value);

// InputError (SchemaError) naming the first field of a profile header the plan reader refuses.
void check_profile_header(const Profile& header);

void bind_loss_rules(pybind11::module_& m);    // python/core/loss_rules.cpp: the normalization rule
void bind_plan_rules(pybind11::module_& m);    // python/core/plan_rules.cpp: step-cost ranges, the persistent step
void bind_plan_object(pybind11::module_& m);   // python/core/plan_object.cpp: _core.Plan, read once
void bind_profile_object(pybind11::module_& m);  // python/core/profile_object.cpp: _core.Profile, the header
void bind_window_loop(pybind11::module_& m);   // python/core/window_bindings.cpp: the window and eval loops

}  // namespace accumplan
