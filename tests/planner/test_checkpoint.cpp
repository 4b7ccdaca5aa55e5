// test_checkpoint.cpp — activation checkpointing's model and choice (accumplan/checkpoint.h):
// the sets considered, the peak and time formulas by hand, and the choice of the least predicted
// window time (a model that only fits checkpointed, plentiful memory where none wins, a fixed
// per-microbatch cost that makes a larger checkpointed microbatch faster), the model of a solved
// plan, and the plan with the chosen set (valid for both readers); the search's step that confirms a
// chosen set by one real window with it applied, or falls back when that window does not fit.
#include <catch2/catch.hpp>

#include <cmath>

#include <nlohmann/json.hpp>

#include "accumplan/checkpoint.h"
#include "accumplan/errors.h"
#include "accumplan/replan.h"
#include "accumplan/schema.h"
#include "accumplan/search.h"
#include "accumplan/solver.h"
#include "test_helpers.h"

using namespace accumplan;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// Four equal blocks of 8 MiB saved per sample and 1 ms of forward per sample; no checkpointing:
// 100 MiB + 40 MiB per sample, 5 ms per microbatch + 10 ms per sample.
CheckpointModel four_blocks() {
  CheckpointModel m;
  m.intercept_bytes = 100 * kMiB;
  m.slope_bytes_per_sample = 40 * kMiB;
  m.step_time = TimeModel::line(0.005, 0.010);
  for (int i = 0; i < 4; ++i) m.blocks.push_back({"blocks." + std::to_string(i), 8 * kMiB, 0.001});
  return m;
}

// A plan of 64 samples solved from a linear profile (weights and gradients of `weights_bytes`
// each, 1 MiB fixed, 4 MiB per sample) whose steps take t0 + t1·b seconds, under `budget_bytes`.
Plan timed_plan(int64_t weights_bytes, double t0, double t1, int64_t budget_bytes) {
  Profile prof = accumplan::test::linear_profile(weights_bytes, 1 << 20, 4 << 20);
  for (auto& pt : prof.points) pt.step_seconds = t0 + t1 * static_cast<double>(pt.micro_batch);
  PlanRequest r;
  r.target_batch = 64;
  r.budget.bytes = budget_bytes;
  return make_plan(prof, r);
}

}  // namespace

TEST_CASE("Checkpoint: a block recomputed after the later blocks' backward holds only the earlier ones",
          "[checkpoint]") {
  // Four blocks of 8 MiB per sample, 100 MiB + 40 MiB per sample without checkpointing (8 MiB outside
  // the blocks). Block 2 alone: the end of the forward holds 0, 1, 3 (24); its recompute holds 0, 1
  // and itself (24): one block freed. Block 3 alone (the last): its recompute holds all four.
  const CheckpointModel m = four_blocks();
  CHECK(m.predicted_peak_bytes(CheckpointSet{{2}, "given"}, 1) == static_cast<int64_t>(132 * kMiB));
  CHECK(m.predicted_peak_bytes(CheckpointSet{{3}, "given"}, 1) == static_cast<int64_t>(140 * kMiB));
  CHECK(m.predicted_peak_bytes(CheckpointSet{{0}, "given"}, 1) == static_cast<int64_t>(132 * kMiB));
  // A peak 8 MiB per sample above the blocks' backward (the head's): gone before any recompute,
  // so the last block alone frees the head's share.
  CheckpointModel held = m;
  held.head_bytes_per_sample = 8 * kMiB;
  CHECK(held.predicted_peak_bytes(CheckpointSet{{3}, "given"}, 1) == static_cast<int64_t>(132 * kMiB));
  CHECK(held.predicted_peak_bytes(CheckpointSet{{0, 1, 2, 3}, "given"}, 1) == static_cast<int64_t>(108 * kMiB));
  // Unequal blocks: a large early block recomputed alone holds itself; {0, 2} of (16, 4, 4, 4):
  // the forward's end holds 8, block 0's recompute 16, block 2's 4 + 4.
  CheckpointModel u = four_blocks();
  u.blocks[0].saved_bytes_per_sample = 16 * kMiB;
  u.slope_bytes_per_sample = 36 * kMiB;  // 8 outside + 28 in the blocks
  for (int i = 1; i < 4; ++i) u.blocks[i].saved_bytes_per_sample = 4 * kMiB;
  CHECK(u.predicted_peak_bytes(CheckpointSet{{0, 2}, "given"}, 1) == static_cast<int64_t>((100 + 8 + 16) * kMiB));
  CHECK(u.bytes_per_sample(CheckpointSet{{1, 3}, "given"}) == Approx(8 * kMiB + 24 * kMiB));  // 0, 2 and 3 at 3's
}

