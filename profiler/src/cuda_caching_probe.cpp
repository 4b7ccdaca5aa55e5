// cuda_caching_probe.cpp — the "cuda-caching-allocator" probe. Compiled only when the LibTorch
// found has CUDA (ACCUMPLAN_HAS_CUDA); all version differences go through cuda_allocator_shim.h.
// What it is not: compiled or run on the development machine (CPU-only LibTorch); it was
// syntax-checked against LibTorch 1.13's c10/cuda headers and CUDA 13's runtime header.
#include "cuda_caching_probe.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "accumplan/errors.h"
#include "accumplan/units.h"
#include "cuda_allocator_shim.h"

namespace accumplan {
namespace {

struct MemInfo {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};

MemInfo mem_info(int device) {
  c10::cuda::CUDAGuard guard(cuda_shim::to_index(device));
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  const cudaError_t err = cudaMemGetInfo(&free_bytes, &total_bytes);
  if (err != cudaSuccess) {
    throw InternalError("cudaMemGetInfo failed on cuda:" + std::to_string(device) + ": " +
                        cudaGetErrorString(err));
  }
  return {static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes)};
}

}  // namespace

CudaCachingProbe::CudaCachingProbe(int device, std::optional<int64_t> budget_bytes)
    : device_(device) {
  const int count = cuda_shim::device_count();
  if (count == 0) {
    throw InputError("cuda:" + std::to_string(device) + ": no CUDA device is visible (no NVIDIA driver, or "
                     "CUDA_VISIBLE_DEVICES is empty); use --device cpu");
  }
  if (device < 0 || device >= count) {
    throw InputError("there is no CUDA device cuda:" + std::to_string(device) + ": this machine has " +
                     std::to_string(count) + " (cuda:0 to cuda:" + std::to_string(count - 1) + ")");
  }
  cuda_shim::ensure_initialized(device_);
  ooms_at_clear_ = cuda_shim::stats(device_).num_ooms;
  set_budget_bytes(budget_bytes);
  cuda_shim::reset_peak(device_);
}

CudaCachingProbe::~CudaCachingProbe() {
  if (budget_bytes_) {
    try {
      cuda_shim::set_memory_fraction(1.0, device_);
    } catch (...) {
      // Destructors must not throw; the process keeps the cap it had.
    }
  }
}

std::string CudaCachingProbe::device_name() const {
  cudaDeviceProp prop{};
  std::string name = "cuda:" + std::to_string(device_);
  if (cudaGetDeviceProperties(&prop, device_) == cudaSuccess) {
    name += std::string(" (") + prop.name + ")";
  }
  return name;
}

int64_t CudaCachingProbe::current_bytes() const {
  return cuda_shim::stats(device_).allocated_current_bytes;
}

int64_t CudaCachingProbe::peak_bytes() const {
  return cuda_shim::stats(device_).allocated_peak_bytes;
}

std::optional<int64_t> CudaCachingProbe::reserved_peak_bytes() const {
  return cuda_shim::stats(device_).reserved_peak_bytes;
}

int64_t CudaCachingProbe::reserved_current_bytes() const {
  return cuda_shim::stats(device_).reserved_current_bytes;
}

void CudaCachingProbe::reset_peak() { cuda_shim::reset_peak(device_); }

int64_t CudaCachingProbe::device_total_bytes() const { return mem_info(device_).total_bytes; }

int64_t CudaCachingProbe::used_outside_allocator_bytes() const {
  const MemInfo info = mem_info(device_);
  const int64_t used = info.total_bytes - info.free_bytes;
  return std::max<int64_t>(0, used - reserved_current_bytes());
}

void CudaCachingProbe::set_budget_bytes(std::optional<int64_t> budget_bytes) {
  if (!budget_bytes) {
    cuda_shim::set_memory_fraction(1.0, device_);
    budget_bytes_.reset();
    return;
  }
  const double fraction =
      device_memory_fraction(*budget_bytes, device_total_bytes(), "cuda:" + std::to_string(device_));
  cuda_shim::set_memory_fraction(fraction, device_);
  budget_bytes_ = budget_bytes;
}

bool CudaCachingProbe::oom_happened() const {
  // The allocator counts an OOM before it throws, also when TorchScript later rewraps the error.
  return cuda_shim::stats(device_).num_ooms > ooms_at_clear_;
}

void CudaCachingProbe::clear_oom() { ooms_at_clear_ = cuda_shim::stats(device_).num_ooms; }

void CudaCachingProbe::release_cached() { cuda_shim::empty_cache(); }

void CudaCachingProbe::fail_allocation_after(int64_t /*n*/) {
  // Not supported honestly: the CUDA caching allocator offers no hook to fail the n-th
  // allocation, and replacing it (2.x's CUDAPluggableAllocator) would change what is measured.
  // Lowering the memory fraction makes *some* later allocation fail, not the n-th one.
  throw InputError("fail_allocation_after is not supported on cuda (the caching allocator has "
                   "no per-allocation failure hook); inject OOMs with --device cpu");
}

}  // namespace accumplan
