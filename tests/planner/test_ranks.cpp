// test_ranks.cpp — ranks that differ: the shares, each rank's window, the reader's rules, the
// window loop on a rank of such a plan, and a rank's re-plan after an out-of-memory.
#include <algorithm>
#include <catch2/catch.hpp>
#include <limits>
#include <numeric>

#include "accumplan/errors.h"
#include "accumplan/ranks.h"
#include "accumplan/report.h"
#include "accumplan/sharding.h"
#include "accumplan/window_loop.h"
#include "test_helpers.h"

using namespace accumplan;
using accumplan::test::linear_profile;
using accumplan::test::MiB;
using json = nlohmann::json;

namespace {

// Rank 0: at most 8 a microbatch, 10 ms + 2 ms a sample; rank 1: at most 24, 10 ms + 1 ms a sample.
std::vector<RankCapacity> two_ranks() {
  return {{8, TimeModel::line(0.010, 0.002)}, {24, TimeModel::line(0.010, 0.001)}};
}

double window_seconds(const std::vector<RankCapacity>& ranks, const std::vector<int64_t>& shares) {
  std::vector<std::vector<int64_t>> splits;
  for (size_t r = 0; r < ranks.size(); ++r) splits.push_back(split_samples(shares[r], ranks[r].max_micro_batch, "balanced"));
  return ranks_window_seconds(ranks, splits);
}

// A profile whose windows made a rank's exchange, with step times of 10 ms + `ms_per_sample` a sample.
Profile rank_profile(double ms_per_sample) {
  Profile p = linear_profile(64 * MiB, 8 * MiB, 1 * MiB);
  for (ProfilePoint& pt : p.points) pt.step_seconds = 0.010 + ms_per_sample * 1e-3 * static_cast<double>(pt.micro_batch);
  p.gradient_exchange = true;
  return p;
}

PlanRequest two_rank_request(int64_t target_batch) {
  PlanRequest r;
  r.target_batch = target_batch;
  r.world_size = 2;
  r.headroom = parse_headroom("0");
  return r;
}

}  // namespace

TEST_CASE("Ranks: the shares finish a window soonest, no share split of the pair does better", "[ranks]") {
  const auto ranks = two_ranks();
  const std::vector<int64_t> shares = choose_shares(ranks, 128);
  REQUIRE(shares.size() == 2);
  CHECK(shares[0] + shares[1] == 128);
  CHECK(shares[1] > shares[0]);  // the faster rank with the larger microbatch takes more
  double best = std::numeric_limits<double>::infinity();
  for (int64_t s0 = 1; s0 < 128; ++s0) best = std::min(best, window_seconds(ranks, {s0, 128 - s0}));
  CHECK(window_seconds(ranks, shares) == Approx(best).epsilon(1e-12));
  // What the peers do, the same batch per rank: clearly slower.
  CHECK(window_seconds(ranks, {64, 64}) > 1.2 * window_seconds(ranks, shares));
}

TEST_CASE("Ranks: shares are multiples of the unit and at least one per rank", "[ranks]") {
  const auto ranks = two_ranks();
  const std::vector<int64_t> shares = choose_shares(ranks, 96, 4);
  CHECK(shares[0] + shares[1] == 96);
  CHECK(shares[0] % 4 == 0);
  CHECK(shares[1] % 4 == 0);
  CHECK(shares[0] >= 4);
  CHECK_THROWS_AS(choose_shares(ranks, 1), InputError);  // two ranks cannot share one sample
}

