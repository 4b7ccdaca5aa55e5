// `accumplan report` as a user runs it: exit codes, the file it writes, stdout, error messages.
// What it is not: a check of the picture's numbers (tests/planner/test_report.cpp parses those).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli_expect.h"  // after Catch
#include "cli_runner.h"

using namespace accumplan::test;
using nlohmann::json;

namespace {

size_t files_in(const std::string& dir) {
  return static_cast<size_t>(
      std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator{}));
}

// Run stats as `accumplan run --stats` writes them (the fields the report reads, and more).
std::string write_stats(const std::string& dir) {
  const json plan = json::parse(slurp(kPlan));
  json s = {{"schema", "accumplan.run_stats"},
            {"schema_version", "1.1"},
            {"windows", 3},
            {"optimizer_steps", 3},
            {"oom_recoveries", 0},
            {"microbatch_sizes", plan["microbatch_sizes"]},
            {"micro_batch", plan["micro_batch"]},
            {"measured_peak_bytes", plan["memory"]["predicted_peak_bytes"].get<int64_t>() - 4096},
            {"predicted_peak_bytes", plan["memory"]["predicted_peak_bytes"]},
            {"budget_bytes", plan["memory"]["budget_bytes"]},
            {"mean_window_seconds", 0.5},
            {"final_loss", 2.25}};
  const std::string path = dir + "/stats.json";
  std::ofstream(path) << s.dump(2);
  return path;
}
}  // namespace

TEST_CASE("CLI report: writes one HTML file atomically, nothing on stdout", "[cli][report]") {
  const std::string dir = scratch_dir("report-html");
  const std::string stats = write_stats(dir);
  const std::string out = dir + "/report.html";
  const CliResult r = run_cli({"report", kPlan, "--stats", stats, "--out", out});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.empty());
  const std::string html = slurp(out);
  CHECK(html.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(html.find("<svg") != std::string::npos);
  CHECK(html.find("accumplan run: 3 window(s)") != std::string::npos);
  CHECK(files_in(dir) == 2);  // stats.json and report.html: no temp file left behind
}

TEST_CASE("CLI report: --format svg to stdout; a profile is drawn too", "[cli][report]") {
  const CliResult r = run_cli({"report", kPlan, "--format", "svg", "--out", "-"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.rfind("<?xml", 0) == 0);
  CHECK(r.out.find("<svg xmlns=\"http://www.w3.org/2000/svg\"") != std::string::npos);

  const std::string dir = scratch_dir("report-profile");
  const CliResult p = run_cli({"report", kProfile, "--format", "svg", "--out", dir + "/profile.svg"});
  INFO(p.err);
  REQUIRE(p.exit_code == 0);
  CHECK(slurp(dir + "/profile.svg").find("class=\"point\"") != std::string::npos);
}

TEST_CASE("CLI report: the --out name's extension chooses the format; --format may not contradict it",
          "[cli][report]") {
  const std::string dir = scratch_dir("report-extension");
  const CliResult r = run_cli({"report", kPlan, "--out", dir + "/r.svg"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(slurp(dir + "/r.svg").rfind("<?xml", 0) == 0);  // SVG, not HTML in a .svg file
  REQUIRE(run_cli({"report", kPlan, "--format", "SVG", "--out", dir + "/r.htm"}).exit_code == 2);
  expect_input_error({"report", kPlan, "--format", "html", "--out", dir + "/x.svg"},
                     "--format html but --out");
  CHECK(files_in(dir) == 1);  // only r.svg
}

TEST_CASE("CLI report: bad input exits 2 and names it", "[cli][report][errors]") {
  const std::string dir = scratch_dir("report-errors");
  expect_input_error({"report", kPlan}, "--out");  // required
  expect_input_error({"report", kPlan, "--format", "png", "--out", dir + "/r.png"}, "--format must be html or svg, got 'png'");
  expect_input_error({"report", "/nonexistent/plan.json", "--out", dir + "/r.html"}, "cannot open '/nonexistent/plan.json'");
  expect_input_error({"report", kPlan, "--stats", kPlan, "--out", dir + "/r.html"}, "accumplan.run_stats");
  const std::string stats = write_stats(dir);
  expect_input_error({"report", stats, "--out", dir + "/r.html"}, "a report reads \"accumplan.plan\"");
  expect_input_error({"report", kPlan, "--out", "/nonexistent-dir/r.html"}, "/nonexistent-dir/r.html");
  CHECK(files_in(dir) == 1);  // only stats.json: no report was written
}

TEST_CASE("CLI report: stats from a run of another plan are refused", "[cli][report][errors]") {
  const std::string dir = scratch_dir("report-other-plan");
  json s = json::parse(slurp(write_stats(dir)));
  s["predicted_peak_bytes"] = s["predicted_peak_bytes"].get<int64_t>() + 4096;
  const std::string other = dir + "/other-stats.json";
  std::ofstream(other) << s.dump();
  expect_refusal(dir, {"report", kPlan, "--stats", other, "--out", dir + "/r.html"}, "is from a run of another plan");
  s = json::parse(slurp(dir + "/stats.json"));
  s["per_rank_batch"] = 3;
  std::ofstream(other) << s.dump();
  expect_refusal(dir, {"report", kPlan, "--stats", other, "--out", dir + "/r.html"}, "per-rank batch of 3");
}
