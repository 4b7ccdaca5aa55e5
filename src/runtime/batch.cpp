// runtime/batch.cpp — synthetic batches from specs, batch files from Python, slicing and tiling.
// See batch.h. What it is not: a data pipeline; the profiler only needs tensors of the right
// shapes and dtypes on the device, and the executor needs exact sample slices.
#include "runtime/batch.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ATen.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "accumplan/checked.h"
#include "accumplan/errors.h"
#include "accumplan/json_io.h"

namespace accumplan {
namespace {

std::string shape_text(at::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? "," : "") + std::to_string(sizes[i]);
  return s + "]";
}

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kShort: return "int16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    default: return c10::toString(t);
  }
}

at::Tensor synthetic_tensor(const TensorSpec& spec, int64_t samples, at::Generator& gen) {
  const std::vector<int64_t> shape = spec.shape(samples);
  const at::ScalarType type = scalar_type_of(spec.dtype);
  if (type == at::kBool) return at::randint(2, shape, gen, at::TensorOptions(at::kLong)).to(at::kBool);
  if (spec.is_integer()) {
    const int64_t high = spec.high.value_or(2);
    return at::randint(high, shape, gen, at::TensorOptions(at::kLong)).to(type);
  }
  at::Tensor t = at::randn(shape, gen, at::TensorOptions(at::kFloat));
  return type == at::kFloat ? t : t.to(type);
}

void check_tensor(const at::Tensor& t, const TensorSpec& spec, const std::string& what) {
  if (t.scalar_type() != scalar_type_of(spec.dtype)) {
    throw InputError(what + ": expected " + spec.dtype + ", found " + dtype_name(t.scalar_type()));
  }
  const std::vector<int64_t> want = spec.shape(t.dim() > 0 ? t.size(0) : 1);
  if (t.dim() == 0 || static_cast<size_t>(t.dim()) != want.size() ||
      !std::equal(want.begin() + 1, want.end(), t.sizes().begin() + 1)) {
    throw InputError(what + ": expected shape " + spec.to_string() + " (dim 0 = samples), found " +
                     shape_text(t.sizes()));
  }
}

// A pickled tensor's sizes, strides and offset are the file's claims, not facts: a file whose
// tensor says [2^40, 64] over 40 bytes of storage used to crash (SIGSEGV) on the first read, and
// one saying [32, 64] over 40 bytes read past its storage. The furthest element it addresses must
// lie inside its storage; computed in checked int64 (the claimed extents may overflow it).
void check_storage(const at::Tensor& t, const std::string& what) {
  const std::string why = what + " (shape " + shape_text(t.sizes()) + ")";
  int64_t last = t.storage_offset();  // the furthest element, in elements
  bool empty = false;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t size = t.size(d), stride = t.stride(d);
    if (size < 0 || stride < 0) throw InputError(why + ": negative size or stride; the file is damaged");
    if (size == 0) empty = true;
    if (size > 0) last = checked_add(last, checked_mul(size - 1, stride, why), why);
  }
  if (empty) return;
  const int64_t item = static_cast<int64_t>(t.element_size());
  const int64_t need = checked_mul(checked_add(last, 1, why), item, why);
  const int64_t have = static_cast<int64_t>(t.storage().nbytes());
  if (need > have) {
    throw InputError(why + " claims " + std::to_string(need) + " bytes but its storage holds " + std::to_string(have) +
                     "; the file is damaged or was not written by torch.save");
  }
}

}  // namespace

at::ScalarType scalar_type_of(const std::string& dtype) {
  if (dtype == "float32") return at::kFloat;
  if (dtype == "float64") return at::kDouble;
  if (dtype == "float16") return at::kHalf;
  if (dtype == "bfloat16") return at::kBFloat16;
  if (dtype == "int64") return at::kLong;
  if (dtype == "int32") return at::kInt;
  if (dtype == "int16") return at::kShort;
  if (dtype == "int8") return at::kChar;
  if (dtype == "uint8") return at::kByte;
  if (dtype == "bool") return at::kBool;
  throw InternalError("scalar_type_of: unknown dtype '" + dtype + "'");
}

int64_t Batch::size() const {
  if (!inputs.empty()) return inputs.front().size(0);
  return target.defined() ? target.size(0) : 0;
}

Batch Batch::slice(int64_t start, int64_t count) const {
  Batch out;
  for (const auto& t : inputs) out.inputs.push_back(t.narrow(0, start, count));
  if (target.defined()) out.target = target.narrow(0, start, count);
  return out;
}

Batch Batch::to(const at::Device& device) const {
  Batch out;
  for (const auto& t : inputs) out.inputs.push_back(t.to(device));
  if (target.defined()) out.target = target.to(device);
  return out;
}

