// test_search.cpp — the measurement search (accumplan/search.h) on a fake device, without torch.
//
// The fake runs no model: a window's peaks follow an exact line (weights, gradients after the
// first microbatch, activations per sample) and it runs out of memory past the limit the search
// asks for, so the windows the search chooses and the plan it makes can be checked by hand. The
// real runners (ProbeRunner on TorchScript, accumplan.plan's Python runner) are tested with
// their executors in tests/runtime and tests/python.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "accumplan/errors.h"
#include "accumplan/search.h"
#include "accumplan/sharding.h"
#include "accumplan/tensor_spec.h"
#include "accumplan/token_model.h"
#include "accumplan/units.h"

using namespace accumplan;

namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

struct FakeDevice final : WindowRunner {
  int64_t weights = 4 * kMiB, grads = 4 * kMiB, fixed = 1 * kMiB, per_sample = 256 * 1024;
  std::optional<int64_t> budget;
  std::vector<std::vector<int64_t>> windows;  // every window asked for, in order
  std::vector<std::optional<int64_t>> limits;  // the limit each ran under, in bytes (nullopt: none)

  int64_t floor = 0;  // a b-independent phase's peak (a gradient hook's copies): the peaks are at least this
  double seconds_per_sample = 1e-3;

  int64_t step_at = 0, step_bytes = 0;  // an allocator's step: step_bytes more from b = step_at on
  int64_t stepped(int64_t b) const { return step_at > 0 && b >= step_at ? step_bytes : 0; }
  int64_t first(int64_t b) const { return std::max(floor, weights + fixed + per_sample * b + stepped(b)); }
  int64_t steady(int64_t b) const { return std::max(floor, weights + grads + fixed + per_sample * b + stepped(b)); }

  WindowMeasurement run_window(const std::vector<int64_t>& sizes, int64_t, std::optional<int64_t> limit) override {
    windows.push_back(sizes);
    limits.push_back(limit);
    WindowMeasurement m;
    m.first_microbatch_peak_bytes = first(sizes.front());
    m.steady_peak_bytes = 0;
    for (size_t i = 1; i < sizes.size(); ++i) m.steady_peak_bytes = std::max(m.steady_peak_bytes, steady(sizes[i]));
    m.peak_bytes = std::max(m.first_microbatch_peak_bytes, m.steady_peak_bytes);
    m.optimizer_step_peak_bytes = weights + grads;
    m.max_peak_bytes = m.peak_bytes;
    m.step_seconds = seconds_per_sample * static_cast<double>(sizes.front());
    m.seconds = m.step_seconds * static_cast<double>(sizes.size());
    const std::optional<int64_t> cap = limit;
    if (cap && m.max_peak_bytes > *cap) {
      m.oom = true;
      m.peak_bytes = m.max_peak_bytes = 0;
    }
    return m;
  }

  // Evaluation: the weights and optimizer state resident, no gradients, and far fewer
  // activations per sample than training keeps for backward.
  bool evaluates = true;
  int64_t state = 2 * kMiB, eval_fixed = kMiB / 2, eval_per_sample = 32 * 1024;
  std::vector<std::vector<int64_t>> eval_windows;
  int64_t eval_peak(int64_t b) const { return weights + state + eval_fixed + eval_per_sample * b; }

  // Kept outputs: a microbatch's peak also holds the previous microbatch's outputs.
  int64_t out_per_sample = 4 * 1024;

  std::optional<EvalMeasurement> run_eval_window(const std::vector<int64_t>& sizes, int64_t, std::optional<int64_t> limit,
                                                 bool keep_outputs) override {
    if (!evaluates) return std::nullopt;
    eval_windows.push_back(sizes);
    limits.push_back(limit);
    EvalMeasurement m;
    const std::optional<int64_t> cap = limit;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const int64_t held = keep_outputs && i > 0 ? out_per_sample * sizes[i - 1] : 0;
      if (cap && eval_peak(sizes[i]) + held > *cap) {
        m.oom = true;
        m.peak_bytes.clear();
        break;
      }
      m.peak_bytes.push_back(eval_peak(sizes[i]) + held);
    }
    return m;
  }
};

