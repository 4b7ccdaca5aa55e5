// accumplan/replan.h — the plan after an out-of-memory during training: same target batch, every
// microbatch strictly below the size that failed.
//
// What it is: docs/oom-contract.md, the re-planning step. The failing size becomes an upper
// bound (max_micro_batch = failing − 1). When the plan carries its profile points and budget, the
// planner's own make_plan solves again under that bound (so the split, weights, predicted peak
// and reason are the planner's); otherwise, or if the solver refuses, the same per-rank batch is
// re-split with split_samples (set_window: the one rule for a plan's sizes, weights and uniform
// split). Also the split of a short (last) window. Torch-free: the executor calls it, and so can
// any trainer that follows a plan.
// What it is not: the recovery itself (dropping references, zeroing gradients, replaying the
// window): that is Executor (executor.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "accumplan/schema.h"

namespace accumplan {

// The plan to continue with after microbatch size `failing_micro_batch` ran out of memory.
// Throws InfeasibleError when failing_micro_batch <= 1: nothing smaller exists, which is a budget
// problem, not something to retry. `note` (optional) receives how the new plan was made.
Plan replan_below(const Plan& plan, int64_t failing_micro_batch, std::string* note = nullptr);

// A packed plan (plan.tokens) after a microbatch of `failing_tokens` padded tokens ran out of
// memory: the token budget drops below it (and max_seq_len to at most the budget), the sample
// fields are re-split at budget / max_seq_len sequences, and the predicted peak is the worst
// packed microbatch under the new budget (the token model of the plan's profile, when it has one).
// Unconfirmed; `reason` says why. InfeasibleError when failing_tokens <= 1.
Plan repack_below(const Plan& plan, int64_t failing_tokens);

// Microbatch sizes for a window of `samples` (== per_rank_batch: the plan's own sizes; fewer: a
// short last window split with split_samples under the plan's largest microbatch, which was
// confirmed or survived training, so the short window never uses a size the full one did not).
// Where the ranks differ (plan.ranks), rank `rank`'s: its share and its own microbatches.
std::vector<int64_t> window_sizes(const Plan& plan, int64_t samples, int64_t rank = 0);

// ---- The evaluation batch (plan.eval, schema 1.7) ----
// Microbatches of `micro_batch` over `samples`, the last the remainder: 10 by 4 → 4, 4, 2.
std::vector<int64_t> eval_split(int64_t samples, int64_t micro_batch);
// An evaluation of `samples` under the plan: its eval microbatch, or the training microbatch when
// the plan has none (a plan from before 1.7, --no-eval, or none fits: the training one fits with
// gradients and the graph resident, which an eval step does not keep).
std::vector<int64_t> eval_sizes(const Plan& plan, int64_t samples);
// After an eval microbatch of `failing_size` samples ran out of memory: the size the samples from
// it on run at (half of it). InfeasibleError at one sample: nothing smaller exists.
int64_t eval_size_after_oom(int64_t failing_size);

}  // namespace accumplan
