// fuzz_plan_reader — bytes as a plan.json: the JSON front end and plan_from_json (header, ranges,
// cross-field invariants, the nested or 1.0 flattened profile). A plan read is written back and
// read again. The exporters are not run here: they fit the plan's time model (memory_model.cpp).
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "accumplan/json_io.h"
#include "accumplan/schema.h"
#include "fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  accumplan::fuzz::expect_refusal_or_success([&] {
    const nlohmann::json doc = accumplan::parse_json_text(text, "fuzz plan");
    const accumplan::Plan p = accumplan::plan_from_json(doc);
    const auto once = accumplan::to_json(p);
    (void)accumplan::plan_from_json(nlohmann::json::parse(once.dump()));
    (void)p.profile.persistent.total();
  });
  return 0;
}