Profile header(const FakeDevice& d) {
  Profile p;
  p.device = {"cpu", 0, "fake device", d.budget.value_or(int64_t{1} << 34)};
  p.model = {"fake.pt", "", 1000, {}};
  p.setup.inputs = {"float32[B,16]"};
  p.setup.target = "int64[B]:10";
  p.libtorch_version = "none";
  p.probe = "fake";
  p.budget_bytes = d.budget;
  p.persistent = {d.weights, d.grads, 0};
  return p;
}

SearchSettings settings_for(const FakeDevice& d, bool simulated, int64_t target) {
  SearchSettings s;
  s.budget_bytes = d.budget;
  s.budget_is_simulated = simulated;
  s.device_total_bytes = d.budget.value_or(int64_t{1} << 34);
  s.device_name = "fake device";
  s.max_probe_micro_batch = target;
  return s;
}

PlanRequest request_for(int64_t target) {
  PlanRequest r;
  r.target_batch = target;
  return r;
}

// The probe schedule on `d`, then the plan for `target` confirmed by its windows.
Plan profiled_plan(FakeDevice& d, std::vector<Trial>& trials, bool simulated, int64_t target) {
  Search search(d, settings_for(d, simulated, target), trials);
  Profile p = header(d);
  search.profile(p);
  p.trials = trials;
  return search.plan_and_confirm(p, request_for(target));
}

// The largest b whose [b, b] window fits the budget on the fake: steady(b) <= budget.
int64_t true_max(const FakeDevice& d) { return (*d.budget - d.weights - d.grads - d.fixed) / d.per_sample; }

}  // namespace

TEST_CASE("Search: probes 2 and 4 first, then plans a size a real window ran at within the budget", "[search]") {
  FakeDevice d;
  d.budget = 64 * kMiB;  // true max: (64 - 9) MiB / 256 KiB = 220
  std::vector<Trial> trials;
  Search search(d, settings_for(d, /*simulated=*/true, 1024), trials);
  Profile p = header(d);
  search.profile(p);
  REQUIRE(d.windows.size() >= 2);
  CHECK(d.windows[0] == std::vector<int64_t>{2, 2});
  CHECK(d.windows[1] == std::vector<int64_t>{4, 4});
  p.trials = trials;
  const Plan plan = search.plan_and_confirm(p, request_for(1024));
  CHECK(plan.confirmed);
  CHECK(plan.max_micro_batch <= true_max(d));
  CHECK(plan.max_micro_batch >= true_max(d) - 2);  // an exact line: the search lands next to the truth
  CHECK(plan.memory.predicted_peak_bytes <= *d.budget);
  // Every window it ran is recorded, and the windows past the probes ran under twice the budget.
  CHECK(trials.size() == d.windows.size());
  CHECK(std::count(d.limits.begin(), d.limits.end(), std::optional<int64_t>(2 * *d.budget)) >= 1);
  CHECK(d.windows.size() <= 2 + 2 + 6);  // probes, at most two tail probes, at most six windows after
}

TEST_CASE("Search: a plan that only a larger window covers runs its own once, and predicts what it measured",
          "[search]") {
  // 1.5 MiB more from b = 14 on: the line between the windows measured below and above it leans
  // under the truth at 16, the size a per-rank batch of 64 splits into below the largest that fits.
  FakeDevice d;
  d.step_at = 14;
  d.step_bytes = 3 * kMiB / 2;
  d.budget = 15 * kMiB;  // steady(b) fits up to b = 18
  std::vector<Trial> trials;
  const Plan plan = profiled_plan(d, trials, /*simulated=*/true, 64);
  REQUIRE(plan.microbatch_sizes == std::vector<int64_t>{16, 16, 16, 16});
  CHECK(plan.confirmed);
  CHECK(std::count(d.windows.begin(), d.windows.end(), std::vector<int64_t>{16, 16}) == 1);
  CHECK(plan.memory.predicted_peak_bytes == d.steady(16));
}

