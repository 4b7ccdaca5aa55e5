// runtime/batch.h — the samples one microbatch or window is made of.
//
// What it is: a Batch holds one tensor per forward argument plus the target, dim 0 = samples.
// Batches come from tensor specs (synthetic, seeded, reproducible) or from a file written by
// Python's `torch.save([inputs..., target], f)`; they slice without copying and tile to any size.
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

  int64_t size() const;                             // samples (dim 0)
  Batch slice(int64_t start, int64_t count) const;  // a view of samples [start, start+count)
  Batch to(const at::Device& device) const;
};

// Random data matching the specs: floats ~ N(0,1), integers uniform in [0, high). The same seed
// gives the same batch. `target` may be nullopt (loss "model" without a target).
Batch synthetic_batch(const std::vector<TensorSpec>& inputs, const std::optional<TensorSpec>& target,
                      int64_t samples, uint64_t seed, const at::Device& device);

// Reads `torch.save([inputs..., target], f)` (zip format). `has_target` says whether the last
// tensor is the target. Throws InputError for a missing or unreadable file, a file that is not a
// list of tensors, or tensors whose dim 0 disagree; its messages name the file as `option` 'path'.
Batch load_batch_file(const std::string& path, bool has_target, const std::string& option = "--batch-file");

// Repeats the batch's samples cyclically to exactly `samples` samples.
Batch tile_batch(const Batch& batch, int64_t samples);

// Throws InputError naming the argument if `batch` does not match the specs (count, dtype, shape
// apart from dim 0).
void check_batch_matches(const Batch& batch, const std::vector<TensorSpec>& inputs,
                         const std::optional<TensorSpec>& target, const std::string& what);

// The spec text describing `samples` (dim 0 = samples): "float32[B,3,32,32]"; integer tensors get
// ":high" with high = max + 1, so a plan made from a batch file can rebuild synthetic data.
std::string spec_text_of(const at::Tensor& samples);

// at::ScalarType for a spec dtype name ("float32" → kFloat); InternalError for an unknown one
// (parse_tensor_spec has already refused those).
at::ScalarType scalar_type_of(const std::string& dtype);

}  // namespace accumplan
