// test_cli_tokens.cpp — variable-length sequences end to end through the real binary: profile a
// (b, T) grid with --seq-len, plan a token budget, confirm it, then `accumplan run` the plan on
// synthetic lengths and on a ragged torch.save file under the same budget, packed, without OOM.
//
// What it is not: the packing arithmetic (tests/planner/test_token_model.cpp), the gradient
// equality (test_packing.cpp) or a benchmark; no timing.
#include <torch/script.h>
#include <torch/torch.h>

#include <unistd.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "torch_save_file.h"

// Last: torch/torch.h brings glog's CHECK macro, which would shadow Catch's.
#include "catch_after_torch.h"

using namespace accumplan::test;
using nlohmann::json;

namespace {

const std::vector<std::string> kModel{"--model", "builtin:tinylm", "--input", "int64[B,T]:1000", "--target",
                                      "int64[B,T]:1000", "--device", "cpu", "--threads", "2"};

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

}  // namespace

TEST_CASE("CLI tokens: --seq-len plans a confirmed token budget that run packs under, without OOM",
          "[cli][tokens]") {
  const std::string dir = scratch_dir("cli-tokens-" + std::to_string(::getpid()));
  const std::string plan_path = dir + "/plan.json";
  const CliResult planned = run_cli(with(kModel, {"--seq-len", "16..128", "--target-batch", "48", "--memory-budget",
                                                  "40MiB", "--out", plan_path}));
  INFO(planned.err);
  REQUIRE(planned.exit_code == 0);
  CHECK_THAT(planned.err, Catch::Contains("probe b=2 x T=128"));
  CHECK_THAT(planned.err, Catch::Contains("token budget"));
  const json plan = json::parse(slurp(plan_path));
  CHECK(plan["schema_version"] == schema_version_string());
  REQUIRE(plan.contains("tokens"));
  const int64_t budget_tokens = plan["tokens"]["token_budget"].get<int64_t>();
  CHECK(plan["tokens"]["max_seq_len"] == 128);
  CHECK(budget_tokens >= 128);
  CHECK(plan["confirmed"] == true);
  CHECK(plan["setup"]["seq_len"] == "16..128");
  CHECK(plan["setup"]["inputs"][0] == "int64[B,T]:1000");

  // Synthetic lengths (uniform in 16..128, seeded): packed windows, fewer microbatches than padded.
  const std::string stats_path = dir + "/stats.json";
  const CliResult ran = run_cli({"run", "--model", "builtin:tinylm", "--plan", plan_path, "--device", "cpu",
                                 "--memory-budget", "40MiB", "--threads", "2", "--epochs", "2", "--stats", stats_path});
  INFO(ran.err);
  REQUIRE(ran.exit_code == 0);
  CHECK_THAT(ran.err, Catch::Contains("packed longest first under a token budget of " + std::to_string(budget_tokens)));
  const json stats = json::parse(slurp(stats_path));
  CHECK(stats["oom_recoveries"] == 0);
  CHECK(stats["measured_peak_bytes"].get<int64_t>() <= 40 * 1024 * 1024);
  for (const auto& w : stats["window_series"]) CHECK(w["valid_tokens"].get<int64_t>() > 0);
  // The run's own step times: every window after the first is cut by a fit made from them, and
  // the stats say how each window's microbatch seconds were predicted.
  REQUIRE(stats.contains("time_model"));
  CHECK(stats["time_model"]["packing"] == "time");
  CHECK(stats["time_model"]["refits"].get<int64_t>() >= 1);
  CHECK(stats["time_model"]["microbatches"].get<int64_t>() > 0);
  CHECK(stats["time_model"]["final_cost"]["token_seconds"].get<double>() > 0);
  CHECK(stats["packed_predicted_peak_bytes"].get<int64_t>() > 0);
  for (const auto& w : stats["window_series"]) {
    CHECK(w["microbatch_seconds"].get<double>() > 0);
    CHECK(w["predicted_peak_bytes"].get<int64_t>() > 0);
  }
  CHECK_FALSE(stats["window_series"].back()["predicted_seconds"].is_null());
  // --packing fill: every microbatch filled (at most as many microbatches), no fit; short
  // sequences share microbatches, so windows need fewer than the padded split's.
  const CliResult filled = run_cli({"run", "--model", "builtin:tinylm", "--plan", plan_path, "--device", "cpu",
                                    "--memory-budget", "40MiB", "--threads", "2", "--epochs", "2", "--packing", "FILL",
                                    "--stats", stats_path});
  INFO(filled.err);
  REQUIRE(filled.exit_code == 0);
  const json fill_stats = json::parse(slurp(stats_path));
  CHECK(fill_stats["time_model"]["packing"] == "fill");
  CHECK(fill_stats["time_model"]["refits"] == 0);
  REQUIRE(fill_stats["window_series"].size() == stats["window_series"].size());
  const int64_t padded_k = plan["accumulation_steps"].get<int64_t>();
  int64_t fewer = 0;
  for (size_t i = 0; i < stats["window_series"].size(); ++i) {
    const auto& w = fill_stats["window_series"][i];
    CHECK(w["microbatch_sizes"].size() <= stats["window_series"][i]["microbatch_sizes"].size());
    if (static_cast<int64_t>(w["microbatch_sizes"].size()) < padded_k) ++fewer;
  }
  CHECK(fewer > 0);
  // A bad --packing, or --packing on a plan that packs nothing, is refused before anything runs.
  const CliResult bad_packing = run_cli({"run", "--model", "builtin:tinylm", "--plan", plan_path, "--packing", "fastest"});
  CHECK(bad_packing.exit_code == 2);
  CHECK_THAT(bad_packing.err, Catch::Contains("--packing must be time or fill, got 'fastest'"));

  // A ragged file as Python's torch.save([sequences, None]) writes it: next-token targets.
  std::vector<at::Tensor> seqs;
  torch::manual_seed(3);
  for (int64_t i = 0; i < 48; ++i) seqs.push_back(torch::randint(0, 1000, {16 + (i * 37) % 113}, torch::kLong));
  const std::string data = write_ragged_save(dir + "/tokens.pt", seqs, {});
  const CliResult on_file = run_cli({"run", "--model", "builtin:tinylm", "--plan", plan_path, "--data", data, "--device",
                                     "cpu", "--memory-budget", "40MiB", "--threads", "2", "--stats", stats_path});
  INFO(on_file.err);
  REQUIRE(on_file.exit_code == 0);
  const json file_stats = json::parse(slurp(stats_path));
  CHECK(file_stats["oom_recoveries"] == 0);
  int64_t tokens = 0;
  for (const auto& s : seqs) tokens += s.numel() - 1;  // next-token targets: the last position has none
  CHECK(file_stats["tokens_seen"] == tokens);
}

