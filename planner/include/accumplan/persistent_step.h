// accumplan/persistent_step.h — the persistent-memory step's protocol and its verdicts, for every
// executor that measures one: the profiler (src/profiling/probe_runner.cpp) and accumplan.plan's
// Python runner (python/accumplan/measure.py, through accumplan._core).
//
// What it is: the rule for the step before the search (one window of kPersistentWindowSamples,
// accumplan/search.h, whose deltas are the gradients and the optimizer state). Attempt 0 runs
// under the budget; if it runs out of memory and there is a budget, attempt 1 runs without one,
// so the error can give the breakdown, and persistent memory is over the budget (the search then
// runs its windows Lifted). On a simulated device (the CPU) "without the budget" is still held
// to `lifted_cap_bytes`, the host-data limit (accumplan/host_data.h): a 64 MiB budget's fallback
// once took 1.2 GiB of the host unbounded. Each attempt is recorded as a probe trial, its fit
// judged here; an attempt that runs out of memory with no budget left to lift is infeasible.
// What it is not: the measurement (the executor reads its own probe) nor the search's judgement
// of its windows (Search::run).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "accumplan/schema.h"

namespace accumplan {

class PersistentStep {
 public:
  explicit PersistentStep(std::optional<int64_t> budget_bytes, std::optional<int64_t> lifted_cap_bytes = std::nullopt)
      : budget_bytes_(budget_bytes), lifted_cap_bytes_(lifted_cap_bytes) {}

  // The budget the next attempt runs under (nullopt: none); after an out-of-memory under the
  // budget, the lifted cap.
  std::optional<int64_t> attempt_budget_bytes() const { return over_budget_ ? lifted_cap_bytes_ : budget_bytes_; }
  // The trial of an attempt that ran, its peak `peak_bytes` (its data excluded): fit when there is
  // no budget or the peak is within it (the budget's, also for an attempt that ran without it).
  Trial measured(int64_t peak_bytes, double seconds) const;
  // The trial of an attempt that ran out of memory. Afterwards persistent memory is over the
  // budget and the next attempt runs without one (under the lifted cap); InfeasibleError naming
  // `device_name` (and the cap) when this attempt already ran without the budget, or had none.
  Trial out_of_memory(double seconds, const std::string& device_name);
  // After the attempt's microbatches: InputError when the window's loss is not finite, for then the
  // optimizer does not step, its state is never made, and no window measures what training holds.
  static void check_loss(double loss);
  // Whether an attempt under the budget ran out of memory (the search's persistent_over_budget).
  bool over_budget() const { return over_budget_; }

 private:
  std::optional<int64_t> budget_bytes_;
  std::optional<int64_t> lifted_cap_bytes_;
  bool over_budget_ = false;
};

}  // namespace accumplan