TEST_CASE("Search: a sharded profile measures each other share's step by a window holding it, once each",
          "[search][sharding]") {
  // Shares 40, 30, 30, 0 over four ranks: ranks 1 (30) and 3 (none) are measured, rank 2 has rank 1's share.
  struct ShardedDevice final : WindowRunner {
    FakeDevice d;
    std::vector<int64_t> ranks_held;
    WindowMeasurement run_window(const std::vector<int64_t>& sizes, int64_t t, std::optional<int64_t> b) override {
      return d.run_window(sizes, t, b);
    }
    std::optional<WindowMeasurement> run_rank_window(int64_t rank, const std::vector<int64_t>& sizes, int64_t t,
                                                     std::optional<int64_t> b) override {
      ranks_held.push_back(rank);
      WindowMeasurement m = d.run_window(sizes, t, b);
      m.optimizer_step_peak_bytes -= 1000 * (rank + 1);
      return m;
    }
  } dev;
  dev.d.budget = 64 * kMiB;
  std::vector<Trial> trials;
  Profile p = header(dev.d);
  p.persistent.optimizer_state_bytes = 500;  // the largest share's, resident in every window
  p.sharding = shard_state({{4, 3, 3, 1}}, {40, 30, 30, 0}, 4);
  REQUIRE(ranks_to_measure(*p.sharding) == std::vector<int64_t>{1, 3});
  Search(dev, settings_for(dev.d, true, 1024), trials).profile(p);
  CHECK(dev.ranks_held == std::vector<int64_t>{1, 3});
  REQUIRE(p.sharding->other_ranks.size() == 2);
  CHECK(p.sharding->other_ranks[0].rank == 1);
  // Less the largest share's state, which stayed resident beside the rank's.
  CHECK(p.sharding->other_ranks[0].optimizer_step_peak_bytes == dev.d.weights + dev.d.grads - 2000 - 500);
  CHECK(p.sharding->other_ranks[1].rank == 3);
  CHECK(trials.size() == dev.d.windows.size() - 2);  // the ranks' windows are no trial the planner could count
  // A runner that holds no other share measures none: every rank's step is taken as the largest's.
  FakeDevice plain;
  plain.budget = 64 * kMiB;
  Profile q = header(plain);
  q.sharding = shard_state({{4, 3, 3, 1}}, {40, 30, 30, 0}, 4);
  std::vector<Trial> more;
  Search(plain, settings_for(plain, true, 1024), more).profile(q);
  CHECK(q.sharding->other_ranks.empty());
}

TEST_CASE("Search: a window of a second or more is announced with its estimate from the pace so far and the windows left",
          "[search][progress]") {
  FakeDevice d;
  d.budget = 64 * kMiB;
  d.seconds_per_sample = 0.05;  // probes of 2 and 4 take 0.2 and 0.4 s; a confirmation near 200 takes 20 s
  std::vector<Trial> trials;
  SearchSettings settings = settings_for(d, true, 1024);
  std::vector<std::string> lines;
  settings.progress = [&](const std::string& line) { lines.push_back(line); };
  Search search(d, settings, trials);
  Profile p = header(d);
  search.profile(p);
  p.trials = trials;
  const size_t before = trials.size();
  search.plan_and_confirm(p, request_for(1024));
  REQUIRE(trials.size() > before);
  const Trial& confirm = trials[before];
  const std::string expected = "confirm: next window [" + std::to_string(confirm.micro_batch) + "," +
                               std::to_string(confirm.micro_batch) + "], about " + format_seconds(confirm.seconds) +
                               " at the pace of the ";
  const auto at = std::find_if(lines.begin(), lines.end(), [&](const std::string& l) { return l.rfind(expected, 0) == 0; });
  REQUIRE(at != lines.end());
  CHECK(at->find("of windows so far; at most 5 more after it") != std::string::npos);
  CHECK(std::next(at)->rfind("confirm b=" + std::to_string(confirm.micro_batch), 0) == 0);  // then the window's own line
  // The probes themselves (under a second each) are not announced.
  CHECK(std::none_of(lines.begin(), at, [](const std::string& l) { return l.find("next window") != std::string::npos; }));
}

