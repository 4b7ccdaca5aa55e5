// Checked arithmetic (accumplan/checked.h): sums, products, ceil-divisions and double -> int64
// conversions either give the exact answer or an InputError (exit 2) naming the quantity, the
// value and the range. Never a wrapped number, never an undefined cast.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "accumplan/checked.h"
#include "accumplan/errors.h"

using namespace accumplan;

namespace {
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
}  // namespace

TEST_CASE("Checked: exact results inside int64", "[checked]") {
  CHECK(checked_add(2, 3, "x") == 5);
  CHECK(checked_add(kMax - 1, 1, "x") == kMax);
  CHECK(checked_mul(int64_t{1} << 31, int64_t{1} << 31, "x") == int64_t{1} << 62);
  CHECK(checked_mul(-4, 5, "x") == -20);
  CHECK(checked_sum({52, 51, 51, 51, 51}, "x") == 256);
  CHECK(checked_ceil_div(256, 60, "x") == 5);
  CHECK(checked_ceil_div(240, 60, "x") == 4);
  CHECK(checked_ceil_div(0, 7, "x") == 0);
  CHECK(checked_ceil_div(kMax, 1, "x") == kMax);  // no a + b - 1 to overflow
  CHECK(checked_ceil_div(kMax, 2, "x") == int64_t{1} << 62);
  CHECK(checked_to_int64(1e15, "x") == 1000000000000000);
  CHECK(checked_to_int64(-2.9, "x") == -2);  // truncation, as static_cast
  CHECK(checked_to_int64(9223372036854774784.0, "x") == 9223372036854774784);  // largest double below 2^63
  CHECK(checked_in_range(5, 1, 10, "x") == 5);
}

TEST_CASE("Checked: overflow is an input error naming the quantity and the operands", "[checked][errors]") {
  auto message = [](auto f) -> std::string {
    try {
      f();
    } catch (const InputError& e) {
      CHECK(e.exit_code() == 2);
      return e.what();
    }
    FAIL("no error");
    return "";
  };
  const std::string add = message([] { checked_add(kMax, 1, "$.microbatch_sizes: the sum"); });
  CHECK(add.find("$.microbatch_sizes: the sum") == 0);
  CHECK(add.find("9223372036854775807 + 1") != std::string::npos);
  CHECK(add.find("does not fit in a 64-bit integer") != std::string::npos);
  // An exporter's case: u * k * W with four sizes of 2^62.
  const std::string mul = message([] { checked_mul(int64_t{1} << 62, 4, "the plan's uniform split"); });
  CHECK(mul.find("4611686018427387904 * 4") != std::string::npos);
  CHECK_THROWS_AS(checked_mul(kMin, -1, "x"), InputError);
  CHECK_THROWS_AS(checked_add(kMin, -1, "x"), InputError);
  CHECK_THROWS_AS(checked_sum({int64_t{1} << 62, int64_t{1} << 62, int64_t{1} << 62, int64_t{1} << 62}, "x"),
                  InputError);
  CHECK_THROWS_AS(checked_ceil_div(5, 0, "x"), InputError);
  CHECK_THROWS_AS(checked_ceil_div(-5, 2, "x"), InputError);
  const std::string range = message([] { checked_in_range(0, 1, 10, "--target-batch"); });
  CHECK(range == "--target-batch: 0 is out of range [1, 10]");
}

TEST_CASE("Checked: NaN, infinities and values beyond int64 are refused, never cast", "[checked][errors]") {
  for (double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL, 9223372036854775808.0, -9.3e18, 1e300}) {
    INFO(bad);
    CHECK_THROWS_AS(checked_to_int64(bad, "predicted peak"), InputError);
  }
  CHECK_THROWS_WITH(checked_to_int64(1e16, "micro_batch", 1, int64_t{1} << 40),
                    Catch::Contains("micro_batch: 10000000000000000 is out of range [1, 1099511627776]"));
  CHECK_THROWS_WITH(checked_to_int64(std::nan(""), "slope"), Catch::Contains("slope: nan is not a finite number"));
}

TEST_CASE("Checked: a long quantity name is cut to 160 characters", "[checked][errors]") {
  const std::string name(5000, 'n');
  try {
    checked_add(kMax, kMax, name);
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).size() < 400);
    CHECK(std::string(e.what()).find(std::string(160, 'n') + "... (5000 characters)") != std::string::npos);
  }
  CHECK(cut_for_message("line one\nline two") == "line one?line two");
  CHECK(cut_for_message(std::string(80, 'a')) == std::string(80, 'a'));
}

TEST_CASE("Errors: a long path keeps its file name and its directory, elided in the middle", "[errors][paths]") {
  const std::string deep = "/home/me/" + std::string(150, 'p') + "/build/tests/scratch/no-such-dir/plan.json";
  const std::string shown = path_for_message(deep);
  CHECK(shown.size() <= 82);  // 80 bytes, the ellipsis counted as its three UTF-8 bytes
  CHECK(shown == "/home/me/\xE2\x80\xA6/no-such-dir/plan.json");
  // As much of the start as fits, cut at a '/'.
  const std::string wide = "/home/me/projects/a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p/q/r/s/t/u/v/w/x/y/z/no-such-dir/plan.json";
  CHECK(path_for_message(wide) == "/home/me/projects/a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p/q/r/s/\xE2\x80\xA6/no-such-dir/plan.json");
}

TEST_CASE("Errors: a short path is shown whole, control characters as '?'", "[errors][paths]") {
  CHECK(path_for_message("runs/plan.json") == "runs/plan.json");
  CHECK(path_for_message("a\nb/plan\x7f.json") == "a?b/plan?.json");
  const std::string exact(80, 'x');
  CHECK(path_for_message(exact) == exact);
}

TEST_CASE("Errors: a file name longer than the limit keeps its start and its end", "[errors][paths]") {
  const std::string name = "/data/" + std::string(100, 'n') + "-END.pt";
  const std::string shown = path_for_message(name);
  CHECK(shown.size() <= 82);
  CHECK(shown.rfind("-END.pt") == shown.size() - 7);
  CHECK(shown.rfind("/data/", 0) == 0);
  // A directory too long to keep beside the name gives way to the name.
  const std::string dir = "/" + std::string(100, 'd') + "/plan.json";
  CHECK(path_for_message(dir) == "/\xE2\x80\xA6/plan.json");
}

TEST_CASE("Errors: a path is never cut inside a UTF-8 character", "[errors][paths]") {
  std::string utf;
  for (int i = 0; i < 60; ++i) utf += "\xC3\xA9";  // "é", two bytes
  for (const std::string& path : {"/" + utf + "/f.json", "/a" + utf + ".json", "/ab/" + utf + "/" + utf + ".json"}) {
    const std::string shown = path_for_message(path);
    // Every "é" is whole: 0xC3 is followed by 0xA9 and 0xA9 follows 0xC3.
    for (size_t i = 0; i < shown.size(); ++i) {
      const unsigned char c = static_cast<unsigned char>(shown[i]);
      if (c == 0xC3) CHECK((i + 1 < shown.size() && static_cast<unsigned char>(shown[i + 1]) == 0xA9));
      if (c == 0xA9) CHECK((i > 0 && static_cast<unsigned char>(shown[i - 1]) == 0xC3));
    }
    CHECK(shown.size() <= 82);
    CHECK(shown.find(".json") != std::string::npos);
  }
}
