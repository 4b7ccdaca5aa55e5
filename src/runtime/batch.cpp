// runtime/batch.cpp — synthetic batches from specs, batch files from Python, slicing and tiling.
// See batch.h. What it is not: a data pipeline; the profiler only needs tensors of the right
// shapes and dtypes on the device, and the executor needs exact sample slices.
#include "runtime/batch.h"
#include "runtime/host_data.h"
#include "runtime/loss.h"
#include "runtime/torch_save_reader.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ATen.h>

#include <filesystem>
#include <iomanip>
#include <sstream>

#include "accumplan/checked.h"
#include "accumplan/errors.h"
#include "accumplan/json_io.h"
#include "accumplan/setup_rules.h"

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

// Synthetic data is made on the host (and moved to the device after): its bytes are held to the
// host-data limit before anything is allocated. 16 bytes an element: the int64 draw (or float32
// draw and its conversion) and, for ragged data, the padded copy. --input float32[B,2147483647] or
// --seq-len up to 2147483647 would otherwise end in LibTorch's allocator or the kernel's OOM killer.
void check_synthetic_bytes(const TensorSpec& spec, int64_t samples, int64_t seq_len) {
  const std::string what = "a synthetic " + spec.to_string() + " of " + std::to_string(samples) + " sample(s)" +
                           (spec.has_seq_dim() ? " of " + std::to_string(seq_len) + " tokens" : std::string());
  check_host_data_bytes(checked_mul(checked_mul(spec.elements_per_sample(seq_len), samples, what), 16, what), what,
                        "give smaller --input/--target shapes, --seq-len or --target-batch");
}

at::Tensor synthetic_tensor(const TensorSpec& spec, int64_t samples, at::Generator& gen, int64_t seq_len = 1) {
  check_synthetic_bytes(spec, samples, seq_len);
  const std::vector<int64_t> shape = spec.shape(samples, seq_len);
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
  // T (variable-length data) takes the batch's padded length; every other extent is fixed.
  const std::vector<int64_t> want = spec.shape(t.dim() > 0 ? t.size(0) : 1, t.dim() > 1 ? t.size(1) : 1);
  if (t.dim() == 0 || static_cast<size_t>(t.dim()) != want.size() ||
      !std::equal(want.begin() + 1, want.end(), t.sizes().begin() + 1)) {
    throw InputError(what + ": expected shape " + spec.to_string() + " (dim 0 = samples), found " +
                     shape_text(t.sizes()));
  }
}