TEST_CASE("Checkpoint: a window's peak is its first microbatch without gradients or a later one with them",
          "[checkpoint]") {
  CheckpointModel m = four_blocks();
  m.gradients_bytes = 30 * kMiB;
  m.optimizer_step_peak_bytes = 150 * kMiB;
  const CheckpointSet all = checkpoint_sets(4).back();  // 100 + 16 b MiB with gradients resident
  CHECK(m.predicted_window_peak_bytes(all, {22, 21, 21}) == static_cast<int64_t>((100 + 16 * 21) * kMiB));
  CHECK(m.predicted_window_peak_bytes(all, {10}) == static_cast<int64_t>((100 + 16 * 10 - 30) * kMiB));
  CHECK(m.predicted_window_peak_bytes(all, {1}) == static_cast<int64_t>(150 * kMiB));  // the optimizer step
}

TEST_CASE("Checkpoint: the sets are none, every k-th block for k = n..2, and all", "[checkpoint]") {
  const auto sets = checkpoint_sets(4);
  REQUIRE(sets.size() == 5);
  CHECK(sets[0].blocks.empty());
  CHECK(sets[0].rule == "none");
  CHECK(sets[1].blocks == std::vector<size_t>{3});
  CHECK(sets[1].rule == "every 4th block");
  CHECK(sets[2].blocks == std::vector<size_t>{2});
  CHECK(sets[3].blocks == std::vector<size_t>{1, 3});
  CHECK(sets[3].rule == "every 2nd block");
  CHECK(sets[4].blocks == std::vector<size_t>{0, 1, 2, 3});
  CHECK(sets[4].rule == "all");
  CHECK(checkpoint_sets(1).size() == 2);
  CHECK(checkpoint_sets(0).size() == 1);
  CHECK(checkpoint_sets(23).back().rule == "all");
  CHECK(checkpoint_sets(23)[11].rule == "every 13th block");
}

TEST_CASE("Checkpoint: peak and seconds follow the formulas, the recomputed block held once", "[checkpoint]") {
  const CheckpointModel m = four_blocks();
  const auto sets = checkpoint_sets(4);
  // none: 100 + 40 b MiB; every 2nd: 100 + (40 - 16 + 8) b; all: 100 + (40 - 32 + 8) b.
  CHECK(m.predicted_peak_bytes(sets[0], 3) == static_cast<int64_t>(220 * kMiB));
  CHECK(m.predicted_peak_bytes(sets[3], 3) == static_cast<int64_t>(196 * kMiB));
  CHECK(m.predicted_peak_bytes(sets[4], 3) == static_cast<int64_t>(148 * kMiB));
  CHECK(m.predicted_step_seconds(sets[0], 10) == Approx(0.105));
  CHECK(m.predicted_step_seconds(sets[4], 10) == Approx(0.145));
  // Largest microbatch under 400 MiB: none (400-100)/40 = 7; all (400-100)/16 = 18.
  CHECK(m.largest_micro_batch(sets[0], static_cast<int64_t>(400 * kMiB), 1000) == 7);
  CHECK(m.largest_micro_batch(sets[4], static_cast<int64_t>(400 * kMiB), 1000) == 18);
  CHECK(m.largest_micro_batch(sets[4], static_cast<int64_t>(400 * kMiB), 5) == 5);
  CHECK(m.largest_micro_batch(sets[0], static_cast<int64_t>(120 * kMiB), 1000) == 0);
  CheckpointSet bad{{7}, "bad"};
  CHECK_THROWS_AS(m.predicted_peak_bytes(bad, 1), InputError);
}