TEST_CASE("CLI tokens: a saved token profile records the budget and re-plans without --memory-budget", "[cli][tokens]") {
  const std::string dir = scratch_dir("cli-tokens-profile-" + std::to_string(::getpid()));
  const std::string profile_path = dir + "/profile.json";
  const CliResult profiled = run_cli(with({"profile"}, with(kModel, {"--seq-len", "16..128", "--memory-budget", "40MiB",
                                                                      "--out", profile_path})));
  INFO(profiled.err);
  REQUIRE(profiled.exit_code == 0);
  const json profile = json::parse(slurp(profile_path));
  CHECK(profile["device"]["total_bytes"] == 40 * 1024 * 1024);
  const CliResult planned = run_cli({"plan", "--profile", profile_path, "--target-batch", "48"});
  INFO(planned.err);
  REQUIRE(planned.exit_code == 0);
  const json plan = json::parse(planned.out);
  CHECK(plan["tokens"]["max_seq_len"] == 128);
  CHECK(plan["memory"]["budget_bytes"] == 40 * 1024 * 1024);
  // --target-tokens is a planning option of `plan` too; neither target is an error naming both.
  const CliResult by_tokens = run_cli({"plan", "--profile", profile_path, "--target-tokens", "1000"});
  INFO(by_tokens.err);
  REQUIRE(by_tokens.exit_code == 0);
  CHECK(json::parse(by_tokens.out)["tokens"]["target_tokens"] == 1000);
  const CliResult neither = run_cli({"plan", "--profile", profile_path});
  CHECK(neither.exit_code == 2);
  CHECK_THAT(neither.err, Catch::Contains("--target-batch N") && Catch::Contains("--target-tokens N"));
}

