// Hostile documents and option texts: every number has a documented range
// (docs/plan-format.md) enforced at read, schema_version is digits.digits, a plan's weights and
// uniform split must agree with its sizes, strings in messages are cut to 80 characters, and the
// size and spec parsers bound what they return. Each refusal is an InputError (exit 2) naming the
// field or option, the value and the range.
#include <catch2/catch.hpp>

#include <cstdint>

#include <nlohmann/json.hpp>

#include "accumplan/errors.h"
#include "accumplan/exporters.h"
#include "accumplan/json_io.h"
#include "accumplan/schema.h"
#include "accumplan/tensor_spec.h"
#include "accumplan/units.h"
#include "test_helpers.h"

using namespace accumplan;
using accumplan::test::source_path;
using nlohmann::json;

namespace {

json golden_profile() { return read_json_file(source_path("tests/golden/profile.json"), "golden"); }
json golden_plan() { return read_json_file(source_path("tests/golden/plan.json"), "golden"); }

template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const InputError& e) {
    CHECK(e.exit_code() == 2);
    return e.what();
  }
  return "(accepted)";
}

std::string profile_error(const json& doc) {
  return error_of([&] { profile_from_json(doc); });
}
std::string plan_error(const json& doc) {
  return error_of([&] { plan_from_json(doc); });
}

}  // namespace

TEST_CASE("Hostile: 2^63 and other out-of-range numbers are refused by path, value and range",
          "[hostile][schema][errors]") {
  json p = golden_profile();
  p["persistent"]["weights_bytes"] = 9223372036854775808ULL;  // 2^63: was read back as negative
  std::string msg = profile_error(p);
  CHECK_THAT(msg, Catch::StartsWith("$.persistent.weights_bytes: 9223372036854775808 is out of range"));
  CHECK_THAT(msg, Catch::Contains("[0, 1125899906842624]"));

  p = golden_profile();
  p["persistent"]["gradients_bytes"] = int64_t{1} << 62;  // 2^62 each planned as "582 MiB"
  CHECK_THAT(profile_error(p), Catch::Contains("$.persistent.gradients_bytes: 4611686018427387904 is out of range"));

  p = golden_profile();
  p["points"][0]["micro_batch"] = 0;
  CHECK_THAT(profile_error(p), Catch::Contains("$.points[0].micro_batch: 0 is out of range; expected a number in [1, 1099511627776]"));
  p = golden_profile();
  p["points"][1]["peak_bytes"] = -5;
  CHECK_THAT(profile_error(p), Catch::Contains("$.points[1].peak_bytes: -5 is out of range"));
  p = golden_profile();
  p["points"][1]["step_seconds"] = 1e300;
  CHECK_THAT(profile_error(p), Catch::Contains("$.points[1].step_seconds: 1e+300 is out of range"));
  p = golden_profile();
  p["setup"]["lr"] = 1e308;
  CHECK_THAT(profile_error(p), Catch::Contains("$.setup.lr"));
  p = golden_profile();
  p["setup"]["hyperparameters"]["momentum"] = -1e9;
  CHECK_THAT(profile_error(p), Catch::Contains("$.setup.hyperparameters.momentum"));
  p = golden_profile();
  p["device"]["index"] = -1;
  CHECK_THAT(profile_error(p), Catch::Contains("$.device.index"));

  json plan = golden_plan();
  plan["world_size"] = 0;
  CHECK_THAT(plan_error(plan), Catch::Contains("$.world_size: 0 is out of range"));
  plan = golden_plan();
  plan["target_batch"] = 4611686018427387904LL;
  CHECK_THAT(plan_error(plan), Catch::Contains("$.target_batch: 4611686018427387904 is out of range"));
  plan = golden_plan();
  plan["microbatch_sizes"] = json::array({int64_t{1} << 62, int64_t{1} << 62, int64_t{1} << 62, (int64_t{1} << 62) + 256});
  CHECK_THAT(plan_error(plan), Catch::Contains("$.microbatch_sizes[0]: 4611686018427387904 is out of range"));
}

TEST_CASE("Hostile: schema_version must be digits, a dot, digits", "[hostile][schema][version]") {
  for (const char* bad : {"1.", "+1.0", "1.0.0", "-1.0", ".1", "1", "1.0 ", " 1.0", "1.x", "", "01.-1"}) {
    INFO(bad);
    json p = golden_profile();
    p["schema_version"] = bad;
    const std::string msg = profile_error(p);
    CHECK_THAT(msg, Catch::StartsWith("$.schema_version: '"));
    CHECK_THAT(msg, Catch::Contains("is not MAJOR.MINOR"));
  }
  json p = golden_profile();
  p["schema_version"] = "1.0";
  CHECK(profile_error(p) == "(accepted)");
  p["schema_version"] = "1.999";
  CHECK(profile_error(p) == "(accepted)");
  p["schema_version"] = "99999999999999999999.0";  // refused as text, never parsed into a long
  CHECK_THAT(profile_error(p), Catch::Contains("$.schema_version"));
}

TEST_CASE("Hostile: a profile without setup.lr is read (the learning rate is not a memory fact)",
          "[hostile][schema][compat]") {
  json p = golden_profile();
  p["setup"].erase("lr");
  const Profile profile = profile_from_json(p);
  CHECK(profile.setup.lr == 1e-3);  // adam's conventional default
  p["setup"]["optimizer"] = "sgd";
  CHECK(profile_from_json(p).setup.lr == 1e-2);
  p["setup"]["lr"] = nullptr;
  CHECK(profile_from_json(p).setup.lr == 1e-2);
}

