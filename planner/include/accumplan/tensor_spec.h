// accumplan/tensor_spec.h — the torch-free description of one model input or target.
//
// What it is: `float32[B,3,224,224]`, `int64[B,128]:50257` (integers in [0, 50257)),
// `float32[B,10]` parsed into dtype, dims and an integer range. `B` marks the microbatch dimension
// and appears exactly once. `T` marks the sequence dimension of variable-length data
// (`int64[B,T]:50257`): at most once, right after B at the front, its extent given per batch. Specs travel inside profile.json and plan.json as their text, so the
// executor can rebuild synthetic inputs from a plan alone.
// What it is not: a tensor factory; src/ turns a spec into a LibTorch tensor.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "accumplan/terms.h"

namespace accumplan {

struct TensorSpec {
  static constexpr int64_t kBatchDim = -1;  // the `B` entry of `dims`
  static constexpr int64_t kSeqDim = -2;    // the `T` entry of `dims` (sequence length, per batch)

  std::string dtype;               // float32 float64 float16 bfloat16 int64 int32 int16 int8 uint8 bool
  std::vector<int64_t> dims;       // kBatchDim for B, else a positive extent
  std::optional<int64_t> high;     // integers are drawn from [0, high); required for int dtypes
  std::string text;                // the spec as written, canonical form

  bool is_integer() const;
  size_t batch_axis() const;       // index of B in dims
  bool has_seq_dim() const;        // `T` appears (then dims[0] is B and dims[1] is T)
  // Shape with B replaced by `micro_batch` and T by `seq_len`.
  std::vector<int64_t> shape(int64_t micro_batch, int64_t seq_len = 1) const;
  // Elements per sample (product of the non-B dims, T counted as `seq_len`); checked (InputError
  // on overflow).
  int64_t elements_per_sample(int64_t seq_len = 1) const;
  std::string to_string() const;   // canonical text, e.g. "int64[B,128]:50257"
};

// Throws InputError naming `what` (e.g. "--input") and the bad part of `text` (cut to 80
// characters). Bounds: every dimension in [1, 2^31 - 1], at most 2^36 elements per sample and 16
// dimensions, `:N` at most the values the dtype holds (int8 128, uint8 256, int16 32768, int32
// 2^31, bool 2).
TensorSpec parse_tensor_spec(const std::string& text, const std::string& what);

// `--seq-len`: the sequence lengths of variable-length data, "16..1024" (every length from 16 to
// 1024) or "512" (one length). Lengths in [1, 2^31 - 1]. The one parser of the value; throws
// InputError naming `what`, the value and the forms.
struct SeqLenRange {
  int64_t min = 0;
  int64_t max = 0;
  std::string text() const;  // "16..1024", or "512" when min == max
  bool operator==(const SeqLenRange& o) const { return min == o.min && max == o.max; }
  bool operator!=(const SeqLenRange& o) const { return !(*this == o); }
};
SeqLenRange parse_seq_len(const std::string& text, const std::string& what = option_name("--seq-len"));
// The one parser of --seq-len-file's contents: observed sequence lengths in tokens, whitespace or
// commas between them, '#' to the end of a line a comment. InputError naming `what` and the line
// for a value that is not a length in [1, 2^31], or for no lengths at all.
std::vector<int64_t> parse_seq_len_list(const std::string& text, const std::string& what = "--seq-len-file");

}  // namespace accumplan
