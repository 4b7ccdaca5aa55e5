// The least-squares memory model: exact on lines, residuals reported, bad profiles refused.
#include <catch2/catch.hpp>

#include "accumplan/errors.h"
#include "accumplan/memory_model.h"
#include "test_helpers.h"

using namespace accumplan;
using accumplan::test::linear_profile;

TEST_CASE("MemoryModel: an exact line is recovered with zero residual", "[model]") {
  const Profile p = linear_profile(1000, 500, 100);
  const MemoryModel m = MemoryModel::fit(p);
  CHECK(m.summary().slope_bytes_per_sample == Approx(100));
  CHECK(m.summary().intercept_bytes == Approx(2500));
  CHECK(m.activation_fixed_bytes() == 500);
  CHECK(m.summary().max_abs_residual_bytes == Approx(0).margin(1e-6));
  CHECK(m.predict_peak_bytes(10) == 3500);
  CHECK(m.largest_fitting(3500) == 10);
  CHECK(m.largest_fitting(3599) == 10);
  CHECK(m.largest_fitting(2599) == 0);
  CHECK(m.summary().target == "peak_bytes");
}

TEST_CASE("MemoryModel: residuals of noisy points are reported", "[model]") {
  Profile p = linear_profile(1000, 500, 100);
  p.points[1].peak_bytes += 30;
  const MemoryModel m = MemoryModel::fit(p);
  CHECK(m.summary().residuals_bytes.size() == 4);
  CHECK(m.summary().max_abs_residual_bytes > 10);
  CHECK(m.summary().rms_residual_bytes > 0);
}

TEST_CASE("MemoryModel: a caching allocator's reserved peaks are reported, not fitted", "[model]") {
  Profile p = linear_profile(1000, 500, 100);
  for (auto& pt : p.points) pt.reserved_peak_bytes = pt.peak_bytes * 2;
  const MemoryModel m = MemoryModel::fit(p);
  CHECK(m.summary().target == "peak_bytes");
  CHECK(m.summary().slope_bytes_per_sample == Approx(100));
}

TEST_CASE("MemoryModel: fewer than two distinct sizes is refused", "[model][errors]") {
  Profile p = linear_profile(1000, 500, 100);
  p.points.resize(1);
  CHECK_THROWS_WITH(MemoryModel::fit(p), Catch::Contains("1 distinct microbatch size"));
  p.points.push_back(p.points[0]);
  CHECK_THROWS_WITH(MemoryModel::fit(p), Catch::Contains("at least two"));
}

TEST_CASE("MemoryModel: peaks that fall with the microbatch are refused, noise is not", "[model][errors]") {
  Profile p = linear_profile(1000000, 50000, 10000);
  p.points[2].peak_bytes = p.points[1].peak_bytes - 5000;  // a 0.5% dip: noise
  CHECK_NOTHROW(MemoryModel::fit(p));
  p.points[2].peak_bytes = p.points[1].peak_bytes / 2;     // halved: broken measurement
  CHECK_THROWS_WITH(MemoryModel::fit(p), Catch::Contains("peaks must grow"));
  Profile falling = linear_profile(1000, 500, 0);
  falling.points[3].peak_bytes -= 1;  // within noise, but the line falls: no line at all
  CHECK_THROWS_WITH(MemoryModel::fit(falling), Catch::Contains("does not grow"));
}

TEST_CASE("MemoryModel: a flat peak is a line known only up to the largest size measured", "[model]") {
  // A b-independent phase (a gradient hook's copies on a small MLP) sets the peak at every size
  // probed, 1 to 8 here: planned from, but never past 8, where the activations may yet show.
  const Profile flat = linear_profile(1000, 500, 0);
  const MemoryModel m = MemoryModel::fit(flat);
  CHECK(m.summary().slope_bytes_per_sample == 0);
  CHECK(m.largest_fitting(int64_t{1} << 30, 1000) == 8);
  CHECK(m.largest_fitting(int64_t{1} << 30, 5) == 5);
  CHECK(m.largest_fitting(2499, 1000) == 0);  // persistent 2000 + 500 does not fit 2499
}
