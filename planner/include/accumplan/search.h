// accumplan/search.h — the measurement search: which real window to run next, and what its peak
// says. One search, two executors.
//
// What it is: the probe schedule and the confirmation of a plan (docs/architecture.md "What the
// profiler measures"), written against a WindowRunner that runs one real training window and
// reports its peaks. `accumplan profile`/the main job pass the C++ executor's window on a
// TorchScript module (src/profiling/probe_runner.h); Python's `accumplan.plan` passes a window of
// `train_window`'s own microbatch step on the user's nn.Module (python/core/core.cpp). Both get
// the same sizes in the same order for the same peaks:
//   profile()           windows of two microbatches of b for the probe sizes (2, 4), then, while
//                       the fit predicts more than 4x the largest size measured, one at half that
//                       prediction (at most two); variable-length data: the (b, T) grid and
//                       one window of the shortest length at the token budget's worth; sharded
//                       state: one window per other share holding it (run_rank_window)
//   plan_and_confirm()  make_plan; a plan no real window covers is confirmed by a window at its
//                       largest allowed size (bisecting below a failure), then climbs while the
//                       refit predicts a larger size within the budget (at most two while none
//                       failed; after a failure, bisecting up toward the line's largest below it
//                       until within 3%), six windows in all; then, where only a larger window
//                       covers the plan's, one window of the plan's own head
// Every window is recorded as a Trial, judged against the budget here (the one rule: finished,
// and its highest peak within the budget).
// What it is not: an executor, a memory probe or torch-aware: it never allocates a tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "accumplan/checkpoint.h"
#include "accumplan/schema.h"
#include "accumplan/solver.h"
#include "accumplan/tensor_spec.h"

