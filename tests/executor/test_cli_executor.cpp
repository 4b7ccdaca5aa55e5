// test_cli_executor.cpp — `accumplan run` and `accumplan verify` end to end, through the real
// binary: a plan made by `accumplan --model builtin:mlp` under a CPU budget runs under that budget
// without OOM and reports its measured peak next to the prediction; a tighter budget recovers by
// re-planning; epochs count windows; verify passes on an MLP and warns (exit 3) on BatchNorm;
// bad input exits 2 with a clear message.
//
// What it is not: a test of the planner's or profiler's numbers (their own tests), nor timing.
#include <torch/script.h>
#include <torch/torch.h>

#include <fstream>
#include <stdexcept>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "mlp_plan_fixture.h"
#include "executor_fixtures.h"
#include "torch_save_file.h"

// Last: torch/torch.h brings glog's CHECK macro, which would shadow Catch's.
#include "catch_after_torch.h"

#include "cli_expect.h"  // after Catch

using namespace accumplan::test;
using nlohmann::json;

namespace {

std::string write_json(const std::string& path, const json& j) {
  std::ofstream(path) << j.dump(2);
  return path;
}

}  // namespace

TEST_CASE("run executes a plan from `accumplan --model` under the same CPU budget, peak next to prediction",
          "[cli][run]") {
  const MlpPlan& f = mlp_plan();
  const std::vector<int64_t> planned = f.plan_json["microbatch_sizes"].get<std::vector<int64_t>>();
  REQUIRE(planned.size() >= 2);  // the budget forces accumulation, or this test shows nothing
  const std::string stats = f.dir + "/stats.json", saved = f.dir + "/trained.pt";
  const CliResult r = run_cli({"run", "--plan", f.plan, "--model", "builtin:mlp", "--memory-budget", kMlpBudget, "--steps", "3",
                               "--threads", "2", "--stats", stats, "--save", saved});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const json s = json::parse(slurp(stats));
  CHECK(s["oom_recoveries"] == 0);
  CHECK(s["windows"] == 3);
  CHECK(s["optimizer_steps"] == 3);
  CHECK(s["skipped_steps"] == 0);
  CHECK(s["samples_seen"] == 3 * kMlpTarget);
  CHECK(s["microbatch_sizes"].get<std::vector<int64_t>>() == planned);
  CHECK(s["normalization"] == "samples");
  const int64_t measured = s["measured_peak_bytes"], predicted = s["predicted_peak_bytes"], budget = s["budget_bytes"];
  CHECK(predicted == f.plan_json["memory"]["predicted_peak_bytes"].get<int64_t>());
  CHECK(measured > 0);
  CHECK(measured <= budget);
  report("run builtin:mlp " + std::to_string(kMlpTarget) + " = " + f.plan_json["microbatch_sizes"].dump() + ": measured/predicted peak",
         static_cast<double>(measured) / static_cast<double>(predicted));
  CHECK(std::abs(static_cast<double>(measured) / static_cast<double>(predicted) - 1.0) < 0.10);
  CHECK(s["mean_window_seconds"].get<double>() > 0);
  CHECK(r.err.find("measured peak") != std::string::npos);
  // The trained model is a loadable TorchScript module whose weights moved.
  const auto trained = torch::jit::load(saved);
  CHECK(trained.parameters().size() > 0);
}

TEST_CASE("run under a tighter budget recovers from OOM by re-planning and writes the new plan", "[cli][run][oom]") {
  const MlpPlan& f = mlp_plan();
  const int64_t m = f.plan_json["micro_batch"];
  const int64_t m_max = f.plan_json["max_micro_batch"];
  REQUIRE(f.plan_json["accumulation_steps"].get<int64_t>() == (kMlpTarget + m_max - 1) / m_max);  // the fewest
  REQUIRE(m > 6);
  const double intercept = f.plan_json["fit"]["intercept_bytes"], slope = f.plan_json["fit"]["slope_bytes_per_sample"];
  // Six samples' worth below the planned microbatch's prediction: the planned size cannot fit,
  // sizes of m - 6 and below can (about 20 KiB of margin either way).
  const auto budget = static_cast<int64_t>(intercept + slope * static_cast<double>(m - 6));
  const std::string stats = f.dir + "/stats-oom.json", plan_out = f.dir + "/replanned.json";
  const CliResult r = run_cli({"run", "--plan", f.plan, "--model", "builtin:mlp", "--memory-budget", std::to_string(budget),
                               "--steps", "2", "--threads", "2", "--stats", stats, "--plan-out", plan_out});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const json s = json::parse(slurp(stats));
  CHECK(s["oom_recoveries"].get<int64_t>() >= 1);
  CHECK(s["samples_seen"] == 2 * kMlpTarget);
  CHECK(s["optimizer_steps"] == 2);
  const auto sizes = s["microbatch_sizes"].get<std::vector<int64_t>>();
  CHECK(*std::max_element(sizes.begin(), sizes.end()) < m);
  CHECK(r.err.find("out of memory in window 0 at microbatch") != std::string::npos);
  const json p = json::parse(slurp(plan_out));
  CHECK(p["microbatch_sizes"].get<std::vector<int64_t>>() == sizes);
  CHECK(p["confirmed"] == true);
  CHECK(p["per_rank_batch"] == kMlpTarget);
}