TEST_CASE("CLI tokens: sequence options without sequences, or sequences without lengths, are refused", "[cli][tokens][errors]") {
  const CliResult no_len = run_cli(with(kModel, {"--target-batch", "8", "--memory-budget", "40MiB"}));
  CHECK(no_len.exit_code == 2);
  CHECK_THAT(no_len.err, Catch::Contains("has a sequence dimension T: give the lengths to plan for with --seq-len"));
  const CliResult no_t = run_cli({"--model", "builtin:tinylm", "--seq-len", "16..64", "--target-batch", "8", "--device",
                                  "cpu", "--memory-budget", "40MiB"});
  CHECK(no_t.exit_code == 2);
  CHECK_THAT(no_t.err, Catch::Contains("--seq-len 16..64 needs variable-length inputs"));
  const CliResult bad = run_cli(with(kModel, {"--seq-len", "64..16", "--target-batch", "8", "--memory-budget", "40MiB"}));
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Catch::Contains("--seq-len '64..16': the shortest length 64 is above the longest 16"));
}

TEST_CASE("CLI tokens: --target-tokens windows hold the tokens asked for, each sequence once; verify and export follow",
          "[cli][tokens][target-tokens]") {
  const std::string dir = scratch_dir("cli-target-tokens-" + std::to_string(::getpid()));
  const std::string lengths_path = dir + "/lengths.txt";
  std::ofstream(lengths_path) << "# observed lengths\n16\n40, 64\n128\n90\n";
  const std::string plan_path = dir + "/plan.json";
  const CliResult planned = run_cli(with(kModel, {"--seq-len-file", lengths_path, "--target-tokens", "600",
                                                  "--memory-budget", "40MiB", "--out", plan_path}));
  INFO(planned.err);
  REQUIRE(planned.exit_code == 0);
  const json plan = json::parse(slurp(plan_path));
  CHECK(plan["setup"]["seq_len"] == "16..128");  // the file's shortest..longest
  CHECK(plan["tokens"]["target_tokens"] == 600);
  CHECK(plan["target_batch"] == 5);  // ceil(600 / 128) sequences at the longest length

  // run: synthetic lengths drawn from the file; every window but the last holds >= 600 valid
  // tokens and fewer than 600 + 128; the windows tile the data.
  const std::string stats_path = dir + "/stats.json";
  const CliResult ran = run_cli({"run", "--model", "builtin:tinylm", "--plan", plan_path, "--device", "cpu",
                                 "--memory-budget", "40MiB", "--threads", "2", "--seq-len-file", lengths_path,
                                 "--synthetic-samples", "40", "--stats", stats_path});
  INFO(ran.err);
  REQUIRE(ran.exit_code == 0);
  CHECK_THAT(ran.err, Catch::Contains("windows of at least 600 valid tokens"));
  const json stats = json::parse(slurp(stats_path));
  CHECK(stats["oom_recoveries"] == 0);
  CHECK(stats["samples_seen"] == 40);
  const auto& series = stats["window_series"];
  REQUIRE(series.size() >= 2);
  int64_t samples = 0;
  for (size_t i = 0; i < series.size(); ++i) {
    samples += series[i]["samples"].get<int64_t>();
    if (i + 1 < series.size()) {
      CHECK(series[i]["valid_tokens"].get<int64_t>() >= 600);
      CHECK(series[i]["valid_tokens"].get<int64_t>() < 600 + 128);
    }
  }
  CHECK(samples == 40);

  // verify: the packed window against one combined forward, as it trains.
  const CliResult verified = run_cli({"verify", "--model", "builtin:tinylm", "--plan", plan_path, "--device", "cpu",
                                      "--threads", "2"});
  INFO(verified.out);
  CHECK(verified.exit_code == 0);
  CHECK_THAT(verified.out, Catch::Contains("packed-tight"));

  // export: a trainer that cuts windows by samples cannot express tokens; torchrun runs the plan.
  const CliResult hf = run_cli({"export", "--plan", plan_path, "--to", "hf"});
  CHECK(hf.exit_code == 2);
  CHECK_THAT(hf.err, Catch::Contains("600 valid tokens") && Catch::Contains("cuts windows by samples"));
  const CliResult torchrun = run_cli({"export", "--plan", plan_path, "--to", "torchrun"});
  CHECK(torchrun.exit_code == 0);
  CHECK_THAT(torchrun.out, Catch::Contains("windows of at least 600 valid tokens"));

  const CliResult both = run_cli(with(kModel, {"--seq-len", "16..64", "--seq-len-file", lengths_path, "--target-batch",
                                               "8", "--memory-budget", "40MiB"}));
  CHECK(both.exit_code == 2);
  CHECK_THAT(both.err, Catch::Contains("not both"));
  const CliResult fixed = run_cli({"--model", "builtin:tinylm", "--target-tokens", "600", "--device", "cpu",
                                   "--memory-budget", "40MiB"});
  CHECK(fixed.exit_code == 2);
  CHECK_THAT(fixed.err, Catch::Contains("--target-tokens 600 counts the tokens of variable-length data"));
}

