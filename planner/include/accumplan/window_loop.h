// accumplan/window_loop.h — the one window algorithm and the one evaluation loop, for every
// executor: `accumplan run` (LibTorch, src/executor) and Python's train_window and evaluate (the
// user's nn.Module, through accumplan._core) run their windows through this code.
//
// What it is: everything about a window that does not need a tensor. A backend (WindowBackend,
// EvalBackend) does what only its executor can — count its share's units, run one microbatch's
// forward, loss and backward, exchange gradients, unscale, measure, scale and step — and this
// code decides the rest (docs/weighting.md, docs/oom-contract.md):
//   1. the split: the plan's sizes (window_sizes), or for a packed plan the pack of the window's
//      sequences under the token budget (pack_by_token_budget), cut by the PackingCost: the plan's
//      step cost, then the run's own fit over the microbatches it timed (CPU only: on CUDA a queued
//      step's wall time is not its device time);
//   2. the counts before the first backward, in ONE collective of [units, samples, valid tokens,
//      samples of rank 0 .. W-1, (packed) longest sequence of rank 0 .. W-1]: every rank weights
//      by the GLOBAL N and checks every rank's share the same way, so every rank raises alike;
//   3. the microbatches: each rank runs its own split (a rank with fewer or smaller microbatches
//      does not wait between them), stopping at its first failure; after its last, ONE collective of
//      every rank's status (0, the failing size on out-of-memory, -1 for another error) and failing
//      microbatch: the agreement point;
//   4. after an out-of-memory anywhere: the smallest failing size on every rank; the gradients set
//      to none and the failed microbatch's memory released, the plan re-planned below the size
//      (replan_below; packed: repack_below) and the window replayed from its first sample, so the
//      update is the original plan's, every sample counted once. At one sample (packed: below the
//      longest sequence), or with recovery off, ExecutorOomError;
//   5. the update, in this order: one gradient exchange (W > 1, the loss sum riding along); unscale
//      once (fp16), skip on a non-finite loss or gradient; clip the combined gradient; the learning
//      rate for the step, the optimizer step (the first one, which makes the optimizer's state,
//      after the device's cache is released), the scaler's update, the scheduler — the last only
//      after a real step.
// The evaluation loop (run_eval) is the same idea for forward-only microbatches: after an
// out-of-memory the samples from the failing microbatch on run at half its size
// (eval_size_after_oom), nothing skipped or counted twice.
// What it is not: torch-aware (no tensor crosses this header), a data loader, or a probe. The
// backend owns the model, the optimizer, the data and where memory is read.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "accumplan/errors.h"
#include "accumplan/schema.h"
#include "accumplan/step_time.h"
#include "accumplan/token_model.h"

