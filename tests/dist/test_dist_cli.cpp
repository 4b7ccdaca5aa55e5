// test_dist_cli.cpp — `accumplan run` as 2 processes, launched the way torchrun --no_python
// launches them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), on 127.0.0.1 with Gloo.
//
// What it is: a plan made by `accumplan --model builtin:mlp --world-size 2` (per-rank batch 8,
// microbatches of at most 3: 3,3,2 or 2,2,2,2 — the planner may weigh measured step times), run for 3 windows over 40 synthetic samples (16, 16, then a short 8: 4 per
// rank): both ranks exit 0, save bitwise identical parameters ({rank} in --save/--stats), count
// every sample once globally, and exchange gradients once per window. Also the failures that must
// be clear rather than hangs: a plan for 2 ranks run as one process, a rank whose peer never
// comes (bounded by --dist-timeout), and a rank whose peer is killed mid-run (one line, exit 1).
// What it is not: the weighting proof (test_dist_executor.cpp compares against full-batch updates).
#include <torch/script.h>
#include <torch/torch.h>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "dist_harness.h"
#include "accumplan/schema.h"
#include "accumplan/sharding.h"
#include "accumplan/replan.h"
#include "executor/verify.h"

#include "catch_after_torch.h"

using namespace accumplan;
using namespace accumplan::test;
using json = nlohmann::json;

namespace {

// plan.json for builtin:mlp, B = 16 on 2 ranks, microbatches of at most 3.
std::string make_dist_plan(const std::string& dir) {
  const std::string plan = dir + "/plan.json";
  const CliResult r = run_cli({"--model", "builtin:mlp", "--target-batch", "16", "--world-size", "2", "--max-micro-batch",
                               "3", "--device", "cpu", "--threads", "1", "--out", plan},
                              120);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  return plan;
}

}  // namespace

TEST_CASE("accumplan run on 2 processes: both ranks finish with identical parameters, one gradient exchange a window",
          "[dist][cli]") {
  const std::string dir = scratch_dir("dist-cli-" + std::to_string(::getpid()));
  const std::string plan = make_dist_plan(dir);
  const Plan pj = read_plan_file(plan);
  REQUIRE(pj.world_size == 2);
  REQUIRE(pj.per_rank_batch == 8);
  REQUIRE(pj.micro_batch <= 3);
  REQUIRE(pj.microbatch_sizes.size() > 1);  // several microbatches, still one agreement a window

  const LaunchResult res =
      launch_ranks({ACCUMPLAN_BIN, "run", "--plan", plan, "--model", "builtin:mlp", "--steps", "3", "--synthetic-samples",
                    "40", "--threads", "1", "--dist-timeout", "20", "--save", dir + "/trained-{rank}.pt", "--stats",
                    dir + "/stats-{rank}.json"},
                   2, dir, {}, 60);
  INFO("rank 0:\n" << slurp(res.ranks[0].log) << "\nrank 1:\n" << slurp(res.ranks[1].log));
  REQUIRE_FALSE(res.timed_out);
  REQUIRE(res.ranks[0].exit_code == 0);
  REQUIRE(res.ranks[1].exit_code == 0);

  std::vector<std::vector<at::Tensor>> params;
  for (int r = 0; r < 2; ++r) {
    const json st = json::parse(slurp(dir + "/stats-" + std::to_string(r) + ".json"));
    CHECK(st["rank"] == r);
    CHECK(st["world_size"] == 2);
    CHECK(st["backend"] == "gloo");
    CHECK(st["windows"] == 3);
    CHECK(st["samples_seen"] == 40);  // global: 16 + 16 + 8, each sample once
    CHECK(st["replicas_identical"] == true);
    CHECK(st["collectives"]["gradient_exchanges"] == 3);
    // One count reduce and one agreement per window, whatever its microbatches (3,3,2, and the
    // short window's 2,2); never one exchange per microbatch.
    CHECK(st["collectives"]["counter_all_reduces"] == 2 * 3);
    torch::jit::Module m = torch::jit::load(dir + "/trained-" + std::to_string(r) + ".pt");
    std::vector<at::Tensor> v;
    for (const auto& p : m.parameters()) v.push_back(p.detach().clone());
    params.push_back(v);
  }
  CHECK(compare_tensors(params[0], params[1]).max_abs == 0.0);
  CHECK(slurp(res.ranks[0].log).find("on 2 ranks") != std::string::npos);
}

