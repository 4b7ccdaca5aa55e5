// Optimizer state sharded over ranks (accumplan/sharding.h): ZeroRedundancyOptimizer's partition,
// each rank's share, the sharded plan's record and reason, shard="auto"'s gain, the 1.9 fields'
// round trip, golden file and reader refusals.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <numeric>

#include <nlohmann/json.hpp>

#include "accumplan/errors.h"
#include "accumplan/exporters.h"
#include "accumplan/json_io.h"
#include "accumplan/report.h"
#include "accumplan/schema.h"
#include "accumplan/sharding.h"
#include "accumplan/solver.h"
#include "test_helpers.h"

using namespace accumplan;
using accumplan::test::source_path;
using nlohmann::json;

namespace {

// The golden profile (resnet18, Adam: its state is 2 x the weights) measured as the rank of the
// largest share of 4: its state is that share, and every peak holds it instead of the whole.
Profile sharded_profile(int64_t world_size = 4) {
  Profile p = read_profile_file(source_path("tests/golden/profile.json"));
  const int64_t whole = p.persistent.optimizer_state_bytes;
  // Four parameters of 40%, 30%, 20% and 10% of the elements (Adam: 8 bytes per element, no fixed part).
  const int64_t elements = whole / 8;
  const std::vector<std::vector<int64_t>> groups{{elements / 10, elements * 3 / 10, elements * 4 / 10,
                                                  elements - elements / 10 - elements * 3 / 10 - elements * 4 / 10}};
  Sharding s = shard_optimizer_state(groups, world_size, StateLayout{8, 0});
  const int64_t freed = freed_state_bytes(s);
  p.persistent.optimizer_state_bytes -= freed;
  for (ProfilePoint& pt : p.points) {
    pt.peak_bytes -= freed;
    if (pt.first_microbatch_peak_bytes) *pt.first_microbatch_peak_bytes -= freed;
    if (pt.optimizer_step_peak_bytes) *pt.optimizer_step_peak_bytes -= freed;
  }
  for (Trial& t : p.trials) t.peak_bytes = t.fit ? t.peak_bytes - freed : 0;
  // Each other share's step: lower by the state it does not hold, and by a step temporary
  // (one copy of its state) smaller by as much again.
  int64_t step = 0;
  for (const ProfilePoint& pt : p.points) step = std::max(step, pt.optimizer_step_peak_bytes.value_or(0));
  const int64_t largest = s.per_rank_state_bytes[static_cast<size_t>(s.measured_rank)];
  for (const int64_t r : ranks_to_measure(s)) {
    s.other_ranks.push_back({r, step - 2 * (largest - s.per_rank_state_bytes[static_cast<size_t>(r)]), 0.5});
  }
  p.sharding = s;
  p.gradient_exchange = true;  // windows for two or more ranks make a rank's exchange
  return p;
}

Plan sharded_plan(int64_t world_size = 4) {
  PlanRequest r;
  r.target_batch = 4096;  // 1024 per rank of 4: memory bounds the microbatch
  r.world_size = world_size;
  return make_plan(sharded_profile(world_size), r);
}

}  // namespace

