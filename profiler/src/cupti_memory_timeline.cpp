// cupti_memory_timeline.cpp — replay of memory records into per-device current/peak bytes and a
// timeline. Torch-free and CUPTI-free; see cupti_memory_timeline.h for why it replays.
#include "cupti_memory_timeline.h"

#include <algorithm>

namespace accumplan {

CuptiMemoryTimeline::CuptiMemoryTimeline(CuptiMemoryRecordSource& source) : source_(source) {}

void CuptiMemoryTimeline::update() {
  std::vector<CuptiMemoryRecord> fresh = source_.take_records();
  if (fresh.empty()) {
    return;
  }
  records_.insert(records_.end(), fresh.begin(), fresh.end());
  // Stable: two operations with the same timestamp keep the order they were delivered in, which
  // is the order CUPTI wrote them (the best tie-break available: the clock is 1 ns but calls
  // on different threads can still collide).
  std::stable_sort(records_.begin(), records_.end(),
                   [](const CuptiMemoryRecord& a, const CuptiMemoryRecord& b) {
                     return a.timestamp_ns < b.timestamp_ns;
                   });
  recompute();
}

void CuptiMemoryTimeline::set_baseline_bytes(uint32_t device, int64_t bytes) {
  devices_[device].baseline_bytes = std::max<int64_t>(bytes, 0);
  recompute();
}

void CuptiMemoryTimeline::reset_peak(uint32_t device, uint64_t timestamp_ns) {
  devices_[device].peak_reset_ns = timestamp_ns;
  recompute();
}

void CuptiMemoryTimeline::recompute() {
  struct Work {
    std::unordered_map<uint64_t, int64_t> live;  // address -> bytes allocated since tracing
    int64_t baseline_left = 0;
    bool peak_armed = true;  // false until the reset timestamp is passed
  };
  for (const CuptiMemoryRecord& r : records_) {
    devices_[r.device];  // every device with records gets a state
  }
  std::map<uint32_t, Work> work;
  for (auto& [device, state] : devices_) {
    state.current_bytes = state.baseline_bytes;
    state.peak_bytes = state.baseline_bytes;
    state.timeline.clear();
    state.anomalies = Anomalies{};
    Work& w = work[device];
    w.baseline_left = state.baseline_bytes;
    w.peak_armed = !state.peak_reset_ns.has_value();
  }

  for (const CuptiMemoryRecord& r : records_) {
    DeviceState& s = devices_[r.device];
    Work& w = work[r.device];
    if (!w.peak_armed && r.timestamp_ns >= *s.peak_reset_ns) {
      w.peak_armed = true;
      s.peak_bytes = s.current_bytes;  // peak := current at the reset
    }
    const auto bytes = static_cast<int64_t>(r.bytes);
    auto it = w.live.find(r.address);
    if (r.is_allocation) {
      if (it != w.live.end()) {
        // An allocation at an address we think is live: its release record was dropped (CUPTI
        // drops records when buffers run out). The old block is necessarily gone.
        ++s.anomalies.reallocated_address_count;
        s.current_bytes -= it->second;
        it->second = bytes;
      } else {
        w.live.emplace(r.address, bytes);
      }
      s.current_bytes += bytes;
    } else if (it != w.live.end()) {
      // Use the allocation's size, not the release record's: that is what was added.
      s.current_bytes -= it->second;
      w.live.erase(it);
    } else {
      // Memory allocated before tracing began: it can only have come out of the baseline.
      ++s.anomalies.unmatched_release_count;
      s.anomalies.unmatched_release_bytes += bytes;
      const int64_t taken = std::min(bytes, w.baseline_left);
      w.baseline_left -= taken;
      s.current_bytes -= taken;
    }
    s.timeline.push_back({r.timestamp_ns, s.current_bytes});
    if (w.peak_armed) {
      s.peak_bytes = std::max(s.peak_bytes, s.current_bytes);
    }
  }
  for (auto& [device, state] : devices_) {
    if (!work[device].peak_armed) {
      state.peak_bytes = state.current_bytes;  // reset after the last operation
    }
  }
}

std::vector<uint32_t> CuptiMemoryTimeline::devices() const {
  std::vector<uint32_t> out;
  for (const auto& entry : devices_) {
    out.push_back(entry.first);
  }
  return out;
}

int64_t CuptiMemoryTimeline::current_bytes(uint32_t device) const {
  auto it = devices_.find(device);
  return it == devices_.end() ? 0 : it->second.current_bytes;
}

int64_t CuptiMemoryTimeline::peak_bytes(uint32_t device) const {
  auto it = devices_.find(device);
  return it == devices_.end() ? 0 : it->second.peak_bytes;
}

std::vector<CuptiTimelinePoint> CuptiMemoryTimeline::timeline(uint32_t device) const {
  auto it = devices_.find(device);
  return it == devices_.end() ? std::vector<CuptiTimelinePoint>{} : it->second.timeline;
}

CuptiMemoryTimeline::Anomalies CuptiMemoryTimeline::anomalies(uint32_t device) const {
  auto it = devices_.find(device);
  return it == devices_.end() ? Anomalies{} : it->second.anomalies;
}

}  // namespace accumplan
