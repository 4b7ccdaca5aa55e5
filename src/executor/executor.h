// executor/executor.h — runs a plan on a TorchScript module: one accumulation window per call,
// exactly weighted, with mixed precision, clipping of the combined gradient, scheduler gating and
// out-of-memory recovery.
//
// What it is: the LibTorch backend of the one window algorithm (accumplan/window_loop.h, which
// decides the split, the counts, the rounds, the agreement between ranks, the re-plan and replay
// after an out-of-memory and the update's order; Python's train_window runs the same loop). This
// class does what needs tensors: it counts a window's units on the host (samples, or valid tokens
// with target != ignore_index in tokens mode), runs the one microbatch step (runtime/step.h:
// forward under autocast, loss sum, backward of loss_sum / N, × the loss scale for fp16) on a
// worker thread, keeps the loss sums on the device until the window's one host read, exchanges
// the gradients once across ranks, unscales (fp16), measures and scales the gradient, and steps.
// The profiler measures memory by running it, so a plan's peak is the peak this code reaches.
// Microbatch steps run on a worker thread (step_thread.h) that is joined and replaced after every
// out-of-memory: LibTorch can keep a failed backward's memory on the thread that ran it, and a
// replay on that thread would start out of memory. An out-of-memory is recognised by the memory
// probe's flag, because TorchScript rewraps c10::OutOfMemoryError as std::runtime_error.
// Data parallel (ExecutorOptions::communicator, docs/weighting.md "Several ranks"): each of W ranks
// calls step() with ITS share of the global window; `accumplan run` shards by the strided rule
// (stride_window): of every global window of B samples, rank r takes samples r, r+W, r+2W, ...
// Ragged data: a packed plan (plan.tokens) packs each window's sequences under the token budget;
// a sample plan cuts each microbatch to its own longest sequence. On the CPU the loop refits the
// packing's step cost from this run's own microbatches after every window.
// What it is not: a data loader (callers hand it windows and shard them), or a checkpointer.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/optim.h>
#include <torch/script.h>

#include "accumplan/errors.h"
#include "accumplan/memory_probe.h"
#include "accumplan/schema.h"
#include "accumplan/step_time.h"
#include "accumplan/token_model.h"
#include "accumplan/window_loop.h"
#include "dist/communicator.h"
#include "runtime/amp.h"
#include "runtime/batch.h"
#include "runtime/loss.h"

namespace accumplan {

class StepThread;

struct ExecutorOptions {
  LossConfig loss;                       // kind, normalization (samples|tokens), ignore_index
  AmpMode amp = AmpMode::None;
  LossScalerOptions scaler;              // fp16 only
  std::optional<double> max_grad_norm;   // clip the combined gradient's 2-norm to this
  // Learning rate for optimizer step k (0-based count of real steps) — set before that step. A
  // skipped step does not advance k.
  std::function<double(int64_t step)> lr_schedule;
  // Called after each real optimizer step (never after a skipped one).
  std::function<void(const StepEvent&)> on_step;
  bool oom_recovery = true;
  MemoryProbe* probe = nullptr;          // not owned; OOM flag, peaks. Without one, OOM is
                                         // recognised by c10::OutOfMemoryError's type alone.
  std::string plan_out;                  // write the plan atomically after each re-plan
  // One line per event (recoveries, skipped steps). Default: stderr, prefixed "accumplan: ".
  std::function<void(const std::string&)> log;
  // Testing and instrumentation hook, called before each microbatch's forward.
  std::function<void(const MicrobatchEvent&)> before_microbatch;
  // Instrumentation (a trace, a progress line; never changes what the executor does): after each
  // microbatch's step returned or failed (`out_of_memory`: it failed for memory), after each
  // re-plan, and before each optimizer step that is not skipped.
  std::function<void(const MicrobatchEvent&, bool out_of_memory)> after_microbatch;
  std::function<void(const ReplanEvent&)> on_replan;
  std::function<void(int64_t window)> before_optimizer_step;
  // Data parallel: not owned; null = one process, no collectives. Must outlive the executor; the
  // plan's world_size must equal communicator->world_size() (InputError otherwise). With one,
  // only rank 0 writes plan_out.
  Communicator* communicator = nullptr;
  // Optimizer state sharded over the communicator's ranks (ZeRO-1): each trainable parameter's
  // owner (accumplan/sharding.h zero_partition). The optimizer then holds this rank's parameters
  // only, and after each step every parameter takes its owner's values. Empty: not sharded.
  std::vector<int64_t> parameter_owners;
  // Ragged data: pass the padding mask as one more forward argument (StepConfig::padding_mask).
  bool padding_mask = false;
  Packing packing = Packing::Time;       // packed plans only
};

using ExecutorTotals = WindowTotals;

class Executor {
 public:
  // The optimizer must outlive the executor and hold the module's trainable parameters. Throws
  // InputError for a plan it cannot execute (sizes that do not sum to per_rank_batch).
  Executor(torch::jit::Module module, torch::optim::Optimizer& optimizer, Plan plan, ExecutorOptions options);
  ~Executor();

