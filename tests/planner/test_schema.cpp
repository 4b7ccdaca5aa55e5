// profile.json and plan.json: round trips, golden files, versioning, and errors that name the
// JSON path. Golden files live in tests/golden/; regenerate them deliberately with
// ACCUMPLAN_UPDATE_GOLDEN=1 and review the diff.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <set>

#include <nlohmann/json.hpp>

#include "accumplan/errors.h"
#include "accumplan/json_io.h"
#include "accumplan/schema.h"
#include "accumplan/setup_rules.h"
#include "accumplan/solver.h"
#include "test_helpers.h"

using namespace accumplan;
using accumplan::test::source_path;
using nlohmann::json;

namespace {

constexpr int64_t kGoldenMiB = int64_t{1} << 20;

Plan golden_plan() {
  const Profile profile = read_profile_file(source_path("tests/golden/profile.json"));
  PlanRequest r;
  r.target_batch = 256;  // budget: the profiled device's 1 GiB, default margin (auto)
  Plan plan = make_plan(profile, r);
  // 1.7: the eval batch, as Search::plan_eval states it (two eval windows: m and 2m, then the
  // largest size the line fits).
  EvalPlan e;
  e.micro_batch = 160;
  e.predicted_peak_bytes = 700 * kGoldenMiB;
  e.intercept_bytes = 60.0 * kGoldenMiB;
  e.slope_bytes_per_sample = 4.0 * kGoldenMiB;
  e.weights_bytes = plan.profile.persistent.weights_bytes;
  e.optimizer_state_bytes = plan.profile.persistent.optimizer_state_bytes;
  e.confirmed = true;
  e.trials = {Trial{"eval", 64, true, 316 * kGoldenMiB, 0.25, {32, 64}, std::nullopt},
              Trial{"eval", 160, true, 700 * kGoldenMiB, 0.5, {160}, std::nullopt}};
  plan.eval = e;
  // 1.7: checkpointing every 2nd of four measured blocks.
  PlanCheckpoint c;
  c.modules = {"blocks.1", "blocks.3"};
  c.rule = "every 2nd block";
  for (int i = 0; i < 4; ++i) c.candidates.push_back({"blocks." + std::to_string(i), 2.0 * kGoldenMiB, 0.0015});
  c.saved_bytes_per_sample = 2.0 * kGoldenMiB;
  c.recompute_seconds = 0.768;
  c.predicted_seconds_per_window = 6.5;
  c.without = CheckpointAlternative{96, 3, 1000 * kGoldenMiB, 6.25};
  c.trials = {Trial{"costs", 64, true, 900 * kGoldenMiB, 0.4, {64}, std::nullopt},
              Trial{"confirm", 64, true, 1100 * kGoldenMiB, 1.5, {64, 64}, std::nullopt}};
  plan.checkpoint = c;
  // 1.8: what "auto" weighed: none, every 2nd, all; every 2nd chosen.
  CheckpointChoiceRecord choice;
  choice.options = {CheckpointOption{"none", {}, 96, 3, 1000 * kGoldenMiB, 6.25},
                    CheckpointOption{"every 2nd block", {"blocks.1", "blocks.3"}, 128, 2, 1010 * kGoldenMiB, 6.5},
                    CheckpointOption{"all", {"blocks.0", "blocks.1", "blocks.2", "blocks.3"}, 256, 1, 990 * kGoldenMiB, 7.0}};
  choice.chosen = "every 2nd block";
  choice.decided_by = "the least predicted seconds per window when at least 10% under the fitting set with the fewest "
                      "checkpointed blocks; else that set";
  plan.checkpoint_choice = choice;
  return plan;
}

// The golden plan measured with a two-group optimizer (1.6): momentum SGD with nesterov, lr 0.01
// for the first group's 100 elements and 0.1 for the second's 10.
Plan grouped_plan() {
  Plan plan = golden_plan();
  Setup& s = plan.setup;
  s.optimizer = "momentum";
  s.lr = 0.01;
  s.hyperparameters = {{"momentum", 0.9}, {"dampening", 0.0}, {"weight_decay", 0.0}};
  s.flags = {{"nesterov", true}};
  s.param_groups = {OptimizerGroup{0.01, s.hyperparameters, s.flags, 100},
                    OptimizerGroup{0.1, s.hyperparameters, s.flags, 10}};
  plan.profile.setup = s;
  return plan;
}

void check_golden(const std::string& rel, const std::string& actual) {
  const std::string path = source_path(rel);
  if (std::getenv("ACCUMPLAN_UPDATE_GOLDEN")) write_text_atomic(path, actual);
  CHECK(read_text_file(path, "golden") == actual);
}

// A run of the golden plan as `accumplan run --stats` records it: two windows, the second after
// an OOM recovery re-planned the window; a CUDA-style reserved peak so every optional key is set.
RunRecord golden_run() {
  RunRecord r;
  r.windows = 2;
  r.optimizer_steps = 2;
  r.samples_seen = 512;
  r.oom_recoveries = 1;
  r.microbatch_sizes = {43, 43, 43, 43, 42, 42};
  r.micro_batch = 43;
  r.accumulation_steps = 6;
  r.per_rank_batch = 256;
  r.normalization = "samples";
  r.amp = "none";
  r.measured_peak_bytes = 900000000;
  r.measured_reserved_peak_bytes = 943718400;
  r.predicted_peak_bytes = 950000000;
  r.final_predicted_peak_bytes = 880000000;
  r.budget_bytes = 1073741824;
  r.probe = "cuda-caching-allocator";
  r.mean_window_seconds = 0.5;
  r.final_loss = 1.25;
  r.model_sha256 = std::string(64, 'a');
  RunWindowRecord w0;
  w0.window = 0;
  w0.samples = 256;
  w0.loss = 1.5;
  w0.peak_bytes = 900000000;
  w0.reserved_peak_bytes = 943718400;
  w0.oom_recoveries = 1;
  w0.replans = 1;
  w0.microbatch_sizes = r.microbatch_sizes;
  w0.seconds = 0.75;
  // The 1.5 keys of packed runs, set here too so the golden file holds every key.
  w0.microbatch_seconds = 0.625;
  w0.predicted_seconds = 0.5;
  w0.predicted_peak_bytes = 890000000;
  r.packed_predicted_peak_bytes = 890000000;
  r.time_model = RunTimeModel{"time", 12, 0.0625, 0.25, 1, TokenStepCost{131072, 65536, 64, 2.5e-6}};
  RunWindowRecord w1 = w0;
  w1.window = 1;
  w1.loss.reset();  // not finite: written as null
  w1.oom_recoveries = 0;
  w1.replans = 0;
  w1.seconds = 0.25;
  w1.predicted_seconds.reset();  // no model with seconds yet: written as null
  r.window_series = {w0, w1};
  // 1.7: an evaluation after the last window, re-split once after an out-of-memory.
  r.evaluations = {RunEvalRecord{1, 1000, 1000, 2.25, {160, 80, 80, 80, 80, 80, 80, 80, 80, 80, 80, 40}, 1, 700000000,
                                 1.5}};
  return r;
}

std::string error_of(const json& doc, bool plan) {
  try {
    if (plan) {
      plan_from_json(doc);
    } else {
      profile_from_json(doc);
    }
  } catch (const SchemaError& e) {
    return e.what();
  }
  FAIL("accepted");
  return "";
}

}  // namespace

