// executor/verify.h — the check the seed documents recommend before a long run: one accumulated
// update against one combined-batch update on the same model and samples.
//
// What it is: scenarios over one window of the plan — equal microbatches, unequal ones, a partial
// (short) window with its own N, and token masks with a different number of valid tokens per
// microbatch — each run twice from the same initial weights: through the Executor (accumulated)
// and as one forward/backward of the whole window (combined). Reported per parameter: max
// absolute and relative gradient difference, the two losses, the optimizer-step counts and the
// difference of the resulting SGD updates. Relative difference of a tensor is
// max|a − b| / max|b| (a max-norm ratio: element-wise ratios explode where a gradient is ~0).
// Also the gradient helpers the tests use, including deliberately wrong weightings, so the same
// comparison that passes the executor is shown to fail them.
// What it is not: a mixed-precision check (verification runs in float32, where 1e-5 is a
// meaningful tolerance), nor a fix for batch-dependent layers: BatchNorm uses each physical
// microbatch's statistics, so accumulation cannot equal the combined batch; verify warns.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/script.h>

#include "accumplan/schema.h"
#include "runtime/batch.h"
#include "runtime/loss.h"

namespace accumplan {

struct TensorDiff {
  std::string name;
  double max_abs = 0;
  double max_rel = 0;   // max|a-b| / max|b|
  double ref_max_abs = 0;
};

struct GradientComparison {
  std::vector<TensorDiff> tensors;
  double max_abs = 0;
  double max_rel = 0;
  bool within(double rtol) const { return max_rel <= rtol; }
};

// Compares two lists of tensors element by element (same length and shapes; InternalError
// otherwise). `names` may be empty. Any NaN/inf difference counts as +inf.
GradientComparison compare_tensors(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b,
                                   const std::vector<std::string>& names = {});

// Gradients of the combined window's mean loss (one forward/backward of all samples), computed on
// `module` itself (callers pass a clone): sum of unit losses / units, float32, no autocast.
// `loss_out` receives that mean loss.
// `padding_mask`: ragged data, the mask goes in as one more forward argument (StepConfig).
// `freeze_batch_dependent`: those layers in eval mode (freeze_batch_dependent_layers), the rest training.
std::vector<at::Tensor> combined_gradients(torch::jit::Module module, const Batch& window, const LossConfig& loss,
                                           double* loss_out = nullptr, bool padding_mask = false,
                                           bool freeze_batch_dependent = false);

// The weightings public trainers have shipped, for demonstrating that a check catches them:
//   MeanOverK   each microbatch's MEAN loss divided by `k` (the "loss / accum_iter" recipe):
//               right only for equal microbatches of equal unit counts. With k = the plan's
//               accumulation count on a short window it is the "divide by k" bug; with k = the
//               number of microbatches on unequal ones it is the mean of microbatch means.
enum class NaiveWeighting { MeanOverK };
std::vector<at::Tensor> naive_accumulated_gradients(torch::jit::Module module, const Batch& window,
                                                    const std::vector<int64_t>& sizes, const LossConfig& loss,
                                                    NaiveWeighting weighting, int64_t k, bool padding_mask = false,
                                                    bool freeze_batch_dependent = false);

// A deep copy whose parameters are fresh leaf tensors with the same requires_grad. (Module::
// deepcopy clones under autograd, so its parameters would be non-leaf CloneBackward outputs that
// neither receive .grad nor can be optimized.)
torch::jit::Module clone_module(const torch::jit::Module& module);

// Trainable parameter names and a snapshot of their gradients (undefined grads become zeros).
std::vector<std::string> parameter_names(const torch::jit::Module& module);
std::vector<at::Tensor> gradients_of(const torch::jit::Module& module);

struct VerifyScenario {
  std::string name;                 // equal | unequal | partial | token-masks
  std::string description;
  bool ran = false;
  std::string not_run_reason;       // when ran == false
  int64_t samples = 0;
  int64_t units = 0;                // N of the window (samples or valid tokens)
  std::vector<int64_t> sizes;
  std::vector<int64_t> units_per_microbatch;
  GradientComparison gradients;
  GradientComparison updates;       // parameter change after one SGD step, accumulated vs combined
  double loss_accumulated = 0;
  double loss_combined = 0;
  double loss_rel_diff = 0;
  int64_t accumulated_optimizer_steps = 0;
  int64_t combined_optimizer_steps = 0;
  double naive_max_rel = -1;        // the "loss / k" recipe's gradient difference, for contrast
  bool pass = false;
};

struct VerifyReport {
  std::vector<VerifyScenario> scenarios;
  std::vector<std::string> warnings;
  double rtol = 1e-5;
  std::string normalization;
  bool pass = false;
};

struct VerifyOptions {
  LossConfig loss;
  double rtol = 1e-5;               // float32: a few ulps of accumulated summation-order noise
  double sgd_lr = 0.1;              // the update compared after one step
  std::vector<std::string> batch_dependent_layers;  // from the model's module tree; warns
  // Those layers in eval mode in every run of the check (their running statistics, no update of
  // them): the check is then of the weighting alone (`verify --freeze-batch-dependent`).
  bool freeze_batch_dependent = false;
  uint64_t seed = 0;                // at::manual_seed before each forward pass pair
};

// Runs every scenario that applies to `window` (the plan's per-rank batch of samples). The
// module is cloned for each run, so it is left unchanged. Ragged data passes the padding mask as
// the plan's setup.padding_mask says, in both updates. A packed plan (plan.tokens) is checked as it
// trains: "packed" — the window packed under the plan's token budget; "packed-tight" — under a
// budget of the window's longest sequence, the most microbatches of the most different lengths;
// "partial" — a short window packed; the combined update is one forward of the whole window
// padded to its longest (padding must not change the valid tokens' outputs: with attention, that
// needs the mask).
VerifyReport verify_accumulation(const torch::jit::Module& module, const Batch& window, const Plan& plan,
                                 const VerifyOptions& options);

nlohmann::ordered_json to_json(const VerifyReport& report);
std::string format_table(const VerifyReport& report);

}  // namespace accumplan
