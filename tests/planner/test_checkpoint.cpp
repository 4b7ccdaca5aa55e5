// test_checkpoint.cpp — activation checkpointing's model and choice (accumplan/checkpoint.h):
// the sets considered, the peak and time formulas by hand, and the choice of the least predicted
// window time (a model that only fits checkpointed, plentiful memory where none wins, a fixed
// per-microbatch cost that makes a larger checkpointed microbatch faster), the model of a solved
// plan, and the plan with the chosen set (valid for both readers).
#include <catch2/catch.hpp>

#include <cmath>

#include <nlohmann/json.hpp>

#include "accumplan/checkpoint.h"
#include "accumplan/errors.h"
#include "accumplan/schema.h"
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
  m.step_seconds = 0.005;
  m.step_seconds_per_sample = 0.010;
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
  m.step_seconds = 0.5;  // a launch-bound step: fewer microbatches pay
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

TEST_CASE("Checkpoint: a plan's model is its fit's line and its step times' line", "[checkpoint]") {
  const Plan plan = timed_plan(8 << 20, 0.02, 0.005, int64_t{64} << 20);
  const CheckpointModel m = checkpoint_model_of(plan, {{"b0", 1e6, 1e-3}});
  CHECK(m.intercept_bytes == Approx(plan.fit.intercept_bytes));
  CHECK(m.slope_bytes_per_sample == Approx(plan.fit.slope_bytes_per_sample));
  CHECK(m.step_seconds == Approx(0.02));
  CHECK(m.step_seconds_per_sample == Approx(0.005));
  // A line that would give a negative per-microbatch cost: t0 = 0, the mean seconds per sample.
  const CheckpointModel clamped = checkpoint_model_of(timed_plan(8 << 20, -0.01, 0.005, int64_t{64} << 20), {});
  CHECK(clamped.step_seconds == 0);
  CHECK(clamped.step_seconds_per_sample > 0);
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
  CHECK(p.memory.predicted_peak_bytes == choice->predicted_peak_bytes);
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
