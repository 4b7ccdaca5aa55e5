// observe/trace.h — a run as a Chrome trace (Trace Event Format JSON), which Perfetto
// (ui.perfetto.dev) and chrome://tracing open.
//
// What it is: `RunTrace`, fed by `accumplan run` from the executor's instrumentation hooks
// (ExecutorOptions::after_microbatch, on_replan, before_optimizer_step): every window, each
// microbatch (forward + backward) and the optimizer step as complete events ("ph":"X", ts and
// dur in microseconds since the run began, nested on one track per rank), the gradient combine
// between the last backward and the step, each out-of-memory and re-plan as an instant event
// ("ph":"i"), and memory as counter tracks ("ph":"C"): the probe's allocated bytes at every
// microbatch boundary, each window's peak, and a device timeline where the probe records one
// (CUPTI: one point per cudaMalloc/cudaFree). Times are the host's: on a GPU a microbatch's span
// is when the host issued its work, and the window's one host sync (reading the loss) shows as
// the combine span.
// What it is not: torch-aware (the CLI turns executor events into these calls), a profiler of
// operators, or thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace accumplan {

// One point of a device memory timeline on another clock (MemoryTimelinePoint's shape, kept
// here so this file needs nothing from the profiler).
struct TraceMemoryPoint {
  uint64_t timestamp_ns = 0;
  int64_t bytes = 0;
};

class RunTrace {
 public:
  // `rank` is the trace's process id, so the traces of several ranks can be merged side by side.
  explicit RunTrace(int rank = 0, std::string process_name = "accumplan run");

  // Microseconds since construction on the steady clock: the trace's time axis.
  double now_us() const;

  // The executor's events, in the order they happen; each takes its time (now_us() by default
  // through the overloads without one, which `accumplan run` uses; tests pass times).
  void window_begin(int64_t window, double ts_us);
  void microbatch_begin(int64_t index, int64_t count, int64_t size, int64_t attempt, double ts_us);
  void microbatch_end(bool out_of_memory, double ts_us);
  void replanned(int64_t failing_size, const std::vector<int64_t>& microbatch_sizes, const std::string& note,
                 double ts_us);
  void optimizer_begin(double ts_us);
  // Closes the window (and its optimizer step or combine span). `peak_bytes`: the probe's peak
  // during the window, drawn on the "window peak" counter over the window's span.
  void window_end(int64_t samples, double loss, bool stepped, std::optional<int64_t> peak_bytes, double ts_us);
  // Allocated bytes now, on the "allocated" counter.
  void memory(int64_t bytes, double ts_us);

  // A device timeline from another clock: `clock_ns_at` is that clock read at trace time
  // `trace_us_at` (the same instant), so a point at t ns lands at trace_us_at + (t - clock_ns_at)/1000.
  // Points before the trace began are dropped, except the last of them, placed at 0 (the bytes
  // the device held when the run began).
  void device_timeline(const std::string& name, const std::vector<TraceMemoryPoint>& points, uint64_t clock_ns_at,
                       double trace_us_at);

  // {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}, events ordered by ts
  // (an enclosing span before what it encloses), metadata naming the process and its tracks first.
  nlohmann::json to_json() const;
  std::string dump() const;
  size_t event_count() const { return events_.size(); }

 private:
  void complete(const std::string& name, const std::string& category, double begin_us, double end_us,
                nlohmann::json args);
  void instant(const std::string& name, const std::string& category, double ts_us, nlohmann::json args);
  void counter(const std::string& name, double ts_us, nlohmann::json args);
  void close_combine(double ts_us);

  int rank_;
  std::string process_name_;
  double origin_s_;
  std::vector<nlohmann::json> events_;
  // The open spans of the window in progress.
  int64_t window_ = -1;
  double window_begin_us_ = 0;
  std::optional<double> microbatch_begin_us_;
  nlohmann::json microbatch_args_;
  std::string microbatch_name_;
  std::optional<double> combine_begin_us_;   // after a microbatch ended, until the next begins
  std::optional<double> optimizer_begin_us_;
  int64_t microbatches_ = 0;                 // microbatch spans in this window, every attempt
  int64_t oom_ = 0;
  int64_t replans_ = 0;
};

}  // namespace accumplan