TEST_CASE("accumplan run of a plan sharding Adam's state over 2 ranks: each rank steps its share, the parameters "
          "equal the unsharded run's", "[dist][cli][sharding]") {
  const std::string dir = scratch_dir("dist-shard-" + std::to_string(::getpid()));
  auto plan_and_run = [&](const std::string& shard) {
    const std::string plan = dir + "/plan-" + shard + ".json";
    const CliResult made = run_cli({"--model", "builtin:mlp", "--target-batch", "16", "--world-size", "2", "--max-micro-batch",
                                    "3", "--optimizer", "adam", "--shard", shard, "--device", "cpu", "--threads", "1",
                                    "--no-eval", "--out", plan}, 120);
    INFO(made.err);
    REQUIRE(made.exit_code == 0);
    const LaunchResult res =
        launch_ranks({ACCUMPLAN_BIN, "run", "--plan", plan, "--model", "builtin:mlp", "--steps", "3", "--synthetic-samples",
                      "40", "--threads", "1", "--dist-timeout", "20", "--save", dir + "/" + shard + "-{rank}.pt", "--stats",
                      dir + "/" + shard + "-{rank}.json"},
                     2, dir, {}, 60);
    INFO("rank 0:\n" << slurp(res.ranks[0].log) << "\nrank 1:\n" << slurp(res.ranks[1].log));
    REQUIRE_FALSE(res.timed_out);
    REQUIRE(res.ranks[0].exit_code == 0);
    REQUIRE(res.ranks[1].exit_code == 0);
    return read_plan_file(plan);
  };
  const Plan sharded = plan_and_run("optimizer");
  const Plan whole = plan_and_run("off");
  REQUIRE(sharded.sharding);
  CHECK_FALSE(whole.sharding);
  REQUIRE(sharded.microbatch_sizes == whole.microbatch_sizes);
  const Sharding& s = *sharded.sharding;
  CHECK(s.per_rank_state_bytes[0] + s.per_rank_state_bytes[1] == whole.memory.optimizer_state_bytes);
  // The windows held the largest share only.
  CHECK(sharded.memory.optimizer_state_bytes == s.per_rank_state_bytes[static_cast<size_t>(s.measured_rank)]);
  for (int r = 0; r < 2; ++r) {
    const json st = json::parse(slurp(dir + "/optimizer-" + std::to_string(r) + ".json"));
    CHECK(st["replicas_identical"] == true);
    CHECK(st["collectives"]["parameter_broadcasts"] == 3);  // one after each of the 3 steps
    CHECK(json::parse(slurp(dir + "/off-" + std::to_string(r) + ".json"))["collectives"]["parameter_broadcasts"] == 0);
    auto params = [&](const std::string& shard) {
      torch::jit::Module m = torch::jit::load(dir + "/" + shard + "-" + std::to_string(r) + ".pt");
      std::vector<at::Tensor> v;
      for (const auto& p : m.parameters()) v.push_back(p.detach().clone());
      return v;
    };
    CHECK(compare_tensors(params("optimizer"), params("off")).max_abs == 0.0);  // Adam steps each parameter alone
  }
}

TEST_CASE("accumplan --shard auto shards Adam's state only where it fits a larger microbatch, and says which",
          "[dist][cli][sharding]") {
  const std::string dir = scratch_dir("dist-shard-auto-" + std::to_string(::getpid()));
  auto plan_with = [&](const std::string& shard, const std::vector<std::string>& more) {
    const std::string plan = dir + "/plan-" + shard + "-" + std::to_string(more.size()) + ".json";
    std::vector<std::string> args{"--model", "builtin:mlp", "--world-size", "2", "--optimizer", "adam", "--shard", shard,
                                  "--device", "cpu", "--threads", "1", "--no-eval", "--progress", "none", "--out", plan};
    args.insert(args.end(), more.begin(), more.end());
    const CliResult made = run_cli(args, 300);
    INFO(made.err);
    REQUIRE(made.exit_code == 0);
    return read_plan_file(plan);
  };
  // 2 MiB: Adam's state (twice the weights) decides how large a microbatch fits.
  const std::vector<std::string> tight{"--target-batch", "1024", "--memory-budget", "2MiB"};
  const Plan off = plan_with("off", tight);
  const Plan sharded = plan_with("auto", tight);
  REQUIRE(sharded.sharding);
  CHECK(sharded.max_micro_batch > off.max_micro_batch);
  CHECK_THAT(sharded.reason, Catch::Contains("--shard auto sharded it"));
  // 1700 KiB: the whole state on every rank leaves not one sample; sharded, a plan.
  const Plan only_sharded = plan_with("auto", {"--target-batch", "64", "--memory-budget", "1700KiB"});
  REQUIRE(only_sharded.sharding);
  CHECK(only_sharded.micro_batch >= 1);
  CHECK_THAT(only_sharded.reason, Catch::Contains("--shard auto sharded it: unsharded, not one sample fits."));
  // No budget: the whole window already fits, so sharding gains nothing.
  const Plan whole = plan_with("auto", {"--target-batch", "16"});
  CHECK_FALSE(whole.sharding);
  CHECK_THAT(whole.reason, Catch::Contains("--shard auto did not shard"));
  // Profiling measures one way; auto chooses while planning.
  const CliResult profile = run_cli({"profile", "--model", "builtin:mlp", "--world-size", "2", "--shard", "auto",
                                     "--device", "cpu"}, 120);
  CHECK(profile.exit_code == 2);
  CHECK_THAT(profile.err, Catch::Contains("--shard auto chooses while planning"));
}

