// cpu_counting_probe.cpp — the counting CPU allocator and the probe that installs it.
// See cpu_counting_probe.h for what it is and is not.
//
// The allocator follows docs/libtorch-notes.md ("Counting CPU memory") to the letter:
//  - allocate with base->raw_allocate(n) and return DataPtr{p, p, &deleter, kCPU}: data must equal
//    context, because ATen/ideep code that uses raw_allocate asserts
//    dptr.get() == dptr.get_context() (a wrapper with its own context broke scripted conv);
//  - override raw_deleter() to return that same deleter;
//  - keep sizes in a mutex-guarded map (the deleter gets only the pointer).
#include "cpu_counting_probe.h"

#include <unistd.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include "accumplan/errors.h"
#include "accumplan/host_data.h"
#include "accumplan/units.h"
#include "torch_allocator_shim.h"

namespace accumplan {
namespace {

// One instance for the whole process, created on first use and never destroyed. Why a global:
// c10's DataPtr deleter is a plain function pointer that receives only the data pointer, so the
// deleter must find the allocator without a context; and a tensor allocated while a probe was
// installed may be freed after the probe is gone (or during static destruction), so the object
// the deleter reaches must outlive every probe. Probes install and uninstall this instance.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  static CountingCpuAllocator& instance() {
    static CountingCpuAllocator* allocator = new CountingCpuAllocator();
    return *allocator;
  }

  void install(std::optional<int64_t> budget_bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (installed_) {
        throw InternalError(
            "a cpu-counting memory probe is already installed: LibTorch has one CPU allocator "
            "slot, so only one probe can count CPU allocations at a time. Destroy the first "
            "probe before making another.");
      }
      c10::Allocator* base = c10::GetDefaultCPUAllocator();
      if (base == nullptr || base->raw_deleter() == nullptr) {
        throw InternalError(
            "the default CPU allocator has no raw deleter, so it cannot be wrapped for counting");
      }
      base_ = base;
      base_deleter_.store(base->raw_deleter());
      sizes_.clear();
      current_bytes_ = 0;
      peak_bytes_ = 0;
      allocation_count_ = 0;
      fail_countdown_ = 0;
      budget_bytes_ = budget_bytes;
      oom_.store(false);
      installed_ = true;
    }
    previous_ = c10::GetCPUAllocator();
    // Priority 0 is enough in 1.13 (docs/libtorch-notes.md); a higher-priority allocator set by
    // someone else would silently keep its place, so check rather than assume.
    c10::SetCPUAllocator(this, /*priority=*/0);
    if (c10::GetCPUAllocator() != this) {
      std::lock_guard<std::mutex> lock(mutex_);
      installed_ = false;
      throw InternalError(
          "could not install the counting CPU allocator: another CPU allocator was set with a "
          "higher priority");
    }
  }

  void uninstall() {
    // Restore first, so no new allocation reaches us; then stop counting. Blocks still alive are
    // freed later through counting_delete, which hands them to the base deleter.
    if (c10::GetCPUAllocator() == this) {
      c10::SetCPUAllocator(previous_, /*priority=*/0);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    installed_ = false;
    sizes_.clear();
    current_bytes_ = 0;
    peak_bytes_ = 0;
    budget_bytes_.reset();
    fail_countdown_ = 0;
  }

  c10::DataPtr allocate(size_t n) ACCUMPLAN_ALLOCATE_CONST override {
    if (n == 0) {
      // The default allocator returns nullptr for 0 bytes; nothing to count or fail.
      return {nullptr, nullptr, &counting_delete, c10::Device(c10::DeviceType::CPU)};
    }
    const auto bytes = static_cast<int64_t>(n);
    std::string oom_message;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      // Worded as LibTorch's CPU allocator words a failure, so what recognises an out-of-memory
      // by its text (Accelerate's find_executable_batch_size, Lightning's BatchSizeFinder) does;
      // the probe's name tells it from the machine running out (failed_host_allocation_bytes).
      const std::string failed = "CPU out of memory. DefaultCPUAllocator: can't allocate memory: you tried to allocate " +
                                 std::to_string(bytes) + " bytes (" + kCountingProbeName;
      if (fail_countdown_ > 0 && --fail_countdown_ == 0) {
        oom_message = failed + ": an injected failure, fail_allocation_after)";
      } else if (budget_bytes_ && current_bytes_ + bytes > *budget_bytes_) {
        oom_message = failed + ": " + format_bytes(bytes) + " with " + format_bytes(current_bytes_) + " of the " +
                      format_bytes(*budget_bytes_) + " budget in use)";
      } else {
        // Reserve before allocating so concurrent allocations cannot both pass the budget.
        current_bytes_ += bytes;
        peak_bytes_ = std::max(peak_bytes_, current_bytes_);
        ++allocation_count_;
      }
    }
    if (!oom_message.empty()) {
      // Flag first: TorchScript rewraps this exception as std::runtime_error, so callers can
      // only recognise the OOM by the flag.
      oom_.store(true);
      TORCH_CHECK_WITH(OutOfMemoryError, false, oom_message);
    }
    void* p = nullptr;
    try {
      p = base_->raw_allocate(n);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      current_bytes_ -= bytes;
      --allocation_count_;
      throw;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      sizes_[p] = n;
    }
    return {p, p, &counting_delete, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &counting_delete; }

#if ACCUMPLAN_ALLOCATOR_HAS_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif

  int64_t current_bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return current_bytes_;
  }
  int64_t peak_bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return peak_bytes_;
  }
  int64_t allocation_count() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return allocation_count_;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    peak_bytes_ = current_bytes_;
  }
  void set_budget_bytes(std::optional<int64_t> budget_bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    budget_bytes_ = budget_bytes;
  }
  std::optional<int64_t> budget_bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return budget_bytes_;
  }
  void fail_allocation_after(int64_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    fail_countdown_ = n;
  }
  bool oom_happened() const { return oom_.load(); }
  void clear_oom() { oom_.store(false); }

 private:
  CountingCpuAllocator() = default;

  static void counting_delete(void* p) {
    if (p == nullptr) {
      return;
    }
    instance().forget(p);
    // Every block we handed out came from the default allocator's raw_allocate, so its raw
    // deleter frees it, whether or not we are still installed.
    instance().base_deleter_.load()(p);
  }

  void forget(void* p) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = sizes_.find(p);
    if (it == sizes_.end()) {
      return;  // allocated under an earlier probe: not ours to count
    }
    current_bytes_ -= static_cast<int64_t>(it->second);
    sizes_.erase(it);
  }

  // `mutable` because allocate() is const in LibTorch 1.13 (torch_allocator_shim.h).
  mutable std::mutex mutex_;
  mutable std::unordered_map<void*, size_t> sizes_;
  mutable int64_t current_bytes_ = 0;
  mutable int64_t peak_bytes_ = 0;
  mutable int64_t allocation_count_ = 0;
  mutable int64_t fail_countdown_ = 0;  // 0: disarmed; k: the k-th allocation from now fails
  mutable std::atomic<bool> oom_{false};
  std::optional<int64_t> budget_bytes_;
  bool installed_ = false;
  c10::Allocator* base_ = nullptr;
  c10::Allocator* previous_ = nullptr;
  // Set at the first install and never cleared: blocks can outlive the probe.
  std::atomic<c10::DeleterFnPtr> base_deleter_{nullptr};
};

