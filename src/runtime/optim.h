// runtime/optim.h — LibTorch optimizers built from a profile/plan Setup.
//
// What it is: sgd, momentum (SGD with momentum, default 0.9), adam, adamw, adagrad, rmsprop, with
// lr and the hyperparameters in Setup::hyperparameters (momentum, weight_decay, beta1, beta2,
// eps, alpha, lr_decay, initial_accumulator_value) and the flags LibTorch has (SGD nesterov,
// Adam/AdamW amsgrad, RMSprop centered). What LibTorch cannot run (parameter groups with
// different values, maximize: libtorch_cannot_run in accumplan/setup_rules.h) is refused; the
// implementation flags (foreach, fused, capturable, differentiable) run as LibTorch's one
// implementation of the same update, said in one stderr note. Also the bytes an optimizer's state holds right now, summed over the
// tensors LibTorch keeps in its param state (Adam: exp_avg and exp_avg_sq; its step counter is a
// plain int64 in LibTorch's C++ state, not a tensor, so it allocates no device memory).
// What it is not: a scheduler. The executor takes a step callback for that.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/optim.h>

#include "accumplan/schema.h"
#include "accumplan/setup_rules.h"  // optimizer_names, and each optimizer's defaults

namespace accumplan {

// Throws InputError naming the option (--lr, --momentum, ...), the value and its range for a
// learning rate or hyperparameter (of any parameter group) that is not finite or out of its range
// (setup_rules.h's optimizer_value_ranges: lr in [0, 1e6], momentum and betas in [0, 1), eps in
// (0, 1], ...), for what LibTorch cannot run
// (libtorch_cannot_run: groups with different values, maximize=true), and for nesterov without
// momentum. make_optimizer calls it; commands call it before loading anything.
void check_optimizer_values(const Setup& setup);

// A gradient-clipping norm (--max-grad-norm, --clip-grad-norm) must be finite and in (0, 1e12] (as setup.max_grad_norm in a plan);
// throws InputError naming `option`, the value and the range.
void check_grad_norm(double value, const std::string& option);

// Throws InputError for an unknown optimizer or hyperparameter (naming the known ones). An absent
// hyperparameter is its default in optimizer_defaults (accumplan/setup_rules.h).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Setup& setup, std::vector<at::Tensor> params);

// The optimizer state sharded over ranks (ZeRO-1): each parameter's rank, ZeroRedundancyOptimizer's
// partition of one group (accumplan/sharding.h zero_partition), and the parameters `rank` owns.
std::vector<int64_t> parameter_owners(const std::vector<at::Tensor>& params, int64_t world_size);
std::vector<at::Tensor> owned_parameters(const std::vector<at::Tensor>& params, const std::vector<int64_t>& owners,
                                         int64_t rank);

// Bytes of all tensors in the optimizer's per-parameter state (storage nbytes, counted once).
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

// Set every parameter's learning rate (for schedulers and step callbacks).
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace accumplan
