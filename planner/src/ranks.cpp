// ranks.cpp — ranks that differ: shares, each rank's window, its re-plan. See ranks.h.
#include "accumplan/ranks.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <sstream>

#include "accumplan/checked.h"
#include "accumplan/errors.h"
#include "accumplan/replan.h"
#include "accumplan/terms.h"

namespace accumplan {

namespace {

// The predicted seconds of rank r's share of `units` units split into its fewest microbatches
// (balanced: sizes differing by at most one unit).
double share_seconds(const RankCapacity& rank, int64_t units, int64_t unit) {
  if (units <= 0) return 0;
  const int64_t cap = rank.max_micro_batch / unit;
  const int64_t k = (units + cap - 1) / cap, q = units / k, longer = units % k;
  return static_cast<double>(longer) * rank.time.predict_seconds((q + 1) * unit) +
         static_cast<double>(k - longer) * rank.time.predict_seconds(q * unit);
}

// The most units rank r takes within `seconds` (at least one: every rank takes a microbatch).
int64_t units_within(const RankCapacity& rank, double seconds, int64_t units, int64_t unit) {
  int64_t lo = 1, hi = units;  // share_seconds grows with the share
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (share_seconds(rank, mid, unit) <= seconds) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// A rank's step of the plan: its rank number named in what the solver says.
Plan solve_rank(const Profile& profile, const PlanRequest& request, size_t rank) {
  try {
    return make_plan(profile, request);
  } catch (const InfeasibleError& e) {
    throw InfeasibleError("rank " + std::to_string(rank) + ": " + e.what(), e.detail());
  } catch (const InputError& e) {
    throw InputError("rank " + std::to_string(rank) + ": " + e.what(), e.detail());
  }
}

void check_rank_request(const std::vector<Profile>& profiles, const std::vector<BudgetSpec>& budgets,
                        const PlanRequest& request) {
  const int64_t W = request.world_size;
  auto count_ok = [W](size_t n) { return n == 1 || static_cast<int64_t>(n) == W; };
  if (W < 2 || profiles.empty() || !count_ok(profiles.size()) || !count_ok(budgets.size())) {
    throw InputError("ranks that differ need " + option_name("--world-size") + " of at least 2 and one profile and one " +
                     option_name("--memory-budget") + " for every rank, or one for all; got world size " +
                     std::to_string(W) + ", " + std::to_string(profiles.size()) + " profile(s) and " +
                     std::to_string(budgets.size()) + " budget(s)");
  }
  if (request.target_tokens) {
    throw InputError("ranks that differ are planned for fixed-shape samples; a " + option_name("--target-tokens") +
                     " plan gives every rank one budget: give one " + option_name("--memory-budget"));
  }
  for (const Profile& p : profiles) {
    if (p.sharding) {
      throw InputError("ranks that differ keep their whole optimizer state; plan " + option_name("--shard") +
                       " optimizer with one " + option_name("--memory-budget") + " for every rank");
    }
    check_exchange(p, request);
  }
}

// Rank 0's window fields: those of its own plan, over the whole target batch and world.
Plan combined_plan(const std::vector<Plan>& per_rank, const PlanRequest& request, const std::vector<RankCapacity>& caps) {
  Plan plan = per_rank.front();
  plan.target_batch = request.target_batch;
  plan.world_size = request.world_size;
  std::vector<std::vector<int64_t>> splits;
  for (const Plan& p : per_rank) {
    RankWindow w;
    w.budget_bytes = p.memory.budget_bytes;
    w.per_rank_batch = p.per_rank_batch;
    w.max_micro_batch = p.max_micro_batch;
    w.microbatch_sizes = p.microbatch_sizes;
    w.predicted_peak_bytes = p.memory.predicted_peak_bytes;
    if (p.timing) w.window_seconds = p.timing->window_seconds;
    plan.ranks.push_back(w);
    splits.push_back(p.microbatch_sizes);
  }
  const double seconds = ranks_window_seconds(caps, splits);
  if (plan.timing) plan.timing->window_seconds = seconds;
  return plan;
}

std::string ranks_reason(const Plan& plan, bool timed) {
  std::ostringstream s;
  s << " The ranks differ: ";
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    const RankWindow& w = plan.ranks[r];
    s << (r ? "; " : "") << "rank " << r << " takes " << w.per_rank_batch << " as " << join_sizes(w.microbatch_sizes)
      << " under " << format_bytes(w.budget_bytes);
  }
  s << (timed ? ", the shares that finish a window soonest by each rank's measured step times"
              : ", shares in proportion to each rank's largest microbatch (no step times measured)")
    << "; every rank weights by the global count.";
  return s.str();
}

}  // namespace

double ranks_window_seconds(const std::vector<RankCapacity>& ranks, const std::vector<std::vector<int64_t>>& splits) {
  double slowest = 0;
  for (size_t r = 0; r < ranks.size(); ++r) slowest = std::max(slowest, ranks[r].time.window_seconds(splits[r]));
  return slowest;
}

std::vector<int64_t> choose_shares(const std::vector<RankCapacity>& ranks, int64_t target_batch, int64_t unit) {
  const int64_t W = static_cast<int64_t>(ranks.size());
  if (W < 1 || unit < 1 || target_batch % unit != 0 || target_batch / unit < W) {
    throw InputError("a target batch of " + std::to_string(target_batch) + " gives each of " + std::to_string(W) +
                     " ranks at least one microbatch of a multiple of " + std::to_string(unit) + " only if it is such a "
                     "multiple and holds one per rank");
  }
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].max_micro_batch < unit) {
      throw InfeasibleError("rank " + std::to_string(r) + " fits no microbatch of " + std::to_string(unit));
    }
  }
  const int64_t units = target_batch / unit;
  // The least time T within which the ranks hold every unit: bisected between 0 and the time any
  // one rank takes for all of them.
  double lo = 0, hi = 0;
  for (const RankCapacity& r : ranks) hi = std::max(hi, share_seconds(r, units, unit));
  auto held = [&](double seconds) {
    int64_t n = 0;
    for (const RankCapacity& r : ranks) n += units_within(r, seconds, units, unit);
    return n;
  };
  for (int i = 0; i < 100 && held(lo) < units; ++i) {
    const double mid = 0.5 * (lo + hi);
    if (held(mid) >= units) hi = mid; else lo = mid;
    if (hi - lo <= 1e-12 * hi) break;
  }
  // Each rank takes what it holds within the lower time, then the rest goes to the ranks with room
  // within the upper one, in rank order: no rank's time then exceeds hi.
  std::vector<int64_t> shares;
  int64_t left = units;
  for (const RankCapacity& r : ranks) left -= shares.emplace_back(held(lo) >= units ? 0 : units_within(r, lo, units, unit));
  for (size_t r = 0; r < ranks.size() && left > 0; ++r) {
    const int64_t more = std::min(left, units_within(ranks[r], hi, units, unit) - shares[r]);
    shares[r] += more;
    left -= more;
  }
  for (int64_t& s : shares) s = std::max<int64_t>(s, 1);
  // Rounding can leave a unit over or under: taken from, or given to, the rank it slows least.
  int64_t total = std::accumulate(shares.begin(), shares.end(), int64_t{0});
  for (; total != units; total += total < units ? 1 : -1) {
    size_t best = ranks.size();
    double best_seconds = 0;
    for (size_t r = 0; r < ranks.size(); ++r) {
      if (total > units && shares[r] <= 1) continue;
      const double t = share_seconds(ranks[r], shares[r] + (total < units ? 1 : -1), unit);
      const bool better = total < units ? t < best_seconds : t > best_seconds;
      if (best == ranks.size() || better) best = r, best_seconds = t;
    }
    shares[best] += total < units ? 1 : -1;
  }
  for (int64_t& s : shares) s *= unit;
  return shares;
}

