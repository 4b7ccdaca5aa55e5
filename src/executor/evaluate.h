// executor/evaluate.h — an eval batch in microbatches on a TorchScript module, forward only, the
// loss summed, re-split after an out-of-memory: the one evaluation loop (accumplan/window_loop.h
// run_eval) over LibTorch.
//
// What it is: what a mid-training evaluation runs, and what the profiler measures an eval window
// with (profiling/probe_runner.cpp), so a plan's eval peak is the peak this code reaches. Each
// microbatch is runtime/step.h's forward_loss under no_grad, with every submodule in eval mode
// for the call (dropout off, BatchNorm on its running statistics; each module's own training flag
// put back after, even when it throws). The result is the SUM of the per-unit losses and the
// units (samples, or valid tokens in tokens mode): mean = sum / units is the same number whatever
// the split, to float64 rounding.
// On an out-of-memory (recovery on), the failing microbatch is dropped and the samples from it on
// are evaluated in microbatches of the planner's smaller size (accumplan/replan.h
// eval_size_after_oom: half): nothing is skipped or counted twice, and the sums already taken
// stay. Out of memory at one sample is an ExecutorOomError. With recovery off (the profiler) the
// out-of-memory propagates.
// Kept outputs (keep_outputs): each microbatch's output stays referenced until the next
// microbatch's forward has finished, then goes to on_outputs (a loop that moves outputs to the
// host one microbatch behind); the plan's eval peaks are measured that way.
// What it is not: a training step (no backward, no gradient, no optimizer), or a data loader.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "runtime/batch.h"
#include "runtime/step.h"

namespace torch::jit {
struct Module;
}

namespace accumplan {

class MemoryProbe;

struct EvalOptions {
  StepConfig step;               // loss, AMP, device, padding mask (its probe: the one below)
  MemoryProbe* probe = nullptr;  // not owned: its OOM flag, cleared after a recovery
  bool oom_recovery = true;
  bool keep_outputs = false;
  // Called before each microbatch's forward with (index, size) of this attempt's microbatches.
  std::function<void(int64_t index, int64_t size)> before_microbatch;
  // Kept outputs: (output, first sample's index in the batch), one microbatch behind.
  std::function<void(const at::Tensor& output, int64_t start)> on_outputs;
  std::function<void(const std::string&)> log;  // one line per re-split
};

struct EvalStats {
  double loss_sum = 0;                    // sum of the per-unit losses over the batch
  int64_t units = 0;                      // samples, or valid tokens in tokens mode
  int64_t samples = 0;
  std::vector<int64_t> microbatch_sizes;  // as run, a re-split's included
  int64_t oom_recoveries = 0;
  double mean() const { return units > 0 ? loss_sum / static_cast<double>(units) : 0.0; }
};

// Evaluates `data` (on the host) in microbatches of `sizes` (summing to its samples).
EvalStats evaluate(torch::jit::Module& module, const Batch& data, const std::vector<int64_t>& sizes,
                   const EvalOptions& options);

}  // namespace accumplan
