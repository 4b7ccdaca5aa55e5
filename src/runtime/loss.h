// runtime/loss.h — losses as sums over the units they are normalised by.
//
// What it is: every loss returns the SUM of per-unit losses of one microbatch plus the number of
// units, so that weighting is one division by the window's total: samples mode divides by the
// samples N of the window (each microbatch mean therefore carries weight n_i/N), tokens mode by
// the valid (target != ignore_index) tokens of the whole window, counted before the first
// backward. docs/weighting.md.
//   cross_entropy  logits [B,C] with target [B], or [B,T,C] with target [B,T]; ignore_index skips
//                  a position. Samples mode: a sample's loss is the mean over its valid positions.
//                  Or logits [B,C] with a floating target [B,C] of class probabilities (mixup,
//                  label smoothing, distillation): a sample's loss is -sum_c target[c] *
//                  log_softmax(logits)[c], as F.cross_entropy computes it; samples mode only.
//   mse            output and target of equal shape; a sample's loss is the mean over its elements.
//   model          the model's forward takes the target last and returns the microbatch's MEAN
//                  loss (a scalar); samples mode only: its sum is mean × n.
// What it is not: a reduction="mean" loss. Callers that want a plain mean divide sum by units.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "accumplan/tensor_spec.h"

namespace accumplan {

enum class Normalization { Samples, Tokens };

struct LossConfig {
  std::string kind = "cross_entropy";  // cross_entropy | mse | model
  Normalization normalization = Normalization::Samples;
  int64_t ignore_index = -100;
  // cross_entropy: the target spec's bound H (class indices in [0, H), e.g. int64[B]:1000), when
  // known. A model with fewer than H outputs is refused before the loss runs: on a GPU an index
  // out of range is a device-side assert that poisons the CUDA context, not a catchable error.
  // A host-side comparison of two integers, no sync.
  std::optional<int64_t> target_classes;
  std::string target_source;  // how messages name the target ("--target int64[B]:1000")
};

struct LossSum {
  at::Tensor sum;     // scalar, differentiable: sum over units of the per-unit loss
  int64_t units = 0;  // samples, or valid tokens (-1: tokens not counted, see count_tokens)
};

// Throws InputError for an unknown kind, mismatched shapes, or tokens mode with a loss that has
// no tokens (mse, model, [B,C] cross-entropy without ignored targets is allowed and counts them).
// `samples` is the microbatch's sample count (needed for "model", whose output is a mean).
// `count_tokens` false leaves units at -1 in tokens mode: counting reads a device tensor (a host
// sync per microbatch on a GPU), and the executor already counted the window's tokens on the host.
LossSum loss_sum(const at::Tensor& output, const at::Tensor& target, int64_t samples,
                 const LossConfig& config, bool count_tokens = true);

// Units in a microbatch without running the model: samples, or target != ignore_index. This is
// how the executor counts a window's denominator before the first backward.
int64_t count_units(const at::Tensor& target, int64_t samples, const LossConfig& config);

// Resolves setup.normalization "auto": tokens for cross-entropy over [B,T,C] logits (a target of
// class indices with more than one dimension), samples otherwise (a floating target of
// probabilities included). Throws InputError for an unknown name. The rule is setup_rules.h's.
Normalization resolve_normalization(const std::string& name, const std::string& loss_kind,
                                    int64_t target_dims, bool target_is_floating = false);

// Whether `loss_kind`'s target `target` holds class probabilities: a floating target of
// cross_entropy ([B,C], each row a distribution over the classes). Synthetic data makes such
// rows valid and the data check refuses rows that are not (batch.h check_probability_rows).
bool is_probability_target(const std::string& loss_kind, const TensorSpec& target);

std::string to_string(Normalization n);

}  // namespace accumplan
