// fuzz_units — bytes as a --memory-budget: sizes and percentages parse into [1, 1 PiB] bytes or
// are refused; a percentage resolves against device totals from 1 byte to 1 PiB; every size
// prints for humans.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "accumplan/checked.h"
#include "accumplan/units.h"
#include "fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  accumplan::fuzz::expect_refusal_or_success([&] {
    const accumplan::BudgetSpec b = accumplan::parse_budget(text, "--memory-budget");
    for (int64_t total : {int64_t{1}, int64_t{1} << 30, accumplan::kMaxBytes}) {
      const int64_t bytes = b.resolve_bytes(total);
      if (bytes < 0 || bytes > accumplan::kMaxBytes) std::abort();
      (void)accumplan::format_bytes(bytes);
    }
    (void)b.to_string();
  });
  accumplan::fuzz::expect_refusal_or_success([&] {
    const int64_t bytes = accumplan::parse_size_bytes(text, "--memory-budget");
    if (bytes < 1 || bytes > accumplan::kMaxBytes) std::abort();
  });
  return 0;
}
