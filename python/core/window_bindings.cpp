// python/core/window_bindings.cpp — the one window algorithm and evaluation loop
// (accumplan/window_loop.h), for Python's train_window, evaluate and accumplan.plan's windows.
//
// What it is: _core.WindowLoop over a _core.Plan (re-planned in place after an out-of-memory),
// driven by a _core.WindowBackend that accumplan/window.py implements in Python: it counts its
// share, runs one microbatch of the user's forward, loss and backward, steps the user's optimizer.
// The loop's decisions (split, pack, counts, rounds, agreement, re-plan and replay, the update's
// order) are the C++ ones `accumplan run` makes. A Python exception raised in a backend method
// crosses the loop unchanged; the loop asks the backend's is_out_of_memory(error) whether it was
// an out-of-memory. _core.run_eval is the evaluation loop over a _core.EvalBackend.
// What it is not: torch-aware: every tensor stays in Python.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "accumplan/errors.h"
#include "accumplan/step_time.h"
#include "accumplan/window_loop.h"
#include "bindings.h"

namespace py = pybind11;

namespace accumplan {
namespace {

// Asks the Python override `is_out_of_memory(error)` about a Python exception that crossed the
// loop; any C++ exception is not an out-of-memory of the device.
template <class Base>
bool python_out_of_memory(const Base* self, const std::exception& e) {
  const auto* err = dynamic_cast<const py::error_already_set*>(&e);
  if (err == nullptr) return false;
  py::gil_scoped_acquire gil;
  py::function f = py::get_override(self, "is_out_of_memory");
  return f && f(err->value()).template cast<bool>();
}

class PyWindowBackend : public WindowBackend {
 public:
  using WindowBackend::WindowBackend;
  int world_size() const override { PYBIND11_OVERRIDE(int, WindowBackend, world_size); }
  int rank() const override { PYBIND11_OVERRIDE(int, WindowBackend, rank); }
  std::vector<int64_t> sum_over_ranks(const std::vector<int64_t>& values) override {
    PYBIND11_OVERRIDE(std::vector<int64_t>, WindowBackend, sum_over_ranks, values);
  }
  ShareCounts count_share() override { PYBIND11_OVERRIDE_PURE(ShareCounts, WindowBackend, count_share); }
  void begin_attempt() override { PYBIND11_OVERRIDE_PURE(void, WindowBackend, begin_attempt); }
  void run_microbatch(const Microbatch& microbatch, int64_t window_units) override {
    PYBIND11_OVERRIDE_PURE(void, WindowBackend, run_microbatch, microbatch, window_units);
  }
  bool is_out_of_memory(const std::exception& e) const override { return python_out_of_memory<WindowBackend>(this, e); }
  void after_out_of_memory() override { PYBIND11_OVERRIDE_PURE(void, WindowBackend, after_out_of_memory); }
  double loss_sum() override { PYBIND11_OVERRIDE_PURE(double, WindowBackend, loss_sum); }
  double exchange_gradients() override { PYBIND11_OVERRIDE(double, WindowBackend, exchange_gradients); }
  bool exchanges() const override { PYBIND11_OVERRIDE(bool, WindowBackend, exchanges); }
  bool has_scaler() const override { PYBIND11_OVERRIDE(bool, WindowBackend, has_scaler); }
  double loss_scale() const override { PYBIND11_OVERRIDE(double, WindowBackend, loss_scale); }
  bool unscale_finds_non_finite() override { PYBIND11_OVERRIDE(bool, WindowBackend, unscale_finds_non_finite); }
  double gradient_norm() override { PYBIND11_OVERRIDE_PURE(double, WindowBackend, gradient_norm); }
  void scale_gradients(double coefficient) override {
    PYBIND11_OVERRIDE_PURE(void, WindowBackend, scale_gradients, coefficient);
  }
  void optimizer_step(int64_t step) override { PYBIND11_OVERRIDE_PURE(void, WindowBackend, optimizer_step, step); }
  void after_update(bool stepped, const StepEvent& event) override {
    PYBIND11_OVERRIDE(void, WindowBackend, after_update, stepped, event);
  }
  void release_cached() override { PYBIND11_OVERRIDE(void, WindowBackend, release_cached); }
  void drop_gradients() override { PYBIND11_OVERRIDE_PURE(void, WindowBackend, drop_gradients); }
  bool optimizer_state_exists() const override { PYBIND11_OVERRIDE_PURE(bool, WindowBackend, optimizer_state_exists); }
  bool wall_time_is_device_time() const override {
    PYBIND11_OVERRIDE_PURE(bool, WindowBackend, wall_time_is_device_time);
  }
  std::optional<int64_t> budget_bytes() const override {
    PYBIND11_OVERRIDE(std::optional<int64_t>, WindowBackend, budget_bytes);
  }
};

class PyEvalBackend : public EvalBackend {
 public:
  using EvalBackend::EvalBackend;
  void eval_microbatch(int64_t index, int64_t start, int64_t size, bool keep_output) override {
    PYBIND11_OVERRIDE_PURE(void, EvalBackend, eval_microbatch, index, start, size, keep_output);
  }
  bool is_out_of_memory(const std::exception& e) const override { return python_out_of_memory<EvalBackend>(this, e); }
  void after_out_of_memory() override { PYBIND11_OVERRIDE_PURE(void, EvalBackend, after_out_of_memory); }
  void hand_over_output() override { PYBIND11_OVERRIDE_PURE(void, EvalBackend, hand_over_output); }
};

// A Python callable as a std::function argument of WindowOptions; None: no callback.
template <class F>
F callback(const py::object& f) {
  if (f.is_none()) return F();
  return f.cast<F>();
}

// The window's options from train_window's keywords (each optional).
WindowOptions window_options(const py::dict& kw) {
  WindowOptions o;
  auto get = [&](const char* key) { return kw.contains(key) ? py::object(kw[key]) : py::object(py::none()); };
  if (kw.contains("oom_recovery")) o.oom_recovery = kw["oom_recovery"].cast<bool>();
  if (!get("max_grad_norm").is_none()) o.max_grad_norm = kw["max_grad_norm"].cast<double>();
  if (kw.contains("packing")) {
    const std::string name = kw["packing"].cast<std::string>();
    const std::optional<Packing> packing = packing_named(name);
    if (!packing) throw InputError("packing is '" + cut_for_message(name) + "'; use time or fill");
    o.packing = *packing;
  }
  if (kw.contains("ragged_data_fix")) o.ragged_data_fix = kw["ragged_data_fix"].cast<std::string>();
  o.log = callback<std::function<void(const std::string&)>>(get("log"));
  o.before_microbatch = callback<std::function<void(const MicrobatchEvent&)>>(get("before_microbatch"));
  o.after_microbatch = callback<std::function<void(const MicrobatchEvent&, bool)>>(get("after_microbatch"));
  o.before_optimizer_step = callback<std::function<void(int64_t)>>(get("before_optimizer_step"));
  const auto on_replan = callback<std::function<void(const ReplanEvent&)>>(get("on_replan"));
  if (on_replan) o.on_replan = [on_replan](const ReplanEvent& e, const Plan&) { on_replan(e); };
  return o;
}

std::string stats_repr(const WindowStats& s) {
  auto opt = [](const auto& v) { return v ? py::str(py::cast(*v)).cast<std::string>() : std::string("None"); };
  return "WindowStats(samples=" + std::to_string(s.samples) + ", local_samples=" + std::to_string(s.local_samples) +
         ", units=" + std::to_string(s.units) + ", loss=" + py::str(py::float_(s.loss)).cast<std::string>() +
         ", microbatch_sizes=" + py::str(py::cast(s.microbatch_sizes)).cast<std::string>() +
         ", stepped=" + (s.stepped ? "True" : "False") + ", skipped=" + (s.skipped ? "True" : "False") +
         ", skip_reason=" + py::repr(py::str(s.skip_reason)).cast<std::string>() + ", grad_norm=" + opt(s.grad_norm) +
         ", oom_recoveries=" + std::to_string(s.oom_recoveries) +
         ", optimizer_state_ready=" + (s.optimizer_state_ready ? "True" : "False") + ", normalization=" +
         py::repr(py::str(s.normalization)).cast<std::string>() + ", peak_bytes=" + opt(s.peak_bytes) +
         ", predicted_peak_bytes=" + opt(s.predicted_peak_bytes) + ", seconds=" +
         py::str(py::float_(s.seconds)).cast<std::string>() + ")";
}

void bind_events(py::module_& m) {
  py::class_<MicrobatchEvent>(m, "MicrobatchEvent")
      .def_readonly("window", &MicrobatchEvent::window)
      .def_readonly("index", &MicrobatchEvent::index)
      .def_readonly("size", &MicrobatchEvent::size)
      .def_readonly("count", &MicrobatchEvent::count)
      .def_readonly("attempt", &MicrobatchEvent::attempt)
      .def_readonly("padded_tokens", &MicrobatchEvent::padded_tokens);
  py::class_<ReplanEvent>(m, "ReplanEvent")
      .def_readonly("window", &ReplanEvent::window)
      .def_readonly("failing_size", &ReplanEvent::failing_size)
      .def_readonly("microbatch_sizes", &ReplanEvent::microbatch_sizes)
      .def_readonly("note", &ReplanEvent::note)
      .def_readonly("line", &ReplanEvent::line);
  py::class_<StepEvent>(m, "StepEvent")
      .def_readonly("optimizer_steps", &StepEvent::optimizer_steps)
      .def_readonly("window", &StepEvent::window)
      .def_readonly("loss", &StepEvent::loss);
  py::class_<Microbatch>(m, "Microbatch")
      .def_readonly("where", &Microbatch::where)
      .def_readonly("start", &Microbatch::start)
      .def_readonly("samples", &Microbatch::samples)
      .def_readonly("padded_length", &Microbatch::padded_length);
  py::class_<ShareCounts>(m, "ShareCounts")
      .def(py::init([](int64_t samples, int64_t units, int64_t valid_tokens, std::vector<int64_t> lengths,
                       std::string normalization) {
             return ShareCounts{samples, units, valid_tokens, std::move(lengths), std::move(normalization)};
           }),
           py::arg("samples"), py::arg("units"), py::arg("valid_tokens") = 0, py::arg("lengths") = std::vector<int64_t>{},
           py::arg("normalization") = "samples");
}

void bind_stats(py::module_& m) {
  py::class_<WindowStats>(m, "WindowStats", "what one window did (accumplan/window_loop.h)")
      .def(py::init<>())
      .def_readwrite("samples", &WindowStats::samples)
      .def_readwrite("units", &WindowStats::units)
      .def_readwrite("valid_tokens", &WindowStats::valid_tokens)
      .def_readwrite("local_samples", &WindowStats::local_samples)
      .def_readwrite("microbatch_sizes", &WindowStats::microbatch_sizes)
      .def_readwrite("microbatch_rounds", &WindowStats::microbatch_rounds)
      .def_readwrite("loss", &WindowStats::loss)
      .def_readwrite("grad_norm", &WindowStats::grad_norm)
      .def_readwrite("stepped", &WindowStats::stepped)
      .def_readwrite("optimizer_state_ready", &WindowStats::optimizer_state_ready)
      .def_readwrite("skipped", &WindowStats::skipped)
      .def_readwrite("skip_reason", &WindowStats::skip_reason)
      .def_readwrite("oom_recoveries", &WindowStats::oom_recoveries)
      .def_readwrite("loss_scale", &WindowStats::loss_scale)
      .def_readwrite("normalization", &WindowStats::normalization)
      .def_readwrite("seconds", &WindowStats::seconds)
      .def_readwrite("microbatch_seconds", &WindowStats::microbatch_seconds)
      .def_readwrite("predicted_seconds", &WindowStats::predicted_seconds)
      .def_readwrite("predicted_peak_bytes", &WindowStats::predicted_peak_bytes)
      .def_readwrite("peak_bytes", &WindowStats::peak_bytes)
      .def_readwrite("reserved_peak_bytes", &WindowStats::reserved_peak_bytes)
      .def("__repr__", &stats_repr);
}

py::object cost_dict(const std::optional<TokenStepCost>& cost) {
  if (!cost) return py::none();
  py::dict d;
  d["per_microbatch"] = cost->per_microbatch;
  d["per_token"] = cost->per_token;
  d["per_token_squared"] = cost->per_token_squared;
  d["token_seconds"] = cost->token_seconds;
  return std::move(d);
}

void bind_loop(py::module_& m) {
  py::class_<WindowCounts>(m, "WindowCounts", "a window's counts as every rank agreed on them")
      .def_readonly("units", &WindowCounts::units)
      .def_readonly("samples", &WindowCounts::samples)
      .def_readonly("valid_tokens", &WindowCounts::valid_tokens)
      .def_readonly("rank_samples", &WindowCounts::rank_samples)
      .def_readonly("longest_sequence", &WindowCounts::longest_sequence);
  py::class_<WindowBackend, PyWindowBackend>(m, "WindowBackend").def(py::init<>());
  py::class_<EvalBackend, PyEvalBackend>(m, "EvalBackend").def(py::init<>());
  py::class_<WindowLoop>(m, "WindowLoop", "the one window algorithm over a plan it re-plans in place")
      .def(py::init<Plan&>(), py::arg("plan"), py::keep_alive<1, 2>())
      .def("accumulate",
           [](WindowLoop& loop, WindowBackend& backend, const std::vector<int64_t>& sizes, const py::kwargs& kw) {
             return loop.accumulate(backend, window_options(kw), sizes);
           },
           py::arg("backend"), py::arg("sizes") = std::vector<int64_t>{},
           "the gradient half of a window (counts, rounds, recovery, clipping); options as keywords")
      .def("count_window",
           [](const WindowLoop& loop, WindowBackend& backend, const std::string& during) {
             return loop.count_window(backend, during);
           },
           py::arg("backend"), py::arg("during"),
           "step 2 alone: this rank's share counted and agreed with every rank's (WindowCounts); a share that "
           "cannot be counted raises on every rank, the others naming it and `during`")
      .def("apply",
           [](WindowLoop& loop, WindowBackend& backend, WindowStats& stats, const py::kwargs& kw) {
             loop.apply(backend, window_options(kw), stats);
           },
           py::arg("backend"), py::arg("stats"), "the update half: the optimizer step, the scaler, the scheduler")
      .def("packing_cost", [](const WindowLoop& loop, const std::string& packing) {
             return cost_dict(loop.packing_cost(packing_named(packing).value_or(Packing::Time)));
           }, py::arg("packing") = "time", "the step cost the next packed window is cut by (None: fill)")
      .def("observe_window",
           [](WindowLoop& loop, const std::vector<std::tuple<int64_t, int64_t, double>>& timed) {
             std::vector<TimedMicrobatch> t;
             for (const auto& [b, l, s] : timed) t.push_back({b, l, s});
             loop.packing_fit().observe_window(t);
           },
           py::arg("microbatches"), "a window's (sequences, padded length, seconds) microbatches, then a refit")
      .def_property_readonly("refits", [](WindowLoop& loop) { return loop.packing_fit().model().refits(); })
      .def_property_readonly("held", [](WindowLoop& loop) { return loop.packing_fit().model().held(); })
      .def_property_readonly("window_index", &WindowLoop::window_index);
  py::class_<EvalOutcome>(m, "EvalOutcome")
      .def_readonly("microbatch_sizes", &EvalOutcome::microbatch_sizes)
      .def_readonly("oom_recoveries", &EvalOutcome::oom_recoveries);
  m.def("run_eval",
        [](EvalBackend& backend, int64_t samples, const std::vector<int64_t>& sizes, bool oom_recovery,
           bool keep_outputs, const py::object& log, const py::object& before_microbatch) {
          EvalLoopOptions o;
          o.oom_recovery = oom_recovery;
          o.keep_outputs = keep_outputs;
          o.log = callback<std::function<void(const std::string&)>>(log);
          o.before_microbatch = callback<std::function<void(int64_t, int64_t)>>(before_microbatch);
          return run_eval(backend, samples, sizes, o);
        },
        py::arg("backend"), py::arg("samples"), py::arg("sizes"), py::arg("oom_recovery"), py::arg("keep_outputs"),
        py::arg("log") = py::none(), py::arg("before_microbatch") = py::none(),
        "the evaluation loop: microbatches of `sizes`, re-split after an out-of-memory");
}

}  // namespace

void bind_window_loop(py::module_& m) {
  bind_events(m);
  bind_stats(m);
  bind_loop(m);
}

}  // namespace accumplan
