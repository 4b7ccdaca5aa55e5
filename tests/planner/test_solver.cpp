// The solver's arithmetic: m_max, k, balanced and uniform splits, weights, bounds and errors.
// Profiles here are exact lines (test_helpers.h), so every expected number is computed by hand.
#include <catch2/catch.hpp>

#include <numeric>

#include "accumplan/errors.h"
#include "accumplan/memory_model.h"
#include "accumplan/solver.h"
#include "test_helpers.h"

using namespace accumplan;
using accumplan::test::linear_profile;

namespace {
constexpr int64_t MiB = 1024 * 1024;

// A budget (with headroom 0) at which exactly `m` samples fit.
int64_t budget_for(const Profile& p, int64_t m, int64_t fixed, int64_t per_sample) {
  return p.persistent.total() + fixed + per_sample * m + per_sample - 1;
}

PlanRequest request(int64_t B, int64_t budget_bytes) {
  PlanRequest r;
  r.target_batch = B;
  r.budget.bytes = budget_bytes;
  r.headroom = 0.0;
  return r;
}

// peak(b) = persistent + 1 MiB + 1 MiB·b at each (size, step seconds) given.
Profile timed_profile(const std::vector<std::pair<int64_t, double>>& times) {
  Profile p = linear_profile(MiB, MiB, MiB);
  p.points.clear();
  for (const auto& [b, t] : times) {
    ProfilePoint pt;
    pt.micro_batch = b;
    pt.peak_bytes = p.persistent.total() + MiB + MiB * b;
    pt.step_seconds = t;
    p.points.push_back(pt);
  }
  return p;
}

std::string error_of(const Profile& p, const PlanRequest& r) {
  try {
    make_plan(p, r);
  } catch (const InputError& e) {
    CHECK(e.exit_code() == 2);
    return e.what();
  }
  FAIL("make_plan did not throw");
  return "";
}
}  // namespace

TEST_CASE("Solver: 256 with m_max 60 splits balanced as 52,51,51,51,51", "[solver]") {
  const Profile p = linear_profile(100 * MiB, 10 * MiB, 3 * MiB);
  const Plan plan = make_plan(p, request(256, budget_for(p, 60, 10 * MiB, 3 * MiB)));
  CHECK(plan.max_micro_batch == 60);
  CHECK(plan.accumulation_steps == 5);
  CHECK(plan.microbatch_sizes == std::vector<int64_t>{52, 51, 51, 51, 51});
  CHECK(plan.micro_batch == 52);
  CHECK(plan.weights[0] == Approx(52.0 / 256));
  CHECK(plan.weights[4] == Approx(51.0 / 256));
  CHECK(plan.memory.predicted_peak_bytes == p.persistent.total() + 10 * MiB + 52 * 3 * MiB);
  CHECK(plan.memory.activation_bytes_per_sample == Approx(3.0 * MiB));
  CHECK(plan.memory.activation_fixed_bytes == 10 * MiB);
  CHECK(plan.uniform.micro_batch == 32);  // largest divisor of 256 that is <= 60
  CHECK(plan.uniform.accumulation_steps == 8);
  CHECK_FALSE(plan.confirmed);
  CHECK(plan.reason.find("is 60") != std::string::npos);
  CHECK(plan.reason.find("52,51,51,51,51") != std::string::npos);
}

TEST_CASE("Solver: uniform split uses the largest divisor of T not above m_max", "[solver]") {
  const Profile p = linear_profile(100 * MiB, 10 * MiB, 3 * MiB);
  PlanRequest r = request(256, budget_for(p, 60, 10 * MiB, 3 * MiB));
  r.split = "uniform";
  const Plan plan = make_plan(p, r);
  CHECK(plan.microbatch_sizes == std::vector<int64_t>(8, 32));
  CHECK(plan.split == "uniform");
}

TEST_CASE("Solver: the whole batch fitting means no accumulation", "[solver]") {
  const Profile p = linear_profile(MiB, MiB, MiB);
  const Plan plan = make_plan(p, request(32, int64_t{1} << 36));
  CHECK(plan.microbatch_sizes == std::vector<int64_t>{32});
  CHECK(plan.weights == std::vector<double>{1.0});
  CHECK(plan.reason.find("no accumulation") != std::string::npos);
}

TEST_CASE("Solver: world size divides the target batch, or the error names the nearest values", "[solver][errors]") {
  const Profile p = linear_profile(MiB, MiB, MiB);
  PlanRequest r = request(256, budget_for(p, 30, MiB, MiB));
  r.world_size = 4;
  const Plan plan = make_plan(p, r);
  CHECK(plan.per_rank_batch == 64);
  CHECK(plan.microbatch_sizes == std::vector<int64_t>{22, 21, 21});
  CHECK(std::accumulate(plan.microbatch_sizes.begin(), plan.microbatch_sizes.end(), int64_t{0}) == 64);

  r.target_batch = 250;
  const std::string msg = error_of(p, r);
  CHECK(msg.find("250") != std::string::npos);
  CHECK(msg.find("248 or 252") != std::string::npos);

  r.world_size = 0;
  CHECK(error_of(p, r).find("--world-size must be at least 1, got 0") != std::string::npos);
}

