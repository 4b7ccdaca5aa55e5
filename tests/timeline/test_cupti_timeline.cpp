// test_cupti_timeline.cpp — CuptiMemoryTimeline against a fake record source: the record
// arithmetic of the CUPTI probe, checked without CUPTI or a GPU.
// Not tested here: the CUPTI wrapper itself (test_cupti_wrapper.cpp).
#include <catch2/catch.hpp>

#include <deque>
#include <vector>

#include "cupti_memory_timeline.h"

namespace {

using accumplan::CuptiMemoryRecord;
using accumplan::CuptiMemoryTimeline;

// Hands out one queued batch per take_records() call, like CUPTI delivering one buffer per flush.
class FakeRecordSource : public accumplan::CuptiMemoryRecordSource {
 public:
  void push(std::vector<CuptiMemoryRecord> batch) { batches_.push_back(std::move(batch)); }
  std::vector<CuptiMemoryRecord> take_records() override {
    if (batches_.empty()) {
      return {};
    }
    auto batch = std::move(batches_.front());
    batches_.pop_front();
    return batch;
  }

 private:
  std::deque<std::vector<CuptiMemoryRecord>> batches_;
};

CuptiMemoryRecord alloc(uint64_t t, uint64_t address, uint64_t bytes, uint32_t device = 0) {
  return {t, bytes, true, device, address};
}
CuptiMemoryRecord release(uint64_t t, uint64_t address, uint64_t bytes, uint32_t device = 0) {
  return {t, bytes, false, device, address};
}

std::vector<int64_t> currents(const CuptiMemoryTimeline& timeline, uint32_t device) {
  std::vector<int64_t> out;
  for (const auto& point : timeline.timeline(device)) {
    out.push_back(point.current_bytes);
  }
  return out;
}

}  // namespace

TEST_CASE("Cupti timeline: allocations and releases give current, peak and a timeline",
          "[probe][cupti][timeline]") {
  FakeRecordSource source;
  source.push({alloc(10, 0xA000, 100), alloc(20, 0xB000, 50), release(30, 0xA000, 100)});
  CuptiMemoryTimeline timeline(source);
  timeline.update();
  CHECK(timeline.current_bytes(0) == 50);
  CHECK(timeline.peak_bytes(0) == 150);
  CHECK(currents(timeline, 0) == std::vector<int64_t>{100, 150, 50});
  CHECK(timeline.anomalies(0).unmatched_release_count == 0);
  CHECK(timeline.record_count() == 3);
}

TEST_CASE("Cupti timeline: records delivered out of timestamp order are replayed in order",
          "[probe][cupti][timeline]") {
  FakeRecordSource source;
  // The first buffer holds the release of A and a later allocation; A's allocation (stamped
  // earliest) arrives in the second buffer, as when two threads' buffers flush in turn.
  source.push({release(30, 0xA000, 100), alloc(20, 0xB000, 50)});
  source.push({alloc(10, 0xA000, 100)});
  CuptiMemoryTimeline timeline(source);

  timeline.update();
  // With only the first buffer the release has no allocation: counted, not subtracted.
  CHECK(timeline.anomalies(0).unmatched_release_count == 1);
  CHECK(timeline.current_bytes(0) == 50);

  timeline.update();
  CHECK(timeline.anomalies(0).unmatched_release_count == 0);
  CHECK(timeline.current_bytes(0) == 50);
  CHECK(timeline.peak_bytes(0) == 150);
  const auto points = timeline.timeline(0);
  REQUIRE(points.size() == 3);
  CHECK(points[0].timestamp_ns == 10);
  CHECK(points[1].timestamp_ns == 20);
  CHECK(points[2].timestamp_ns == 30);
  CHECK(currents(timeline, 0) == std::vector<int64_t>{100, 150, 50});
}