TEST_CASE("Checkpoint: a model whose one sample does not fit without checkpointing is planned with it",
          "[checkpoint]") {
  const CheckpointModel m = four_blocks();
  const int64_t usable = static_cast<int64_t>(130 * kMiB);  // none: 140 MiB at b = 1
  const auto options = checkpoint_options(m, 64, usable);
  CHECK(options[0].micro_batch == 0);
  const auto c = choose_checkpointing(m, 64, usable);
  REQUIRE(c);
  CHECK(c->set.rule == "all");  // 100 + 16 b: b = 1 (116 MiB); every 2nd: 100 + 32 b: b = 0
  CHECK(c->micro_batch == 1);
  CHECK(c->accumulation_steps == 64);
  CHECK(c->predicted_peak_bytes <= usable);
  CHECK_FALSE(choose_checkpointing(m, 64, static_cast<int64_t>(110 * kMiB)).has_value());
}

TEST_CASE("Checkpoint: with memory to spare none wins; equal times go to fewer blocks", "[checkpoint]") {
  CheckpointModel m = four_blocks();
  const auto c = choose_checkpointing(m, 8, static_cast<int64_t>(2048 * kMiB));
  REQUIRE(c);
  CHECK(c->set.rule == "none");
  CHECK(c->accumulation_steps == 1);
  // Free recomputation and every set fitting the whole window: all tie, and none has the fewest.
  for (auto& b : m.blocks) b.forward_seconds_per_sample = 0;
  CHECK(choose_checkpointing(m, 8, static_cast<int64_t>(2048 * kMiB))->set.rule == "none");
}

TEST_CASE("Checkpoint: a large per-microbatch cost makes the larger checkpointed microbatch faster", "[checkpoint]") {
  CheckpointModel m = four_blocks();
  m.step_time = TimeModel::line(0.5, 0.010);  // a launch-bound step: fewer microbatches pay
  const int64_t usable = static_cast<int64_t>(400 * kMiB);
  const auto options = checkpoint_options(m, 64, usable);
  const auto c = choose_checkpointing(m, 64, usable);
  REQUIRE(c);
  CHECK(c->set.rule == "all");  // b 18 in 4 microbatches against none's 7 in 10
  for (const auto& o : options) {
    if (o.micro_batch > 0) CHECK(c->predicted_window_seconds <= o.predicted_window_seconds);
  }
  CHECK(c->predicted_window_seconds == Approx(4 * 0.5 + 64 * (0.010 + 0.004)));
  CHECK(options[0].predicted_window_seconds == Approx(10 * 0.5 + 64 * 0.010));
}

TEST_CASE("Checkpoint: a predicted gain under 10% keeps the fewest blocks, as --use-timing keeps the fewest "
          "microbatches", "[checkpoint]") {
  // 60 ms per microbatch: none 7 x 10 = 0.6 + 0.64 s; all 18 x 4 = 0.24 + 64 x 14 ms = 1.136 s,
  // 8.4% less, within what step-time noise alone produces; at 100 ms all is 21% less and wins.
  CheckpointModel m = four_blocks();
  const int64_t usable = static_cast<int64_t>(400 * kMiB);
  m.step_time = TimeModel::line(0.06, 0.010);
  const auto options = checkpoint_options(m, 64, usable);
  CHECK(options.back().predicted_window_seconds == Approx(1.136));
  CHECK(options.front().predicted_window_seconds == Approx(1.24));
  CHECK(choose_checkpointing(m, 64, usable)->set.rule == "none");
  m.step_time = TimeModel::line(0.1, 0.010);
  CHECK(choose_checkpointing(m, 64, usable)->set.rule == "all");
  // None does not fit: the default is the fitting set with the fewest blocks. At 365 MiB fixed,
  // block 2 alone (every 3rd, 32 MiB per sample) fits 1, all (16) fits 2: at 8 ms per microbatch
  // 64 x 19 ms = 1.216 s against 32 x 36 ms = 1.152 s (5.3% less) keeps block 2; at 20 ms, all.
  m.intercept_bytes = 365 * kMiB;
  m.step_time = TimeModel::line(0.008, 0.010);
  const auto tight = checkpoint_options(m, 64, usable);
  CHECK(tight.front().micro_batch == 0);
  CHECK(tight.back().micro_batch == 2);
  CHECK(choose_checkpointing(m, 64, usable)->set.blocks == std::vector<size_t>{2});
  m.step_time = TimeModel::line(0.02, 0.010);
  CHECK(choose_checkpointing(m, 64, usable)->set.rule == "all");
}

