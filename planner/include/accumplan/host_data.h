// accumplan/host_data.h — the limit on host data, and LibTorch's host allocator failing, in words.
// What it is: the one rule for how much host memory a data set (a batch file, synthetic data, a
// window's tiled samples in Python) may take once made or padded, checked before anything is
// allocated, and the one line for the host running out. Torch-free: the CLI (runtime/host_data.h
// counts host data beside the step's memory) and the Python package (accumplan._core) both ask it.
// What it is not: a memory probe; the budget of the training step is the probe's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include <unistd.h>

#include "accumplan/errors.h"
#include "accumplan/terms.h"
#include "accumplan/units.h"

namespace accumplan {

// The most host memory a data set may take once made or padded: 16 GiB or half of this machine's
// physical memory, whichever is less (unbounded, a billion samples of a small model fail deep in
// the allocator; a 21 MB ragged file padded to its longest sequence needs 320 GB; on a 23 GiB
// machine a 16 GiB synthetic sequence and its padded copy are killed by the kernel, exit 137), or
// ACCUMPLAN_MAX_HOST_DATA (a size: "64GiB") when set.
inline constexpr int64_t kDefaultMaxHostDataBytes = int64_t{16} << 30;
inline int64_t max_host_data_bytes() {
  const char* env = std::getenv("ACCUMPLAN_MAX_HOST_DATA");
  if (env != nullptr && *env != '\0') return parse_size_bytes(env, "ACCUMPLAN_MAX_HOST_DATA");
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return kDefaultMaxHostDataBytes;
  return std::min(kDefaultMaxHostDataBytes, static_cast<int64_t>(pages) / 2 * static_cast<int64_t>(page));
}

// InputError when `bytes` of host data (`what`, e.g. "--data 'f.pt' padded to its longest
// sequence of 90000 tokens") exceed max_host_data_bytes(); `fix` says what to do instead.
inline void check_host_data_bytes(int64_t bytes, const std::string& what, const std::string& fix) {
  const int64_t limit = max_host_data_bytes();
  if (bytes > limit) {
    throw InputError(what + " would take " + format_bytes(bytes) + " of host memory, more than the " + format_bytes(limit) +
                     " allowed for host data (ACCUMPLAN_MAX_HOST_DATA raises it); " + fix);
  }
}

// Who raises an out-of-memory of the CPU budget: the counting probe, in LibTorch's allocator's
// words followed by "(accumplan cpu-counting probe: ...)".
inline constexpr const char* kCountingProbeName = "accumplan cpu-counting probe";

// LibTorch's CPU allocator failing ("DefaultCPUAllocator: can't allocate memory: you tried to
// allocate 2148007936 bytes"): the bytes it asked for (0 when its message gives none); nullopt for
// any other error. Not an out-of-memory of the budget (the counting probe raises those, naming
// itself, and they are re-planned): the machine's memory or a ulimit ran out, which no smaller
// microbatch fixes.
inline std::optional<int64_t> failed_host_allocation_bytes(const std::string& what) {
  if (what.find("DefaultCPUAllocator: can't allocate memory") == std::string::npos) return std::nullopt;
  if (what.find(kCountingProbeName) != std::string::npos) return std::nullopt;
  const std::string key = "you tried to allocate ";
  const size_t at = what.find(key);
  int64_t bytes = 0;
  for (size_t i = at == std::string::npos ? what.size() : at + key.size(); i < what.size() && bytes < (int64_t{1} << 56); ++i) {
    if (what[i] < '0' || what[i] > '9') break;
    bytes = bytes * 10 + (what[i] - '0');
  }
  return bytes;
}

// The one line for it: exit 2, what was being done, and the size asked for.
inline InputError host_out_of_memory(int64_t bytes, const std::string& during) {
  return InputError("the host ran out of memory" + (during.empty() ? std::string() : " " + during) + (bytes > 0 ? ": LibTorch could not allocate " + format_bytes(bytes) + " more" : std::string()) +
                    " (the machine's free memory or a ulimit); give smaller data, shapes, " + option_name("--seq-len") +
                    " or " + option_name("--target-batch") +
                    ", or lower ACCUMPLAN_MAX_HOST_DATA below what this machine can hold");
}

}  // namespace accumplan