TEST_CASE("CLI tokens: after an OOM re-pack, the written plan is the re-packed one", "[cli][tokens][oom]") {
  const std::string dir = scratch_dir("cli-tokens-repack-" + std::to_string(::getpid()));
  const std::string plan_path = dir + "/plan.json";
  const CliResult planned = run_cli(with(kModel, {"--seq-len", "64..128", "--target-batch", "48", "--memory-budget",
                                                  "40MiB", "--out", plan_path}));
  INFO(planned.err);
  REQUIRE(planned.exit_code == 0);
  const json plan = json::parse(slurp(plan_path));
  // Run under less memory than planned: the executor lowers the token budget and replays. Filled
  // microbatches (--packing fill) reach the budget; cut by time they may stay below it.
  const std::string out_path = dir + "/replanned.json";
  const CliResult ran = run_cli({"run", "--model", "builtin:tinylm", "--plan", plan_path, "--device", "cpu",
                                 "--memory-budget", "30MiB", "--threads", "2", "--packing", "fill", "--plan-out", out_path});
  INFO(ran.err);
  REQUIRE(ran.exit_code == 0);
  REQUIRE_THAT(ran.err, Catch::Contains("token budget lowered"));
  const json after = json::parse(slurp(out_path));
  const int64_t budget = after["tokens"]["token_budget"].get<int64_t>();
  CHECK(budget < plan["tokens"]["token_budget"].get<int64_t>());
  CHECK(after["tokens"]["max_seq_len"].get<int64_t>() <= budget);
  // The sample fields and the prediction follow the new budget, not the old one.
  CHECK(after["micro_batch"].get<int64_t>() <= budget / after["tokens"]["max_seq_len"].get<int64_t>());
  CHECK(after["memory"]["predicted_peak_bytes"].get<int64_t>() < plan["memory"]["predicted_peak_bytes"].get<int64_t>());
  CHECK_THAT(after["reason"].get<std::string>(), Catch::Contains("Re-packed during training"));
}
