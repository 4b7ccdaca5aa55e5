// `accumplan --model ... --target-batch N` and `accumplan profile` as a user runs them, on the
// CPU counting probe: exit codes, JSON on stdout or --out, summary and progress on stderr, and
// every bad-input case with its message.
#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli_runner.h"

#include "catch_after_torch.h"  // last: after glog's CHECK from LibTorch
#include "cli_expect.h"        // after Catch

using namespace accumplan::test;
using nlohmann::json;

namespace {

const std::vector<std::string> kMlp = {"--model", "builtin:mlp", "--device", "cpu", "--target-batch", "512"};

std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

}  // namespace

TEST_CASE("CLI main job: profiles, plans and confirms; plan JSON on stdout, summary on stderr", "[cli][device]") {
  const CliResult r = run_cli(with(kMlp, {"--memory-budget", "2MiB", "--optimizer", "adam", "--threads", "2"}));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const json plan = json::parse(r.out);
  CHECK(plan["schema"] == "accumplan.plan");
  CHECK(plan["confirmed"] == true);
  CHECK(plan["accumulation_steps"].get<int>() > 1);  // 2 MiB does not hold 512 samples of the MLP
  CHECK(plan["confirmed_peak_bytes"].get<int64_t>() <= 2 * 1024 * 1024);
  CHECK(plan["model"]["sha256"].get<std::string>().size() == 64);
  CHECK(plan["setup"]["optimizer"] == "adam");
  CHECK(plan["setup"]["inputs"][0] == "float32[B,64]");  // the built-in's default spec
  const std::string last = plan["profile"]["trials"].back()["kind"];
  CHECK((last == "confirm" || last == "climb"));
  CHECK(plan["memory"]["margin"]["headroom"] == "auto");
  CHECK(plan["memory"]["margin"]["measured"] == true);
  CHECK(r.err.find("probe b=4: peak") != std::string::npos);
  CHECK(r.err.find("confirm b=") != std::string::npos);
  CHECK(r.err.find("predicted peak") != std::string::npos);
  CHECK(r.err.find("real windows run") != std::string::npos);
}

