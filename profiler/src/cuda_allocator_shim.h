// cuda_allocator_shim.h — the CUDA caching-allocator calls the CUDA probe makes, one spelling for
// LibTorch 1.13 and 2.x.
//
// What it is: plain functions over c10::cuda::CUDACachingAllocator that return torch-free
// numbers, so cuda_caching_probe.cpp has no version #if. The differences (docs/libtorch-notes.md,
// "CUDA caching allocator API"):
//   1.13: free functions taking `int device`; DeviceStats in c10::cuda::CUDACachingAllocator.
//   2.x:  inline wrappers taking c10::DeviceIndex; DeviceStats is
//         c10::CachingDeviceAllocator::DeviceStats from 2.5 on; emptyCache gained a defaulted
//         MempoolId_t argument.
// The shim absorbs them with `auto` for the stats type, an explicit c10::DeviceIndex (an integer
// in both, so it converts to 1.13's `int`), and index [0] for the aggregate StatType.
// What it is not: compiled on the development machine (its LibTorch has no CUDA; the 1.13
// headers are present and it was syntax-checked against them and CUDA 13's runtime header).
// Included only in CUDA builds.
#pragma once

#include <cstdint>

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/version.h>

namespace accumplan::cuda_shim {

struct AllocatorStats {
  int64_t allocated_current_bytes = 0;
  int64_t allocated_peak_bytes = 0;
  int64_t reserved_current_bytes = 0;
  int64_t reserved_peak_bytes = 0;
  int64_t num_ooms = 0;  // allocations that failed even after freeing the cache
};

inline c10::DeviceIndex to_index(int device) { return static_cast<c10::DeviceIndex>(device); }

inline int device_count() { return static_cast<int>(c10::cuda::device_count()); }

inline AllocatorStats stats(int device) {
  const auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(to_index(device));
  constexpr size_t kAggregate = 0;  // StatType::AGGREGATE in every version
  AllocatorStats out;
  out.allocated_current_bytes = s.allocated_bytes[kAggregate].current;
  out.allocated_peak_bytes = s.allocated_bytes[kAggregate].peak;
  out.reserved_current_bytes = s.reserved_bytes[kAggregate].current;
  out.reserved_peak_bytes = s.reserved_bytes[kAggregate].peak;
  out.num_ooms = s.num_ooms;
  return out;
}

// Sets peak := current for every statistic of the device (not to 0).
inline void reset_peak(int device) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(to_index(device));
}

// Caps the allocator's *reserved* bytes at fraction * device total; 1.0 removes the cap.
inline void set_memory_fraction(double fraction, int device) {
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, to_index(device));
}

inline void empty_cache() { c10::cuda::CUDACachingAllocator::emptyCache(); }

// The caching allocator creates its per-device state lazily (1.13: lazyInitCUDA; 2.x:
// lazyInitDevice, names that differ between versions), and getDeviceStats asserts on a device
// it has not initialised. One tiny allocation initialises it through the public path in every
// version; the cost is the allocator's first 2 MiB small-block segment, which it keeps cached.
inline void ensure_initialized(int device) {
  (void)at::empty({1}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA, to_index(device)));
}

}  // namespace accumplan::cuda_shim