Plan plan_ranks(const std::vector<Profile>& profiles, const std::vector<BudgetSpec>& budgets, const PlanRequest& request) {
  check_rank_request(profiles, budgets, request);
  const auto W = static_cast<size_t>(request.world_size);
  auto profile_of = [&](size_t r) -> const Profile& { return profiles[profiles.size() == 1 ? 0 : r]; };
  auto request_of = [&](size_t r, int64_t target) {
    PlanRequest q = request;
    q.world_size = 1;  // each rank's own window; the exchange's buffers are in its profile's windows
    q.target_batch = target;
    q.budget = budgets[budgets.size() == 1 ? 0 : r];
    q.use_timing = false;
    return q;
  };
  bool timed = true;
  for (const Profile& p : profiles) timed = timed && TimeModel::available(p);
  std::vector<RankCapacity> caps;
  for (size_t r = 0; r < W; ++r) {
    const int64_t cap = solve_rank(profile_of(r), request_of(r, request.target_batch), r).max_micro_batch;
    // No step times: a rank's time is its share over its largest microbatch.
    caps.push_back({cap, timed ? TimeModel::fit(profile_of(r)) : TimeModel::line(0, 1.0 / static_cast<double>(cap))});
  }
  const std::vector<int64_t> shares = choose_shares(caps, request.target_batch, request.multiple_of.value_or(1));
  std::vector<Plan> per_rank;
  for (size_t r = 0; r < W; ++r) per_rank.push_back(solve_rank(profile_of(r), request_of(r, shares[r]), r));
  Plan plan = combined_plan(per_rank, request, caps);
  plan.reason += ranks_reason(plan, timed);
  check_rank_windows(plan);
  return plan;
}