TEST_CASE("CLI profile: writes a profile that `accumplan plan` re-plans without the device", "[cli][device]") {
  const std::string dir = scratch_dir("cli-profile");
  const CliResult r = run_cli({"profile", "--model", "builtin:convnet", "--device", "cpu", "--memory-budget", "64MiB",
                               "--momentum", "0.8", "--optimizer", "momentum", "--out", dir + "/profile.json"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.empty());
  const json profile = json::parse(slurp(dir + "/profile.json"));
  CHECK(profile["schema"] == "accumplan.profile");
  CHECK(profile["points"].size() >= 2);  // 2, 4 and perhaps one or two nearer the budget's maximum
  CHECK(profile["model"]["batch_dependent_layers"][0] == "bn1 (BatchNorm2d)");
  CHECK(profile["setup"]["hyperparameters"]["momentum"] == 0.8);
  CHECK(profile["persistent"]["optimizer_state_bytes"] == profile["persistent"]["gradients_bytes"]);
  const CliResult p = run_cli({"plan", "--profile", dir + "/profile.json", "--target-batch", "256"});
  INFO(p.err);
  CHECK(p.exit_code == 0);
  CHECK(json::parse(p.out)["confirmed"] == false);
}

TEST_CASE("CLI: a budget below persistent memory gives the breakdown and exit 2", "[cli][device][errors]") {
  // builtin:mlp holds 84,234 parameters: 337 KiB each for weights, gradients and two Adam buffers.
  expect_input_error(with(kMlp, {"--memory-budget", "1MiB", "--optimizer", "adam"}), "persistent memory alone is");
}

TEST_CASE("CLI: bad input exits 2 with a message naming the problem", "[cli][device][errors]") {
  expect_input_error({"--model", "/nonexistent/m.pt", "--target-batch", "8", "--device", "cpu", "--input",
                      "float32[B,4]", "--target", "int64[B]:2"},
                     "cannot open model file '/nonexistent/m.pt'");
  const std::string dir = scratch_dir("cli-bad");
  std::ofstream(dir + "/notes.pt") << "not a model";
  expect_input_error({"--model", dir + "/notes.pt", "--target-batch", "8", "--device", "cpu", "--input", "float32[B,4]",
                      "--target", "int64[B]:2"},
                     "is not a TorchScript model");
  expect_input_error(with(kMlp, {"--input", "float32[B,3"}), "float32[B,3");
  expect_input_error(with(kMlp, {"--input", "float33[B]"}), "float33");
  expect_input_error(with(kMlp, {"--input", "int64[B]:0"}), "int64[B]:0");
  // A spec the model rejects: the MLP multiplies by a 256x64 weight; the model's own error shows.
  expect_input_error(with(kMlp, {"--input", "float32[B,3]"}), "mat1 and mat2 shapes cannot be multiplied");
  expect_input_error(with(kMlp, {"--optimizer", "lion"}), "--optimizer 'lion' is unknown");
  expect_input_error(with(kMlp, {"--loss", "hinge"}), "--loss 'hinge' is unknown");
  expect_input_error({"--model", "builtin:mlp", "--target-batch", "8", "--device", "cuda"}, "CUDA");
  expect_input_error({"--model", "builtin:nope", "--target-batch", "8"}, "is not a built-in example");
  expect_input_error({"--model", "builtin:mlp", "--device", "cpu"}, "--target-batch is required");
  expect_input_error(with(kMlp, {"--world-size", "3"}), "not divisible");
  expect_input_error(with(kMlp, {"--memory-budget", "12 GiB"}), "is not a size");
  expect_input_error(with(kMlp, {"--headroom", "1.5"}), "--headroom '1.5': a fraction must be in [0, 1]");
  expect_input_error(with(kMlp, {"--max-micro-batch", "-1"}), "--max-micro-batch must be at least 1, got -1");
  expect_input_error(with(kMlp, {"--memory-budget", "2MiB", "--multiple-of", "0"}), "--multiple-of must be at least 1, got 0");
}

TEST_CASE("CLI main job: --use-timing weighs the measured step times and the reason says what came of it",
          "[cli][device][timing]") {
  const CliResult r = run_cli(with(kMlp, {"--memory-budget", "2MiB", "--threads", "2", "--use-timing"}));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const std::string reason = json::parse(r.out)["reason"];
  // Either outcome is legitimate (step times vary with the machine's load); silence is not.
  const bool used = reason.find("with --use-timing, measured step times predict") != std::string::npos;
  const bool weighed = reason.find("--use-timing found no split predicted at least 10% faster") != std::string::npos;
  CHECK((used || weighed));
  const CliResult plain = run_cli(with(kMlp, {"--memory-budget", "2MiB", "--threads", "2"}));
  REQUIRE(plain.exit_code == 0);
  CHECK(json::parse(plain.out)["reason"].get<std::string>().find("timing") == std::string::npos);
}

TEST_CASE("CLI: `accumplan plan` still parses beside the root job's options", "[cli][device]") {
  const CliResult r = run_cli({"plan", "--profile", source_path("tests/golden/profile.json"), "--target-batch", "64"});
  INFO(r.err);
  CHECK(r.exit_code == 0);
  const CliResult help = run_cli({"--help"});
  CHECK(help.exit_code == 0);
  CHECK(help.out.find("--target-batch") != std::string::npos);
  CHECK(help.out.find("builtin:convnet") != std::string::npos);
}

TEST_CASE("CLI front: plan works without accumplan-device; a device command without it is one line naming it",
          "[cli][front]") {
  // build/accumplan alone in a folder: the torch-free front, without the executable it hands the
  // device commands to.
  const std::string dir = scratch_dir("front-alone");
  const std::string front = dir + "/accumplan";
  std::filesystem::copy_file(ACCUMPLAN_BIN, front);
  const CliResult plan = run_binary(front, {"plan", "--profile", kProfile, "--target-batch", "64"});
  INFO(plan.err);
  CHECK(plan.exit_code == 0);
  CHECK(json::parse(plan.out)["schema"] == "accumplan.plan");
  CHECK(run_binary(front, {"--version"}).exit_code == 0);
  for (const std::vector<std::string>& args : {std::vector<std::string>{"run", "--help"}, {"--model", "builtin:mlp"}}) {
    const CliResult r = run_binary(front, args);
    INFO(r.err);
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("accumplan-device") != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
  // Beside it again, the same command line is the whole CLI's.
  std::filesystem::copy_file(std::filesystem::path(ACCUMPLAN_BIN).parent_path() / "accumplan-device",
                             dir + "/accumplan-device");
  CHECK(run_binary(front, {"run", "--help"}).out == run_cli({"run", "--help"}).out);
}