TEST_CASE("Checkpoint: a plan's model is its fit's line and the plan's own time model", "[checkpoint]") {
  const Plan plan = timed_plan(8 << 20, 0.02, 0.005, int64_t{64} << 20);
  const CheckpointModel m = checkpoint_model_of(plan, {{"b0", 1e6, 1e-3}});
  CHECK(m.intercept_bytes == Approx(plan.fit.intercept_bytes));
  CHECK(m.slope_bytes_per_sample == Approx(plan.fit.slope_bytes_per_sample));
  // Without checkpointing its window is the plan's `timing` (no window was timed: no overhead),
  // and each step the line the profile was timed on.
  REQUIRE(plan.timing);
  CHECK(m.predicted_window_seconds(CheckpointSet{}, plan.microbatch_sizes) ==
        Approx(plan.timing->window_seconds));
  for (int64_t b : {1, 3, 64, 500}) CHECK(m.predicted_step_seconds(CheckpointSet{}, b) == Approx(0.02 + 0.005 * b));
  // Step times that are not a line stay as measured at every timed size (piecewise, as the plan's).
  Plan bent = plan;
  for (auto& pt : bent.profile.points) pt.step_seconds = 0.01 * std::sqrt(static_cast<double>(pt.micro_batch));
  const CheckpointModel mb = checkpoint_model_of(bent, {});
  for (const auto& pt : bent.profile.points) {
    CHECK(mb.predicted_step_seconds(CheckpointSet{}, pt.micro_batch) == Approx(*pt.step_seconds));
  }
  // No two sizes timed: steps cost nothing but the recomputation.
  Plan untimed = plan;
  for (auto& pt : untimed.profile.points) pt.step_seconds.reset();
  const CheckpointModel mu = checkpoint_model_of(untimed, {{"b0", 1e6, 1e-3}});
  CHECK_FALSE(mu.step_time);
  CHECK(mu.predicted_step_seconds(CheckpointSet{{0}, "all"}, 10) == Approx(0.01));
}

TEST_CASE("Checkpoint: the set a plan's windows ran with is taken out of its step times", "[checkpoint]") {
  // Windows timed with block b0 (1 ms per sample of forward) applied: the model without it is 1 ms
  // per sample faster, and with it again exactly the times measured.
  const Plan plan = timed_plan(8 << 20, 0.02, 0.006, int64_t{64} << 20);
  const CheckpointSet all{{0}, "all"};
  const CheckpointModel m = checkpoint_model_of(plan, {{"b0", 1e6, 1e-3}}, all);
  for (int64_t b : {1, 4, 64}) {
    CHECK(m.predicted_step_seconds(CheckpointSet{}, b) == Approx(0.02 + 0.005 * b));
    CHECK(m.predicted_step_seconds(all, b) == Approx(0.02 + 0.006 * b));
  }
}

TEST_CASE("TimeModel: points are checked and a per-sample cost moves every size", "[checkpoint][timing]") {
  CHECK_THROWS_WITH(TimeModel({{2, 0.1}, {2, 0.2}}, 0), Catch::Contains("point 1 (size 2)"));
  CHECK_THROWS_WITH(TimeModel({{0, 0.1}}, 0), Catch::Contains("sizes must be >= 1"));
  CHECK_THROWS_WITH(TimeModel({{1, -0.1}}, 0), Catch::Contains("got -0.1"));
  CHECK_THROWS_AS(TimeModel({{1, 0.1}}, -1), InputError);
  CHECK_THROWS_AS(TimeModel({}, 0), InputError);
  const TimeModel t({{2, 0.2}, {4, 0.3}, {8, 0.7}}, 0.1);
  const TimeModel moved = t.plus_per_sample(0.01);
  for (int64_t b : {1, 2, 3, 4, 6, 8, 20}) CHECK(moved.predict_seconds(b) == Approx(t.predict_seconds(b) + 0.01 * b));
  // Taken out past zero: each point and the slope stay at 0, never negative.
  const TimeModel gone = t.plus_per_sample(-1.0);
  for (int64_t b : {1, 4, 20}) CHECK(gone.predict_seconds(b) == 0);
  CHECK(TimeModel::line(0.5, 0.01).predict_seconds(7) == Approx(0.57));
  // Below the smallest size timed a per-microbatch cost stays in (50 ms + 1 ms per sample timed at
  // 2 and 4 is 51 ms at 1, not 26), and a first segment steeper than proportional scales down.
  CHECK(TimeModel({{2, 0.052}, {4, 0.054}}, 0.001).predict_seconds(1) == Approx(0.051));
  CHECK(TimeModel({{2, 0.2}, {4, 0.8}}, 0.3).predict_seconds(1) == Approx(0.1));
}