TEST_CASE("Search: a peak flat at the first probes doubles them until it grows, or plans the flat target", "[search]") {
  FakeDevice d;
  d.budget = 64 * kMiB;
  d.floor = d.steady(24);  // flat up to b = 24: 2, 4, 8 and 16 all peak at the floor
  {
    std::vector<Trial> trials;
    Search search(d, settings_for(d, true, 1024), trials);
    Profile p = header(d);
    search.profile(p);
    REQUIRE(d.windows.size() >= 5);
    CHECK(d.windows[2] == std::vector<int64_t>{8, 8});
    CHECK(d.windows[4] == std::vector<int64_t>{32, 32});  // the first size past the floor
    p.trials = trials;
    const Plan plan = search.plan_and_confirm(p, request_for(1024));
    CHECK(plan.confirmed);
    CHECK(plan.max_micro_batch <= true_max(d));
  }
  d.windows.clear();
  {
    std::vector<Trial> trials;  // a per-rank target of 16: flat all the way, planned as one microbatch of 16
    Search search(d, settings_for(d, true, 16), trials);
    Profile p = header(d);
    search.profile(p);
    CHECK(d.windows.back() == std::vector<int64_t>{16, 16});
    p.trials = trials;
    const Plan plan = search.plan_and_confirm(p, request_for(16));
    CHECK(plan.confirmed);
    CHECK(plan.microbatch_sizes == std::vector<int64_t>{16});
  }
}

TEST_CASE("Search: on a real (not simulated) budget no window runs past it", "[search]") {
  FakeDevice d;
  d.budget = 64 * kMiB;
  std::vector<Trial> trials;
  const Plan plan = profiled_plan(d, trials, /*simulated=*/false, 1024);
  CHECK(plan.max_micro_batch <= true_max(d));
  CHECK(std::all_of(d.limits.begin(), d.limits.end(), [&](std::optional<int64_t> l) { return l == d.budget; }));
}

TEST_CASE("Search: a window over the budget is judged not to fit even when it ran under a raised limit", "[search]") {
  FakeDevice d;
  d.budget = 64 * kMiB;
  std::vector<Trial> trials;
  Search search(d, settings_for(d, true, 1024), trials);
  const WindowMeasurement over = search.run({240, 240}, 240, 0, WindowBudget::Doubled);
  CHECK_FALSE(over.oom);
  CHECK(over.max_peak_bytes > *d.budget);
  CHECK_FALSE(over.fit);
  CHECK(search.run({200, 200}, 200, 0, WindowBudget::Enforced).fit);
  CHECK(trials.empty());  // run() records nothing
}

TEST_CASE("Search: persistent memory over the budget measures the probes without it and the plan says why", "[search]") {
  FakeDevice d;
  d.budget = 6 * kMiB;  // weights + gradients alone are 8 MiB
  std::vector<Trial> trials;
  SearchSettings s = settings_for(d, true, 64);
  s.persistent_over_budget = true;
  Search search(d, s, trials);
  Profile p = header(d);
  search.profile(p);
  CHECK(std::all_of(d.limits.begin(), d.limits.end(), [](std::optional<int64_t> l) { return !l; }));
  CHECK(p.points.size() == 2);
  p.trials = trials;
  CHECK_THROWS_WITH(search.plan_and_confirm(p, request_for(64)), Catch::Contains("persistent memory alone"));
}

