// cpu_counting_probe.h — the "cpu-counting" MemoryProbe: a counting allocator installed as
// LibTorch's CPU allocator, which turns the CPU into a small simulated accelerator.
//
// What it is: while a CpuCountingProbe exists, every CPU tensor allocation goes through a
// wrapper around c10's default CPU allocator that counts current and peak bytes and, given a
// budget, throws c10::OutOfMemoryError past it — as a GPU does at capacity. Destroying the probe
// puts the previous CPU allocator back.
// What it is not: a measure of the process's RSS. It counts what LibTorch asks its CPU allocator
// for (tensor storage), not malloc calls made elsewhere (oneDNN scratch, if it bypasses the
// allocator — not checked, see docs/libtorch-notes.md), nor allocator overhead. Only one can be
// installed at a time (c10 has one CPU allocator slot); a second is an InternalError.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "accumplan/memory_probe.h"

namespace accumplan {

class CpuCountingProbe final : public MemoryProbe {
 public:
  explicit CpuCountingProbe(std::optional<int64_t> budget_bytes = std::nullopt);
  ~CpuCountingProbe() override;
  CpuCountingProbe(const CpuCountingProbe&) = delete;
  CpuCountingProbe& operator=(const CpuCountingProbe&) = delete;

  std::string name() const override { return "cpu-counting"; }
  std::string device_name() const override;
  int64_t current_bytes() const override;
  int64_t peak_bytes() const override;
  void reset_peak() override;
  // The budget when one is set, else the machine's physical memory.
  int64_t device_total_bytes() const override;
  void set_budget_bytes(std::optional<int64_t> budget_bytes) override;
  std::optional<int64_t> budget_bytes() const override;
  bool budget_is_simulated() const override { return true; }
  bool oom_happened() const override;
  void clear_oom() override;
  // n >= 1: the n-th allocation of one byte or more from now fails as an OOM, once (zero-byte
  // allocations never reach memory, so they are not counted). n == 0 disarms. n < 0: InputError.
  void fail_allocation_after(int64_t n) override;

  // Allocations (of one byte or more) made through the probe since it was installed.
  int64_t allocation_count() const;
};

// Physical memory of this machine in bytes: sysconf(_SC_PHYS_PAGES * _SC_PAGE_SIZE), falling
// back to MemTotal in /proc/meminfo; 0 if neither is readable.
int64_t machine_memory_bytes();

}  // namespace accumplan