namespace accumplan {

// An out-of-memory the loop could not (recovery off, one sample) or must not (during the optimizer
// step, when parameters may be half-updated) recover from. Exit code 2: the budget is the fix.
class ExecutorOomError : public InfeasibleError {
 public:
  using InfeasibleError::InfeasibleError;
};

// Where a microbatch is about to run or has run.
struct MicrobatchEvent {
  int64_t window = 0;         // 0-based index of the window among this loop's windows
  int64_t index = 0;          // 0-based microbatch index within the window
  int64_t size = 0;           // samples in this microbatch
  int64_t count = 0;          // microbatches in this attempt of the window
  int64_t attempt = 0;        // 0 first try; n after n out-of-memory recoveries in this window
  int64_t padded_tokens = 0;  // packed plans: size × the microbatch's longest sequence; else 0
};

// A re-plan after an out-of-memory.
struct ReplanEvent {
  int64_t window = 0;
  int64_t failing_size = 0;               // the size that ran out of memory (packed: padded tokens)
  std::vector<int64_t> microbatch_sizes;  // the new split (packed: this window re-packed)
  std::string note;                       // the re-planner's reason
  std::string line;                       // the one line logged for it
};

// After a real optimizer step.
struct StepEvent {
  int64_t optimizer_steps = 0;  // including this one
  int64_t window = 0;
  double loss = 0;
};

// One microbatch as the loop hands it to its backend.
struct Microbatch {
  MicrobatchEvent where;
  int64_t start = 0;             // its first sample in this rank's share (sample plans: a slice)
  std::vector<int64_t> samples;  // packed plans: its samples, longest first; empty otherwise
  int64_t padded_length = 0;     // packed plans: its longest sequence; 0 otherwise
};

// This rank's share of a window, counted by its backend on the host before the first backward.
struct ShareCounts {
  int64_t samples = 0;
  int64_t units = 0;              // this share's part of N: samples, or valid tokens in tokens mode
  int64_t valid_tokens = 0;       // non-ignored tokens of a token-shaped target, whatever the mode
  std::vector<int64_t> lengths;   // ragged data: each sample's sequence length; empty otherwise
  std::string normalization;      // what the units count: "samples" or "tokens"
};

// Step 2's agreement: this rank's share and, summed over the ranks in one collective, the window's
// units, samples and valid tokens, each rank's samples and the longest sequence (packed plans).
struct WindowCounts {
  ShareCounts share;                   // this rank's, as its backend counted it
  int64_t units = 0;                   // N
  int64_t samples = 0;
  int64_t valid_tokens = 0;
  std::vector<int64_t> rank_samples;   // samples of rank 0 .. W-1
  int64_t longest_sequence = 0;        // packed: the longest sequence on any rank
};

// With W > 1, samples/units/valid_tokens/loss are GLOBAL (summed over ranks) and
// local_samples/microbatch_sizes/peaks are this rank's.
struct WindowStats {
  int64_t samples = 0;                    // samples in the window (each counted once)
  int64_t units = 0;                      // N: samples, or valid tokens in tokens mode
  int64_t valid_tokens = 0;               // target != ignore_index, for token-shaped targets; else 0
  int64_t local_samples = 0;              // this rank's share (== samples in one process)
  std::vector<int64_t> microbatch_sizes;  // sizes of the attempt that completed (this rank's)
  int64_t microbatch_rounds = 0;          // rounds of the completed attempt (k_max over ranks)
  double loss = 0;                        // the window's mean loss: sum of unit losses / N
  std::optional<double> grad_norm;        // 2-norm of the combined, unscaled gradient before
                                          // clipping; computed only when clipping
  bool stepped = false;                   // the optimizer updated the parameters
  bool skipped = false;                   // non-finite loss or gradient (or no units): no update
  std::string skip_reason;
  int64_t oom_recoveries = 0;             // out-of-memory events recovered from in this window
  // The optimizer held its state before the window (or keeps none). False: this window's step
  // creates it, so its peak is below the steady windows' by up to the state's bytes.
  bool optimizer_state_ready = true;
  double loss_scale = 1;                  // fp16: the scale used through this window
  std::string normalization;              // what N counted: "samples" or "tokens"
  double seconds = 0;
  // Packed plans on the CPU: the completed attempt's microbatches, measured, and what the cut's
  // step cost predicted for them (nullopt: a cost without seconds, or packing by fill).
  std::optional<double> microbatch_seconds;
  std::optional<double> predicted_seconds;
  // Packed plans: the largest peak the plan's token model predicts for what this window ran, less
  // what was not resident yet (no gradient in a window's first microbatch, no optimizer state
  // before the first step), or the profile's optimizer-step peak where higher; nullopt without a
  // token profile.
  std::optional<int64_t> predicted_peak_bytes;
  std::optional<int64_t> peak_bytes;           // the backend's probe: the window's peak
  std::optional<int64_t> reserved_peak_bytes;  // a caching allocator's reserved peak, where one
};

struct WindowTotals : RunCounts {  // windows, steps, samples, tokens, OOM recoveries (schema.h)
  double seconds = 0;
  std::optional<int64_t> peak_bytes;           // max over windows
  std::optional<int64_t> reserved_peak_bytes;  // max over windows, where the probe has one
};

// How a window runs: the settings a caller chooses, and where its events go.
struct WindowOptions {
  bool oom_recovery = true;
  std::optional<double> max_grad_norm;  // clip the combined gradient's 2-norm to this
  Packing packing = Packing::Time;      // packed plans only
  // The fix named when a packed plan is handed data without sequence lengths, in the caller's terms.
  std::string ragged_data_fix = "load the data from a torch.save([list_of_1d_token_tensors, targets]) file";
  // One line per event (recoveries, skipped steps); none: dropped.
  std::function<void(const std::string&)> log;
  // Before each microbatch's forward, and after it returned or
  // failed (`out_of_memory`: it failed for memory); instrumentation, never changes the window.
  std::function<void(const MicrobatchEvent&)> before_microbatch;
  std::function<void(const MicrobatchEvent&, bool out_of_memory)> after_microbatch;
  std::function<void(const ReplanEvent&, const Plan&)> on_replan;  // the plan as re-planned
  std::function<void(int64_t window)> before_optimizer_step;
};

// What the loop asks of the executor that trains a window. One process is a group of one: the
// collectives are never called for it. Any failure but an out-of-memory is thrown and passes
// through the loop unchanged (on a rank of a group, after the agreement point).
class WindowBackend {
 public:
  virtual ~WindowBackend() = default;
  virtual int world_size() const { return 1; }
  virtual int rank() const { return 0; }
  // Element-wise sum over the ranks of the group (W > 1 only).
  virtual std::vector<int64_t> sum_over_ranks(const std::vector<int64_t>& values) { return values; }