  // One window: gradients, then one optimizer step (unless skipped). window.size() in
  // 1..per_rank_batch (0..per_rank_batch for a rank of a data-parallel group, whose global
  // window must hold at least one sample).
  WindowStats step(const Batch& window);

  // The gradient half of step(): leaves the combined (unscaled, clipped) gradient in .grad and
  // does not step the optimizer. `sizes` (optional) overrides the split; they must sum to the
  // window's samples. For verification and tests; step() is accumulate() + apply(). No override
  // with a communicator (every rank must know every rank's split): InputError.
  WindowStats accumulate(const Batch& window, const std::vector<int64_t>& sizes = {});
  // The update half: lr schedule, optimizer step, scheduler callback; fills stepped/skipped.
  void apply(WindowStats& stats);

  // One forward and backward of the window's shortest sample (its first, for fixed-shape data),
  // not counted, not timed, then everything it touched put back: gradients to none, every buffer
  // (BatchNorm running statistics), the CPU's and the device's random generators (dropout).
  // Parameters, optimizer state and the loss scale are never touched.
  // Why: TorchScript's profiling executor runs a method's first call on its profiling graph and
  // the optimized graph from the second call on, whose autodiff subgraphs keep other tensors for
  // backward. The token benchmark's decoder (8 such subgraphs) measured 77,772,813 B in its first
  // window and 81,588,237 B in the same window run again: the plan predicts the second, and a
  // run's first window would otherwise not be the state its peak was predicted for.
  // A failure here is not an error: the first window raises its own (with its own shapes), or
  // recovers from its own out-of-memory; one sample may fail where a window does not.
  void warm_up(const Batch& window);

  const Plan& plan() const { return plan_; }
  const at::Device& device() const { return device_; }
  const ExecutorTotals& totals() const { return loop_.totals(); }
  // Packed plans: how the time model predicted the microbatches so far; nullopt for sample plans.
  std::optional<RunTimeModel> time_model() const;
  double loss_scale() const;

 private:
  class Backend;
  void log(const std::string& line) const;
  void zero_grads();
  WindowOptions window_options();

  torch::jit::Module module_;
  torch::optim::Optimizer& optimizer_;
  Plan plan_;
  ExecutorOptions options_;
  std::vector<at::Tensor> params_;
  at::Device device_;
  std::optional<LossScaler> scaler_;
  WindowLoop loop_;  // re-plans plan_ in place
  WindowOptions window_options_;
  std::unique_ptr<Backend> backend_;
  // Where microbatch steps run; dropped (joined) after an out-of-memory so the autograd work a
  // failed backward left queued on it is freed (executor/step_thread.h), made again on next use.
  std::unique_ptr<StepThread> step_thread_;
};

// [start, count) of each window of an epoch of `samples` samples in windows of `per_rank_batch`,
// in order, the last one short when per_rank_batch does not divide samples.
std::vector<std::pair<int64_t, int64_t>> epoch_windows(int64_t samples, int64_t per_rank_batch);

// The valid tokens of each sample of ragged data, what --target-tokens windows are cut by: its
// positions whose integer target is not `ignore_index` ([B,T] class targets), else its length
// (float per-token targets, or no target). InputError for data that is not ragged.
std::vector<int64_t> valid_tokens_per_sample(const Batch& data, int64_t ignore_index);

// The global windows of one epoch of `data` under `plan`, [start, count) in order: for a
// --target-tokens plan token_windows (accumplan/token_model.h) over valid_tokens_per_sample, else
// epoch_windows of plan.per_rank_batch × world_size samples.
std::vector<std::pair<int64_t, int64_t>> plan_windows(const Batch& data, const Plan& plan, int64_t ignore_index);

// Rank `rank`'s share of a global window under the strided rule: samples rank, rank+world,
// rank+2·world, ... (views, no copy). A window of 7 on 2 ranks: 4 and 3 samples; of 1: 1 and 0.
// Every rank can compute every share, which is why the rule is strided rather than blocks.
Batch stride_window(const Batch& window, int rank, int world_size);

// Rank `rank`'s share of a global window under `plan` (rank_slice: its consecutive share where the
// ranks differ, otherwise strided); InputError when the plan is not for `world_size` ranks.
Batch rank_window(const Batch& window, const Plan& plan, int rank, int world_size);

// Samples in a batch (dim 0 of every tensor); InputError naming `what` if they disagree or the
// batch has no tensors.
int64_t batch_samples(const Batch& batch, const std::string& what = "window");

}  // namespace accumplan