TEST_CASE("Schema: profile round-trips through JSON unchanged", "[schema]") {
  const Profile p = read_profile_file(source_path("tests/golden/profile.json"));
  CHECK(p.points.size() == 4);
  CHECK(p.points[0].step_seconds);
  const auto once = to_json(p);
  const auto twice = to_json(profile_from_json(json::parse(once.dump())));
  CHECK(once == twice);
  check_golden("tests/golden/profile.json", once.dump(2) + "\n");
}

TEST_CASE("Schema: plan round-trips and matches its golden file", "[schema][golden]") {
  const Plan plan = golden_plan();
  const auto once = to_json(plan);
  CHECK(once["schema"] == "accumplan.plan");
  CHECK(once["schema_version"] == schema_version_string());
  const auto twice = to_json(plan_from_json(json::parse(once.dump())));
  CHECK(once == twice);
  check_golden("tests/golden/plan.json", once.dump(2) + "\n");
}

TEST_CASE("Schema: the eval batch round-trips; a plan without one reads and writes none (1.7)", "[schema][eval]") {
  const Plan plan = golden_plan();
  const Plan back = plan_from_json(json::parse(to_json(plan).dump()));
  REQUIRE(back.eval);
  CHECK(back.eval->micro_batch == 160);
  CHECK(back.eval->trials.size() == 2);
  CHECK(back.eval->trials[0].kind == "eval");
  CHECK(back.eval->trials[0].window == std::vector<int64_t>{32, 64});
  CHECK(back.eval->weights_bytes == plan.profile.persistent.weights_bytes);
  Plan none = plan;
  none.eval.reset();
  const json written = json::parse(to_json(none).dump());
  CHECK_FALSE(written.contains("eval"));
  CHECK_FALSE(plan_from_json(written).eval.has_value());
  // Not even the training microbatch fits: micro_batch null, never 0 (a count of samples).
  Plan unfit = plan;
  unfit.eval->micro_batch = 0;
  unfit.eval->confirmed = false;
  const json j = json::parse(to_json(unfit).dump());
  CHECK(j["eval"]["micro_batch"].is_null());
  CHECK(plan_from_json(j).eval->micro_batch == 0);
  json lying = j;
  lying["eval"]["confirmed"] = true;
  CHECK_THROWS_WITH(plan_from_json(lying), Catch::Contains("$.eval: confirmed is true"));
}