TEST_CASE("Solver: multiple_of rounds m_max down and keeps every microbatch a multiple", "[solver]") {
  const Profile p = linear_profile(MiB, MiB, MiB);
  PlanRequest r = request(256, budget_for(p, 60, MiB, MiB));
  r.multiple_of = 8;
  const Plan plan = make_plan(p, r);
  CHECK(plan.max_micro_batch == 56);
  CHECK(plan.microbatch_sizes == std::vector<int64_t>{56, 56, 48, 48, 48});
  for (auto n : plan.microbatch_sizes) CHECK(n % 8 == 0);
  CHECK(plan.uniform.micro_batch == 32);
  CHECK(plan.reason.find("56 as a multiple of 8") != std::string::npos);

  r.target_batch = 100;  // 100 is not a multiple of 8
  CHECK(error_of(p, r).find("nearest valid target batches: 96 or 104") != std::string::npos);
}

TEST_CASE("Solver: max_micro_batch bounds the plan below what memory allows", "[solver]") {
  const Profile p = linear_profile(MiB, MiB, MiB);
  PlanRequest r = request(256, budget_for(p, 60, MiB, MiB));
  r.max_micro_batch = 40;
  const Plan plan = make_plan(p, r);
  CHECK(plan.max_micro_batch == 40);
  CHECK(plan.microbatch_sizes == std::vector<int64_t>{37, 37, 37, 37, 36, 36, 36});
  CHECK(plan.reason.find("--max-micro-batch bounds the microbatch at 40 (memory alone would allow 60)") !=
        std::string::npos);
  r.max_micro_batch = 0;
  CHECK(error_of(p, r).find("--max-micro-batch must be at least 1") != std::string::npos);
}

TEST_CASE("Solver: a percentage budget resolves against the profiled device", "[solver]") {
  const int64_t total = 1000 * MiB;
  const Profile p = linear_profile(100 * MiB, 0, 10 * MiB, total);
  PlanRequest r;
  r.target_batch = 512;
  r.budget = parse_budget("50%", "--memory-budget");
  r.headroom = 0;
  // 500 MiB - 200 MiB persistent = 300 MiB of activations at 10 MiB/sample.
  CHECK(make_plan(p, r).max_micro_batch == 30);
  // Without --memory-budget the whole device is the budget: 800 MiB / 10 MiB.
  r.budget = BudgetSpec{};
  CHECK(make_plan(p, r).max_micro_batch == 80);
}

TEST_CASE("Solver: headroom keeps a fraction of the budget free", "[solver]") {
  const Profile p = linear_profile(100 * MiB, 0, 10 * MiB);
  PlanRequest r = request(512, 1000 * MiB);
  CHECK(make_plan(p, r).max_micro_batch == 80);
  r.headroom = 0.10;  // usable 900 MiB: 70 samples
  const Plan plan = make_plan(p, r);
  CHECK(plan.max_micro_batch == 70);
  CHECK(plan.memory.usable_bytes == 900 * MiB);
  CHECK(plan.memory.headroom == 0.10);
  CHECK(PlanRequest{}.headroom == 0.10);  // the documented default
  for (double bad : {-0.1, 1.0, 1.5}) {
    r.headroom = bad;
    CHECK(error_of(p, r).find("--headroom must be a fraction in [0, 1)") != std::string::npos);
  }
}

TEST_CASE("Solver: an infeasible budget shows the breakdown and the budget that would work", "[solver][errors]") {
  const Profile p = linear_profile(100 * MiB, 10 * MiB, 5 * MiB);
  // Persistent memory alone (200 MiB) is over the budget.
  std::string msg = error_of(p, request(64, 150 * MiB));
  CHECK(msg.find("persistent memory alone is 200.0 MiB") != std::string::npos);
  CHECK(msg.find("weights 100.0 MiB") != std::string::npos);
  CHECK(msg.find("Raise --memory-budget to at least 215.0 MiB") != std::string::npos);
  // Persistent fits but microbatch 1 does not.
  msg = error_of(p, request(64, 212 * MiB));
  CHECK(msg.find("the smallest microbatch needs weights 100.0 MiB + gradients 100.0 MiB + optimizer "
                 "state 0 B + activations at microbatch 1 15.0 MiB = 215.0 MiB") != std::string::npos);
}

TEST_CASE("Solver: target batch must be at least 1", "[solver][errors]") {
  const Profile p = linear_profile(MiB, MiB, MiB);
  CHECK(error_of(p, request(0, 1 << 30)).find("--target-batch must be at least 1, got 0") != std::string::npos);
  CHECK(error_of(p, request(-3, 1 << 30)).find("got -3") != std::string::npos);
}

