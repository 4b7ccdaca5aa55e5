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

TEST_CASE("TensorSpec: T is the sequence dimension of variable-length data, right after B", "[spec][token]") {
  const TensorSpec s = parse_tensor_spec("int64[B,T]:50257", "--input");
  CHECK(s.has_seq_dim());
  CHECK(s.dims == std::vector<int64_t>{TensorSpec::kBatchDim, TensorSpec::kSeqDim});
  CHECK(s.to_string() == "int64[B,T]:50257");
  CHECK(s.shape(4, 128) == std::vector<int64_t>{4, 128});
  CHECK(s.elements_per_sample(128) == 128);
  const TensorSpec f = parse_tensor_spec("float32[B,T,768]", "--input");
  CHECK(f.shape(2, 10) == std::vector<int64_t>{2, 10, 768});
  CHECK(f.elements_per_sample(10) == 7680);
  CHECK_FALSE(parse_tensor_spec("int64[B,128]:7", "--input").has_seq_dim());
  CHECK_THROWS_WITH(parse_tensor_spec("int64[T,B]:7", "--input"), Catch::Contains("T must follow B at the front"));
  CHECK_THROWS_WITH(parse_tensor_spec("int64[B,4,T]:7", "--input"), Catch::Contains("T must follow B at the front"));
  CHECK_THROWS_WITH(parse_tensor_spec("int64[B,T,T]:7", "--input"), Catch::Contains("T must follow B at the front"));
  CHECK_THROWS_WITH(parse_tensor_spec("int64[B,X]:7", "--input"), Catch::Contains("neither B, T nor a positive integer"));
}

TEST_CASE("SeqLen: a range or one length, refused with the forms", "[spec][token]") {
  const SeqLenRange r = parse_seq_len("16..1024");
  CHECK(r.min == 16);
  CHECK(r.max == 1024);
  CHECK(r.text() == "16..1024");
  CHECK(parse_seq_len(" 512 ").min == 512);
  CHECK(parse_seq_len("512").text() == "512");
  CHECK_THROWS_WITH(parse_seq_len("1024..16"), Catch::Contains("--seq-len '1024..16': the shortest length 1024 is above the longest 16"));
  CHECK_THROWS_WITH(parse_seq_len("0..16"), Catch::Contains("at least 1 token"));
  CHECK_THROWS_WITH(parse_seq_len("abc"), Catch::Contains("is not a whole number of tokens") &&
                                             Catch::Contains("expected a length range like 16..1024"));
  CHECK_THROWS_WITH(parse_seq_len("1..99999999999"), Catch::Contains("out of range [1, 2147483647]"));
  CHECK_THROWS_AS(parse_seq_len(""), InputError);
  CHECK_THROWS_AS(parse_seq_len(".."), InputError);
}
