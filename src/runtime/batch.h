// runtime/batch.h — the samples one microbatch or window is made of.
//
// What it is: a Batch holds one tensor per forward argument plus the target, dim 0 = samples.
// Batches come from tensor specs (synthetic, seeded, reproducible) or from a file written by
// Python's `torch.save([inputs..., target], f)`; they slice without copying and tile to any size.
// Ragged data (sequences of different lengths) is held padded along dim 1 with each sample's
// length beside it: a file written by `torch.save([list_of_1d_token_tensors, list_of_targets_or_None], f)`
// loads that way, and `gather` cuts a microbatch padded only to its own longest sequence.
// What it is not: a data loader. There is no shuffling or prefetching here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "accumplan/tensor_spec.h"

namespace accumplan {

struct Batch {
  std::vector<at::Tensor> inputs;  // one per forward argument, dim 0 = samples
  at::Tensor target;               // undefined when the model computes its loss without one
  // Ragged data only (undefined otherwise): each sample's length in tokens, int64 [samples], on
  // the host. Every tensor of a ragged batch is [samples, T, ...] with T >= every length, and the
  // positions past a sample's length are padding: input 0, target ignore_index, so the padding
  // counts as no token of the loss in either normalization.
  at::Tensor lengths;

  int64_t size() const;                             // samples (dim 0)
  bool ragged() const { return lengths.defined(); }
  int64_t padded_length() const;                    // T (dim 1) of a ragged batch; 0 otherwise
  std::vector<int64_t> sequence_lengths() const;    // lengths as a vector (ragged only)
  Batch slice(int64_t start, int64_t count) const;  // a view of samples [start, start+count)
  // The samples at `indices`, in that order (a copy), every tensor cut along dim 1 to the longest
  // of them: a packed microbatch holds no padding beyond its own longest sequence. Ragged only.
  Batch gather(const std::vector<int64_t>& indices) const;
  Batch to(const at::Device& device) const;         // lengths stay on the host
};

// The padding mask of a ragged batch: bool [samples, T], true at padding positions — the
// convention of nn.TransformerEncoder's src_key_padding_mask. `--padding-mask` passes it to the
// model as one more forward argument after the inputs.
at::Tensor padding_mask(const Batch& batch);

// Random data matching the specs: floats ~ N(0,1), integers uniform in [0, high). The same seed
// gives the same batch. `target` may be nullopt (loss "model" without a target). The target of
// `loss_kind` that holds class probabilities (loss.h is_probability_target: a floating
// cross_entropy target [B,C]) is drawn as valid rows instead: a softmax of N(0,1) values. Specs
// with a sequence dimension T need synthetic_ragged_batch (InputError here).
Batch synthetic_batch(const std::vector<TensorSpec>& inputs, const std::optional<TensorSpec>& target,
                      int64_t samples, uint64_t seed, const at::Device& device, const std::string& loss_kind = "");

// Synthetic ragged data: one sample per entry of `lengths`, every spec [B,T,...] with T the
// sample's length, padded to the longest as a ragged file loads (inputs 0, targets
// `ignore_index`). InputError for a spec without T. The same seed gives the same batch.
Batch synthetic_ragged_batch(const std::vector<TensorSpec>& inputs, const std::optional<TensorSpec>& target,
                             const std::vector<int64_t>& lengths, uint64_t seed, int64_t ignore_index = -100);

// The one data check (the main job's --batch-file, `run --data`, `verify --data`): what a data set
// must hold for the loss and the plan, checked once on the host before anything is measured or
// trained, so data the main job accepts is data `run` accepts.
//   - integer inputs are ids (tokens, classes, positions): in [0, high) — high from the spec, or
//     unbounded above when the spec came from the file itself;
//   - integer targets are class ids: in [0, high) or ignore_index, and at least one is not
//     ignore_index (a loss over no target is NaN: no optimizer step could be taken);
//   - ragged data: no sequence longer than `max_length` (the --seq-len maximum or the plan's);
//   - class probabilities (a floating cross_entropy target [B,C]): loss.h check_probability_rows.
// InputError names `what` ("--data 'd.pt'"), the offending value and `fix`.
struct DataRules {
  std::vector<std::optional<int64_t>> input_high;  // per input, integer dtypes only
  std::optional<int64_t> target_high;              // integer targets only
  bool probability_target = false;                 // the target's rows are class probabilities
  int64_t ignore_index = -100;
  std::optional<int64_t> max_length;  // ragged data only
  std::string max_length_source;      // "--seq-len 16..512", "the plan (tokens.max_seq_len)"
};
// The rules for data of these specs feeding `loss_kind` ("cross_entropy", "mse", "model").
DataRules data_rules(const std::vector<TensorSpec>& inputs, const std::optional<TensorSpec>& target, int64_t ignore_index,
                     const std::string& loss_kind = "");
void check_batch_values(const Batch& batch, const DataRules& rules, const std::string& what, const std::string& fix);

// The rows of a probability target [B,C] (dim 0 = samples): every entry non-negative, every row
// summing to 1 within setup_rules.h's probability_row_tolerance (a NaN fails). InputError naming
// `what`, the first bad row and its value or sum otherwise. Reads the tensor on the host.
void check_probability_rows(const at::Tensor& target, const std::string& what);

// Reads `torch.save([inputs..., target], f)` (zip format). `has_target` says whether the last
// tensor is the target. Throws InputError for a missing or unreadable file, a file that is not a
// list of tensors, or tensors whose dim 0 disagree; its messages name the file as `option` 'path'.
// A file holding `[list_of_1d_int64_tensors, targets]` is ragged data: targets is a list of 1-D
// tensors of the same lengths (per-token targets), or None for next-token targets (the inputs
// shifted left by one, the last position ignore_index) — or None with has_target false, for a
// model that computes its own loss. It loads padded with 0 (inputs) and `ignore_index` (targets).
Batch load_batch_file(const std::string& path, bool has_target, const std::string& option = "--batch-file",
                      int64_t ignore_index = -100);

// The ragged batch of `sequences` (1-D integer tensors, each >= 1 token) and per-token `targets`
// (same lengths; empty for none), padded as load_batch_file pads. InputError naming the sequence
// for an empty or mismatched one. Used by load_batch_file and by tests.
Batch ragged_batch(const std::vector<at::Tensor>& sequences, const std::vector<at::Tensor>& targets,
                   int64_t ignore_index = -100, const std::string& what = "ragged data");

// Next-token targets of a ragged batch's (single) input: targets[i][t] = inputs[i][t+1] for
// t + 1 < length, ignore_index after.
at::Tensor next_token_targets(const Batch& batch, int64_t ignore_index);

// Repeats the batch's samples cyclically to exactly `samples` samples.
Batch tile_batch(const Batch& batch, int64_t samples);

// Throws InputError naming the argument if `batch` does not match the specs (count, dtype, shape
// apart from dim 0).
void check_batch_matches(const Batch& batch, const std::vector<TensorSpec>& inputs,
                         const std::optional<TensorSpec>& target, const std::string& what);

// The spec text describing `samples` (dim 0 = samples): "float32[B,3,32,32]"; integer tensors get
// ":high" with high = max + 1, so a plan made from a batch file can rebuild synthetic data. With
// `sequence_dim` (ragged data, padded along dim 1), dim 1 is the sequence dimension T:
// "int64[B,T]:50257". Written by TensorSpec::to_string, the spec's one canonical form.
std::string spec_text_of(const at::Tensor& samples, bool sequence_dim = false);

// at::ScalarType for a spec dtype name ("float32" → kFloat); InternalError for an unknown one
// (parse_tensor_spec has already refused those).
at::ScalarType scalar_type_of(const std::string& dtype);

}  // namespace accumplan
