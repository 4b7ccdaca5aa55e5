// test_cli_trace.cpp — what `accumplan run` shows of itself, through the real binary: the Chrome
// trace of --trace (one span per window and per microbatch, the optimizer steps, OOM recoveries
// and re-plans as instants, memory counters), the per-window series of --stats, and the plain
// progress lines a log gets (--progress plain, or stderr not a terminal, as here).
//
// What it is not: a test of the trace writer's details (tests/observe/) or of timing: only
// counts, order and signs of the times are checked.
#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "mlp_plan_fixture.h"

#include <catch2/catch.hpp>

using namespace accumplan::test;
using nlohmann::json;

namespace {

std::vector<json> events_of(const json& trace, const std::string& ph, const std::string& cat = "") {
  std::vector<json> out;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == ph && (cat.empty() || e.value("cat", "") == cat)) out.push_back(e);
  }
  return out;
}

// Timestamps never go back, no span is negative, every microbatch is inside its window.
void check_times(const json& trace) {
  double last = -1;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M") continue;
    const double ts = e.at("ts").get<double>();
    CHECK(ts >= 0);
    CHECK(ts >= last);
    last = ts;
    if (e.at("ph") == "X") CHECK(e.at("dur").get<double>() >= 0);
  }
  const auto windows = events_of(trace, "X", "window");
  for (const auto& mb : events_of(trace, "X", "microbatch")) {
    const auto& w = windows.at(mb.at("args").at("window").get<size_t>());
    CHECK(mb.at("ts").get<double>() >= w.at("ts").get<double>());
    CHECK(mb.at("ts").get<double>() + mb.at("dur").get<double>() <=
          w.at("ts").get<double>() + w.at("dur").get<double>() + 1e-3);
  }
}

}  // namespace