TEST_CASE("Search: when every window runs out of memory the profile refuses, naming the device", "[search]") {
  FakeDevice d;
  d.budget = 6 * kMiB;
  std::vector<Trial> trials;
  Search search(d, settings_for(d, false, 64), trials);
  Profile p = header(d);
  // Not lifted: the first probe runs out of memory, is measured lifted to explain, then the second
  // probe needs a second point; both are measured without the budget and the profile has them.
  search.profile(p);
  CHECK(d.limits.front() == d.budget);
  CHECK(std::count(d.limits.begin(), d.limits.end(), std::nullopt) >= 1);
  CHECK(p.points.size() >= 2);
}

namespace {

// The whole search for a per-rank batch: profile, plan, confirm; the plan must read back as the
// plan reader (and so `accumplan run`) reads it.
Plan small_plan(FakeDevice& d, std::vector<Trial>& trials, int64_t target, int64_t world_size) {
  Search search(d, settings_for(d, /*simulated=*/false, target / world_size), trials);
  Profile p = header(d);
  p.gradient_exchange = world_size > 1;  // windows for W ranks make a rank's exchange
  search.profile(p);
  p.trials = trials;
  PlanRequest r = request_for(target);
  r.world_size = world_size;
  const Plan plan = search.plan_and_confirm(p, r);
  const Plan read = plan_from_json(nlohmann::json::parse(to_json(plan).dump()));
  CHECK(read.microbatch_sizes == plan.microbatch_sizes);
  return plan;
}

}  // namespace

TEST_CASE("Search: a per-rank batch of 1, 2 or 3 is planned from probes 2 and 4 in one microbatch, confirmed",
          "[search][small]") {
  for (const auto& [target, world_size] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {2, 1}, {3, 1}, {8, 4}}) {
    CAPTURE(target, world_size);
    FakeDevice d;
    d.budget = 64 * kMiB;  // far more than any of these needs
    std::vector<Trial> trials;
    const Plan plan = small_plan(d, trials, target, world_size);
    REQUIRE(d.windows.size() >= 2);
    CHECK(d.windows[0] == std::vector<int64_t>{2, 2});
    CHECK(d.windows[1] == std::vector<int64_t>{4, 4});
    CHECK(plan.per_rank_batch == target / world_size);
    CHECK(plan.microbatch_sizes == std::vector<int64_t>{target / world_size});
    CHECK(plan.confirmed);
    CHECK(plan.memory.predicted_peak_bytes <= *d.budget);
  }
}

TEST_CASE("Search: a per-rank batch of 3 that does not fit whole runs in microbatches of 1, confirmed by a real window",
          "[search][small]") {
  FakeDevice d;
  // Activations dominate: one microbatch of 3 needs 17 MiB (first(3)), a window of 1s 10 MiB
  // (steady(1)), a window of 2s 14 MiB; the budget of 12 MiB holds only microbatches of 1.
  d.per_sample = 4 * kMiB;
  d.grads = 1 * kMiB;
  d.budget = 12 * kMiB;
  std::vector<Trial> trials;
  const Plan plan = small_plan(d, trials, 3, 1);
  CHECK(plan.microbatch_sizes == std::vector<int64_t>{1, 1, 1});
  CHECK(plan.confirmed);
  // The window that confirmed it: microbatches of 1, run within the budget.
  CHECK(std::any_of(trials.begin(), trials.end(), [](const Trial& t) {
    return t.fit && !t.window.empty() && *std::max_element(t.window.begin(), t.window.end()) == 1;
  }));
}

TEST_CASE("Search: a per-rank batch of 2 that does not fit even in microbatches of 1 is refused as infeasible",
          "[search][small]") {
  FakeDevice d;
  d.budget = 7 * kMiB;  // weights and gradients alone are 8 MiB
  std::vector<Trial> trials;
  CHECK_THROWS_AS(small_plan(d, trials, 2, 1), InfeasibleError);
}

// ---- The evaluation batch ---------------------------------------------------------------------

namespace {

Plan planned(FakeDevice& d, std::vector<Trial>& trials, int64_t target = 1024) {
  Search search(d, settings_for(d, /*simulated=*/true, target), trials);
  Profile p = header(d);
  p.persistent.optimizer_state_bytes = d.state;
  search.profile(p);
  p.trials = trials;
  return search.plan_and_confirm(p, request_for(target));
}

}  // namespace

