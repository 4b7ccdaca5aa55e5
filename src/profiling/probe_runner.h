// profiling/probe_runner.h — real training windows on the device, measured by a MemoryProbe.
//
// What it is: the profiler's engine (docs/architecture.md "What the profiler measures").
// It measures by running the executor (executor/executor.h) — the same step, gradient lifetime,
// AMP mode, clipping and optimizer step that `accumplan run` uses — so a plan's peak is the peak
// training reaches. Constructed with an installed probe, it enforces the budget, loads the model
// (so weights are counted), and measures persistent memory: weights (probe delta across the
// load), gradients (delta across the first window's backward), optimizer state (delta across
// optimizer construction plus its first real step — Adagrad allocates its state in the
// constructor, Adam on the first step). Then
//   measure(b)          a window of two microbatches of b (the first with no gradient resident,
//                       the second with the first's) and the optimizer step → the microbatches'
//                       peak, the first one's, the optimizer step's, and the faster step's seconds
//   profile()           measure(b) for b = 2, 4 (bounded by the per-rank target), then, while the
//                       fit predicts more than 4x the largest size measured, half that prediction
//                       → Profile
// Variable-length data (an input spec with T, --seq-len): profile() measures a (b, T) grid —
// b = 1, 2 at T = T_max/4, T_max/2, T_max — plus, when the fit predicts far more sequences at
// T_max, one window at half that; plan_and_confirm() confirms the token plan with a window of
// token_budget / T_max sequences of T_max tokens (re-planning below a failure, four windows at
// most). Every window's sequences are synthetic, exactly T long.
//   plan_and_confirm()  make_plan; a plan no real window covers is confirmed by a window at its
//                       largest allowed size (on failure: bisect between the largest size that
//                       ran and the smallest that failed); then climb: while the refit predicts a
//                       larger size within the budget less the margin's run-to-run part, run a
//                       window there (at most two, none after a failure). The plan is solved
//                       from the profile with every window in it, so its sizes are covered by a
//                       real window.
// Every window is recorded as a Trial. The window's samples live on the host, as `accumplan run`
// keeps its data, and their bytes are not part of any peak (on the CPU device, where host memory
// is the device, they are subtracted).
// What it is not: a trainer. Weighting and the window algorithm are the executor's.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "accumplan/memory_probe.h"
#include "accumplan/schema.h"
#include "accumplan/solver.h"
#include "accumplan/tensor_spec.h"
#include "accumplan/units.h"
#include "executor/executor.h"
#include "runtime/amp.h"
#include "runtime/batch.h"
#include "runtime/loss.h"
#include "runtime/model.h"
#include "runtime/step.h"

namespace torch::optim {
class Optimizer;
}

namespace accumplan {

struct RunnerOptions {
  std::string model;                    // a TorchScript file or builtin:NAME
  // Builds the model instead of load_model(model) (tests build modules in place). Called after
  // the probe's budget is in force, so its allocations are counted as weights.
  std::function<LoadedModel(const torch::Device&)> loader;
  Setup setup;                          // optimizer, lr, loss, input/target specs (complete: no defaults applied here)
  std::optional<std::string> batch_file;  // replaces synthetic inputs; setup.inputs/target are then derived from it
  // How messages name where setup.seq_len came from: "--seq-len 16..1024", or the
  // --seq-len-file it was read from; empty: "--seq-len " + setup.seq_len.
  std::string seq_len_source;
  std::string device = "cpu";           // "cpu", "cuda", "cuda:1"
  BudgetSpec budget;                    // enforced while measuring; unset: the device's own limit
  // Measured first; then, while the fit predicts more than 4x the largest, one size halfway toward
  // the budget's predicted maximum (probe_runner.cpp has the numbers behind both).
  std::vector<int64_t> probe_sizes = {2, 4};
  int64_t max_probe_micro_batch = 0;    // per-rank target: probes above it are skipped (0: none)
  uint64_t seed = 1234;                 // synthetic data
  std::function<void(const std::string&)> progress;  // one line per real step, no trailing newline
};

// One real window: the peaks of its microbatches and of its optimizer step, persistent memory
// included, the window's data excluded.
struct WindowMeasurement {
  int64_t micro_batch = 0;
  std::vector<int64_t> sizes;            // the window's microbatch sizes, in order
  bool oom = false;                      // an allocation failed (the window did not finish)
  bool fit = false;                      // finished, and every peak within the budget
  int64_t peak_bytes = 0;                // the microbatches' peak (0 after an OOM)
  int64_t first_microbatch_peak_bytes = 0; // the first microbatch's, no gradient resident yet
  int64_t steady_peak_bytes = 0;         // the later microbatches', gradients resident (0: k = 1)
  int64_t optimizer_step_peak_bytes = 0; // peak during optimizer.step()
  int64_t max_peak_bytes = 0;            // highest peak over the whole window
  std::optional<int64_t> reserved_peak_bytes;  // caching allocators only
  double step_seconds = 0;               // the faster microbatch, forward + backward
  double seconds = 0;                    // the whole window (its cost as a Trial)
};

class ProbeRunner {
 public:
  // `probe` must outlive the runner. Throws InputError for bad specs, a bad model or batch file,
  // an unknown optimizer or loss, and the model's own error if it rejects the inputs.
  ProbeRunner(MemoryProbe& probe, RunnerOptions options);
  ~ProbeRunner();
  ProbeRunner(const ProbeRunner&) = delete;
  ProbeRunner& operator=(const ProbeRunner&) = delete;

