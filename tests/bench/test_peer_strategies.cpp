// The peer searches against a fake oracle with a known threshold: what they find and what it
// costs them, so the benchmark's comparison rests on tested logic.
#include <catch2/catch.hpp>

#include "peer_strategies.h"

using namespace accumplan::bench;

namespace {
// Fits up to `limit` samples; peak = 1000 + 100 * b bytes.
Oracle threshold(int64_t limit) {
  return [limit](int64_t b, int) { return StepOutcome{b <= limit, b <= limit ? 1000 + 100 * b : 0}; };
}
}  // namespace

TEST_CASE("Peers: Lightning power doubles from 2 and stops at the last power of two that fits", "[bench][peers]") {
  const SearchResult r = lightning_power(threshold(100), 100000);
  CHECK(r.micro_batch == 64);
  CHECK(r.tried == std::vector<int64_t>{2, 4, 8, 16, 32, 64, 128});
  CHECK(r.steps == 7 * 3);
  CHECK(r.ooms == 1);
}

TEST_CASE("Peers: Lightning binsearch refines between the last success and the failure", "[bench][peers]") {
  const SearchResult r = lightning_binsearch(threshold(100), 100000);
  CHECK(r.micro_batch == 100);
  CHECK(r.ooms >= 1);
  CHECK(r.steps == r.trials * 3);
}

TEST_CASE("Peers: Accelerate shrinks by 0.9 from 128, or halves in its legacy mode", "[bench][peers]") {
  SearchResult r = accelerate_find_executable(threshold(100), 128);
  CHECK(r.tried == std::vector<int64_t>{128, 115, 103, 92});
  CHECK(r.micro_batch == 92);
  r = accelerate_find_executable(threshold(100), 128, true);
  CHECK(r.micro_batch == 64);
  CHECK(accelerate_find_executable(threshold(0), 128).micro_batch == 0);
}

TEST_CASE("Peers: Composer halves from the per-rank batch", "[bench][peers]") {
  const SearchResult r = composer_auto_microbatch(threshold(100), 256);
  CHECK(r.tried == std::vector<int64_t>{256, 128, 64});
  CHECK(r.micro_batch == 64);
}

TEST_CASE("Peers: DeepSpeed predicts from one profile at 1 and bisects after misses", "[bench][peers]") {
  // model states 1000 B, 100 B/sample: with budget 1000 + 100*100 the prediction is exact.
  SearchResult r = deepspeed_autotune(threshold(100), 1000 + 100 * 100, 1000, 100000);
  CHECK(r.micro_batch == 100);
  CHECK(r.tried.front() == 1);
  // An oracle tighter than the prediction makes every candidate fail: bisect finds the limit.
  r = deepspeed_autotune(threshold(60), 1000 + 100 * 100, 1000, 100000);
  CHECK(r.micro_batch == 60);
  CHECK(r.ooms >= 3);
}