TEST_CASE("Ranks: each rank's budget gives its microbatch and its predicted peak", "[ranks]") {
  PlanRequest r = two_rank_request(256);
  // 128 MiB persistent + 8 MiB fixed + 1 MiB a sample: 24 MiB more than the base fits 16, 64 fits 56.
  const std::vector<BudgetSpec> budgets = parse_rank_budgets("160MiB,200MiB", 2, "--memory-budget");
  const Plan plan = plan_ranks({rank_profile(1.0), rank_profile(0.5)}, budgets, r);
  REQUIRE(plan.ranks.size() == 2);
  CHECK(plan.ranks[0].max_micro_batch == 24);
  CHECK(plan.ranks[1].max_micro_batch == 64);
  CHECK(plan.ranks[0].per_rank_batch + plan.ranks[1].per_rank_batch == 256);
  CHECK(plan.ranks[1].per_rank_batch > plan.ranks[0].per_rank_batch);
  for (const RankWindow& w : plan.ranks) {
    CHECK(w.predicted_peak_bytes <= w.budget_bytes);
    CHECK(*std::max_element(w.microbatch_sizes.begin(), w.microbatch_sizes.end()) <= w.max_micro_batch);
  }
  for (const RankWindow& w : plan.ranks) {  // the line is exact: 136 MiB + 1 MiB a sample of the largest microbatch
    CHECK(w.predicted_peak_bytes == 136 * MiB + MiB * *std::max_element(w.microbatch_sizes.begin(), w.microbatch_sizes.end()));
  }
  CHECK(plan.per_rank_batch == plan.ranks[0].per_rank_batch);  // the window fields are rank 0's
  CHECK(predicted_peak_of_rank(plan, 1) == plan.ranks[1].predicted_peak_bytes);
  // The plan goes through the reader unchanged.
  const Plan back = plan_from_json(json::parse(to_json(plan).dump()));
  REQUIRE(back.ranks.size() == 2);
  CHECK(back.ranks[1].microbatch_sizes == plan.ranks[1].microbatch_sizes);
  CHECK(back.ranks[1].budget_bytes == 200 * MiB);
  CHECK_THAT(describe_plan(plan), Catch::Contains("rank 1") && Catch::Contains("predicted peak"));
  // The report shows each rank's budget, share and predicted peak.
  const std::string html = render_report_html(report_input_from_plan(plan));
  CHECK_THAT(html, Catch::Contains("Ranks that differ") && Catch::Contains("200.0 MiB") &&
                       Catch::Contains(format_bytes(plan.ranks[1].predicted_peak_bytes)));
}

TEST_CASE("Ranks: a plan asks a budget or a profile for every rank, or one for all", "[ranks]") {
  PlanRequest r = two_rank_request(256);
  CHECK_THROWS_WITH(parse_rank_budgets("1GiB,2GiB,3GiB", 2, "--memory-budget"),
                    Catch::Contains("holds 3 budgets for 2 ranks"));
  CHECK_THROWS_WITH(plan_ranks({rank_profile(1), rank_profile(1), rank_profile(1)}, {BudgetSpec{}}, r),
                    Catch::Contains("3 profile(s)"));
  Profile single = rank_profile(1);
  single.gradient_exchange = false;
  CHECK_THROWS_WITH(plan_ranks({single}, parse_rank_budgets("160MiB,200MiB", 2, "b"), r),
                    Catch::Contains("gradient exchange"));
  // A rank whose budget fits no sample is named.
  CHECK_THROWS_WITH(plan_ranks({rank_profile(1)}, parse_rank_budgets("160MiB,100MiB", 2, "b"), r),
                    Catch::StartsWith("rank 1: "));
}

TEST_CASE("Ranks: the reader refuses ranks that do not match the world size or the window", "[ranks]") {
  const Plan plan = plan_ranks({rank_profile(1.0), rank_profile(0.5)}, parse_rank_budgets("160MiB,200MiB", 2, "b"),
                               two_rank_request(256));
  const json good = json::parse(to_json(plan).dump());
  CHECK(accumplan::test::plan_schema_error(good).empty());
  json missing = good;
  missing["ranks"].erase(1);
  CHECK_THAT(accumplan::test::plan_schema_error(missing), Catch::Contains("$.ranks: 1 ranks for world_size 2"));
  json extra = good;
  extra["ranks"][1]["per_rank_batch"] = extra["ranks"][1]["per_rank_batch"].get<int64_t>() + 1;
  extra["ranks"][1]["microbatch_sizes"][0] = extra["ranks"][1]["microbatch_sizes"][0].get<int64_t>() + 1;
  CHECK_THAT(accumplan::test::plan_schema_error(extra), Catch::Contains("the shares sum to 257, but target_batch is 256"));
  json split = good;
  split["ranks"][1]["microbatch_sizes"][0] = 1;
  CHECK_THAT(accumplan::test::plan_schema_error(split), Catch::Contains("$.ranks[1].microbatch_sizes: they do not sum"));
  json order = good;
  order["ranks"][0]["rank"] = 1;
  CHECK_THAT(accumplan::test::plan_schema_error(order), Catch::Contains("$.ranks[0].rank"));
}

