// Hostile inputs to the planner-only commands: `plan`, `export` and `report` reading
// bad files, and `--out` onto special files. Every refusal exits 2 with exactly one line naming
// the bad value, prints nothing on stdout, and leaves no file or temp file behind. The torch
// commands' cases live with their tests (tests/runtime, tests/executor).
//
// What it is not: a test of the messages' full wording (tests/planner/test_hostile_inputs.cpp,
// test_files.cpp); here each case is one line: its arguments and the text the line must hold.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include <nlohmann/json.hpp>

#include "accumplan/errors.h"  // path_for_message: how messages show a path
#include "cli_expect.h"        // after Catch
#include "cli_runner.h"
#include "cli_stdout.h"

using accumplan::path_for_message;
using namespace accumplan::test;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {


// The golden document with `edit` applied, written to dir/name (raw text replacements for values
// nlohmann cannot hold, such as 1e400).
std::string variant(const std::string& dir, const std::string& name, const std::string& source,
                    const std::function<void(json&)>& edit, const std::string& from = "", const std::string& to = "") {
  json doc = json::parse(slurp(source));
  edit(doc);
  std::string text = doc.dump(1);
  if (!from.empty()) {
    const size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    text.replace(at, from.size(), to);
  }
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

const auto kNoEdit = [](json&) {};

}  // namespace

TEST_CASE("CLI hostile: plan refuses bad profiles with one line naming the value", "[cli][hostile][plan]") {
  const std::string in = scratch_dir("hostile-plan-in");
  const std::string out = scratch_dir("hostile-plan-out");
  const std::string o = out + "/plan.json";
  auto plan = [&](const std::string& profile) {
    return std::vector<std::string>{"plan", "--profile", profile, "--target-batch", "8", "--out", o};
  };
  const std::string p_1e400 = variant(in, "1e400.json", kProfile, kNoEdit, "\"peak_bytes\": 220599408", "\"peak_bytes\": 1e400");
  const std::string p_2pow63 = variant(in, "2pow63.json", kProfile, kNoEdit, "\"weights_bytes\": 46758048",
                                       "\"weights_bytes\": 9223372036854775808");
  const std::string p_2pow62 = variant(in, "2pow62.json", kProfile, [](json& d) {
    for (auto& [k, v] : d["persistent"].items()) v = int64_t{1} << 62;
  });
  const std::string p_tiny = variant(in, "tiny-slope.json", kProfile, [](json& d) {
    d["points"] = json::array({{{"micro_batch", 1}, {"peak_bytes", 100000000}},
                               {{"micro_batch", int64_t{1000000000000000}}, {"peak_bytes", 100000001}}});
  });
  const std::string p_long = variant(in, "long.json", kProfile, [](json& d) { d["schema"] = std::string(50000, 's'); });
  const std::string p_empty = in + "/empty.json";
  std::ofstream(p_empty).close();
  const std::string p_fifo = in + "/fifo.json";
  REQUIRE(::mkfifo(p_fifo.c_str(), 0600) == 0);

  expect_refusal(out, plan(p_1e400), "$.points[0].peak_bytes: the number 1e400");
  expect_refusal(out, plan(p_2pow63), "$.persistent.weights_bytes: 9223372036854775808 is out of range");
  expect_refusal(out, plan(p_2pow62), "4611686018427387904 is out of range");
  expect_refusal(out, plan(p_tiny), "$.points[1].micro_batch: 1000000000000000 is out of range");
  expect_refusal(out, plan(p_long), "(50000 characters)");
  for (const char* v : {"1.", "+1.0", "1.0.0", "-1.0"}) {
    expect_refusal(out, plan(variant(in, "version.json", kProfile, [&](json& d) { d["schema_version"] = v; })),
                   std::string("$.schema_version: '") + v + "' is not MAJOR.MINOR");
  }
  expect_refusal(out, plan("/dev/null"), "is empty");
  expect_refusal(out, plan(p_empty), "is empty");
  expect_refusal(out, plan(in), "is a directory");
  expect_refusal(out, plan(p_fifo), "is a FIFO");  // with no writer: refused, never waited on
  expect_refusal(out, plan("/dev/zero"), "is a device");
  expect_refusal(out, {"plan", "--profile", kProfile, "--target-batch", "9223372036854775807", "--out", o},
                 "--target-batch: 9223372036854775807 is out of range [1, 1099511627776]");
  expect_refusal(out, {"plan", "--profile", kProfile, "--target-batch", "8", "--max-micro-batch", "4611686018427387904", "--out", o},
                 "--max-micro-batch: 4611686018427387904 is out of range");
  expect_refusal(out, {"plan", "--profile", kProfile, "--target-batch", "8", "--out", out + "/no-such-dir/plan.json"},
                 "no-such-dir");  // one line: the summary is printed only once the plan is written
  expect_refusal(out, {"plan", "--profile", kProfile, "--target-batch", "8", "--memory-budget", "8000000TB", "--out", o},
                 "'8000000TB' is not a size (it is more than 1 PiB");
}

TEST_CASE("CLI hostile: export refuses bad plans with one line naming the value", "[cli][hostile][export]") {
  const std::string in = scratch_dir("hostile-export-in");
  const std::string out = scratch_dir("hostile-export-out");
  const std::string o = out + "/ds.json";
  auto exp = [&](const std::string& plan) {
    return std::vector<std::string>{"export", "--plan", plan, "--to", "deepspeed", "--out", o};
  };
  expect_refusal(out, exp(variant(in, "sizes.json", kPlan, [](json& d) {
                   // The issue's plan whose sizes' sum wraps to 256: exported with exit 0 before.
                   const int64_t big = int64_t{1} << 62;
                   d["microbatch_sizes"] = json::array({big, big, big, big + 256});
                   d["accumulation_steps"] = 4;
                   d["weights"] = json::array({0.25, 0.25, 0.25, 0.25});
                 })),
                 "$.microbatch_sizes[0]: 4611686018427387904 is out of range");
  expect_refusal(out, exp(variant(in, "uniform.json", kPlan, [](json& d) {
                   d["uniform"] = {{"micro_batch", 1}, {"accumulation_steps", 0}};
                 })),
                 "$.uniform.accumulation_steps: 0 is out of range");
  expect_refusal(out, exp(variant(in, "weights.json", kPlan, [](json& d) { d["weights"][0] = 0.5; })),
                 "$.weights[0]: 0.5 is not microbatch_sizes[0] / per_rank_batch");
  expect_refusal(out, exp(variant(in, "budget.json", kPlan, kNoEdit, "\"budget_bytes\": 1073741824", "\"budget_bytes\": 1e400")),
                 "$.memory.budget_bytes: the number 1e400");
  expect_refusal(out, exp(variant(in, "target.json", kPlan, [](json& d) { d["target_batch"] = INT64_MAX; })),
                 "$.target_batch: 9223372036854775807 is out of range");
  expect_refusal(out, exp(variant(in, "world.json", kPlan, [](json& d) { d["world_size"] = int64_t{1} << 62; })),
                 "$.world_size: 4611686018427387904 is out of range");
  expect_refusal(out, exp(variant(in, "v.json", kPlan, [](json& d) { d["schema_version"] = "1.0.0"; })),
                 "$.schema_version: '1.0.0' is not MAJOR.MINOR");
  // Enumerations are read exactly: "balanced\n" was taken for balanced, "none\n" for no AMP.
  expect_refusal(out, exp(variant(in, "split.json", kPlan, [](json& d) { d["split"] = "balanced\n"; })),
                 "$.split: 'balanced?' is not one of balanced, uniform");
  expect_refusal(out, exp(variant(in, "amp.json", kPlan, [](json& d) { d["setup"]["amp"] = "none\n"; })),
                 "$.setup.amp: 'none?' is not one of none, fp16, bf16");
  expect_refusal(out, exp(variant(in, "loss.json", kPlan, [](json& d) { d["setup"]["loss"] = "cross_entropy\x1b"; })),
                 "$.setup.loss: 'cross_entropy?' is not one of cross_entropy, mse, model");
  expect_refusal(out, exp(variant(in, "device.json", kPlan, [](json& d) { d["device"]["type"] = "cpu\x07"; })),
                 "$.device.type: 'cpu?' is not one of cpu, cuda");
  // A newline in a value printed into the torchrun line would start a second command.
  expect_refusal(out, {"export", "--plan", kPlan, "--to", "torchrun", "--binary", "accumplan\nrm -rf x", "--out", o},
                 "--binary 'accumplan?rm -rf x' holds a control character");
  // An empty binary would make a torchrun line that launches nothing.
  expect_refusal(out, {"export", "--plan", kPlan, "--to", "torchrun", "--binary", "", "--out", o},
                 "--binary '': name the accumplan the torchrun line launches");
  // An option the command does not have, said as typed (CLI11 listed it back to front).
  expect_refusal(out, {"export", "--plan", kPlan, "--to", "deepspeed", "--split", "uniform", "--out", o},
                 "`accumplan export` does not take --split uniform");
  expect_refusal(out, exp("/dev/null"), "is empty");
  expect_refusal(out, exp(in), "is a directory");
}

TEST_CASE("CLI hostile: report refuses special and overflowing files", "[cli][hostile][report]") {
  const std::string in = scratch_dir("hostile-report-in");
  const std::string out = scratch_dir("hostile-report-out");
  const std::string o = out + "/report.html";
  const std::string fifo = in + "/fifo.json";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  expect_refusal(out, {"report", "/dev/null", "--out", o}, "is empty");
  expect_refusal(out, {"report", in, "--out", o}, "is a directory");
  expect_refusal(out, {"report", fifo, "--out", o}, "is a FIFO");
  expect_refusal(out, {"report", variant(in, "1e400.json", kPlan, kNoEdit, "\"budget_bytes\": 1073741824", "\"budget_bytes\": 1e400"), "--out", o},
                 "$.memory.budget_bytes: the number 1e400");
  expect_refusal(out, {"report", kPlan, "--stats", "/dev/null", "--out", o}, "is empty");
  // A field error names the file it is in, for the stats as for the plan.
  const std::string stats = in + "/stats.json";
  std::ofstream(stats) << R"({"schema": "accumplan.run_stats", "schema_version": "1.0"})";
  expect_refusal(out, {"report", kPlan, "--stats", stats, "--out", o}, "--stats '" + path_for_message(stats) + "': $.");
  const std::string plan = variant(in, "no-fit.json", kPlan, [](json& d) { d["fit"] = 5; });
  expect_refusal(out, {"report", plan, "--out", o}, "report input '" + path_for_message(plan) + "': $.fit");
}

TEST_CASE("CLI hostile: --out onto a directory, a FIFO without a reader, a missing directory or a full device",
          "[cli][hostile][out]") {
  const std::string out = scratch_dir("hostile-out");
  const std::string fifo = out + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  fs::create_directories(out + "/adir");
  // `report`: it prints nothing else on stderr, so the refusal is the only line (`plan` prints
  // its summary first, then the same refusal).
  auto report_to = [&](const std::string& o) { return std::vector<std::string>{"report", kPlan, "--out", o}; };
  expect_refusal(out, report_to(out + "/adir"), "is a directory");  // checked before reading (outputs.h)
  expect_refusal(out, report_to(fifo), "it is a FIFO (named pipe) with no reader");
  expect_refusal(out, report_to(out + "/no/such/report.html"), "no such directory");
  expect_refusal(out, report_to("/dev/full"), "disk full");
  struct stat st {};
  REQUIRE(::lstat(fifo.c_str(), &st) == 0);
  CHECK(S_ISFIFO(st.st_mode));
}

TEST_CASE("CLI hostile: --out onto /dev/null, a symlink, a 255-character name and /proc/self/fd/1 works in place",
          "[cli][hostile][out]") {
  const std::string out = scratch_dir("hostile-out-ok");
  auto plan_to = [&](const std::string& o) {
    return run_cli({"plan", "--profile", kProfile, "--target-batch", "8", "--out", o}, 30);
  };
  CHECK(plan_to("/dev/null").exit_code == 0);
  struct stat st {};
  REQUIRE(::stat("/dev/null", &st) == 0);
  CHECK(S_ISCHR(st.st_mode));

  std::ofstream(out + "/real.json") << "old";
  fs::create_symlink("real.json", out + "/link.json");
  CHECK(plan_to(out + "/link.json").exit_code == 0);
  CHECK(fs::is_symlink(out + "/link.json"));
  CHECK(json::parse(slurp(out + "/real.json"))["schema"] == "accumplan.plan");

  const std::string long_name = out + "/" + std::string(250, 'n') + ".json";
  CHECK(plan_to(long_name).exit_code == 0);
  CHECK(json::parse(slurp(long_name))["target_batch"] == 8);

  const CliResult r = plan_to("/proc/self/fd/1");  // the runner's stdout file, written in place
  CHECK(r.exit_code == 0);
  CHECK(json::parse(r.out)["target_batch"] == 8);
  CHECK(listing(out) == std::set<std::string>{"real.json", "link.json", std::string(250, 'n') + ".json"});
}

TEST_CASE("CLI hostile: integer options are decimal: 010 is ten, hex, exponents and '' are refused",
          "[cli][hostile][plan]") {
  const std::string dir = scratch_dir("hostile-decimal");
  auto plan = [&](const std::string& target_batch, const std::string& extra = "--multiple-of", const std::string& value = "1") {
    return std::vector<std::string>{"plan", "--profile", kProfile, "--target-batch", target_batch, "--memory-budget", "1GiB",
                                    extra, value, "--out", dir + "/plan.json"};
  };
  // CLI11 reads base 0: 010 was octal 8, a plan for 8 samples when 10 were typed.
  const CliResult r = run_cli(plan("010"));
  REQUIRE(r.exit_code == 0);
  CHECK(json::parse(slurp(dir + "/plan.json"))["target_batch"] == 10);
  fs::remove(dir + "/plan.json");
  expect_refusal(dir, plan("0x10"), "--target-batch: '0x10' is not a decimal integer");
  expect_refusal(dir, plan("1e3"), "--target-batch: '1e3' is not a decimal integer");
  expect_refusal(dir, plan(""), "--target-batch: '' is not a decimal integer");
  expect_refusal(dir, plan("8", "--multiple-of", "0b11"), "--multiple-of: '0b11' is not a decimal integer");
}

namespace {

// The full-disk contract on standard output: exit 2, exactly one "accumplan: error:" line naming
// standard output and the disk, nothing else on stderr (no summary, no note before it).
void expect_stdout_full(const std::vector<std::string>& args) {
  const CliResult r = run_cli_with_stdout("/dev/full", args, 30);
  INFO("args: " << [&] { std::string s; for (const auto& a : args) s += a + " "; return s; }());
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == 2);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.err.rfind("accumplan: error: cannot write to standard output: No space left on device (disk full?)", 0) == 0);
}

}  // namespace