TEST_CASE("Solver: sizes sum to T and weights to 1 for every B in 1..1024 and m_max in 1..B", "[solver][sweep]") {
  const Profile p = linear_profile(MiB, MiB, MiB);
  PlanRequest r = request(1, int64_t{1} << 40);
  for (int64_t B = 1; B <= 1024; ++B) {
    r.target_batch = B;
    for (int64_t m = 1; m <= B; ++m) {
      r.max_micro_batch = m;
      const Plan plan = make_plan(p, r);
      int64_t sum = 0;
      double wsum = 0;
      int64_t lo = plan.microbatch_sizes.front(), hi = lo;
      for (size_t i = 0; i < plan.microbatch_sizes.size(); ++i) {
        const int64_t n = plan.microbatch_sizes[i];
        sum += n;
        wsum += plan.weights[i];
        lo = std::min(lo, n);
        hi = std::max(hi, n);
      }
      const int64_t k = (B + m - 1) / m;
      // Collect failures cheaply; REQUIRE inside 500k iterations would be slow to report.
      if (sum != B || std::fabs(wsum - 1.0) > 1e-12 || hi > m || hi - lo > 1 ||
          plan.accumulation_steps != k) {
        FAIL("B=" << B << " m=" << m << " sum=" << sum << " wsum=" << wsum << " k=" << plan.accumulation_steps);
      }
      const int64_t u = plan.uniform.micro_batch;
      if (u > m || B % u != 0 || plan.uniform.accumulation_steps * u != B) {
        FAIL("uniform B=" << B << " m=" << m << " u=" << u);
      }
      for (int64_t d = u + 1; d <= m; ++d) {
        if (B % d == 0) FAIL("uniform B=" << B << " m=" << m << " chose " << u << " but " << d << " divides");
      }
    }
  }
  SUCCEED();
}

TEST_CASE("Solver: measured step times may choose more microbatches, and the reason says so", "[solver][timing]") {
  // Throughput collapses above 16 (a cache cliff): 16 costs 0.16 s but 32 costs 1.0 s.
  const Profile p = timed_profile({{1, 0.01}, {2, 0.02}, {4, 0.04}, {8, 0.08}, {16, 0.16}, {32, 1.0}});
  PlanRequest r = request(64, int64_t{1} << 40);
  r.max_micro_batch = 32;
  r.use_timing = true;
  const Plan plan = make_plan(p, r);
  CHECK(plan.accumulation_steps > 2);
  CHECK(plan.reason.find("faster per window than 2, so") != std::string::npos);
  CHECK(plan.reason.find("need 2 microbatches") != std::string::npos);  // memory's answer, then timing's
  REQUIRE(plan.timing);
  CHECK(plan.timing->window_seconds < 2.0);

  r.use_timing = false;
  CHECK(make_plan(p, r).accumulation_steps == 2);
}

TEST_CASE("Solver: a predicted gain under 10% keeps the fewest microbatches", "[solver][timing]") {
  // Linear up to 8 (1 ms per sample), steeper to 32: eight microbatches of 8 are predicted 64 ms
  // per window against 68.8 ms for 22,21,21, a 7% gain — within what noise alone produces.
  const Profile p = timed_profile({{1, 0.001}, {8, 0.008}, {32, 0.0349}});
  PlanRequest r = request(64, int64_t{1} << 40);
  r.max_micro_batch = 22;
  r.use_timing = true;
  const Plan plan = make_plan(p, r);
  CHECK(plan.microbatch_sizes == std::vector<int64_t>{22, 21, 21});
  CHECK(plan.reason.find("--use-timing found no split predicted at least 10% faster per window") != std::string::npos);
  REQUIRE(plan.timing);
  CHECK(plan.timing->window_seconds == Approx(0.0688).epsilon(0.01));
}

TEST_CASE("Solver: --use-timing that cannot apply says so in the reason", "[solver][timing]") {
  Profile p = linear_profile(MiB, MiB, MiB);  // no step times
  PlanRequest r = request(64, int64_t{1} << 40);
  r.max_micro_batch = 8;
  r.use_timing = true;
  const Plan untimed = make_plan(p, r);
  CHECK(untimed.accumulation_steps == 8);
  CHECK(untimed.reason.find("--use-timing had no effect: the profile has no step times") != std::string::npos);

  for (auto& pt : p.points) pt.step_seconds = 0.001 * static_cast<double>(pt.micro_batch);
  r.split = "uniform";
  const Plan uniform = make_plan(p, r);
  CHECK(uniform.accumulation_steps == 8);
  CHECK(uniform.reason.find("--use-timing had no effect: it weighs balanced splits only, not --split uniform") !=
        std::string::npos);

  r.use_timing = false;
  CHECK(make_plan(p, r).reason.find("timing") == std::string::npos);
}

TEST_CASE("Solver: split_samples covers a short last window with the fewest microbatches", "[solver]") {
  CHECK(split_samples(26, 8, "balanced") == std::vector<int64_t>{7, 7, 6, 6});
  CHECK(split_samples(26, 8, "uniform") == std::vector<int64_t>{2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2});
  CHECK(split_samples(5, 60, "balanced") == std::vector<int64_t>{5});
  CHECK(balanced_split(256, 5) == std::vector<int64_t>{52, 51, 51, 51, 51});
  CHECK(largest_divisor_at_most(256, 60) == 32);
  CHECK(largest_divisor_at_most(97, 60) == 1);
}