namespace accumplan {

// One real window: the peaks of its microbatches and of its optimizer step, persistent memory
// included, the window's data excluded.
struct WindowMeasurement {
  int64_t micro_batch = 0;
  std::vector<int64_t> sizes;            // the window's microbatch sizes, in order
  bool oom = false;                      // an allocation failed (the window did not finish)
  bool fit = false;                      // finished, and every peak within the budget (the search sets it)
  int64_t peak_bytes = 0;                // the microbatches' peak (0 after an OOM)
  int64_t first_microbatch_peak_bytes = 0; // the first microbatch's, no gradient resident yet
  int64_t steady_peak_bytes = 0;         // the later microbatches', gradients resident (0: k = 1)
  int64_t optimizer_step_peak_bytes = 0; // peak after the microbatches: the gradient exchange, if made, and optimizer.step()
  int64_t max_peak_bytes = 0;            // highest peak over the whole window
  std::optional<int64_t> reserved_peak_bytes;  // caching allocators only
  double step_seconds = 0;               // the faster microbatch, forward + backward
  double seconds = 0;                    // the whole window (its cost as a Trial)
};

// One evaluation window: microbatches of these sizes through the forward under no_grad
// in eval mode, the loss summed, with what stays resident in a mid-training evaluation (weights and
// optimizer state; gradients freed as zero_grad(set_to_none=True) leaves them).
struct EvalMeasurement {
  std::vector<int64_t> sizes;
  bool oom = false;                     // an allocation failed
  bool fit = false;                     // finished, every peak within the budget (the search sets it)
  std::vector<int64_t> peak_bytes;      // each microbatch's peak, the training state included, the data not (empty after an OOM)
  double seconds = 0;
};

// The window each runner measures persistent memory with before the search starts (gradients:
// the delta across its backward; optimizer state: across its step): one microbatch of two
// samples. Not one: BatchNorm in training mode refuses a batch of one ("Expected more than 1
// value per channel"), and the deltas do not depend on the batch.
constexpr int64_t kPersistentWindowSamples = 2;

// Under which limit the search runs a window; Search::limit_bytes turns it into the bytes the
// runner is handed, the one rule for every runner.
enum class WindowBudget {
  Enforced,  // the budget planned for (none when no budget was given)
  Doubled,   // twice it: only asked where the budget is simulated (SearchSettings::budget_is_simulated)
  Lifted,    // none: persistent memory or the smallest probes do not fit, measured to explain by how much
};

// Who runs the windows. An out-of-memory is reported (oom = true, peaks 0), never thrown; any
// other failure (the model rejecting its inputs) is thrown and ends the search. `limit_bytes`:
// what the window may allocate on the device, the data excluded (nullopt: no limit).
class WindowRunner {
 public:
  virtual ~WindowRunner() = default;
  // One window of these microbatch sizes and its optimizer step. seq_len > 0: every sample a
  // sequence of exactly seq_len tokens (variable-length data); 0: fixed shapes.
  virtual WindowMeasurement run_window(const std::vector<int64_t>& sizes, int64_t seq_len,
                                       std::optional<int64_t> limit_bytes) = 0;
  // One evaluation window (EvalMeasurement); an OOM is reported, not thrown. nullopt: this runner
  // does not evaluate, and the plan gets no evaluation batch.
  // keep_outputs: each microbatch's outputs stay on the device until the next microbatch's forward
  // has finished (a loop that moves them to the host one microbatch behind), so a microbatch's
  // peak holds the previous one's outputs.
  virtual std::optional<EvalMeasurement> run_eval_window(const std::vector<int64_t>& /*sizes*/, int64_t /*seq_len*/,
                                                         std::optional<int64_t> /*limit_bytes*/,
                                                         bool /*keep_outputs*/) {
    return std::nullopt;
  }
  // Sharded optimizer state: a window of `sizes` whose optimizer holds rank `rank`'s share beside
  // the largest share's, after one window that lets it allocate that state; its peaks as this
  // process holds them, the largest share's state still resident (the search takes it off).
  // nullopt: this runner holds no other share.
  virtual std::optional<WindowMeasurement> run_rank_window(int64_t /*rank*/, const std::vector<int64_t>& /*sizes*/,
                                                           int64_t /*seq_len*/,
                                                           std::optional<int64_t> /*limit_bytes*/) {
    return std::nullopt;
  }
  // Applies activation checkpointing of these modules (candidate names, accumplan/checkpoint.h) to
  // every later window; empty: none. The default refuses any module: a TorchScript module's blocks
  // cannot be wrapped.
  virtual void set_checkpointing(const std::vector<std::string>& modules);
};

struct SearchSettings {
  std::optional<int64_t> budget_bytes;  // planned for and enforced; unset: the device's own limit
  bool budget_is_simulated = false;     // windows may run under twice the budget (MemoryProbe::budget_is_simulated)
  int64_t device_total_bytes = 0;       // as the profile records it (CPU: the budget)
  std::string device_name;              // for messages: "cpu (counting allocator)"
  bool persistent_over_budget = false;  // persistent memory alone did not fit: windows run Lifted
  // Measured first; then, while the fit predicts more than 4x the largest, one size halfway toward
  // the budget's predicted maximum (search.cpp has the numbers behind both).
  std::vector<int64_t> probe_sizes = {2, 4};
  int64_t max_probe_micro_batch = 0;    // per-rank target: probes above it are skipped, the two smallest kept (0: none)
  std::optional<SeqLenRange> seq_range; // variable-length data: the lengths planned for
  std::function<void(const std::string&)> progress;  // one line per real window, no trailing newline
};

// The evaluation batch a plan made from a saved profile states (`accumplan plan --profile`): the
// largest size the profile's eval line fits under the plan's usable bytes (at most 256x the
// training microbatch), unconfirmed — no eval window ran at it. nullopt when the profile has no
// eval window (or fewer than two sizes in it).
std::optional<EvalPlan> eval_from_profile(const Plan& plan);

class Search {
 public:
  // `runner` must outlive the search. `trials` holds the windows run before it (the persistent-
  // memory step) and gets every window the search runs.
  Search(WindowRunner& runner, SearchSettings settings, std::vector<Trial>& trials);

