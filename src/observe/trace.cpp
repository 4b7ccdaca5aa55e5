// observe/trace.cpp — the Chrome trace of a run. See trace.h.
#include "observe/trace.h"

#include <algorithm>
#include <chrono>

namespace accumplan {
namespace {

constexpr int kExecutorTrack = 1;  // the thread id of the executor's spans

double steady_now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

RunTrace::RunTrace(int rank, std::string process_name)
    : rank_(rank), process_name_(std::move(process_name)), origin_s_(steady_now_s()) {}

double RunTrace::now_us() const { return (steady_now_s() - origin_s_) * 1e6; }

void RunTrace::complete(const std::string& name, const std::string& category, double begin_us, double end_us,
                        nlohmann::json args) {
  nlohmann::json e = {{"name", name}, {"cat", category}, {"ph", "X"}, {"ts", begin_us},
                      {"dur", std::max(0.0, end_us - begin_us)}, {"pid", rank_}, {"tid", kExecutorTrack}};
  if (!args.is_null()) e["args"] = std::move(args);
  events_.push_back(std::move(e));
}

void RunTrace::instant(const std::string& name, const std::string& category, double ts_us, nlohmann::json args) {
  nlohmann::json e = {{"name", name}, {"cat", category}, {"ph", "i"}, {"s", "t"},
                      {"ts", ts_us},  {"pid", rank_},    {"tid", kExecutorTrack}};
  if (!args.is_null()) e["args"] = std::move(args);
  events_.push_back(std::move(e));
}

void RunTrace::counter(const std::string& name, double ts_us, nlohmann::json args) {
  events_.push_back({{"name", name}, {"cat", "memory"}, {"ph", "C"}, {"ts", ts_us}, {"pid", rank_}, {"args", std::move(args)}});
}

void RunTrace::close_combine(double ts_us) {
  if (!combine_begin_us_) return;
  complete("combine gradient", "combine", *combine_begin_us_, ts_us,
           {{"what", "loss read (the window's host sync), unscale, non-finite check, clipping"}});
  combine_begin_us_.reset();
}

void RunTrace::window_begin(int64_t window, double ts_us) {
  window_ = window;
  window_begin_us_ = ts_us;
  microbatch_begin_us_.reset();
  combine_begin_us_.reset();
  optimizer_begin_us_.reset();
  microbatches_ = oom_ = replans_ = 0;
}

void RunTrace::microbatch_begin(int64_t index, int64_t count, int64_t size, int64_t attempt, double ts_us) {
  // A replayed window's earlier attempt left no combine span: the gap was the recovery.
  combine_begin_us_.reset();
  microbatch_begin_us_ = ts_us;
  microbatch_name_ = "microbatch " + std::to_string(index + 1) + "/" + std::to_string(count) + " b=" + std::to_string(size);
  microbatch_args_ = {{"window", window_}, {"index", index}, {"count", count}, {"size", size}, {"attempt", attempt}};
}

void RunTrace::microbatch_end(bool out_of_memory, double ts_us) {
  if (!microbatch_begin_us_) return;
  nlohmann::json args = microbatch_args_;
  args["out_of_memory"] = out_of_memory;
  complete(microbatch_name_ + (out_of_memory ? " (out of memory)" : ""), "microbatch", *microbatch_begin_us_, ts_us,
           std::move(args));
  ++microbatches_;
  if (out_of_memory) {
    ++oom_;
    instant("out of memory", "oom", ts_us, microbatch_args_);
  } else {
    combine_begin_us_ = ts_us;
  }
  microbatch_begin_us_.reset();
}

void RunTrace::replanned(int64_t failing_size, const std::vector<int64_t>& microbatch_sizes, const std::string& note,
                         double ts_us) {
  ++replans_;
  combine_begin_us_.reset();
  instant("re-plan", "replan", ts_us,
          {{"window", window_}, {"failing_size", failing_size}, {"microbatch_sizes", microbatch_sizes}, {"note", note}});
}

void RunTrace::optimizer_begin(double ts_us) {
  close_combine(ts_us);
  optimizer_begin_us_ = ts_us;
}

void RunTrace::window_end(int64_t samples, double loss, bool stepped, std::optional<int64_t> peak_bytes, double ts_us) {
  if (window_ < 0) return;
  close_combine(ts_us);  // a skipped step: the combine ran to the window's end
  if (optimizer_begin_us_) complete("optimizer step", "optimizer", *optimizer_begin_us_, ts_us, {{"window", window_}});
  nlohmann::json args = {{"window", window_}, {"samples", samples},     {"loss", loss},
                         {"stepped", stepped}, {"microbatches", microbatches_}, {"out_of_memory", oom_},
                         {"replans", replans_}};
  if (peak_bytes) {
    args["peak_bytes"] = *peak_bytes;
    counter("window peak", window_begin_us_, {{"peak_bytes", *peak_bytes}});
  }
  complete("window " + std::to_string(window_), "window", window_begin_us_, ts_us, std::move(args));
  window_ = -1;
  optimizer_begin_us_.reset();
}

void RunTrace::memory(int64_t bytes, double ts_us) { counter("allocated", ts_us, {{"allocated_bytes", bytes}}); }

void RunTrace::device_timeline(const std::string& name, const std::vector<TraceMemoryPoint>& points,
                               uint64_t clock_ns_at, double trace_us_at) {
  std::optional<int64_t> before;  // bytes held when the trace began
  for (const TraceMemoryPoint& p : points) {
    const double ts = trace_us_at + (static_cast<double>(p.timestamp_ns) - static_cast<double>(clock_ns_at)) / 1000.0;
    if (ts < 0) {
      before = p.bytes;
      continue;
    }
    if (before) {
      counter(name, 0.0, {{"bytes", *before}});
      before.reset();
    }
    counter(name, ts, {{"bytes", p.bytes}});
  }
  if (before) counter(name, 0.0, {{"bytes", *before}});
}

nlohmann::json RunTrace::to_json() const {
  std::vector<const nlohmann::json*> order;
  order.reserve(events_.size());
  for (const auto& e : events_) order.push_back(&e);
  // By time; at equal times the longer span first, so a window precedes its first microbatch.
  std::stable_sort(order.begin(), order.end(), [](const nlohmann::json* a, const nlohmann::json* b) {
    const double ta = (*a)["ts"].get<double>(), tb = (*b)["ts"].get<double>();
    if (ta != tb) return ta < tb;
    const double da = a->contains("dur") ? (*a)["dur"].get<double>() : -1;
    const double db = b->contains("dur") ? (*b)["dur"].get<double>() : -1;
    return da > db;
  });
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank_}, {"args", {{"name", process_name_}}}});
  events.push_back({{"name", "thread_name"},
                    {"ph", "M"},
                    {"pid", rank_},
                    {"tid", kExecutorTrack},
                    {"args", {{"name", "executor (rank " + std::to_string(rank_) + ")"}}}});
  for (const nlohmann::json* e : order) events.push_back(*e);
  return {{"traceEvents", std::move(events)},
          {"displayTimeUnit", "ms"},
          {"otherData", {{"producer", "accumplan run --trace"}, {"time_unit", "microseconds since the run began"}}}};
}

// A name that is not UTF-8 (a model file from a non-UTF-8 locale) is written as U+FFFD.
std::string RunTrace::dump() const {
  return to_json().dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace accumplan
