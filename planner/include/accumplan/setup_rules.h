// accumplan/setup_rules.h — what a plan's training setup means, said once for every reader.
//
// What it is: the rules that turn the `setup` a profile was measured under into the settings
// that follow from it, torch-free, so the LibTorch runtime (which builds the optimizer and the
// loss) and the exporters (which write the same settings in each trainer's words) read them from
// one place:
//   - the optimizers accumplan measures, the hyperparameters each takes and LibTorch's default
//     for each (what an absent hyperparameter means), the on/off options (flags) each takes, its
//     parameter groups with every value filled in, and what LibTorch cannot run of them;
//   - setup.normalization resolved: per token or per sample.
// What it is not: validation of ranges (runtime/optim.h checks values against LibTorch's limits)
// or the construction of anything.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "accumplan/schema.h"

namespace accumplan {

// sgd momentum adam adamw adagrad rmsprop, in that order.
const std::vector<std::string>& optimizer_names();

// Every hyperparameter `optimizer` takes (beyond lr) with LibTorch's default for it:
//   sgd: weight_decay 0, dampening 0; momentum: momentum 0.9 (accumplan's), dampening 0,
//   weight_decay 0; adam: beta1 0.9, beta2 0.999, eps 1e-8, weight_decay 0; adamw: the same with
//   weight_decay 0.01; adagrad: lr_decay 0, eps 1e-10, weight_decay 0, initial_accumulator_value 0;
//   rmsprop: alpha 0.99, eps 1e-8, weight_decay 0, momentum 0.
// InputError naming the known optimizers for an unknown name.
const std::map<std::string, double>& optimizer_defaults(const std::string& optimizer);

// setup.hyperparameters with every absent one at its default: the values the optimizer runs
// with. InputError for an unknown optimizer or a hyperparameter it does not take (naming those
// it takes).
std::map<std::string, double> optimizer_hyperparameters(const Setup& setup);

// Every on/off option (flag) `optimizer` takes, by torch.optim's names; each is off by default
// (foreach and fused: None, torch chooses), so an absent flag means torch's default:
//   sgd, momentum: nesterov, maximize, foreach, fused, differentiable;
//   adam, adamw: amsgrad, maximize, foreach, fused, capturable, differentiable;
//   adagrad: maximize, foreach, fused, differentiable;
//   rmsprop: centered, maximize, foreach, capturable, differentiable.
// (The union over torch versions: a torch without one never records it.) InputError for an
// unknown optimizer.
const std::vector<std::string>& optimizer_flags(const std::string& optimizer);

// Whether a flag chooses how the update is computed rather than what it is: foreach, fused,
// capturable, differentiable. The others (nesterov, amsgrad, centered, maximize) change it.
bool is_implementation_flag(const std::string& flag);

// Every parameter group of the setup, in order, with every hyperparameter at its value (absent
// ones at their defaults, as optimizer_hyperparameters) and the flags as recorded: one group of
// lr, hyperparameters and flags when setup.param_groups is empty. InputError for an unknown
// optimizer, hyperparameter or flag (naming those it takes).
std::vector<OptimizerGroup> optimizer_groups(const Setup& setup);

// The values in which the groups differ, in one clause: "2 parameter groups (lr 0.01, 0.1)",
// "3 parameter groups (lr 0.01, 0.1, 0.1; weight_decay 0, 0, 0.01)". Empty for one group or
// groups that all hold the same values (one group's values then say everything).
std::string group_difference(const std::vector<OptimizerGroup>& groups);

// What LibTorch's optimizers (`accumplan run`) cannot run of the setup, as a clause naming the
// value: groups that differ (group_difference), or a flag that changes the update and that
// LibTorch lacks ("maximize=true"); empty when it runs all of it. InputError as optimizer_groups.
std::string libtorch_cannot_run(const Setup& setup);

// The implementation flags that are set ("fused=true, foreach=false"), which LibTorch runs as
// its one implementation (the same update); empty when none is set.
std::string implementation_flags_set(const Setup& setup);

// "0.01", "1e-08", "0.9": a value as a message shows it (%g).
std::string number_text(double value);

// Whether the loss is normalised per valid token across the window (and ranks) rather than per
// sample: "tokens"; "auto" for cross-entropy, or a model's own loss (loss "model"), over a target
// of class indices with more than one dimension ([B,T]); "samples". A floating target of cross-entropy holds class probabilities
// ([B,C], one distribution per sample): "auto" is samples for it. InputError for an unknown name,
// or "tokens" with a loss that has no tokens or with a floating target. The CLI and the Python
// package (accumplan.resolve_normalization, through _core) both ask this.
bool normalizes_by_tokens(const std::string& normalization, const std::string& loss, int64_t target_dims,
                          bool target_is_floating);
// The same for a setup: target_dims and the dtype from setup.target's spec (no target: 0 dims).
bool normalizes_by_tokens(const Setup& setup);

// How far from 1 a row of class probabilities (a floating cross-entropy target) may sum, for a
// target of `dtype` ("float32", "bfloat16", as a tensor spec names it): 1e-3; bfloat16's epsilon
// 2^-7 for bfloat16, whose rounding alone moves a sum by up to 2^-8. The CLI's data check
// (runtime/batch.h) and accumplan.loss_sum (through _core) both ask this.
double probability_row_tolerance(const std::string& dtype);

// The one rule for a batch-dependent layer, whose statistics mix the samples of its batch so that
// accumulation cannot reproduce one large batch for it: a module type named *BatchNorm*
// (BatchNorm1d/2d/3d, SyncBatchNorm) or *InstanceNorm* that tracks running statistics (it
// normalises per sample; only those statistics mix samples). `type` is the module's class name.
// The LibTorch runtime (runtime/model.h) and the Python package (python/core) both ask this.
bool is_batch_dependent_type(const std::string& type, bool tracks_running_stats);

}  // namespace accumplan
