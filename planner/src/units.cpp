// units.cpp — size/budget parsing and formatting. See units.h. Sizes are bounded to 1 PiB
// (kMaxBytes, checked.h), so no parsed size can overflow a sum or a double-to-integer cast.
#include "accumplan/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <algorithm>

#include "accumplan/checked.h"
#include "accumplan/errors.h"

namespace accumplan {
namespace {

const char* kAcceptedForms =
    "accepted forms: 2048 (bytes), 512KiB, 512MiB, 12GiB, 1TiB, 1.5kB, 1.5MB, 1.5GB, 1TB";

struct Unit {
  const char* name;
  double factor;
};

// Case-insensitive so that `512mib` and `12gb` work; `b` alone is bytes.
const Unit kUnits[] = {
    {"", 1.0},
    {"b", 1.0},
    {"kib", 1024.0},
    {"mib", 1024.0 * 1024},
    {"gib", 1024.0 * 1024 * 1024},
    {"tib", 1024.0 * 1024 * 1024 * 1024},
    {"kb", 1e3},
    {"mb", 1e6},
    {"gb", 1e9},
    {"tb", 1e12},
};

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Splits "1.5GB" into a non-negative decimal number and a unit suffix; false if the text is not
// digits[.digits] followed by letters only.
bool split_number(const std::string& text, double* number, std::string* suffix) {
  size_t i = 0;
  bool digits = false;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    ++i;
    digits = true;
  }
  if (i < text.size() && text[i] == '.') {
    ++i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      ++i;
      digits = true;
    }
  }
  if (!digits) return false;
  *number = std::strtod(text.substr(0, i).c_str(), nullptr);
  *suffix = text.substr(i);
  for (char c : *suffix) {
    if (!std::isalpha(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace

int64_t parse_size_bytes(const std::string& text, const std::string& what) {
  auto fail = [&](const std::string& why) -> int64_t {
    throw InputError(what + ": '" + cut_for_message(text) + "' is not a size (" + why + "); " + kAcceptedForms);
  };
  if (text.empty()) return fail("empty");
  if (text[0] == '-') return fail("it is negative");
  double number = 0;
  std::string suffix;
  if (!split_number(text, &number, &suffix)) {
    if (text.find(' ') != std::string::npos) return fail("no spaces between number and unit");
    return fail("expected a number followed by a unit");
  }
  const std::string unit = lower(suffix);
  for (const auto& u : kUnits) {
    if (unit == u.name) {
      const double bytes = std::floor(number * u.factor);
      if (bytes < 1) return fail("it must be at least 1 byte");
      if (!(bytes <= static_cast<double>(kMaxBytes))) {
        return fail("it is more than 1 PiB (" + std::to_string(kMaxBytes) + " bytes), more than any device has");
      }
      return checked_to_int64(bytes, what, 1, kMaxBytes);
    }
  }
  return fail("unknown unit '" + cut_for_message(suffix) + "'");
}

BudgetSpec parse_budget(const std::string& text, const std::string& what) {
  BudgetSpec spec;
  if (!text.empty() && text.back() == '%') {
    const std::string body = text.substr(0, text.size() - 1);
    double number = 0;
    std::string suffix;
    if (!split_number(body, &number, &suffix) || !suffix.empty()) {
      throw InputError(what + ": '" + cut_for_message(text) + "' is not a percentage; write e.g. 90%");
    }
    if (number <= 0 || number > 100) {
      throw InputError(what + ": '" + cut_for_message(text) + "' must be a percentage in (0%, 100%]");
    }
    spec.fraction = number / 100.0;
    return spec;
  }
  spec.bytes = parse_size_bytes(text, what);
  return spec;
}

double device_memory_fraction(int64_t budget_bytes, int64_t total_bytes, const std::string& device) {
  if (budget_bytes <= 0) {
    throw InputError("a memory budget must be positive, got " + std::to_string(budget_bytes) + " bytes");
  }
  if (budget_bytes > total_bytes) {
    throw InputError("the memory budget " + format_bytes(budget_bytes) + " exceeds " + device + "'s " +
                     format_bytes(total_bytes));
  }
  // setMemoryFraction caps reserved bytes at fraction × total (the allocator takes the total from
  // the same cudaMemGetInfo), so budget / total reproduces the budget to within a byte.
  return static_cast<double>(budget_bytes) / static_cast<double>(total_bytes);
}

int64_t BudgetSpec::resolve_bytes(int64_t device_total_bytes) const {
  if (bytes) return *bytes;
  if (fraction) {
    if (device_total_bytes <= 0) {
      throw InputError("memory budget " + to_string() +
                       " is a percentage, but the device's total memory is unknown; give an "
                       "absolute size such as 12GiB");
    }
    return checked_to_int64(std::floor(*fraction * static_cast<double>(device_total_bytes)), "memory budget " + to_string());
  }
  throw InternalError("BudgetSpec::resolve_bytes called on an unset budget");
}

std::string BudgetSpec::to_string() const {
  if (bytes) return format_bytes(*bytes);
  if (fraction) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g%%", *fraction * 100.0);
    return buf;
  }
  return "(none)";
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  const bool negative = bytes < 0;
  double v = std::fabs(static_cast<double>(bytes));
  if (v < 1024) return std::to_string(bytes) + " B";
  int u = -1;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%s%.1f %s", negative ? "-" : "", v, units[u]);
  return buf;
}

std::string format_seconds(double seconds) {
  char buf[48];
  if (seconds < 1e-3) {
    std::snprintf(buf, sizeof buf, "%.1f us", seconds * 1e6);
  } else if (seconds < 1.0) {
    std::snprintf(buf, sizeof buf, "%.1f ms", seconds * 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f s", seconds);
  }
  return buf;
}

std::string join_sizes(const std::vector<int64_t>& sizes, size_t max_items) {
  std::string s;
  const size_t n = max_items > 0 ? std::min(max_items, sizes.size()) : sizes.size();
  for (size_t i = 0; i < n; ++i) s += (i ? "," : "") + std::to_string(sizes[i]);
  if (n < sizes.size()) s += ",… (" + std::to_string(sizes.size()) + " in all)";
  return s;
}

}  // namespace accumplan