TEST_CASE("Schema: a checkpoint round-trips and names only its measured candidates, once (1.7)", "[schema][checkpoint]") {
  const Plan plan = golden_plan();
  const Plan back = plan_from_json(json::parse(to_json(plan).dump()));
  REQUIRE(back.checkpoint);
  CHECK(back.checkpoint->modules == std::vector<std::string>{"blocks.1", "blocks.3"});
  CHECK(back.checkpoint->candidates.size() == 4);
  CHECK(back.checkpoint->without.micro_batch == 96);
  json doc = json::parse(to_json(plan).dump());
  doc["checkpoint"]["without"]["micro_batch"] = nullptr;  // not one sample fits without it
  CHECK(plan_from_json(doc).checkpoint->without.micro_batch == 0);
  json stranger = doc;
  stranger["checkpoint"]["modules"].push_back("head");
  CHECK_THROWS_WITH(plan_from_json(stranger), Catch::Contains("'head' is not one of the candidates"));
  json twice = doc;
  twice["checkpoint"]["modules"].push_back("blocks.1");
  CHECK_THROWS_WITH(plan_from_json(twice), Catch::Contains("'blocks.1' is named twice"));
  json negative = doc;
  negative["checkpoint"]["candidates"][0]["saved_bytes_per_sample"] = -1;
  CHECK_THROWS(plan_from_json(negative));
  // Its own windows: the costs window and the confirmation, each of those kinds only.
  REQUIRE(back.checkpoint->trials.size() == 2);
  CHECK(back.checkpoint->trials[1].kind == "confirm");
  CHECK(back.checkpoint->trials[1].window == std::vector<int64_t>{64, 64});
  json probe = doc;
  probe["checkpoint"]["trials"][0]["kind"] = "probe";
  CHECK_THROWS_WITH(plan_from_json(probe), Catch::Contains("checkpoint.trials[0].kind"));
  json head = doc;
  head["checkpoint"]["head_bytes_per_sample"] = -1;
  CHECK_THROWS_WITH(plan_from_json(head), Catch::Contains("$.checkpoint.head_bytes_per_sample: -1 is out of range"));
  json duplicate = doc;
  duplicate["checkpoint"]["candidates"].push_back(duplicate["checkpoint"]["candidates"][0]);
  CHECK_THROWS_WITH(plan_from_json(duplicate), Catch::Contains("$.checkpoint.candidates: 'blocks.0' is named twice"));
  // The eval section: its line's slope is 0 or more, and its windows are eval windows.
  REQUIRE(doc.contains("eval"));
  json slope = doc;
  slope["eval"]["slope_bytes_per_sample"] = -5.5;
  CHECK_THROWS_WITH(plan_from_json(slope), Catch::Contains("$.eval.slope_bytes_per_sample: -5.5 is out of range"));
  slope["schema_version"] = "1.7";  // an older planner could write a falling eval line: still read
  CHECK(plan_from_json(slope).eval->slope_bytes_per_sample == -5.5);
  for (const char* where : {"eval", "profile"}) {
    json kind = doc;
    json& trials = std::string(where) == "eval" ? kind["eval"]["trials"] : kind["profile"]["eval"]["trials"];
    REQUIRE(!trials.empty());
    trials[0]["kind"] = "probe";
    CHECK_THROWS_WITH(plan_from_json(kind), Catch::Contains("trials[0].kind: 'probe' is not an eval window (eval)"));
  }
  json searched_with_it = doc;
  searched_with_it["checkpoint"].erase("trials");
  CHECK(plan_from_json(searched_with_it).checkpoint->trials.empty());
  Plan none = plan;
  none.checkpoint.reset();
  CHECK_FALSE(json::parse(to_json(none).dump()).contains("checkpoint"));
}