TEST_CASE("Sharding: where the whole state's optimizer step passes the budget, unsharded fits no sample, as planning "
          "unsharded says", "[sharding]") {
  // The step's temporaries raised above every microbatch's peak by the state the shards free, in
  // the sharded windows and in the same windows unsharded.
  Profile sharded = sharded_profile();
  Profile whole = read_profile_file(source_path("tests/golden/profile.json"));
  whole.gradient_exchange = true;
  const int64_t freed = freed_state_bytes(*sharded.sharding);
  int64_t highest = 0;
  for (const ProfilePoint& pt : whole.points) highest = std::max(highest, pt.peak_bytes);
  const int64_t step = highest + freed;  // the sharded step
  for (Profile* p : {&sharded, &whole}) {
    for (ProfilePoint& pt : p->points) pt.optimizer_step_peak_bytes = step + (p == &whole ? freed : 0);
  }
  for (RankStepPeak& r : sharded.sharding->other_ranks) r.optimizer_step_peak_bytes = step;
  PlanRequest r;
  r.target_batch = 4096;
  r.world_size = 4;
  r.budget.bytes = step + freed / 2;  // the sharded step fits; the unsharded one does not
  const Plan plan = make_plan(sharded, r);
  REQUIRE(plan.sharding);
  CHECK(plan.sharding->unsharded_micro_batch.value_or(-1) == 0);
  CHECK_THAT(plan.reason, Catch::Contains("unsharded, the same line gives a microbatch of none (the optimizer step alone"));
  // The truth it states: the same windows with the whole state resident plan nothing.
  CHECK_THROWS_AS(make_plan(whole, r), InfeasibleError);
}

TEST_CASE("Sharding: the partition is ZeroRedundancyOptimizer's, largest first to the rank with the fewest elements",
          "[sharding]") {
  // Sorted 30 (#1), 30 (#3), 20 (#2), 10 (#0): ranks 0, 1, 0, 1 in that order.
  CHECK(zero_partition({{10, 30, 20, 30}}, 2) == std::vector<int64_t>{1, 0, 0, 1});
  // The elements carry across groups: the second group's first parameter goes to the emptier rank 1.
  CHECK(zero_partition({{50}, {5, 7}}, 2) == std::vector<int64_t>{0, 1, 1});
  // More ranks than parameters: the later ranks hold nothing.
  CHECK(zero_partition({{3, 2}}, 4) == std::vector<int64_t>{0, 1});
}

TEST_CASE("Sharding: each rank's share follows the layout, and the windows hold the largest", "[sharding]") {
  const Sharding s = shard_optimizer_state({{10, 30, 20, 30}}, 2, StateLayout{8, 4});
  // Rank 0 holds 30 + 20 elements in two parameters, rank 1 30 + 10.
  CHECK(s.per_rank_state_bytes == std::vector<int64_t>{50 * 8 + 2 * 4, 40 * 8 + 2 * 4});
  CHECK(s.measured_rank == 0);
  CHECK(freed_state_bytes(s) == 40 * 8 + 8);
  // Adam's layout from one step on parameters of one and two float32 elements with a scalar step.
  const StateLayout adam = state_layout(4 + 4 + 4, 8 + 8 + 4);
  CHECK(adam.bytes_per_element == 8);
  CHECK(adam.bytes_per_parameter == 4);
  CHECK_THROWS_AS(state_layout(20, 12), InputError);
  CHECK_THROWS_WITH(shard_optimizer_state({{10}}, 1, adam), Catch::Contains("needs 2 to"));
  CHECK_THROWS_WITH(shard_optimizer_state({{}}, 2, adam), Catch::Contains("no parameters"));
  CHECK_THROWS_WITH(shard_optimizer_state({{10}}, 2, StateLayout{0, 0}), Catch::Contains("nothing to shard"));
}

TEST_CASE("Sharding: shares from each parameter's own state; one that gets no gradient holds none", "[sharding]") {
  // Elements 10, 30, 20, 30: ranks 1, 0, 0, 1 (zero_partition). The 30 on rank 0 is frozen: no state.
  const Sharding s = shard_state({{10, 30, 20, 30}}, {84, 0, 164, 244}, 2);
  CHECK(s.per_rank_state_bytes == std::vector<int64_t>{164, 84 + 244});
  CHECK(s.measured_rank == 1);  // by the layout alone rank 0 held the most
  CHECK(shard_optimizer_state({{10, 30, 20, 30}}, 2, StateLayout{8, 4}).measured_rank == 0);
  CHECK_THROWS_WITH(shard_state({{10, 30}}, {84}, 2), Catch::Contains("given for 1 parameters, but its groups hold 2"));
  CHECK_THROWS_WITH(shard_state({{10, 30}}, {0, 0}, 2), Catch::Contains("nothing to shard"));
  CHECK_THROWS_WITH(shard_state({{10, 30}}, {84, 244}, 1), Catch::Contains("needs 2 to"));
}

