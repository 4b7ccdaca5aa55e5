// test_trace.cpp — the Chrome trace of a run, written from a scripted sequence of executor events
// (windows, microbatches, an out-of-memory and its re-plan, optimizer steps, memory) and read back
// as JSON: the counts of each kind of event, timestamps in order, no negative duration, every
// microbatch inside its window, and a device timeline placed on the trace's clock.
// What it is not: a timing test: every time is passed in, none is measured.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "observe/trace.h"

using namespace accumplan;
using nlohmann::json;

namespace {

std::vector<json> events_of(const json& trace, const std::string& ph, const std::string& cat = "") {
  std::vector<json> out;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == ph && (cat.empty() || e.value("cat", "") == cat)) out.push_back(e);
  }
  return out;
}

// Windows of `sizes` microbatches each, 10 us per microbatch, 5 us combine, 7 us optimizer.
RunTrace scripted(const std::vector<std::vector<int64_t>>& windows) {
  RunTrace t;
  double now = 0;
  for (size_t w = 0; w < windows.size(); ++w) {
    t.window_begin(static_cast<int64_t>(w), now);
    now += 1;
    int64_t samples = 0;
    const auto& sizes = windows[w];
    for (size_t i = 0; i < sizes.size(); ++i) {
      t.microbatch_begin(static_cast<int64_t>(i), static_cast<int64_t>(sizes.size()), sizes[i], 0, now);
      t.memory(1000 + sizes[i] * 10, now);
      now += 10;
      t.microbatch_end(false, now);
      t.memory(1000, now);
      samples += sizes[i];
    }
    now += 5;
    t.optimizer_begin(now);
    now += 7;
    t.window_end(samples, 2.5, true, 1000 + 80 * 10, now);
    now += 2;
  }
  return t;
}

}  // namespace

TEST_CASE("trace: one span per window and per microbatch, in time order, none negative", "[trace]") {
  const int64_t windows = 4, microbatches = 3;
  const RunTrace t = scripted(std::vector<std::vector<int64_t>>(windows, std::vector<int64_t>(microbatches, 8)));
  // What a viewer reads: the written text, parsed.
  const json trace = json::parse(t.dump());
  CHECK(trace.at("displayTimeUnit") == "ms");
  CHECK(events_of(trace, "X", "window").size() == windows);
  CHECK(events_of(trace, "X", "microbatch").size() == windows * microbatches);
  CHECK(events_of(trace, "X", "optimizer").size() == windows);
  CHECK(events_of(trace, "X", "combine").size() == windows);
  CHECK(events_of(trace, "C").size() == windows * microbatches * 2 + windows);  // allocated + window peaks
  CHECK(events_of(trace, "M").size() == 2);                                     // process and track names
  double last = -1;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M") continue;
    const double ts = e.at("ts").get<double>();
    CHECK(ts >= last);
    last = ts;
    if (e.at("ph") == "X") CHECK(e.at("dur").get<double>() >= 0);
  }
  // Every microbatch lies inside the window its args name; the optimizer step after the last.
  const auto ws = events_of(trace, "X", "window");
  for (const auto& mb : events_of(trace, "X", "microbatch")) {
    const auto& w = ws.at(mb.at("args").at("window").get<size_t>());
    CHECK(mb.at("ts").get<double>() >= w.at("ts").get<double>());
    CHECK(mb.at("ts").get<double>() + mb.at("dur").get<double>() <= w.at("ts").get<double>() + w.at("dur").get<double>());
  }
  CHECK(ws.front().at("args").at("peak_bytes") == 1800);
  CHECK(ws.front().at("args").at("samples") == 24);
  CHECK(ws.front().at("name") == "window 0");
  CHECK(events_of(trace, "X", "microbatch").front().at("name") == "microbatch 1/3 b=8");
}

TEST_CASE("trace: an out-of-memory and its re-plan are instants, the replayed window holds every attempt", "[trace]") {
  RunTrace t;
  t.window_begin(0, 0);
  t.microbatch_begin(0, 2, 16, 0, 1);
  t.microbatch_end(false, 11);
  t.microbatch_begin(1, 2, 16, 0, 11);
  t.microbatch_end(true, 15);
  t.replanned(16, {11, 11, 10}, "largest size below 16", 16);
  for (int64_t i = 0; i < 3; ++i) {
    t.microbatch_begin(i, 3, i < 2 ? 11 : 10, 1, 20 + 10.0 * static_cast<double>(i));
    t.microbatch_end(false, 29 + 10.0 * static_cast<double>(i));
  }
  t.window_end(32, 1.5, false, std::nullopt, 60);  // the step was skipped: no optimizer span
  const json trace = json::parse(t.dump());
  CHECK(events_of(trace, "X", "microbatch").size() == 5);
  CHECK(events_of(trace, "X", "optimizer").empty());
  CHECK(events_of(trace, "X", "combine").size() == 1);  // last backward to the window's end
  const auto oom = events_of(trace, "i", "oom");
  REQUIRE(oom.size() == 1);
  CHECK(oom[0].at("ts") == 15);
  CHECK(oom[0].at("args").at("size") == 16);
  const auto replan = events_of(trace, "i", "replan");
  REQUIRE(replan.size() == 1);
  CHECK(replan[0].at("args").at("microbatch_sizes") == json({11, 11, 10}));
  const auto w = events_of(trace, "X", "window");
  REQUIRE(w.size() == 1);
  CHECK(w[0].at("args").at("out_of_memory") == 1);
  CHECK(w[0].at("args").at("replans") == 1);
  CHECK(w[0].at("args").at("microbatches") == 5);
  CHECK(events_of(trace, "C").empty());  // no probe peak, no samples: no counter
}

TEST_CASE("trace: a device timeline on another clock lands on the trace's time axis", "[trace]") {
  RunTrace t;
  // The other clock read 5,000,000 ns at trace time 100 us.
  t.device_timeline("device memory (CUPTI)",
                    {{4'000'000, 10}, {4'500'000, 20}, {5'000'000, 30}, {5'250'000, 25}}, 5'000'000, 100.0);
  const json trace = json::parse(t.dump());
  const auto c = events_of(trace, "C");
  REQUIRE(c.size() == 3);  // the point before the trace began is dropped, the one at 0 keeps its bytes
  CHECK(c[0].at("ts") == 0.0);
  CHECK(c[0].at("args").at("bytes") == 20);
  CHECK(c[1].at("ts") == 100.0);
  CHECK(c[1].at("args").at("bytes") == 30);
  CHECK(c[2].at("ts") == 350.0);
  CHECK(c[2].at("name") == "device memory (CUPTI)");
}
