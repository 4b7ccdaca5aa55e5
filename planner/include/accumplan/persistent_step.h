// accumplan/persistent_step.h — the persistent-memory step's protocol and its verdicts, for every
// executor that measures one: the profiler (src/profiling/probe_runner.cpp) and accumplan.plan's
// Python runner (python/accumplan/measure.py, through accumplan._core).
//
// What it is: the rule for the step before the search (one window of kPersistentWindowSamples,
// accumplan/search.h, whose deltas are the gradients and the optimizer state). Attempt 0 runs
// under the budget; if it runs out of memory and there is a budget, attempt 1 runs without one,
// so the error can give the breakdown, and persistent memory is over the budget (the search then
// runs its windows Lifted). Each attempt is recorded as a probe trial, its fit judged here; an
// attempt that runs out of memory with no budget left to lift is infeasible.
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
  explicit PersistentStep(std::optional<int64_t> budget_bytes) : budget_bytes_(budget_bytes) {}

  // The budget the next attempt runs under (nullopt: none).
  std::optional<int64_t> attempt_budget_bytes() const { return over_budget_ ? std::nullopt : budget_bytes_; }
  // The trial of an attempt that ran, its peak `peak_bytes` (its data excluded): fit when there is
  // no budget or the peak is within it (the budget's, also for an attempt that ran without it).
  Trial measured(int64_t peak_bytes, double seconds) const;
  // The trial of an attempt that ran out of memory. Afterwards persistent memory is over the
  // budget and the next attempt runs without one; InfeasibleError naming `device_name` when this
  // attempt already ran without a budget.
  Trial out_of_memory(double seconds, const std::string& device_name);
  // Whether an attempt under the budget ran out of memory (the search's persistent_over_budget).
  bool over_budget() const { return over_budget_; }

 private:
  std::optional<int64_t> budget_bytes_;
  bool over_budget_ = false;
};

}  // namespace accumplan
