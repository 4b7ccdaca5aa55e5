// tests/common/torch_save_file.h — write a list of tensors as Python's `torch.save([t0, t1, ...], f)`
// does (the zip format), for tests that feed `--batch-file`, `--data` or load_batch_file.
//
// What it is not: product code. The product only reads such files (runtime/batch.h); for LibTorch
// test executables only (it includes LibTorch, so include it before Catch).
#pragma once

#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include <fstream>
#include <string>
#include <vector>

namespace accumplan::test {

inline std::string write_torch_save(const std::string& path, const std::vector<at::Tensor>& tensors) {
  c10::List<at::Tensor> list;
  for (const auto& t : tensors) list.push_back(t);
  const std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(list));
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

// Ragged data as Python's `torch.save([list_of_1d_tensors, list_of_targets_or_None], f)` writes
// it: an empty `targets` saves None.
inline std::string write_ragged_save(const std::string& path, const std::vector<at::Tensor>& sequences,
                                     const std::vector<at::Tensor>& targets) {
  c10::List<at::Tensor> seqs;
  for (const auto& t : sequences) seqs.push_back(t);
  c10::impl::GenericList outer(c10::AnyType::get());
  outer.push_back(c10::IValue(seqs));
  if (targets.empty()) {
    outer.push_back(c10::IValue());
  } else {
    c10::List<at::Tensor> ts;
    for (const auto& t : targets) ts.push_back(t);
    outer.push_back(c10::IValue(ts));
  }
  const std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(outer));
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

}  // namespace accumplan::test
