// test_cuda_probes.cpp — the cuda-caching-allocator and cupti probes on a real GPU.
//
// What it is: the checks scripts/gpu-check.sh runs on the lent GPU machine (ctest -R "^(probes|timeline):"):
// an allocation shows in the allocated and reserved peaks, a budget turns a larger allocation
// into an OOM the probe sees and is lifted when the probe goes, and CUPTI's traced timeline sees
// the allocator's segments.
// What it is not: compiled in builds without CUDA (every check here needs a CUDA LibTorch: the
// file is empty there), nor a test that passes without a device: a CUDA build on a machine with
// no visible GPU warns and checks nothing.
#include "accumplan/build_config.h"

#if ACCUMPLAN_HAS_CUDA

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "accumplan/memory_probe.h"
#include "cuda_allocator_shim.h"  // profiler/src: one spelling of the allocator calls
#include "torch_and_catch.h"  // last: see why there

namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

std::unique_ptr<accumplan::MemoryProbe> cuda_probe(const std::string& backend,
                                                   std::optional<int64_t> budget_bytes = std::nullopt) {
  accumplan::ProbeRequest r;
  r.device = "cuda:0";
  r.backend = backend;
  r.budget_bytes = budget_bytes;
  return accumplan::make_memory_probe(r);
}

bool have_gpu() {
  if (torch::cuda::is_available()) return true;
  WARN("this CUDA build sees no GPU: nothing was checked");
  return false;
}

}  // namespace

TEST_CASE("CUDA probe: a 64 MiB tensor shows in the allocated and the reserved peak", "[probe][cuda]") {
  if (!have_gpu()) return;
  auto probe = cuda_probe("cuda-caching-allocator");
  CHECK(probe->name() == "cuda-caching-allocator");
  probe->release_cached();
  probe->reset_peak();
  const int64_t before = probe->current_bytes();
  {
    const at::Tensor t = torch::empty({64 * kMiB}, torch::dtype(torch::kUInt8).device(torch::kCUDA));
    CHECK(probe->current_bytes() - before >= 64 * kMiB);
  }
  CHECK(probe->peak_bytes() - before >= 64 * kMiB);
  REQUIRE(probe->reserved_peak_bytes().has_value());
  CHECK(*probe->reserved_peak_bytes() >= probe->peak_bytes());  // the allocator reserves segments
  CHECK(probe->current_bytes() == before);                      // freed, back to where it was
  CHECK(probe->device_total_bytes() > 1024 * kMiB);
}

TEST_CASE("CUDA probe: past the budget an allocation is an OOM the probe sees; the budget goes with the probe",
          "[probe][cuda]") {
  if (!have_gpu()) return;
  {
    auto probe = cuda_probe("cuda-caching-allocator", 512 * kMiB);
    CHECK(probe->budget_bytes() == std::optional<int64_t>(512 * kMiB));
    probe->clear_oom();
    CHECK_THROWS(torch::empty({1024 * kMiB}, torch::dtype(torch::kUInt8).device(torch::kCUDA)));
    CHECK(probe->oom_happened());
    probe->clear_oom();
    CHECK_FALSE(probe->oom_happened());
    // Below the budget allocations still work.
    CHECK_NOTHROW(torch::empty({64 * kMiB}, torch::dtype(torch::kUInt8).device(torch::kCUDA)));
    probe->release_cached();
  }
  // The probe is gone and so is its memory fraction: 1 GiB fits again.
  CHECK_NOTHROW(torch::empty({1024 * kMiB}, torch::dtype(torch::kUInt8).device(torch::kCUDA)));
  accumplan::cuda_shim::empty_cache();
}

#if ACCUMPLAN_HAS_CUPTI
TEST_CASE("CUPTI probe: the traced timeline sees the allocator's new segment", "[probe][cuda][cupti]") {
  if (!have_gpu()) return;
  accumplan::cuda_shim::empty_cache();  // so the next tensor needs a new cudaMalloc
  auto probe = cuda_probe("cupti");
  CHECK(probe->name() == "cupti");
  probe->reset_peak();
  {
    const at::Tensor t = torch::empty({96 * kMiB}, torch::dtype(torch::kUInt8).device(torch::kCUDA));
    torch::cuda::synchronize();
  }
  probe->release_cached();
  torch::cuda::synchronize();
  const std::vector<accumplan::MemoryTimelinePoint> timeline = probe->memory_timeline();
  REQUIRE_FALSE(timeline.empty());
  int64_t highest = 0;
  for (const auto& p : timeline) highest = std::max(highest, p.current_bytes);
  CHECK(highest >= 96 * kMiB);
  REQUIRE(probe->reserved_peak_bytes().has_value());
  CHECK(*probe->reserved_peak_bytes() >= 96 * kMiB);
  CHECK(probe->memory_clock_ns().has_value());
}
#endif  // ACCUMPLAN_HAS_CUPTI

#endif  // ACCUMPLAN_HAS_CUDA