// A pickled tensor's sizes, strides and offset are the file's claims, not facts: a file whose
// tensor says [2^40, 64] over 40 bytes of storage would crash (SIGSEGV) on the first read, and
// one saying [32, 64] over 40 bytes would read past its storage. The furthest element it
// addresses must lie inside its storage; computed in checked int64 (the claimed extents may
// overflow it). Also its dtype: one of those a spec can name (a QUInt8 or complex tensor would
// otherwise surface as a bad --input spec the user never gave).
void check_storage(const at::Tensor& t, const std::string& what) {
  const std::string dtype = dtype_name(t.scalar_type());
  bool known = true;
  try {
    scalar_type_of(dtype);  // the inverse of dtype_name on the dtypes a spec names
  } catch (const InternalError&) {
    known = false;
  }
  if (!known) {
    throw InputError(what + " is a " + dtype + " tensor; data files hold float32, float64, float16, bfloat16, int64, "
                     "int32, int16, int8, uint8 or bool tensors");
  }
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

// [list_of_sequences, list_of_targets | None]: see load_batch_file in batch.h.
Batch load_ragged(const std::vector<c10::IValue>& items, bool has_target, const std::string& file, int64_t ignore_index) {
  if (items.size() != 2) {
    throw InputError(file + " starts with a list, so it is read as ragged data [sequences, targets], but it holds " +
                     std::to_string(items.size()) + " elements; save [list_of_1d_token_tensors, list_of_targets_or_None]");
  }
  auto tensors_of = [&](const c10::IValue& v, const std::string& name) {
    std::vector<at::Tensor> out;
    for (const auto& e : v.toListRef()) {
      if (!e.isTensor()) {
        throw InputError(file + ": " + name + " " + std::to_string(out.size()) + " is a " + e.tagKind() + ", not a tensor");
      }
      at::Tensor t = e.toTensor();
      check_storage(t, file + ": " + name + " " + std::to_string(out.size()));
      out.push_back(t);
    }
    return out;
  };
  const std::vector<at::Tensor> sequences = tensors_of(items[0], "sequence");
  std::vector<at::Tensor> targets;
  if (items[1].isList()) {
    if (!has_target) {
      throw InputError(file + " holds per-token targets but the loss takes none (--loss model); save None as the "
                       "second element");
    }
    targets = tensors_of(items[1], "target");
  } else if (!items[1].isNone()) {
    throw InputError(file + ": the second element is a " + items[1].tagKind() +
                     "; ragged data is [list_of_1d_token_tensors, list_of_targets_or_None]");
  }
  Batch b = ragged_batch(sequences, targets, ignore_index, file);
  if (has_target && targets.empty()) b.target = next_token_targets(b, ignore_index);
  return b;
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

int64_t Batch::padded_length() const {
  if (!ragged()) return 0;
  const at::Tensor& t = inputs.empty() ? target : inputs.front();
  return t.defined() && t.dim() >= 2 ? t.size(1) : 0;
}

std::vector<int64_t> Batch::sequence_lengths() const {
  if (!ragged()) throw InternalError("sequence_lengths() of a batch that is not ragged");
  const at::Tensor l = lengths.to(at::kLong).contiguous();
  return std::vector<int64_t>(l.data_ptr<int64_t>(), l.data_ptr<int64_t>() + l.numel());
}

Batch Batch::slice(int64_t start, int64_t count) const {
  Batch out;
  for (const auto& t : inputs) out.inputs.push_back(t.narrow(0, start, count));
  if (target.defined()) out.target = target.narrow(0, start, count);
  if (lengths.defined()) out.lengths = lengths.narrow(0, start, count);
  return out;
}

namespace {

// The longest of the sequences at `indices`, read in place (a strided shard's lengths too): no
// copy of the window's lengths per microbatch.
int64_t longest_of(const at::Tensor& lengths, const std::vector<int64_t>& indices) {
  const at::Tensor l = lengths.scalar_type() == at::kLong ? lengths : lengths.to(at::kLong);
  const auto acc = l.accessor<int64_t, 1>();
  int64_t longest = 0;
  for (int64_t i : indices) {
    if (i < 0 || i >= acc.size(0)) {
      throw InternalError("gather: index " + std::to_string(i) + " outside a batch of " + std::to_string(acc.size(0)));
    }
    longest = std::max(longest, acc[i]);
  }
  return longest;
}

}  // namespace

Batch Batch::gather(const std::vector<int64_t>& indices) const {
  if (!ragged()) throw InternalError("gather() of a batch that is not ragged");
  const int64_t longest = longest_of(lengths, indices);
  // A copy, not a view, also for a contiguous run (a sample plan's microbatch): models may .view()
  // their inputs, which a narrowed view refuses; the copy is the microbatch's tokens only.
  const at::Tensor index = at::tensor(indices, at::TensorOptions(at::kLong));
  // Cut to the longest first, then pick the rows: the copy holds only this microbatch's tokens.
  // Only tensors with a sequence dimension are cut: a target of one label per sequence ([B]) is not.
  auto pick = [&](const at::Tensor& t) {
    return (t.dim() >= 2 ? t.narrow(1, 0, longest) : t).index_select(0, index.to(t.device()));
  };
  Batch out;
  for (const auto& t : inputs) out.inputs.push_back(pick(t));
  if (target.defined()) out.target = pick(target);
  out.lengths = lengths.index_select(0, index);
  return out;
}

Batch Batch::to(const at::Device& device) const {
  Batch out;
  for (const auto& t : inputs) out.inputs.push_back(t.to(device));
  if (target.defined()) out.target = target.to(device);
  out.lengths = lengths;
  return out;
}

at::Tensor padding_mask(const Batch& batch) {
  if (!batch.ragged()) throw InternalError("padding_mask() of a batch that is not ragged");
  const at::Tensor positions = at::arange(batch.padded_length(), at::TensorOptions(at::kLong));
  return positions.unsqueeze(0).ge(batch.lengths.to(at::kLong).unsqueeze(1));
}

Batch ragged_batch(const std::vector<at::Tensor>& sequences, const std::vector<at::Tensor>& targets,
                   int64_t ignore_index, const std::string& what) {
  if (sequences.empty()) throw InputError(what + " holds no sequences");
  if (!targets.empty() && targets.size() != sequences.size()) {
    throw InputError(what + " has " + std::to_string(sequences.size()) + " sequences but " +
                     std::to_string(targets.size()) + " targets; give one target tensor per sequence, or None");
  }
  std::vector<int64_t> lengths;
  lengths.reserve(sequences.size());
  int64_t longest = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const at::Tensor& s = sequences[i];
    const std::string name = what + ": sequence " + std::to_string(i);
    if (!s.defined() || s.dim() != 1 || !at::isIntegralType(s.scalar_type(), /*includeBool=*/false)) {
      throw InputError(name + " is not a 1-D integer tensor of token ids (found " +
                       (s.defined() ? dtype_name(s.scalar_type()) + shape_text(s.sizes()) : std::string("nothing")) + ")");
    }
    if (s.size(0) < 1) throw InputError(name + " is empty; every sequence needs at least one token");
    if (!targets.empty()) {
      const at::Tensor& t = targets[i];
      if (t.defined() && targets.front().defined() &&
          at::isFloatingType(t.scalar_type()) != at::isFloatingType(targets.front().scalar_type())) {
        // The padded target takes target 0's kind: a float target after integer ones was truncated.
        throw InputError(what + ": target " + std::to_string(i) + " is " + dtype_name(t.scalar_type()) + " but target 0 is " +
                         dtype_name(targets.front().scalar_type()) + "; every target needs one kind (class ids or values)");
      }
      if (!t.defined() || t.dim() != 1 || t.size(0) != s.size(0)) {
        throw InputError(what + ": target " + std::to_string(i) + " has shape " +
                         (t.defined() ? shape_text(t.sizes()) : std::string("(none)")) + " but sequence " +
                         std::to_string(i) + " has " + std::to_string(s.size(0)) +
                         " tokens; per-token targets need one entry per token");
      }
    }
    lengths.push_back(s.size(0));
    longest = std::max(longest, s.size(0));
  }
  const int64_t n = static_cast<int64_t>(sequences.size());
  // Padded to the longest, the set takes n x longest elements per tensor: the input, the target
  // (given, or the next-token one made from the input) and one temporary of that size.
  const int64_t padded = checked_mul(n, longest, what + ": sequences x the longest");
  check_host_data_bytes(checked_mul(padded, 3 * 8, what + ": padded bytes"),
                        what + " padded to its longest sequence (" + std::to_string(n) + " sequences of up to " +
                            std::to_string(longest) + " tokens)",
                        "truncate the longest sequences or split the file");
  Batch b;
  at::Tensor input = at::zeros({n, longest}, at::TensorOptions(at::kLong));
  for (int64_t i = 0; i < n; ++i) input[i].narrow(0, 0, lengths[static_cast<size_t>(i)]).copy_(sequences[static_cast<size_t>(i)]);
  b.inputs.push_back(input);
  if (!targets.empty()) {
    const at::ScalarType type = at::isFloatingType(targets.front().scalar_type()) ? targets.front().scalar_type() : at::kLong;
    at::Tensor target = at::full({n, longest}, ignore_index, at::TensorOptions(type));
    for (int64_t i = 0; i < n; ++i) target[i].narrow(0, 0, lengths[static_cast<size_t>(i)]).copy_(targets[static_cast<size_t>(i)]);
    b.target = target;
  }
  b.lengths = at::tensor(lengths, at::TensorOptions(at::kLong));
  return b;
}

at::Tensor next_token_targets(const Batch& batch, int64_t ignore_index) {
  if (!batch.ragged() || batch.inputs.size() != 1) throw InternalError("next_token_targets needs one ragged input");
  const at::Tensor& input = batch.inputs.front();
  const int64_t t = input.size(1);
  at::Tensor shifted = at::full_like(input, ignore_index);
  if (t > 1) shifted.narrow(1, 0, t - 1).copy_(input.narrow(1, 1, t - 1));
  const at::Tensor positions = at::arange(t, at::TensorOptions(at::kLong)).unsqueeze(0);
  const at::Tensor valid = positions.lt(batch.lengths.unsqueeze(1) - 1);
  return at::where(valid, shifted, at::full_like(shifted, ignore_index));
}

Batch synthetic_batch(const std::vector<TensorSpec>& inputs, const std::optional<TensorSpec>& target,
                      int64_t samples, uint64_t seed, const at::Device& device, const std::string& loss_kind) {
  for (const auto& spec : inputs) {
    if (spec.has_seq_dim()) {
      throw InputError("input " + spec.to_string() + " has a sequence dimension T: synthetic samples need their "
                       "lengths (--seq-len), or give ragged data");
    }
  }
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  Batch b;
  for (const auto& spec : inputs) b.inputs.push_back(synthetic_tensor(spec, samples, gen));
  if (target) b.target = synthetic_tensor(*target, samples, gen);
  if (target && is_probability_target(loss_kind, *target) && b.target.dim() == 2) {
    // Class probabilities: each row a softmax of its N(0,1) values, a valid distribution.
    b.target = at::softmax(b.target.to(at::kFloat), 1).to(b.target.scalar_type());
  }
  return device.is_cpu() ? b : b.to(device);
}

Batch synthetic_ragged_batch(const std::vector<TensorSpec>& inputs, const std::optional<TensorSpec>& target,
                             const std::vector<int64_t>& lengths, uint64_t seed, int64_t ignore_index) {
  if (lengths.empty()) throw InternalError("synthetic_ragged_batch without lengths");
  const int64_t n = static_cast<int64_t>(lengths.size());
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  if (*std::min_element(lengths.begin(), lengths.end()) < 1) throw InternalError("synthetic_ragged_batch: a length below 1");
  // Every tensor checked before the first is made: the padding mask alone is [n, T] (a 2^31-token
  // --seq-len made a 16 GiB arange before any spec was checked).
  for (const auto& spec : inputs) check_synthetic_bytes(spec, n, longest);
  if (target) check_synthetic_bytes(*target, n, target->has_seq_dim() ? longest : 1);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  Batch b;
  b.lengths = at::tensor(lengths, at::TensorOptions(at::kLong));
  // Positions past each sample's length: input 0, target ignore_index (the layout a ragged file loads to).
  const at::Tensor pad = at::arange(longest, at::TensorOptions(at::kLong)).unsqueeze(0).ge(b.lengths.unsqueeze(1));
  auto masked = [&](at::Tensor t, double fill) {
    at::Tensor m = pad;
    while (m.dim() < t.dim()) m = m.unsqueeze(-1);
    return t.masked_fill(m, fill);
  };
  for (const auto& spec : inputs) {
    if (!spec.has_seq_dim()) {
      throw InputError("input " + spec.to_string() + " has no sequence dimension T; variable-length data needs every "
                       "input as [B,T,...] (e.g. int64[B,T]:50257)");
    }
    b.inputs.push_back(masked(synthetic_tensor(spec, n, gen, longest), 0));
  }
  if (target) {
    // Per-token targets [B,T] are padded; a per-sample target (int64[B]:10, a class per sequence)
    // has nothing to pad.
    if (target->has_seq_dim()) {
      b.target = masked(synthetic_tensor(*target, n, gen, longest), static_cast<double>(ignore_index));
    } else if (target->dims.size() == 1) {
      b.target = synthetic_tensor(*target, n, gen);
    } else {
      throw InputError("target " + target->to_string() + " of variable-length data is either per token, [B,T,...], "
                       "or one value per sample, [B]");
    }
  }
  return b;
}

Batch load_batch_file(const std::string& path, bool has_target, const std::string& option, int64_t ignore_index) {
  const std::string file = option + " '" + path_for_message(path) + "'";  // how every message names the file
  require_regular_file(path, option, "a file written by torch.save([inputs..., target], f)");
  const c10::IValue value = read_torch_save(path, file);
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
  if (!items.empty() && items.front().isList()) return load_ragged(items, has_target, file, ignore_index);
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
  if (batch.lengths.defined()) out.lengths = batch.lengths.index_select(0, index.cpu());
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

DataRules data_rules(const std::vector<TensorSpec>& inputs, const std::optional<TensorSpec>& target, int64_t ignore_index,
                     const std::string& loss_kind) {
  DataRules r;
  for (const auto& spec : inputs) r.input_high.push_back(spec.is_integer() ? spec.high : std::nullopt);
  if (target && target->is_integer()) r.target_high = target->high;
  r.probability_target = target && is_probability_target(loss_kind, *target);
  r.ignore_index = ignore_index;
  return r;
}

namespace {

// Integer values of `t` outside [0, high) (nullopt high: [0, inf)), `ignore` allowed too when set.
void check_ids(const at::Tensor& t, std::optional<int64_t> high, std::optional<int64_t> ignore, const std::string& name,
               const std::string& fix) {
  if (t.numel() == 0 || !at::isIntegralType(t.scalar_type(), /*includeBool=*/false)) return;
  const at::Tensor named = ignore ? t.masked_select(t.ne(*ignore)) : t.reshape({-1});
  if (named.numel() == 0) return;
  const int64_t lo = named.min().item<int64_t>(), hi = named.max().item<int64_t>();
  if (lo >= 0 && (!high || hi < *high)) return;
  const std::string allowed = high ? "[0, " + std::to_string(*high - 1) + "]" : "0 or more";
  throw InputError(name + " range over [" + std::to_string(lo) + ", " + std::to_string(hi) + "] but must be " + allowed +
                   (ignore ? " (or " + std::to_string(*ignore) + " to ignore)" : std::string()) + "; " + fix);
}

}  // namespace

// NaN or infinity in floating data gives a non-finite loss: every step it is in would be skipped.
static void check_finite(const at::Tensor& t, const std::string& name) {
  if (!t.defined() || t.numel() == 0 || !at::isFloatingType(t.scalar_type())) return;
  const at::Tensor bad = t.isfinite().logical_not().reshape({t.size(0), -1}).any(1);
  if (!bad.any().item<bool>()) return;
  const int64_t samples = bad.sum().item<int64_t>(), first = bad.nonzero()[0][0].item<int64_t>();
  throw InputError(name + " holds NaN or infinite values in " + std::to_string(samples) + " sample(s), the first sample " +
                   std::to_string(first) + "; their loss would be non-finite and every step with them skipped");
}

void check_probability_rows(const at::Tensor& target, const std::string& what) {
  if (target.dim() != 2 || !at::isFloatingType(target.scalar_type())) {
    throw InputError(what + " is " + dtype_name(target.scalar_type()) + shape_text(target.sizes()) +
                     "; class probabilities are a floating [B,C] tensor");
  }
  const double tolerance = probability_row_tolerance(dtype_name(target.scalar_type()));
  const at::Tensor t = target.to(at::kCPU, at::kDouble);
  const at::Tensor negative = t.lt(0).any(1);
  const at::Tensor sums = t.sum(1);
  const at::Tensor off = (sums - 1).abs().le(tolerance).logical_not();  // NaN sums are off too
  const at::Tensor bad = negative.logical_or(off);
  if (!bad.any().item<bool>()) return;
  const int64_t row = bad.nonzero()[0][0].item<int64_t>();
  const std::string rule = "; class probabilities are non-negative and each row sums to 1 (e.g. a softmax, or "
                           "one-hot rows)";
  if (negative[row].item<bool>()) {
    const int64_t column = t[row].lt(0).nonzero()[0][0].item<int64_t>();
    throw InputError(what + ": row " + std::to_string(row) + " holds " + number_text(t[row][column].item<double>()) +
                     " for class " + std::to_string(column) + rule);
  }
  throw InputError(what + ": row " + std::to_string(row) + " sums to " + number_text(sums[row].item<double>()) +
                   ", not 1 (tolerance " + number_text(tolerance) + ")" + rule);
}

void check_batch_values(const Batch& batch, const DataRules& rules, const std::string& what, const std::string& fix) {
  for (size_t i = 0; i < batch.inputs.size(); ++i) check_finite(batch.inputs[i], what + ": input " + std::to_string(i));
  check_finite(batch.target, what + ": the target");
  for (size_t i = 0; i < batch.inputs.size(); ++i) {
    const std::optional<int64_t> high = i < rules.input_high.size() ? rules.input_high[i] : std::nullopt;
    const std::string name = what + ": the ids of input " + std::to_string(i) + (batch.ragged() ? " (token ids)" : "");
    // Ragged inputs are padded with 0 past each length: a valid id, so the padding is harmless here.
    check_ids(batch.inputs[i], high, std::nullopt, name, fix);
  }
  const at::Tensor& target = batch.target;
  if (target.defined() && at::isIntegralType(target.scalar_type(), /*includeBool=*/false)) {
    check_ids(target, rules.target_high, rules.ignore_index, what + ": its targets (class ids)", fix);
    if (target.numel() > 0 && !target.ne(rules.ignore_index).any().item<bool>()) {
      throw InputError(what + " has no valid target: every target is the ignore index " + std::to_string(rules.ignore_index) +
                       (batch.ragged() ? " (one-token sequences have no next-token target)" : "") +
                       ", so the loss has nothing to average and no optimizer step could be taken; " + fix);
    }
  }
  if (target.defined() && rules.probability_target && at::isFloatingType(target.scalar_type())) {
    check_probability_rows(target, what + ": the target (class probabilities)");
  }
  if (batch.ragged() && rules.max_length) {
    const std::vector<int64_t> lengths = batch.sequence_lengths();
    const auto longest = std::max_element(lengths.begin(), lengths.end());
    if (longest != lengths.end() && *longest > *rules.max_length) {
      throw InputError(what + ": sequence " + std::to_string(longest - lengths.begin()) + " has " + std::to_string(*longest) +
                       " tokens, more than the " + std::to_string(*rules.max_length) + " of " + rules.max_length_source +
                       "; truncate the longest sequences or plan for longer ones");
    }
  }
}

std::string spec_text_of(const at::Tensor& samples, bool sequence_dim) {
  TensorSpec spec;
  spec.dtype = dtype_name(samples.scalar_type());
  spec.dims.push_back(TensorSpec::kBatchDim);
  for (int64_t i = 1; i < samples.dim(); ++i) {
    spec.dims.push_back(i == 1 && sequence_dim ? TensorSpec::kSeqDim : samples.size(i));
  }
  if (at::isIntegralType(samples.scalar_type(), /*includeBool=*/false)) {
    spec.high = std::max<int64_t>(1, samples.numel() > 0 ? samples.max().item<int64_t>() + 1 : 1);
  }
  return spec.to_string();
}

}  // namespace accumplan