TEST_CASE("Sharding: a sharded plan states the shares, the unsharded microbatch its line gives, and why",
          "[sharding]") {
  const Plan plan = sharded_plan();
  REQUIRE(plan.sharding);
  const Sharding& s = *plan.sharding;
  CHECK(s.world_size == 4);
  const int64_t freed = freed_state_bytes(s);
  REQUIRE(freed > 0);
  CHECK(plan.memory.optimizer_state_bytes == s.per_rank_state_bytes[static_cast<size_t>(s.measured_rank)]);
  // With the whole state resident the line fits fewer samples, by about what the state freed.
  REQUIRE(s.unsharded_micro_batch);
  CHECK(*s.unsharded_micro_batch == line_micro_batch(plan, freed));
  CHECK(*s.unsharded_micro_batch < plan.max_micro_batch);
  const double per_sample = plan.fit.slope_bytes_per_sample;
  CHECK(std::abs(static_cast<double>(line_micro_batch(plan, 0) - *s.unsharded_micro_batch) -
                 static_cast<double>(freed) / per_sample) <= 1.0);
  CHECK_THAT(plan.reason, Catch::Contains("sharded over 4 ranks") && Catch::Contains("unsharded, the same line gives"));
  CHECK_THAT(describe_plan(plan), Catch::Contains("sharding") && Catch::Contains("ZeRO-1"));
  // A profile of 4 ranks' largest share planned for 2 ranks is refused, naming the fix.
  PlanRequest r;
  r.target_batch = 4096;
  r.world_size = 2;
  CHECK_THROWS_WITH(make_plan(sharded_profile(4), r), Catch::Contains("--world-size 4"));
}

TEST_CASE("Sharding: the profile measures the lowest rank of each other share, the largest first, at most 8",
          "[sharding]") {
  Sharding s;
  s.world_size = 6;
  s.per_rank_state_bytes = {40, 30, 40, 10, 30, 0};
  s.measured_rank = 0;
  CHECK(ranks_to_measure(s) == std::vector<int64_t>{1, 3, 5});
  s.world_size = 20;
  s.per_rank_state_bytes.clear();
  for (int64_t r = 0; r < 20; ++r) s.per_rank_state_bytes.push_back(r == 19 ? 1000 : r);
  s.measured_rank = 19;
  CHECK(ranks_to_measure(s) == std::vector<int64_t>{11, 12, 13, 14, 15, 16, 17, 18});
  s.per_rank_state_bytes.assign(20, 7);  // one share: nothing else to measure
  s.measured_rank = 0;
  CHECK(ranks_to_measure(s).empty());
}

TEST_CASE("Sharding: each rank peaks at its microbatches less the state it lacks, or at its own step", "[sharding]") {
  Sharding s;
  s.world_size = 4;
  s.per_rank_state_bytes = {100, 60, 20, 100};
  s.measured_rank = 0;
  s.other_ranks = {{1, 980, 0.1}};
  // Rank 0 and 3: the step (1050) above the microbatches (1000). Rank 1: its measured step (980)
  // above its microbatches (1000 - 40). Rank 2: no step of its own share measured, so the
  // smallest measured share above it (rank 1's) stands for it, above 1000 - 80.
  CHECK(per_rank_peaks(s, 1000, 1050) == std::vector<int64_t>{1050, 980, 980, 1050});
  // Microbatches above every step: each rank lower by what its share is smaller by.
  CHECK(per_rank_peaks(s, 2000, 1050) == std::vector<int64_t>{2000, 1960, 1920, 2000});
  s.other_ranks.clear();  // none measured: every rank's step taken as the largest's
  CHECK(per_rank_peaks(s, 1000, 1050) == std::vector<int64_t>{1050, 1050, 1050, 1050});
}

