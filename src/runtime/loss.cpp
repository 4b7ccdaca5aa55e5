// runtime/loss.cpp — losses as (sum, units). See loss.h for the contract and docs/weighting.md for why.
#include "runtime/loss.h"
#include "runtime/loss_setup.h"

#include <ATen/ATen.h>


#include "accumplan/errors.h"
#include "accumplan/setup_rules.h"

namespace accumplan {
namespace {

std::string shape_of(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? "," : "") + std::to_string(t.size(i));
  return s + "]";
}

// Logits [B,C] with target [B], or [B,T,C] with [B,T], class indices: InputError otherwise.
void check_cross_entropy_shapes(const at::Tensor& logits, const at::Tensor& target, const LossConfig& config) {
  const bool ok2 = logits.dim() == 2 && target.dim() == 1 && target.size(0) == logits.size(0);
  const bool ok3 = logits.dim() == 3 && target.dim() == 2 && target.size(0) == logits.size(0) &&
                   target.size(1) == logits.size(1);
  if (!ok2 && !ok3) {
    throw InputError("cross_entropy needs logits [B,C] with target [B], or [B,T,C] with [B,T] (class indices), or "
                     "logits [B,C] with a floating target [B,C] (class probabilities); got output " +
                     shape_of(logits) + " and target " + shape_of(target));
  }
  if (target.scalar_type() != at::kLong) {
    throw InputError("cross_entropy needs an int64 target of class indices (or a floating [B,C] target of class "
                     "probabilities); got " + std::string(c10::toString(target.scalar_type())));
  }
  const int64_t C = logits.size(-1);
  if (config.target_classes && *config.target_classes > C) {
    const std::string source = config.target_source.empty() ? "the target spec" : config.target_source;
    throw InputError("the targets are class indices in [0, " + std::to_string(*config.target_classes) + ") (" + source +
                     ") but the model's output has " + std::to_string(C) + " classes (output " + shape_of(logits) +
                     "); give targets below " + std::to_string(C) + " (e.g. --target int64[B]:" + std::to_string(C) +
                     ") or a model with " + std::to_string(*config.target_classes) + " outputs");
  }
}

// A loss is summed in at least float32: half and bfloat16 outputs go up to float32, float32 and
// float64 stay as they are (a float64 model's loss and gradients keep float64's precision).
at::Tensor at_least_float(const at::Tensor& t) {
  const auto dtype = t.scalar_type();
  return dtype == at::kFloat || dtype == at::kDouble ? t : t.to(at::kFloat);
}

// Cross-entropy per position. Returns the per-position losses with ignored positions zeroed, and
// the valid mask, both shaped like target.
std::pair<at::Tensor, at::Tensor> cross_entropy_positions(const at::Tensor& logits, const at::Tensor& target,
                                                          const LossConfig& config) {
  check_cross_entropy_shapes(logits, target, config);
  const int64_t ignore_index = config.ignore_index;
  const int64_t C = logits.size(-1);
  const at::Tensor flat_logits = at_least_float(logits.reshape({-1, C}));
  const at::Tensor flat_target = target.reshape({-1});
  // reduction none (0) keeps per-position losses; ignored positions come back as 0.
  at::Tensor per = at::cross_entropy_loss(flat_logits, flat_target, {}, at::Reduction::None, ignore_index);
  const at::Tensor valid = flat_target.ne(ignore_index);
  return {per.reshape(target.sizes()), valid.reshape(target.sizes())};
}

// Logits [B,C] with a floating target [B,C] of class probabilities: per sample -sum_c target[c] *
// log_softmax(logits)[c] (what F.cross_entropy computes for probability targets), summed over the
// samples. The rows are checked where the data enters (the data check), not here: reading them
// would be a host sync per microbatch.
LossSum probability_cross_entropy(const at::Tensor& logits, const at::Tensor& target, const LossConfig& config) {
  if (logits.dim() != 2 || target.sizes() != logits.sizes()) {
    throw InputError("cross_entropy with a floating target (class probabilities) needs logits [B,C] and a target of "
                     "the same shape; got output " + shape_of(logits) + " and target " + shape_of(target) +
                     "; for class indices give an int64 target");
  }
  if (config.normalization == Normalization::Tokens) {
    throw InputError("tokens normalization needs a target of class indices; a floating cross_entropy target holds "
                     "class probabilities per sample and is normalized by samples");
  }
  LossSum out;
  out.sum = -(at_least_float(target) * at::log_softmax(at_least_float(logits), 1)).sum();
  out.units = logits.size(0);
  return out;
}

}  // namespace