  // This rank's share of the window; throws for a share it cannot count.
  virtual ShareCounts count_share() = 0;
  // Every trainable parameter's gradient to none; the window's loss sum to zero.
  virtual void begin_attempt() = 0;
  // Forward, loss sum, backward of sum / window_units of one microbatch; its loss sum joins the
  // window's. An out-of-memory is thrown, as the device raised it.
  virtual void run_microbatch(const Microbatch& microbatch, int64_t window_units) = 0;
  virtual bool is_out_of_memory(const std::exception& error) const = 0;
  // After an out-of-memory (the exception gone): gradients to none, what the failed step still
  // holds released, the device's cache emptied, the probe's flag cleared.
  virtual void after_out_of_memory() = 0;
  // This rank's loss sum of the completed attempt (the window's one host read).
  virtual double loss_sum() = 0;
  // Where exchanges() instead of loss_sum(): one exchange of every gradient (zeros where none)
  // with this rank's loss sum riding along; returns the global loss sum.
  virtual double exchange_gradients() { return loss_sum(); }
  // Whether the window's gradients go through exchange_gradients(): on a rank of two or more, and
  // in one process that rehearses a rank's exchange (planning windows for W ranks hold its buffers).
  virtual bool exchanges() const { return world_size() > 1; }

  // The update. fp16: the scale used through the window, and unscaling once (true: a non-finite
  // gradient). Without a scaler: 1 and false.
  virtual bool has_scaler() const { return false; }
  virtual double loss_scale() const { return 1.0; }
  virtual bool unscale_finds_non_finite() { return false; }
  virtual double gradient_norm() = 0;  // the combined gradient's 2-norm
  virtual void scale_gradients(double coefficient) = 0;
  // The learning rate for real step `step` (0-based), then the optimizer step.
  virtual void optimizer_step(int64_t step) = 0;
  // After the update: the scaler backs off (skipped) or grows; the scheduler advances when stepped.
  virtual void after_update(bool stepped, const StepEvent& event) {
    (void)stepped;
    (void)event;
  }
  // Before the loop's first step, when the optimizer has no state yet: cached blocks back to the
  // device (CUDA: emptyCache), so the state lands in fresh segments instead of splitting those the
  // first window's activations left cached, which every later window would then find fragmented.
  // Once per loop (an optimizer without state would otherwise empty the cache every step). No-op
  // where nothing is cached.
  virtual void release_cached() {}
  virtual void drop_gradients() = 0;  // every gradient to none, after the update
  virtual bool optimizer_state_exists() const = 0;
  // True where a microbatch's wall time is its device time (the CPU), so it can be learnt from.
  virtual bool wall_time_is_device_time() const = 0;
  // The budget the device enforces, for an out-of-memory's message; nullopt: the device's memory.
  virtual std::optional<int64_t> budget_bytes() const { return std::nullopt; }
};

class WindowLoop {
 public:
  // `plan` is re-planned in place after an out-of-memory; it must outlive the loop. Throws
  // InputError for a plan whose window breaks the reader's rules.
  explicit WindowLoop(Plan& plan);

  // Step 2 alone: this rank's share counted (and `check`ed) and agreed with every rank's in one
  // collective; a share that cannot be counted throws on every rank after it, the others naming
  // the rank and `during` ("while counting the units of window 3"). accumulate() starts with it;
  // a caller that only splits a window (accumplan.split) asks it alone.
  WindowCounts count_window(WindowBackend& backend, const std::string& during,
                            const std::function<void(const ShareCounts&)>& check = {}) const;
  // The gradient half of a window: leaves the combined (unscaled, clipped) gradient in the
  // backend and does not step. `sizes` (optional, one process only) overrides the first attempt's
  // split and must sum to the share's samples.
  WindowStats accumulate(WindowBackend& backend, const WindowOptions& options, const std::vector<int64_t>& sizes = {});
  // The update half: the optimizer step (unless skipped), the scaler and the scheduler; counts the
  // window in totals().
  void apply(WindowBackend& backend, const WindowOptions& options, WindowStats& stats);

