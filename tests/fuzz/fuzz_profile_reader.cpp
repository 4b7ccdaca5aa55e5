// fuzz_profile_reader — bytes as a profile.json: the JSON front end (1e400, depth, syntax) and
// profile_from_json (header, ranges, types). A profile read is written back and read again: the
// round trip must succeed and give the same document.
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
    const nlohmann::json doc = accumplan::parse_json_text(text, "fuzz profile");
    const accumplan::Profile p = accumplan::profile_from_json(doc);
    const auto once = accumplan::to_json(p);
    const auto twice = accumplan::to_json(accumplan::profile_from_json(nlohmann::json::parse(once.dump())));
    if (once != twice) std::abort();
    (void)p.persistent.total();
  });
  return 0;
}