TEST_CASE("Sharding: a sharded plan predicts every rank's peak, the largest share's at the plan's", "[sharding]") {
  const Plan plan = sharded_plan();
  REQUIRE(plan.sharding);
  const Sharding& s = *plan.sharding;
  REQUIRE(s.per_rank_peak_bytes.size() == 4);
  REQUIRE(s.other_ranks.size() == 3);
  const int64_t largest = s.per_rank_state_bytes[static_cast<size_t>(s.measured_rank)];
  for (size_t r = 0; r < 4; ++r) {
    CAPTURE(r);
    CHECK(s.per_rank_peak_bytes[r] <= plan.memory.predicted_peak_bytes);
    if (s.per_rank_state_bytes[r] == largest) CHECK(s.per_rank_peak_bytes[r] == plan.memory.predicted_peak_bytes);
    CHECK(predicted_peak_of_rank(plan, static_cast<int64_t>(r)) == s.per_rank_peak_bytes[r]);
  }
  // This plan's microbatches peak above every step: each rank lower by exactly what it lacks.
  CHECK(plan.memory.predicted_peak_bytes - s.per_rank_peak_bytes[3] == largest - s.per_rank_state_bytes[3]);
  CHECK_THAT(plan.reason, Catch::Contains("The ranks' peaks are predicted from") &&
                              Catch::Contains("3 other share(s)' optimizer step measured"));
  // An unsharded plan predicts the same peak for every rank.
  PlanRequest r;
  r.target_batch = 256;
  const Plan whole = make_plan(read_profile_file(source_path("tests/golden/profile.json")), r);
  CHECK(predicted_peak_of_rank(whole, 3) == whole.memory.predicted_peak_bytes);
}

TEST_CASE("Sharding: shard auto gains only when the freed state fits at least one more sample", "[sharding]") {
  PlanRequest r;
  r.target_batch = 1024;  // not reached in one microbatch: memory bounds it
  const Plan unsharded = make_plan(read_profile_file(source_path("tests/golden/profile.json")), r);
  const auto per_sample = static_cast<int64_t>(unsharded.fit.slope_bytes_per_sample);
  REQUIRE(unsharded.micro_batch < unsharded.per_rank_batch);
  CHECK_FALSE(sharding_gain(unsharded, 0));
  const auto gain = sharding_gain(unsharded, 8 * per_sample);
  REQUIRE(gain);
  CHECK(*gain >= unsharded.max_micro_batch + 7);
  CHECK(*gain <= line_micro_batch(unsharded, 0) + 8);
  Plan noted = unsharded;
  noted.reason += auto_sharding_note(noted, 4, 1000, false);
  CHECK_THAT(noted.reason, Catch::Contains("did not shard") && Catch::Contains("no larger microbatch"));
  // Sharded where not one sample fits unsharded: it says so, not "smaller (0)".
  Plan sharded = sharded_plan();
  sharded.sharding->unsharded_micro_batch = 0;
  CHECK_THAT(auto_sharding_note(sharded, 4, 0, true), Catch::EndsWith("sharded it: unsharded, not one sample fits."));
  sharded.sharding->unsharded_micro_batch = 3;
  CHECK_THAT(auto_sharding_note(sharded, 4, 0, true), Catch::EndsWith("the largest microbatch that fits is smaller (3)."));
}

TEST_CASE("Sharding: the 1.9 fields round-trip and match their golden file", "[sharding][schema][golden]") {
  const Plan plan = sharded_plan();
  const json once = to_json(plan);
  CHECK(once["schema_version"] == schema_version_string());
  CHECK(once["sharding"]["per_rank_state_bytes"].size() == 4);
  CHECK(once["profile"]["sharding"].contains("unsharded_micro_batch") == false);
  const json twice = to_json(plan_from_json(json::parse(once.dump())));
  CHECK(once == twice);
  const std::string path = source_path("tests/golden/plan-sharded.json");
  if (std::getenv("ACCUMPLAN_UPDATE_GOLDEN")) write_text_atomic(path, once.dump(2) + "\n");
  CHECK(read_text_file(path, "golden") == once.dump(2) + "\n");
  // An unsharded plan writes none.
  PlanRequest r;
  r.target_batch = 256;
  CHECK_FALSE(to_json(make_plan(read_profile_file(source_path("tests/golden/profile.json")), r)).contains("sharding"));
}

