// fuzz_make_plan — a profile that the reader accepts, planned for fuzzed requests: the solver and
// memory model must answer (a plan or an InputError) without a crash, a sanitizer report or a
// hang. Input: 16 bytes of request (target batch, budget, flags), then profile.json.
//
// Run by scripts/test.sh like the other targets; its corpus (tests/fuzz/corpus/make_plan/) keeps
// the solver's hostile cases (the tiny slope, 2^40 samples, casts out of int64) as regressions.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include "accumplan/checked.h"
#include "accumplan/json_io.h"
#include "accumplan/schema.h"
#include "accumplan/solver.h"
#include "fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 16) return 0;
  uint64_t target = 0, budget = 0;
  std::memcpy(&target, data, 8);
  std::memcpy(&budget, data + 8, 8);
  const std::string text(reinterpret_cast<const char*>(data + 16), size - 16);
  accumplan::Profile profile;
  try {
    profile = accumplan::profile_from_json(accumplan::parse_json_text(text, "fuzz profile"));
  } catch (const accumplan::InputError&) {
    return 0;  // the readers have their own targets
  }
  accumplan::PlanRequest r;
  // Within the documented ranges: 1..2^40 samples, 1 byte..1 PiB; the low bits pick the rest.
  r.target_batch = static_cast<int64_t>(target % static_cast<uint64_t>(accumplan::kMaxSamples)) + 1;
  r.budget.bytes = static_cast<int64_t>(budget % static_cast<uint64_t>(accumplan::kMaxBytes)) + 1;
  r.world_size = (target >> 60) == 0 ? 1 : static_cast<int64_t>(1 + (target >> 62));
  if (r.target_batch % r.world_size != 0) r.world_size = 1;
  r.split = (budget >> 63) ? "uniform" : "balanced";
  r.use_timing = (budget >> 62) & 1;
  accumplan::fuzz::expect_refusal_or_success([&] { (void)accumplan::make_plan(profile, r); });
  return 0;
}