TEST_CASE("Schema: the checkpoint choice lists every set weighed and names one of them as chosen (1.8)",
          "[schema][checkpoint]") {
  const Plan plan = golden_plan();
  const Plan back = plan_from_json(json::parse(to_json(plan).dump()));
  REQUIRE(back.checkpoint_choice);
  CHECK(back.checkpoint_choice->options.size() == 3);
  CHECK(back.checkpoint_choice->options[2].modules.size() == 4);
  CHECK(back.checkpoint_choice->chosen == "every 2nd block");
  json doc = json::parse(to_json(plan).dump());
  json stranger = doc;
  stranger["checkpoint_choice"]["chosen"] = "every 3rd block";
  CHECK_THROWS_WITH(plan_from_json(stranger), Catch::Contains("$.checkpoint_choice.chosen: 'every 3rd block' is not one"));
  json twice = doc;
  twice["checkpoint_choice"]["options"].push_back(twice["checkpoint_choice"]["options"][0]);
  CHECK_THROWS_WITH(plan_from_json(twice), Catch::Contains("options[3].rule: 'none' is listed twice"));
  json unfit = doc;
  unfit["checkpoint_choice"]["options"][0]["micro_batch"] = nullptr;  // not one sample fits without
  unfit["checkpoint_choice"]["options"][0]["accumulation_steps"] = nullptr;
  CHECK(plan_from_json(unfit).checkpoint_choice->options[0].micro_batch == 0);
  json other = doc;
  other["checkpoint_choice"]["chosen"] = "all";  // an option, but not the set the plan trains with
  CHECK_THROWS_WITH(plan_from_json(other), Catch::Contains("$.checkpoint_choice.chosen: 'all' but the plan trains with"));
  json kept_none = doc;
  kept_none.erase("checkpoint");  // no checkpoint: the choice must be none
  CHECK_THROWS_WITH(plan_from_json(kept_none), Catch::Contains("but the plan trains with no checkpoint ('none')"));
  kept_none["checkpoint_choice"]["chosen"] = "none";
  CHECK(plan_from_json(kept_none).checkpoint_choice->chosen == "none");
  json first = doc;
  first["checkpoint_choice"]["options"].erase(0);
  CHECK_THROWS_WITH(plan_from_json(first), Catch::Contains("options[0]: the first option is 'none'"));
  json negative = doc;
  negative["checkpoint_choice"]["options"][1]["predicted_seconds_per_window"] = -1;
  CHECK_THROWS(plan_from_json(negative));
  // The summary shows the chosen set and the best other, with the rule.
  const std::string summary = describe_plan(plan);
  CHECK(summary.find("checkpointing: every 2nd block (microbatch 128 x 2") != std::string::npos);
  CHECK(summary.find("next best: none (microbatch 96 x 3") != std::string::npos);
  CHECK(summary.find("the rule: the least predicted seconds per window") != std::string::npos);
}

TEST_CASE("Schema: run stats round-trip and match their golden file", "[schema][golden][run-stats]") {
  const auto once = to_json(golden_run());
  CHECK(once["schema"] == "accumplan.run_stats");
  CHECK(once["window_series"][1]["loss"].is_null());
  const auto twice = to_json(run_record_from_json(json::parse(once.dump())));
  CHECK(once == twice);
  check_golden("tests/golden/run_stats.json", once.dump(2) + "\n");
}

TEST_CASE("Schema: run stats from another schema or major version are refused", "[schema][run-stats]") {
  json doc = json::parse(to_json(golden_run()).dump());
  doc["schema"] = "accumplan.plan";
  CHECK_THROWS_WITH(run_record_from_json(doc), Catch::Contains("expected \"accumplan.run_stats\""));
  doc = json::parse(to_json(golden_run()).dump());
  doc["schema_version"] = "2.0";
  CHECK_THROWS_AS(run_record_from_json(doc), SchemaError);
  doc = json::parse(to_json(golden_run()).dump());
  doc.erase("schema_version");  // written before 1.4: read
  CHECK(run_record_from_json(doc).windows == 2);
  doc["window_series"][0].erase("samples");
  CHECK_THROWS_WITH(run_record_from_json(doc), Catch::Contains("$.window_series[0].samples"));
}