TEST_CASE("Sharding: the reader refuses shares that do not describe the plan's ranks", "[sharding][schema]") {
  const json good = to_json(sharded_plan());
  json doc = good;
  doc["sharding"]["world_size"] = 2;
  doc["sharding"]["per_rank_state_bytes"] = {10, 20};
  doc["sharding"]["measured_rank"] = 1;
  doc["sharding"].erase("other_ranks");
  CHECK_THAT(accumplan::test::plan_schema_error(doc), Catch::Contains("$.sharding.per_rank_peak_bytes: 4 peaks for world_size 2 (one per rank)"));
  doc["sharding"].erase("per_rank_peak_bytes");
  CHECK_THAT(accumplan::test::plan_schema_error(doc), Catch::Contains("$.sharding.world_size: 2 but the plan's world_size is 4"));
  doc = good;  // other_ranks: ranks of the plan, ascending, not the measured one
  doc["sharding"]["other_ranks"][0]["rank"] = 0;
  CHECK_THAT(accumplan::test::plan_schema_error(doc), Catch::Contains("$.sharding.other_ranks[0].rank: 0 is not a rank in [0, 4)"));
  doc = good;
  doc["sharding"]["other_ranks"][1]["rank"] = 1;
  CHECK_THAT(accumplan::test::plan_schema_error(doc), Catch::Contains("$.sharding.other_ranks[1].rank: 1 is not a rank"));
  doc = good;  // a 1.10 plan has no per-rank peaks: every rank reads the plan's
  doc["sharding"].erase("per_rank_peak_bytes");
  doc["sharding"].erase("other_ranks");
  doc["profile"]["sharding"].erase("other_ranks");
  CHECK(accumplan::test::plan_schema_error(doc).empty());
  CHECK(predicted_peak_of_rank(plan_from_json(doc), 2) == good["memory"]["predicted_peak_bytes"].get<int64_t>());
  doc = good;
  doc["sharding"]["per_rank_state_bytes"].erase(0);
  CHECK_THAT(accumplan::test::plan_schema_error(doc), Catch::Contains("$.sharding.per_rank_state_bytes: 3 shares for world_size 4"));
  doc = good;
  doc["sharding"]["measured_rank"] = (good["sharding"]["measured_rank"].get<int>() + 1) % 4;
  CHECK_THAT(accumplan::test::plan_schema_error(doc), Catch::Contains("the lowest rank of the largest share"));
  doc = good;  // equal shares: the windows held rank 0's, the lowest
  doc["sharding"]["per_rank_state_bytes"] = {5, 5, 5, 5};
  doc["sharding"]["measured_rank"] = 1;
  CHECK_THAT(accumplan::test::plan_schema_error(doc), Catch::Contains("$.sharding.measured_rank: 1 is not rank 0"));
  doc = good;  // a plan that shards over windows that held no share
  doc["profile"].erase("sharding");
  CHECK_THAT(accumplan::test::plan_schema_error(doc), Catch::Contains("$.sharding: the plan shards the optimizer state, but $.profile.sharding is absent"));
  doc = good;
  doc["profile"]["sharding"]["per_rank_state_bytes"][0] = doc["profile"]["sharding"]["per_rank_state_bytes"][0].get<int64_t>() + 1;
  CHECK_THAT(accumplan::test::plan_schema_error(doc), Catch::Contains("$.profile.sharding holds other shares"));
  doc = good;  // shares in range whose sum is not: the message names where
  doc["sharding"]["per_rank_state_bytes"] = {int64_t{1} << 50, int64_t{1} << 50, int64_t{1} << 50, int64_t{1} << 50};
  doc["profile"]["sharding"]["per_rank_state_bytes"] = doc["sharding"]["per_rank_state_bytes"];
  doc["profile"]["sharding"]["measured_rank"] = doc["sharding"]["measured_rank"] = 0;
  CHECK(accumplan::test::plan_schema_error(doc).empty());
  doc["sharding"]["world_size"] = doc["world_size"] = 1 << 14;
  doc["sharding"]["per_rank_state_bytes"] = json::array();
  for (int r = 0; r < (1 << 14); ++r) doc["sharding"]["per_rank_state_bytes"].push_back(int64_t{1} << 50);
  CHECK_THAT(accumplan::test::plan_schema_error(doc), Catch::Contains("$.sharding.per_rank_state_bytes: the whole state, the shares' sum"));
  doc = good;
  doc["sharding"]["optimizer"] = false;
  CHECK_THAT(accumplan::test::plan_schema_error(doc), Catch::Contains("$.sharding.optimizer: false"));
  doc = good;
  doc["sharding"]["per_rank_state_bytes"][0] = -1;
  CHECK_THAT(accumplan::test::plan_schema_error(doc), Catch::Contains("$.sharding.per_rank_state_bytes[0]"));
  doc = good;
  doc["sharding"]["unsharded_micro_batch"] = nullptr;  // not one sample fits unsharded
  CHECK(accumplan::test::plan_schema_error(doc).empty());
}

