// How the planner's messages name options (accumplan/terms.h): the command line's spelling by
// default, Python's argument names once the Python core has set its front end; the same message
// from the solver and from the plan reader under each.
#include <catch2/catch.hpp>

#include <string>

#include <nlohmann/json.hpp>

#include "accumplan/schema.h"
#include "accumplan/solver.h"
#include "accumplan/terms.h"
#include "test_helpers.h"

using namespace accumplan;
using accumplan::test::MiB;
using accumplan::test::linear_profile;

namespace {

// Python's words for the test's extent; the command line's again after it, whatever it threw.
struct PythonWords {
  PythonWords() { set_front_end(FrontEnd::Python); }
  ~PythonWords() { set_front_end(FrontEnd::Cli); }
};

// The solver's refusal of a target batch of 0.
void plan_no_samples() {
  PlanRequest r;
  r.target_batch = 0;
  r.budget.bytes = 64 * MiB;
  make_plan(linear_profile(MiB, MiB, MiB), r);
}

// The reader's refusal of a plan whose weights are not its sizes over the per-rank batch.
void read_misweighted_plan() {
  PlanRequest r;
  r.target_batch = 16;
  r.budget.bytes = 64 * MiB;
  nlohmann::json doc = nlohmann::json::parse(to_json(make_plan(linear_profile(MiB, MiB, MiB), r)).dump());
  doc["weights"][0] = 0.5 * doc["weights"][0].get<double>();
  plan_from_json(doc);
}

}  // namespace

TEST_CASE("Terms: the command line is the default front end, and its options keep their spelling", "[terms]") {
  REQUIRE(front_end() == FrontEnd::Cli);
  CHECK(option_name("--target-batch") == "--target-batch");
  CHECK(option_name("--seq-len") == "--seq-len");
  CHECK(plan_command() == "`accumplan plan`");
  CHECK(plan_command({"--target-batch"}) == "`accumplan plan --target-batch`");
  CHECK_THROWS_WITH(plan_no_samples(), Catch::StartsWith("--target-batch must be at least 1, got 0"));
  CHECK_THROWS_WITH(read_misweighted_plan(), Catch::Contains("; re-plan with `accumplan plan`"));
}

TEST_CASE("Terms: under Python, options are its arguments and advice is a call of accumplan.plan", "[terms]") {
  {
    const PythonWords python;
    CHECK(option_name("--target-batch") == "target_batch");
    CHECK(option_name("--memory-budget") == "memory_budget");
    CHECK(option_name("--seq-len") == "max_seq_len");
    CHECK(option_name("--lr") == "the optimizer's lr");
    CHECK(option_name("--max-micro-batch") == "max_micro_batch");
    CHECK(option_name("--batch-file") == "--batch-file");  // Python has no argument for it
    CHECK(plan_command() == "accumplan.plan(...)");
    CHECK(plan_command({"--target-batch"}) == "accumplan.plan(..., target_batch=...)");
    CHECK_THROWS_WITH(plan_no_samples(),
                      Catch::StartsWith("target_batch must be at least 1, got 0") && !Catch::Contains("--"));
    CHECK_THROWS_WITH(read_misweighted_plan(), Catch::Contains("; re-plan with accumplan.plan(...)"));
  }
  CHECK(front_end() == FrontEnd::Cli);
}

TEST_CASE("Terms: a range check of the solver names the Python argument", "[terms]") {
  const PythonWords python;
  PlanRequest r;
  r.target_batch = int64_t{1} << 50;
  r.budget.bytes = 64 * MiB;
  CHECK_THROWS_WITH(make_plan(linear_profile(MiB, MiB, MiB), r),
                    Catch::StartsWith("target_batch: 1125899906842624 is out of range [1, 1099511627776]"));
  r.target_batch = 16;
  r.world_size = 3;
  CHECK_THROWS_WITH(make_plan(linear_profile(MiB, MiB, MiB), r),
                    Catch::StartsWith("target_batch 16 is not divisible by world_size (3)"));
}
