// Token plans (accumplan/solver.h make_token_plan): a profile of (b, T) points planned to a token
// budget whose worst microbatch fits the budget less the margin, with the padded sample split
// beside it; bounds, failures, confirmation and refusals. The profiles are exact (b, T) models, so
// the expected budget follows by hand from c0 + B·(a1 + a2·T_max).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "accumplan/errors.h"
#include "accumplan/schema.h"
#include "accumplan/solver.h"
#include "accumplan/tensor_spec.h"
#include "accumplan/token_model.h"
#include "test_helpers.h"

using namespace accumplan;

namespace {

constexpr int64_t MiB = int64_t{1} << 20;

// peak(b, T) = 100 MiB + 4 KiB·b·T + 8 B·b·T², probed on b in {1, 2, 4} x T in {64, 256, 1024}.
Profile token_profile(const std::string& seq_len = "16..1024") {
  Profile p = test::linear_profile(40 * MiB, 0, 0);
  p.points.clear();
  p.persistent = {40 * MiB, 40 * MiB, 0};
  p.setup.inputs = {"int64[B,T]:50257"};
  p.setup.target = "int64[B,T]:50257";
  p.setup.seq_len = seq_len;
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
  CHECK(back.setup.seq_len == "16..1024");
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
  PlanRequest shorter = token_request(256, 612 * MiB);
  shorter.max_seq_len = 256;
  CHECK(make_plan(p, shorter).tokens->token_budget > plain);
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
  no_lengths.setup.seq_len.clear();
  CHECK_THROWS_WITH(make_plan(no_lengths, token_request(256, 612 * MiB)), Catch::Contains("give --seq-len"));
  CHECK_THROWS_WITH(parse_seq_len("16..x"), Catch::Contains("--seq-len '16..x'"));
}
