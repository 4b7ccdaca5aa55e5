// Hostile inputs, round four, on the LibTorch commands: per-rank batches of 1 to 3
// plan and run, lr 0 plans and runs, an empty --packing is refused, and outputs on a full disk
// (/dev/full) are one error line with nothing printed before it: no summary, no table, no plan on
// standard output.
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "cli_stdout.h"

#include "catch_after_torch.h"  // last: after glog's CHECK from LibTorch
#include "cli_expect.h"         // after Catch

using namespace accumplan::test;
using nlohmann::json;

namespace {

std::vector<std::string> main_job(const std::string& target, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--model", "builtin:mlp", "--device", "cpu", "--memory-budget", "2MiB",
                                   "--threads", "2", "--progress", "none", "--target-batch", target};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// One line on stderr, starting "accumplan: error:" and holding `needle`; exit 2.
void expect_one_error_line(const CliResult& r, const std::string& needle) {
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == 2);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.err.rfind("accumplan: error: ", 0) == 0);
  CHECK(r.err.find(needle) != std::string::npos);
}

}  // namespace

TEST_CASE("CLI small plans: target batches 1, 2 and 3 (and 8 over 4 ranks) plan, confirmed, and run",
          "[cli][device][small]") {
  const std::string dir = scratch_dir("round-four-small");
  for (const auto& [target, ranks] : std::vector<std::pair<int, int>>{{1, 1}, {2, 1}, {3, 1}, {8, 4}}) {
    CAPTURE(target, ranks);
    const std::string plan_path = dir + "/plan-" + std::to_string(target) + ".json";
    const CliResult r = run_cli(main_job(std::to_string(target), {"--world-size", std::to_string(ranks), "--out", plan_path}));
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    const json plan = json::parse(slurp(plan_path));
    CHECK(plan["confirmed"] == true);
    CHECK(plan["per_rank_batch"] == target / ranks);
    int64_t sum = 0;
    for (const auto& b : plan["microbatch_sizes"]) sum += b.get<int64_t>();
    CHECK(sum == target / ranks);
    if (ranks == 1) {  // `accumplan run` reads and trains it
      const CliResult run = run_cli({"run", "--plan", plan_path, "--model", "builtin:mlp", "--steps", "2", "--threads",
                                     "2", "--progress", "none"});
      INFO(run.err);
      CHECK(run.exit_code == 0);
    }
  }
}

TEST_CASE("CLI lr 0: the main job plans it and run trains at it; a negative lr is refused", "[cli][device][lr]") {
  const std::string dir = scratch_dir("round-four-lr");
  const std::string plan_path = dir + "/plan.json";
  const CliResult r = run_cli(main_job("16", {"--lr", "0", "--out", plan_path}));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(json::parse(slurp(plan_path))["setup"]["lr"].get<double>() == 0.0);
  const CliResult run = run_cli({"run", "--plan", plan_path, "--model", "builtin:mlp", "--steps", "1", "--lr", "0",
                                 "--threads", "2", "--progress", "none"});
  INFO(run.err);
  CHECK(run.exit_code == 0);
  expect_refusal(dir, main_job("16", {"--lr=-0.001"}), "--lr: -0.001 is out of range [0, 1e+06]");
  expect_refusal(dir, main_job("16", {"--lr", "nan"}), "--lr: nan is out of range");
}

TEST_CASE("CLI empty words: run --packing, --amp, --device, its input paths, verify --device and the main job's --loss, --device '' are refused",
          "[cli][run][packing][empty]") {
  const std::string dir = scratch_dir("round-four-packing");
  const std::string plan_path = dir + "/plan.json";
  REQUIRE(run_cli(main_job("16", {"--out", plan_path})).exit_code == 0);
  const std::vector<std::string> run = {"run", "--plan", plan_path, "--model", "builtin:mlp", "--steps", "1"};
  auto with = [](std::vector<std::string> args, const std::vector<std::string>& more) {
    args.insert(args.end(), more.begin(), more.end());
    return args;
  };
  expect_refusal(dir, with(run, {"--packing", ""}), "--packing must be time or fill, got ''");
  expect_refusal(dir, with(run, {"--amp", ""}), "--amp '' is unknown; use none, bf16 or fp16");
  expect_refusal(dir, with(run, {"--device", ""}), "--device '' is not a device; known devices: cpu, cuda");
  for (const char* input : {"--data", "--eval-data", "--seq-len-file"}) {
    expect_refusal(dir, with(run, {input, ""}), std::string(input) + " is empty; give the path of a file, or drop " + input);
  }
  expect_refusal(dir, {"verify", "--plan", plan_path, "--model", "builtin:mlp", "--device", ""}, "--device '' is not a device");
  expect_refusal(dir, main_job("16", {"--loss", ""}), "--loss '' is unknown; use cross_entropy, mse or model");
  expect_refusal(dir, {"--model", "builtin:mlp", "--target-batch", "16", "--device", ""}, "--device '' is not a device");
  expect_refusal(dir, {"profile", "--model", "builtin:mlp", "--device", ""}, "--device '' is not a device");
}

TEST_CASE("CLI full disk: the main job's --out and --report, and verify's --json, are one line with nothing before it",
          "[cli][device][full]") {
  const std::string dir = scratch_dir("round-four-full");
  // --out on a full disk: no summary of the plan that was never saved.
  CliResult r = run_cli(main_job("16", {"--out", "/dev/full"}));
  expect_one_error_line(r, "(disk full?)");
  CHECK(r.out.empty());
  // --report on a full disk: the plan is not left on standard output.
  r = run_cli(main_job("16", {"--report", "/dev/full"}));
  expect_one_error_line(r, "(disk full?)");
  CHECK(r.out.empty());
  // The plan on a full standard output: one line, no summary.
  r = run_cli_with_stdout("/dev/full", main_job("16"));
  expect_one_error_line(r, "cannot write to standard output: No space left on device");
  // verify --json on a full disk: no table before the error.
  const std::string plan_path = dir + "/plan.json";
  REQUIRE(run_cli(main_job("16", {"--out", plan_path})).exit_code == 0);
  const std::vector<std::string> verify = {"verify", "--plan", plan_path, "--model", "builtin:mlp", "--threads", "2"};
  std::vector<std::string> to_full = verify;
  to_full.insert(to_full.end(), {"--json", "/dev/full"});
  r = run_cli(to_full);
  expect_one_error_line(r, "(disk full?)");
  CHECK(r.out.empty());
  r = run_cli_with_stdout("/dev/full", verify);
  expect_one_error_line(r, "cannot write to standard output");
  // Not full: the table on stdout, exit 0 as before.
  r = run_cli(verify);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK_FALSE(r.out.empty());
}
