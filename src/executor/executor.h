// executor/executor.h — runs a plan: one accumulation window per call, exactly weighted, with
// mixed precision, clipping of the combined gradient, scheduler gating and OOM recovery.
//
// What it is: the training loop's inner part (docs/weighting.md, docs/oom-contract.md), and the
// only window algorithm in accumplan: the profiler measures memory by running it, so a plan's
// peak is the peak this code reaches. `step(window)` takes the samples of one window (the plan's
// per-rank batch, or fewer for the last window of an epoch), and:
//   1. splits them into the plan's microbatch sizes (a short window: split_samples, own N);
//   2. counts the window's units N before the first backward — samples, or valid tokens
//      (target != ignore_index) in tokens mode — on the host, where the window's data lives;
//   3. sets every gradient to none, then for each microbatch runs the one microbatch step
//      (runtime/step.h: forward under autocast, loss sum, backward of loss_sum / N, × the loss
//      scale for fp16), so the accumulated gradient is the gradient of the window's mean loss;
//      the loss sums stay on the device and are read once, after the last microbatch;
//   4. fp16: unscales once, and a non-finite gradient (or loss) skips the step and backs the
//      scale off; clips the combined (unscaled) gradient to max_grad_norm (the norm is computed
//      only when clipping: it is a pass over every gradient and a host sync);
//   5. steps the optimizer once, then advances the scheduler / calls on_step — only if it stepped.
// Host syncs per window: one (the loss), plus one for the norm when clipping and the scaler's
// check in fp16.
// On an out-of-memory inside a microbatch (recognised by the memory probe's flag, because
// TorchScript rewraps c10::OutOfMemoryError as std::runtime_error) it drops that microbatch's
// tensors, sets the gradients to none, releases cached device memory, re-plans every microbatch
// below the failing size (replan.h: the solver again, on the profile the plan carries) and
// replays the window from its first sample: the update is the one the original plan would have
// made, every sample counted once. Microbatch steps run on a worker thread (step_thread.h) that is
// joined and replaced after every out-of-memory: LibTorch can keep a failed backward's memory
// on the thread that ran it (21.7 MB of squeezenet1_1's, measured), and a replay on that thread
// would start out of memory.
// One process is a group of one: the same algorithm runs for 1 and W ranks, the collectives below
// being the identity (and skipped) when W = 1.
// Data parallel (ExecutorOptions::communicator, docs/weighting.md "Several ranks"): each of W ranks
// calls step() with ITS share of the global window. The sharding is the caller's, and accumplan's
// own callers (`accumplan run`) use the strided rule: of every global window of B samples, rank r
// takes samples r, r+W, r+2W, ... — so a short last window of 7 on 2 ranks gives 4 and 3, never
// 5 and 2, and a window of 1 gives rank 1 no samples at all (it still joins every collective).
// Per window, step()
//   a. sums [units, samples, valid tokens, every rank's sample count] across ranks in ONE
//      collective before the first backward, so every microbatch on every rank is weighted by the
//      GLOBAL N (per-rank N is the 2024 transformers loss bug);
//   b. runs k_max microbatch rounds on every rank, k_max the largest split any rank has (known
//      from every rank's count); a rank with fewer microbatches runs empty rounds;
//   c. after each round, one small collective of every rank's status (0 ok, s > 0 OOM at size s,
//      -1 another error): the fixed agreement point per microbatch (as Composer does). On any OOM
//      every rank recovers with the SAME failing size (the smallest that failed), re-plans
//      identically and replays the window; on another rank's error every rank throws;
//   d. after the last round, ONE gradient exchange (Communicator::all_reduce_gradients: a few
//      flat buckets) of every trainable parameter's gradient (zeros where this rank made none) and
//      the loss sum; then unscale, non-finite check and clipping see the global gradient, so
//      every rank takes the same decision. Gradients are never all-reduced per microbatch.
//   Per window with W > 1: 1 gradient exchange and 1 + (rounds run, over all attempts) counter
//   reduces.
// Ragged data under a packed plan (plan.tokens, schema 1.3): step 1 packs instead of splitting —
// the window's sequences, sorted longest first, go into microbatches of at most the plan's token
// budget in padded tokens, each padded only to its own longest (pack_by_token_budget, the rule
// the Python reader follows too). Weighting is unchanged: N counts the window's valid tokens
// (padding targets are ignore_index), globally over ranks. An out-of-memory lowers the token
// budget below the failing microbatch's padded tokens, re-packs and replays; a sequence longer
// than the new budget on any rank ends the run (ExecutorOomError), since nothing can split it.
// Ragged data under a sample plan: the plan's sizes, each microbatch cut to its own longest
// sequence. With W > 1, each rank packs its own share; every rank's longest sequence travels in the counts
// collective and every attempt adds one collective of the ranks' microbatch counts.
// The cut of a packed window minimises predicted time (ExecutorOptions::packing, Packing::Time):
// at first by the plan's step cost (fitted from the profile's probe steps), then, on the CPU
// device, by the fit over this run's own microbatches (accumplan/step_time.h), redone after every
// window; there each microbatch (its gather and step) is timed and its prediction's miss kept for
// the run's stats, from completed attempts only. On CUDA a microbatch's wall time is not its
// device time (steps are queued, one sync per window): the plan's cost stays, and no time is
// recorded. With W > 1 each rank fits its own times and cuts its own share; the ranks still agree
// on the rounds (the largest count of any rank), and the stats hold rank 0's model.
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
#include "dist/communicator.h"
#include "runtime/amp.h"
#include "runtime/batch.h"
#include "runtime/loss.h"