  const Persistent& persistent() const { return persistent_; }
  const ModelInfo& model_info() const { return model_.info; }
  const Setup& setup() const { return options_.setup; }
  torch::jit::Module& module() { return model_.module; }
  // What the module and the optimizer say they hold, to compare with what the probe measured.
  int64_t declared_parameter_bytes() const { return declared_parameter_bytes_; }
  int64_t declared_weight_bytes() const { return declared_weight_bytes_; }  // parameters + buffers
  int64_t declared_optimizer_state_bytes() const;
  // The budget enforced while measuring, if any.
  std::optional<int64_t> budget_bytes() const { return budget_bytes_; }
  // True when persistent memory alone did not fit the budget (it was measured without it).
  bool persistent_over_budget() const { return persistent_over_budget_; }

  // One real window of two microbatches of b. An OOM is reported, not thrown.
  WindowMeasurement measure(int64_t micro_batch);
  // One real window of exactly these microbatch sizes (e.g. {T}: a whole batch in one microbatch,
  // no gradient resident while it runs). An OOM is reported, not thrown.
  WindowMeasurement measure_window(const std::vector<int64_t>& sizes) { return window(sizes); }

  // The probe schedule → a Profile holding every point and trial.
  Profile profile();

  // Plans from `profile` and confirms by real steps (see the file comment). Appends confirm
  // trials to profile.trials. Throws InfeasibleError when not even microbatch 1 runs.
  Plan plan_and_confirm(Profile& profile, PlanRequest request);

  const std::vector<Trial>& trials() const { return trials_; }

 private:
  void load_and_measure_persistent();
  // Runs one executor window of these microbatch sizes and its optimizer step, budget enforced.
  WindowMeasurement window(const std::vector<int64_t>& sizes);
  Plan window_plan(const std::vector<int64_t>& sizes) const;
  // How `accumplan run` trains (loss, AMP, clipping), with OOM reported rather than recovered.
  ExecutorOptions executor_options();
  Batch window_data(int64_t samples);
  bool is_oom(const std::exception& e) const;
  // Rethrows the model's rejection naming where the inputs came from (--batch-file or --input).
  [[noreturn]] void name_the_inputs(const ModelRejectedInputError& e) const;
  void say(const std::string& line) const;
  // Probes closer to the budget's predicted maximum when it is far beyond the probes (numbers in
  // the .cpp).
  void extend_linear_tail(Profile& p, int64_t largest_scheduled,
                          const std::function<void(const WindowMeasurement&)>& record);
  int64_t probe_peak() const;
  // Enforces `budget` on the probe, plus the host data (the --batch-file) it must not count.
  void enforce(std::optional<int64_t> budget);
  // Whether windows may run past the budget: only a simulated one (MemoryProbe::
  // budget_is_simulated), and only when set. On a real device the budget is never raised.
  bool can_pass_budget() const;
  // Runs `window` under twice the budget where can_pass_budget(), and restores the budget after,
  // also when it throws: a window past the budget is then a measured point the fit learns from,
  // not just an out-of-memory (numbers at the callers). Elsewhere it runs under the budget.
  WindowMeasurement past_the_budget(const std::function<WindowMeasurement()>& window);
  // The device's memory as a profile records it: on CPU the budget, without the host data.
  int64_t device_total_bytes() const;
  // Variable-length data (inputs with T): the (b, T) grid and the confirmation at the planned
  // token budget with the longest sequence.
  void profile_tokens(Profile& p);
  Plan plan_and_confirm_tokens(Profile& profile, PlanRequest request);
  // One window of two microbatches of b sequences of exactly t tokens; past the budget (twice it)
  // where the budget is only simulated, judged against the budget.
  WindowMeasurement measure_tokens(int64_t micro_batch, int64_t seq_len, bool past_budget);

  MemoryProbe& probe_;
  RunnerOptions options_;
  torch::Device device_;
  LoadedModel model_;
  std::vector<at::Tensor> params_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  LossConfig loss_;
  AmpMode amp_ = AmpMode::None;
  std::vector<TensorSpec> input_specs_;
  std::optional<TensorSpec> target_spec_;
  std::optional<Batch> file_batch_;
  std::optional<int64_t> budget_bytes_;
  bool persistent_over_budget_ = false;
  Persistent persistent_;
  int64_t declared_parameter_bytes_ = 0;
  int64_t declared_weight_bytes_ = 0;
  uint64_t next_seed_ = 0;
  std::vector<Trial> trials_;
  // Variable-length data: the lengths planned for, and the length of the windows being run.
  int64_t host_bytes_ = 0;  // the --batch-file's bytes held through the probe (CPU), outside every peak
  std::optional<SeqLenRange> seq_range_;
  int64_t seq_len_ = 0;
  std::string seq_len_source() const {
    return options_.seq_len_source.empty() ? "--seq-len " + options_.setup.seq_len : options_.seq_len_source;
  }
};

}  // namespace accumplan
