// test_caching_device.cpp — the reserved-versus-allocated rules on a double of a GPU's caching
// allocator (caching_device.h): the double's own rules first, then the search planning on it and the
// window loop recovering on it. Torch-free.
//
// The truth each plan is judged against is the double's, found by running windows on a fresh one
// (two microbatches of b and Adam's step, twice: the second with the state resident), without the
// planner's code.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "accumplan/search.h"
#include "accumplan/solver.h"
#include "accumplan/window_loop.h"
#include "caching_device.h"
#include "test_helpers.h"

using namespace accumplan;
using accumplan::test::CachingAllocatorDouble;
using accumplan::test::CachingDeviceBackend;
using accumplan::test::CachingDeviceRunner;
using accumplan::test::LayerBytes;
using accumplan::test::TrainingDouble;

namespace {

using accumplan::test::MiB;
constexpr int64_t kCachingKiB = MiB / 1024;
constexpr int64_t kDeviceTotalBytes = 80 * 1024 * MiB;

// A small convolutional network's shape: wide early activations with workspaces, heavy late weights.
std::vector<LayerBytes> conv_net() {
  return {{40 * kCachingKiB, 256 * kCachingKiB, 32 * kCachingKiB, 4 * MiB},    {600 * kCachingKiB, 256 * kCachingKiB, 32 * kCachingKiB, 8 * MiB},
          {1200 * kCachingKiB, 128 * kCachingKiB, 16 * kCachingKiB, 8 * MiB},  {4608 * kCachingKiB, 128 * kCachingKiB, 16 * kCachingKiB, 16 * MiB},
          {9 * MiB, 64 * kCachingKiB, 8 * kCachingKiB, 16 * MiB},      {18 * MiB, 32 * kCachingKiB, 4 * kCachingKiB, 32 * MiB},
          {512 * kCachingKiB, 2 * kCachingKiB, 0, 0}};
}

int64_t weight_bytes(const std::vector<LayerBytes>& layers) {
  int64_t sum = 0;
  for (const LayerBytes& l : layers) sum += CachingAllocatorDouble::rounded_bytes(l.weight_bytes);
  return sum;
}

// The truth: two windows of [b, b] and a step run on a fresh double under the cap.
bool window_runs(const std::vector<LayerBytes>& layers, int64_t cap_bytes, int64_t b) {
  TrainingDouble model(layers, cap_bytes);
  for (int window = 0; window < 2; ++window) {
    if (!model.microbatch(b) || !model.microbatch(b) || !model.step()) return false;
    model.drop_gradients();
  }
  return true;
}

int64_t true_max(const std::vector<LayerBytes>& layers, int64_t cap_bytes) {
  int64_t lo = 0, hi = 1;
  while (window_runs(layers, cap_bytes, hi)) lo = hi, hi *= 2;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (window_runs(layers, cap_bytes, mid) ? lo : hi) = mid;
  }
  return lo;
}

Profile header(const std::vector<LayerBytes>& layers, int64_t budget_bytes) {
  Profile p;
  p.device = {"cuda", 0, "caching allocator double", kDeviceTotalBytes};
  p.model = {"conv.pt", "", weight_bytes(layers) / 4, {}};
  p.setup.inputs = {"float32[B,3,64,64]"};
  p.setup.target = "int64[B]:10";
  p.libtorch_version = "none";
  p.probe = "cuda-caching-allocator";
  p.budget_bytes = budget_bytes;
  p.persistent = {weight_bytes(layers), weight_bytes(layers), 2 * weight_bytes(layers)};
  return p;
}

struct Planned {
  Plan plan;
  Profile profile;
};

Planned plan_on(CachingDeviceRunner& runner, const std::vector<LayerBytes>& layers, int64_t budget_bytes,
                int64_t target) {
  SearchSettings s;
  s.budget_bytes = budget_bytes;
  s.budget_is_simulated = false;  // a real cap, as set_per_process_memory_fraction sets
  s.device_total_bytes = kDeviceTotalBytes;
  s.device_name = "caching allocator double";
  s.max_probe_micro_batch = target;
  // The persistent-memory window every runner takes first: the gradients and Adam's state made.
  REQUIRE_FALSE(runner.run_window({kPersistentWindowSamples}, 0, runner.budget_bytes()).oom);
  std::vector<Trial> trials;
  Search search(runner, s, trials);
  Profile p = header(layers, budget_bytes);
  search.profile(p);
  p.trials = trials;
  PlanRequest r;
  r.target_batch = target;
  r.budget.bytes = budget_bytes;
  Plan plan = search.plan_and_confirm(p, r);
  return {plan, p};
}