TEST_CASE("run over a data file: epochs of ceil(N/B) windows, the last one short", "[cli][run][epoch]") {
  const MlpPlan& f = mlp_plan();
  torch::manual_seed(3);
  const int64_t n = 2 * kMlpTarget + 88;
  const std::string data = write_torch_save(f.dir + "/data.pt", {torch::randn({n, 64}), torch::randint(0, 10, {n}, torch::kLong)});
  const std::string stats = f.dir + "/stats-epochs.json";
  const CliResult r = run_cli({"run", "--plan", f.plan, "--model", "builtin:mlp", "--data", data, "--epochs", "2", "--threads",
                               "2", "--stats", stats});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const json s = json::parse(slurp(stats));
  CHECK(s["windows"] == 6);          // kMlpTarget, kMlpTarget, 88 per epoch
  CHECK(s["optimizer_steps"] == 6);  // 2 * ceil(n / kMlpTarget)
  CHECK(s["samples_seen"] == 2 * n);
}

TEST_CASE("CLI outputs: every output is checked before measuring or training; nothing is replaced",
          "[cli][outputs][errors]") {
  const MlpPlan& f = mlp_plan();
  const std::string dir = scratch_dir("executor-outputs-" + std::to_string(::getpid()));
  const std::string old_plan = dir + "/plan.json";
  std::ofstream(old_plan) << "an earlier plan";
  const std::vector<std::string> job = {"--model", "builtin:mlp", "--target-batch", "64", "--device", "cpu",
                                        "--memory-budget", kMlpBudget, "--threads", "2"};
  auto with = [](std::vector<std::string> a, const std::vector<std::string>& extra) {
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  // The main job: a --report into a missing directory is found before measuring, and --out is
  // not replaced.
  expect_refusal(dir, with(job, {"--out", old_plan, "--report", dir + "/no-such-dir/r.html"}), "no such directory");
  CHECK(slurp(old_plan) == "an earlier plan");
  expect_refusal(dir, with(job, {"--out", old_plan, "--report", old_plan}), "name the same file");
  expect_refusal(dir, with(job, {"--report", "-"}), "--out and --report would both write to standard output");
  // run: --trace '' was ignored; a bad --trace was found after training and writing --plan-out.
  const std::vector<std::string> run = {"run", "--plan", f.plan, "--model", "builtin:mlp", "--steps", "1", "--threads", "2"};
  expect_refusal(dir, with(run, {"--trace", ""}), "--trace '': an empty path");
  expect_refusal(dir, with(run, {"--plan-out", dir + "/p.json", "--trace", dir + "/missing/t.json"}), "no such directory");
  expect_refusal(dir, with(run, {"--stats", "-", "--trace", "-"}), "both write to standard output");
  expect_refusal(dir, with(run, {"--plan-out", f.plan}), "is the --plan file it is made from");
  // verify: the table was printed, then --json failed.
  const std::vector<std::string> verify = {"verify", "--plan", f.plan, "--model", "builtin:mlp", "--threads", "2"};
  expect_refusal(dir, with(verify, {"--json", dir + "/missing/v.json"}), "no such directory");
  expect_refusal(dir, with(verify, {"--json", "-"}), "the verification table and --json would both write to standard output");
}

TEST_CASE("CLI: --ignore-index outside what a plan's reader accepts is refused before measuring", "[cli][errors]") {
  const std::string dir = scratch_dir("ignore-index-" + std::to_string(::getpid()));
  expect_refusal(dir,
                 {"--model", "builtin:mlp", "--target-batch", "64", "--device", "cpu", "--memory-budget", kMlpBudget,
                  "--ignore-index", "4294967296", "--out", dir + "/plan.json"},
                 "--ignore-index");
}

TEST_CASE("run refuses bad input with exit code 2 and a clear message", "[cli][run][errors]") {
  const MlpPlan& f = mlp_plan();
  auto run = [&](const std::string& plan, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"run", "--plan", plan, "--model", "builtin:mlp", "--steps", "1", "--threads", "2"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_cli(args);
  };
  SECTION("a document of another schema") {
    json j = f.plan_json;
    j["schema"] = "accumplan.profile";
    const CliResult r = run(write_json(f.dir + "/wrong-schema.json", j));
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("schema") != std::string::npos);
  }
  SECTION("a future major version") {
    json j = f.plan_json;
    j["schema_version"] = "2.0";
    const CliResult r = run(write_json(f.dir + "/future.json", j));
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("2.0") != std::string::npos);
  }
  SECTION("a model whose SHA-256 is not the plan's, unless --force") {
    json j = f.plan_json;
    j["model"]["sha256"] = std::string(64, '0');
    const std::string path = write_json(f.dir + "/other-model.json", j);
    const CliResult r = run(path);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("SHA-256") != std::string::npos);
    CHECK(r.err.find("--force") != std::string::npos);
    const CliResult forced = run(path, {"--force"});
    CHECK(forced.exit_code == 0);
    CHECK(forced.err.find("running anyway (--force)") != std::string::npos);
  }
  SECTION("a data file whose shapes do not match the plan's inputs") {
    const std::string data = write_torch_save(f.dir + "/bad-shape.pt", {torch::randn({10, 63}), torch::randint(0, 10, {10}, torch::kLong)});
    const CliResult r = run(f.plan, {"--data", data});
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("--data") != std::string::npos);
    CHECK(r.err.find("float32[B,64]") != std::string::npos);
  }
  SECTION("a data file whose tensors disagree on the sample count") {
    const std::string data = write_torch_save(f.dir + "/bad-count.pt", {torch::randn({10, 64}), torch::randint(0, 10, {9}, torch::kLong)});
    const CliResult r = run(f.plan, {"--data", data});
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("--data") != std::string::npos);
  }
  SECTION("--packing on a plan that splits fixed-size samples") {
    const CliResult r = run(f.plan, {"--packing", "fill"});
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("--packing applies to plans that pack variable-length data by tokens") != std::string::npos);
    CHECK(r.err.find("drop --packing") != std::string::npos);
  }
  SECTION("--steps 0") {
    const CliResult r = run_cli({"run", "--plan", f.plan, "--model", "builtin:mlp", "--steps", "0"});
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("--steps (optimizer windows to run): 0 is out of range") != std::string::npos);
  }
}