bool is_probability_target(const std::string& loss_kind, const TensorSpec& target) {
  return loss_kind == "cross_entropy" && !target.is_integer();
}

std::string to_string(Normalization n) { return n == Normalization::Tokens ? "tokens" : "samples"; }

Normalization resolve_normalization(const std::string& name, const std::string& loss_kind, int64_t target_dims,
                                    bool target_is_floating) {
  // The rule is the planner's (accumplan/setup_rules.h), which the exporters read too.
  return normalizes_by_tokens(name, loss_kind, target_dims, target_is_floating) ? Normalization::Tokens
                                                                               : Normalization::Samples;
}

int64_t count_units(const at::Tensor& target, int64_t samples, const LossConfig& config) {
  if (config.normalization == Normalization::Samples) return samples;
  if (!target.defined()) throw InputError("tokens normalization needs a target to count tokens in");
  return target.ne(config.ignore_index).sum().item<int64_t>();
}

LossSum loss_sum(const at::Tensor& output, const at::Tensor& target, int64_t samples,
                 const LossConfig& config, bool count_tokens) {
  LossSum out;
  if (config.kind == "cross_entropy") {
    if (target.defined() && at::isFloatingType(target.scalar_type())) return probability_cross_entropy(output, target, config);
    const bool per_sample_mean = config.normalization == Normalization::Samples && target.dim() > 1;
    if (!per_sample_mean) {
      // One position per sample, or tokens mode: the sum over positions is the loss sum (ignored
      // positions add 0), one fused op whose backward is cheaper than per-position losses + sum.
      check_cross_entropy_shapes(output, target, config);
      const int64_t C = output.size(-1);
      out.sum = at::cross_entropy_loss(at_least_float(output.reshape({-1, C})), target.reshape({-1}), {}, at::Reduction::Sum,
                                       config.ignore_index);
      if (config.normalization == Normalization::Samples) {
        out.units = target.size(0);
      } else {
        // Reading the count is a host sync on a GPU; the executor counts its window once instead.
        out.units = count_tokens ? target.ne(config.ignore_index).sum().item<int64_t>() : -1;
      }
      return out;
    }
    // A sample's loss is the mean over its valid positions; a sample with none contributes 0.
    auto [per, valid] = cross_entropy_positions(output, target, config);
    const at::Tensor counts = valid.sum(1).clamp_min(1).to(per.scalar_type());
    out.sum = (per.sum(1) / counts).sum();
    out.units = per.size(0);
    return out;
  }
  if (config.normalization == Normalization::Tokens) {
    throw InputError("tokens normalization applies to cross_entropy only, not '" + config.kind + "'");
  }
  if (config.kind == "mse") {
    if (!target.defined() || output.sizes() != target.sizes()) {
      throw InputError("mse needs output and target of the same shape; got output " + shape_of(output) +
                       " and target " + (target.defined() ? shape_of(target) : std::string("none")));
    }
    const at::Tensor sq = (at_least_float(output) - at_least_float(target)).pow(2);
    const int64_t B = output.size(0);
    out.sum = sq.reshape({B, -1}).mean(1).sum();
    out.units = B;
    return out;
  }
  if (config.kind == "model") {
    if (output.numel() != 1) {
      throw InputError("--loss model expects the model to return a scalar loss; it returned " + shape_of(output));
    }
    out.sum = at_least_float(output.reshape({})) * static_cast<double>(samples);
    out.units = samples;
    return out;
  }
  throw InputError("--loss '" + config.kind + "' is unknown; use cross_entropy, mse or model");
}

LossConfig loss_config(const Setup& setup, const std::optional<TensorSpec>& target, const std::string& target_source) {
  LossConfig c;
  c.kind = setup.loss;
  c.ignore_index = setup.ignore_index;
  if (target && target->is_integer()) {
    c.target_classes = target->high;
    c.target_source = target_source;
  }
  // No target: 0 dimensions (a model's own loss), samples under "auto".
  c.normalization = resolve_normalization(setup.normalization, setup.loss,
                                          target ? static_cast<int64_t>(target->dims.size()) : 0,
                                          target && !target->is_integer());
  if (c.kind == "model" && c.normalization == Normalization::Tokens) {
    // Which tokens a model's own mean covers depends on the model (a causal LM shifts its labels):
    // the Python executor knows the module and weights it per token; this one would guess.
    throw InputError("a model's own loss over per-token labels (--loss model, normalization " + setup.normalization +
                     ") is weighted per token only by the Python package (accumplan.train_window); accumplan run "
                     "weights a model's loss by samples: give --normalization samples to train it so");
  }
  return c;
}

}  // namespace accumplan
