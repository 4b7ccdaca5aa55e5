// profiling/probe_runner.h — real training windows on the device, measured by a MemoryProbe.
//
// What it is: the profiler's engine (docs/architecture.md "What the profiler measures").
// It measures by running the executor (executor/executor.h) — the same step, gradient lifetime,
// AMP mode, clipping and optimizer step that `accumplan run` uses — so a plan's peak is the peak
// training reaches. Constructed with an installed probe, it enforces the budget, loads the model
// (so weights are counted), and measures persistent memory: weights (probe delta across the
// load), gradients (delta across the first window's backward), optimizer state (delta across
// optimizer construction plus its first real step — Adagrad allocates its state in the
// constructor, Adam on the first step), in one window of kPersistentWindowSamples (search.h). It
// is the C++ WindowRunner of the measurement search
// (accumplan/search.h, which decides which windows run: probe sizes, tail, confirm, climb,
// bisect); profile() and plan_and_confirm() hand this runner to that search.
//   measure(b)          a window of two microbatches of b (the first with no gradient resident,
//                       the second with the first's) and the optimizer step → the microbatches'
//                       peak, the first one's, the optimizer step's, and the faster step's seconds
// Variable-length data (an input spec with T, --seq-len): a window's sequences are synthetic,
// exactly T long (the T the search asks for).
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
#include "accumplan/search.h"
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
  // The optimizer state sharded over this many ranks (ZeRO-1, accumplan/sharding.h): the optimizer
  // holds the parameters of the largest share only, and the profile records the sharding. 0: not.
  int64_t shard_world_size = 0;
  // The ranks the plan is for: from 2 on, every window makes a rank's gradient exchange (and, with
  // the state sharded, its parameter broadcast) through a rehearsal communicator, so the peaks
  // measured hold the exchange's flat buffers as every rank's window will.
  int64_t world_size = 1;
  std::function<void(const std::string&)> progress;  // one line per real step, no trailing newline
};

class ProbeRunner final : public WindowRunner {
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
  WindowMeasurement measure_window(const std::vector<int64_t>& sizes);

  // The probe schedule → a Profile holding every point and trial.
  // eval: then one evaluation window at its two largest sizes (Search::profile_eval; `accumplan
  // profile`, for `accumplan plan` to state an eval batch from).
  Profile profile(bool eval = false, bool keep_outputs = false);

  // Plans from `profile` and confirms by real steps (see the file comment). Appends confirm
  // trials to profile.trials. Throws InfeasibleError when not even microbatch 1 runs. eval: then
  // the evaluation batch beside the plan (Search::plan_eval, at most two eval windows; plan.eval).
  Plan plan_and_confirm(Profile& profile, PlanRequest request, bool eval = false, bool keep_outputs = false);

  const std::vector<Trial>& trials() const { return trials_; }
  // What sharding the optimizer state over `world_size` ranks frees on the largest share
  // (--shard auto weighs it); InputError when the parameters differ in dtype.
  int64_t freed_by_sharding(int64_t world_size) const;

  // WindowRunner: the executor's window under the budget the search asks for, restored after.
  WindowMeasurement run_window(const std::vector<int64_t>& sizes, int64_t seq_len,
                               std::optional<int64_t> limit_bytes) override;
  std::optional<WindowMeasurement> run_rank_window(int64_t rank, const std::vector<int64_t>& sizes, int64_t seq_len,
                                                   std::optional<int64_t> limit_bytes) override;
  // WindowRunner: an evaluation window (executor/evaluate.h, recovery off) with the weights and
  // optimizer state resident and the gradients freed.
  std::optional<EvalMeasurement> run_eval_window(const std::vector<int64_t>& sizes, int64_t seq_len,
                                                 std::optional<int64_t> limit_bytes, bool keep_outputs) override;

 private:
  // What the search needs to know of this device and budget.
  SearchSettings search_settings() const;
  // The limit of a window measured outside the search: none while persistent memory alone is over
  // the budget (as it was measured), else the budget.
  WindowBudget own_budget() const { return persistent_over_budget_ ? WindowBudget::Lifted : WindowBudget::Enforced; }
  void load_and_measure_persistent();
  // Runs one executor window of these microbatch sizes and its optimizer step, budget enforced.
  WindowMeasurement window(const std::vector<int64_t>& sizes);
  EvalMeasurement eval_window(const std::vector<int64_t>& sizes, bool keep_outputs);
  // The frame of every measured window: its samples made as host data with the budget lifted, the
  // budget enforced beside them, then body(data, host bytes to leave out of every peak). Returns
  // true after an out-of-memory (the gradients dropped, the cache released); a model's rejection
  // names the inputs; any other failure propagates. The budget is as it was after.
  bool measured(const std::vector<int64_t>& sizes, const std::function<void(const Batch&, int64_t)>& body);
  // Runs `run` under the limit the search asked for; the planned budget is enforced again after.
  void with_budget(std::optional<int64_t> limit_bytes, const std::function<void()>& run);
  // How `accumplan run` trains (loss, AMP, clipping), with OOM reported rather than recovered.
  ExecutorOptions executor_options();
  Batch window_data(int64_t samples);
  bool is_oom(const std::exception& e) const;
  // Rethrows the model's rejection naming where the inputs came from (--batch-file or --input).
  [[noreturn]] void name_the_inputs(const ModelRejectedInputError& e) const;
  void say(const std::string& line) const;
  // Enforces `budget` on the probe, plus the host data (the --batch-file) it must not count.
  void enforce(std::optional<int64_t> budget);
  // The device's memory as a profile records it: on CPU the budget, without the host data.
  int64_t device_total_bytes() const;

  MemoryProbe& probe_;
  RunnerOptions options_;
  torch::Device device_;
  LoadedModel model_;
  // The parameters the optimizer holds: all, or under RunnerOptions::shard_world_size the largest share's.
  std::vector<at::Tensor> shard_held_parameters();
  // The optimizer state of the trainable parameters sharded over `world_size` ranks (each
  // parameter's rank into `owners` when given), by the state one step leaves on them.
  Sharding shard_over(int64_t world_size, std::vector<int64_t>* owners) const;
  std::vector<at::Tensor> params_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  LossConfig loss_;
  AmpMode amp_ = AmpMode::None;
  std::vector<TensorSpec> input_specs_;
  std::optional<TensorSpec> target_spec_;
  std::optional<Batch> file_batch_;
  std::optional<int64_t> budget_bytes_;
  bool persistent_over_budget_ = false;
  bool warmed_up_ = false;  // the first window's executor ran one sample first, timed by no window
  Persistent persistent_;
  std::optional<Sharding> sharding_;  // RunnerOptions::shard_world_size: the largest share the optimizer holds
  std::vector<int64_t> owners_;        // with sharding_: each trainable parameter's owning rank
  std::unique_ptr<Communicator> rehearsal_;  // RunnerOptions::world_size >= 2: the exchange every window makes
  int64_t declared_parameter_bytes_ = 0;
  int64_t declared_weight_bytes_ = 0;
  uint64_t next_seed_ = 0;
  std::vector<Trial> trials_;
  // Variable-length data: the lengths planned for, and the length of the windows being run.
  int64_t host_bytes_ = 0;  // the --batch-file's bytes held through the probe (CPU), outside every peak
  std::optional<SeqLenRange> seq_range_;
  int64_t seq_len_ = 0;
  std::string seq_len_source() const {
    return options_.seq_len_source.empty() ? "--seq-len " + options_.setup.seq_len->text() : options_.seq_len_source;
  }
};

}  // namespace accumplan