// The user's run at the plan's promise: `windows` windows of three microbatches of the plan's
// largest size through the window loop on a fresh double.
WindowTotals run_at_largest(const std::vector<LayerBytes>& layers, int64_t cap_bytes, Plan plan, int windows) {
  const int64_t m = plan.max_micro_batch;
  plan.per_rank_batch = plan.target_batch = 3 * m;
  set_window(plan, {m, m, m}, m);
  TrainingDouble model(layers, cap_bytes);
  WindowLoop loop(plan);
  CachingDeviceBackend backend(model, plan.per_rank_batch);
  for (int w = 0; w < windows; ++w) {
    WindowStats st = loop.accumulate(backend, WindowOptions{});
    loop.apply(backend, WindowOptions{}, st);
  }
  return loop.totals();
}

}  // namespace

TEST_CASE("Caching allocator double: requests round to 512 B; small ones share 2 MiB segments, large ones get their own",
          "[caching-device]") {
  CachingAllocatorDouble a(kDeviceTotalBytes);
  const auto one = a.allocate(1);
  REQUIRE(one);
  CHECK(a.allocated_bytes() == 512);
  CHECK(a.reserved_bytes() == 2 * MiB);
  REQUIRE(a.allocate(700 * kCachingKiB));  // the same small segment
  CHECK(a.reserved_bytes() == 2 * MiB);
  REQUIRE(a.allocate(3 * MiB));  // a 20 MiB segment
  CHECK(a.reserved_bytes() == 22 * MiB);
  REQUIRE(a.allocate(30 * MiB + 1));  // its own segment, rounded to 2 MiB
  CHECK(a.reserved_bytes() == 22 * MiB + 32 * MiB);
  CHECK(a.allocated_bytes() == 512 + 700 * kCachingKiB + 3 * MiB + (30 * MiB + 512));
}

TEST_CASE("Caching allocator double: a freed block stays reserved and serves the next request that fits it",
          "[caching-device]") {
  CachingAllocatorDouble a(kDeviceTotalBytes);
  const auto big = a.allocate(64 * MiB);
  REQUIRE(big);
  a.free(*big);
  CHECK(a.allocated_bytes() == 0);
  CHECK(a.reserved_bytes() == 64 * MiB);  // cached, not returned
  a.reset_peaks();
  REQUIRE(a.allocate(40 * MiB));  // cut from the cached block
  CHECK(a.reserved_bytes() == 64 * MiB);
  CHECK(a.segment_count() == 1);
  CHECK(a.reserved_peak_bytes() == 64 * MiB);
}

TEST_CASE("Caching allocator double: at the cap the cache is released and the request retried before it runs out",
          "[caching-device]") {
  CachingAllocatorDouble a(64 * MiB);
  const auto first = a.allocate(40 * MiB);
  REQUIRE(first);
  a.free(*first);
  REQUIRE(a.allocate(50 * MiB));  // 40 cached + 50 new is over 64: the cached 40 goes back first
  CHECK(a.reserved_bytes() == 50 * MiB);
  CHECK_FALSE(a.allocate(20 * MiB));  // nothing cached to release: out of memory
  CHECK(a.allocated_bytes() == 50 * MiB);
}

TEST_CASE("Caching allocator double: a split cached segment can refuse a request that the allocated bytes would fit",
          "[caching-device]") {
  CachingAllocatorDouble a(24 * MiB);
  REQUIRE(a.allocate(3 * MiB));  // a 20 MiB segment, 17 MiB of it free and cached
  CHECK_FALSE(a.allocate(18 * MiB));  // 3 + 18 allocated is under 24, but 20 + 18 reserved is not
  CHECK(a.allocated_bytes() == 3 * MiB);
  REQUIRE(a.allocate(17 * MiB));  // the cached rest serves a request it holds
}

TEST_CASE("Caching device: a smaller window after a larger one keeps the larger one's reserved bytes",
          "[caching-device]") {
  CachingDeviceRunner runner(conv_net(), 1024 * MiB, kDeviceTotalBytes);
  REQUIRE_FALSE(runner.run_window({kPersistentWindowSamples}, 0, runner.budget_bytes()).oom);  // the state made
  const WindowMeasurement large = runner.run_window({300, 300}, 0, runner.budget_bytes());
  const WindowMeasurement small = runner.run_window({100, 100}, 0, runner.budget_bytes());
  REQUIRE_FALSE(large.oom);
  REQUIRE_FALSE(small.oom);
  CHECK(small.peak_bytes < large.peak_bytes);
  REQUIRE(small.reserved_peak_bytes);
  CHECK(*small.reserved_peak_bytes >= *large.reserved_peak_bytes);  // the cache kept between windows
  CHECK(*small.reserved_peak_bytes > small.max_peak_bytes);
}