TEST_CASE("Schema: run stats whose window series disagrees with its window count, or a window of no microbatch, are refused",
          "[schema][run-stats]") {
  json doc = json::parse(to_json(golden_run()).dump());
  doc["window_series"][1]["microbatch_sizes"] = json::array();
  CHECK_THROWS_WITH(run_record_from_json(doc), Catch::Contains("$.window_series[1].microbatch_sizes: a window ran at least one"));
  doc = json::parse(to_json(golden_run()).dump());
  doc["window_series"] = json::array();
  CHECK_THROWS_WITH(run_record_from_json(doc), Catch::Contains("$.window_series: 0 records for the 2 windows"));
  doc.erase("window_series");  // stats written before the series: read
  CHECK(run_record_from_json(doc).window_series.empty());
}

TEST_CASE("Schema: a newer minor version is read, another major is refused", "[schema][version]") {
  json doc = json::parse(to_json(golden_plan()).dump());
  doc["schema_version"] = "1." + std::to_string(kSchemaMinor + 1);
  doc["a_field_from_the_future"] = 42;
  CHECK_NOTHROW(plan_from_json(doc));
  doc["schema_version"] = "2.0";
  const std::string msg = error_of(doc, true);
  CHECK(msg.find("$.schema_version") != std::string::npos);
  CHECK(msg.find("2.0") != std::string::npos);
  CHECK(msg.find("reads 1.x") != std::string::npos);
  doc["schema_version"] = "one";
  CHECK(error_of(doc, true).find("not MAJOR.MINOR") != std::string::npos);
}

TEST_CASE("Schema: a missing or ill-typed field is reported by its JSON path", "[schema][errors]") {
  json doc = json::parse(to_json(golden_plan()).dump());
  json bad = doc;
  bad["memory"]["budget_bytes"] = "lots";
  CHECK(error_of(bad, true) == "$.memory.budget_bytes: expected an integer, found string");
  bad = doc;
  bad["memory"].erase("usable_bytes");
  CHECK(error_of(bad, true) == "$.memory.usable_bytes: missing required field");
  bad = doc;
  bad["profile"]["points"][2]["peak_bytes"] = 1.5;
  CHECK(error_of(bad, true) == "$.profile.points[2].peak_bytes: expected an integer, found number");

  json prof = json::parse(to_json(read_profile_file(source_path("tests/golden/profile.json"))).dump());
  prof["points"][1].erase("micro_batch");
  CHECK(error_of(prof, false) == "$.points[1].micro_batch: missing required field");
  prof["schema"] = "accumplan.plan";
  CHECK(error_of(prof, false).find("expected 'accumplan.profile'") != std::string::npos);
}

TEST_CASE("Schema: plans whose sizes, weights and counts disagree are refused", "[schema][errors]") {
  json doc = json::parse(to_json(golden_plan()).dump());
  json bad = doc;
  bad["microbatch_sizes"][0] = 1;
  CHECK(error_of(bad, true).find("sizes sum to") != std::string::npos);
  bad = doc;
  bad["weights"].erase(0);
  CHECK(error_of(bad, true).find("$.weights") != std::string::npos);
}

TEST_CASE("Schema: files that are missing or not JSON are clear input errors", "[schema][errors]") {
  CHECK_THROWS_WITH(read_plan_file("/nonexistent/plan.json", "--plan"),
                    Catch::Contains("--plan: cannot open '/nonexistent/plan.json'"));
  const std::string path = std::string(ACCUMPLAN_BINARY_DIR) + "/not-json.json";
  write_text_atomic(path, "{\n  \"schema\": \"accumplan.plan\",\n  oops\n}\n");
  CHECK_THROWS_WITH(read_plan_file(path, "--plan"), Catch::Contains("is not valid JSON (line 3"));
}

