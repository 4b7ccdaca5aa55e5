// `accumplan plan` and `accumplan export` as a user runs them: exit codes, stdout, stderr, files.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli_expect.h"  // after Catch
#include "cli_runner.h"

using namespace accumplan::test;
using nlohmann::json;


TEST_CASE("CLI plan: writes plan JSON to stdout and a summary to stderr", "[cli][plan]") {
  const CliResult r = run_cli({"plan", "--profile", kProfile, "--target-batch", "256"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const json plan = json::parse(r.out);
  CHECK(plan["schema"] == "accumplan.plan");
  CHECK(plan["target_batch"] == 256);
  CHECK(r.err.find("predicted peak") != std::string::npos);
  CHECK(r.err.find("batch-dependent") != std::string::npos);  // the profile lists a BatchNorm
}

TEST_CASE("CLI plan: --out writes the file atomically and leaves no temp file", "[cli][plan]") {
  const std::string dir = scratch_dir("plan-out");
  const std::string out = dir + "/plan.json";
  // The golden profile's windows made no gradient exchange: a plan for two ranks is refused, naming the fix.
  const CliResult two = run_cli({"plan", "--profile", kProfile, "--target-batch", "512", "--memory-budget", "90%",
                                 "--world-size", "2", "--out", out});
  CHECK(two.exit_code == 2);
  CHECK(two.err.find("profile again with --world-size 2") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(out));
  const CliResult r = run_cli({"plan", "--profile", kProfile, "--target-batch", "512", "--memory-budget",
                               "90%", "--out", out});
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.empty());
  const json plan = json::parse(slurp(out));
  CHECK(plan["world_size"] == 1);
  CHECK(plan["per_rank_batch"] == 512);
  CHECK(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator{}) == 1);
}

TEST_CASE("CLI plan: memory alone decides by default; --use-timing adds microbatches at a throughput cliff",
          "[cli][plan][timing]") {
  // The golden profile with its largest point made 3x slower per sample: 8 costs 0.393 s, so
  // microbatches of 4 (0.068 s) win by far with --use-timing; by default the fewest microbatches.
  json profile = json::parse(slurp(kProfile));
  profile["points"].back()["step_seconds"] = 0.393;
  const std::string dir = scratch_dir("plan-timing");
  const std::string path = dir + "/cliff.json";
  std::ofstream(path) << profile.dump(2);
  const std::vector<std::string> args = {"plan", "--profile", path, "--target-batch", "64", "--max-micro-batch", "8"};

  std::vector<std::string> with_timing = args;
  with_timing.push_back("--use-timing");
  const CliResult timed = run_cli(with_timing);
  INFO(timed.err);
  REQUIRE(timed.exit_code == 0);
  const json a = json::parse(timed.out);
  CHECK(a["accumulation_steps"].get<int>() > 8);
  CHECK(a["reason"].get<std::string>().find("faster per window than 8") != std::string::npos);

  const CliResult plain = run_cli(args);
  INFO(plain.err);
  REQUIRE(plain.exit_code == 0);
  const json b = json::parse(plain.out);
  CHECK(b["accumulation_steps"] == 8);
  CHECK(b["microbatch_sizes"] == json::array({8, 8, 8, 8, 8, 8, 8, 8}));
  CHECK(b["reason"].get<std::string>().find("faster") == std::string::npos);
}

TEST_CASE("CLI plan: bad input exits 2 with a message naming the problem", "[cli][plan][errors]") {
  expect_input_error({"plan", "--profile", "/nonexistent/p.json", "--target-batch", "8"},
                     "cannot open '/nonexistent/p.json'");
  const std::string dir = scratch_dir("bad-json");
  const std::string bad = dir + "/bad.json";
  std::ofstream(bad) << "{ not json";
  expect_input_error({"plan", "--profile", bad, "--target-batch", "8"}, "is not valid JSON");
  expect_input_error({"plan", "--profile", kProfile, "--target-batch", "0"}, "--target-batch must be at least 1, got 0");
  expect_input_error({"plan", "--profile", kProfile, "--target-batch", "-4"}, "got -4");
  expect_input_error({"plan", "--profile", kProfile, "--target-batch", "8", "--world-size", "0"},
                     "--world-size must be at least 1, got 0");
  for (const char* size : {"12 GiB", "abc", "-5MiB"}) {
    expect_input_error({"plan", "--profile", kProfile, "--target-batch", "8", "--memory-budget", size},
                       std::string("'") + size + "' is not a size");
  }
  expect_input_error({"plan", "--profile", kProfile, "--target-batch", "8", "--headroom", "1.5"},
                     "--headroom '1.5': a fraction must be in [0, 1]");
  expect_input_error({"plan", "--profile", kProfile, "--target-batch", "8", "--headroom", "-0.5"},
                     "--headroom '-0.5': a fraction must be in [0, 1]; use auto");
  // An explicit 0 is a bad value, not "no constraint" (leaving the option out is that).
  expect_input_error({"plan", "--profile", kProfile, "--target-batch", "8", "--multiple-of", "0"},
                     "--multiple-of must be at least 1, got 0");
  expect_input_error({"plan", "--profile", kProfile, "--target-batch", "8", "--memory-budget", "100MiB"},
                     "persistent memory alone is");
  expect_input_error({"plan", "--target-batch", "8"}, "--profile is required");
  expect_input_error({"plan", "--profile", kProfile, "--target-batch", "eight"}, "--target-batch");
}