TEST_CASE("verify: accumulated equals combined on an MLP — BatchNorm is warned about and differs", "[cli][verify]") {
  const MlpPlan& f = mlp_plan();
  const std::string out = f.dir + "/verify.json";
  const CliResult ok = run_cli({"verify", "--plan", f.plan, "--model", "builtin:mlp", "--threads", "2", "--json", out});
  INFO(ok.err);
  REQUIRE(ok.exit_code == 0);
  CHECK(ok.out.find("verify: accumulated updates equal combined-batch updates") != std::string::npos);
  const json v = json::parse(slurp(out));
  CHECK(v["pass"] == true);
  int ran = 0;
  for (const auto& s : v["scenarios"]) {
    if (!s["ran"].get<bool>()) continue;
    ++ran;
    CHECK(s["grad_max_rel_diff"].get<double>() <= 1e-5);
    CHECK(s["accumulated_optimizer_steps"] == 1);
    report("verify builtin:mlp " + s["name"].get<std::string>() + ": grad max rel diff", s["grad_max_rel_diff"].get<double>());
  }
  CHECK(ran == 3);  // equal, unequal, partial; token-masks needs a per-token target

  // builtin:convnet has a BatchNorm2d: the plan is the MLP's with convnet's inputs and a small
  // window (verification needs no profile), run with --force since the hash is the MLP's.
  json j = f.plan_json;
  j["target_batch"] = 6;
  j["per_rank_batch"] = 6;
  j["microbatch_sizes"] = {3, 3};
  j["weights"] = {0.5, 0.5};
  j["micro_batch"] = 3;
  j["max_micro_batch"] = 3;
  j["accumulation_steps"] = 2;
  j["uniform"] = {{"micro_batch", 3}, {"accumulation_steps", 2}};  // readers check it makes per_rank_batch
  j["setup"]["inputs"] = {"float32[B,3,32,32]"};
  j["setup"]["target"] = "int64[B]:10";
  const std::string cplan = write_json(f.dir + "/convnet-plan.json", j);
  const CliResult bn = run_cli({"verify", "--plan", cplan, "--model", "builtin:convnet", "--force", "--threads", "2"});
  INFO(bn.err);
  CHECK(bn.exit_code == 3);
  CHECK(bn.err.find("batch-dependent layers") != std::string::npos);
  CHECK(bn.err.find("BatchNorm") != std::string::npos);
  CHECK(bn.out.find("DIFFERS") != std::string::npos);
  // The warning is said once, on stderr, not again in the table on stdout.
  const std::string warning = "the model has batch-dependent layers";
  CHECK(bn.out.find(warning) == std::string::npos);
  CHECK(bn.err.find(warning) != std::string::npos);
  CHECK(bn.err.find(warning, bn.err.find(warning) + 1) == std::string::npos);
  // With those layers in eval mode the same check is of the weighting alone, and passes: the
  // differences fall from above 1e-3 to float32 summation noise (about 1e-5 on a conv bias, the
  // convolution sums in another order at another batch size), hence --rtol 1e-4.
  const CliResult frozen = run_cli({"verify", "--plan", cplan, "--model", "builtin:convnet", "--force", "--threads", "2",
                                    "--freeze-batch-dependent", "--rtol", "1e-4"});
  INFO(frozen.err);
  CHECK(frozen.exit_code == 0);
  CHECK(frozen.out.find("verify: accumulated updates equal combined-batch updates") != std::string::npos);
  CHECK(frozen.err.find("ran in eval mode for this check") != std::string::npos);
}

