// run/run_session.cpp — `accumplan run`'s driver. See run_session.h.
#include "run/run_session.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "accumplan/ranks.h"
#include "accumplan/replan.h"
#include "accumplan/sharding.h"

namespace accumplan {
namespace {

// FNV-1a over every parameter's bytes: replicas that applied the same updates are bitwise equal
// (every rank steps with the same all-reduced gradient), so this is exact, not a tolerance.
int64_t parameter_fingerprint(const torch::jit::Module& module) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& p : module.parameters()) {
    const at::Tensor t = p.detach().to(at::kCPU).contiguous();
    const auto* b = static_cast<const unsigned char*>(t.data_ptr());
    for (size_t i = 0; i < t.nbytes(); ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  return static_cast<int64_t>(h >> 1);  // non-negative, so a sum over one-hot slots is exact
}

std::optional<double> finite(double v) { return std::isfinite(v) ? std::optional<double>(v) : std::nullopt; }

}  // namespace

RunSession::RunSession(torch::jit::Module module, torch::optim::Optimizer& optimizer, const Plan& plan, ExecutorOptions eo,
                       const Batch& data, std::vector<std::pair<int64_t, int64_t>> windows, RunSessionOptions options)
    : module_(module), data_(data), windows_(std::move(windows)), options_(std::move(options)),
      comm_(eo.communicator), probe_(eo.probe) {
  if (!options_.guard) options_.guard = [](const std::function<WindowStats()>& step) { return step(); };
  eval_base_ = eo;
  attach_hooks(eo);
  executor_ = std::make_unique<Executor>(std::move(module), optimizer, plan, std::move(eo));
}

std::optional<int64_t> RunSession::device_peak(std::optional<int64_t> peak) const {
  return peak ? std::optional<int64_t>(*peak - options_.host_data_bytes) : std::nullopt;
}

// The trace and the per-window re-plan count are fed by the executor's hooks; the window
// algorithm itself knows nothing of them.
void RunSession::attach_hooks(ExecutorOptions& eo) {
  RunTrace* trace = options_.trace;
  auto replanned = eo.on_replan;
  eo.on_replan = [this, trace, replanned](const ReplanEvent& e) {
    ++window_replans_;
    if (trace) trace->replanned(e.failing_size, e.microbatch_sizes, e.note, trace->now_us());
    if (replanned) replanned(e);
  };
  if (!trace) return;
  const MemoryProbe* probe = eo.probe;
  const int64_t host = options_.host_data_bytes;
  auto device_bytes = [probe, host]() { return probe ? probe->current_bytes() - host : 0; };
  eo.before_microbatch = [trace, device_bytes](const MicrobatchEvent& e) {
    const double now = trace->now_us();
    trace->microbatch_begin(e.index, e.count, e.size, e.attempt, now);
    trace->memory(device_bytes(), now);
  };
  eo.after_microbatch = [trace, device_bytes](const MicrobatchEvent&, bool out_of_memory) {
    const double now = trace->now_us();
    trace->microbatch_end(out_of_memory, now);
    trace->memory(device_bytes(), now);
  };
  eo.before_optimizer_step = [trace](int64_t) { trace->optimizer_begin(trace->now_us()); };
}

void RunSession::run() {
  const int rank = comm_ ? comm_->rank() : 0, world = comm_ ? comm_->world_size() : 1;
  RunTrace* trace = options_.trace;
  int64_t samples_done = 0;
  if (options_.total_windows > 0 && !windows_.empty()) {
    // The first window then runs TorchScript's optimized graph, as every later one (Executor::warm_up).
    const Batch first = data_.slice(windows_.front().first, windows_.front().second);
    options_.guard([&] {
      executor_->warm_up(comm_ ? rank_window(first, executor_->plan(), rank, world) : first);
      return WindowStats{};
    });
  }
  for (int64_t w = 0; w < options_.total_windows; ++w) {
    const auto& [start, count] = windows_[static_cast<size_t>(w) % windows_.size()];
    const Batch window = data_.slice(start, count);
    window_replans_ = 0;
    if (trace) trace->window_begin(w, trace->now_us());
    const WindowStats st =
        options_.guard([&] { return executor_->step(comm_ ? rank_window(window, executor_->plan(), rank, world) : window); });
    const std::optional<int64_t> peak = device_peak(st.peak_bytes);
    if (trace) trace->window_end(st.samples, st.loss, st.stepped, peak, trace->now_us());
    last_loss_ = finite(st.loss);
    if (!st.stepped && first_skip_reason_.empty()) first_skip_reason_ = st.skip_reason.empty() ? "skipped" : st.skip_reason;
    samples_done += st.samples;
    RunWindowRecord r;
    r.window = w;
    r.samples = st.samples;
    r.valid_tokens = st.valid_tokens;
    r.loss = finite(st.loss);
    r.peak_bytes = peak;
    r.reserved_peak_bytes = st.reserved_peak_bytes;
    r.oom_recoveries = st.oom_recoveries;
    r.replans = window_replans_;
    r.microbatch_sizes = st.microbatch_sizes;
    r.stepped = st.stepped;
    r.seconds = st.seconds;
    if (executor_->plan().tokens) {
      r.microbatch_seconds = st.microbatch_seconds;
      r.predicted_seconds = st.predicted_seconds;
      r.predicted_peak_bytes = st.predicted_peak_bytes;
    }
    series_.push_back(r);
    if (options_.on_window) options_.on_window(w, samples_done, series_.back());
    if (evaluates_after(w)) {
      evaluations_.push_back(evaluate_after(w));
      if (options_.on_eval) options_.on_eval(evaluations_.back());
    }
  }
  // Counts of the training windows, before the replica check adds its own collective.
  if (comm_) training_collectives_ = comm_->counts();
}

bool RunSession::evaluates_after(int64_t w) const {
  if (!options_.eval_data) return false;
  return options_.eval_every > 0 ? (w + 1) % options_.eval_every == 0 : w + 1 == options_.total_windows;
}

RunEvalRecord RunSession::evaluate_after(int64_t w) {
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& p : module_.parameters()) {
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
  }
  EvalOptions eo;
  eo.step.loss = eval_base_.loss;
  eo.step.amp = eval_base_.amp;
  eo.step.device = executor_->device();
  eo.step.padding_mask = eval_base_.padding_mask;
  eo.probe = probe_;
  eo.oom_recovery = eval_base_.oom_recovery;
  eo.log = eval_base_.log;
  if (probe_) probe_->reset_peak();
  const Batch& data = *options_.eval_data;
  const EvalStats st = evaluate(module_, data, eval_sizes(executor_->plan(), data.size()), eo);
  RunEvalRecord r;
  r.after_window = w;
  r.samples = st.samples;
  r.units = st.units;
  r.loss = finite(st.mean());
  r.microbatch_sizes = st.microbatch_sizes;
  r.oom_recoveries = st.oom_recoveries;
  if (probe_) r.peak_bytes = device_peak(probe_->peak_bytes());
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

Plan RunSession::final_plan() const {
  Plan plan = executor_->plan();
  const ExecutorTotals& t = executor_->totals();
  if (t.oom_recoveries > 0 && t.windows > 0) {
    plan.confirmed = true;
    if (t.peak_bytes) plan.confirmed_peak_bytes = *t.peak_bytes;
  }
  return plan;
}

bool RunSession::replicas_identical() {
  if (!comm_) return true;
  std::vector<int64_t> slots(static_cast<size_t>(comm_->world_size()), 0);
  slots[static_cast<size_t>(comm_->rank())] = parameter_fingerprint(module_);
  const std::vector<int64_t> all = comm_->all_reduce_counters(slots);
  return std::all_of(all.begin(), all.end(), [&](int64_t v) { return v == all[0]; });
}

void RunSession::add_device_timeline(const MemoryProbe& probe) {
  if (!options_.trace) return;
  // CUPTI's device timeline (empty for probes that record none), placed on the trace's clock.
  const std::vector<MemoryTimelinePoint> timeline = probe.memory_timeline();
  const std::optional<uint64_t> clock_ns = probe.memory_clock_ns();
  if (timeline.empty() || !clock_ns) return;
  std::vector<TraceMemoryPoint> points;
  points.reserve(timeline.size());
  for (const auto& pt : timeline) points.push_back({pt.timestamp_ns, pt.current_bytes});
  options_.trace->device_timeline("device memory (CUPTI)", points, *clock_ns, options_.trace->now_us());
}

RunRecord RunSession::record(RunRecord r, const Plan& final_plan, bool replicas_identical) const {
  const ExecutorTotals& t = executor_->totals();
  static_cast<RunCounts&>(r) = t;
  const Plan own = rank_view(final_plan, final_plan.ranks.empty() || !comm_ ? 0 : comm_->rank());  // this rank's window
  r.microbatch_sizes = own.microbatch_sizes;
  r.micro_batch = own.micro_batch;
  r.accumulation_steps = own.accumulation_steps;
  r.collectives = {training_collectives_.counter_all_reduces, training_collectives_.gradient_exchanges,
                   training_collectives_.tensor_all_reduces, training_collectives_.parameter_broadcasts};
  r.replicas_identical = replicas_identical;
  r.measured_peak_bytes = device_peak(t.peak_bytes);
  // Host data is never on the device, so nothing is subtracted from the reserved peak.
  r.measured_reserved_peak_bytes = t.reserved_peak_bytes;
  r.final_predicted_peak_bytes = predicted_peak_of_rank(final_plan, comm_ ? comm_->rank() : 0);
  r.mean_window_seconds = t.windows > 0 ? t.seconds / static_cast<double>(t.windows) : 0.0;
  r.final_loss = last_loss_;
  r.loss_scale = executor_->loss_scale();
  r.time_model = executor_->time_model();
  for (const auto& w : series_) {
    if (w.predicted_peak_bytes) r.packed_predicted_peak_bytes = std::max(r.packed_predicted_peak_bytes.value_or(0), *w.predicted_peak_bytes);
  }
  r.window_series = series_;
  r.evaluations = evaluations_;
  return r;
}

}  // namespace accumplan