TEST_CASE("Search: the eval batch is the largest eval microbatch the budget holds, in two eval windows", "[search][eval]") {
  FakeDevice d;
  d.budget = 64 * kMiB;
  std::vector<Trial> trials;
  const Plan plan = planned(d, trials);
  Search search(d, settings_for(d, true, 1024), trials);
  const std::optional<EvalPlan> e = search.plan_eval(plan);
  REQUIRE(e);
  const int64_t m = plan.micro_batch;
  REQUIRE(d.eval_windows.size() == 2);
  CHECK(d.eval_windows[0] == std::vector<int64_t>{m, 2 * m});
  CHECK(d.eval_windows[1] == std::vector<int64_t>{e->micro_batch});
  // The line is exact on the fake: the plan is the true largest under the usable bytes.
  const int64_t usable = plan.memory.usable_bytes;
  CHECK(d.eval_peak(e->micro_batch) <= usable);
  CHECK(d.eval_peak(e->micro_batch + 1) > usable);
  CHECK(e->micro_batch > 4 * m);  // eval keeps no graph: several times the training microbatch
  CHECK(e->confirmed);
  CHECK(e->predicted_peak_bytes == d.eval_peak(e->micro_batch));
  CHECK(e->weights_bytes == d.weights);
  CHECK(e->optimizer_state_bytes == d.state);
  REQUIRE(e->trials.size() == 2);
  CHECK(e->trials[0].kind == "eval");
  CHECK(e->trials[1].fit);
}

TEST_CASE("Search: kept outputs run each eval size twice and plan with the previous outputs held", "[search][eval]") {
  FakeDevice d;
  d.budget = 64 * kMiB;
  std::vector<Trial> trials;
  const Plan plan = planned(d, trials);
  Search search(d, settings_for(d, true, 1024), trials);
  const std::optional<EvalPlan> e = search.plan_eval(plan, /*keep_outputs=*/true);
  REQUIRE(e);
  const int64_t m = plan.micro_batch;
  REQUIRE(d.eval_windows.size() == 2);
  CHECK(d.eval_windows[0] == std::vector<int64_t>{m, m, 2 * m, 2 * m});
  const int64_t b = e->micro_batch;
  CHECK(d.eval_windows[1] == std::vector<int64_t>{b, b});
  auto kept_peak = [&](int64_t n) { return d.eval_peak(n) + d.out_per_sample * n; };
  const int64_t usable = plan.memory.usable_bytes;
  CHECK(kept_peak(b) <= usable);
  CHECK(kept_peak(b + 1) > usable);
  CHECK(e->keep_outputs);
  CHECK(e->predicted_peak_bytes == kept_peak(b));
  // Smaller than without kept outputs: they count.
  FakeDevice d2;
  d2.budget = d.budget;
  std::vector<Trial> trials2;
  const Plan plan2 = planned(d2, trials2);
  CHECK(Search(d2, settings_for(d2, true, 1024), trials2).plan_eval(plan2)->micro_batch > b);
}