// The published JSON Schema files must describe what the writers emit: every required key is
// written, and every written key is declared (a drift in either direction fails here).
TEST_CASE("Schema: published JSON Schemas match what the writers emit", "[schema]") {
  auto check = [](const char* schema_file, const json& doc) {
    const json schema = read_json_file(source_path(schema_file), "schema");
    CHECK(schema["properties"]["schema_version"]["pattern"] == "^1\\.[0-9]+$");
    std::set<std::string> declared;
    for (auto it = schema["properties"].begin(); it != schema["properties"].end(); ++it) declared.insert(it.key());
    for (const auto& req : schema["required"]) {
      INFO(schema_file << " requires " << req);
      CHECK(doc.contains(req.get<std::string>()));
    }
    for (auto it = doc.begin(); it != doc.end(); ++it) {
      INFO(schema_file << " lacks " << it.key());
      CHECK(declared.count(it.key()) == 1);
    }
    // One level down, for the objects the schema spells out.
    for (auto it = schema["properties"].begin(); it != schema["properties"].end(); ++it) {
      const json& sub = it.value();
      if (!sub.contains("properties") || !doc.contains(it.key()) || !doc[it.key()].is_object()) continue;
      for (auto f = doc[it.key()].begin(); f != doc[it.key()].end(); ++f) {
        INFO(schema_file << " lacks " << it.key() << "." << f.key());
        CHECK(sub["properties"].contains(f.key()));
      }
      for (const auto& req : sub.value("required", json::array())) {
        CHECK(doc[it.key()].contains(req.get<std::string>()));
      }
    }
  };
  check("planner/schemas/plan.schema.json", json::parse(to_json(golden_plan()).dump()));
  Plan packed = golden_plan();  // the 1.3 fields that only ragged-data plans carry
  packed.tokens = TokenBudget{8192, 1024, 1500};
  packed.setup.padding_mask = true;
  check("planner/schemas/plan.schema.json", json::parse(to_json(packed).dump()));
  check("planner/schemas/plan.schema.json", json::parse(to_json(grouped_plan()).dump()));  // 1.6 setup fields
  check("planner/schemas/profile.schema.json",
        json::parse(to_json(read_profile_file(source_path("tests/golden/profile.json"))).dump()));
  check("planner/schemas/run_stats.schema.json", json::parse(to_json(golden_run()).dump()));
  // One level further for the per-window records.
  const json run_schema = read_json_file(source_path("planner/schemas/run_stats.schema.json"), "schema");
  const json& window_props = run_schema["properties"]["window_series"]["items"]["properties"];
  const json run_doc = json::parse(to_json(golden_run()).dump());  // named: the loop below reads into it
  for (const auto& w : run_doc["window_series"]) {
    for (auto f = w.begin(); f != w.end(); ++f) {
      INFO("run_stats.schema.json window_series lacks " << f.key());
      CHECK(window_props.contains(f.key()));
    }
  }
}

// Every "optimizer" property of a JSON Schema that names one, wherever it stands (not 1.9's
// sharding.optimizer, a boolean).
static void optimizer_enums(const json& schema, std::vector<json>& found) {
  if (!schema.is_object() && !schema.is_array()) return;
  if (schema.is_object() && schema.contains("properties") && schema["properties"].contains("optimizer") &&
      schema["properties"]["optimizer"].value("type", "") != "boolean") {
    found.push_back(schema["properties"]["optimizer"]["enum"]);
  }
  for (const auto& child : schema) optimizer_enums(child, found);
}

TEST_CASE("Schema: each published schema's $id carries the version the writers write", "[schema][version]") {
  for (const std::string name : {"plan", "profile", "run_stats"}) {
    const json schema = read_json_file(source_path("planner/schemas/" + name + ".schema.json"), "schema");
    CHECK(schema["$id"] == "accumplan." + name + "/" + schema_version_string());
  }
}

TEST_CASE("Schema: the published schemas list exactly the optimizer table's names", "[schema][optimizer]") {
  for (const char* file : {"planner/schemas/plan.schema.json", "planner/schemas/profile.schema.json"}) {
    std::vector<json> enums;
    optimizer_enums(read_json_file(source_path(file), "schema"), enums);
    INFO(file);
    REQUIRE_FALSE(enums.empty());
    for (const json& e : enums) CHECK(e == json(optimizer_names()));
  }
}

TEST_CASE("Schema: a token plan round-trips; sample plans carry no token fields", "[schema][token]") {
  const json sample = json::parse(to_json(golden_plan()).dump());
  CHECK_FALSE(sample.contains("tokens"));
  CHECK_FALSE(sample["setup"].contains("padding_mask"));
  Plan packed = golden_plan();
  packed.tokens = TokenBudget{8192, 1024, 1500};
  packed.setup.padding_mask = true;
  const json doc = json::parse(to_json(packed).dump());
  CHECK(doc["tokens"]["token_budget"] == 8192);
  const Plan back = plan_from_json(doc);
  REQUIRE(back.tokens.has_value());
  CHECK(back.tokens->token_budget == 8192);
  CHECK(back.tokens->max_seq_len == 1024);
  CHECK(back.tokens->longest_sequence_alone == 1500);
  CHECK(back.setup.padding_mask);
  CHECK_FALSE(plan_from_json(sample).tokens.has_value());
  json bad = doc;
  bad["tokens"]["max_seq_len"] = 9000;  // a budget that cannot hold one sequence of that length
  CHECK_THAT(error_of(bad, true), Catch::Contains("$.tokens: token_budget 8192 must hold at least one sequence of "
                                                  "max_seq_len 9000"));
  bad = doc;
  bad["tokens"]["token_budget"] = 0;
  CHECK_THAT(error_of(bad, true), Catch::Contains("$.tokens.token_budget"));
  bad = doc;
  bad["tokens"].erase("max_seq_len");
  CHECK_THAT(error_of(bad, true), Catch::Contains("$.tokens.max_seq_len"));
}

