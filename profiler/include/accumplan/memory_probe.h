// accumplan/memory_probe.h — one interface for every way accumplan measures device memory.
//
// What it is: the profiler and the executor ask a MemoryProbe for current and peak bytes, reset
// the peak between phases, enforce a budget, and learn whether an out-of-memory just happened.
// Implementations (chosen by make_memory_probe in one place):
//   cpu-counting            counting allocator installed with c10::SetCPUAllocator; a budget
//                           makes it throw c10::OutOfMemoryError like a GPU at capacity
//   cuda-caching-allocator  CUDACachingAllocator stats (allocated and reserved), cudaMemGetInfo,
//                           setMemoryFraction as the budget (only in CUDA builds)
//   cupti                   CUPTI MEMORY2 activity records cross-checking the allocator (only in
//                           CUDA + CUPTI builds)
// What it is not: torch-aware. This header has no LibTorch include, so planner-side code and
// tests can hold a probe without pulling in torch.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace accumplan {

// One point of a device memory timeline: what the device held for us after one operation.
struct MemoryTimelinePoint {
  uint64_t timestamp_ns = 0;  // on the probe's own clock (MemoryProbe::memory_clock_ns)
  int64_t current_bytes = 0;
};

class MemoryProbe {
 public:
  virtual ~MemoryProbe() = default;

  virtual std::string name() const = 0;            // "cpu-counting", "cuda-caching-allocator", "cupti"
  virtual std::string device_name() const = 0;     // human name of the device
  virtual int64_t current_bytes() const = 0;       // allocated now
  virtual int64_t peak_bytes() const = 0;          // allocated peak since reset_peak()
  // Peak of what the device really holds for us when that differs from allocated (a caching
  // allocator's reserved segments); nullopt when it is the same as peak_bytes.
  virtual std::optional<int64_t> reserved_peak_bytes() const { return std::nullopt; }
  virtual void reset_peak() = 0;                   // peak := current
  virtual int64_t device_total_bytes() const = 0;  // the budget when one is enforced on CPU

  // Enforce a budget: allocations beyond it fail with c10::OutOfMemoryError. nullopt removes it.
  virtual void set_budget_bytes(std::optional<int64_t> budget_bytes) = 0;
  virtual std::optional<int64_t> budget_bytes() const = 0;
  // True when the budget is a simulation over far larger memory (the CPU counting allocator: the
  // host has gigabytes behind a budget of megabytes), so a probe may be measured past it at no
  // risk to anything else; false where the budget guards real device memory.
  virtual bool budget_is_simulated() const { return false; }

  // True when an allocation failed for lack of memory since the last clear_oom(). TorchScript
  // rewraps OutOfMemoryError as std::runtime_error, so callers identify OOM by this flag, not by
  // the exception's type (docs/libtorch-notes.md).
  virtual bool oom_happened() const = 0;
  virtual void clear_oom() = 0;

  // Return cached blocks to the device (CUDA: emptyCache). No-op where nothing is cached.
  virtual void release_cached() {}

  // The device memory timeline this probe records, where it records one (cupti: every device
  // cudaMalloc/cudaFree traced since the probe was made, one point each); empty otherwise.
  // memory_clock_ns() reads the clock those timestamps use, so a caller can place them on its
  // own clock; nullopt where there is no timeline.
  virtual std::vector<MemoryTimelinePoint> memory_timeline() const { return {}; }
  virtual std::optional<uint64_t> memory_clock_ns() const { return std::nullopt; }

  // Testing hook: make the n-th allocation from now (1 = the next one) fail as an OOM, once.
  // Lets tests inject an OOM at an exact point without tuning a budget.
  virtual void fail_allocation_after(int64_t n) = 0;
};

// A --device value: "cpu", "cuda" (index 0) or "cuda:N". The one parser of device names in
// accumplan; InputError naming the value otherwise.
struct ParsedDevice {
  std::string type;  // "cpu" | "cuda"
  int index = 0;
  bool is_cuda() const { return type == "cuda"; }
};
ParsedDevice parse_device(const std::string& device);

struct ProbeRequest {
  std::string device = "cpu";              // "cpu", "cuda", "cuda:1"
  std::string backend = "auto";            // auto | cpu-counting | cuda-caching-allocator | cupti
  std::optional<int64_t> budget_bytes;     // enforced while the probe is installed
};

// The one factory. Throws BackendNotBuiltError (with how to rebuild) for a backend this build
// lacks, InputError for an unknown device or backend name or a CUDA device that is not there.
std::unique_ptr<MemoryProbe> make_memory_probe(const ProbeRequest& request);

}  // namespace accumplan
