// cupti_probe.cpp — the "cupti" probe (ACCUMPLAN_HAS_CUPTI builds only). See cupti_probe.h.
// What it is not: compiled or run on the development machine (no CUDA LibTorch there).
#include "cupti_probe.h"

#include <algorithm>
#include <atomic>

#include "accumplan/errors.h"

namespace accumplan {
namespace {
// CUPTI's record stream is process-wide and each probe's timeline takes the records it reads,
// so two live probes would split the records between them and both undercount.
std::atomic<bool> g_cupti_probe_live{false};
}  // namespace

CuptiProbe::ExclusiveUse::ExclusiveUse() {
  if (g_cupti_probe_live.exchange(true)) {
    throw InternalError(
        "a cupti memory probe is already active: CUPTI's memory records are process-wide, so "
        "only one probe can consume them at a time. Destroy the first probe before making "
        "another.");
  }
}

CuptiProbe::ExclusiveUse::~ExclusiveUse() { g_cupti_probe_live.store(false); }

CuptiProbe::CuptiProbe(int device, std::optional<int64_t> budget_bytes)
    : exclusive_(), cuda_(device, budget_bytes), api_(CuptiActivityApi::singleton()) {
  const CuptiAvailability availability = api_.enable_memory_records();
  if (!availability.available) {
    throw InputError(availability.message + ". Use --device cuda without the cupti backend.");
  }
  api_.take_records();  // discard anything recorded before this probe
  timeline_ = std::make_unique<CuptiMemoryTimeline>(api_);
  // What the allocator already holds was allocated before tracing; count it as the baseline so
  // the traced bytes compare with the allocator's reserved bytes.
  timeline_->set_baseline_bytes(static_cast<uint32_t>(device), cuda_.reserved_current_bytes());
}

CuptiProbe::~CuptiProbe() { api_.disable_memory_records(); }

std::string CuptiProbe::device_name() const { return cuda_.device_name() + " (CUPTI traced)"; }

std::optional<int64_t> CuptiProbe::reserved_peak_bytes() const {
  const CrossCheck check = cross_check();
  return std::max(check.allocator_reserved_peak_bytes, check.traced_peak_bytes);
}

void CuptiProbe::reset_peak() {
  cuda_.reset_peak();
  if (auto now = api_.timestamp_ns()) {
    timeline_->update();
    timeline_->reset_peak(static_cast<uint32_t>(cuda_.device()), *now);
  }
}

CuptiProbe::CrossCheck CuptiProbe::cross_check() const {
  timeline_->update();  // the timeline is owned through a pointer, so this const method may update
  const auto device = static_cast<uint32_t>(cuda_.device());
  CrossCheck check;
  check.allocator_reserved_peak_bytes = cuda_.reserved_peak_bytes().value_or(0);
  check.traced_peak_bytes = timeline_->peak_bytes(device);
  check.traced_current_bytes = timeline_->current_bytes(device);
  check.dropped_record_count = api_.dropped_record_count();
  check.anomalies = timeline_->anomalies(device);
  return check;
}

std::vector<MemoryTimelinePoint> CuptiProbe::memory_timeline() const {
  timeline_->update();  // takes the records CUPTI delivered so far (take_records flushes first)
  std::vector<MemoryTimelinePoint> out;
  for (const CuptiTimelinePoint& p : timeline_->timeline(static_cast<uint32_t>(cuda_.device()))) {
    out.push_back(MemoryTimelinePoint{p.timestamp_ns, p.current_bytes});
  }
  return out;
}

}  // namespace accumplan