TEST_CASE("Schema: a 1.0 plan still reads, its flattened profile nested as 1.1 writes it", "[schema][compat]") {
  // tests/golden/plan-1.0.json is the golden plan as accumplan wrote it before 1.1 (kept as is).
  const json old_doc = read_json_file(source_path("tests/golden/plan-1.0.json"), "golden");
  REQUIRE(old_doc["schema_version"] == "1.0");
  const Plan old_plan = plan_from_json(old_doc);
  const Plan plan = golden_plan();
  REQUIRE(old_plan.profile.points.size() == old_doc["profile_points"].size());
  for (size_t i = 0; i < old_plan.profile.points.size(); ++i) {
    CHECK(old_plan.profile.points[i].peak_bytes == old_doc["profile_points"][i]["peak_bytes"].get<int64_t>());
  }
  CHECK(old_plan.profile.persistent.total() == plan.profile.persistent.total());
  CHECK(old_plan.profile.setup.optimizer == plan.profile.setup.optimizer);
  // Re-planning from the nested profile gives the plan the 1.0 file was solved to.
  PlanRequest r;
  r.target_batch = old_plan.target_batch;
  r.budget.bytes = old_plan.memory.budget_bytes;
  // Its headroom (a fraction of the budget then) reads as the bytes it kept free.
  CHECK(old_plan.memory.margin.fixed_bytes == old_plan.memory.budget_bytes - old_plan.memory.usable_bytes);
  r.headroom = headroom_of(old_plan.memory.margin);
  CHECK(make_plan(old_plan.profile, r).microbatch_sizes == old_plan.microbatch_sizes);
  // Written again, it is a plan of the writer's version with the profile nested.
  const json again = json::parse(to_json(old_plan).dump());
  CHECK(again["schema_version"] == schema_version_string());
  CHECK(again.contains("profile"));
  CHECK_FALSE(again.contains("profile_points"));
}