TEST_CASE("run --trace: a span per window and per microbatch, --stats a record per window", "[cli][run][trace]") {
  const MlpPlan& f = mlp_plan();
  const int64_t k = f.plan_json["accumulation_steps"];
  REQUIRE(k >= 2);
  const int64_t windows = 3;
  const std::string trace_path = f.dir + "/trace.json", stats_path = f.dir + "/stats.json";
  const CliResult r = run_cli({"run", "--plan", f.plan, "--model", "builtin:mlp", "--memory-budget", kMlpBudget, "--steps",
                               std::to_string(windows), "--threads", "2", "--trace", trace_path, "--stats", stats_path,
                               "--progress", "plain"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const json trace = json::parse(slurp(trace_path));
  CHECK(events_of(trace, "X", "window").size() == static_cast<size_t>(windows));
  CHECK(events_of(trace, "X", "microbatch").size() == static_cast<size_t>(windows * k));
  CHECK(events_of(trace, "X", "optimizer").size() == static_cast<size_t>(windows));
  CHECK(events_of(trace, "i").empty());  // no OOM, no re-plan
  std::vector<json> peaks, allocated;
  for (const auto& c : events_of(trace, "C")) (c.at("name") == "window peak" ? peaks : allocated).push_back(c);
  CHECK(peaks.size() == static_cast<size_t>(windows));
  CHECK(allocated.size() == static_cast<size_t>(2 * windows * k));  // before and after each microbatch
  check_times(trace);

  const json s = json::parse(slurp(stats_path));
  const json& series = s.at("window_series");
  REQUIRE(series.size() == static_cast<size_t>(windows));
  int64_t samples = 0, highest = 0;
  for (size_t w = 0; w < series.size(); ++w) {
    CHECK(series[w]["window"] == static_cast<int64_t>(w));
    CHECK(series[w]["oom_recoveries"] == 0);
    CHECK(series[w]["replans"] == 0);
    CHECK(series[w]["microbatch_sizes"].size() == static_cast<size_t>(k));
    CHECK(series[w]["seconds"].get<double>() >= 0);
    samples += series[w]["samples"].get<int64_t>();
    highest = std::max(highest, series[w]["peak_bytes"].get<int64_t>());
    // The trace's window peak is the same number.
    CHECK(peaks[w]["args"]["peak_bytes"] == series[w]["peak_bytes"]);
    CHECK(series[w]["reserved_peak_bytes"].is_null());  // the CPU counting allocator reserves nothing
  }
  CHECK(samples == s["samples_seen"].get<int64_t>());
  CHECK(highest == s["measured_peak_bytes"].get<int64_t>());  // the run's peak is its highest window
  // A log gets whole lines with elapsed time and rate, never a carriage return.
  CHECK(r.err.find('\r') == std::string::npos);
  CHECK(r.err.find("accumplan: window 3/3: loss ") != std::string::npos);
  CHECK(r.err.find(" elapsed, ") != std::string::npos);
  CHECK(r.err.find(" samples/s") != std::string::npos);
}

TEST_CASE("run --trace: an OOM recovery is an instant, its re-plan another, the replay's microbatches spans",
          "[cli][run][trace][oom]") {
  const MlpPlan& f = mlp_plan();
  const int64_t m = f.plan_json["micro_batch"];
  REQUIRE(m > 6);
  const double intercept = f.plan_json["fit"]["intercept_bytes"], slope = f.plan_json["fit"]["slope_bytes_per_sample"];
  // Six samples' worth below the planned microbatch's prediction: the planned size cannot fit.
  const auto budget = static_cast<int64_t>(intercept + slope * static_cast<double>(m - 6));
  const std::string trace_path = f.dir + "/trace-oom.json", stats_path = f.dir + "/stats-oom.json";
  const CliResult r = run_cli({"run", "--plan", f.plan, "--model", "builtin:mlp", "--memory-budget", std::to_string(budget),
                               "--steps", "2", "--threads", "2", "--trace", trace_path, "--stats", stats_path,
                               "--progress", "none"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const json s = json::parse(slurp(stats_path));
  const int64_t recoveries = s["oom_recoveries"];
  REQUIRE(recoveries >= 1);
  const json trace = json::parse(slurp(trace_path));
  CHECK(events_of(trace, "i", "oom").size() == static_cast<size_t>(recoveries));
  CHECK(events_of(trace, "i", "replan").size() == static_cast<size_t>(recoveries));
  // Every microbatch that ran, failed ones included, is a span: the completed attempts' sizes plus
  // the failed attempts' microbatches (up to and including the one that ran out of memory).
  int64_t completed = 0, series_recoveries = 0, series_replans = 0;
  for (const auto& w : s["window_series"]) {
    completed += static_cast<int64_t>(w["microbatch_sizes"].size());
    series_recoveries += w["oom_recoveries"].get<int64_t>();
    series_replans += w["replans"].get<int64_t>();
  }
  CHECK(series_recoveries == recoveries);
  CHECK(series_replans == recoveries);
  const auto mbs = events_of(trace, "X", "microbatch");
  const auto failed = std::count_if(mbs.begin(), mbs.end(), [](const json& e) { return e["args"]["out_of_memory"] == true; });
  CHECK(failed == recoveries);
  CHECK(static_cast<int64_t>(mbs.size()) >= completed + recoveries);
  const auto done = std::count_if(mbs.begin(), mbs.end(), [](const json& e) { return e["args"]["attempt"] == 0; });
  CHECK(done >= 1);
  check_times(trace);
  // --progress none: the run's own lines (start, recovery, summary) but no window lines.
  CHECK(r.err.find("accumplan: window ") == std::string::npos);
  CHECK(r.err.find("out of memory in window 0") != std::string::npos);
}

TEST_CASE("run refuses a bad --progress with exit 2 naming the value", "[cli][run][errors]") {
  const MlpPlan& f = mlp_plan();
  const CliResult r = run_cli({"run", "--plan", f.plan, "--model", "builtin:mlp", "--steps", "1", "--progress", "fancy"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("--progress must be auto, bar, plain or none, got 'fancy'") != std::string::npos);
}
