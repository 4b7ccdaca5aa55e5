// replan.cpp — re-planning below a failed microbatch size, a short window's split. See replan.h.
#include "accumplan/replan.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "accumplan/errors.h"
#include "accumplan/memory_model.h"
#include "accumplan/solver.h"
#include "accumplan/terms.h"
#include "accumplan/token_model.h"
#include "accumplan/units.h"

namespace accumplan {

std::vector<int64_t> eval_split(int64_t samples, int64_t micro_batch) {
  if (samples < 0 || micro_batch < 1) {
    throw InputError("an evaluation splits 0 or more samples into microbatches of at least 1; got " +
                     std::to_string(samples) + " samples by " + std::to_string(micro_batch));
  }
  // As a window, an evaluation call holds at most kMaxAccumulationSteps microbatches: a list that
  // long is a data set to evaluate in parts, not a call to allocate for.
  const int64_t count = samples / micro_batch + (samples % micro_batch != 0);
  if (count > kMaxAccumulationSteps) {
    throw InputError("an evaluation of " + std::to_string(samples) + " samples in microbatches of " +
                     std::to_string(micro_batch) + " needs " + std::to_string(count) + " microbatches, more than " +
                     std::to_string(kMaxAccumulationSteps) + "; evaluate the data in parts");
  }
  std::vector<int64_t> sizes;
  sizes.reserve(static_cast<size_t>(count));
  for (int64_t done = 0; done < samples; done += micro_batch) sizes.push_back(std::min(micro_batch, samples - done));
  return sizes;
}

std::vector<int64_t> eval_sizes(const Plan& plan, int64_t samples) {
  const int64_t m = plan.eval && plan.eval->micro_batch > 0 ? plan.eval->micro_batch : std::max<int64_t>(1, plan.micro_batch);
  return eval_split(samples, m);
}

int64_t eval_size_after_oom(int64_t failing_size) {
  if (failing_size <= 1) {
    throw InfeasibleError("evaluation ran out of memory at one sample: nothing smaller exists; free device memory "
                          "(the training state) or evaluate on a larger device");
  }
  return failing_size / 2;
}

std::vector<int64_t> window_sizes(const Plan& plan, int64_t samples, int64_t rank) {
  if (!plan.ranks.empty()) {  // ranks that differ: this rank's own window
    if (rank < 0 || rank >= static_cast<int64_t>(plan.ranks.size())) {
      throw InputError("rank " + std::to_string(rank) + " is not one of the plan's " + std::to_string(plan.ranks.size()) +
                       " ranks");
    }
    const RankWindow& w = plan.ranks[static_cast<size_t>(rank)];
    if (samples == w.per_rank_batch) return w.microbatch_sizes;
    if (samples < 1 || samples > w.per_rank_batch) {
      throw InputError("a window holds 1.." + std::to_string(w.per_rank_batch) + " samples on rank " +
                       std::to_string(rank) + " (its share, plan.ranks); got " + std::to_string(samples));
    }
    const int64_t cap = *std::max_element(w.microbatch_sizes.begin(), w.microbatch_sizes.end());
    return split_samples(samples, cap, plan.split == "uniform" ? "uniform" : "balanced", plan.multiple_of.value_or(1));
  }
  if (samples == plan.per_rank_batch) return plan.microbatch_sizes;
  // A plan with target_tokens windows by valid tokens: a window may hold more samples than the
  // per-rank batch, split under the same largest microbatch.
  const bool by_tokens = plan.tokens && plan.tokens->target_tokens;
  if (samples < 1 || (samples > plan.per_rank_batch && !by_tokens)) {
    throw InputError("a window holds 1.." + std::to_string(plan.per_rank_batch) + " samples (the plan's per-rank batch); got " +
                     std::to_string(samples));
  }
  // The plan's largest microbatch, not max_micro_batch: for 256 with m_max 60 the plan runs
  // 52,51,51,51,51, and a short window of 60 should run 30,30 rather than one 60 nobody ran.
  const int64_t cap = *std::max_element(plan.microbatch_sizes.begin(), plan.microbatch_sizes.end());
  return split_samples(samples, cap, plan.split == "uniform" ? "uniform" : "balanced", plan.multiple_of.value_or(1));
}

namespace {
// A re-split window's peak by the solver's rule (MemoryModel::predict_window_peak_bytes: the first
// microbatch, the steady ones and the optimizer step) from the plan's profile; a plan whose profile
// holds no line to refit (written by hand) has only its fit's steady line; nullopt without either.
std::optional<int64_t> resplit_peak_bytes(const Plan& plan, const std::vector<int64_t>& sizes) {
  if (plan.profile.points.size() >= 2) {
    try {
      return MemoryModel::fit(plan.profile).predict_window_peak_bytes(sizes);
    } catch (const InputError&) {
      // points that fit no line: the plan's summary below
    }
  }
  if (plan.fit.slope_bytes_per_sample > 0) {
    return MemoryModel::line_peak_bytes(plan.fit, *std::max_element(sizes.begin(), sizes.end()));
  }
  return std::nullopt;
}
}  // namespace

Plan replan_below(const Plan& plan, int64_t failing_micro_batch, std::string* note) {
  if (failing_micro_batch <= 1) {
    throw InfeasibleError(
        "out of memory at microbatch size 1: the model's weights, gradients and optimizer state plus one "
        "sample do not fit in the memory budget" +
        (plan.memory.budget_bytes > 0 ? " (" + std::to_string(plan.memory.budget_bytes) + " bytes)" : std::string()) +
        ". Nothing smaller can be tried; raise the budget, free device memory, or use a smaller model/sequence");
  }
  int64_t bound = failing_micro_batch - 1;
  if (plan.max_micro_batch > 0) bound = std::min(bound, plan.max_micro_batch);
  int64_t unit = plan.multiple_of.value_or(1);
  std::ostringstream how;
  if (unit > bound || plan.per_rank_batch % unit != 0) {
    how << option_name("--multiple-of") << " " << unit << " dropped (no multiple of it fits below " << failing_micro_batch << "); ";
    unit = 1;
  }

  Plan next = plan;
  bool solved = false;
  // A plan whose checkpointing was confirmed by its own window (a "confirm" in checkpoint.trials)
  // carries the profile of the windows without it: solving from that profile would size
  // microbatches that fit only without checkpointing, so it is re-split instead, checkpointing kept.
  const bool profile_is_the_plans =
      !plan.checkpoint || std::none_of(plan.checkpoint->trials.begin(), plan.checkpoint->trials.end(),
                                       [](const Trial& t) { return t.kind == "confirm"; });
  if (plan.profile.points.size() >= 2 && plan.memory.budget_bytes > 0 && profile_is_the_plans) {
    PlanRequest req;
    req.target_batch = plan.target_batch;
    req.world_size = plan.world_size;
    req.budget.bytes = plan.memory.budget_bytes;
    req.headroom = headroom_of(plan.memory.margin);
    if (unit > 1) req.multiple_of = unit;
    req.max_micro_batch = bound;
    req.max_micro_batch_set_by = "the out-of-memory at microbatch " + std::to_string(failing_micro_batch) + " during training";
    req.split = plan.split;
    // The fewest microbatches under the bound, whatever the original plan weighed: the
    // profile's step times are a few probe steps old and noisy, and a recovery that also trades
    // throughput guesses (seen: 16 x 4 where 4 x 16 fit) is harder to reason about than one
    // that only shrinks.
    req.use_timing = false;
    try {
      Plan solved_plan = make_plan(plan.profile, req);
      if (solved_plan.micro_batch <= bound && solved_plan.per_rank_batch == plan.per_rank_batch) {
        // Keep what the solver does not know about this run (the model file, its hash, device).
        solved_plan.model = plan.model;
        solved_plan.device = plan.device;
        solved_plan.setup = plan.setup;
        solved_plan.libtorch_version = plan.libtorch_version;
        // The eval batch was measured with the training state resident, not at a training size:
        // a smaller training microbatch leaves it as it was.
        solved_plan.eval = plan.eval;
        solved_plan.checkpoint = plan.checkpoint;  // the profile's windows ran with it
        next = solved_plan;
        solved = true;
        how << "solved again by the planner with max_micro_batch " << bound;
      }
    } catch (const InputError& e) {
      how << "the planner refused (" << e.what() << "), so ";
    }
  }
  if (!solved) {
    set_window(next, split_samples(plan.per_rank_batch, bound, plan.split == "uniform" ? "uniform" : "balanced", unit), bound,
               unit);
    if (const auto peak = resplit_peak_bytes(plan, next.microbatch_sizes)) next.memory.predicted_peak_bytes = *peak;
    if (next.sharding) {
      // A smaller window: no rank peaks above the new prediction, none above what it would have.
      for (int64_t& p : next.sharding->per_rank_peak_bytes) p = std::min(p, next.memory.predicted_peak_bytes);
    }
    how << "re-split " << plan.per_rank_batch << " samples under max_micro_batch " << bound;
  }
  if (unit == 1 && plan.multiple_of.value_or(1) != 1) next.multiple_of.reset();
  next.confirmed = false;
  next.confirmed_peak_bytes.reset();
  next.reason = (solved ? next.reason : plan.reason) + " Re-planned during training after microbatch " + std::to_string(failing_micro_batch) +
                " ran out of memory: " + std::to_string(next.accumulation_steps) + " microbatches (" +
                join_sizes(next.microbatch_sizes) + ").";
  if (note) *note = how.str();
  return next;
}

Plan repack_below(const Plan& plan, int64_t failing_tokens) {
  if (!plan.tokens) throw InputError("repack_below needs a packed plan (plan.tokens)");
  if (failing_tokens <= 1) {
    throw InfeasibleError("out of memory at a microbatch of 1 padded token: nothing smaller can be tried; raise the "
                          "budget or free device memory");
  }
  Plan next = plan;
  TokenBudget& tb = *next.tokens;
  tb.token_budget = std::min(tb.token_budget, failing_tokens - 1);
  tb.max_seq_len = std::min(tb.max_seq_len, tb.token_budget);
  const int64_t m_max = std::max<int64_t>(1, tb.token_budget / tb.max_seq_len);
  set_window(next, split_samples(plan.per_rank_batch, m_max, plan.split == "uniform" ? "uniform" : "balanced", 1), m_max, 1);
  try {
    next.memory.predicted_peak_bytes =
        TokenMemoryModel::fit(plan.profile).worst_packed_peak_bytes(tb.token_budget, tb.max_seq_len);
  } catch (const InputError&) {
    // No token profile to predict from (a plan written by hand): the old prediction stays, an upper bound.
  }
  next.confirmed = false;
  next.confirmed_peak_bytes.reset();
  next.reason = plan.reason + " Re-packed during training after a microbatch of " + std::to_string(failing_tokens) +
                " padded tokens ran out of memory: token budget " + std::to_string(tb.token_budget) + ".";
  return next;
}

}  // namespace accumplan