  // The probe schedule: appends points and trials to `p` (whose header the caller filled). Throws
  // InfeasibleError when fewer than two sizes ran.
  void profile(Profile& p);
  // Plans from `profile` and confirms by real windows; appends them to profile.trials and points.
  // Throws InfeasibleError when not even microbatch 1 runs.
  Plan plan_and_confirm(Profile& profile, PlanRequest request);
  // The evaluation batch beside `plan`, in at most two eval windows: microbatches of the
  // plan's m and 2m (past a simulated budget) give the eval line; one window at the largest size
  // the line fits under plan.memory.usable_bytes confirms it, and the line is refitted with its
  // point. A confirmation that fails leaves the largest measured size that fit (unconfirmed sizes
  // are never planned). Packed plans evaluate sequences of max_seq_len. nullopt when the runner
  // does not evaluate; micro_batch 0 when not even m fits. keep_outputs: every size runs twice in a
  // row and the second's peak (the first's outputs held) is the point, so the plan counts them.
  std::optional<EvalPlan> plan_eval(const Plan& plan, bool keep_outputs = false);
  // `accumplan profile` (no plan yet): one eval window at the two largest sizes the profile ran
  // within the budget (b and 2b when it has one), past a simulated budget, into `p.eval`.
  // Variable-length data: sequences of the longest length planned for. No window when the runner
  // does not evaluate or no size fit.
  void profile_eval(Profile& p, bool keep_outputs = false);
  // Activation checkpointing: `plan`'s windows ran with `applied` checkpointed (none;
  // all when nothing fitted without), `blocks` the candidates' measured costs. choose: the set of
  // least predicted window time (choose_checkpointing); one other than `applied` is confirmed by
  // one real window at its largest size, the runner applying it, recorded in checkpoint.trials;
  // when that window does not fit, the plan stays `plan` (and the runner back at `applied`).
  // Without choose, or when `applied` wins, `plan` states `applied` (plan_stating_checkpointing).
  // `costs`: the window that measured the blocks (kind "costs"), first in checkpoint.trials.
  // `head_bytes_per_sample`: measured with the blocks (CheckpointModel).
  Plan plan_checkpointing(const Plan& plan, std::vector<BlockCost> blocks, double head_bytes_per_sample,
                          const CheckpointSet& applied, bool choose, const Trial& costs);
  // Runs and judges one window, recording nothing; `micro_batch` labels it.
  WindowMeasurement run(const std::vector<int64_t>& sizes, int64_t micro_batch, int64_t seq_len, WindowBudget budget);
  // The bytes a window under `budget` may allocate: the budget, twice it, or none (nullopt; also
  // Enforced without a budget).
  std::optional<int64_t> limit_bytes(WindowBudget budget) const;

 private:
  // Doubled where the budget is simulated, else Enforced.
  WindowBudget past_the_budget() const;
  bool can_pass_budget() const { return settings_.budget_is_simulated && settings_.budget_bytes.has_value(); }
  void probe_until_peak_grows(Profile& p, bool lifted, const std::function<void(const WindowMeasurement&)>& record);
  void extend_linear_tail(Profile& p, int64_t largest_scheduled,
                          const std::function<void(const WindowMeasurement&)>& record);
  void profile_tokens(Profile& p);
  void profile_samples(Profile& p);
  // Sharded state: each other share's optimizer step (ranks_to_measure) into p.sharding->other_ranks.
  void profile_other_ranks(Profile& p);
  // One window of the shortest sequences planned for, the token budget's worth (`probe(b, T)`).
  void profile_short_sequences(const Profile& p, int64_t grid_shortest, const std::function<void(int64_t, int64_t)>& probe);
  // Windows (one sequence, a third and two thirds of the token budget) at the middle of the
  // interval between measured lengths where the token model is least certain, until every
  // interval is within half a percent (at most six).
  void profile_knees(Profile& p, const std::function<void(int64_t, int64_t)>& probe);
  Plan plan_and_confirm_tokens(Profile& profile, PlanRequest request);
  void say(const std::string& line) const;
  // Before a window that the pace of the windows so far (seconds per sample-token) predicts at
  // a second or more: its sizes, that estimate and how many more windows `phase` may run.
  void announce(const std::string& phase, const std::vector<int64_t>& sizes, int64_t seq_len, int more_at_most) const;
  void count_pace(const std::vector<int64_t>& sizes, int64_t seq_len, double seconds);
  void count_pace(const Profile& profile);  // its timed windows, where this search has timed none
  // `more_at_most`: the eval windows that may follow it (for announce).
  std::optional<EvalMeasurement> run_eval(const std::vector<int64_t>& sizes, int64_t seq_len, WindowBudget budget,
                                          EvalPlan& e, int more_at_most);

  WindowRunner& runner_;
  SearchSettings settings_;
  std::vector<Trial>& trials_;
  double paced_seconds_ = 0;  // the windows that finished: their seconds and samples x max(1, T)
  double paced_units_ = 0;
};

}  // namespace accumplan