TEST_CASE("Ranks: each rank takes its consecutive share; a short window is shared in proportion", "[ranks]") {
  Plan plan = plan_ranks({rank_profile(1.0), rank_profile(0.5)}, parse_rank_budgets("160MiB,200MiB", 2, "b"),
                         two_rank_request(256));
  const int64_t s0 = plan.ranks[0].per_rank_batch;
  CHECK(rank_share(plan, 0, 256) == std::pair<int64_t, int64_t>{0, s0});
  CHECK(rank_share(plan, 1, 256) == std::pair<int64_t, int64_t>{s0, 256 - s0});
  for (int64_t n : {1, 2, 7, 100, 255}) {
    const auto [a0, c0] = rank_share(plan, 0, n);
    const auto [a1, c1] = rank_share(plan, 1, n);
    CHECK(a0 == 0);
    CHECK(a1 == c0);
    CHECK(c0 + c1 == n);
    CHECK(c0 <= s0);
    CHECK(c1 <= 256 - s0);
  }
}

TEST_CASE("Ranks: a rank that runs out of memory re-plans its own window; the shares stay", "[ranks]") {
  const Plan plan = plan_ranks({rank_profile(1.0), rank_profile(0.5)}, parse_rank_budgets("160MiB,200MiB", 2, "b"),
                               two_rank_request(256));
  const Plan next = replan_rank(plan, 1, 40);
  CHECK(next.ranks[1].max_micro_batch == 39);
  CHECK(*std::max_element(next.ranks[1].microbatch_sizes.begin(), next.ranks[1].microbatch_sizes.end()) <= 39);
  CHECK(next.ranks[1].per_rank_batch == plan.ranks[1].per_rank_batch);
  CHECK(next.ranks[0].microbatch_sizes == plan.ranks[0].microbatch_sizes);
  CHECK(next.microbatch_sizes == plan.microbatch_sizes);  // rank 0's window, untouched
  const Plan first = replan_rank(plan, 0, 10);
  CHECK(first.micro_batch <= 9);
  CHECK(first.microbatch_sizes == first.ranks[0].microbatch_sizes);
  check_plan_window(next);
  check_plan_window(first);
}

TEST_CASE("Ranks: the window loop splits each rank's share by its own window", "[ranks]") {
  // Rank 1 of two, seen through a fake peer (rank 0) that adds its slots to every sum.
  struct RankOne : WindowBackend {
    int64_t samples = 0;
    std::vector<int64_t> peer;
    std::vector<int64_t> ran;
    int world_size() const override { return 2; }
    int rank() const override { return 1; }
    std::vector<int64_t> sum_over_ranks(const std::vector<int64_t>& v) override {
      if (v.size() != peer.size()) return v;  // the rounds' status: the peer's rounds all ran
      std::vector<int64_t> sum = v;
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += peer[i];
      return sum;
    }
    ShareCounts count_share() override { return ShareCounts{samples, samples, 0, {}, "samples"}; }
    void begin_attempt() override {}
    void run_microbatch(const Microbatch& mb, int64_t) override { ran.push_back(mb.where.size); }
    bool is_out_of_memory(const std::exception&) const override { return false; }
    void after_out_of_memory() override {}
    double loss_sum() override { return 0; }
    double exchange_gradients() override { return 0; }
    bool unscale_finds_non_finite() override { return false; }
    double gradient_norm() override { return 0; }
    void scale_gradients(double) override {}
    void optimizer_step(int64_t) override {}
    void after_update(bool, const StepEvent&) override {}
    void drop_gradients() override {}
    bool optimizer_state_exists() const override { return false; }
    bool wall_time_is_device_time() const override { return true; }
  };
  Plan plan = plan_ranks({rank_profile(1.0), rank_profile(0.5)}, parse_rank_budgets("160MiB,200MiB", 2, "b"),
                         two_rank_request(256));
  const int64_t s0 = plan.ranks[0].per_rank_batch, s1 = plan.ranks[1].per_rank_batch;
  WindowLoop loop(plan);
  RankOne b;
  b.samples = s1;
  b.peer = {s0, s0, 0, s0, 0};
  const WindowStats st = loop.accumulate(b, WindowOptions{});
  CHECK(b.ran == plan.ranks[1].microbatch_sizes);  // its own split, not rank 0's
  CHECK(st.microbatch_rounds == static_cast<int64_t>(std::max(plan.ranks[0].microbatch_sizes.size(),
                                                              plan.ranks[1].microbatch_sizes.size())));
  CHECK(st.samples == 256);
  // Handed more than its share: refused, naming the share's samples.
  b.samples = s1 + 1;
  b.peer = {s0 - 1, s0 - 1, 0, s0 - 1, 0};
  CHECK_THROWS_WITH(loop.accumulate(b, WindowOptions{}),
                    Catch::Contains("more than its share " + std::to_string(s1)) &&
                        Catch::Contains("takes samples " + std::to_string(s0) + "..255"));
}
