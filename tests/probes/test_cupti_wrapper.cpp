// test_cupti_wrapper.cpp — the real CUPTI wrapper on this machine: without an NVIDIA driver it
// must report "unavailable" with CUPTI's error code and not crash; with one it must enable.
// Compiled into a test only when the wrapper is built (ACCUMPLAN_HAS_CUPTI_WRAPPER).
// Not tested here: record arithmetic (test_cupti_timeline.cpp).
#include <catch2/catch.hpp>

#if ACCUMPLAN_HAS_CUPTI_WRAPPER

#include <fstream>
#include <string>

#include "CuptiActivityApi.h"

using accumplan::CuptiActivityApi;
using Catch::Matchers::Contains;

namespace {

// The NVIDIA kernel driver publishes its version here; without it CUDA cannot run.
bool nvidia_driver_present() { return std::ifstream("/proc/driver/nvidia/version").good(); }

}  // namespace

TEST_CASE("Cupti: unavailable driver is reported, not fatal", "[probe][cupti]") {
  CuptiActivityApi& api = CuptiActivityApi::singleton();
  // cuptiGetVersion needs no driver: 130001 for CUDA 13.0 Update 1; any CUPTI >= 1.
  const auto version = api.cupti_version();
  REQUIRE(version.has_value());
  CHECK(*version > 0);

  const accumplan::CuptiAvailability availability = api.enable_memory_records();
  INFO("CUPTI says: " << availability.message);
  if (nvidia_driver_present()) {
    CHECK(availability.available);
    CHECK(availability.error_code == 0);
    api.disable_memory_records();
    return;
  }
  CHECK_FALSE(availability.available);
  CHECK(availability.error_code != 0);  // 999 (CUPTI_ERROR_UNKNOWN) with CUPTI 13
  CHECK_THAT(availability.message, Contains(std::to_string(availability.error_code)));
  CHECK_THAT(availability.message, Contains("CUPTI is unavailable"));
  CHECK_FALSE(api.enabled());
  // Everything else stays harmless: flushing, taking records, disabling, asking again.
  CHECK_NOTHROW(api.flush());
  CHECK(api.take_records().empty());
  CHECK_NOTHROW(api.disable_memory_records());
  CHECK(api.dropped_record_count() == 0);
  const accumplan::CuptiAvailability again = api.enable_memory_records();
  CHECK_FALSE(again.available);
  CHECK(again.error_code == availability.error_code);
}

#endif  // ACCUMPLAN_HAS_CUPTI_WRAPPER
