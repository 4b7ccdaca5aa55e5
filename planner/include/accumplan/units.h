// accumplan/units.h — parsing and printing of byte sizes and memory budgets.
//
// What it is: `512MiB`, `12GiB`, `1.5GB`, `2048` (bytes) and `90%` (of the device's total) turned
// into exact integers, and bytes printed back for humans. Binary units (KiB, MiB, GiB, TiB) are
// powers of 1024, decimal units (kB, MB, GB, TB) powers of 1000, as in IEC 80000-13.
// What it is not: locale-aware. There is no space between number and unit (`12 GiB` is refused,
// because a shell would split it into two arguments anyway).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace accumplan {

// A memory budget as the user gave it: an absolute size or a fraction of the device's memory.
struct BudgetSpec {
  std::optional<int64_t> bytes;    // set for `512MiB`, `2048`
  std::optional<double> fraction;  // set for `90%` (0.9); resolved against the device total

  bool is_set() const { return bytes.has_value() || fraction.has_value(); }
  // Resolve against the device's total bytes; throws InputError if it is a fraction and the
  // device total is unknown (<= 0).
  int64_t resolve_bytes(int64_t device_total_bytes) const;
  std::string to_string() const;
};

// Parses `512MiB`, `1.5GB`, `2048` into [1, 1 PiB] bytes. Throws InputError naming `what` (e.g.
// "--memory-budget"), the text (cut to 80 characters) and listing the accepted forms on anything
// else: negative, zero, more than 1 PiB, empty, spaces, unknown units.
int64_t parse_size_bytes(const std::string& text, const std::string& what);

// Parses a size or a percentage `1%`..`100%`.
BudgetSpec parse_budget(const std::string& text, const std::string& what);

// The fraction of a device's memory a caching allocator is capped at so that it holds
// `budget_bytes`: the one rule of every enforced device budget (the C++ CUDA probe's and
// accumplan.plan's). InputError for a budget that is not positive or exceeds the device's
// `total_bytes` (named `device`): a budget is never clamped silently.
double device_memory_fraction(int64_t budget_bytes, int64_t total_bytes, const std::string& device);

// 536870912 -> "512.0 MiB"; values under 1 KiB print as "123 B".
std::string format_bytes(int64_t bytes);

// 0.0123 -> "12.3 ms", 2.5 -> "2.50 s".
std::string format_seconds(double seconds);

// Microbatch sizes for messages: {52,51,51} -> "52,51,51". With max_items > 0, longer lists are
// cut after that many entries and end with ",… (N in all)" so a log line stays one line.
std::string join_sizes(const std::vector<int64_t>& sizes, size_t max_items = 0);

}  // namespace accumplan
