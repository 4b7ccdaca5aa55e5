// test_helpers.h — small fixtures shared by the planner tests: synthetic profiles whose memory is
// an exact line, so the expected microbatch can be computed by hand.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "accumplan/errors.h"
#include "accumplan/schema.h"

namespace accumplan::test {

inline constexpr int64_t MiB = int64_t{1} << 20;  // bytes

// peak(b) = persistent + fixed + per_sample * b exactly, probed at 1, 2, 4, 8.
inline Profile linear_profile(int64_t weights_bytes, int64_t fixed_bytes, int64_t per_sample_bytes,
                              int64_t device_total_bytes = int64_t{1} << 34) {
  Profile p;
  p.device = {"cpu", 0, "test device", device_total_bytes};
  p.model = {"model.pt", std::string(64, 'a'), weights_bytes / 4, {}};
  p.setup.inputs = {"float32[B,16]"};
  p.setup.target = "int64[B]:10";
  p.libtorch_version = "test";
  p.persistent = {weights_bytes, weights_bytes, 0};
  for (int64_t b : {1, 2, 4, 8}) {
    ProfilePoint pt;
    pt.micro_batch = b;
    pt.peak_bytes = p.persistent.total() + fixed_bytes + per_sample_bytes * b;
    p.points.push_back(pt);
  }
  return p;
}

// What the plan reader says of `doc`: its SchemaError's message, "" when it reads the plan.
inline std::string plan_schema_error(const nlohmann::json& doc) {
  try {
    plan_from_json(doc);
  } catch (const SchemaError& e) {
    return e.what();
  }
  return "";
}

inline std::string source_path(const std::string& rel) { return std::string(ACCUMPLAN_SOURCE_DIR) + "/" + rel; }

// An empty scratch directory `area`/`name`, 160+ characters deep (ACCUMPLAN_SCRATCH_DIR, tests/CMakeLists.txt).
inline std::string fresh_dir(const std::string& area, const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(ACCUMPLAN_SCRATCH_DIR) / area / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace accumplan::test