  const Plan& plan() const { return plan_; }
  const WindowTotals& totals() const { return totals_; }
  WindowTotals& totals() { return totals_; }
  int64_t window_index() const { return window_index_; }
  // Packed plans: the cost the next window is cut by (packing by time: the run's fit once there
  // is one, else the plan's; by fill: none), and how the model predicted the microbatches so far.
  std::optional<TokenStepCost> packing_cost(Packing packing) const;
  PackingCost& packing_fit() { return packing_cost_; }
  std::optional<RunTimeModel> time_model(Packing packing) const;

 private:
  struct Attempt;
  struct Split;
  void check_counts(const WindowCounts& c, const WindowStats& st, bool packed, int world) const;
  int64_t rounds_for(WindowBackend& backend, const Split& split, const WindowCounts& c) const;
  Attempt run_attempt(WindowBackend& backend, const WindowOptions& options, const Split& split, int64_t attempt,
                      int64_t units);
  int64_t run_microbatch(WindowBackend& backend, const WindowOptions& options, const Split& split,
                         const MicrobatchEvent& where, int64_t start, int64_t units, Attempt& out,
                         std::exception_ptr& error);
  void recover(WindowBackend& backend, const WindowOptions& options, const Attempt& a, const Split& split,
               int64_t rounds, int64_t longest_sequence);
  ReplanEvent replan(int64_t failing_size, int failing_rank, const MicrobatchEvent& where, const std::string& what,
                     std::optional<int64_t> budget);
  ReplanEvent repack(int64_t failing_tokens, int64_t longest_sequence, const std::vector<int64_t>& lengths,
                     const MicrobatchEvent& where, const std::string& what, std::optional<int64_t> budget);
  void finish_gradient(WindowBackend& backend, WindowStats& st, const WindowOptions& options);
  void keep_times(const Attempt& a, WindowStats& st, bool device_times);
  [[noreturn]] void fail_oom(WindowBackend& backend, const std::string& message) const;

  Plan& plan_;
  WindowTotals totals_;
  int64_t window_index_ = 0;
  PackingCost packing_cost_;
  std::optional<PackedPeakPredictor> packed_peak_;
  // Each predicted microbatch's |predicted − measured| / measured, the first kMaxTimeErrors of the
  // run (8 bytes each: 0.5 MiB at most).
  std::vector<double> time_errors_;
  static constexpr size_t kMaxTimeErrors = 65536;
};

// ---- The evaluation loop ----

// What the evaluation loop asks of its executor. The caller sets eval mode and no_grad around
// run_eval; the backend sums the microbatches' losses and units.
class EvalBackend {
 public:
  virtual ~EvalBackend() = default;
  // Forward and loss sum of samples [start, start + size); keep_output: its output is held.
  virtual void eval_microbatch(int64_t index, int64_t start, int64_t size, bool keep_output) = 0;
  virtual bool is_out_of_memory(const std::exception& error) const = 0;
  virtual void after_out_of_memory() = 0;  // the cache emptied, the probe's flag cleared
  // The oldest held output goes to the caller's handler and is no longer held.
  virtual void hand_over_output() = 0;
};

struct EvalLoopOptions {
  bool oom_recovery = true;
  bool keep_outputs = false;  // each output held until the NEXT microbatch's forward has finished
  std::function<void(const std::string&)> log;  // one line per re-split
  std::function<void(int64_t index, int64_t size)> before_microbatch;
};

struct EvalOutcome {
  std::vector<int64_t> microbatch_sizes;  // as run, a re-split's included
  int64_t oom_recoveries = 0;
};

// Evaluates `samples` samples in microbatches of `sizes` (summing to them). After an out-of-memory
// (recovery on) the samples from the failing microbatch on run at eval_size_after_oom of its size;
// at one sample, ExecutorOomError; with recovery off the out-of-memory propagates.
EvalOutcome run_eval(EvalBackend& backend, int64_t samples, const std::vector<int64_t>& sizes,
                     const EvalLoopOptions& options);

// The gradient exchange's bucket: at most this many bytes per flat buffer (DDP's default).
constexpr int64_t kGradientBucketBytes = 25 * 1024 * 1024;

// The exchange's buckets, the one rule of both front ends: consecutive gradients of one dtype, in
// order, up to bucket_bytes each (one larger than that alone), each bucket one flat buffer and one
// collective. `gradients`: each one's (dtype, bytes); returns each bucket's indices into it.
std::vector<std::vector<size_t>> gradient_buckets(const std::vector<std::pair<std::string, int64_t>>& gradients,
                                                  int64_t bucket_bytes = kGradientBucketBytes);

}  // namespace accumplan
