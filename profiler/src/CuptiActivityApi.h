// CuptiActivityApi.h — thin wrapper over CUPTI's activity API for device memory records.
//
// What it is: the only code in accumplan that calls CUPTI (kineto's layout: vendor calls live in
// Cupti* files). It enables CUPTI_ACTIVITY_KIND_MEMORY2, owns the activity buffers CUPTI asks
// for, flushes them, and turns each device-memory record into a plain CuptiMemoryRecord, served
// through CuptiMemoryRecordSource to CuptiMemoryTimeline.
// What it is not: a probe (cupti_probe.cpp combines it with the CUDA allocator), torch-aware, or
// fatal when CUPTI cannot run: without an NVIDIA driver cuptiActivityEnable returns 999
// (CUPTI_ERROR_UNKNOWN), and enable_memory_records() then reports "unavailable" with that code.
// This header has no CUPTI include, so callers compile without the toolkit's headers.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cupti_memory_timeline.h"

namespace accumplan {

struct CuptiAvailability {
  bool available = false;
  int error_code = 0;   // the CUptiResult of the call that failed (0 = CUPTI_SUCCESS)
  std::string message;  // what failed and the likely cause, one sentence
};

class CuptiActivityApi final : public CuptiMemoryRecordSource {
 public:
  // CUPTI's buffer callbacks are registered once per process and are plain C function
  // pointers, so there is exactly one instance. It is never destroyed: CUPTI may still call
  // back (a final flush) while static destructors run.
  static CuptiActivityApi& singleton();

  // cuptiGetVersion; works without a driver (130001 on the development machine).
  static std::optional<uint32_t> cupti_version();

  // Register the buffer callbacks (once) and enable MEMORY2 records. Never throws for a missing
  // driver: returns available=false with the CUPTI error code and message.
  CuptiAvailability enable_memory_records();
  void disable_memory_records();
  bool enabled() const;

  // Hand every buffer CUPTI holds, even partly filled ones, to the completion callback.
  void flush();
  // flush(), then the device-memory records collected since the last call.
  std::vector<CuptiMemoryRecord> take_records() override;

  // Records CUPTI reported dropped (buffers full) and records skipped because they are not
  // device memory (pinned or pageable host, managed: not what a device budget is about).
  uint64_t dropped_record_count() const;
  uint64_t skipped_record_count() const;

  // CUPTI's clock (the one record timestamps use); nullopt when CUPTI cannot read it.
  std::optional<uint64_t> timestamp_ns() const;

  // Called from CUPTI's completion callback (any thread); public only for that callback.
  void add_records(std::vector<CuptiMemoryRecord> records, uint64_t dropped, uint64_t skipped);

 private:
  CuptiActivityApi() = default;

  // Two locks because flush() makes CUPTI call add_records() on the calling thread: holding one
  // lock across both would deadlock.
  mutable std::mutex control_mutex_;  // callbacks_registered_, enabled_
  bool callbacks_registered_ = false;
  bool enabled_ = false;
  mutable std::mutex records_mutex_;  // records_, dropped_, skipped_
  std::vector<CuptiMemoryRecord> records_;
  uint64_t dropped_ = 0;
  uint64_t skipped_ = 0;
};

}  // namespace accumplan