TEST_CASE("Cupti timeline: releases of addresses never seen come out of the baseline only",
          "[probe][cupti][timeline]") {
  SECTION("without a baseline they are counted but do not change current") {
    FakeRecordSource source;
    source.push({alloc(5, 0x1, 64), release(10, 0xDEAD, 300)});
    CuptiMemoryTimeline timeline(source);
    timeline.update();
    CHECK(timeline.current_bytes(0) == 64);
    CHECK(timeline.peak_bytes(0) == 64);
    CHECK(timeline.anomalies(0).unmatched_release_count == 1);
    CHECK(timeline.anomalies(0).unmatched_release_bytes == 300);
  }
  SECTION("with a baseline they reduce it, never below zero") {
    FakeRecordSource source;
    source.push({release(10, 0xDEAD, 300), release(20, 0xBEEF, 2000)});
    CuptiMemoryTimeline timeline(source);
    timeline.set_baseline_bytes(0, 1000);
    CHECK(timeline.current_bytes(0) == 1000);
    timeline.update();
    CHECK(currents(timeline, 0) == std::vector<int64_t>{700, 0});
    CHECK(timeline.current_bytes(0) == 0);
    CHECK(timeline.peak_bytes(0) == 1000);  // the baseline itself was the peak
    CHECK(timeline.anomalies(0).unmatched_release_count == 2);
  }
}

TEST_CASE("Cupti timeline: devices are tracked separately", "[probe][cupti][timeline]") {
  FakeRecordSource source;
  // The same address on two devices is two different allocations.
  source.push({alloc(10, 0xA000, 100, 0), alloc(11, 0xA000, 700, 1), release(12, 0xA000, 100, 0),
               alloc(13, 0xB000, 40, 0), release(14, 0xA000, 700, 1), alloc(15, 0xC000, 5, 1)});
  CuptiMemoryTimeline timeline(source);
  timeline.update();
  CHECK(timeline.devices() == std::vector<uint32_t>{0, 1});
  CHECK(timeline.current_bytes(0) == 40);
  CHECK(timeline.peak_bytes(0) == 100);
  CHECK(timeline.current_bytes(1) == 5);
  CHECK(timeline.peak_bytes(1) == 700);
  CHECK(currents(timeline, 0) == std::vector<int64_t>{100, 0, 40});
  CHECK(currents(timeline, 1) == std::vector<int64_t>{700, 0, 5});
  CHECK(timeline.current_bytes(7) == 0);  // a device with no records
}

TEST_CASE("Cupti timeline: reset_peak is a timestamp, so late records land on the right side",
          "[probe][cupti][timeline]") {
  FakeRecordSource source;
  source.push({alloc(10, 0x1, 100), release(20, 0x1, 100), alloc(30, 0x2, 30)});
  CuptiMemoryTimeline timeline(source);
  timeline.update();
  REQUIRE(timeline.peak_bytes(0) == 100);
  timeline.reset_peak(0, 25);
  CHECK(timeline.peak_bytes(0) == 30);  // current at 25 was 0, then +30

  // A record stamped 22 (before the reset) arrives late: it is part of current at the reset.
  source.push({alloc(22, 0x3, 500)});
  timeline.update();
  CHECK(timeline.current_bytes(0) == 530);
  CHECK(timeline.peak_bytes(0) == 530);

  // A reset after the last record: peak := current.
  source.push({release(40, 0x3, 500)});
  timeline.update();
  timeline.reset_peak(0, 50);
  CHECK(timeline.peak_bytes(0) == 30);
  CHECK(timeline.current_bytes(0) == 30);
}

TEST_CASE("Cupti timeline: an allocation at a live address replaces it (lost release)",
          "[probe][cupti][timeline]") {
  FakeRecordSource source;
  source.push({alloc(10, 0xA, 100), alloc(20, 0xA, 200), release(30, 0xA, 200)});
  CuptiMemoryTimeline timeline(source);
  timeline.update();
  CHECK(currents(timeline, 0) == std::vector<int64_t>{100, 200, 0});
  CHECK(timeline.peak_bytes(0) == 200);
  CHECK(timeline.anomalies(0).reallocated_address_count == 1);
}

TEST_CASE("Cupti timeline: equal timestamps keep delivery order and a release uses the allocated size",
          "[probe][cupti][timeline]") {
  FakeRecordSource source;
  // Release record says 1 byte, but 100 were allocated: subtract what was added.
  source.push({alloc(10, 0xA, 100), release(10, 0xA, 1)});
  CuptiMemoryTimeline timeline(source);
  timeline.update();
  CHECK(currents(timeline, 0) == std::vector<int64_t>{100, 0});
  CHECK(timeline.peak_bytes(0) == 100);
  CHECK(timeline.current_bytes(0) == 0);
}
