// fuzz_tensor_spec — bytes as an --input/--target spec: a spec parsed prints canonically, parses
// back to the same spec, and its elements per sample are formed without overflow.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "accumplan/tensor_spec.h"
#include "fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  accumplan::fuzz::expect_refusal_or_success([&] {
    const accumplan::TensorSpec s = accumplan::parse_tensor_spec(text, "--input");
    const accumplan::TensorSpec again = accumplan::parse_tensor_spec(s.to_string(), "--input");
    if (again.dims != s.dims || again.dtype != s.dtype || again.high != s.high) std::abort();
    if (s.elements_per_sample() < 1) std::abort();
    (void)s.shape(int64_t{1} << 20);
  });
  return 0;
}
