// Token plans (accumplan/solver.h make_token_plan): a profile of (b, T) points planned to a token
// budget whose worst microbatch fits the budget less the margin, with the padded sample split
// beside it; bounds, failures, confirmation and refusals. The profiles are exact (b, T) models, so
// the expected budget follows by hand from c0 + B·(a1 + a2·T_max).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "accumplan/errors.h"
#include "accumplan/json_io.h"
#include "accumplan/schema.h"
#include "accumplan/solver.h"
#include "accumplan/tensor_spec.h"
#include "accumplan/token_model.h"
#include "test_helpers.h"

using namespace accumplan;
using accumplan::test::MiB;

namespace {


// peak(b, T) = 100 MiB + 4 KiB·b·T + 8 B·b·T², probed on b in {1, 2, 4} x T in {64, 256, 1024}.
Profile token_profile(const std::string& seq_len = "16..1024") {
  Profile p = test::linear_profile(40 * MiB, 0, 0);
  p.points.clear();
  p.persistent = {40 * MiB, 40 * MiB, 0};
  p.setup.inputs = {"int64[B,T]:50257"};
  p.setup.target = "int64[B,T]:50257";
  p.setup.seq_len = parse_seq_len(seq_len);
  for (int64_t b : {1, 2, 4}) {
    for (int64_t t : {64, 256, 1024}) {
      ProfilePoint pt;
      pt.micro_batch = b;
      pt.seq_len = t;
      pt.peak_bytes = 100 * MiB + 4096 * b * t + 8 * b * t * t;
      p.points.push_back(pt);
    }
  }
  return p;
}

PlanRequest token_request(int64_t target, int64_t budget_bytes, const std::string& headroom = "0") {
  PlanRequest r;
  r.target_batch = target;
  r.budget.bytes = budget_bytes;
  r.headroom = parse_headroom(headroom);
  return r;
}

}  // namespace

TEST_CASE("Token plan: the budget's worst microbatch fits, the sample split is the padded one", "[token][solver]") {
  const Profile p = token_profile();
  REQUIRE(is_token_profile(p));
  const Plan plan = make_plan(p, token_request(256, 612 * MiB));
  REQUIRE(plan.tokens.has_value());
  // (612 − 100) MiB / (4096 + 8·1024) bytes per token = 43690.
  CHECK(plan.tokens->max_seq_len == 1024);
  CHECK(plan.tokens->token_budget == 43690);
  const int64_t worst = 100 * MiB + plan.tokens->token_budget * (4096 + 8 * 1024);
  CHECK(worst <= 612 * MiB);
  CHECK(100 * MiB + (plan.tokens->token_budget + 1) * (4096 + 8 * 1024) > 612 * MiB);
  // Padded to 1024 tokens: 42 sequences per microbatch, 256 in 7 microbatches.
  CHECK(plan.max_micro_batch == 42);
  CHECK(plan.accumulation_steps == 7);
  CHECK(plan.microbatch_sizes == split_samples(256, 42, "balanced"));
  CHECK(plan.tokens->longest_sequence_alone > 1024);
  CHECK_FALSE(plan.confirmed);
  CHECK_THAT(plan.reason, Catch::Contains("token budget of 43690 padded tokens"));
  // The plan writes and reads back with its tokens and the profile's (b, T) points.
  const Plan back = plan_from_json(nlohmann::json::parse(to_json(plan).dump()));
  REQUIRE(back.tokens.has_value());
  CHECK(back.tokens->token_budget == 43690);
  CHECK(back.profile.points.front().seq_len == 64);
  CHECK(back.setup.seq_len == SeqLenRange{16, 1024});
  CHECK(make_plan(back.profile, token_request(256, 612 * MiB)).tokens->token_budget == 43690);
}