TEST_CASE("Checkpoint: a window's cost beyond its microbatches is the median over the profile's windows, in every "
          "set's prediction", "[checkpoint]") {
  Plan plan = timed_plan(8 << 20, 0.02, 0.005, int64_t{64} << 20);
  CHECK(checkpoint_model_of(plan, {}).window_overhead_seconds == 0);  // no window timed
  // Windows [b, b] that took their two steps plus 0.3 s (0.9 s for one outlier), one that did not
  // fit (not counted) and one of a token grid (not counted).
  auto window = [](int64_t b, double extra) { return 2 * (0.02 + 0.005 * static_cast<double>(b)) + extra; };
  plan.profile.trials = {{"probe", 2, true, 1, window(2, 0.3), {2, 2}, std::nullopt},
                         {"probe", 4, true, 1, window(4, 0.3), {4, 4}, std::nullopt},
                         {"probe", 8, true, 1, window(8, 0.9), {8, 8}, std::nullopt},
                         {"confirm", 16, false, 0, 5.0, {16, 16}, std::nullopt},
                         {"probe", 4, true, 1, 7.0, {4, 4}, int64_t{128}}};
  const CheckpointModel m = checkpoint_model_of(plan, {{"b0", 1e6, 1e-3}});
  CHECK(m.window_overhead_seconds == Approx(0.3));
  const std::vector<CheckpointChoice> options = checkpoint_options(m, 64, plan.memory.usable_bytes);
  REQUIRE(options.size() == 2);
  for (const CheckpointChoice& c : options) {
    const double steps = static_cast<double>(c.accumulation_steps) * 0.02;
    const double per_sample = 0.005 + (c.set.blocks.empty() ? 0.0 : 1e-3);
    CHECK(c.predicted_window_seconds == Approx(steps + 64 * per_sample + 0.3));
  }
}

TEST_CASE("Checkpoint: the plan with the chosen set: its split, peak, trade and reason, valid for both readers",
          "[checkpoint]") {
  // 8 MiB weights + gradients, 1 MiB fixed, 4 MiB per sample; four blocks of 1 MiB per sample each.
  const Plan plan = timed_plan(4 << 20, 0.5, 0.001, int64_t{48} << 20);
  std::vector<BlockCost> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back({"blocks." + std::to_string(i), double(1 << 20), 1e-4});
  const CheckpointModel m = checkpoint_model_of(plan, blocks);
  const auto choice = choose_checkpointing(m, plan.per_rank_batch, plan.memory.usable_bytes);
  REQUIRE(choice);
  REQUIRE_FALSE(choice->set.blocks.empty());  // 0.5 s a microbatch: fewer, larger ones pay
  const Plan p = plan_with_checkpointing(plan, m, *choice);
  CHECK(p.micro_batch <= choice->micro_batch);
  CHECK(p.micro_batch > plan.micro_batch);
  CHECK(p.accumulation_steps == choice->accumulation_steps);
  CHECK(p.memory.predicted_peak_bytes == m.predicted_peak_bytes(choice->set, p.micro_batch));  // the split's largest
  CHECK(p.memory.predicted_peak_bytes <= choice->predicted_peak_bytes);
  CHECK(p.memory.predicted_peak_bytes <= p.memory.usable_bytes);
  CHECK_FALSE(p.confirmed);
  REQUIRE(p.checkpoint);
  CHECK(p.checkpoint->rule == choice->set.rule);
  CHECK(p.checkpoint->candidates.size() == 4);
  CHECK(p.checkpoint->without.micro_batch == checkpoint_options(m, 64, plan.memory.usable_bytes)[0].micro_batch);
  CHECK(p.checkpoint->predicted_seconds_per_window < p.checkpoint->without.predicted_seconds_per_window);
  CHECK(p.reason.find("Checkpointing " + choice->set.rule) == 0);
  const Plan back = plan_from_json(nlohmann::json::parse(to_json(p).dump()));  // the readers' rules hold
  CHECK(back.checkpoint->modules == p.checkpoint->modules);
  // none: the plan as it was.
  CheckpointChoice none;
  none.set = checkpoint_sets(4)[0];
  CHECK(to_json(plan_with_checkpointing(plan, m, none)).dump() == to_json(plan).dump());
}