namespace accumplan {

class StepThread;
class WindowSplit;

// Where a microbatch is about to run; passed to ExecutorOptions::before_microbatch.
struct MicrobatchEvent {
  int64_t window = 0;    // 0-based index of the window among this executor's windows
  int64_t index = 0;     // 0-based microbatch index within the window
  int64_t size = 0;      // samples in this microbatch
  int64_t count = 0;     // microbatches in this attempt of the window
  int64_t attempt = 0;   // 0 first try; n after n OOM recoveries in this window
  int64_t padded_tokens = 0;  // packed (token) plans: size × the microbatch's longest sequence; else 0
};

// A re-plan after an out-of-memory; passed to ExecutorOptions::on_replan.
struct ReplanEvent {
  int64_t window = 0;
  int64_t failing_size = 0;                // the microbatch size that ran out of memory (packed
                                           // plans: its padded tokens)
  std::vector<int64_t> microbatch_sizes;   // the new split of a full window (packed plans: of
                                           // this window, re-packed under the new token budget)
  std::string note;                        // the re-planner's reason
};

// Information handed to the scheduler after a real optimizer step.
struct StepEvent {
  int64_t optimizer_steps = 0;  // including this one
  int64_t window = 0;
  double loss = 0;
};

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
  // Testing and instrumentation hook, called before each microbatch's forward (not for the
  // empty rounds of a data-parallel rank that has fewer microbatches).
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
  // Ragged data: pass the padding mask as one more forward argument (StepConfig::padding_mask).
  bool padding_mask = false;
  Packing packing = Packing::Time;       // packed plans only
};

// With a communicator, samples/units/valid_tokens/loss are GLOBAL (summed over ranks) and
// local_samples/microbatch_sizes/peak_bytes are this rank's.
struct WindowStats {
  int64_t samples = 0;                   // samples in the window (each counted once)
  int64_t units = 0;                     // N: samples, or valid tokens in tokens mode
  int64_t valid_tokens = 0;              // target != ignore_index, for token-shaped targets; else 0
  int64_t local_samples = 0;             // this rank's share (== samples in one process)
  std::vector<int64_t> microbatch_sizes; // sizes of the attempt that completed (this rank's)
  int64_t microbatch_rounds = 0;         // rounds of the completed attempt (k_max over ranks)
  double loss = 0;                       // the window's mean loss: sum of unit losses / N
  std::optional<double> grad_norm;       // 2-norm of the combined, unscaled gradient before clipping;
                                         // computed only when clipping (a pass and a host sync)
  bool stepped = false;                  // the optimizer updated the parameters
  bool skipped = false;                  // non-finite gradient (or no units): no update
  std::string skip_reason;
  int64_t oom_recoveries = 0;            // OOM events recovered from in this window
  double loss_scale = 1;                 // fp16: the scale used through this window
  double seconds = 0;
  // Packed plans: the completed attempt's microbatches, forward + backward, measured; and as the
  // step cost the window was cut by predicted them (nullopt: a cost without seconds, or Fill).
  std::optional<double> microbatch_seconds;  // CPU only
  std::optional<double> predicted_seconds;
  // Packed plans: the largest peak the plan's token memory model (fitted from its profile)
  // predicts for the microbatches this window ran, less what was not resident yet (a window's
  // first microbatch has no gradient; before the first optimizer step, no lazily made optimizer
  // state), or the optimizer step's peak the profile measured where that is higher: the
  // prediction of what was run, to hold the measured peak against (the plan's own predicted peak
  // is the worst the budget allows, which a time-cut window may never reach).
  // nullopt when the plan carries no token profile.
  std::optional<int64_t> predicted_peak_bytes;
  std::optional<int64_t> peak_bytes;     // probe's peak during the window
  // The caching allocator's reserved peak (CUDA: what a GPU runs out on, and what a CUDA plan's
  // fit predicts); nullopt where the probe has no reserved figure (the CPU counting allocator).
  std::optional<int64_t> reserved_peak_bytes;
};

