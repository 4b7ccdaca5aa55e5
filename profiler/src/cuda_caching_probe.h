// cuda_caching_probe.h — the "cuda-caching-allocator" MemoryProbe (CUDA builds only).
//
// What it is: LibTorch's CUDA caching allocator read as a probe: allocated and reserved current
// and peak bytes (plans are checked against reserved, because OOM happens when a new segment
// cannot be reserved), cudaMemGetInfo for the device total and what is held outside the
// allocator, setMemoryFraction to enforce a budget, and OOM detection by the allocator's
// num_ooms counter.
// What it is not: able to inject an OOM at an exact allocation: fail_allocation_after throws
// InputError (see the .cpp for why). Torch-free header; the implementation needs a CUDA LibTorch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "accumplan/memory_probe.h"

namespace accumplan {

class CudaCachingProbe final : public MemoryProbe {
 public:
  // Throws InputError when device `device` does not exist on this machine.
  explicit CudaCachingProbe(int device, std::optional<int64_t> budget_bytes = std::nullopt);
  ~CudaCachingProbe() override;  // removes the budget (memory fraction back to 1.0)
  CudaCachingProbe(const CudaCachingProbe&) = delete;
  CudaCachingProbe& operator=(const CudaCachingProbe&) = delete;

  std::string name() const override { return "cuda-caching-allocator"; }
  std::string device_name() const override;
  int64_t current_bytes() const override;   // allocated
  int64_t peak_bytes() const override;      // allocated peak
  std::optional<int64_t> reserved_peak_bytes() const override;
  void reset_peak() override;
  int64_t device_total_bytes() const override;  // cudaMemGetInfo total
  void set_budget_bytes(std::optional<int64_t> budget_bytes) override;
  std::optional<int64_t> budget_bytes() const override { return budget_bytes_; }
  bool oom_happened() const override;
  void clear_oom() override;
  void release_cached() override;
  void fail_allocation_after(int64_t n) override;

  int device() const { return device_; }
  int64_t reserved_current_bytes() const;
  // Device memory in use that the allocator did not reserve: CUDA context, NCCL buffers,
  // libraries calling cudaMalloc directly. (total - free) - reserved, from cudaMemGetInfo.
  int64_t used_outside_allocator_bytes() const;

 private:
  int device_;
  std::optional<int64_t> budget_bytes_;
  int64_t ooms_at_clear_ = 0;
};

}  // namespace accumplan
