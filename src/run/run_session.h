// run/run_session.h — the driver of `accumplan run`: a data set's windows, epoch after
// epoch, each rank's share of each, through one Executor; the trace and the per-window record;
// the confirmation of a re-planned plan; the replica check of a group; the run's RunRecord
// (accumplan/schema.h, `--stats`).
// What it is: everything `accumplan run` does besides turning flags into options and writing
// files. What it is not: the window algorithm (Executor), the data loading (run_data.h), the
// flags (cli/executor_commands.cpp), or a writer of files (the caller writes what it returns).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <torch/optim.h>
#include <torch/script.h>

#include "accumplan/schema.h"
#include "executor/evaluate.h"
#include "executor/executor.h"
#include "observe/trace.h"

namespace accumplan {

struct RunSessionOptions {
  int64_t total_windows = 0;     // windows to run, cycling over the data's windows (epochs)
  // The data set's bytes inside the probe (CPU: the counting allocator holds host data too): left
  // out of every peak the session reports, as a device would never hold them.
  int64_t host_data_bytes = 0;
  RunTrace* trace = nullptr;     // --trace; not owned
  // Wraps each window's step (the CLI names the data source in an error). Default: just runs it.
  std::function<WindowStats(const std::function<WindowStats()>&)> guard;
  // After each window: its 0-based index, the samples seen so far, and its record.
  std::function<void(int64_t window, int64_t samples_done, const RunWindowRecord&)> on_window;
  // --eval-data: evaluated (executor/evaluate.h) in the plan's eval microbatches after every
  // eval_every windows, else (0) after the last; the gradients freed first, as
  // zero_grad(set_to_none=True) leaves them in a mid-training evaluation. Not owned.
  const Batch* eval_data = nullptr;
  int64_t eval_every = 0;
  std::function<void(const RunEvalRecord&)> on_eval;
};

class RunSession {
 public:
  // `eo` gets the session's hooks (re-plan counting, the trace) added to its own; the executor is
  // made here. `windows` are [start, count) of one epoch of `data` (plan_windows).
  RunSession(torch::jit::Module module, torch::optim::Optimizer& optimizer, const Plan& plan, ExecutorOptions eo,
             const Batch& data, std::vector<std::pair<int64_t, int64_t>> windows, RunSessionOptions options);

  // The executor's hooks hold `this`: a session stays where it was made.
  RunSession(const RunSession&) = delete;
  RunSession& operator=(const RunSession&) = delete;

  // Runs every window; a rank of a group steps its strided share of each (stride_window).
  void run();

  // The plan the run ended on: after an OOM recovery its re-planned sizes have run whole windows
  // within the budget, a real confirmation, and it says so.
  Plan final_plan() const;
  // A group: true when every rank's parameters hash the same after the run (one collective).
  bool replicas_identical();
  // What the run did, on top of `base` (the run's constants: setup, budget, model, probe), with
  // the final plan and whether the replicas agree.
  RunRecord record(RunRecord base, const Plan& final_plan, bool replicas_identical) const;
  // The probe's device timeline (CUPTI), where it has one, placed on the trace.
  void add_device_timeline(const MemoryProbe& probe);

  // Why the first skipped window was skipped ("" when none was): a run that took no optimizer
  // step at all is refused with it.
  const std::string& first_skip_reason() const { return first_skip_reason_; }

  const Executor& executor() const { return *executor_; }
  // A peak with the host data left out.
  std::optional<int64_t> device_peak(std::optional<int64_t> peak) const;

 private:
  void attach_hooks(ExecutorOptions& eo);
  bool evaluates_after(int64_t window) const;
  RunEvalRecord evaluate_after(int64_t window);

  torch::jit::Module module_;
  const Batch& data_;
  std::vector<std::pair<int64_t, int64_t>> windows_;
  RunSessionOptions options_;
  Communicator* comm_ = nullptr;
  MemoryProbe* probe_ = nullptr;
  int64_t window_replans_ = 0;  // the executor's re-plans in the current window
  std::vector<RunWindowRecord> series_;
  std::vector<RunEvalRecord> evaluations_;
  ExecutorOptions eval_base_;  // the loss, AMP, probe, recovery and log the evaluations use too
  std::optional<double> last_loss_;
  std::string first_skip_reason_;
  CollectiveCounts training_collectives_;  // before the replica check adds its own
  std::unique_ptr<Executor> executor_;
};

}  // namespace accumplan