struct ExecutorTotals : RunCounts {  // windows, steps, samples, tokens, OOM recoveries (schema.h)
  double seconds = 0;
  std::optional<int64_t> peak_bytes;     // max over windows
  std::optional<int64_t> reserved_peak_bytes;  // max over windows, where the probe has one
};

// An out-of-memory the executor could not (recovery off) or must not (during the optimizer step,
// when parameters may already be half-updated) recover from. Exit code 2: the budget is the fix.
class ExecutorOomError : public InfeasibleError {
 public:
  using InfeasibleError::InfeasibleError;
};

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
  const ExecutorTotals& totals() const { return totals_; }
  // Packed plans: how the time model predicted the microbatches so far; nullopt for sample plans.
  std::optional<RunTimeModel> time_model() const;
  double loss_scale() const;

 private:
  struct WindowCounts;
  struct RoundsOutcome;
  // The pieces of accumulate(), in order (executor.cpp): (a) count, (b) rounds, each microbatch,
  // (c) agreement and recovery, (d) the gradient exchange.
  int world() const;
  int rank() const;
  std::vector<int64_t> sum_over_ranks(const std::vector<int64_t>& values) const;
  WindowCounts count_window(const Batch& window, const WindowSplit& split, WindowStats& st);
  void check_window_counts(const WindowCounts& c, const WindowStats& st, bool packed) const;
  int64_t rounds_for(const WindowSplit& split, const WindowCounts& c) const;
  // `seconds`: the microbatch's gather and step, measured (when it ran).
  int64_t run_microbatch(const WindowSplit& split, const MicrobatchEvent& where, int64_t start, double units,
                         at::Tensor& loss_total, std::string& what, std::exception_ptr& error, double& seconds);
  RoundsOutcome run_rounds(const WindowSplit& split, int64_t attempt, int64_t rounds, double units, at::Tensor& loss_total);
  void recover_from(const RoundsOutcome& o, const WindowSplit& split, int64_t attempt, int64_t rounds,
                    int64_t longest_sequence);
  void exchange_gradients(at::Tensor& loss_total);
  void finish_gradient(WindowStats& st);
  void recover(int64_t failing_size, const MicrobatchEvent& where, const std::string& what);
  // Packed plans: the token budget drops below the failing microbatch's padded tokens; a
  // sequence of any rank longer than the new budget cannot be helped (ExecutorOomError).
  void recover_packed(int64_t failing_tokens, int64_t longest_sequence, const std::vector<int64_t>& lengths,
                      const MicrobatchEvent& where, const std::string& what);
  // An OOM that is not recovered: drops the gradients, clears the probe's flag, throws.
  [[noreturn]] void fail_oom(const std::string& message);
  // Packed plans: the cost the next window is cut by (Packing::Time: the run's own fit once there
  // is one, else the plan's; Fill: none).
  std::optional<TokenStepCost> step_cost() const;
  // A microbatch that ran: predict its peak; on the CPU note its time and the prediction's miss
  // in the attempt's outcome.
  void time_microbatch(const WindowSplit& split, const MicrobatchEvent& where, double seconds, RoundsOutcome& out) const;
  // The completed attempt's times into the window's stats, the run's misses and the step time
  // fit (refitted for the next window). A failed attempt's are dropped: its replay runs them again.
  void keep_times(const RoundsOutcome& o, WindowStats& st);
  void log(const std::string& line) const;
  void zero_grads();

  torch::jit::Module module_;
  torch::optim::Optimizer& optimizer_;
  Plan plan_;
  ExecutorOptions options_;
  std::vector<at::Tensor> params_;
  at::Device device_;
  std::optional<LossScaler> scaler_;
  ExecutorTotals totals_;
  int64_t window_index_ = 0;
  // Where microbatch steps run; dropped (joined) after an out-of-memory so the autograd work a
  // failed backward left queued on it is freed (executor/step_thread.h), made again on next use.
  std::unique_ptr<StepThread> step_thread_;
  std::optional<PackingCost> packing_cost_;          // packed plans: fed this run's microbatches (CPU, Packing::Time)
  std::optional<PackedPeakPredictor> packed_peak_;   // packed plans: what a window is predicted to peak at
  // Each predicted microbatch's |predicted − measured| / measured, the first kMaxTimeErrors of
  // the run (8 bytes each: 0.5 MiB at most).
  std::vector<double> time_errors_;
  static constexpr size_t kMaxTimeErrors = 65536;
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
Batch shard_window(const Batch& window, int rank, int world_size);

// Samples in a batch (dim 0 of every tensor); InputError naming `what` if they disagree or the
// batch has no tensors.
int64_t batch_samples(const Batch& batch, const std::string& what = "window");

}  // namespace accumplan
