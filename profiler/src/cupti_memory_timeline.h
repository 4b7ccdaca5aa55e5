// cupti_memory_timeline.h — device-level current/peak bytes and a timeline, computed from plain
// memory allocation/release records.
//
// What it is: the record-processing half of the CUPTI tracer. CuptiActivityApi (the only code
// that calls CUPTI) turns CUPTI_ACTIVITY_KIND_MEMORY2 records into CuptiMemoryRecord and serves
// them through CuptiMemoryRecordSource; this class consumes any such source, so it is unit-tested
// on CPU against a fake one.
// What it is not: CUPTI- or torch-aware (no vendor include here), and not thread-safe: one owner
// calls update() and the queries.
//
// Why it recomputes from all records instead of keeping a running sum: CUPTI hands records over
// in buffers, and a later buffer can carry records stamped earlier than ones already delivered
// (one buffer per flush, records per thread). A running sum would then see a release before its
// allocation. Keeping every record and replaying them in timestamp order makes the answer
// independent of delivery order. The caching allocator issues few cudaMalloc/cudaFree calls (one
// per 2 MiB or 20 MiB+ segment), so a training run produces hundreds to thousands of records —
// replaying them costs microseconds.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <unordered_map>
#include <vector>

namespace accumplan {

// One device memory operation, as the CUPTI wrapper reports it.
struct CuptiMemoryRecord {
  uint64_t timestamp_ns = 0;  // CUPTI timestamp (cuptiGetTimestamp clock)
  uint64_t bytes = 0;
  bool is_allocation = true;  // false: a release
  uint32_t device = 0;        // CUDA device ordinal
  uint64_t address = 0;       // device virtual address
};

// Where records come from: the real CUPTI wrapper, or a fake in tests.
class CuptiMemoryRecordSource {
 public:
  virtual ~CuptiMemoryRecordSource() = default;
  // Records delivered since the last call, in any order; each record is returned once.
  virtual std::vector<CuptiMemoryRecord> take_records() = 0;
};

struct CuptiTimelinePoint {
  uint64_t timestamp_ns = 0;
  int64_t current_bytes = 0;  // after the operation at timestamp_ns
};

class CuptiMemoryTimeline {
 public:
  explicit CuptiMemoryTimeline(CuptiMemoryRecordSource& source);

  // Pull new records from the source and recompute. Call before querying.
  void update();

  // Bytes the device already held for us when tracing began (e.g. the caching allocator's
  // reserved segments). Counted in current/peak; releases of addresses never seen allocated are
  // taken out of it (never below zero), since that is where such memory must have come from.
  void set_baseline_bytes(uint32_t device, int64_t bytes);

  // Peak := current as of `timestamp_ns` (a CUPTI timestamp): only operations at or after it
  // can raise the peak. Records for earlier operations that arrive late are still placed before
  // the reset, which is why the reset is a timestamp and not "now".
  void reset_peak(uint32_t device, uint64_t timestamp_ns);

  std::vector<uint32_t> devices() const;  // devices with records or a baseline, ascending
  int64_t current_bytes(uint32_t device) const;
  int64_t peak_bytes(uint32_t device) const;
  // One point per operation on that device, in timestamp order (ties keep delivery order).
  std::vector<CuptiTimelinePoint> timeline(uint32_t device) const;

  // Anomalies the replay met, counted so callers can judge how far to trust the numbers.
  struct Anomalies {
    int64_t unmatched_release_count = 0;   // release of an address not allocated since tracing
    int64_t unmatched_release_bytes = 0;
    int64_t reallocated_address_count = 0; // allocation at a live address: its release was lost
  };
  Anomalies anomalies(uint32_t device) const;
  size_t record_count() const { return records_.size(); }

 private:
  struct DeviceState {
    int64_t baseline_bytes = 0;
    std::optional<uint64_t> peak_reset_ns;
    int64_t current_bytes = 0;
    int64_t peak_bytes = 0;
    std::vector<CuptiTimelinePoint> timeline;
    Anomalies anomalies;
  };
  void recompute();

  CuptiMemoryRecordSource& source_;
  std::vector<CuptiMemoryRecord> records_;  // kept sorted by timestamp (stable)
  std::map<uint32_t, DeviceState> devices_;
};

}  // namespace accumplan
