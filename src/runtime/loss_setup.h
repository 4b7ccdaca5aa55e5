// runtime/loss_setup.h — a plan's or a profile's setup turned into the executor's LossConfig.
// What it is: the one place that reads setup.loss, setup.ignore_index, setup.normalization and the
// target spec for the loss (the profiler, `run` and `verify` all call it, so they resolve
// "auto" alike). What it is not: the loss itself (runtime/loss.h).
#pragma once

#include <optional>
#include <string>

#include "accumplan/schema.h"
#include "accumplan/tensor_spec.h"
#include "runtime/loss.h"

namespace accumplan {

// The loss of `setup` with target `target` (nullopt: no target, e.g. loss "model"); an integer
// target's bound becomes target_classes, named in messages as `target_source`. Throws InputError
// for an unknown normalization or one the loss cannot have (tokens with mse).
LossConfig loss_config(const Setup& setup, const std::optional<TensorSpec>& target, const std::string& target_source);

}  // namespace accumplan
