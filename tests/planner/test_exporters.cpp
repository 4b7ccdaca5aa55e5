// Exports to trainer settings: the uniform split in each trainer's own shape, the departure from
// the plan written inside the output, and a refusal (exit 2) for a uniform split predicted more
// than 25% slower. tests/python/test_exports.py parses the same outputs with the consumers.
#include <catch2/catch.hpp>

#include <sstream>

#include <nlohmann/json.hpp>

#include "accumplan/errors.h"
#include "accumplan/exporters.h"
#include "accumplan/solver.h"
#include "test_helpers.h"

using namespace accumplan;
using nlohmann::json;

namespace {
constexpr int64_t MiB = 1024 * 1024;

// m_max = `fits` samples exactly (1 MiB per sample, no headroom).
Plan plan_for(int64_t target, int64_t world, int64_t fits, bool timed = false) {
  Profile p = accumplan::test::linear_profile(MiB, MiB, MiB);
  if (timed) {  // 10 ms + 1 ms per sample: a microbatch's fixed cost is what many small ones pay for
    for (auto& pt : p.points) pt.step_seconds = 0.010 + 0.001 * static_cast<double>(pt.micro_batch);
  }
  PlanRequest r;
  r.target_batch = target;
  r.world_size = world;
  r.headroom = parse_headroom("0");
  r.budget.bytes = p.persistent.total() + MiB + fits * MiB;
  return make_plan(p, r);
}

std::string body_without_comments(const std::string& text) {
  std::string out, line;
  std::istringstream in(text);
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] != '#') out += line + "\n";
  }
  return out;
}
}  // namespace

TEST_CASE("Exporters: DeepSpeed gets batch, micro batch per GPU and accumulation, and says what it departs from",
          "[export]") {
  std::string note;
  const Plan plan = plan_for(256, 1, 60);  // [52,51,51,51,51]; uniform 8 x 32
  const json ds = json::parse(export_plan(plan, "deepspeed", &note, ExportOptions{"p.json", "accumplan", true}));
  CHECK(ds["train_batch_size"] == 256);
  CHECK(ds["train_micro_batch_size_per_gpu"] == 32);
  CHECK(ds["gradient_accumulation_steps"] == 8);
  CHECK(ds["accumplan"]["departs_from_plan"] == true);
  CHECK(ds["accumplan"]["plan_microbatch_sizes"] == json::array({52, 51, 51, 51, 51}));
  CHECK(ds["accumplan"]["note"].get<std::string>().find("uniform split 8 x 32") != std::string::npos);
  CHECK(note.find("[52,51,51,51,51]") != std::string::npos);
}

TEST_CASE("Exporters: every trainer's batch arithmetic reaches the target with W ranks", "[export]") {
  const Plan plan = plan_for(256, 2, 64);  // T = 128, m_max 64: 2 x 64, uniform too
  std::string note = "stale";
  const json hf = json::parse(export_plan(plan, "hf", &note));
  CHECK(note.empty());
  CHECK(hf["TrainingArguments"]["per_device_train_batch_size"].get<int64_t>() *
            hf["TrainingArguments"]["gradient_accumulation_steps"].get<int64_t>() * 2 ==
        256);
  CHECK(hf["launch"] == "torchrun --nnodes=1 --nproc_per_node=2 YOUR_SCRIPT.py");
  CHECK(hf["accumplan"]["departs_from_plan"] == false);
  const json acc = json::parse(export_plan(plan, "accelerate", &note));
  CHECK(acc["Accelerator"] == json{{"gradient_accumulation_steps", 2}});
  CHECK(acc["DataLoader"] == json{{"batch_size", 64}});
  CHECK(acc["launch"] == "accelerate launch --num_machines 1 --num_processes 2 YOUR_SCRIPT.py");
  const std::string pl = export_plan(plan, "lightning", &note);
  CHECK(body_without_comments(pl).find("trainer:\n  accumulate_grad_batches: 2\n  devices: 2\n  num_nodes: 1\n"
                                       "data:\n  batch_size: 64") != std::string::npos);
  CHECK(pl.find("NOTE") == std::string::npos);
}

TEST_CASE("Exporters: torchrun is a full command line with spellings 1.13 and 2.x accept", "[export]") {
  Plan plan = plan_for(256, 2, 60);
  plan.model.path = "models/my model.pt";
  std::string note;
  const std::string text = export_plan(plan, "torchrun", &note, ExportOptions{"plan.json", "build/accumplan", false});
  CHECK(note.empty());  // accumplan runs the balanced plan itself
  CHECK(body_without_comments(text) ==
        "torchrun --nnodes=1 --nproc_per_node=2 --redirects=1 --tee=1 --no_python build/accumplan run --plan "
        "plan.json --model "
        "'models/my model.pt'\n");
  CHECK(text.find("--nproc-per-node") == std::string::npos);
}

TEST_CASE("Exporters: a uniform split predicted more than 25% slower is refused, naming even targets", "[export][errors]") {
  // 251 with m_max 36: the plan is 7 microbatches (36 x 6 + 35); 251 is prime, so the uniform
  // split is 251 x 1.
  for (bool timed : {false, true}) {
    const Plan plan = plan_for(251, 1, 36, timed);
    REQUIRE(plan.accumulation_steps == 7);
    REQUIRE(plan.uniform.accumulation_steps == 251);
    bool by_time = !timed;
    CHECK(uniform_slowdown(plan, &by_time) > 1.25);
    CHECK(by_time == timed);
    CHECK(nearest_even_targets(plan) == std::pair<int64_t, int64_t>{245, 252});
    for (const char* to : {"deepspeed", "hf", "accelerate", "lightning"}) {
      CHECK_THROWS_AS(export_plan(plan, to, nullptr), InfeasibleError);
      CHECK_THROWS_WITH(export_plan(plan, to, nullptr), Catch::Contains("252 (7 x 36) or 245 (7 x 35)") &&
                                                           Catch::Contains("--allow-slow"));
    }
    CHECK_NOTHROW(export_plan(plan, "torchrun", nullptr));  // accumplan runs the plan as it is
    ExportOptions allow;
    allow.allow_slow = true;
    const json ds = json::parse(export_plan(plan, "deepspeed", nullptr, allow));
    CHECK(ds["gradient_accumulation_steps"] == 251);
    CHECK(ds["accumplan"]["predicted_slowdown"].get<double>() > 1.25);
    const std::string pl = export_plan(plan, "lightning", nullptr, allow);
    CHECK(pl.find("# NOTE: lightning needs equal microbatches") != std::string::npos);
  }
}

TEST_CASE("Exporters: a small departure is exported, with the prediction inside the output", "[export]") {
  // 256 with m_max 60 and step times: 8 x 32 against 52,51,51,51,51 is a few percent slower.
  const Plan plan = plan_for(256, 1, 60, true);
  bool by_time = false;
  const double slow = uniform_slowdown(plan, &by_time);
  CHECK(by_time);
  CHECK(slow > 1.0);
  CHECK(slow < 1.25);
  const json hf = json::parse(export_plan(plan, "hf", nullptr));
  CHECK(hf["accumplan"]["note"].get<std::string>().find("slower per window by the profile's step times") !=
        std::string::npos);
}

TEST_CASE("Exporters: an unknown trainer lists the known ones", "[export][errors]") {
  CHECK_THROWS_WITH(export_plan(plan_for(256, 1, 60), "keras", nullptr),
                    Catch::Contains("deepspeed, accelerate, lightning, hf, torchrun"));
}
