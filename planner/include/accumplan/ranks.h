// accumplan/ranks.h — ranks that differ: each rank's share of the global window and its own
// microbatch, so that ranks with less memory or less speed finish a window with the others.
//
// What it is: pure functions of profiles, budgets and a request. `plan_ranks` gives each rank the
// largest microbatch its own budget allows (the one solver, make_plan, on that rank's profile),
// then the shares of the target batch that finish a window soonest: each rank runs its own
// microbatches and the ranks meet once, after the last, so a window takes the slowest rank's time
// (each rank's own step-time model, TimeModel).
// `rank_view` is the plan one rank trains by; `replan_rank` re-plans one rank after it ran out of
// memory, the shares kept; `rank_share` is the part of a global window a rank takes.
// What it is not: the weighting (the window loop weights by the global count, so any share is
// exact), nor a sharding of state (accumplan/sharding.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "accumplan/memory_model.h"
#include "accumplan/schema.h"
#include "accumplan/solver.h"
#include "accumplan/units.h"

namespace accumplan {

// What the share rule knows of one rank: its largest microbatch and its step times.
struct RankCapacity {
  int64_t max_micro_batch = 0;
  TimeModel time;
};

// The predicted seconds of a window whose rank r runs `splits[r]`: the slowest rank's microbatches
// (each rank runs its own, and the ranks meet once, after the last).
double ranks_window_seconds(const std::vector<RankCapacity>& ranks, const std::vector<std::vector<int64_t>>& splits);

// Each rank's share of `target_batch` samples (each a multiple of `unit`, at least one unit): the
// shares of least ranks_window_seconds when each rank splits its share into its fewest microbatches.
std::vector<int64_t> choose_shares(const std::vector<RankCapacity>& ranks, int64_t target_batch, int64_t unit = 1);

// The plan of request.world_size ranks with their own budgets: `profiles` one per rank (each
// measured on its own device) or one for all, `budgets` one per rank (an unset one: that rank's
// profiled device total). InputError naming the mismatch, or the rank that fits no sample.
Plan plan_ranks(const std::vector<Profile>& profiles, const std::vector<BudgetSpec>& budgets,
                const PlanRequest& request);

// The same from each rank's own plan (made on that rank's device for request.world_size ranks,
// under its budget, its profile holding its confirmations): their profiles and budgets, rank 0's
// request. InputError naming a plan whose target, world size or model differs from rank 0's.
Plan plan_ranks(const std::vector<Plan>& own);

// The plan rank `rank` trains by: the plan's window fields set to that rank's (a plan without
// ranks: itself).
Plan rank_view(const Plan& plan, int64_t rank);

// `plan` after rank `rank` ran out of memory at microbatch `failing_micro_batch`: that rank's
// window re-planned below it (replan_below on its view), every share kept. `note` as replan_below's.
Plan replan_rank(const Plan& plan, int64_t rank, int64_t failing_micro_batch, std::string* note = nullptr);

// The samples [start, start + count) of a global window of `samples` that rank `rank` takes under
// a plan with ranks: consecutive shares in rank order, each share scaled to a short window
// (floor(samples · shares before r / target_batch)), so a full window gives each rank its share.
std::pair<int64_t, int64_t> rank_share(const Plan& plan, int64_t rank, int64_t samples);

// The samples of a global window that a rank trains: [start, stop), every step-th.
struct SampleSlice {
  int64_t start = 0, stop = 0, step = 1;
};
// Rank `rank` of `world_size` under the strided rule: samples rank, rank + W, rank + 2W, ... (a
// window of 7 on 2 ranks: 4 and 3; of 1: 1 and 0). InputError for a rank outside the group.
SampleSlice strided_slice(int64_t rank, int64_t world_size, int64_t samples);
// Rank `rank`'s part of a global window of `samples` under `plan`: its consecutive share where the
// ranks differ (rank_share), otherwise strided. `accumplan run` and Python's Plan.rank_slice both cut by it.
SampleSlice rank_slice(const Plan& plan, int64_t rank, int64_t samples);

// The most samples rank `rank` may be handed in a window: its share, or the plan's per-rank batch.
int64_t rank_batch(const Plan& plan, int64_t rank);

// The plan reader's rules for $.ranks (SchemaError naming the field): one per rank, shares that
// sum to target_batch, each rank's split summing to its share within its max_micro_batch, rank 0
// equal to the plan's window fields, no sharding or token budget beside them.
void check_rank_windows(const Plan& plan);

// Each rank's budget from `--memory-budget` text: one value for every rank, or one per rank
// separated by commas ("24MiB,64MiB"). InputError naming `what` when the count is not 1 or W.
std::vector<BudgetSpec> parse_rank_budgets(const std::string& text, int64_t world_size, const std::string& what);

}  // namespace accumplan
