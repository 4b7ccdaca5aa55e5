// Exports to trainer settings: uniform split, product equals the target batch, a note when the
// uniform split differs from the balanced window.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "accumplan/errors.h"
#include "accumplan/exporters.h"
#include "accumplan/solver.h"
#include "test_helpers.h"

using namespace accumplan;
using nlohmann::json;

namespace {
Plan plan_256_on(int64_t world) {
  const int64_t MiB = 1024 * 1024;
  const Profile p = accumplan::test::linear_profile(MiB, MiB, MiB);
  PlanRequest r;
  r.target_batch = 256;
  r.world_size = world;
  r.headroom = 0;
  r.budget.bytes = p.persistent.total() + MiB + 60 * MiB;
  return make_plan(p, r);
}
}  // namespace

TEST_CASE("Exporters: DeepSpeed gets batch, micro batch per GPU and accumulation", "[export]") {
  std::string note;
  const json ds = json::parse(export_plan(plan_256_on(1), "deepspeed", &note));
  CHECK(ds["train_batch_size"] == 256);
  CHECK(ds["train_micro_batch_size_per_gpu"] == 32);
  CHECK(ds["gradient_accumulation_steps"] == 8);
  CHECK(note.find("uniform split 8 x 32") != std::string::npos);
  CHECK(note.find("[52,51,51,51,51]") != std::string::npos);
}

TEST_CASE("Exporters: every trainer's batch arithmetic reaches the target with W ranks", "[export]") {
  const Plan plan = plan_256_on(2);  // T = 128, m_max 60: uniform 32 x 4
  std::string note;
  const json hf = json::parse(export_plan(plan, "hf", &note));
  CHECK(hf["per_device_train_batch_size"].get<int64_t>() * hf["gradient_accumulation_steps"].get<int64_t>() * 2 == 256);
  const json acc = json::parse(export_plan(plan, "accelerate", &note));
  CHECK(acc["num_processes"] == 2);
  CHECK(acc["gradient_accumulation_steps"] == 4);
  const json pl = json::parse(export_plan(plan, "lightning", &note));
  CHECK(pl["trainer"]["accumulate_grad_batches"] == 4);
  CHECK(pl["trainer"]["devices"] == 2);
  CHECK(pl["dataloader"]["batch_size"] == 32);
  CHECK(export_plan(plan, "torchrun", &note) == "--nnodes=1 --nproc-per-node=2\n");
}

TEST_CASE("Exporters: no note when the balanced plan is already uniform", "[export]") {
  const int64_t MiB = 1024 * 1024;
  const Profile p = accumplan::test::linear_profile(MiB, MiB, MiB);
  PlanRequest r;
  r.target_batch = 256;
  r.headroom = 0;
  r.budget.bytes = p.persistent.total() + MiB + 64 * MiB;
  std::string note = "stale";
  export_plan(make_plan(p, r), "hf", &note);
  CHECK(note.empty());
}

TEST_CASE("Exporters: an unknown trainer lists the known ones", "[export][errors]") {
  CHECK_THROWS_WITH(export_plan(plan_256_on(1), "keras", nullptr),
                    Catch::Contains("deepspeed, accelerate, lightning, hf, torchrun"));
}