void check_budget(std::optional<int64_t> budget_bytes) {
  if (budget_bytes && *budget_bytes <= 0) {
    throw InputError("a memory budget must be positive, got " + std::to_string(*budget_bytes) +
                     " bytes");
  }
}

}  // namespace

CpuCountingProbe::CpuCountingProbe(std::optional<int64_t> budget_bytes) {
  check_budget(budget_bytes);
  CountingCpuAllocator::instance().install(budget_bytes);
}

CpuCountingProbe::~CpuCountingProbe() { CountingCpuAllocator::instance().uninstall(); }

std::string CpuCountingProbe::device_name() const { return "cpu (counting allocator)"; }

int64_t CpuCountingProbe::current_bytes() const {
  return CountingCpuAllocator::instance().current_bytes();
}

int64_t CpuCountingProbe::peak_bytes() const {
  return CountingCpuAllocator::instance().peak_bytes();
}

void CpuCountingProbe::reset_peak() { CountingCpuAllocator::instance().reset_peak(); }

int64_t CpuCountingProbe::device_total_bytes() const {
  if (auto budget = budget_bytes()) {
    return *budget;
  }
  return machine_memory_bytes();
}

void CpuCountingProbe::set_budget_bytes(std::optional<int64_t> budget_bytes) {
  check_budget(budget_bytes);
  CountingCpuAllocator::instance().set_budget_bytes(budget_bytes);
}

std::optional<int64_t> CpuCountingProbe::budget_bytes() const {
  return CountingCpuAllocator::instance().budget_bytes();
}

bool CpuCountingProbe::oom_happened() const {
  return CountingCpuAllocator::instance().oom_happened();
}

void CpuCountingProbe::clear_oom() { CountingCpuAllocator::instance().clear_oom(); }

void CpuCountingProbe::fail_allocation_after(int64_t n) {
  if (n < 0) {
    throw InputError("fail_allocation_after needs n >= 1 (or 0 to disarm), got " +
                     std::to_string(n));
  }
  CountingCpuAllocator::instance().fail_allocation_after(n);
}

int64_t CpuCountingProbe::allocation_count() const {
  return CountingCpuAllocator::instance().allocation_count();
}

int64_t machine_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_bytes = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page_bytes > 0) {
    return static_cast<int64_t>(pages) * static_cast<int64_t>(page_bytes);
  }
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    std::istringstream in(line);
    std::string key;
    int64_t kib = 0;
    if (in >> key >> kib && key == "MemTotal:") {
      return kib * 1024;  // /proc/meminfo reports kB meaning KiB
    }
  }
  return 0;
}

}  // namespace accumplan