TEST_CASE("Token plan: the margin, --seq-len, the window and a failed window bound the budget", "[token][solver]") {
  const Profile p = token_profile();
  const int64_t plain = make_plan(p, token_request(256, 612 * MiB)).tokens->token_budget;
  // auto keeps 2% of the worst microbatch's activations (the fit is exact: no residual).
  const Plan margin = make_plan(p, token_request(256, 612 * MiB, "auto"));
  CHECK(margin.tokens->token_budget < plain);
  CHECK(margin.memory.margin_bytes > 0);
  CHECK(margin.memory.usable_bytes == 612 * MiB - margin.memory.margin_bytes);
  // A shorter longest sequence leaves more tokens: the T² cost is taken at T_max.
  Profile shorter = p;
  shorter.setup.seq_len->max = 256;
  CHECK(make_plan(shorter, token_request(256, 612 * MiB)).tokens->token_budget > plain);
  // The per-rank window padded to T_max bounds it.
  CHECK(make_plan(p, token_request(8, 612 * MiB)).tokens->token_budget == 8 * 1024);
  // A window at T_max that failed: the budget stays below it.
  Profile failed = p;
  Trial t;
  t.kind = "confirm";
  t.micro_batch = 30;
  t.window = {30, 30};
  t.seq_len = 1024;
  failed.trials.push_back(t);
  CHECK(make_plan(failed, token_request(256, 612 * MiB)).tokens->token_budget == 30 * 1024 - 1);
  // A window at T_max of the budget's sequences confirms it.
  Profile ran = p;
  t.fit = true;
  t.micro_batch = 42;
  t.window = {42, 42};
  t.peak_bytes = 100 * MiB + 42 * 1024 * (4096 + 8 * 1024);
  ran.trials.push_back(t);
  const Plan confirmed = make_plan(ran, token_request(256, 612 * MiB));
  CHECK(confirmed.confirmed);
  CHECK(confirmed.confirmed_peak_bytes == t.peak_bytes);
}

TEST_CASE("Token plan: what cannot be planned is refused with the fix", "[token][solver][errors]") {
  const Profile p = token_profile();
  // One 1024-token sequence needs 100 MiB + 12 MiB.
  CHECK_THROWS_AS(make_plan(p, token_request(256, 105 * MiB)), InfeasibleError);
  CHECK_THROWS_WITH(make_plan(p, token_request(256, 105 * MiB)),
                    Catch::Contains("one sequence of 1024 tokens") && Catch::Contains("the longest sequence that fits alone has") &&
                        Catch::Contains("--seq-len"));
  PlanRequest multiple = token_request(256, 612 * MiB);
  multiple.multiple_of = 8;
  CHECK_THROWS_WITH(make_plan(p, multiple), Catch::Contains("--multiple-of 8 applies to sample plans"));
  PlanRequest bounded = token_request(256, 612 * MiB);
  bounded.max_micro_batch = 4;
  CHECK_THROWS_WITH(make_plan(p, bounded), Catch::Contains("--max-micro-batch 4 applies to sample plans"));
  // More than 2^20 microbatches of the padded split is refused, not allocated.
  CHECK_THROWS_WITH(make_plan(p, token_request(int64_t{1} << 40, 120 * MiB)), Catch::Contains("microbatches per window"));
  Profile no_lengths = p;
  no_lengths.setup.seq_len.reset();
  CHECK_THROWS_WITH(make_plan(no_lengths, token_request(256, 612 * MiB)), Catch::Contains("give --seq-len"));
  CHECK_THROWS_WITH(parse_seq_len("16..x"), Catch::Contains("--seq-len '16..x'"));
}

TEST_CASE("Token plan: --target-tokens sets the window at the longest length and is kept in the plan",
          "[token][solver][target-tokens]") {
  Profile p = token_profile();
  p.gradient_exchange = true;  // windows for two ranks
  PlanRequest r = token_request(0, 612 * MiB);
  r.target_tokens = 100000;
  r.world_size = 2;
  const Plan plan = make_plan(p, r);
  REQUIRE(plan.tokens.has_value());
  REQUIRE(plan.tokens->target_tokens == 100000);
  // ceil(100000 / 1024) = 98 sequences at T_max, already a multiple of 2 ranks.
  CHECK(plan.target_batch == 98);
  CHECK(plan.per_rank_batch == 49);
  // The budget is memory's, as with --target-batch of the same window.
  CHECK(plan.tokens->token_budget == make_plan(p, [&] {
          PlanRequest s = token_request(98, 612 * MiB);
          s.world_size = 2;
          return s;
        }()).tokens->token_budget);
  CHECK_THAT(plan.reason, Catch::Contains("at least 100000 valid tokens") &&
                              Catch::Contains("the sample fields size it as 98 sequences of 1024 tokens"));
  // The summary leads with the window as it is: valid tokens, not a batch of sequences.
  const std::string summary = describe_plan(plan);
  CHECK(summary.rfind("plan: windows of at least 100000 valid tokens over 2 rank(s)", 0) == 0);
  CHECK(summary.find("target batch") == std::string::npos);
  const Plan back = plan_from_json(nlohmann::json::parse(to_json(plan).dump()));
  REQUIRE(back.tokens.has_value());
  CHECK(back.tokens->target_tokens == 100000);
  // Rounded up to a multiple of the world size: ceil(3000 / 1024) = 3 sequences, 4 on 2 ranks.
  r.target_tokens = 3000;
  CHECK(make_plan(p, r).target_batch == 4);
}