TEST_CASE("Caching device: near the cap the layout is path-dependent: a size that ran twice can fail the third time",
          "[caching-device]") {
  // Why no few windows prove a size on a caching allocator: the cache a window leaves decides
  // where the next one's blocks go, and free space split by live blocks is not released.
  auto windows = [](int64_t b) {
    CachingDeviceRunner runner(conv_net(), 512 * MiB, kDeviceTotalBytes);
    REQUIRE_FALSE(runner.run_window({kPersistentWindowSamples}, 0, runner.budget_bytes()).oom);
    std::string ran;
    for (int w = 0; w < 3; ++w) ran += runner.run_window({b, b}, 0, runner.budget_bytes()).oom ? "X" : "o";
    return ran;
  };
  CHECK(windows(330) == "ooX");
  CHECK(windows(342) == "ooo");  // larger, and it runs
}

TEST_CASE("Caching device: the search plans by allocated peaks at 0.97 or more of the plain truth, and its plan runs",
          "[caching-device][search]") {
  const std::vector<LayerBytes> layers = conv_net();
  for (const int64_t budget : {512 * MiB, 1024 * MiB, 3 * 1024 * MiB}) {
    CAPTURE(budget);
    const int64_t truth = true_max(layers, budget);
    CachingDeviceRunner runner(layers, budget, kDeviceTotalBytes);
    const Planned planned = plan_on(runner, layers, budget, 4096);
    const Plan& plan = planned.plan;
    CAPTURE(truth, plan.max_micro_batch);
    CHECK(static_cast<double>(plan.max_micro_batch) >= 0.97 * static_cast<double>(truth));
    CHECK(plan.memory.margin.allocator_fragmentation_bytes == 0);
    CHECK(plan.memory.predicted_peak_bytes <= budget);
    // What the user runs: three windows at the plan's largest size on a fresh device. Near the cap
    // the layout is path-dependent (below), so a size the search's warm windows ran can meet one
    // out-of-memory there; the loop recovers once and runs every sample.
    const WindowTotals run = run_at_largest(layers, budget, plan, 3);
    CHECK(run.windows == 3);
    CHECK(run.samples_seen == 3 * 3 * plan.max_micro_batch);
    CHECK(run.oom_recoveries <= 1);
    // The points carry the reserved peaks beside the allocated ones the model fits.
    int64_t above = 0;
    for (const ProfilePoint& pt : planned.profile.points) {
      REQUIRE(pt.reserved_peak_bytes);
      CHECK(*pt.reserved_peak_bytes >= pt.peak_bytes);
      above = std::max(above, *pt.reserved_peak_bytes - pt.peak_bytes);
    }
    CHECK(above >= 20 * MiB);  // the cache held more than the allocated peak somewhere
  }
}

TEST_CASE("Caching device: a plan 1.3x too large recovers once, the cache released, every sample once",
          "[caching-device][window-loop]") {
  const std::vector<LayerBytes> layers = conv_net();
  const int64_t budget = 1024 * MiB;
  CachingDeviceRunner runner(layers, budget, kDeviceTotalBytes);
  Plan plan = plan_on(runner, layers, budget, 4096).plan;
  const int64_t forced = static_cast<int64_t>(std::ceil(1.3 * static_cast<double>(plan.max_micro_batch)));
  plan.per_rank_batch = plan.target_batch = 3 * forced;
  set_window(plan, {forced, forced, forced}, forced);

  TrainingDouble model(layers, budget);
  WindowLoop loop(plan);
  CachingDeviceBackend backend(model, plan.per_rank_batch);
  int64_t recoveries = 0;
  for (int window = 0; window < 3; ++window) {
    const size_t from = backend.ran.size();
    WindowStats st = loop.accumulate(backend, WindowOptions{});
    recoveries += st.oom_recoveries;
    loop.apply(backend, WindowOptions{}, st);
    // Every sample of the window in exactly one microbatch of its last attempt.
    std::vector<int64_t> seen;
    for (size_t i = from; i < backend.ran.size(); ++i) {
      if (backend.ran[i].where.attempt != backend.ran.back().where.attempt) continue;
      for (int64_t s = 0; s < backend.ran[i].where.size; ++s) seen.push_back(backend.ran[i].start + s);
    }
    std::sort(seen.begin(), seen.end());
    std::vector<int64_t> all(static_cast<size_t>(3 * forced));
    std::iota(all.begin(), all.end(), 0);
    CHECK(seen == all);
    CHECK(st.loss == Approx(1.0));  // each sample weighted 1/N once
  }
  // Out of memory once (the first window's step makes the state; a later window meets the cap
  // with it resident), re-planned to sizes that run from then on.
  CHECK(recoveries == 1);
  CHECK(loop.plan().max_micro_batch < forced);
  // Released: right after the failure the cache holds nothing beyond the blocks in use.
  REQUIRE(backend.reserved_after_release.size() == 1);
  CHECK(backend.reserved_after_release[0] < budget / 4);
}