TEST_CASE("CLI export: renders the uniform split and notes the difference on stderr", "[cli][export]") {
  const std::string dir = scratch_dir("export");
  const std::string plan = dir + "/plan.json";
  REQUIRE(run_cli({"plan", "--profile", kProfile, "--target-batch", "256", "--out", plan}).exit_code == 0);
  const CliResult r = run_cli({"export", "--plan", plan, "--to", "deepspeed"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const json ds = json::parse(r.out);
  CHECK(ds["train_batch_size"] == 256);
  CHECK(ds["train_micro_batch_size_per_gpu"].get<int>() * ds["gradient_accumulation_steps"].get<int>() == 256);
  expect_input_error({"export", "--plan", plan, "--to", "keras"}, "not a known trainer");
  expect_input_error({"export", "--plan", kProfile, "--to", "hf"}, "expected 'accumplan.plan'");
}

TEST_CASE("CLI: --help and --version exit 0", "[cli]") {
  CliResult r = run_cli({"--help"});
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("plan") != std::string::npos);
  r = run_cli({"plan", "--help"});
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("--memory-budget") != std::string::npos);
  r = run_cli({"--version"});
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("accumplan 0.1.0") != std::string::npos);
}

TEST_CASE("CLI: accumplan help [COMMAND] is --help, and every help line fits 100 columns", "[cli][help]") {
  const CliResult top = run_cli({"help"});
  CHECK(top.exit_code == 0);
  CHECK(top.out == run_cli({"--help"}).out);
  // The commands a torch-free build has too; the torch build's device commands are checked alike.
  for (const std::string command : {"plan", "export", "report", "profile", "run", "verify"}) {
    INFO(command);
    const CliResult via_help = run_cli({"help", command});
    const CliResult direct = run_cli({command, "--help"});
    if (direct.exit_code != 0) continue;  // not in this build
    CHECK(via_help.exit_code == 0);
    CHECK(via_help.out == direct.out);
  }
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--help"}, {"plan", "--help"}, {"export", "--help"}, {"report", "--help"},
        {"profile", "--help"}, {"run", "--help"}, {"verify", "--help"}}) {
    const CliResult r = run_cli(args);
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) {
      INFO(args.front() << ": " << line);
      CHECK(line.size() <= 100 + 2);  // bytes; a '−' or '…' is three bytes for one column
    }
  }
  expect_input_error({"help", "nosuch"}, "`accumplan help` takes one command name");
}

TEST_CASE("CLI: choice values in any case; an option given twice is said in product words", "[cli][errors]") {
  const std::string dir = scratch_dir("choices");
  const std::string plan = dir + "/plan.json";
  REQUIRE(run_cli({"plan", "--profile", kProfile, "--target-batch", "256", "--split", "UNIFORM", "--out", plan})
              .exit_code == 0);
  CHECK(json::parse(slurp(plan))["split"] == "uniform");
  const CliResult ds = run_cli({"export", "--plan", plan, "--to", "DeepSpeed"});
  INFO(ds.err);
  CHECK(ds.exit_code == 0);
  CHECK(json::parse(ds.out).contains("train_batch_size"));
  // Paths keep their case: only choice values are lowered.
  expect_input_error({"export", "--plan", dir + "/PLAN.json", "--to", "hf"}, "PLAN.json");
  expect_input_error({"plan", "--profile", kProfile, "--target-batch", "8", "--out", dir + "/a.json", "--out",
                      dir + "/b.json"},
                     "--out was given 2 times; give it once");
  // A newline inside a choice value is not echoed into a second line.
  expect_input_error({"export", "--plan", plan, "--to", "deep\nspeed"}, "is not a known trainer");
}