TEST_CASE("Sharding: every export carries ZeRO stage 1 in its trainer's terms",
          "[sharding][export]") {
  const Plan plan = sharded_plan();
  std::string note;
  const ExportOptions options{"p.json", "accumplan", true};
  CHECK(json::parse(export_plan(plan, "deepspeed", &note, options))["zero_optimization"]["stage"] == 1);
  CHECK(json::parse(export_plan(plan, "hf", &note, options))["TrainingArguments"]["deepspeed"]["zero_optimization"]["stage"] == 1);
  CHECK(json::parse(export_plan(plan, "accelerate", &note, options))["DeepSpeedPlugin"]["zero_stage"] == 1);
  const std::string config = export_plan(plan, "accelerate-config", &note, options);
  CHECK_THAT(config, Catch::Contains("distributed_type: DEEPSPEED") && Catch::Contains("  zero_stage: 1"));
  CHECK_THAT(export_plan(plan, "lightning", &note, options), Catch::Contains("strategy: deepspeed_stage_1"));
  CHECK_THAT(export_plan(plan, "torchrun", &note, options), Catch::Contains("sharded over the 4 ranks (ZeRO-1)"));
  // Unsharded, none of them says so.
  PlanRequest r;
  r.target_batch = 256;
  const Plan whole = make_plan(read_profile_file(source_path("tests/golden/profile.json")), r);
  CHECK_FALSE(json::parse(export_plan(whole, "deepspeed", &note, options)).contains("zero_optimization"));
  CHECK_THAT(export_plan(whole, "lightning", &note, options), !Catch::Contains("deepspeed"));
}

TEST_CASE("Sharding: the report shows every rank's share and the one the windows held", "[sharding][report]") {
  const Plan plan = sharded_plan();
  const std::string html = render_report(report_input_from_plan(plan), "html");
  CHECK_THAT(html, Catch::Contains("Optimizer state sharded over 4 ranks (ZeRO-1)"));
  CHECK_THAT(html, Catch::Contains(format_bytes(plan.sharding->per_rank_state_bytes[3])));
  PlanRequest r;
  r.target_batch = 256;
  const Plan whole = make_plan(read_profile_file(source_path("tests/golden/profile.json")), r);
  CHECK_THAT(render_report(report_input_from_plan(whole), "html"), !Catch::Contains("sharded over"));
}
