// Rules the Python package asks the core for (python/core/plan_rules.cpp): the one check of a
// step cost's ranges, which the run statistics reader uses too; the largest microbatch a plan's
// fitted line admits, which is the fitted model's; the persistent step's protocol, the profiler's.
#include <catch2/catch.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "accumplan/errors.h"
#include "accumplan/json_io.h"
#include "accumplan/memory_model.h"
#include "accumplan/persistent_step.h"
#include "accumplan/schema.h"
#include "accumplan/search.h"
#include "test_helpers.h"

using namespace accumplan;
using accumplan::test::linear_profile;
using accumplan::test::source_path;
using nlohmann::json;

namespace {

TokenStepCost with_term(const std::string& name, int64_t value) {
  TokenStepCost c{1, 1, 0, 0};
  if (name == "per_microbatch") c.per_microbatch = value;
  if (name == "per_token") c.per_token = value;
  if (name == "per_token_squared") c.per_token_squared = value;
  return c;
}

std::string refusal(const std::string& path, int64_t value, const StepCostTermRange& r) {
  return path + ": " + std::to_string(value) + " is out of range; expected an integer in [" + std::to_string(r.lo) +
         ", " + std::to_string(r.hi) + "]";
}

}  // namespace

TEST_CASE("Step cost: each term is read at the ends of its range and refused just outside, named as asked",
          "[schema][tokens][errors]") {
  for (const StepCostTermRange& r : kStepCostTermRanges) {
    for (int64_t v : {r.lo, r.hi}) CHECK_NOTHROW(check_step_cost(with_term(r.name, v), "$.x."));
    for (int64_t v : {r.lo - 1, r.hi + 1}) {
      CHECK_THROWS_AS(check_step_cost(with_term(r.name, v), "$.x."), SchemaError);
      CHECK_THROWS_WITH(check_step_cost(with_term(r.name, v), "step_cost['", "']"),
                        refusal(std::string("step_cost['") + r.name + "']", v, r));
    }
  }
}

TEST_CASE("Step cost: the run statistics reader refuses a final cost term with check_step_cost's message",
          "[schema][run-stats][errors]") {
  const json golden = read_json_file(source_path("tests/golden/run_stats.json"), "run stats");
  REQUIRE(golden.contains("time_model"));
  for (const StepCostTermRange& r : kStepCostTermRanges) {
    json doc = golden;
    doc["time_model"]["final_cost"][r.name] = r.hi + 1;
    CHECK_THROWS_WITH(run_record_from_json(doc),
                      Catch::Contains(refusal(std::string("$.time_model.final_cost.") + r.name, r.hi + 1, r)));
    doc["time_model"]["final_cost"][r.name] = r.hi;
    CHECK_NOTHROW(run_record_from_json(doc));
  }
}

TEST_CASE("Memory model: a plan's line alone fits what the fitted model fits", "[model]") {
  const MemoryModel m = MemoryModel::fit(linear_profile(1000, 500, 100));
  for (int64_t budget : {2599, 2600, 3500, 3599, 123456789}) {
    CHECK(MemoryModel::line_largest_fitting(m.summary(), budget) == m.largest_fitting(budget));
  }
}

TEST_CASE("Persistent step: an attempt under the budget, one without it after an OOM, then infeasible",
          "[search][persistent]") {
  PersistentStep step(int64_t{1000});
  CHECK(step.attempt_budget_bytes() == int64_t{1000});
  CHECK(step.measured(1000, 0.5).fit);
  CHECK_FALSE(step.measured(1001, 0.5).fit);
  const Trial failed = step.out_of_memory(0.5, "test device");
  CHECK_FALSE(failed.fit);
  CHECK(failed.window == std::vector<int64_t>{kPersistentWindowSamples});
  CHECK(step.over_budget());
  CHECK_FALSE(step.attempt_budget_bytes().has_value());
  CHECK_FALSE(step.measured(1001, 0.5).fit);  // still judged against the budget it did not fit
  CHECK_THROWS_AS(step.out_of_memory(0.5, "test device"), InfeasibleError);
  PersistentStep unbounded(std::nullopt);
  CHECK(unbounded.measured(int64_t{1} << 40, 0.5).fit);
  CHECK_THROWS_WITH(unbounded.out_of_memory(0.5, "test device"), Catch::Contains("test device even without a budget"));
  CHECK_FALSE(unbounded.over_budget());
}

TEST_CASE("Persistent step: on a simulated device the attempt without the budget is held to the host cap",
          "[search][persistent]") {
  PersistentStep step(int64_t{1000}, int64_t{1} << 30);
  CHECK(step.attempt_budget_bytes() == int64_t{1000});
  step.out_of_memory(0.5, "cpu");
  CHECK(step.attempt_budget_bytes() == (int64_t{1} << 30));  // the fallback is bounded, not unlimited
  CHECK_FALSE(step.measured(2000, 0.5).fit);                 // and still judged against the budget
  CHECK_THROWS_WITH(step.out_of_memory(0.5, "cpu"),
                    "the model's weights, gradients and optimizer state do not fit on cpu even without the budget, "
                    "within the host-data limit of 1.0 GiB (ACCUMPLAN_MAX_HOST_DATA raises it); use a smaller "
                    "model, an optimizer with less state (sgd keeps none), or a larger device");
}