TEST_CASE("Search: a profile's eval window at its two largest sizes gives a plan an unconfirmed eval batch by its line",
          "[search][eval]") {
  FakeDevice d;
  d.budget = 64 * kMiB;
  std::vector<Trial> trials;
  Search search(d, settings_for(d, true, 1024), trials);
  Profile p = header(d);
  p.persistent.optimizer_state_bytes = d.state;
  search.profile(p);
  p.trials = trials;
  search.profile_eval(p);
  REQUIRE(p.eval);
  REQUIRE(d.eval_windows.size() == 1);  // one window only: no plan to confirm yet
  std::vector<int64_t> sizes;
  for (const auto& pt : p.points) sizes.push_back(pt.micro_batch);
  std::sort(sizes.begin(), sizes.end());
  CHECK(d.eval_windows[0] == std::vector<int64_t>{sizes[sizes.size() - 2], sizes.back()});
  REQUIRE(p.eval->points.size() == 2);
  CHECK(p.eval->points[1].peak_bytes == d.eval_peak(sizes.back()));
  const Plan plan = make_plan(p, request_for(1024));
  const std::optional<EvalPlan> e = eval_from_profile(plan);
  REQUIRE(e);
  CHECK(d.eval_peak(e->micro_batch) <= plan.memory.usable_bytes);
  CHECK(d.eval_peak(e->micro_batch + 1) > plan.memory.usable_bytes);
  CHECK(std::abs(e->predicted_peak_bytes - d.eval_peak(e->micro_batch)) <= 1);  // the line's ceil
  CHECK_FALSE(e->confirmed);
  CHECK(e->trials.size() == 1);
  Profile none = p;
  none.eval.reset();
  CHECK_FALSE(eval_from_profile(make_plan(none, request_for(1024))).has_value());
  // Eval peaks that fall with the batch (noise) give a flat line at the highest, never a negative slope.
  Profile falling = p;
  falling.eval->points = {{4, 5000000}, {8, 4900000}};
  const std::optional<EvalPlan> flat = eval_from_profile(make_plan(falling, request_for(1024)));
  REQUIRE(flat);
  CHECK(flat->slope_bytes_per_sample == 0);
  CHECK(flat->intercept_bytes == 5000000);
}

TEST_CASE("Search: a runner that does not evaluate gives no eval batch and runs no window", "[search][eval]") {
  FakeDevice d;
  d.budget = 64 * kMiB;
  d.evaluates = false;
  std::vector<Trial> trials;
  const Plan plan = planned(d, trials);
  const size_t windows = d.windows.size();
  Search search(d, settings_for(d, true, 1024), trials);
  CHECK_FALSE(search.plan_eval(plan).has_value());
  CHECK(d.windows.size() == windows);
}

TEST_CASE("Search: a confirming eval window that fails leaves the largest measured size that fit", "[search][eval]") {
  FakeDevice d;
  d.budget = 64 * kMiB;
  std::vector<Trial> trials;
  const Plan plan = planned(d, trials);
  const int64_t m = plan.micro_batch;
  // The eval activations turn out larger past 2m than the first window's line says.
  struct Steeper final : WindowRunner {
    FakeDevice& d;
    int64_t m;
    Steeper(FakeDevice& device, int64_t micro) : d(device), m(micro) {}
    WindowMeasurement run_window(const std::vector<int64_t>& sizes, int64_t t, std::optional<int64_t> b) override {
      return d.run_window(sizes, t, b);
    }
    std::optional<EvalMeasurement> run_eval_window(const std::vector<int64_t>& sizes, int64_t t, std::optional<int64_t> b,
                                                   bool keep) override {
      if (sizes.size() == 1 && sizes[0] > 2 * m) {
        EvalMeasurement oom;
        oom.oom = true;
        return oom;
      }
      return d.run_eval_window(sizes, t, b, keep);
    }
  } steeper(d, m);
  Search search(steeper, settings_for(d, true, 1024), trials);
  const std::optional<EvalPlan> e = search.plan_eval(plan);
  REQUIRE(e);
  CHECK(e->micro_batch == 2 * m);
  CHECK(e->confirmed);
  REQUIRE(e->trials.size() == 2);
  CHECK_FALSE(e->trials[1].fit);
}

namespace {

// Variable-length data: peak(b, T) = c0 + a0·b + a1·b·T + a2·b·T², a per-sequence part (a0) that
// the grid's lengths (T_max / 4 and up) cannot tell from the per-token one.
struct FakeTokenDevice final : WindowRunner {
  int64_t c0 = 40 * kMiB, a0 = 16 * 1024, a1 = 4 * 1024, a2 = 8;
  std::vector<std::pair<int64_t, int64_t>> windows;  // (b, T) of every window asked for
  int64_t peak(int64_t b, int64_t t) const { return c0 + a0 * b + a1 * b * t + a2 * b * t * t; }

