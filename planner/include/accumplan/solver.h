// accumplan/solver.h — from a profile and a target batch to a plan.
//
// What it is: the arithmetic of docs/architecture.md "What the planner solves". T = B / W samples per rank
// per update; m_max = the largest microbatch predicted to fit budget·(1 − headroom), bounded by T,
// --max-micro-batch and --multiple-of; k = ceil(T / m_max); T split into k sizes that differ by at
// most one unit (`balanced`, 256 with m_max 60 → 52,51,51,51,51) or into equal sizes that divide T
// (`uniform`); weights n_i / T. With use_timing and measured step times, a larger k may be chosen
// if it is predicted at least 10% faster, and `reason` says so (off by default: timings of a few
// probe steps are noisy, and the plan should be the same from run to run).
// What it is not: a measurement. Plans from `accumplan plan` are `confirmed: false` until a real
// step at micro_batch has run (the profiler does that).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "accumplan/schema.h"
#include "accumplan/units.h"

namespace accumplan {

struct PlanRequest {
  int64_t target_batch = 0;
  int64_t world_size = 1;
  BudgetSpec budget;                      // unset: the profile device's total bytes
  double headroom = 0.10;                 // fraction of the budget kept free, in [0, 1)
  std::optional<int64_t> multiple_of;     // every microbatch a multiple of this
  std::optional<int64_t> max_micro_batch; // user bound, e.g. from a failed step
  std::string split = "balanced";         // balanced | uniform
  bool use_timing = false;                // opt-in: may pick a larger k when predicted >= 10% faster
};

// Splits `total` samples into `parts` sizes that differ by at most `unit`, larger ones first, all
// multiples of `unit` (which must divide `total`). balanced_split(256, 5) = 52,51,51,51,51.
std::vector<int64_t> balanced_split(int64_t total, int64_t parts, int64_t unit = 1);

// Largest d <= limit with d % unit == 0 and total % d == 0; 0 if none.
int64_t largest_divisor_at_most(int64_t total, int64_t limit, int64_t unit = 1);

// Microbatch sizes for `total` samples with microbatches of at most `max_micro_batch`: the fewest
// microbatches, balanced or uniform. Used for the plan's window and for a short last window.
std::vector<int64_t> split_samples(int64_t total, int64_t max_micro_batch, const std::string& split,
                                   int64_t unit = 1);

// The request's own checks (ranges, B divisible by W and by W·multiple_of), without a profile:
// callers that measure first run it before spending the measurement. Throws like make_plan.
void check_request(const PlanRequest& request);

// Throws InputError/InfeasibleError with a message that names the bad value and the fix.
Plan make_plan(const Profile& profile, const PlanRequest& request);

// Human summary for stderr: breakdown, chosen split, predicted peak against budget.
std::string describe_plan(const Plan& plan);

}  // namespace accumplan
