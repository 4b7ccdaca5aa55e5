// planner/src/settle.h — the largest integer that satisfies a monotone test, from a closed-form
// estimate (internal to the planner).
//
// What it is: the one way the planner turns a double estimate ("about 1.3e9 samples fit") into
// the exact largest integer b in [1, limit] with fits(b): clamp the estimate into range before
// it becomes an integer (no float-to-int conversion outside int64), step a few times toward the
// boundary (rounding moves it by a few units at most), and bisect when that is not enough. The
// search is bounded by about 64 tests whatever the numbers: nothing counts b up one at a time (a
// slope of one byte per sample and a budget in terabytes would hang the solver).
// What it is not: a general root finder; `fits` must be monotone (true up to the answer, false
// after it) and fits(1) must hold.
#pragma once

#include <cstdint>

namespace accumplan::detail {

template <class Fits>
int64_t settle_largest(double estimate, int64_t limit, Fits fits) {
  if (!(estimate >= 1.0)) estimate = 1.0;
  int64_t b = estimate >= static_cast<double>(limit) ? limit : static_cast<int64_t>(estimate);
  for (int i = 0; i < 4 && b > 1 && !fits(b); ++i) --b;
  if (!fits(b)) {
    int64_t lo = 1, hi = b;  // fits(lo), !fits(hi)
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      (fits(mid) ? lo : hi) = mid;
    }
    return lo;
  }
  for (int i = 0; i < 4 && b < limit && fits(b + 1); ++i) ++b;
  if (b < limit && fits(b + 1)) {  // the estimate was far too low: bisect upward
    int64_t lo = b, hi = limit;
    if (fits(hi)) return hi;
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      (fits(mid) ? lo : hi) = mid;
    }
    return lo;
  }
  return b;
}

}  // namespace accumplan::detail