TEST_CASE("Token plan: --target-tokens is refused where it cannot apply", "[token][solver][target-tokens][errors]") {
  PlanRequest both = token_request(256, 612 * MiB);
  both.target_tokens = 1000;
  CHECK_THROWS_WITH(make_plan(token_profile(), both), Catch::Contains("not both"));
  PlanRequest zero = token_request(0, 612 * MiB);
  zero.target_tokens = 0;
  CHECK_THROWS_WITH(check_request(zero), Catch::Contains("--target-tokens must be at least 1"));
  PlanRequest huge = token_request(0, 612 * MiB);
  huge.target_tokens = kMaxTargetTokens + 1;
  CHECK_THROWS_AS(check_request(huge), InputError);
  // A profile of fixed shapes has no tokens to count.
  PlanRequest tokens = token_request(0, 612 * MiB);
  tokens.target_tokens = 1000;
  CHECK_THROWS_WITH(make_plan(test::linear_profile(40 * MiB, 10 * MiB, MiB), tokens),
                    Catch::Contains("needs variable-length data") && Catch::Contains("--target-batch"));
}

TEST_CASE("Token windows: consecutive windows close at the sequence that reaches the target", "[token][windows]") {
  using W = std::vector<std::pair<int64_t, int64_t>>;
  CHECK(token_windows({5, 5, 5, 5, 5}, 10) == W{{0, 2}, {2, 2}, {4, 1}});
  CHECK(token_windows({12, 1, 1}, 10) == W{{0, 1}, {1, 2}});
  CHECK(token_windows({0, 0, 3}, 2) == W{{0, 3}});
  CHECK(token_windows({}, 10).empty());
  CHECK(token_windows({1, 1, 1}, 1) == W{{0, 1}, {1, 1}, {2, 1}});
  // No sequence lost or repeated, whatever the counts: the windows tile 0..n-1 in order.
  const std::vector<int64_t> counts = {7, 0, 300, 2, 2, 2, 2, 999, 1, 64, 64, 3};
  int64_t next = 0;
  for (const auto& [start, count] : token_windows(counts, 64)) {
    CHECK(start == next);
    CHECK(count >= 1);
    next = start + count;
  }
  CHECK(next == static_cast<int64_t>(counts.size()));
  CHECK_THROWS_WITH(token_windows({1}, 0), Catch::Contains("--target-tokens must be at least 1"));
  CHECK_THROWS_WITH(token_windows({1, -2}, 4), Catch::Contains("sequence 1 has -2 valid tokens"));
}

TEST_CASE("Token windows: the C++ rule and the Python reader agree on the shared cases", "[token][windows][python]") {
  // tests/python/token_windows_cases.json is read by tests/python/test_packing.py as well.
  const std::string path = std::string(ACCUMPLAN_SOURCE_DIR) + "/tests/python/token_windows_cases.json";
  const nlohmann::json cases = nlohmann::json::parse(read_text_file(path, "the shared token-window cases")).at("cases");
  REQUIRE(cases.size() >= 5);
  for (const auto& c : cases) {
    std::vector<std::pair<int64_t, int64_t>> expected;
    for (const auto& w : c.at("windows")) expected.emplace_back(w.at(0).get<int64_t>(), w.at(1).get<int64_t>());
    INFO(c.dump());
    CHECK(token_windows(c.at("valid_tokens").get<std::vector<int64_t>>(), c.at("target_tokens").get<int64_t>()) == expected);
  }
}