namespace {

// A device running a stack of four blocks that each keep `block` bytes per sample for backward
// (checkpointing one really frees `freed`), with a fixed cost per microbatch that makes fewer,
// larger microbatches faster: the Python runner's contract (set_checkpointing applies a set to
// every later window).
struct BlocksDevice final : WindowRunner {
  int64_t persistent = 8 << 20, fixed = 1 << 20, head = 256 << 10, block = 512 << 10, freed = 512 << 10;
  int64_t budget = int64_t{24} << 20;
  double t0 = 0.05, t1 = 0.001, forward = 0.0002;
  std::vector<std::string> applied;
  std::vector<std::vector<std::string>> sets;    // every set_checkpointing call
  std::vector<std::vector<int64_t>> windows;

  int64_t per_sample() const {
    const int64_t k = static_cast<int64_t>(applied.size());
    return head + 4 * block - k * freed + (k > 0 ? freed : 0);
  }
  WindowMeasurement run_window(const std::vector<int64_t>& sizes, int64_t, std::optional<int64_t> limit) override {
    windows.push_back(sizes);
    WindowMeasurement m;
    m.first_microbatch_peak_bytes = persistent + fixed + per_sample() * sizes.front();
    for (size_t i = 1; i < sizes.size(); ++i) {
      m.steady_peak_bytes = std::max(m.steady_peak_bytes, persistent + fixed + per_sample() * sizes[i]);
    }
    m.peak_bytes = m.max_peak_bytes = std::max(m.first_microbatch_peak_bytes, m.steady_peak_bytes);
    m.optimizer_step_peak_bytes = persistent;
    m.step_seconds = t0 + static_cast<double>(sizes.front()) *
                              (t1 + forward * static_cast<double>(applied.size()));
    m.seconds = m.step_seconds * static_cast<double>(sizes.size());
    const int64_t cap = limit.value_or(INT64_MAX);
    if (m.max_peak_bytes > cap) m.oom = true;
    return m;
  }
  void set_checkpointing(const std::vector<std::string>& modules) override {
    applied = modules;
    sets.push_back(modules);
  }
  std::vector<BlockCost> costs() const {
    std::vector<BlockCost> out;
    for (int i = 0; i < 4; ++i) out.push_back({"blocks." + std::to_string(i), static_cast<double>(block), forward});
    return out;
  }
};

// The device's plan for 64 samples searched with its current set applied.
Plan searched(BlocksDevice& d, std::vector<Trial>& trials) {
  SearchSettings s;
  s.budget_bytes = d.budget;
  s.budget_is_simulated = true;
  s.device_total_bytes = d.budget;
  s.device_name = "blocks device";
  s.max_probe_micro_batch = 64;
  Search search(d, s, trials);
  Profile p = accumplan::test::linear_profile(d.persistent / 2, 0, 0);
  p.points.clear();
  p.budget_bytes = d.budget;
  search.profile(p);
  p.trials = trials;
  PlanRequest r;
  r.target_batch = 64;
  return search.plan_and_confirm(p, r);
}

Search search_on(BlocksDevice& d, std::vector<Trial>& trials) {
  SearchSettings s;
  s.budget_bytes = d.budget;
  s.budget_is_simulated = true;
  s.device_name = "blocks device";
  return Search(d, s, trials);
}

const Trial kCosts{"costs", 8, true, 20 << 20, 0.1, {8}, std::nullopt};

}  // namespace

