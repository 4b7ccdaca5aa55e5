// runtime/host_data.h — host data (a data set held outside the training step) counted apart from
// the step's memory.
// What it is: the one rule `accumplan run` and the profiler share. On the CPU device the counting
// allocator sees the data set too (a device would not hold it): its bytes, measured around the
// load, are left out of every peak and added to the enforced budget, so only the training step is
// held to the budget. A GPU probe does not count host allocations, so there they are 0.
// The limit on host data and the host running out are the planner's (accumplan/host_data.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>

#include "accumplan/host_data.h"
#include "accumplan/memory_probe.h"

namespace accumplan {

// Runs `load` and returns its result with the bytes it left allocated as `probe` counts them.
template <class Load>
auto load_host_data(MemoryProbe& probe, Load&& load, int64_t& host_bytes) -> decltype(load()) {
  const int64_t before = probe.current_bytes();
  auto data = load();
  host_bytes = std::max<int64_t>(0, probe.current_bytes() - before);
  return data;
}

// The budget the probe enforces while host data of `host_bytes` is held: the step's budget plus
// the data (nullopt: none).
inline void enforce_budget_beside(MemoryProbe& probe, std::optional<int64_t> budget_bytes, int64_t host_bytes) {
  probe.set_budget_bytes(budget_bytes ? std::optional<int64_t>(*budget_bytes + host_bytes) : std::nullopt);
}

}  // namespace accumplan
