// accumplan/step_time.h — how long a microbatch of b sequences padded to L tokens takes, fitted
// from timed microbatches: what packing minimises.
//
// What it is: `fit_step_time`, a robust, non-negative weighted least-squares fit of
//     seconds(b, L) = t0 + t1·b·L + t2·b·L²                (forward + backward of one microbatch)
// t0 is the per-microbatch cost (launches, the optimizer-free per-step overhead), t1 the
// per-token cost, t2 the per-token cost that grows with the sequence (attention). Every
// coefficient is >= 0 and t1 > 0: of the fits over the subsets of {t0, t2} beside t1, the one of
// least weighted squared error whose coefficients are all >= 0. Weights 1/seconds (a relative
// error, softened: the window's time is a sum, so the long microbatches matter more). Robust:
// microbatches whose relative miss is over max(10%, 5× the median miss) are set aside (at most a
// quarter of them) and the fit is redone, up to three times. On 2 shared CPU cores one step in
// twenty runs 2–3× its usual time, and one such point can pull the profile's fit so far that a
// gate on the whole fit (a 25% miss) would drop it, leaving packing to fill each microbatch —
// 0.72× the throughput of a plain sorted split on the token benchmark.
// `StepTimeModel` keeps a run's most recent microbatches (kRecentMicrobatches) and refits from
// them: `accumplan run` cuts each window where the fit over its own earlier microbatches predicts
// the least time; the profile's probe times are only the plan's starting point.
// What it is not: a memory model (token_model.h keeps every microbatch within the budget), nor
// torch-aware: callers time the microbatches.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "accumplan/schema.h"

namespace accumplan {

// One timed microbatch: `micro_batch` sequences padded to `seq_len` tokens, forward + backward.
struct TimedMicrobatch {
  int64_t micro_batch = 0;
  int64_t seq_len = 0;
  double seconds = 0;
};

struct StepTimeFit {
  double per_microbatch_seconds = 0;     // t0
  double per_token_seconds = 0;          // t1 (> 0)
  double per_token_squared_seconds = 0;  // t2: per sequence, per L²
  int64_t used = 0;                      // microbatches the fit kept
  int64_t set_aside = 0;                 // microbatches left out as outliers
  double median_abs_error = 0;           // relative miss over the kept microbatches

  double predict_seconds(int64_t micro_batch, int64_t seq_len) const;
  // t0 raised to at least `seconds`: what a microbatch costs beyond its forward and backward, timed
  // around them, when the fit over the steps alone finds (almost) none.
  StepTimeFit with_microbatch_floor(double seconds) const;
  // In the plan's integer units (per_token = kStepCostPerToken), token_seconds = t1: what
  // pack_by_token_budget minimises. Coefficients below a 65536th of a token's time round to 0.
  TokenStepCost cost() const;
};

// nullopt when the microbatches cannot say what a token costs: fewer than 4 of them at fewer than
// 3 distinct shapes (b, L), a time that is not positive and finite, or no fit with t1 > 0.
std::optional<StepTimeFit> fit_step_time(const std::vector<TimedMicrobatch>& microbatches);

// A window timed whole beside its microbatches' own steps.
struct WindowTime {
  double seconds = 0;        // the window's wall time
  double step_seconds = 0;   // the sum of its microbatches' forward + backward
  int64_t microbatches = 0;
};

// The median over windows of what each took beyond its microbatches' steps, per microbatch; 0 when
// none is given. The floor of a packing cost's t0: a fit over step times alone can find t0 = 0 and
// then prices a microbatch of one sequence as free, though each microbatch also costs what runs
// around its step (its gather, the hooks, the loop).
double microbatch_overhead_seconds(const std::vector<WindowTime>& windows);

// The seconds a plan's step cost predicts for one microbatch; nullopt when the cost has no
// seconds (plans before 1.5, or a cost given by hand).
std::optional<double> predicted_seconds(const TokenStepCost& cost, int64_t micro_batch, int64_t seq_len);

// A run's own microbatches, the most recent kRecentMicrobatches: older ones drop out, so the fit
// follows the machine as it goes (and host memory stays bounded: 24 bytes each).
class StepTimeModel {
 public:
  static constexpr size_t kRecentMicrobatches = 512;

  void observe(const TimedMicrobatch& microbatch);
  // Refits from the microbatches held; the previous fit stays when the new one cannot be made.
  // Returns whether a fit exists now.
  bool refit();
  const std::optional<StepTimeFit>& fit() const { return fit_; }
  int64_t refits() const { return refits_; }
  size_t held() const { return recent_.size(); }

 private:
  std::deque<TimedMicrobatch> recent_;
  std::optional<StepTimeFit> fit_;
  int64_t refits_ = 0;
};

// How a packed plan cuts each window under its token budget (pack_by_token_budget): `accumplan run
// --packing` and Python's train_window(packing=) take these names, in this order.
enum class Packing {
  Time,  // where the step time model predicts the least time (the plan's cost, then the run's own fit)
  Fill,  // each microbatch filled to the budget: the fewest microbatches, no time model
};
const std::vector<std::string>& packing_names();  // {"time", "fill"}, the enum's order
const std::string& packing_name(Packing packing);
std::optional<Packing> packing_named(const std::string& name);

// The cost a run cuts its next packed window by (packing by time): its own fit over the microbatches
// it timed once one exists, else the plan's step cost (tokens.step_cost; none: packing fills). The
// run's fit never prices a microbatch below what one took beyond its step in the run's own windows
// (the median over recent ones), or, before any window was timed whole, below the plan's t0.
// `accumplan run` (CPU) and Python's train_window (CPU) keep one per run and feed it every packed
// microbatch's time; on CUDA nothing is observed (a queued step's wall time is not its device time).
class PackingCost {
 public:
  explicit PackingCost(std::optional<TokenStepCost> plan_cost) : plan_cost_(std::move(plan_cost)) {}
  static constexpr size_t kRecentWindows = 64;
  // A window's timed microbatches, then one refit (as each window ends). `rounds_seconds`, when
  // known, is the wall time of all its microbatches with what runs between them.
  void observe_window(const std::vector<TimedMicrobatch>& microbatches, std::optional<double> rounds_seconds = std::nullopt);
  std::optional<TokenStepCost> cost() const;
  const StepTimeModel& model() const { return model_; }
  // The per-microbatch floor the run's fit is held to (seconds).
  double microbatch_floor_seconds() const;

 private:
  std::optional<TokenStepCost> plan_cost_;
  StepTimeModel model_;
  std::deque<WindowTime> windows_;  // the most recent kRecentWindows timed whole

};

}  // namespace accumplan
