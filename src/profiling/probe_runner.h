// runner/probe_runner.h — real training steps on the device, measured by a MemoryProbe.
//
// What it is: the profiler's engine (DESIGN.md "What the profiler measures"). Constructed with an
// installed probe, it enforces the budget, loads the model (so weights are counted), and measures
// persistent memory: weights (probe delta across the load), gradients (delta across the first
// backward), optimizer state (delta across optimizer construction plus its first real step —
// Adagrad allocates its state in the constructor, Adam on the first step). Then
//   measure(b)          a window of two accumulated microbatches of b samples and an optimizer
//                       step, then reset_peak and one further steady-state microbatch (gradients
//                       and optimizer state resident) → its peak, the optimizer-step peak, seconds
//   profile()           measure(b) for b = 1, 2, 4, 8 bounded by the per-rank target → Profile
//   plan_and_confirm()  make_plan, then a real step at plan.micro_batch with the budget enforced;
//                       on OOM or over budget, bisect between the largest size that fit and the
//                       smallest that failed, re-planning with max_micro_batch, until confirmed.
// Every real step is recorded as a Trial. After an OOM every reference of the failed step is
// dropped and gradients are zeroed, so memory returns to its steady-state baseline.
// What it is not: a trainer. Loss weighting here is only as exact as memory measurement needs
// (each microbatch's mean loss divided by the microbatches in the window); src/executor/ owns
// exact weighting.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "accumplan/memory_probe.h"
#include "accumplan/schema.h"
#include "accumplan/solver.h"
#include "accumplan/units.h"
#include "runtime/batch.h"
#include "runtime/model.h"

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
  std::string device = "cpu";           // "cpu", "cuda", "cuda:1"
  BudgetSpec budget;                    // enforced while measuring; unset: the device's own limit
  std::vector<int64_t> probe_sizes = {1, 2, 4, 8};
  int64_t max_probe_micro_batch = 0;    // per-rank target: probes above it are skipped (0: none)
  uint64_t seed = 1234;                 // synthetic data
  std::function<void(const std::string&)> progress;  // one line per real step, no trailing newline
};

// One measure(b): a real window plus one steady-state microbatch.
struct StepMeasurement {
  int64_t micro_batch = 0;
  bool oom = false;                      // an allocation failed (the step did not finish)
  bool fit = false;                      // finished, and every peak within the budget
  int64_t peak_bytes = 0;                // steady-state microbatch peak (0 after an OOM)
  int64_t optimizer_step_peak_bytes = 0; // peak during optimizer.step()
  int64_t max_peak_bytes = 0;            // highest peak over the whole sequence
  std::optional<int64_t> reserved_peak_bytes;  // caching allocators only
  double step_seconds = 0;               // the steady-state microbatch, forward + backward
  double seconds = 0;                    // the whole sequence (its cost as a Trial)
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

  // One real window + steady-state microbatch at b. An OOM is reported, not thrown.
  StepMeasurement measure(int64_t micro_batch);

  // The probe schedule → a Profile holding every point and trial.
  Profile profile();

  // Plans from `profile` and confirms by real steps (see the file comment). Appends confirm
  // trials to profile.trials. Throws InfeasibleError when not even microbatch 1 runs.
  Plan plan_and_confirm(Profile& profile, PlanRequest request);

  const std::vector<Trial>& trials() const { return trials_; }

 private:
  void load_and_measure_persistent();
  void microbatch(int64_t micro_batch, int64_t microbatches_in_window);
  void zero_gradients();
  void say(const std::string& line) const;
  // Leaves out small sizes whose peak does not follow the line of the larger ones, and probes
  // closer to the budget's predicted maximum when it is far beyond the probes (numbers in the .cpp).
  void extend_linear_tail(Profile& p, int64_t largest_scheduled,
                          const std::function<void(const StepMeasurement&)>& record);
  int64_t probe_peak() const;

  MemoryProbe& probe_;
  RunnerOptions options_;
  torch::Device device_;
  LoadedModel model_;
  std::vector<at::Tensor> params_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
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
};

// "cuda:1" → {"cuda", 1}; InputError for anything but cpu, cuda, cuda:N.
std::pair<std::string, int> parse_device(const std::string& text);

}  // namespace accumplan
