// test_verify.cpp — the verification library behind `accumplan verify`: every scenario runs and
// passes on a deterministic model without batch-dependent layers (including token masks with a
// different number of valid tokens per microbatch), and a BatchNorm model fails with a warning
// that says why.
// What it is not: the CLI's formatting and exit codes (test_cli_executor.cpp).
#include <torch/torch.h>

#include "executor/verify.h"
#include "executor_fixtures.h"

// Last: torch/torch.h brings glog's CHECK macro, which would shadow Catch's.
#include "catch_after_torch.h"

using namespace accumplan;
using namespace accumplan::test;

TEST_CASE("verify runs equal, unequal, partial and token-mask scenarios and they pass", "[verify]") {
  const auto model = make_tiny_lm();
  const Plan plan = make_plan_with({3, 3, 2});
  const Batch window = token_batch(8, 8);
  VerifyOptions vo;
  vo.loss.normalization = Normalization::Tokens;
  const VerifyReport rep = verify_accumulation(model, window, plan, vo);
  REQUIRE(rep.scenarios.size() == 4);
  for (const auto& s : rep.scenarios) {
    INFO(s.name << ": " << s.not_run_reason);
    CHECK(s.ran);
    CHECK(s.pass);
    CHECK(s.gradients.max_rel <= 1e-5);
    CHECK(s.updates.max_rel <= 1e-5);
    CHECK(s.accumulated_optimizer_steps == 1);
    report("verify tinylm " + s.name + ": grad max rel diff", s.gradients.max_rel);
  }
  CHECK(rep.pass);
  CHECK(rep.warnings.empty());
  CHECK(rep.scenarios[0].sizes == std::vector<int64_t>{2, 2, 2, 2});  // equal
  CHECK(rep.scenarios[1].sizes == std::vector<int64_t>{3, 3, 2});     // the plan's unequal sizes
  CHECK(rep.scenarios[2].samples == 6);                               // partial: 8 - 8/4
  const auto& masks = rep.scenarios[3];
  REQUIRE(masks.name == "token-masks");
  REQUIRE(masks.units_per_microbatch.size() == 3);
  CHECK(masks.units_per_microbatch[0] != masks.units_per_microbatch[1]);
  CHECK(masks.units_per_microbatch[1] != masks.units_per_microbatch[2]);
  CHECK(masks.naive_max_rel > 1e-3);  // the "loss / k" recipe would be caught on this split
  // The module handed in is untouched (every run works on a clone).
  for (const auto& p : model.parameters()) CHECK_FALSE(p.grad().defined());
}

TEST_CASE("verify fails on BatchNorm and explains why", "[verify]") {
  const auto model = make_batchnorm_model();
  const Plan plan = make_plan_with({4, 4});
  torch::manual_seed(9);
  Batch window;
  window.inputs = {torch::randn({8, 4}) * 3 + 1};
  window.target = torch::randint(0, 3, {8}, torch::kLong);
  VerifyOptions vo;
  vo.batch_dependent_layers = {"bn (BatchNorm1d)"};
  const VerifyReport rep = verify_accumulation(model, window, plan, vo);
  CHECK_FALSE(rep.pass);
  REQUIRE_FALSE(rep.warnings.empty());
  CHECK(rep.warnings[0].find("bn (BatchNorm1d)") != std::string::npos);
  CHECK(rep.warnings[0].find("each physical microbatch's own statistics") != std::string::npos);
  report("verify batchnorm equal split: grad max rel diff", rep.scenarios[0].gradients.max_rel);
  CHECK(rep.scenarios[0].gradients.max_rel > 1e-3);
  const std::string table = format_table(rep);
  CHECK(table.find("DIFFERS") != std::string::npos);
  const auto j = to_json(rep);
  CHECK(j["pass"] == false);
  // This model's batch norm is a functional call in forward, not a module: freezing cannot reach
  // it, and the report says so rather than claiming a check of the weighting alone (the CLI test
  // freezes builtin:convnet's BatchNorm2d and passes).
  vo.freeze_batch_dependent = true;
  const VerifyReport frozen = verify_accumulation(model, window, plan, vo);
  CHECK_FALSE(frozen.pass);
  REQUIRE_FALSE(frozen.warnings.empty());
  CHECK(frozen.warnings[0].find("froze nothing") != std::string::npos);
}
