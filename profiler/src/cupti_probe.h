// cupti_probe.h — the "cupti" MemoryProbe: the CUDA caching-allocator probe cross-checked by
// CUPTI's record of every device cudaMalloc/cudaFree (CUDA + CUPTI builds only).
//
// What it is: allocated bytes, budget, OOM and cache release come from CudaCachingProbe;
// reserved_peak_bytes is the larger of the allocator's reserved peak and the device-level peak
// CUPTI traced, because CUPTI also sees memory the allocator does not own (libraries calling
// cudaMalloc themselves). cross_check() reports both so a caller can show the difference.
// What it is not: a record of memory allocated before the probe was made: the allocator's
// reserved bytes at that moment are the timeline's baseline. Only one can be alive at a time.
// Torch-free header.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "CuptiActivityApi.h"
#include "accumplan/memory_probe.h"
#include "cuda_caching_probe.h"
#include "cupti_memory_timeline.h"

namespace accumplan {

class CuptiProbe final : public MemoryProbe {
 public:
  // Throws InputError when the device is missing or CUPTI cannot trace (the message carries
  // the CUPTI error code).
  explicit CuptiProbe(int device, std::optional<int64_t> budget_bytes = std::nullopt);
  ~CuptiProbe() override;

  std::string name() const override { return "cupti"; }
  std::string device_name() const override;
  int64_t current_bytes() const override { return cuda_.current_bytes(); }
  int64_t peak_bytes() const override { return cuda_.peak_bytes(); }
  std::optional<int64_t> reserved_peak_bytes() const override;
  void reset_peak() override;
  int64_t device_total_bytes() const override { return cuda_.device_total_bytes(); }
  void set_budget_bytes(std::optional<int64_t> budget_bytes) override {
    cuda_.set_budget_bytes(budget_bytes);
  }
  std::optional<int64_t> budget_bytes() const override { return cuda_.budget_bytes(); }
  bool oom_happened() const override { return cuda_.oom_happened(); }
  void clear_oom() override { cuda_.clear_oom(); }
  void release_cached() override { cuda_.release_cached(); }
  void fail_allocation_after(int64_t n) override { cuda_.fail_allocation_after(n); }

  struct CrossCheck {
    int64_t allocator_reserved_peak_bytes = 0;
    int64_t traced_peak_bytes = 0;       // CUPTI, device memory, since the last reset_peak
    int64_t traced_current_bytes = 0;
    uint64_t dropped_record_count = 0;   // > 0: CUPTI lost records, the trace undercounts
    CuptiMemoryTimeline::Anomalies anomalies;
  };
  CrossCheck cross_check() const;

  // The traced device timeline (CuptiMemoryTimeline::timeline) and CUPTI's clock.
  std::vector<MemoryTimelinePoint> memory_timeline() const override;
  std::optional<uint64_t> memory_clock_ns() const override { return api_.timestamp_ns(); }

 private:
  // Declared first so it is claimed before cuda_ applies a budget: only one cupti probe may be
  // alive (a second is an InternalError), see cupti_probe.cpp.
  struct ExclusiveUse {
    ExclusiveUse();
    ~ExclusiveUse();
    ExclusiveUse(const ExclusiveUse&) = delete;
    ExclusiveUse& operator=(const ExclusiveUse&) = delete;
  };
  ExclusiveUse exclusive_;
  CudaCachingProbe cuda_;
  CuptiActivityApi& api_;
  std::unique_ptr<CuptiMemoryTimeline> timeline_;
};

}  // namespace accumplan