TEST_CASE("Sequence length lists: --seq-len-file's one parser", "[token][seq-len]") {
  CHECK(parse_seq_len_list("16\n1024\n  300 # a comment\n\n5, 6\t7\r\n") == std::vector<int64_t>{16, 1024, 300, 5, 6, 7});
  CHECK_THROWS_WITH(parse_seq_len_list("16\n0\n", "--seq-len-file 'l.txt'"),
                    Catch::Contains("--seq-len-file 'l.txt' line 2") && Catch::Contains("at least 1 token"));
  CHECK_THROWS_WITH(parse_seq_len_list("16\n12.5\n"), Catch::Contains("line 2") && Catch::Contains("not a whole number"));
  CHECK_THROWS_WITH(parse_seq_len_list("# only a comment\n"), Catch::Contains("holds no sequence lengths"));
  CHECK_THROWS_WITH(parse_seq_len_list("99999999999\n"), Catch::Contains("out of range"));
}

TEST_CASE("Token plan: step times give the packing's step cost, kept in the plan; none without them",
          "[token][solver][step-cost]") {
  Profile p = token_profile();
  CHECK_FALSE(make_plan(p, token_request(256, 612 * MiB)).tokens->step_cost.has_value());
  for (auto& pt : p.points) pt.step_seconds = 0.002 + 1e-6 * static_cast<double>(pt.micro_batch * *pt.seq_len);
  const Plan plan = make_plan(p, token_request(256, 612 * MiB));
  REQUIRE(plan.tokens->step_cost.has_value());
  CHECK(plan.tokens->step_cost->per_microbatch == Approx(2000.0 * kStepCostPerToken).epsilon(1e-3));
  CHECK(plan.tokens->step_cost->per_token_squared == 0);
  CHECK(plan.tokens->step_cost->token_seconds == Approx(1e-6));
  CHECK_THAT(plan.reason, Catch::Contains("a microbatch costs as much as 2000 padded tokens"));
  const Plan back = plan_from_json(nlohmann::json::parse(to_json(plan).dump()));
  REQUIRE(back.tokens->step_cost.has_value());
  CHECK(back.tokens->step_cost->per_microbatch == plan.tokens->step_cost->per_microbatch);
  CHECK(back.tokens->step_cost->per_token == kStepCostPerToken);
  CHECK(back.tokens->step_cost->token_seconds == plan.tokens->step_cost->token_seconds);
  // Times with no per-microbatch part: the plan carries no cost (packing fills) rather than one
  // that would put every sequence in a microbatch of its own where nothing refits it.
  for (auto& pt : p.points) pt.step_seconds = 1e-6 * static_cast<double>(pt.micro_batch * *pt.seq_len);
  CHECK_FALSE(make_plan(p, token_request(256, 612 * MiB)).tokens->step_cost.has_value());
}

TEST_CASE("Token plan: steps that fit with no per-microbatch time are floored by what the windows took beyond them",
          "[token][solver][step-cost]") {
  Profile p = token_profile();
  for (auto& pt : p.points) pt.step_seconds = 1e-6 * static_cast<double>(pt.micro_batch * *pt.seq_len);
  // Windows [b, b] that took 3 ms beyond their two steps (1.5 ms per microbatch), one 9 ms beyond
  // (a slow outlier: the median keeps 1.5 ms), and one that ran out of memory (not counted).
  auto window = [&](int64_t b, int64_t t, double beyond, bool fit) {
    Trial tr{"probe", b, fit, fit ? 100 * MiB : 0, 2e-6 * static_cast<double>(b * t) + beyond, {b, b}, std::nullopt};
    tr.seq_len = t;
    p.trials.push_back(tr);
  };
  window(1, 64, 3e-3, true);
  window(2, 256, 3e-3, true);
  window(4, 1024, 9e-3, true);
  window(8, 1024, 1.0, false);
  const Plan plan = make_plan(p, token_request(256, 612 * MiB));
  REQUIRE(plan.tokens->step_cost.has_value());
  CHECK(plan.tokens->step_cost->per_microbatch == Approx(1500.0 * kStepCostPerToken).epsilon(1e-3));
  // A t0 the steps show stays when it is larger than the windows' overhead.
  for (auto& pt : p.points) pt.step_seconds = 0.004 + 1e-6 * static_cast<double>(pt.micro_batch * *pt.seq_len);
  for (auto& tr : p.trials) tr.seconds += 0.008;
  CHECK(make_plan(p, token_request(256, 612 * MiB)).tokens->step_cost->per_microbatch ==
        Approx(4000.0 * kStepCostPerToken).epsilon(1e-3));
}