TEST_CASE("accumplan run refuses a 2-rank plan in one process, and a missing peer is an error within --dist-timeout",
          "[dist][cli][errors]") {
  const std::string dir = scratch_dir("dist-cli-errors-" + std::to_string(::getpid()));
  const std::string plan = make_dist_plan(dir);
  SECTION("WORLD_SIZE unset") {
    const CliResult r = run_cli({"run", "--plan", plan, "--model", "builtin:mlp", "--steps", "1"}, 120);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("world size 2") != std::string::npos);
    CHECK(r.err.find("torchrun --no_python") != std::string::npos);
  }
  SECTION("rank 1 never starts: rank 0 fails after 3 s instead of waiting forever") {
    const LaunchResult res = launch_ranks({ACCUMPLAN_BIN, "run", "--plan", plan, "--model", "builtin:mlp", "--steps", "1",
                                           "--threads", "1", "--dist-timeout", "3"},
                                          2, dir, {}, 60, /*only_ranks=*/{0});
    const std::string log = slurp(res.ranks[0].log);
    INFO(log);
    CHECK_FALSE(res.timed_out);
    CHECK(res.ranks[0].exit_code == 2);
    CHECK(log.find("could not join the process group") != std::string::npos);
  }
  SECTION("rank 1 is killed mid-run: rank 0 says so in one line, not as a bug") {
    const std::string run = std::string(ACCUMPLAN_BIN) + " run --plan '" + plan +
                            "' --model builtin:mlp --threads 1 --dist-timeout 20 --synthetic-samples 64 --steps 1000000";
    const LaunchResult res = launch_ranks(
        {"/bin/sh", "-c", "if [ \"$RANK\" = 1 ]; then exec timeout -s KILL 3 " + run + "; else exec " + run + "; fi"}, 2, dir,
        {}, 60);
    const std::string log = slurp(res.ranks[0].log);
    INFO(log);
    CHECK_FALSE(res.timed_out);
    CHECK(res.ranks[0].exit_code == 1);
    CHECK(log.find("accumplan: error: rank 0: the ") != std::string::npos);
    CHECK(log.find(" with the other ranks failed, so a peer exited or its connection dropped") != std::string::npos);
    CHECK(log.find("This is a bug") == std::string::npos);
  }
}

TEST_CASE("a plan for 2 ranks at its own budget: every rank's steady windows peak at the plan's prediction, the "
          "gradient exchange included, and never run out of memory", "[dist][cli][exchange]") {
  // builtin:mlp under 2 MiB: its gradients (340,012 bytes) outweigh a microbatch's activations.
  // With momentum the exchange's flat buffer beside them is the window's highest moment; Adam's
  // step peaks higher (1,884,332 bytes), and a buffer still held into it would pass the budget.
  const std::string dir = scratch_dir("dist-exchange-" + std::to_string(::getpid()));
  const std::vector<std::pair<std::string, std::string>> cases{{"momentum", "off"}, {"adam", "off"}, {"adam", "optimizer"}};
  for (const auto& [optimizer, shard] : cases) {
    INFO("--optimizer " << optimizer << " --shard " << shard);
    const std::string name = optimizer + "-" + shard;
    const std::string plan = dir + "/plan-" + name + ".json";
    const CliResult made = run_cli({"--model", "builtin:mlp", "--target-batch", "64", "--world-size", "2", "--optimizer",
                                    optimizer, "--shard", shard, "--memory-budget", "2MiB", "--device", "cpu", "--threads",
                                    "1", "--no-eval", "--out", plan}, 120);
    INFO(made.err);
    REQUIRE(made.exit_code == 0);
    const Plan p = read_plan_file(plan);
    CHECK(p.profile.gradient_exchange);
    const LaunchResult res =
        launch_ranks({ACCUMPLAN_BIN, "run", "--plan", plan, "--model", "builtin:mlp", "--steps", "4", "--synthetic-samples",
                      "256", "--threads", "1", "--dist-timeout", "20", "--memory-budget", "2MiB", "--stats",
                      dir + "/" + name + "-{rank}.json"},
                     2, dir, {}, 60);
    INFO("rank 0:\n" << slurp(res.ranks[0].log) << "\nrank 1:\n" << slurp(res.ranks[1].log));
    REQUIRE_FALSE(res.timed_out);
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r);
      CHECK(res.ranks[static_cast<size_t>(r)].exit_code == 0);
      const json st = json::parse(slurp(dir + "/" + name + "-" + std::to_string(r) + ".json"));
      CHECK(st["oom_recoveries"] == 0);
      const double predicted = st["predicted_peak_bytes"].get<double>();
      // This rank's own prediction: a sharded plan's ranks hold different shares of the state.
      CHECK(st["predicted_peak_bytes"].get<int64_t>() == predicted_peak_of_rank(p, r));
      if (p.sharding) CHECK(p.sharding->per_rank_peak_bytes.size() == 2);
      const json& windows = st["window_series"];
      REQUIRE(windows.size() == 4);
      for (size_t w = 1; w < windows.size(); ++w) {  // the first window makes the optimizer's state
        const double peak = windows[w]["peak_bytes"].get<double>();
        INFO("window " << w << " peaked at " << peak << " bytes against " << predicted << " predicted");
        CHECK(peak <= 2.0 * 1024 * 1024);
        CHECK(peak <= predicted * 1.01);
        CHECK(peak >= predicted * 0.99);
      }
    }
  }
}
