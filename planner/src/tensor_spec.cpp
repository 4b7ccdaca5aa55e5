// tensor_spec.cpp — parsing of `dtype[dims]:high` specs. See tensor_spec.h. Every dimension is in
// [1, 2^31 - 1], a sample has at most 2^36 elements and 16 dimensions, and `:N` fits the dtype, so
// the counts formed from a spec cannot overflow.
#include "accumplan/tensor_spec.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <sstream>
#include <string>

#include "accumplan/checked.h"
#include "accumplan/errors.h"

namespace accumplan {
namespace {

const char* kFloatTypes[] = {"float32", "float64", "float16", "bfloat16"};
const char* kIntTypes[] = {"int64", "int32", "int16", "int8", "uint8", "bool"};

bool is_one_of(const std::string& s, const char* const* list, size_t n) {
  return std::any_of(list, list + n, [&](const char* x) { return s == x; });
}

bool all_digits(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
}

// Bounds of a spec: a dimension, the elements of one sample, the number of dimensions.
constexpr int64_t kMaxDim = (int64_t{1} << 31) - 1;
constexpr int64_t kMaxElementsPerSample = int64_t{1} << 36;
constexpr size_t kMaxRank = 16;

// How many non-negative values an integer dtype holds: the largest `:N` it can take.
int64_t values_of(const std::string& dtype) {
  if (dtype == "bool") return 2;
  if (dtype == "int8") return 128;
  if (dtype == "uint8") return 256;
  if (dtype == "int16") return 32768;
  if (dtype == "int32") return int64_t{1} << 31;
  return std::numeric_limits<int64_t>::max();  // int64
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(' ');
  size_t e = s.find_last_not_of(' ');
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

}  // namespace

bool TensorSpec::is_integer() const { return is_one_of(dtype, kIntTypes, std::size(kIntTypes)); }

size_t TensorSpec::batch_axis() const {
  return static_cast<size_t>(std::find(dims.begin(), dims.end(), kBatchDim) - dims.begin());
}

bool TensorSpec::has_seq_dim() const { return std::find(dims.begin(), dims.end(), kSeqDim) != dims.end(); }

std::vector<int64_t> TensorSpec::shape(int64_t micro_batch, int64_t seq_len) const {
  std::vector<int64_t> out = dims;
  for (auto& d : out) {
    if (d == kBatchDim) d = micro_batch;
    if (d == kSeqDim) d = seq_len;
  }
  return out;
}

int64_t TensorSpec::elements_per_sample(int64_t seq_len) const {
  int64_t n = 1;
  for (auto d : dims) {
    if (d != kBatchDim) n = checked_mul(n, d == kSeqDim ? seq_len : d, "elements per sample of " + text);
  }
  return n;
}

std::string TensorSpec::to_string() const {
  std::string s = dtype + "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ",";
    s += dims[i] == kBatchDim ? "B" : dims[i] == kSeqDim ? "T" : std::to_string(dims[i]);
  }
  s += "]";
  if (high) s += ":" + std::to_string(*high);
  return s;
}

TensorSpec parse_tensor_spec(const std::string& text, const std::string& what) {
  auto fail = [&](const std::string& why) -> TensorSpec {
    throw InputError(what + " '" + cut_for_message(text) + "': " + why +
                     "; expected e.g. float32[B,3,224,224], int64[B,128]:50257 or float32[B,10]");
  };
  const size_t open = text.find('[');
  const size_t close = text.find(']');
  if (open == std::string::npos) return fail("missing '[' after the dtype");
  if (close == std::string::npos || close < open) return fail("missing closing ']'");

  TensorSpec spec;
  spec.dtype = trim(text.substr(0, open));
  if (!is_one_of(spec.dtype, kFloatTypes, std::size(kFloatTypes)) && !spec.is_integer()) {
    return fail("unknown dtype '" + cut_for_message(spec.dtype) +
                "' (known: float32 float64 float16 bfloat16 int64 int32 int16 int8 uint8 bool)");
  }

  const std::string inner = text.substr(open + 1, close - open - 1);
  size_t start = 0;
  int batch_dims = 0;
  while (true) {
    const size_t comma = inner.find(',', start);
    const std::string tok = trim(inner.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (tok == "B") {
      spec.dims.push_back(TensorSpec::kBatchDim);
      ++batch_dims;
    } else if (tok == "T") {
      if (spec.dims.size() != 1 || spec.dims.front() != TensorSpec::kBatchDim) {
        return fail("the sequence dimension T must follow B at the front, as in int64[B,T]:50257");
      }
      spec.dims.push_back(TensorSpec::kSeqDim);
    } else if (all_digits(tok) && tok.find_first_not_of('0') != std::string::npos) {
      const std::string digits = tok.substr(tok.find_first_not_of('0'));
      if (digits.size() > 10 || std::stoll(digits) > kMaxDim) {
        return fail("dimension " + cut_for_message(tok) + " is out of range [1, " + std::to_string(kMaxDim) + "]");
      }
      spec.dims.push_back(std::stoll(digits));
    } else {
      return fail("dimension '" + cut_for_message(tok) + "' is neither B, T nor a positive integer");
    }
    if (spec.dims.size() > kMaxRank) return fail("more than " + std::to_string(kMaxRank) + " dimensions");
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (batch_dims != 1) return fail("the microbatch dimension B must appear exactly once");
  // The product of the other dimensions: bounded, so shape(b) times any microbatch in range stays
  // far from overflow.
  int64_t per_sample = 1;
  for (auto d : spec.dims) {
    if (d == TensorSpec::kBatchDim) continue;
    if (d == TensorSpec::kSeqDim) continue;  // per token: the sequence's length multiplies later, checked
    if (__builtin_mul_overflow(per_sample, d, &per_sample) || per_sample > kMaxElementsPerSample) {
      return fail("one sample has more than " + std::to_string(kMaxElementsPerSample) +
                  " elements (2^36); the dimensions multiply past it");
    }
  }

  const std::string rest = text.substr(close + 1);
  if (!rest.empty()) {
    if (rest[0] != ':') return fail("unexpected '" + cut_for_message(rest) + "' after ']'");
    const std::string high = rest.substr(1);
    if (!all_digits(high) || high.size() > 18 || std::stoll(high) < 1) {
      return fail("the integer range ':" + cut_for_message(high) + "' must be a positive count of values");
    }
    if (!spec.is_integer()) return fail("':N' ranges apply to integer dtypes only");
    spec.high = std::stoll(high);
    const int64_t most = values_of(spec.dtype);
    if (*spec.high > most) {
      return fail("':" + high + "' is out of range for " + spec.dtype + ", which holds " + std::to_string(most) +
                  " values [0, " + std::to_string(most) + ")");
    }
  } else if (spec.is_integer()) {
    if (spec.dtype == "bool") {
      spec.high = 2;
    } else {
      return fail("integer inputs need a range, e.g. " + spec.dtype + "[...]:1000 for [0, 1000)");
    }
  }
  spec.text = spec.to_string();
  return spec;
}

std::string SeqLenRange::text() const {
  return min == max ? std::to_string(min) : std::to_string(min) + ".." + std::to_string(max);
}

namespace {

// One sequence length: a whole number of tokens in [1, kMaxDim]; `fail` throws with the reason.
template <class Fail>
int64_t parse_length(const std::string& part, Fail fail) {
  const std::string t = trim(part);
  if (!all_digits(t)) fail("'" + cut_for_message(t) + "' is not a whole number of tokens");
  const size_t nz = t.find_first_not_of('0');
  if (nz == std::string::npos) fail("a sequence has at least 1 token");
  if (t.size() - nz > 10 || std::stoll(t.substr(nz)) > kMaxDim) {
    fail("'" + cut_for_message(t) + "' is out of range [1, " + std::to_string(kMaxDim) + "]");
  }
  return std::stoll(t.substr(nz));
}

}  // namespace

SeqLenRange parse_seq_len(const std::string& text, const std::string& what) {
  auto fail = [&](const std::string& why) -> SeqLenRange {
    throw InputError(what + " '" + cut_for_message(text) + "': " + why +
                     "; expected a length range like 16..1024, or one length like 512");
  };
  auto number = [&](const std::string& part) { return parse_length(part, fail); };
  SeqLenRange r;
  const size_t dots = text.find("..");
  if (dots == std::string::npos) {
    r.min = r.max = number(text);
  } else {
    r.min = number(text.substr(0, dots));
    r.max = number(text.substr(dots + 2));
    if (r.min > r.max) fail("the shortest length " + std::to_string(r.min) + " is above the longest " + std::to_string(r.max));
  }
  return r;
}

std::vector<int64_t> parse_seq_len_list(const std::string& text, const std::string& what) {
  std::vector<int64_t> lengths;
  std::istringstream in(text);
  std::string line;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    for (char& c : line) {
      if (c == ',' || c == '\t' || c == '\r') c = ' ';
    }
    std::istringstream words(line);
    std::string word;
    while (words >> word) {
      lengths.push_back(parse_length(word, [&](const std::string& why) -> int64_t {
        throw InputError(what + " line " + std::to_string(line_no) + ": " + why +
                         "; expected sequence lengths in tokens, one or more per line (whitespace or commas between "
                         "them, # starts a comment)");
      }));
    }
  }
  if (lengths.empty()) {
    throw InputError(what + " holds no sequence lengths; write the observed lengths in tokens, e.g. one per line");
  }
  return lengths;
}

}  // namespace accumplan
