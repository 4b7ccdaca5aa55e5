// Sizes and budgets: `512MiB`, `1.5GB`, `2048`, `90%` parse exactly; everything else is refused
// with a message that names the flag and the bad text.
#include <catch2/catch.hpp>

#include "accumplan/errors.h"
#include "accumplan/units.h"

using namespace accumplan;

TEST_CASE("Units: binary, decimal and plain byte sizes parse exactly", "[units]") {
  CHECK(parse_size_bytes("2048", "--memory-budget") == 2048);
  CHECK(parse_size_bytes("512MiB", "--memory-budget") == 512LL * 1024 * 1024);
  CHECK(parse_size_bytes("12GiB", "--memory-budget") == 12LL * 1024 * 1024 * 1024);
  CHECK(parse_size_bytes("1.5GB", "--memory-budget") == 1500000000LL);
  CHECK(parse_size_bytes("64KiB", "x") == 65536);
  CHECK(parse_size_bytes("3kb", "x") == 3000);
  CHECK(parse_size_bytes("1TiB", "x") == 1LL << 40);
  CHECK(parse_size_bytes("100B", "x") == 100);
}

TEST_CASE("Units: malformed sizes are refused naming the flag and the text", "[units][errors]") {
  for (const char* bad : {"12 GiB", "abc", "-5MiB", "", "5XB", "0", "0.1", "MiB", "1e9"}) {
    INFO(bad);
    try {
      parse_size_bytes(bad, "--memory-budget");
      FAIL("accepted " << bad);
    } catch (const InputError& e) {
      const std::string msg = e.what();
      CHECK(msg.find("--memory-budget") != std::string::npos);
      CHECK(msg.find(std::string("'") + bad + "'") != std::string::npos);
      CHECK(msg.find("accepted forms") != std::string::npos);
      CHECK(e.exit_code() == 2);
    }
  }
}

TEST_CASE("Units: a percentage budget resolves against the device total", "[units]") {
  const BudgetSpec b = parse_budget("90%", "--memory-budget");
  REQUIRE(b.fraction);
  CHECK(b.resolve_bytes(1000) == 900);
  CHECK(parse_budget("100%", "x").resolve_bytes(4096) == 4096);
  CHECK_THROWS_AS(parse_budget("0%", "x"), InputError);
  CHECK_THROWS_AS(parse_budget("150%", "x"), InputError);
  CHECK_THROWS_AS(parse_budget("x%", "x"), InputError);
  CHECK_THROWS_AS(b.resolve_bytes(0), InputError);  // unknown device total
  CHECK(parse_budget("1GiB", "x").resolve_bytes(0) == 1LL << 30);
}

TEST_CASE("Units: bytes and seconds print for humans", "[units]") {
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(512LL * 1024 * 1024) == "512.0 MiB");
  CHECK(format_bytes(1536) == "1.5 KiB");
  CHECK(format_seconds(0.0123) == "12.3 ms");
  CHECK(format_seconds(2.5) == "2.50 s");
}