TEST_CASE("Checkpoint: a set faster than none is confirmed by one real window with it applied",
          "[checkpoint][search]") {
  BlocksDevice d;
  std::vector<Trial> trials;
  const Plan none = searched(d, trials);
  REQUIRE(none.confirmed);
  const size_t before = d.windows.size();
  std::vector<Trial> more;
  Search search = search_on(d, more);
  const Plan p = search.plan_checkpointing(none, d.costs(), 0, CheckpointSet{}, true, kCosts);
  REQUIRE(p.checkpoint);
  CHECK(d.windows.size() == before + 1);              // one window: the confirmation
  CHECK(d.sets.back() == p.checkpoint->modules);      // run with the chosen set applied
  CHECK(p.micro_batch > none.micro_batch);
  CHECK(p.confirmed);
  REQUIRE(p.checkpoint->trials.size() == 2);
  CHECK(p.checkpoint->trials[0].kind == "costs");
  CHECK(p.checkpoint->trials[1].kind == "confirm");
  CHECK(p.checkpoint->trials[1].fit);
  // The confirmation ran at the largest size allowed; the prediction at the split's largest is the
  // device's own peak there (the device is the model exactly).
  CHECK(p.checkpoint->trials[1].micro_batch == p.max_micro_batch);
  CHECK(*p.confirmed_peak_bytes <= d.budget);
  CHECK(std::abs(p.memory.predicted_peak_bytes - (d.persistent + d.fixed + d.per_sample() * p.micro_batch)) <= 64);
  const Plan read = plan_from_text(to_json(p).dump(), "checkpointed");
  CHECK(read.checkpoint->trials.size() == 2);
  // A re-plan after an OOM keeps the checkpointing and only shrinks (its profile is the plan without it).
  const Plan smaller = replan_below(p, p.micro_batch);
  REQUIRE(smaller.checkpoint);
  CHECK(smaller.checkpoint->modules == p.checkpoint->modules);
  CHECK(smaller.micro_batch < p.micro_batch);
}

TEST_CASE("Checkpoint: a confirming window that does not fit leaves the plan without checkpointing and says why",
          "[checkpoint][search]") {
  BlocksDevice d;
  d.freed = 128 << 10;  // the measured costs claim 512 KiB per block; checkpointing frees a quarter of it
  std::vector<Trial> trials;
  const Plan none = searched(d, trials);
  std::vector<Trial> more;
  Search search = search_on(d, more);
  const Plan p = search.plan_checkpointing(none, d.costs(), 0, CheckpointSet{}, true, kCosts);
  CHECK_FALSE(p.checkpoint);
  CHECK(p.micro_batch == none.micro_batch);
  CHECK(p.confirmed);
  CHECK(d.applied.empty());  // the runner back at no checkpointing
  CHECK(p.reason.find("was predicted to fit") != std::string::npos);
}

TEST_CASE("Checkpoint: a plan searched with every block checkpointed states it, none fitting without",
          "[checkpoint][search]") {
  BlocksDevice d;
  d.budget = 11 << 20;  // without checkpointing one sample needs 11.25 MiB, with all of it 2 fit
  d.applied = {"blocks.0", "blocks.1", "blocks.2", "blocks.3"};
  std::vector<Trial> trials;
  const Plan all = searched(d, trials);
  REQUIRE(all.confirmed);
  std::vector<Trial> more;
  Search search = search_on(d, more);
  CheckpointSet applied = checkpoint_sets(4).back();
  const size_t before = d.windows.size();
  REQUIRE(all.timing);
  Plan timed = all;
  timed.timing->window_seconds = 1.25 * all.timing->window_seconds;  // not what the checkpoint model says
  const Plan p = search.plan_checkpointing(timed, d.costs(), 0, applied, true, kCosts);
  REQUIRE(p.checkpoint);
  CHECK(d.windows.size() == before);  // the search's own windows confirmed it
  CHECK(p.checkpoint->rule == "all");
  CHECK(p.checkpoint->without.micro_batch == 0);
  CHECK(p.micro_batch == all.micro_batch);
  CHECK(p.checkpoint->trials.size() == 1);
  // One time for the window: the windows ran with the set applied, so their timing is its figure.
  CHECK(p.checkpoint->predicted_seconds_per_window == timed.timing->window_seconds);
  CHECK(describe_plan(p).find("predicted window") == std::string::npos);
  const Plan smaller = replan_below(p, p.micro_batch);  // solved again from its own profile, checkpointing kept
  REQUIRE(smaller.checkpoint);
  CHECK(smaller.checkpoint->rule == "all");
}