Plan plan_ranks(const std::vector<Plan>& own) {
  if (own.empty()) throw InputError("ranks that differ are planned from one plan per rank; got none");
  const Plan& first = own.front();
  std::vector<Profile> profiles;
  std::vector<BudgetSpec> budgets;
  for (size_t r = 0; r < own.size(); ++r) {
    const Plan& p = own[r];
    if (p.target_batch != first.target_batch || p.world_size != first.world_size || p.model.sha256 != first.model.sha256) {
      throw InputError("rank " + std::to_string(r) + "'s plan is for target batch " + std::to_string(p.target_batch) +
                       " on " + std::to_string(p.world_size) + " ranks of model " + p.model.sha256.substr(0, 12) +
                       ", rank 0's for " + std::to_string(first.target_batch) + " on " + std::to_string(first.world_size) +
                       " of " + first.model.sha256.substr(0, 12) + "; plan every rank for the same training");
    }
    profiles.push_back(p.profile);
    budgets.push_back(BudgetSpec{p.memory.budget_bytes, std::nullopt});
  }
  PlanRequest request;
  request.target_batch = first.target_batch;
  request.world_size = first.world_size;
  request.headroom = headroom_of(first.memory.margin);
  request.multiple_of = first.multiple_of;
  request.split = first.split;
  return plan_ranks(profiles, budgets, request);
}

Plan rank_view(const Plan& plan, int64_t rank) {
  if (plan.ranks.empty()) return plan;
  if (rank < 0 || rank >= static_cast<int64_t>(plan.ranks.size())) {
    throw InputError("rank " + std::to_string(rank) + " is not one of the plan's " + std::to_string(plan.ranks.size()) +
                     " ranks");
  }
  const RankWindow& w = plan.ranks[static_cast<size_t>(rank)];
  Plan v = plan;
  v.ranks.clear();
  v.target_batch = v.per_rank_batch = w.per_rank_batch;
  v.world_size = 1;
  set_window(v, w.microbatch_sizes, w.max_micro_batch, plan.multiple_of.value_or(1));
  v.memory.budget_bytes = w.budget_bytes;
  v.memory.predicted_peak_bytes = w.predicted_peak_bytes;
  return v;
}

Plan replan_rank(const Plan& plan, int64_t rank, int64_t failing_micro_batch, std::string* note) {
  if (plan.ranks.empty()) return replan_below(plan, failing_micro_batch, note);
  const Plan view = replan_below(rank_view(plan, rank), failing_micro_batch, note);
  Plan next = plan;
  RankWindow& w = next.ranks[static_cast<size_t>(rank)];
  w.max_micro_batch = view.max_micro_batch;
  w.microbatch_sizes = view.microbatch_sizes;
  w.predicted_peak_bytes = view.memory.predicted_peak_bytes;
  w.window_seconds.reset();
  if (rank == 0) {  // the plan's window fields are rank 0's
    set_window(next, view.microbatch_sizes, view.max_micro_batch, plan.multiple_of.value_or(1));
    next.memory.predicted_peak_bytes = view.memory.predicted_peak_bytes;
  }
  next.confirmed = false;
  return next;
}

std::pair<int64_t, int64_t> rank_share(const Plan& plan, int64_t rank, int64_t samples) {
  if (plan.ranks.empty() || rank < 0 || rank >= static_cast<int64_t>(plan.ranks.size()) || samples < 0) {
    throw InputError("rank " + std::to_string(rank) + " has no share of this plan's windows");
  }
  int64_t before = 0;
  for (int64_t r = 0; r < rank; ++r) before += plan.ranks[static_cast<size_t>(r)].per_rank_batch;
  const int64_t through = before + plan.ranks[static_cast<size_t>(rank)].per_rank_batch;
  auto at = [&](int64_t shares) {  // floor(samples · shares / B), exact in 128 bits
    return static_cast<int64_t>(static_cast<__int128>(samples) * shares / plan.target_batch);
  };
  return {at(before), at(through) - at(before)};
}