TEST_CASE("run --eval-data: the planned eval microbatch, the same mean loss after a forced out-of-memory re-split",
          "[cli][run][eval]") {
  const MlpPlan& f = mlp_plan();
  REQUIRE(f.plan_json.contains("eval"));
  const json& e = f.plan_json["eval"];
  const int64_t eval_micro = e["micro_batch"];
  CHECK(eval_micro > f.plan_json["micro_batch"].get<int64_t>());  // no graph kept: larger than training's
  torch::manual_seed(31);
  const std::string data = write_torch_save(f.dir + "/eval.pt", {torch::randn({700, 64}), torch::randint(0, 10, {700})});
  auto run_with = [&](const std::string& budget, const std::string& stats) {
    const CliResult r = run_cli({"run", "--plan", f.plan, "--model", "builtin:mlp", "--memory-budget", budget, "--steps",
                                 "2", "--eval-data", data, "--eval-every", "1", "--threads", "2", "--stats", stats});
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(r.err.find("eval after window 2: mean loss") != std::string::npos);
    return json::parse(slurp(stats));
  };
  const json planned = run_with(kMlpBudget, f.dir + "/eval-stats.json");
  REQUIRE(planned["evaluations"].size() == 2);
  const json& last = planned["evaluations"][1];
  CHECK(last["after_window"] == 1);
  CHECK(last["samples"] == 700);
  CHECK(last["oom_recoveries"] == 0);
  CHECK(last["microbatch_sizes"][0] == eval_micro);
  // The measured eval peak is the plan's prediction (the same loop measured it), within the budget.
  const int64_t peak = last["peak_bytes"], predicted = e["predicted_peak_bytes"];
  CHECK(std::abs(peak - predicted) <= predicted / 100);
  // A budget between the training window's peak and the eval peak: training runs as planned, the
  // evaluation runs out of memory and re-splits, and its mean loss is the same number.
  const int64_t train_peak = f.plan_json["confirmed_peak_bytes"];
  REQUIRE(predicted - train_peak >= 2048);
  const json tight = run_with(std::to_string((train_peak + predicted) / 2), f.dir + "/eval-stats-tight.json");
  CHECK(tight["oom_recoveries"] == 0);  // the training windows
  const json& again = tight["evaluations"][1];
  CHECK(again["oom_recoveries"].get<int64_t>() >= 1);
  CHECK(again["microbatch_sizes"][0].get<int64_t>() < eval_micro);
  CHECK(std::abs(again["loss"].get<double>() - last["loss"].get<double>()) <= 1e-6);
}