  WindowMeasurement run_window(const std::vector<int64_t>& sizes, int64_t seq_len, std::optional<int64_t>) override {
    windows.push_back({sizes.front(), seq_len});
    WindowMeasurement m;
    m.sizes = sizes;
    m.micro_batch = sizes.front();
    m.peak_bytes = m.first_microbatch_peak_bytes = m.steady_peak_bytes = m.max_peak_bytes = peak(sizes.front(), seq_len);
    m.optimizer_step_peak_bytes = c0;
    m.step_seconds = 1e-6 * static_cast<double>(sizes.front() * seq_len);
    m.seconds = 2 * m.step_seconds;
    return m;
  }
  std::optional<EvalMeasurement> run_eval_window(const std::vector<int64_t>&, int64_t, std::optional<int64_t>, bool) override {
    return std::nullopt;
  }
};

}  // namespace

TEST_CASE("Search: variable lengths get one window of the shortest sequences at the token budget, which the fit then predicts",
          "[search][token]") {
  FakeTokenDevice d;
  const int64_t budget = 512 * kMiB;
  SearchSettings s;
  s.budget_bytes = budget;
  s.budget_is_simulated = true;
  s.device_total_bytes = budget;
  s.device_name = "fake device";
  s.seq_range = parse_seq_len("16..1024");
  std::vector<Trial> trials;
  Search search(d, s, trials);
  Profile p;
  search.profile(p);
  const auto short_window = std::find_if(d.windows.begin(), d.windows.end(), [](const auto& w) { return w.second == 16; });
  REQUIRE(short_window != d.windows.end());
  CHECK(short_window->first > 1000);  // about the token budget's worth: tens of thousands of tokens
  const TokenMemoryModel model = TokenMemoryModel::fit(p);
  const int64_t tokens = model.token_budget(budget, 1024);
  for (int64_t t : {16, 24, 32, 48, 64, 100, 256, 700, 1024}) {
    const int64_t b = tokens / t;
    const double predicted = static_cast<double>(model.predict_peak_bytes(b, t)), measured = static_cast<double>(d.peak(b, t));
    INFO("b = " << b << ", T = " << t << ": predicted " << predicted << ", measured " << measured);
    // The per-sequence cost makes the peak at one token count convex in T: the lengths measured
    // between the ends bring every chord within the search's half percent, never under.
    CHECK(predicted >= measured);
    CHECK(predicted <= 1.005 * measured);
  }
  // The grid's lengths alone (T_max / 4 and up) miss the short ones by far more.
  Profile grid_only = p;
  grid_only.points.erase(std::remove_if(grid_only.points.begin(), grid_only.points.end(),
                                        [](const ProfilePoint& q) { return *q.seq_len < 256; }),
                         grid_only.points.end());
  const TokenMemoryModel without = TokenMemoryModel::fit(grid_only);
  CHECK(static_cast<double>(without.predict_peak_bytes(tokens / 16, 16)) < 0.9 * static_cast<double>(d.peak(tokens / 16, 16)));

  // A window of at most 256 sequences: the short window is the shortest length 256 of them fill.
  FakeTokenDevice capped;
  s.max_probe_micro_batch = 256;
  std::vector<Trial> capped_trials;
  Search capped_search(capped, s, capped_trials);
  Profile q;
  capped_search.profile(q);
  const auto short_capped = std::find_if(capped.windows.begin(), capped.windows.end(),
                                         [](const auto& w) { return w.second < 256; });
  REQUIRE(short_capped != capped.windows.end());
  const auto [b_short, t_short] = *short_capped;
  CHECK(t_short > 16);
  CHECK(b_short <= 256);
  CHECK(256 * t_short >= tokens);                // 256 sequences of it fill the budget,
  CHECK(256 * (t_short - 1) < tokens);           // of the shortest such length,
  CHECK(b_short * t_short <= tokens);            // as many as the budget holds
  CHECK((b_short + 1) * t_short > tokens);
}