SampleSlice strided_slice(int64_t rank, int64_t world_size, int64_t samples) {
  if (world_size < 1 || rank < 0 || rank >= world_size || samples < 0) {
    throw InputError("rank " + std::to_string(rank) + " is not in a group of " + std::to_string(world_size));
  }
  return {std::min(rank, samples), samples, world_size};  // a start past the end: a rank with no share
}

SampleSlice rank_slice(const Plan& plan, int64_t rank, int64_t samples) {
  if (plan.ranks.empty()) return strided_slice(rank, plan.world_size, samples);
  const auto [start, count] = rank_share(plan, rank, samples);
  return {start, start + count, 1};
}

int64_t rank_batch(const Plan& plan, int64_t rank) {
  if (plan.ranks.empty() || rank < 0 || rank >= static_cast<int64_t>(plan.ranks.size())) return plan.per_rank_batch;
  return plan.ranks[static_cast<size_t>(rank)].per_rank_batch;
}

std::vector<BudgetSpec> parse_rank_budgets(const std::string& text, int64_t world_size, const std::string& what) {
  if (text.empty()) return {BudgetSpec{}};  // the device's total
  std::vector<BudgetSpec> out;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, ',')) out.push_back(parse_budget(item, what));
  if (text.back() == ',') out.push_back(parse_budget("", what));  // names the empty entry
  if (out.size() != 1 && static_cast<int64_t>(out.size()) != world_size) {
    throw InputError(what + " '" + (text.size() > 80 ? text.substr(0, 77) + "..." : text) + "' holds " +
                     std::to_string(out.size()) + " budgets for " + std::to_string(world_size) +
                     " ranks; give one for every rank, or one for all");
  }
  return out;
}

}  // namespace accumplan

namespace accumplan {

void check_rank_windows(const Plan& p) {
  if (p.ranks.empty()) return;
  const std::string W = std::to_string(p.world_size);
  if (static_cast<int64_t>(p.ranks.size()) != p.world_size) {
    throw SchemaError("$.ranks: " + std::to_string(p.ranks.size()) + " ranks for world_size " + W + "; one per rank");
  }
  if (p.sharding || p.tokens) {
    throw SchemaError(std::string("$.ranks: a plan whose ranks differ has no ") + (p.sharding ? "sharding" : "tokens") +
                      "; re-plan it");
  }
  for (size_t r = 0; r < p.ranks.size(); ++r) {
    const RankWindow& w = p.ranks[r];
    const std::string at = "$.ranks[" + std::to_string(r) + "]";
    if (w.per_rank_batch < 1 || w.max_micro_batch < 1 || w.budget_bytes < 0 || w.predicted_peak_bytes < 0 ||
        w.microbatch_sizes.empty()) {
      throw SchemaError(at + ": per_rank_batch and max_micro_batch >= 1, budget_bytes and predicted_peak_bytes >= 0, "
                        "at least one microbatch");
    }
    for (int64_t n : w.microbatch_sizes) {
      if (n < 1 || n > w.max_micro_batch) {
        throw SchemaError(at + ".microbatch_sizes: " + std::to_string(n) + " is not in 1..max_micro_batch " +
                          std::to_string(w.max_micro_batch));
      }
    }
    if (checked_sum(w.microbatch_sizes, at + ".microbatch_sizes") != w.per_rank_batch) {
      throw SchemaError(at + ".microbatch_sizes: they do not sum to its per_rank_batch " + std::to_string(w.per_rank_batch));
    }
  }
  int64_t total = 0;
  for (const RankWindow& w : p.ranks) total = checked_add(total, w.per_rank_batch, "$.ranks' shares");
  if (total != p.target_batch) {
    throw SchemaError("$.ranks: the shares sum to " + std::to_string(total) + ", but target_batch is " +
                      std::to_string(p.target_batch) + "; every sample of a window goes to one rank");
  }
  if (p.ranks.front().per_rank_batch != p.per_rank_batch || p.ranks.front().microbatch_sizes != p.microbatch_sizes) {
    throw SchemaError("$.ranks[0]: its share and microbatch_sizes differ from the plan's per_rank_batch and "
                      "microbatch_sizes, which are rank 0's");
  }
}

}  // namespace accumplan
