// accumplan/checked.h — int64 arithmetic that refuses to wrap, and the bounds counts and byte
// totals live in.
//
// What it is: `checked_add`, `checked_mul`, `checked_sum`, `checked_ceil_div` on int64_t (through
// the compiler's __builtin_*_overflow, so no undefined behaviour is ever executed) and
// `checked_to_int64`, a double -> int64 conversion that refuses NaN, infinities and values outside
// int64 (a plain static_cast is undefined there, and UBSan's float-cast-overflow reports it).
// Each throws InputError (exit 2) whose one line names the quantity (`what`, e.g.
// "--target-batch * --world-size" or "$.persistent"), the value (cut to 80 characters) and the
// range it had to be in. `kMaxBytes`, `kMaxSamples` and `kMaxWorldSize` are the documented bounds
// (docs/plan-format.md) that readers and options enforce, chosen so that sums and products of a
// few bounded values stay exact in int64 and in double (2^53).
// What it is not: saturating arithmetic, and not a place for policy: callers decide which bound
// applies to which field.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "accumplan/errors.h"

namespace accumplan {

// `what` names the quantity and may hold a file already shortened by path_for_message (80
// characters) behind its option ("--data '…/d.pt'"), so it is cut later than a raw value.
constexpr size_t kMaxWhatChars = 160;

// 1 PiB: no device has more memory, and 2^50 leaves room for sums of thousands of byte counts.
inline constexpr int64_t kMaxBytes = int64_t{1} << 50;
// Samples in a batch, a microbatch or a target batch: 2^40 (about 1.1e12).
inline constexpr int64_t kMaxSamples = int64_t{1} << 40;
// Data-parallel ranks: 2^20.
inline constexpr int64_t kMaxWorldSize = int64_t{1} << 20;

namespace checked_detail {
inline std::string range_text(int64_t lo, int64_t hi) {
  return "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}
inline std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}
[[noreturn]] inline void overflow(const std::string& what, const std::string& expr) {
  throw InputError(cut_for_message(what, kMaxWhatChars) + ": " + expr + " does not fit in a 64-bit integer (range " +
                   range_text(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()) +
                   "); use smaller values");
}
}  // namespace checked_detail

// a + b, or InputError naming `what`.
inline int64_t checked_add(int64_t a, int64_t b, const std::string& what) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) {
    checked_detail::overflow(what, std::to_string(a) + " + " + std::to_string(b));
  }
  return r;
}

// a * b, or InputError naming `what`.
inline int64_t checked_mul(int64_t a, int64_t b, const std::string& what) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) {
    checked_detail::overflow(what, std::to_string(a) + " * " + std::to_string(b));
  }
  return r;
}

// The sum of `values`, or InputError naming `what`.
inline int64_t checked_sum(const std::vector<int64_t>& values, const std::string& what) {
  int64_t s = 0;
  for (int64_t v : values) s = checked_add(s, v, what);
  return s;
}

// ceil(a / b) for a >= 0 and b >= 1 without forming a + b - 1; InputError naming `what` otherwise.
inline int64_t checked_ceil_div(int64_t a, int64_t b, const std::string& what) {
  if (b < 1 || a < 0) {
    throw InputError(cut_for_message(what, kMaxWhatChars) + ": ceil(" + std::to_string(a) + " / " + std::to_string(b) +
                     ") needs a numerator >= 0 and a denominator >= 1");
  }
  return a / b + (a % b != 0 ? 1 : 0);
}

// `value` must lie in [lo, hi]; returns it, or throws InputError naming `what`, the value and the
// range.
inline int64_t checked_in_range(int64_t value, int64_t lo, int64_t hi, const std::string& what) {
  if (value < lo || value > hi) {
    throw InputError(cut_for_message(what, kMaxWhatChars) + ": " + std::to_string(value) + " is out of range " +
                     checked_detail::range_text(lo, hi));
  }
  return value;
}

// A double as an int64: refuses NaN, +-inf and anything outside [lo, hi] (by default all of
// int64, where the cast itself is defined). The value is truncated toward zero as static_cast
// does; round or floor first if another rule is meant.
inline int64_t checked_to_int64(double value, const std::string& what,
                                int64_t lo = std::numeric_limits<int64_t>::min(),
                                int64_t hi = std::numeric_limits<int64_t>::max()) {
  // 2^63 as a double is exact; every double strictly below it and at or above -2^63 converts.
  constexpr double kTwo63 = 9223372036854775808.0;
  if (std::isnan(value) || std::isinf(value) || value >= kTwo63 || value < -kTwo63) {
    throw InputError(cut_for_message(what, kMaxWhatChars) + ": " + checked_detail::num(value) +
                     " is not a finite number in range " + checked_detail::range_text(lo, hi));
  }
  const int64_t r = static_cast<int64_t>(value);
  if (r < lo || r > hi) {
    throw InputError(cut_for_message(what, kMaxWhatChars) + ": " + checked_detail::num(value) + " is out of range " +
                     checked_detail::range_text(lo, hi));
  }
  return r;
}

}  // namespace accumplan
