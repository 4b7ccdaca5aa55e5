// accumplan/setup_rules.h — what a plan's training setup means, said once for every reader.
//
// What it is: the rules that turn the `setup` a profile was measured under into the settings
// that follow from it, torch-free, so the LibTorch runtime (which builds the optimizer and the
// loss) and the exporters (which write the same settings in each trainer's words) read them from
// one place:
//   - the one optimizer table: each optimizer's name, torch.optim class, default learning rate,
//     hyperparameters with their defaults (what an absent one means), on/off options (flags) and
//     Hugging Face Trainer's words for it; its parameter groups with every value filled in, and
//     what LibTorch cannot run of them; which hyperparameters torch.optim takes as one keyword
//     (betas = (beta1, beta2));
//   - the one table of optimizer value ranges (lr and every hyperparameter), which `accumplan
//     run` (runtime/optim.h) and the plan reader (schema.cpp) check against;
//   - setup.normalization resolved: per token or per sample.
// What it is not: the checks themselves (runtime/optim.h refuses what LibTorch cannot run, the
// readers refuse what a document cannot hold) or the construction of anything.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "accumplan/schema.h"

namespace accumplan {

// One hyperparameter of an optimizer (beyond lr), by the plan's name: LibTorch's, with torch.optim's
// `betas` as beta1 and beta2 (torch_grouped_keywords).
struct OptimizerHyperparameter {
  std::string name;
  double plan_default = 0;   // what a plan that leaves it out means (momentum's momentum: 0.9)
  double torch_default = 0;  // torch.optim's class default (SGD's momentum: 0)
};

// One row of the optimizer table: all accumplan knows of an optimizer except how LibTorch builds
// it and which tensors hold its state (src/runtime/optim.cpp). Adding an optimizer is a row here
// and a branch there; the CLI's help, the plan reader, the exporters and accumplan.plan (through
// _core.optimizer_table) read the row.
struct OptimizerInfo {
  std::string name;         // the plan's name
  std::string torch_class;  // torch.optim's class: what exports build, what accumplan.plan recognises
  double default_lr = 0;    // the learning rate when none is given
  std::vector<OptimizerHyperparameter> hyperparameters;    // in torch.optim's keyword order
  std::vector<std::pair<std::string, double>> torch_fixed;  // keywords that make the class this optimizer (sgd: momentum 0)
  std::vector<std::string> flags;                           // on/off options, by torch.optim's names
  // Hugging Face Trainer: its `optim` name ("": Trainer has none), the name when fused is set ("":
  // none), the hyperparameters TrainingArguments carry (plan name -> argument; weight_decay is
  // carried for every optimizer) and a note said when the plan decays weights ("": none).
  std::string hf_optim;
  std::string hf_optim_fused;
  std::vector<std::pair<std::string, std::string>> hf_arguments;
  std::string hf_decay_note;
};

// One of torch.optim's keyword arguments for a row's hyperparameters: a plan's hyperparameter by
// its own name, or several that torch takes as one tuple (`betas` = (beta1, beta2)).
struct TorchKeyword {
  std::string keyword;               // torch.optim's name
  std::vector<std::string> members;  // the plan's hyperparameters it carries, in torch's order
};

// The one rule for hyperparameters torch.optim groups into one keyword: betas = (beta1, beta2).
// The exporters write it, the LibTorch runtime builds its options from it, and accumplan.plan
// (through _core.optimizer_table's "grouped") splits a param_group's tuple by it.
const std::vector<TorchKeyword>& torch_grouped_keywords();
// The plan's hyperparameters torch's `keyword` carries, in order; InternalError for a keyword
// torch_grouped_keywords does not hold.
const std::vector<std::string>& torch_grouped_members(const std::string& keyword);
// `row`'s hyperparameters as torch.optim's keywords, in its keyword order: a group in the place of
// its first member, every other hyperparameter alone.
std::vector<TorchKeyword> torch_keywords(const OptimizerInfo& row);

// Every optimizer accumplan measures: sgd momentum adam adamw adagrad rmsprop, in that order.
const std::vector<OptimizerInfo>& optimizer_table();

// The row of `optimizer`; InputError naming the known optimizers for an unknown name.
const OptimizerInfo& optimizer_info(const std::string& optimizer);

// The names of optimizer_table, in its order.
const std::vector<std::string>& optimizer_names();

// Every hyperparameter `optimizer` takes (beyond lr) with the default an absent one means
// (optimizer_table's plan_default). InputError naming the known optimizers for an unknown name.
const std::map<std::string, double>& optimizer_defaults(const std::string& optimizer);

// setup.hyperparameters with every absent one at its default: the values the optimizer runs
// with. InputError for an unknown optimizer or a hyperparameter it does not take (naming those
// it takes).
std::map<std::string, double> optimizer_hyperparameters(const Setup& setup);

// Every on/off option (flag) `optimizer` takes, by torch.optim's names; each is off by default
// (foreach and fused: None, torch chooses), so an absent flag means torch's default. (The union
// over torch versions: a torch without one never records it.) InputError for an unknown optimizer.
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

// The values a number may take: lo to hi, each end open or closed.
struct ValueRange {
  double lo = 0;
  double hi = 0;
  bool lo_open = false;
  bool hi_open = false;
  // Finite and inside the range (NaN and the infinities never are).
  bool contains(double value) const;
};

// The documented range of a number by the key that holds it in a profile or plan
// ("max_grad_norm", "seconds"; docs/plan-format.md), the readers' own; nullopt for a key that holds
// no number the readers check. Front ends bound their arguments by it.
std::optional<ValueRange> documented_range(const std::string& key);

// The one table of optimizer value ranges, by the plan's name: lr and every hyperparameter of
// optimizer_table. The optimizers compute in float32 on float32 parameters, so a value past these
// (lr 1e308) is not only meaningless but fails deep in LibTorch; lr 0 is a warm-up scheduler's
// first step. `accumplan run` refuses any value outside its range (runtime/optim.h), the plan
// reader an lr outside it.
const std::map<std::string, ValueRange>& optimizer_value_ranges();
// The range of `name` in optimizer_value_ranges, or nullptr for a name it does not hold.
const ValueRange* optimizer_value_range(const std::string& name);
// What a profile or plan may record of any hyperparameter: [-1e6, 1e6], so that no arithmetic on
// it overflows. Wider than optimizer_value_ranges: a document records the user's optimizer as it
// was, and only a run on LibTorch's optimizers needs LibTorch's limits.
inline constexpr ValueRange kRecordedHyperparameterRange{-1e6, 1e6, false, false};

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
