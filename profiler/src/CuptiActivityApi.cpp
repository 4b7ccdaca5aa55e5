// CuptiActivityApi.cpp — the CUPTI calls: buffer callbacks, enable/disable/flush of MEMORY2, and
// conversion of CUPTI memory records to plain structs. See CuptiActivityApi.h.
// What it is not: record arithmetic (CuptiMemoryTimeline) or anything torch.
#include "CuptiActivityApi.h"

#include <cstdlib>
#include <string>

#include "CuptiMemoryRecordShim.h"

namespace accumplan {
namespace {

// 1 MiB per buffer: a CUpti_ActivityMemory4 record is under 128 bytes, so one buffer holds about
// 8,000 allocations or releases — more than a training step's cudaMalloc/cudaFree traffic
// through the caching allocator, so buffers rarely fill between flushes.
constexpr size_t kBufferBytes = 1 << 20;
constexpr size_t kBufferAlignBytes = 8;  // CUPTI requires 8-byte aligned activity buffers

std::string result_string(CUptiResult result) {
  const char* text = nullptr;
  if (cuptiGetResultString(result, &text) == CUPTI_SUCCESS && text != nullptr) {
    return text;
  }
  return "unknown CUPTI error";
}

CuptiAvailability unavailable(const char* call, CUptiResult result) {
  CuptiAvailability a;
  a.available = false;
  a.error_code = static_cast<int>(result);
  a.message = std::string("CUPTI is unavailable: ") + call + " returned " +
              std::to_string(static_cast<int>(result)) + " (" + result_string(result) + ")";
  if (result == CUPTI_ERROR_UNKNOWN || result == CUPTI_ERROR_NOT_INITIALIZED) {
    // 999 is what CUPTI 13 returns on a machine with no NVIDIA driver (observed).
    a.message += "; this usually means no NVIDIA driver or GPU is present";
  } else if (result == CUPTI_ERROR_INSUFFICIENT_PRIVILEGES) {
    a.message += "; profiling needs permission (NVreg_RestrictProfilingToAdminUsers=0 or root)";
  }
  return a;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_num_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kBufferAlignBytes, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;  // size 0: CUPTI drops records, counted below
  *max_num_records = 0;                           // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream_id, uint8_t* buffer,
                               size_t /*size*/, size_t valid_size) {
  std::vector<CuptiMemoryRecord> records;
  uint64_t skipped = 0;
  CUpti_Activity* raw = nullptr;
  while (buffer != nullptr &&
         cuptiActivityGetNextRecord(buffer, valid_size, &raw) == CUPTI_SUCCESS) {
    if (raw->kind != CUPTI_ACTIVITY_KIND_MEMORY2) {
      continue;
    }
    const auto* m = reinterpret_cast<const cupti_shim::Memory2Record*>(raw);
    const bool is_allocation =
        m->memoryOperationType == CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION;
    const bool is_release = m->memoryOperationType == CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE;
    // Device memory only: pinned host buffers (pin_memory) and managed memory are not what a
    // device budget or the allocator's reserved bytes describe.
    if ((!is_allocation && !is_release) || m->memoryKind != CUPTI_ACTIVITY_MEMORY_KIND_DEVICE) {
      ++skipped;
      continue;
    }
    CuptiMemoryRecord r;
    r.timestamp_ns = m->timestamp;
    r.bytes = m->bytes;
    r.is_allocation = is_allocation;
    r.device = m->deviceId;
    r.address = m->address;
    records.push_back(r);
  }
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(context, stream_id, &dropped) != CUPTI_SUCCESS) {
    dropped = 0;
  }
  std::free(buffer);
  CuptiActivityApi::singleton().add_records(std::move(records), dropped, skipped);
}

}  // namespace

CuptiActivityApi& CuptiActivityApi::singleton() {
  static CuptiActivityApi* instance = new CuptiActivityApi();  // never destroyed, see header
  return *instance;
}

std::optional<uint32_t> CuptiActivityApi::cupti_version() {
  uint32_t version = 0;
  if (cuptiGetVersion(&version) != CUPTI_SUCCESS) {
    return std::nullopt;
  }
  return version;
}

CuptiAvailability CuptiActivityApi::enable_memory_records() {
  std::lock_guard<std::mutex> lock(control_mutex_);
  if (enabled_) {
    return CuptiAvailability{true, 0, "CUPTI memory records are enabled"};
  }
  if (!callbacks_registered_) {
    const CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    if (r != CUPTI_SUCCESS) {
      return unavailable("cuptiActivityRegisterCallbacks", r);
    }
    callbacks_registered_ = true;
  }
  const CUptiResult r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMORY2);
  if (r != CUPTI_SUCCESS) {
    return unavailable("cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMORY2)", r);
  }
  enabled_ = true;
  return CuptiAvailability{true, 0, "CUPTI memory records are enabled"};
}

void CuptiActivityApi::disable_memory_records() {
  {
    std::lock_guard<std::mutex> lock(control_mutex_);
    if (!enabled_) {
      return;
    }
    cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMORY2);
    enabled_ = false;
  }
  // Collect what was recorded before disabling, so take_records() still returns it.
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
}

bool CuptiActivityApi::enabled() const {
  std::lock_guard<std::mutex> lock(control_mutex_);
  return enabled_;
}

void CuptiActivityApi::flush() {
  {
    std::lock_guard<std::mutex> lock(control_mutex_);
    if (!callbacks_registered_) {
      return;  // nothing was ever recorded
    }
  }
  // Not under a lock: CUPTI calls buffer_completed -> add_records on this thread.
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
}

std::vector<CuptiMemoryRecord> CuptiActivityApi::take_records() {
  flush();
  std::lock_guard<std::mutex> lock(records_mutex_);
  std::vector<CuptiMemoryRecord> out;
  out.swap(records_);
  return out;
}

void CuptiActivityApi::add_records(std::vector<CuptiMemoryRecord> records, uint64_t dropped,
                                   uint64_t skipped) {
  std::lock_guard<std::mutex> lock(records_mutex_);
  records_.insert(records_.end(), records.begin(), records.end());
  dropped_ += dropped;
  skipped_ += skipped;
}

uint64_t CuptiActivityApi::dropped_record_count() const {
  std::lock_guard<std::mutex> lock(records_mutex_);
  return dropped_;
}

uint64_t CuptiActivityApi::skipped_record_count() const {
  std::lock_guard<std::mutex> lock(records_mutex_);
  return skipped_;
}

std::optional<uint64_t> CuptiActivityApi::timestamp_ns() const {
  uint64_t t = 0;
  if (cuptiGetTimestamp(&t) != CUPTI_SUCCESS) {
    return std::nullopt;
  }
  return t;
}

}  // namespace accumplan