TEST_CASE("Hostile: a plan whose weights or uniform split disagree with its sizes is refused",
          "[hostile][schema][errors]") {
  json plan = golden_plan();
  plan["weights"][0] = 0.5;
  CHECK_THAT(plan_error(plan), Catch::Contains("$.weights[0]: 0.5 is not microbatch_sizes[0] / per_rank_batch"));
  plan = golden_plan();
  plan["uniform"]["accumulation_steps"] = 0;  // a "1 x 0" uniform split: refused, never run
  CHECK_THAT(plan_error(plan), Catch::Contains("$.uniform.accumulation_steps: 0 is out of range"));
  plan = golden_plan();
  plan["uniform"]["accumulation_steps"] = 3;
  const std::string u = std::to_string(plan["uniform"]["micro_batch"].get<int64_t>());
  CHECK_THAT(plan_error(plan), Catch::Contains("$.uniform: 3 x " + u + " does not make per_rank_batch 256"));
}

TEST_CASE("Hostile: long strings are cut to 80 characters in messages", "[hostile][errors]") {
  const std::string huge(1 << 20, 'z');
  json p = golden_profile();
  p["schema"] = huge;
  std::string msg = profile_error(p);
  CHECK(msg.size() < 300);
  CHECK_THAT(msg, Catch::Contains("(1048576 characters)"));
  p = golden_profile();
  p["schema_version"] = huge;
  CHECK(profile_error(p).size() < 300);
  CHECK(error_of([&] { parse_size_bytes(huge, "--memory-budget"); }).size() < 400);
  CHECK(error_of([&] { parse_tensor_spec("float32[B," + huge + "]", "--input"); }).size() < 400);
  CHECK(error_of([&] { parse_tensor_spec(huge, "--input"); }).size() < 400);
}

TEST_CASE("Hostile: sizes above 1 PiB are refused, never wrapped or cast out of range", "[hostile][units][errors]") {
  CHECK(parse_size_bytes("1024TiB", "--memory-budget") == int64_t{1} << 50);
  for (const char* bad : {"8000000TB", "1025TiB", "9223372036854775808", "99999999999999999999999999999GiB",
                          "1125899906842625"}) {
    INFO(bad);
    const std::string msg = error_of([&] { parse_size_bytes(bad, "--memory-budget"); });
    CHECK_THAT(msg, Catch::Contains("--memory-budget"));
    CHECK_THAT(msg, Catch::Contains("more than 1 PiB"));
  }
  // A digit string longer than any double still parses to a refusal, not an exception of strtod.
  CHECK_THAT(error_of([&] { parse_size_bytes(std::string(400, '9'), "x"); }), Catch::Contains("more than 1 PiB"));
  CHECK(parse_budget("100%", "x").resolve_bytes(int64_t{1} << 50) == int64_t{1} << 50);
}

TEST_CASE("Hostile: tensor specs bound their dimensions, elements and integer ranges", "[hostile][spec][errors]") {
  CHECK_THAT(error_of([] { parse_tensor_spec("float32[B,99999999999]", "--input"); }),
             Catch::Contains("dimension 99999999999 is out of range [1, 2147483647]"));
  CHECK_THAT(error_of([] { parse_tensor_spec("float32[B,100000,100000,100000]", "--input"); }),
             Catch::Contains("more than 68719476736 elements"));
  CHECK(parse_tensor_spec("float32[B,00000000000000000000000000007]", "--input").dims[1] == 7);
  CHECK_THAT(error_of([] { parse_tensor_spec("float32[B,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]", "--input"); }),
             Catch::Contains("more than 16 dimensions"));
  CHECK_THAT(error_of([] { parse_tensor_spec("int8[B]:1000", "--target"); }),
             Catch::Contains("out of range for int8, which holds 128 values"));
  CHECK(*parse_tensor_spec("uint8[B]:256", "--target").high == 256);
  CHECK_THAT(error_of([] { parse_tensor_spec("int64[B]:9999999999999999999", "--target"); }),
             Catch::Contains("must be a positive count"));
  CHECK(parse_tensor_spec("float32[B,65536,32768]", "--input").elements_per_sample() == int64_t{1} << 31);
}

TEST_CASE("Hostile: export refuses a uniform split whose product overflows, and answers at once for huge targets",
          "[hostile][exporters][errors]") {
  Plan plan = plan_from_json(golden_plan());
  plan.uniform.micro_batch = int64_t{1} << 62;
  plan.uniform.accumulation_steps = 4;
  CHECK_THAT(error_of([&] { export_plan(plan, "deepspeed", nullptr); }), Catch::Contains("does not fit in a 64-bit integer"));
  // A target batch of 2^39 + 1 on one rank with microbatches of at most 1000: the nearest
  // targets that split evenly are found without a search over 2^39 candidates.
  Plan big = plan_from_json(golden_plan());
  big.target_batch = big.per_rank_batch = kMaxSamples / 2 + 1;
  big.max_micro_batch = big.micro_batch = 1000;
  const auto [below, above] = nearest_even_targets(big);
  CHECK(below >= 1);
  CHECK(below < big.target_batch);
  CHECK(above > big.target_batch);
}