TEST_CASE("CLI outputs: checked before anything is read, and nothing is replaced", "[cli][outputs][errors]") {
  const std::string dir = scratch_dir("planner-outputs");
  const std::string profile = dir + "/profile.json";
  std::ofstream(profile) << slurp(kProfile);
  const std::string before = slurp(profile);
  // An output onto its own input: the profile would be replaced by the plan made from it.
  expect_refusal(dir, {"plan", "--profile", profile, "--target-batch", "8", "--out", profile},
                 "is the --profile file it is made from");
  CHECK(slurp(profile) == before);
  expect_refusal(dir, {"plan", "--profile", profile, "--target-batch", "8", "--out", ""}, "--out '': an empty path");
  expect_refusal(dir, {"report", profile, "--out", dir + "/no-such-dir/r.html"}, "no such directory");
  expect_refusal(dir, {"report", profile, "--out", dir}, "is a directory");
  expect_refusal(dir, {"export", "--plan", profile, "--to", "hf", "--out", dir + "/missing/hf.json"}, "no such directory");
}

TEST_CASE("CLI: a newline inside any value never breaks the one error line", "[cli][errors][one-line]") {
  const std::string dir = scratch_dir("one-line");
  for (const std::vector<std::string>& extra : std::vector<std::vector<std::string>>{
           {"--split", "a\nb"}, {"--memory-budget", "1\n2GiB"}, {"--headroom", "0.1\n"}, {"--target-batch", "8\n"}}) {
    std::vector<std::string> args = {"plan", "--profile", kProfile, "--target-batch", "8"};
    args.insert(args.end(), extra.begin(), extra.end());
    expect_refusal(dir, args, "accumplan: error:");
  }
  expect_refusal(dir, {"plan", "--profile", "no\nsuch.json", "--target-batch", "8"}, "no?such.json");
  expect_refusal(dir, {"export", "--plan", kProfile, "--to", "h\nf"}, "accumplan: error:");
}

TEST_CASE("CLI plan: one --profile and one --memory-budget per rank plan ranks that differ", "[cli][plan][ranks]") {
  const std::string dir = scratch_dir("plan-ranks");
  // The golden profile, as windows for two ranks measured it (its exchange made).
  json p = json::parse(slurp(kProfile));
  p["gradient_exchange"] = true;
  const std::string profile = dir + "/profile.json";
  std::ofstream(profile) << p.dump();
  const int64_t total = p["device"]["total_bytes"];
  const std::string small = std::to_string(total / 2), large = std::to_string(total);
  const CliResult r = run_cli({"plan", "--profile", profile, "--profile", profile, "--target-batch", "512",
                               "--world-size", "2", "--memory-budget", small + "," + large});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const json plan = json::parse(r.out);
  REQUIRE(plan["ranks"].size() == 2);
  CHECK(plan["ranks"][0]["budget_bytes"] == total / 2);
  CHECK(plan["ranks"][1]["budget_bytes"] == total);
  CHECK(plan["ranks"][0]["per_rank_batch"].get<int64_t>() + plan["ranks"][1]["per_rank_batch"].get<int64_t>() == 512);
  CHECK(plan["ranks"][1]["max_micro_batch"].get<int64_t>() >= plan["ranks"][0]["max_micro_batch"].get<int64_t>());
  CHECK(r.err.find("ranks that differ") != std::string::npos);
  // A budget count that is neither one nor one per rank is refused, naming the counts.
  const CliResult three = run_cli({"plan", "--profile", profile, "--target-batch", "512", "--world-size", "2",
                                   "--memory-budget", small + "," + small + "," + large});
  CHECK(three.exit_code == 2);
  CHECK(three.err.find("holds 3 budgets for 2 ranks") != std::string::npos);
  // The exports that give every rank one per-device batch refuse the plan; torchrun carries it.
  const std::string planned = dir + "/plan.json";
  std::ofstream(planned) << r.out;
  const CliResult hf = run_cli({"export", "--plan", planned, "--to", "hf"});
  CHECK(hf.exit_code == 2);
  CHECK(hf.err.find("gives every rank one per-device batch") != std::string::npos);
  const CliResult torchrun = run_cli({"export", "--plan", planned, "--to", "torchrun"});
  INFO(torchrun.err);
  CHECK(torchrun.exit_code == 0);
  CHECK(torchrun.out.find("ranks that differ") != std::string::npos);
}
