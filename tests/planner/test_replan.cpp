// Re-planning after an OOM (accumplan/replan.h) and the plan rules it shares with the solver
// and the reader: set_window, kept_margin, check_plan_window. Torch-free.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>

#include "accumplan/errors.h"
#include "accumplan/memory_model.h"
#include "accumplan/replan.h"
#include "accumplan/schema.h"
#include "accumplan/solver.h"
#include "test_helpers.h"

using namespace accumplan;

namespace {

Plan make_plan_with(std::vector<int64_t> sizes) {
  Plan p;
  p.per_rank_batch = p.target_batch = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  const int64_t largest = *std::max_element(sizes.begin(), sizes.end());
  set_window(p, std::move(sizes), largest);
  p.reason = "test plan.";
  return p;
}

std::string window_error(const Plan& p) {
  try {
    check_plan_window(p);
  } catch (const SchemaError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("Replan: below a failing size, the same batch in smaller microbatches", "[replan]") {
  Plan p = make_plan_with({52, 51, 51, 51, 51});
  p.max_micro_batch = 60;
  std::string note;
  Plan q = replan_below(p, 52, &note);
  CHECK(q.per_rank_batch == 256);
  CHECK(q.max_micro_batch == 51);
  CHECK(q.microbatch_sizes == std::vector<int64_t>{43, 43, 43, 43, 42, 42});
  CHECK(q.micro_batch <= 51);
  CHECK(std::accumulate(q.microbatch_sizes.begin(), q.microbatch_sizes.end(), int64_t{0}) == 256);
  CHECK(q.accumulation_steps == 6);  // ceil(256 / 51)
  double wsum = 0;
  for (double w : q.weights) wsum += w;
  CHECK(wsum == Approx(1.0).epsilon(1e-12));
  CHECK_FALSE(q.confirmed);
  CHECK(q.reason.find("Re-planned during training after microbatch 52 ran out of memory") != std::string::npos);
  CHECK(note.find("re-split 256 samples under max_micro_batch 51") != std::string::npos);

  // multiple_of that cannot fit below the failing size is dropped, not looped on.
  Plan m8 = make_plan_with({8, 8});
  m8.multiple_of = 8;
  Plan r = replan_below(m8, 8, &note);
  CHECK(r.micro_batch == 6);  // 16 under 7: 6,5,5 balanced
  CHECK(r.microbatch_sizes == std::vector<int64_t>{6, 5, 5});
  CHECK_FALSE(r.multiple_of.has_value());
  CHECK_THROWS_AS(replan_below(m8, 1), InfeasibleError);

  // A short last window never uses a microbatch larger than the plan's.
  Plan big = make_plan_with({52, 51, 51, 51, 51});
  big.max_micro_batch = 60;
  CHECK(window_sizes(big, 60) == std::vector<int64_t>{30, 30});
  CHECK(window_sizes(big, 256) == big.microbatch_sizes);
  CHECK_THROWS_AS(window_sizes(big, 257), InputError);
  CHECK_THROWS_AS(window_sizes(big, 0), InputError);
}

TEST_CASE("Replan: the eval batch survives a training re-plan, solved or re-split", "[replan][eval]") {
  // It was measured with the training state resident, not at a training size.
  Plan golden = read_plan_file(accumplan::test::source_path("tests/golden/plan.json"));
  REQUIRE(golden.eval);
  golden.checkpoint.reset();  // its checkpointing was confirmed apart from its profile: that re-splits
  std::string note;
  const Plan solved = replan_below(golden, golden.micro_batch, &note);
  CHECK(note.find("solved again by the planner") != std::string::npos);
  REQUIRE(solved.eval);
  CHECK(solved.eval->micro_batch == golden.eval->micro_batch);
  CHECK(eval_sizes(solved, 2 * golden.eval->micro_batch + 1) ==
        std::vector<int64_t>{golden.eval->micro_batch, golden.eval->micro_batch, 1});
  Plan bare = make_plan_with({8, 8});
  bare.eval = golden.eval;
  CHECK(replan_below(bare, 8).eval->micro_batch == golden.eval->micro_batch);
  // Without one, an evaluation runs at the training microbatch.
  CHECK(eval_sizes(make_plan_with({8, 8}), 20) == std::vector<int64_t>{8, 8, 4});
  // More microbatches than a window may hold is refused before any list is made.
  CHECK(eval_sizes(make_plan_with({8, 8}), 8 * kMaxAccumulationSteps).size() == static_cast<size_t>(kMaxAccumulationSteps));
  CHECK_THROWS_WITH(eval_sizes(make_plan_with({8, 8}), 8 * kMaxAccumulationSteps + 1),
                    Catch::Contains("microbatches, more than 1048576; evaluate the data in parts"));
  CHECK_THROWS_AS(eval_size_after_oom(1), InfeasibleError);
  CHECK(eval_size_after_oom(9) == 4);
}

TEST_CASE("Replan: a re-split without a budget to solve under predicts by the solver's window rule", "[replan]") {
  // peak(b) = 10 MB + 1 MB per sample; the optimizer step peaks at 80 MB, above any microbatch
  // here: the window rule says 80 MB where the steady line alone said 10 MB + 31 MB.
  Plan p = make_plan_with({64, 64});
  p.profile.persistent = {4000000, 4000000, 2000000};
  for (int64_t b : {8, 16, 32, 64}) {
    ProfilePoint point;
    point.micro_batch = b;
    point.peak_bytes = 10000000 + 1000000 * b;
    point.optimizer_step_peak_bytes = 80000000;
    p.profile.points.push_back(point);
  }
  p.fit = MemoryModel::fit(p.profile).summary();
  std::string note;
  const Plan q = replan_below(p, 32, &note);  // memory.budget_bytes 0: nothing to solve under
  CHECK(note.find("re-split 128 samples under max_micro_batch 31") != std::string::npos);
  CHECK(q.memory.predicted_peak_bytes == MemoryModel::fit(p.profile).predict_window_peak_bytes(q.microbatch_sizes));
  CHECK(q.memory.predicted_peak_bytes == 80000000);
  // Without profile points only the plan's line is left: the largest microbatch's steady peak
  // (128 under 31: 26, 26, 26, 25, 25).
  Plan bare = p;
  bare.profile.points.clear();
  const Plan r = replan_below(bare, 32, &note);
  CHECK(r.micro_batch == 26);
  CHECK(r.memory.predicted_peak_bytes == 10000000 + 1000000 * 26);
}

TEST_CASE("Replan: set_window sets sizes, weights, steps and the uniform split together", "[replan][plan-rules]") {
  Plan p;
  p.per_rank_batch = p.target_batch = 256;
  set_window(p, {52, 51, 51, 51, 51}, 60);
  CHECK(p.micro_batch == 52);
  CHECK(p.accumulation_steps == 5);
  REQUIRE(p.weights.size() == 5);
  CHECK(p.weights[0] == Approx(52.0 / 256));
  CHECK(p.max_micro_batch == 60);
  CHECK(p.uniform.micro_batch == 32);  // the largest divisor of 256 up to 60
  CHECK(p.uniform.accumulation_steps == 8);
  CHECK(window_error(p).empty());
  // Set again with fewer sizes: nothing of the old window is left behind.
  set_window(p, {128, 128}, 128);
  CHECK(p.weights.size() == 2);
  CHECK(p.uniform.micro_batch == 128);
  CHECK(window_error(p).empty());
  // A unit that divides nothing up to the bound falls back to any divisor.
  Plan q;
  q.per_rank_batch = q.target_batch = 12;
  set_window(q, {7, 5}, 7, 8);
  CHECK(q.uniform.micro_batch == 6);
}

TEST_CASE("Replan: check_plan_window refuses a plan made in code that breaks the reader's rules", "[replan][plan-rules]") {
  Plan p = make_plan_with({3, 2});
  CHECK(window_error(p).empty());
  Plan empty = p;
  empty.microbatch_sizes.clear();
  CHECK(window_error(empty).find("$.microbatch_sizes") != std::string::npos);
  Plan no_weights = p;
  no_weights.weights.clear();
  CHECK(window_error(no_weights).find("$.weights: 0 weights for 2 microbatches") != std::string::npos);
  Plan wrong_sum = p;
  wrong_sum.microbatch_sizes = {3, 3};
  CHECK(window_error(wrong_sum).find("sizes sum to 6, but per_rank_batch is 5") != std::string::npos);
  Plan no_uniform = p;
  no_uniform.uniform = {};
  CHECK(window_error(no_uniform).find("$.uniform") != std::string::npos);
}

TEST_CASE("Replan: the kept margin drops auto's fraction and keeps a user's", "[replan][plan-rules]") {
  Margin m;
  m.headroom = "auto";
  m.activation_fraction = 0.02;
  m.fit_residual_bytes = 1000;
  m.allocator_fragmentation_bytes = 300;
  CHECK(kept_margin(m).bytes_at(100.0, 50) == 300);  // residual and 2% are prediction
  m.headroom = "0.1";
  m.activation_fraction = 0.1;
  m.fit_residual_bytes = 0;
  m.allocator_fragmentation_bytes = 0;
  CHECK(kept_margin(m).bytes_at(100.0, 50) == 500);  // 10% of 50 samples at 100 bytes
  m.headroom = "256 MiB";
  m.activation_fraction = 0;
  m.fixed_bytes = 256 << 20;
  CHECK(kept_margin(m).bytes_at(100.0, 50) == (256 << 20));
}