TEST_CASE("CLI: --eval-every without --eval-data, and --eval-keep-outputs with --no-eval, are refused", "[cli][eval][errors]") {
  const MlpPlan& f = mlp_plan();
  const CliResult r = run_cli({"run", "--plan", f.plan, "--model", "builtin:mlp", "--eval-every", "2"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("--eval-every evaluates --eval-data FILE") != std::string::npos);
  const CliResult both = run_cli({"--model", "builtin:mlp", "--target-batch", "8", "--no-eval", "--eval-keep-outputs"});
  CHECK(both.exit_code != 0);
  CHECK(both.err.find("--no-eval excludes --eval-keep-outputs") != std::string::npos);
}

TEST_CASE("profile then plan: the profile's eval window gives the plan an eval batch a real evaluation fits",
          "[cli][eval][profile]") {
  const std::string dir = scratch_dir("eval-profile-" + std::to_string(::getpid()));
  const std::string prof = dir + "/profile.json", plan = dir + "/plan.json", bare = dir + "/bare.json";
  const CliResult p = run_cli({"profile", "--model", "builtin:mlp", "--device", "cpu", "--memory-budget", kMlpBudget,
                               "--threads", "2", "--out", prof});
  INFO(p.err);
  REQUIRE(p.exit_code == 0);
  const json profile = json::parse(slurp(prof));
  REQUIRE(profile.contains("eval"));
  CHECK(profile["eval"]["points"].size() == 2);
  CHECK(profile["eval"]["trials"].size() == 1);
  const CliResult q = run_cli({"plan", "--profile", prof, "--target-batch", std::to_string(kMlpTarget), "--out", plan});
  INFO(q.err);
  REQUIRE(q.exit_code == 0);
  const json planned = json::parse(slurp(plan));
  REQUIRE(planned.contains("eval"));
  const int64_t eval_micro = planned["eval"]["micro_batch"];
  CHECK(eval_micro > planned["micro_batch"].get<int64_t>());
  CHECK(planned["eval"]["predicted_peak_bytes"].get<int64_t>() <= planned["memory"]["usable_bytes"].get<int64_t>());
  // The line's size, run for real: an evaluation at it fits the budget, at the predicted peak.
  torch::manual_seed(32);
  const std::string data = write_torch_save(dir + "/eval.pt", {torch::randn({eval_micro, 64}), torch::randint(0, 10, {eval_micro})});
  const CliResult r = run_cli({"run", "--plan", plan, "--model", "builtin:mlp", "--memory-budget", kMlpBudget, "--steps", "1",
                               "--eval-data", data, "--threads", "2", "--stats", dir + "/stats.json"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const json ev = json::parse(slurp(dir + "/stats.json"))["evaluations"][0];
  CHECK(ev["oom_recoveries"] == 0);
  const int64_t predicted = planned["eval"]["predicted_peak_bytes"];
  CHECK(std::abs(ev["peak_bytes"].get<int64_t>() - predicted) <= predicted / 100);
  // --no-eval: no eval window, no eval batch.
  REQUIRE(run_cli({"profile", "--model", "builtin:mlp", "--device", "cpu", "--memory-budget", kMlpBudget, "--no-eval",
                   "--threads", "2", "--out", bare}).exit_code == 0);
  CHECK_FALSE(json::parse(slurp(bare)).contains("eval"));
}

TEST_CASE("CLI: activation checkpointing needs the Python module: run refuses such a plan, the main job the option",
          "[cli][checkpoint][errors]") {
  const MlpPlan& f = mlp_plan();
  json doc = f.plan_json;
  doc["checkpoint"] = {{"modules", {"layers.1"}},
                       {"rule", "every 2nd block"},
                       {"saved_bytes_per_sample", 1000},
                       {"recompute_seconds", 0.1},
                       {"predicted_seconds_per_window", 1.0},
                       {"without", {{"micro_batch", 8}, {"accumulation_steps", 32}, {"predicted_peak_bytes", 1000},
                                    {"predicted_seconds_per_window", 0.9}}},
                       {"candidates", {{{"name", "layers.0"}, {"saved_bytes_per_sample", 1000}, {"forward_seconds_per_sample", 0.001}},
                                       {{"name", "layers.1"}, {"saved_bytes_per_sample", 1000}, {"forward_seconds_per_sample", 0.001}}}}};
  const std::string path = write_json(f.dir + "/checkpointed.json", doc);
  const CliResult r = run_cli({"run", "--plan", path, "--model", "builtin:mlp", "--steps", "1"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("activation checkpointing of layers.1, which needs the Python module") != std::string::npos);
  const CliResult m = run_cli({"--model", "builtin:mlp", "--target-batch", "8", "--checkpointing", "auto"});
  CHECK(m.exit_code == 2);
  CHECK(m.err.find("--checkpointing auto: activation checkpointing needs the Python module") != std::string::npos);
  CHECK(m.err.find("measured") == std::string::npos);  // refused before anything ran
}