TEST_CASE("Schema: run stats out of range are refused, naming the field", "[schema][run-stats]") {
  auto refusal = [](const json& doc) {
    try {
      run_record_from_json(doc);
    } catch (const SchemaError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const json good = json::parse(to_json(golden_run()).dump());
  json doc = good;
  doc["measured_peak_bytes"] = -5;
  CHECK(refusal(doc).find("$.measured_peak_bytes") != std::string::npos);
  doc = good;
  doc["window_series"][0]["seconds"] = -1.0;
  CHECK(refusal(doc).find("$.window_series[0].seconds") != std::string::npos);
  doc = good;
  doc["window_series"][1]["window"] = int64_t{1} << 62;
  CHECK(refusal(doc).find("$.window_series[1].window") != std::string::npos);
  doc = good;
  doc["microbatch_sizes"] = json::array();
  CHECK(refusal(doc).find("$.microbatch_sizes") != std::string::npos);
  doc = good;
  doc["window_series"][0]["microbatch_sizes"] = {4, 0};
  CHECK(refusal(doc).find("$.window_series[0].microbatch_sizes[1]") != std::string::npos);
}

TEST_CASE("Schema: optimizer flags and parameter groups round-trip (1.6) and match their golden setup",
          "[schema][golden][optimizer]") {
  const json once = json::parse(to_json(grouped_plan()).dump());
  const Plan back = plan_from_json(once);
  REQUIRE(back.setup.param_groups.size() == 2);
  CHECK(back.setup.param_groups[1].lr == 0.1);
  CHECK(back.setup.param_groups[1].parameter_count == 10);
  CHECK(back.setup.param_groups[1].flags.at("nesterov"));
  CHECK(back.setup.flags.at("nesterov"));
  CHECK(back.profile.setup.param_groups.size() == 2);
  CHECK(json::parse(to_json(back).dump()) == once);
  check_golden("tests/golden/setup-param-groups.json", to_json(grouped_plan())["setup"].dump(2) + "\n");
}

TEST_CASE("Schema: a setup without flags or groups reads as one group at torch's defaults, written as before",
          "[schema][compat][optimizer]") {
  const json doc = json::parse(to_json(golden_plan()).dump());
  CHECK_FALSE(doc["setup"].contains("flags"));  // single-group plans stay as 1.5 wrote them
  CHECK_FALSE(doc["setup"].contains("param_groups"));
  const Plan p = plan_from_json(doc);
  CHECK(p.setup.flags.empty());
  CHECK(p.setup.param_groups.empty());
}

TEST_CASE("Schema: bad optimizer flags and groups are refused, naming the field", "[schema][errors][optimizer]") {
  const json doc = json::parse(to_json(grouped_plan()).dump());
  json bad = doc;
  bad["setup"]["flags"]["nesterov"] = 1;
  CHECK_THAT(error_of(bad, true), Catch::Contains("$.setup.flags.nesterov"));
  bad = doc;
  bad["setup"]["param_groups"][0]["lr"] = 0.5;  // the first group is setup's own values
  CHECK_THAT(error_of(bad, true), Catch::Contains("$.setup.param_groups[0]: the first group's lr"));
  bad = doc;
  bad["setup"]["param_groups"][1]["lr"] = -1;
  CHECK_THAT(error_of(bad, true), Catch::Contains("$.setup.param_groups[1].lr"));
  bad = doc;
  bad["setup"]["param_groups"] = json::array();
  CHECK_THAT(error_of(bad, true), Catch::Contains("$.setup.param_groups"));
  bad = doc;
  bad["setup"]["param_groups"][1].erase("lr");
  CHECK_THAT(error_of(bad, true), Catch::Contains("$.setup.param_groups[1].lr"));
}

TEST_CASE("Schema: every optimizer value has one range, which the plan reader's lr check reads",
          "[schema][optimizer]") {
  for (const OptimizerInfo& row : optimizer_table()) {
    for (const OptimizerHyperparameter& h : row.hyperparameters) {
      CAPTURE(row.name, h.name);
      REQUIRE(optimizer_value_range(h.name) != nullptr);
      CHECK(optimizer_value_range(h.name)->contains(h.plan_default));
      CHECK(optimizer_value_range(h.name)->contains(h.torch_default));
    }
  }
  const ValueRange& lr = *optimizer_value_range("lr");
  CHECK(lr.contains(0.0));
  CHECK_FALSE(lr.contains(-1e-9));
  CHECK_FALSE(lr.contains(std::nan("")));
  CHECK_FALSE(optimizer_value_range("beta1")->contains(1.0));  // open at 1
  CHECK(optimizer_value_range("no_such_value") == nullptr);
  json bad = json::parse(to_json(grouped_plan()).dump());
  bad["setup"]["lr"] = lr.hi * 2;
  CHECK_THAT(error_of(bad, true), Catch::Contains("$.setup.lr: 2000000.0 is out of range; expected a number in [0, 1000000]"));
}

TEST_CASE("Schema: lr 0 (a warm-up scheduler's first step) reads; a negative lr is refused, naming the field",
          "[schema][errors][optimizer]") {
  const json doc = json::parse(to_json(grouped_plan()).dump());
  json zero = doc;
  zero["setup"]["lr"] = 0.0;
  zero["setup"]["param_groups"][0]["lr"] = 0.0;
  zero["setup"]["param_groups"][1]["lr"] = 0.0;
  zero["profile"]["setup"] = zero["setup"];
  const Plan read = plan_from_json(zero);
  CHECK(read.setup.lr == 0.0);
  CHECK(read.setup.param_groups[1].lr == 0.0);
  // Round trip: what the writer emits for lr 0 reads back.
  CHECK(plan_from_json(json::parse(to_json(read).dump())).setup.lr == 0.0);
  json bad = doc;
  bad["setup"]["lr"] = -1e-9;
  CHECK_THAT(error_of(bad, true), Catch::Contains("$.setup.lr: -1e-09 is out of range; expected a number in [0, 1000000]"));
  bad = doc;
  bad["setup"]["param_groups"][1]["lr"] = -0.5;
  CHECK_THAT(error_of(bad, true), Catch::Contains("$.setup.param_groups[1].lr: -0.5 is out of range"));
}
