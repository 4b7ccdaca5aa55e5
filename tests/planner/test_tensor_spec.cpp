// Input and target specs: `float32[B,3,224,224]`, `int64[B,128]:50257`.
#include <catch2/catch.hpp>

#include "accumplan/errors.h"
#include "accumplan/tensor_spec.h"

using namespace accumplan;

TEST_CASE("TensorSpec: float and integer specs parse into dims and range", "[spec]") {
  const TensorSpec img = parse_tensor_spec("float32[B,3,224,224]", "--input");
  CHECK(img.dtype == "float32");
  CHECK(img.dims == std::vector<int64_t>{TensorSpec::kBatchDim, 3, 224, 224});
  CHECK_FALSE(img.high);
  CHECK(img.shape(8) == std::vector<int64_t>{8, 3, 224, 224});
  CHECK(img.elements_per_sample() == 3 * 224 * 224);
  CHECK(img.batch_axis() == 0);

  const TensorSpec tok = parse_tensor_spec("int64[B,128]:50257", "--input");
  CHECK(tok.is_integer());
  CHECK(*tok.high == 50257);
  CHECK(tok.to_string() == "int64[B,128]:50257");

  const TensorSpec t = parse_tensor_spec("int64[B]:1000", "--target");
  CHECK(t.shape(4) == std::vector<int64_t>{4});
}

TEST_CASE("TensorSpec: malformed specs are refused naming the flag and the problem", "[spec][errors]") {
  struct Case {
    const char* text;
    const char* needle;
  };
  const Case cases[] = {
      {"float32[B,3", "closing ']'"},
      {"float33[B]", "unknown dtype 'float33'"},
      {"int64[B]:0", "positive count"},
      {"int64[B]", "need a range"},
      {"float32[3,4]", "exactly once"},
      {"float32[B,B]", "exactly once"},
      {"float32[B,-3]", "'-3'"},
      {"float32[B]:10", "integer dtypes only"},
      {"float32", "missing '['"},
  };
  for (const auto& c : cases) {
    INFO(c.text);
    try {
      parse_tensor_spec(c.text, "--input");
      FAIL("accepted " << c.text);
    } catch (const InputError& e) {
      const std::string msg = e.what();
      CHECK(msg.find("--input") != std::string::npos);
      CHECK(msg.find(c.needle) != std::string::npos);
    }
  }
}
