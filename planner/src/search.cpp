// search.cpp — the measurement search. See accumplan/search.h for the contract; the numbers behind
// each rule are at the rule.
#include "accumplan/search.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <set>
#include <utility>

#include "accumplan/checked.h"
#include "accumplan/errors.h"
#include "accumplan/memory_model.h"
#include "accumplan/sharding.h"
#include "accumplan/terms.h"
#include "accumplan/token_model.h"
#include "accumplan/units.h"
#include "least_squares.h"

namespace accumplan {
namespace {

// A profile point from a measured window: the peaks, the step time, and `peak_bytes` — the window's
// peak for a probe, the steady-state one for a confirmation (its first microbatch has its own line).
ProfilePoint point_of(const WindowMeasurement& s, int64_t micro_batch, int64_t peak_bytes,
                      std::optional<int64_t> seq_len = std::nullopt) {
  ProfilePoint pt;
  pt.micro_batch = micro_batch;
  pt.seq_len = seq_len;
  pt.peak_bytes = peak_bytes;
  pt.first_microbatch_peak_bytes = s.first_microbatch_peak_bytes;
  pt.optimizer_step_peak_bytes = s.optimizer_step_peak_bytes;
  pt.reserved_peak_bytes = s.reserved_peak_bytes;
  pt.step_seconds = s.step_seconds;
  return pt;
}

}  // namespace

Search::Search(WindowRunner& runner, SearchSettings settings, std::vector<Trial>& trials)
    : runner_(runner), settings_(std::move(settings)), trials_(trials) {}

void Search::say(const std::string& line) const {
  if (settings_.progress) settings_.progress(line);
}

WindowBudget Search::past_the_budget() const {
  return can_pass_budget() ? WindowBudget::Doubled : WindowBudget::Enforced;
}

std::optional<int64_t> Search::limit_bytes(WindowBudget budget) const {
  if (budget == WindowBudget::Lifted || !settings_.budget_bytes) return std::nullopt;
  if (budget == WindowBudget::Enforced) return settings_.budget_bytes;
  return checked_mul(*settings_.budget_bytes, int64_t{2}, "twice the budget");
}

namespace {

double window_units(const std::vector<int64_t>& sizes, int64_t seq_len) {
  double samples = 0;
  for (int64_t b : sizes) samples += static_cast<double>(b);
  return samples * static_cast<double>(std::max<int64_t>(1, seq_len));
}

}  // namespace

void Search::count_pace(const std::vector<int64_t>& sizes, int64_t seq_len, double seconds) {
  if (!(seconds > 0)) return;
  paced_seconds_ += seconds;
  paced_units_ += window_units(sizes, seq_len);
}

void Search::count_pace(const Profile& profile) {
  if (paced_units_ > 0) return;
  for (const Trial& t : profile.trials) {
    if (!t.window.empty()) count_pace(t.window, t.seq_len.value_or(0), t.seconds);
  }
}

void Search::announce(const std::string& phase, const std::vector<int64_t>& sizes, int64_t seq_len,
                      int more_at_most) const {
  if (!(paced_units_ > 0)) return;
  const double estimate = window_units(sizes, seq_len) * paced_seconds_ / paced_units_;
  if (estimate < 1.0) return;  // a window under a second needs no announcing
  say(phase + ": next window [" + join_sizes(sizes) + "]" + (seq_len > 0 ? " x T=" + std::to_string(seq_len) : "") +
      ", about " + format_seconds(estimate) + " at the pace of the " + format_seconds(paced_seconds_) +
      " of windows so far; at most " + std::to_string(std::max(0, more_at_most)) + " more after it");
}

WindowMeasurement Search::run(const std::vector<int64_t>& sizes, int64_t micro_batch, int64_t seq_len,
                              WindowBudget budget) {
  WindowMeasurement m = runner_.run_window(sizes, seq_len, limit_bytes(budget));
  if (!m.oom) count_pace(sizes, seq_len, m.seconds);
  m.sizes = sizes;
  m.micro_batch = micro_batch;
  if (m.oom) m.peak_bytes = m.max_peak_bytes = 0;
  // Judged against the budget planned for, also when the window ran under a raised or lifted one:
  // a window past the budget is a measured point, not a fit.
  m.fit = !m.oom && (!settings_.budget_bytes || m.max_peak_bytes <= *settings_.budget_bytes);
  return m;
}

void Search::profile(Profile& p) {
  if (settings_.seq_range) {
    profile_tokens(p);
  } else {
    profile_samples(p);
  }
  profile_other_ranks(p);
}

void Search::profile_other_ranks(Profile& p) {
  if (!p.sharding) return;
  const int64_t seq_len = settings_.seq_range ? settings_.seq_range->min : 0;
  for (const int64_t rank : ranks_to_measure(*p.sharding)) {
    const std::optional<WindowMeasurement> m = runner_.run_rank_window(rank, {kPersistentWindowSamples}, seq_len, std::nullopt);
    if (!m) return;  // no other share held: per_rank_peaks takes the largest share's step for each
    if (m->oom) continue;
    // The largest share's optimizer stayed alive beside the rank's: its state is not that rank's.
    const int64_t step = m->optimizer_step_peak_bytes - p.persistent.optimizer_state_bytes;
    p.sharding->other_ranks.push_back({rank, step, m->seconds});
    say("rank " + std::to_string(rank) + "'s share of the optimizer state (" +
        format_bytes(p.sharding->per_rank_state_bytes[static_cast<size_t>(rank)]) + "): optimizer step peak " +
        format_bytes(step));
  }
}

void Search::profile_samples(Profile& p) {
  std::set<int64_t> sizes;
  for (int64_t b : settings_.probe_sizes) {
    if (b < 1) throw InputError("probe sizes must be at least 1, got " + std::to_string(b));
    sizes.insert(b);
  }
  // Sizes above the per-rank target are never planned, so they are not probed, except that a fit
  // needs two points: the two smallest always run. A per-rank batch of 1, 2 or 3 (target_batch 8
  // over 4 ranks) is then planned from 2 and 4 like any other, and confirmed by a real window of
  // its own size (the whole per-rank batch, or microbatches of 1): dropping 4 left one size, and
  // every such target was refused.
  while (settings_.max_probe_micro_batch > 0 && sizes.size() > 2 && *sizes.rbegin() > settings_.max_probe_micro_batch) {
    sizes.erase(std::prev(sizes.end()));
  }
  if (sizes.size() < 2) {
    throw InputError("profiling needs at least two probe sizes to fit peak(b) = persistent + a0 + a1*b");
  }

  bool lifted = settings_.persistent_over_budget;  // the budget is not in force
  auto record = [&](const WindowMeasurement& s) {
    trials_.push_back({"probe", s.micro_batch, s.fit, s.max_peak_bytes, s.seconds, s.sizes, std::nullopt});
    if (s.oom) {
      say("probe b=" + std::to_string(s.micro_batch) + ": out of memory under the budget of " +
          format_bytes(settings_.budget_bytes.value_or(0)));
      return;
    }
    p.points.push_back(point_of(s, s.micro_batch, s.peak_bytes));
    say("probe b=" + std::to_string(s.micro_batch) + ": peak " + format_bytes(s.peak_bytes) + ", " +
        format_seconds(s.step_seconds) + (s.fit ? "" : " (over the budget)") + (lifted ? " [measured without the budget]" : ""));
  };
  auto measure = [&](int64_t b) { return run({b, b}, b, 0, lifted ? WindowBudget::Lifted : WindowBudget::Enforced); };
  for (int64_t b : sizes) {
    if (lifted && p.points.size() >= 2) break;
    WindowMeasurement s = measure(b);
    record(s);
    if (s.oom) {
      if (p.points.size() >= 2) break;  // larger sizes would fail too; the fit has enough points
      // Fewer than two points: measure this size without the budget, so the planner can explain
      // how far the budget is from what the smallest microbatches need.
      lifted = true;
      s = measure(b);
      record(s);
      if (s.oom) break;
    }
    if (!s.fit && p.points.size() >= 2) break;
  }
  probe_until_peak_grows(p, lifted, record);
  if (!lifted) extend_linear_tail(p, sizes.empty() ? 1 : *sizes.rbegin(), record);
  if (p.points.size() < 2) {
    throw InfeasibleError("only " + std::to_string(p.points.size()) + " probe size(s) ran on " + settings_.device_name +
                          "; a memory model needs two. Raise " + option_name("--memory-budget") + " or use a smaller model");
  }
}

void Search::probe_until_peak_grows(Profile& p, bool lifted,
                                    const std::function<void(const WindowMeasurement&)>& record) {
  // A peak set by a phase that does not depend on the microbatch — a gradient hook's copies, tied
  // weights or weight_norm's recomputed weight in the backward, on a small MLP: 23.1 KiB at b = 2
  // and at b = 4 — gives the line no slope, and the fit refused it with advice (probe sizes
  // further apart) a Python caller cannot follow. The probes double from the largest instead,
  // up to the per-rank target, until the activations show above that phase.
  constexpr int kMaxFlatProbes = 12;
  for (int extra = 0; extra < kMaxFlatProbes && p.points.size() >= 2; ++extra) {
    const ProfilePoint& last = p.points.back();
    const ProfilePoint& before = p.points[p.points.size() - 2];
    if (last.peak_bytes > before.peak_bytes) return;  // it grows: the fit's to judge
    if (!trials_.empty() && !trials_.back().fit) return;  // the last probe already failed the budget
    int64_t next = checked_mul(last.micro_batch, 2, "the next probe size");
    if (settings_.max_probe_micro_batch > 0) next = std::min(next, settings_.max_probe_micro_batch);
    if (next <= last.micro_batch) return;  // the per-rank target is reached: the fit says what it can
    say("the peak does not grow from b=" + std::to_string(before.micro_batch) + " to b=" +
        std::to_string(last.micro_batch) + "; probing b=" + std::to_string(next) + " where activations show");
    const WindowMeasurement s = run({next, next}, next, 0, lifted ? WindowBudget::Lifted : WindowBudget::Enforced);
    record(s);
    if (s.oom) return;
  }
}

void Search::extend_linear_tail(Profile& p, int64_t largest_scheduled,
                                const std::function<void(const WindowMeasurement&)>& record) {
  // The phase that sets the peak can change far beyond the probes. (That small probes may sit off
  // the line is the fit's business, memory_model.cpp.) A 256-512-512-10 MLP with SGD grows 7,256
  // bytes/sample up to b=128 (a b-independent backward transient on top of the activations sets
  // the peak) but 11,352 bytes/sample from b=256 on; from b <= 8 its largest microbatch under
  // 16 MiB was predicted at ~1,650 while 1,102 is the truth. So while the largest size worth
  // planning (the budget's predicted maximum, or the per-rank target if smaller) is more than 4x
  // the largest probe, one more probe is taken at half of it (at most two), which bounds the
  // extrapolation the confirmation relies on to about 2x. The first probes stay small (2 and 4:
  // cheap, and past b = 1, whose peak another phase can set: resnet18 at 64x64 peaks at 96.5 MiB
  // at b = 1 and 170.3 MiB at b = 2, then +1.7 MiB per sample), and the size from them is chosen
  // by their slope toward the budget: resnet18 at 209 MiB gets 2, 4, 12 and plans from there.
  constexpr int kMaxExtraProbes = 2;
  constexpr int64_t kMaxExtrapolation = 4;
  // Without a per-rank target the budget bounds the probes; without either, 4x the schedule.
  int64_t bound = settings_.max_probe_micro_batch;
  if (bound <= 0) bound = settings_.budget_bytes ? MemoryModel::kMaxMicroBatch : kMaxExtrapolation * largest_scheduled;
  int64_t unmeasured = 0;  // a tail probe that ran out of memory even past the budget
  for (int extra = 0; extra < kMaxExtraProbes && p.points.size() >= 2; ++extra) {
    if (unmeasured == 0 && !trials_.empty() && !trials_.back().fit) break;  // the last probe already failed the budget
    int64_t predicted_max = 0;
    try {
      predicted_max = MemoryModel::fit(p).largest_fitting(settings_.device_total_bytes, bound);
    } catch (const InputError&) {
      break;  // the planner will say what is wrong with these points
    }
    const int64_t largest = p.points.back().micro_batch;
    if (predicted_max <= kMaxExtrapolation * largest) break;
    // Half the prediction; after a tail probe that ran out of memory unmeasured, the geometric
    // mean of the largest measured size and that one instead: a line from b <= 4 can be off by
    // far more than 2x (lstm_classifier under 35 MiB: predicted 392, truth 40; the probe at 196
    // ran out of memory even under twice the budget and taught the fit nothing; sqrt(4 · 196) =
    // 28 is measured and does).
    const int64_t next = unmeasured > 0 ? static_cast<int64_t>(std::sqrt(static_cast<double>(largest) * static_cast<double>(unmeasured)))
                                        : predicted_max / 2;
    if (next <= largest) break;
    say("the fit predicts up to " + std::to_string(predicted_max) + " samples, far beyond b=" + std::to_string(largest) +
        "; probing b=" + std::to_string(next) + " to check the line there");
    // Where the budget is only simulated, the probe runs under twice it: a size past the budget
    // is then a measured point, not just an OOM, and the fit (weighted toward the large sizes)
    // learns the slope it got wrong. lstm_classifier under 21 MiB: from b = 2 and 4 the line
    // predicted 98 samples, the truth is 13; the OOM at 49 said only "less than 49" and four more
    // windows bisected down to 9.
    const WindowBudget budget = past_the_budget();
    const WindowMeasurement s = run({next, next}, next, 0, budget);
    record(s);
    if (s.oom && budget == WindowBudget::Doubled && unmeasured == 0) {
      unmeasured = next;  // one more try, between the largest measured size and this one
      continue;
    }
    if (!s.fit) break;
  }
}

void Search::profile_tokens(Profile& p) {
  const int64_t t_max = settings_.seq_range->max;
  std::set<int64_t> lengths;
  for (int64_t t : {t_max / 4, t_max / 2, t_max}) lengths.insert(std::max({t, settings_.seq_range->min, int64_t{1}}));
  auto record = [&](const WindowMeasurement& s, int64_t t, const std::string& kind) {
    Trial trial{kind, s.micro_batch, s.fit, s.oom ? 0 : s.max_peak_bytes, s.seconds, s.sizes, std::nullopt};
    trial.seq_len = t;
    trials_.push_back(trial);
    if (s.oom) {
      say(kind + " b=" + std::to_string(s.micro_batch) + " x T=" + std::to_string(t) + ": out of memory");
      return;
    }
    p.points.push_back(point_of(s, s.micro_batch, s.peak_bytes, t));
    say(kind + " b=" + std::to_string(s.micro_batch) + " x T=" + std::to_string(t) + ": peak " + format_bytes(s.peak_bytes) +
        ", " + format_seconds(s.step_seconds) + (s.fit ? "" : " (over the budget)"));
  };
  // Persistent memory over the budget: measured without it, so the planner can give the breakdown.
  const WindowBudget budget = settings_.persistent_over_budget ? WindowBudget::Lifted : past_the_budget();
  auto measure = [&](int64_t b, int64_t t) { return run({b, b}, b, t, budget); };
  // The grid: two sequence counts at up to three lengths — enough to tell b·T from b·T² and to
  // leave residuals. Measured past a simulated budget, so a point over it still teaches the fit.
  for (int64_t b : {1, 2}) {
    for (int64_t t : lengths) record(measure(b, t), t, "probe");
  }
  // Far more sequences predicted at T_max than measured: one window at half that, as for samples.
  try {
    const TokenMemoryModel model = TokenMemoryModel::fit(p);
    const int64_t cap = settings_.budget_bytes ? model.largest_micro_batch(t_max, *settings_.budget_bytes) : 0;
    int64_t bound = settings_.max_probe_micro_batch > 0 ? settings_.max_probe_micro_batch : cap;
    if (cap > 8 && bound > 4) {
      const int64_t b = std::min(cap / 2, bound);
      say("the fit predicts up to " + std::to_string(cap) + " sequences of " + std::to_string(t_max) +
          " tokens; probing b=" + std::to_string(b) + " to check it there");
      record(measure(b, t_max), t_max, "probe");
    }
    const auto probe = [&](int64_t b, int64_t t) { record(measure(b, t), t, "probe"); };
    profile_short_sequences(p, *lengths.begin(), probe);
    profile_knees(p, probe);
  } catch (const InputError&) {
    // Too few points for a fit: the planner says what is missing.
  }
}

// The short-length column: one window of short sequences holding the token budget's worth, the
// shortest planned for or, when a window holds fewer sequences than that (max_probe_micro_batch),
// the shortest whose window still fills the budget. The grid's lengths start at T_max / 4, and a
// fit through them alone misses a window of only short sequences (their per-token memory is not
// the long ones'); this window puts the fit's line through both ends of what packing forms.
void Search::profile_short_sequences(const Profile& p, int64_t grid_shortest,
                                     const std::function<void(int64_t, int64_t)>& probe) {
  if (!settings_.budget_bytes) return;
  const int64_t tokens = TokenMemoryModel::fit(p).token_budget(*settings_.budget_bytes, settings_.seq_range->max);
  const int64_t most = settings_.max_probe_micro_batch > 0 ? settings_.max_probe_micro_batch : tokens;
  if (most < 1) return;
  const int64_t t_short = std::max({settings_.seq_range->min, (tokens + most - 1) / most, int64_t{1}});
  const int64_t b = std::min(tokens / t_short, most);
  if (t_short >= grid_shortest || b <= 2) return;  // the grid's b = 1, 2 already span it
  say("short sequences: probing b=" + std::to_string(b) + " x T=" + std::to_string(t_short) +
      ", the token budget's worth");
  probe(b, t_short);
}

// Lengths between the measured ones: the peak is convex in T (the highest of its moments), so
// between two columns it lies between their chord and the neighbouring segments reaching in;
// where those differ by more than half a percent of the token budget's peak, windows at the
// middle length (a knee, where another moment becomes the highest, lies there). At most
// six such lengths.
void Search::profile_knees(Profile& p, const std::function<void(int64_t, int64_t)>& probe) {
  constexpr double kFraction = 0.005;
  constexpr int kMaxLengths = 6;
  for (int n = 0; n < kMaxLengths; ++n) {
    const TokenMemoryModel model = TokenMemoryModel::fit(p);
    const int64_t t_max = settings_.seq_range->max;
    const int64_t tokens = settings_.budget_bytes ? model.token_budget(*settings_.budget_bytes, t_max) : t_max;
    const std::optional<int64_t> t = model.least_certain_length(std::max<int64_t>(tokens, 1), kFraction);
    if (!t) return;
    // A third and two thirds of the token budget: the peak is convex in b as well (a moment
    // with a higher constant sets it for a few sequences), so the line is measured where
    // microbatches near the budget take it.
    // And one sequence, where a moment with a higher constant may set the peak instead.
    const int64_t b1 = std::max<int64_t>(1, tokens / (3 * *t)), b2 = std::max(b1 + 1, 2 * tokens / (3 * *t));
    std::vector<int64_t> sizes{b1, b2};
    if (b1 > 1) sizes.insert(sizes.begin(), 1);
    std::string listed;
    for (int64_t b : sizes) listed += (listed.empty() ? "" : ", ") + std::to_string(b);
    say("between the measured lengths: probing T=" + std::to_string(*t) + " at b=" + listed);
    const size_t before = p.points.size();
    for (int64_t b : sizes) probe(b, *t);
    if (p.points.size() < before + sizes.size()) return;  // out of memory there: the chord stays
  }
}

Plan Search::plan_and_confirm_tokens(Profile& profile, PlanRequest request) {
  constexpr int kMaxWindows = 4;
  for (int windows = 0;; ++windows) {
    Plan plan = make_plan(profile, request);
    if (plan.confirmed || windows >= kMaxWindows) return plan;
    const int64_t t = plan.tokens->max_seq_len;
    const int64_t b = std::max<int64_t>(1, plan.tokens->token_budget / t);
    announce("confirm", {b, b}, t, kMaxWindows - windows - 1);
    const WindowMeasurement s = run({b, b}, b, t, past_the_budget());
    Trial trial{"confirm", b, s.fit, s.oom ? 0 : s.max_peak_bytes, s.seconds, s.sizes, std::nullopt};
    trial.seq_len = t;
    trials_.push_back(trial);
    profile.trials.push_back(trial);
    if (!s.oom) profile.points.push_back(point_of(s, b, s.peak_bytes, t));
    say("confirm b=" + std::to_string(b) + " x T=" + std::to_string(t) + " (token budget " +
        std::to_string(plan.tokens->token_budget) + "): " +
        (s.oom ? std::string("out of memory") : "peak " + format_bytes(s.max_peak_bytes)) + " of " +
        format_bytes(plan.memory.budget_bytes) + " budget (predicted " + format_bytes(plan.memory.predicted_peak_bytes) +
        ")" + (s.fit ? ", fits" : "; lowering the budget"));
  }
}

namespace {

// Bisection stops when the largest size that ran is within this fraction of the line's largest.
constexpr double kBisectGap = 0.03;

// After a window failed: halfway between `fits`, the largest size that ran, and the line's largest
// below the smallest failure (a caching allocator can refuse under its cap what the allocated line
// allows, so only windows find the edge); 0 once `fits` is within kBisectGap of it.
int64_t bisect_candidate(const Profile& profile, PlanRequest request, const Plan& plan, int64_t fits,
                         std::optional<int64_t> user_bound) {
  request.max_micro_batch = user_bound;
  request.max_micro_batch_set_by.clear();
  const int64_t upper = climb_candidate(profile, request, plan);
  if (upper <= fits || static_cast<double>(fits) >= (1.0 - kBisectGap) * static_cast<double>(upper)) return 0;
  return fits + (upper - fits + 1) / 2;
}

// The next climbing window from a confirmed plan: toward the line's largest while no window
// failed (else the whole batch as one microbatch), bisecting up after a failure; 0 for none.
int64_t climb_size(const Profile& profile, const PlanRequest& request, const Plan& plan, bool failed, int64_t fits,
                   std::optional<int64_t> user_bound) {
  if (failed) return bisect_candidate(profile, request, plan, fits, user_bound);
  const int64_t next = climb_candidate(profile, request, plan);
  return next != 0 ? next : whole_batch_candidate(profile, request, plan);
}

// The largest size of a window of two or more microbatches that ran within the budget (0: none),
// and the smallest that did not (the largest int64 when none failed).
std::pair<int64_t, int64_t> fits_and_fails(const Profile& profile) {
  int64_t fits = 0;
  int64_t fails = std::numeric_limits<int64_t>::max();
  for (const auto& t : profile.trials) {
    if (t.window.size() < 2) continue;
    if (t.fit) fits = std::max(fits, t.micro_batch);
    else fails = std::min(fails, t.micro_batch);
  }
  return {fits, fails};
}

// Whether a window of the plan's own head (its whole window when that is one microbatch) ran.
bool own_window_ran(const Profile& profile, const Plan& plan) {
  const std::vector<int64_t> head = window_head(plan.microbatch_sizes);
  return std::any_of(profile.trials.begin(), profile.trials.end(),
                     [&](const Trial& t) { return t.window == head && t.peak_bytes > 0; });
}

[[noreturn]] void no_window_fit(int64_t budget, const std::string& device, int windows) {
  throw InfeasibleError("no window ran within the budget of " + format_bytes(budget) + " on " + device + " in " +
                        std::to_string(windows) + " tries; raise " + option_name("--memory-budget"));
}

}  // namespace

Plan Search::plan_and_confirm(Profile& profile, PlanRequest request) {
  if (!request.budget.is_set() && settings_.budget_bytes) request.budget.bytes = settings_.budget_bytes;
  if (settings_.seq_range) return plan_and_confirm_tokens(profile, request);
  const std::optional<int64_t> user_bound = request.max_micro_batch;
  // The search's own bound on the plan (the user's when that is lower), and what set it.
  auto bound_by = [&](int64_t b, const std::string& set_by) {
    const bool users = user_bound && *user_bound <= b;
    request.max_micro_batch = users ? *user_bound : b;
    request.max_micro_batch_set_by = users ? std::string() : set_by;
  };
  const std::string largest_ran = "the largest window that ran within the budget";
  // Climbing runs at most two windows past the first confirmation while none failed: each climb
  // costs a window at the largest size. After a failure the windows bisect toward the line's
  // largest instead. Six windows in all is the most any plan spends here.
  constexpr int kMaxClimbs = 2;
  constexpr int kMaxWindows = 6;
  auto [fits, fails] = fits_and_fails(profile);  // largest [b, b] that ran within the budget, smallest that did not
  int windows = 0, climbs = 0;
  bool failed = false, out_of_windows = false, own_window_tried = false;
  for (;;) {
    Plan plan = make_plan(profile, request);
    int64_t next = 0;
    std::string kind;
    if (plan.confirmed) {
      const bool may_climb = windows < kMaxWindows && (failed || climbs < kMaxClimbs);
      next = may_climb ? climb_size(profile, request, plan, failed, fits, user_bound) : 0;
      kind = next != 0 ? "climb" : "confirm";
      if (next != 0) {
        ++climbs;
      } else {
        // Where only a larger window covers the plan's, its own runs once: the memory between two
        // measured sizes can step, and what that window measures is then the prediction.
        if (own_window_tried || own_window_ran(profile, plan)) return plan;
        own_window_tried = true;
        next = plan.micro_batch;
      }
    } else if (windows >= kMaxWindows) {
      // Out of windows: the largest size that ran is the plan (unconfirmed if even that is not
      // covered, which the plan then says).
      if (out_of_windows) return plan;
      out_of_windows = true;
      if (fits < 1) no_window_fit(plan.memory.budget_bytes, settings_.device_name, windows);
      bound_by(fits, largest_ran);
      continue;
    } else {
      // The plan's largest allowed size: a window there covers every window of the plan.
      next = plan.accumulation_steps == 1 ? plan.micro_batch : plan.max_micro_batch;
      kind = "confirm";
    }
    // A window of two microbatches of `next` (the whole per-rank batch alone when that is the
    // plan: one microbatch, no gradient resident), then the optimizer step.
    const bool whole = next == plan.per_rank_batch && (kind == "climb" || plan.accumulation_steps == 1);
    // A simulated budget is raised to twice itself for the window (as for the tail probes): a
    // window over the budget is then measured, and the refit interpolates instead of bisecting
    // blind. lstm_classifier under 35 MiB: confirm 42 failed, the midpoint 29 fit, true max 40.
    const std::vector<int64_t> sizes = whole ? std::vector<int64_t>{next} : std::vector<int64_t>{next, next};
    announce(kind, sizes, 0, kMaxWindows - windows - 1);
    const WindowMeasurement s = run(sizes, next, 0, past_the_budget());
    ++windows;
    // Within the budget less the margin's parts a measured size keeps (make_plan's own rule).
    const int64_t kept = kept_margin(plan.memory.margin).bytes_at(plan.fit.slope_bytes_per_sample, next);
    const bool ok = s.fit && s.max_peak_bytes + kept <= plan.memory.budget_bytes;
    const Trial trial{kind, next, ok, s.oom ? 0 : s.max_peak_bytes, s.seconds, s.sizes, std::nullopt};
    trials_.push_back(trial);
    profile.trials.push_back(trial);
    // A steady-state point like any probe's, within the budget or measured past it: the fit
    // folds it in.
    const bool measured_point = !whole && !s.oom && s.steady_peak_bytes > 0;
    if (measured_point) profile.points.push_back(point_of(s, next, s.steady_peak_bytes));
    if (ok) {
      const MemoryModel refit = MemoryModel::fit(profile);
      say(kind + " b=" + std::to_string(next) + ": peak " + format_bytes(s.max_peak_bytes) + " of " +
          format_bytes(plan.memory.budget_bytes) + " budget (predicted " +
          format_bytes(refit.predict_window_peak_bytes(whole ? std::vector<int64_t>{next} : std::vector<int64_t>{next, next})) +
          "), fits");
      if (!whole) fits = std::max(fits, next);
      if (failed && kind == "climb") bound_by(fits, largest_ran);  // the bound a failure set, raised
      continue;
    }
    say(kind + " b=" + std::to_string(next) + ": " +
        (s.oom ? std::string("out of memory") : "peak " + format_bytes(s.max_peak_bytes) + " over the budget") +
        (kind == "climb" ? "; the plan stays at the largest size that ran" : "; lowering the bound"));
    failed = true;
    fails = std::min(fails, next);
    if (next <= 1) {
      throw InfeasibleError("a real step at microbatch 1 does not fit the budget of " +
                            format_bytes(plan.memory.budget_bytes) + " on " + settings_.device_name +
                            " although the fit predicted " + format_bytes(plan.memory.predicted_peak_bytes) +
                            "; raise " + option_name("--memory-budget"));
    }
    // After a failed climb the plan is the largest size that ran; after a failed confirmation,
    // the refit decides below the failure when the failed window was measured, else bisect
    // between the largest size that ran and the smallest that failed.
    int64_t bound = kind == "climb" ? fits
                    : measured_point || fits >= fails ? next - 1
                                                      : fits + (fails - fits) / 2;
    bound_by(std::max<int64_t>(1, std::min(bound, next - 1)),
             kind == "climb" ? largest_ran : "a window of " + std::to_string(next) + " that did not fit the budget");
  }
}

// ---- The evaluation batch ---------------------------------------------------------------------

namespace {

// An eval microbatch above this multiple of the training one is not planned: the confirming window
// would tile that many samples, and a line that flat says the eval activations were not measured.
constexpr int64_t kMaxEvalMultiple = 256;

// The eval line peak(b) = intercept + slope·b over the measured (b, peak) points, least squares;
// nullopt with fewer than two distinct sizes.
std::optional<PeakLine> eval_line(const std::vector<std::pair<int64_t, int64_t>>& points) {
  std::set<int64_t> sizes;
  std::vector<std::vector<double>> rows;
  std::vector<double> y, w;
  for (const auto& [b, peak] : points) {
    sizes.insert(b);
    rows.push_back({1.0, static_cast<double>(b)});
    y.push_back(static_cast<double>(peak));
    w.push_back(1.0);
  }
  if (sizes.size() < 2) return std::nullopt;
  const std::optional<std::vector<double>> c = detail::weighted_least_squares(rows, y, w, 2);
  if (!c) return std::nullopt;
  if ((*c)[1] >= 0) return PeakLine{(*c)[0], (*c)[1], std::nullopt};
  // Peaks that fall with the batch are noise around a flat line: the highest, at every size.
  const auto top = std::max_element(points.begin(), points.end(), [](auto& a, auto& b) { return a.second < b.second; });
  return PeakLine{static_cast<double>(top->second), 0.0, std::nullopt};
}

}  // namespace

std::optional<EvalMeasurement> Search::run_eval(const std::vector<int64_t>& sizes, int64_t seq_len, WindowBudget budget,
                                                EvalPlan& e, int more_at_most) {
  announce("eval", sizes, seq_len, more_at_most);
  std::optional<EvalMeasurement> m = runner_.run_eval_window(sizes, seq_len, limit_bytes(budget), e.keep_outputs);
  if (!m) return std::nullopt;
  if (!m->oom) count_pace(sizes, seq_len, m->seconds);
  m->sizes = sizes;
  if (m->oom || m->peak_bytes.size() != sizes.size()) {
    m->oom = true;
    m->peak_bytes.clear();
  }
  const int64_t peak = m->peak_bytes.empty() ? 0 : *std::max_element(m->peak_bytes.begin(), m->peak_bytes.end());
  m->fit = !m->oom && (!settings_.budget_bytes || peak <= *settings_.budget_bytes);
  Trial trial{"eval", *std::max_element(sizes.begin(), sizes.end()), m->fit, peak, m->seconds, sizes, std::nullopt};
  if (seq_len > 0) trial.seq_len = seq_len;
  e.trials.push_back(trial);
  std::string shown;
  for (size_t i = 0; i < sizes.size(); ++i) {
    shown += (i ? ", b=" : "b=") + std::to_string(sizes[i]) +
             (m->oom ? "" : " peak " + format_bytes(m->peak_bytes[i]));
  }
  say("eval " + shown + (m->oom ? ": out of memory" : (m->fit ? "" : " (over the budget)")));
  return m;
}

std::optional<EvalPlan> Search::plan_eval(const Plan& plan, bool keep_outputs) {
  const int64_t m = std::max<int64_t>(1, plan.micro_batch);
  const int64_t seq_len = plan.tokens ? plan.tokens->max_seq_len : 0;
  const int64_t usable = plan.memory.usable_bytes;
  EvalPlan e;
  e.keep_outputs = keep_outputs;
  e.weights_bytes = plan.profile.persistent.weights_bytes;
  e.optimizer_state_bytes = plan.profile.persistent.optimizer_state_bytes;
  // Kept outputs: each size twice in a row, the second (the first's outputs held) is the point.
  const size_t each = keep_outputs ? 2 : 1;
  auto window_of = [each](std::vector<int64_t> sizes) {
    std::vector<int64_t> w;
    for (int64_t b : sizes) w.insert(w.end(), each, b);
    return w;
  };
  std::vector<std::pair<int64_t, int64_t>> points;  // (eval microbatch, its peak)
  auto keep = [&](const EvalMeasurement& s) {
    for (size_t i = each - 1; i < s.peak_bytes.size(); i += each) points.push_back({s.sizes[i], s.peak_bytes[i]});
  };
  const std::optional<EvalMeasurement> first = run_eval(window_of({m, 2 * m}), seq_len, past_the_budget(), e, 1);
  if (!first) return std::nullopt;
  keep(*first);
  std::optional<PeakLine> line = eval_line(points);
  // The second (and last) window: the line's largest size (a measured size that fit needs none),
  // or, when the first window ran out of memory, the training microbatch itself.
  const int64_t b = first->oom ? m : (line ? line->largest_fitting(usable, kMaxEvalMultiple * m) : 0);
  if (b > 0 && (first->oom || (b != m && b != 2 * m))) {
    const std::optional<EvalMeasurement> confirm = run_eval(window_of({b}), seq_len, WindowBudget::Enforced, e, 0);
    if (confirm) keep(*confirm);
  }
  // The plan: the largest eval size a real microbatch ran at within the usable bytes.
  for (const auto& [size, peak] : points) {
    if (peak <= usable && size > e.micro_batch) e.micro_batch = size;
  }
  line = eval_line(points);
  e.confirmed = e.micro_batch > 0;
  if (line) {
    e.intercept_bytes = line->intercept_bytes;
    e.slope_bytes_per_sample = line->slope_bytes_per_sample;
    if (e.micro_batch > 0) e.predicted_peak_bytes = line->peak_bytes(e.micro_batch);
  }
  say(e.micro_batch > 0 ? "eval microbatch " + std::to_string(e.micro_batch) + " (training " + std::to_string(m) +
                              "): predicted peak " + format_bytes(e.predicted_peak_bytes) + " of " + format_bytes(usable) +
                              " usable"
                        : "eval: not even " + std::to_string(m) + " samples fit beside the training state");
  return e;
}

void Search::profile_eval(Profile& p, bool keep_outputs) {
  std::vector<int64_t> fit;
  for (const ProfilePoint& pt : p.points) {
    if (!settings_.budget_bytes || pt.peak_bytes <= *settings_.budget_bytes) fit.push_back(pt.micro_batch);
  }
  std::sort(fit.begin(), fit.end());
  fit.erase(std::unique(fit.begin(), fit.end()), fit.end());
  if (fit.empty()) return;
  const std::vector<int64_t> sizes = fit.size() >= 2 ? std::vector<int64_t>{fit[fit.size() - 2], fit.back()}
                                                     : std::vector<int64_t>{fit.back(), 2 * fit.back()};
  EvalPlan e;
  e.keep_outputs = keep_outputs;
  const size_t each = keep_outputs ? 2 : 1;
  std::vector<int64_t> window;
  for (int64_t b : sizes) window.insert(window.end(), each, b);
  const int64_t seq_len = settings_.seq_range ? settings_.seq_range->max : 0;
  const std::optional<EvalMeasurement> m = run_eval(window, seq_len, past_the_budget(), e, 0);
  if (!m) return;
  EvalProfile ep;
  ep.keep_outputs = keep_outputs;
  for (size_t i = each - 1; i < m->peak_bytes.size(); i += each) ep.points.push_back({m->sizes[i], m->peak_bytes[i]});
  ep.trials = e.trials;
  p.eval = ep;
}

std::optional<EvalPlan> eval_from_profile(const Plan& plan) {
  const std::optional<EvalProfile>& ep = plan.profile.eval;
  if (!ep) return std::nullopt;
  std::vector<std::pair<int64_t, int64_t>> points;
  for (const EvalPoint& pt : ep->points) points.push_back({pt.micro_batch, pt.peak_bytes});
  const std::optional<PeakLine> line = eval_line(points);
  if (!line) return std::nullopt;
  EvalPlan e;
  e.keep_outputs = ep->keep_outputs;
  e.intercept_bytes = line->intercept_bytes;
  e.slope_bytes_per_sample = line->slope_bytes_per_sample;
  e.weights_bytes = plan.profile.persistent.weights_bytes;
  e.optimizer_state_bytes = plan.profile.persistent.optimizer_state_bytes;
  e.micro_batch = line->largest_fitting(plan.memory.usable_bytes, kMaxEvalMultiple * std::max<int64_t>(1, plan.micro_batch));
  if (e.micro_batch > 0) e.predicted_peak_bytes = line->peak_bytes(e.micro_batch);
  e.trials = ep->trials;
  // Confirmed only where an eval microbatch of exactly that size ran within the usable bytes.
  e.confirmed = std::any_of(ep->points.begin(), ep->points.end(), [&](const EvalPoint& pt) {
    return e.micro_batch > 0 && pt.micro_batch == e.micro_batch && pt.peak_bytes <= plan.memory.usable_bytes;
  });
  return e;
}

// ---- Activation checkpointing ------------------------------------------------------------------

void WindowRunner::set_checkpointing(const std::vector<std::string>& modules) {
  if (!modules.empty()) {
    throw InputError("this executor runs a TorchScript module, whose blocks activation checkpointing cannot wrap; "
                     "plan the Python module with accumplan.plan(..., checkpointing=\"auto\")");
  }
}

namespace {

std::vector<std::string> module_names(const CheckpointModel& m, const CheckpointSet& set) {
  std::vector<std::string> names;
  for (size_t i : set.blocks) names.push_back(m.blocks.at(i).name);
  return names;
}

}  // namespace

Plan Search::plan_checkpointing(const Plan& plan, std::vector<BlockCost> blocks, double head_bytes_per_sample,
                                const CheckpointSet& applied, bool choose, const Trial& costs) {
  count_pace(plan.profile);  // a search of its own (Python's checkpoint step): the plan's windows set the pace
  const CheckpointModel model = checkpoint_model_of(plan, std::move(blocks), applied, head_bytes_per_sample);
  Plan stated = plan_stating_checkpointing(plan, model, applied);
  if (stated.checkpoint) stated.checkpoint->trials = {costs};
  const std::vector<CheckpointChoice> options =
      choose ? checkpoint_options(model, plan.per_rank_batch, plan.memory.usable_bytes) : std::vector<CheckpointChoice>{};
  const std::optional<CheckpointChoice> choice = choose ? choose_checkpointing(options) : std::nullopt;
  // What the choice weighed, with the set the plan ends up training with.
  auto recorded = [&](Plan p, const CheckpointSet& chosen) {
    if (choose) p.checkpoint_choice = choice_record(model, options, chosen);
    return p;
  };
  if (!choice || choice->set.blocks == applied.blocks) {
    if (choose) say("checkpointing: keeps " + (applied.blocks.empty() ? std::string("none") : applied.rule) +
                    ": no other of " + std::to_string(checkpoint_sets(model.blocks.size()).size()) +
                    " sets is predicted at least " + std::to_string(std::lround(100 * kTimingGainFraction)) +
                    "% faster per window");
    return recorded(stated, applied);
  }
  Plan p = plan_with_checkpointing(plan, model, *choice);
  p.checkpoint->trials = {costs};
  runner_.set_checkpointing(module_names(model, choice->set));
  // The largest size the plan allows, as plan_and_confirm confirms: two microbatches (the second
  // with gradients resident) cover every window of the plan; or the whole per-rank batch alone.
  const bool whole = p.accumulation_steps == 1;
  const int64_t b = whole ? p.micro_batch : p.max_micro_batch;
  const std::vector<int64_t> sizes = whole ? std::vector<int64_t>{b} : std::vector<int64_t>{b, b};
  announce("confirm checkpointing " + choice->set.rule, sizes, 0, 0);
  const WindowMeasurement s = run(sizes, b, 0, past_the_budget());
  const int64_t kept = kept_margin(p.memory.margin).bytes_at(model.bytes_per_sample(choice->set), b);
  const bool ok = s.fit && s.max_peak_bytes + kept <= p.memory.budget_bytes;
  p.checkpoint->trials.push_back({"confirm", b, ok, s.oom ? 0 : s.max_peak_bytes, s.seconds, s.sizes, std::nullopt});
  const std::string what = "confirm checkpointing " + choice->set.rule + " b=" + std::to_string(b) + ": ";
  if (ok) {
    say(what + "peak " + format_bytes(s.max_peak_bytes) + " of " + format_bytes(p.memory.budget_bytes) +
        " budget (predicted " + format_bytes(model.predicted_peak_bytes(choice->set, b)) + "), fits");
    p.confirmed = true;
    p.confirmed_peak_bytes = s.max_peak_bytes;
    return recorded(p, choice->set);
  }
  const std::string failure = s.oom ? std::string("ran out of memory") : "peaked at " + format_bytes(s.max_peak_bytes);
  say(what + failure + "; the plan keeps " + (applied.blocks.empty() ? std::string("no checkpointing") : applied.rule));
  runner_.set_checkpointing(module_names(model, applied));
  Plan back = stated;
  back.reason = "Checkpointing " + choice->set.rule + " at microbatch " + std::to_string(b) + " was predicted to fit (" +
                format_bytes(model.predicted_peak_bytes(choice->set, b)) + ") but its window " + failure + ". " +
                back.reason;
  return recorded(back, applied);
}

}  // namespace accumplan