Batch synthetic_batch(const std::vector<TensorSpec>& inputs, const std::optional<TensorSpec>& target,
                      int64_t samples, uint64_t seed, const at::Device& device) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  Batch b;
  for (const auto& spec : inputs) b.inputs.push_back(synthetic_tensor(spec, samples, gen));
  if (target) b.target = synthetic_tensor(*target, samples, gen);
  return device.is_cpu() ? b : b.to(device);
}

Batch load_batch_file(const std::string& path, bool has_target, const std::string& option) {
  const std::string file = option + " '" + cut_for_message(path) + "'";  // how every message names the file
  require_regular_file(path, option, "a file written by torch.save([inputs..., target], f)");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError("cannot open " + file);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue value;
  try {
    value = torch::jit::pickle_load(bytes);
  } catch (const std::exception& e) {
    std::string msg = e.what();
    msg = msg.substr(0, msg.find('\n'));
    throw InputError(file + " is not a file written by torch.save([inputs..., target], f) (" +
                     msg + "). Save with torch.save in its default (zip) format");
  }
  std::vector<c10::IValue> items;
  if (value.isList()) {
    for (const auto& v : value.toListRef()) items.push_back(v);
  } else if (value.isTuple()) {
    for (const auto& v : value.toTupleRef().elements()) items.push_back(v);
  } else if (value.isTensor()) {
    items.push_back(value);
  } else {
    throw InputError(file + " holds a " + value.tagKind() +
                     "; expected a list of tensors [inputs..., target]");
  }
  const size_t need = has_target ? 2 : 1;
  if (items.size() < need) {
    throw InputError(file + " holds " + std::to_string(items.size()) +
                     " tensor(s); expected [inputs..., target] with at least " + std::to_string(need));
  }
  std::vector<at::Tensor> tensors;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].isTensor()) {
      throw InputError(file + ": element " + std::to_string(i) + " is a " +
                       items[i].tagKind() + ", not a tensor");
    }
    at::Tensor t = items[i].toTensor();
    check_storage(t, file + ": element " + std::to_string(i));
    if (t.dim() == 0) {
      throw InputError(file + ": element " + std::to_string(i) +
                       " is a scalar; every tensor needs dim 0 = samples");
    }
    if (!tensors.empty() && t.size(0) != tensors.front().size(0)) {
      throw InputError(file + ": element " + std::to_string(i) + " has " +
                       std::to_string(t.size(0)) + " samples but element 0 has " +
                       std::to_string(tensors.front().size(0)) + "; dim 0 must be the samples of every tensor");
    }
    tensors.push_back(t.contiguous());
  }
  Batch b;
  if (has_target) {
    b.target = tensors.back();
    tensors.pop_back();
  }
  b.inputs = std::move(tensors);
  if (b.size() < 1) throw InputError(file + " has no samples");
  return b;
}

Batch tile_batch(const Batch& batch, int64_t samples) {
  const int64_t n = batch.size();
  if (n < 1 || samples < 1) throw InternalError("tile_batch needs a non-empty batch and samples >= 1");
  if (samples <= n) return batch.slice(0, samples);
  const at::Device device = batch.inputs.empty() ? batch.target.device() : batch.inputs.front().device();
  const at::Tensor index = at::arange(samples, at::TensorOptions(at::kLong).device(device)).remainder(n);
  Batch out;
  for (const auto& t : batch.inputs) out.inputs.push_back(t.index_select(0, index));
  if (batch.target.defined()) out.target = batch.target.index_select(0, index);
  return out;
}

void check_batch_matches(const Batch& batch, const std::vector<TensorSpec>& inputs,
                         const std::optional<TensorSpec>& target, const std::string& what) {
  if (batch.inputs.size() != inputs.size()) {
    throw InputError(what + " has " + std::to_string(batch.inputs.size()) + " input tensor(s); the model takes " +
                     std::to_string(inputs.size()));
  }
  for (size_t i = 0; i < inputs.size(); ++i) check_tensor(batch.inputs[i], inputs[i], what + " input " + std::to_string(i));
  if (target.has_value() != batch.target.defined()) {
    throw InputError(what + (target ? " has no target tensor" : " has a target the loss does not take"));
  }
  if (target) check_tensor(batch.target, *target, what + " target");
}

std::string spec_text_of(const at::Tensor& samples) {
  std::string s = dtype_name(samples.scalar_type()) + "[B";
  for (int64_t i = 1; i < samples.dim(); ++i) s += "," + std::to_string(samples.size(i));
  s += "]";
  const bool integer = at::isIntegralType(samples.scalar_type(), /*includeBool=*/false);
  if (integer) {
    const int64_t high = samples.numel() > 0 ? samples.max().item<int64_t>() + 1 : 1;
    s += ":" + std::to_string(std::max<int64_t>(1, high));
  }
  return s;
}

}  // namespace accumplan