TEST_CASE("CLI hostile: standard output on a full disk is one error line and exit 2, for every command writing it",
          "[cli][hostile][out][full]") {
  expect_stdout_full({"export", "--plan", kPlan, "--to", "deepspeed"});
  expect_stdout_full({"export", "--plan", kPlan, "--to", "deepspeed", "--out", "-"});
  expect_stdout_full({"report", kPlan, "--out", "-"});
  expect_stdout_full({"plan", "--profile", kProfile, "--target-batch", "256"});
  expect_stdout_full({"--help"});
  expect_stdout_full({"help", "export"});
  expect_stdout_full({"--version"});
  // The same commands with standard output that takes the text still succeed.
  for (const std::vector<std::string>& ok : std::vector<std::vector<std::string>>{
           {"export", "--plan", kPlan, "--to", "deepspeed"}, {"--help"}, {"--version"}}) {
    const CliResult r = run_cli(ok, 30);
    CHECK(r.exit_code == 0);
    CHECK_FALSE(r.out.empty());
  }
}

TEST_CASE("CLI hostile: plan --out on a full disk prints no summary before its one error line", "[cli][hostile][out][full]") {
  const std::string out = scratch_dir("hostile-plan-full");
  expect_refusal(out, {"plan", "--profile", kProfile, "--target-batch", "256", "--out", "/dev/full"}, "(disk full?)");
}

TEST_CASE("CLI hostile: report --format '' is refused naming the option and its values", "[cli][hostile][report]") {
  const std::string out = scratch_dir("hostile-report-format");
  expect_refusal(out, {"report", kPlan, "--out", out + "/r.html", "--format", ""}, "--format must be html or svg, got ''");
  // Absent, the extension decides, as before.
  const CliResult r = run_cli({"report", kPlan, "--out", out + "/r.svg"}, 30);
  CHECK(r.exit_code == 0);
}
