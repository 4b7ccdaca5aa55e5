// run/run_data.h — the samples `accumplan run` and `accumplan verify` train on, and the trained
// module written back.
//
// What it is: a torch.save file checked against the plan's input specs and values (shapes,
// class indices, lengths within the plan's token budget), or synthetic samples from the plan's
// specs — variable-length ones drawn from the plan's setup.seq_len range (no longer than its
// token budget holds) or from observed lengths — held on the host within the host-data limit;
// for `run`, their bytes kept outside the budget the probe enforces (runtime/host_data.h).
// What it is not: the flags (cli/executor_commands.cpp reads them into a RunDataSource), the
// windows cut from the samples (executor.h plan_windows) or the training.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/script.h>

#include "accumplan/memory_probe.h"
#include "accumplan/schema.h"
#include "accumplan/tensor_spec.h"
#include "runtime/batch.h"
#include "runtime/loss.h"

namespace accumplan {

// The synthetic data set lives in host memory: at most 2^30 samples, and its bytes within
// max_host_data_bytes() (accumplan/host_data.h).
inline constexpr int64_t kMaxSyntheticSamples = int64_t{1} << 30;

// Where the samples come from. Messages name the file by `data_name` ("--data").
struct RunDataSource {
  std::string data_path;                    // a torch.save file of samples; empty: synthetic samples
  std::string data_name = "--data";
  std::optional<int64_t> synthetic_samples;  // how many; nullopt: the default_windows' worth
  std::string synthetic_samples_name = "--synthetic-samples";
  // Synthetic variable-length samples take their lengths from these (each within the plan's
  // token budget) rather than uniformly from setup.seq_len; `lengths_source` names them.
  std::vector<int64_t> observed_lengths;
  std::string lengths_source;
  uint64_t seed = 1234;
};

// What the samples must match: the plan's specs and its loss.
struct RunDataSpecs {
  const Plan& plan;
  const std::vector<TensorSpec>& inputs;
  const std::optional<TensorSpec>& target;
  const LossConfig& loss;
};

// How an error names the samples: "--data 'x.pt'" or "synthetic samples of the plan's setup.inputs".
std::string data_source_text(const RunDataSource& source);

// The samples, on the CPU (microbatches move to the device one at a time): the file's, checked,
// or synthetic ones — about `default_windows` global windows unless synthetic_samples says (for a
// plan that cuts windows by valid tokens, enough sequences to reach that many windows' tokens).
// InputError naming the file, the value or the limit (synthetic bytes over the host-data limit).
Batch load_samples(const RunDataSource& source, const RunDataSpecs& specs, int64_t default_windows);

// `run`'s data: load_samples for 4 global windows by default, their bytes as the probe counted
// them, and `budget_bytes` enforced beside them (on the CPU device host data is counted too).
// `eval_source` (--eval-data): the evaluation set too, checked as the data is, its bytes host data.
struct RunData {
  Batch data;
  std::optional<Batch> eval_data;
  int64_t host_data_bytes = 0;  // CPU: the data's (and eval data's) bytes in the counting allocator, outside the budget
  std::optional<int64_t> budget_bytes;
};
RunData load_run_data(const RunDataSource& source, const RunDataSpecs& specs, MemoryProbe& probe,
                      std::optional<int64_t> budget_bytes, const RunDataSource* eval_source = nullptr);

// Serialized in memory, then written by the same temp-and-rename as every other output, so a
// failed save leaves nothing behind. `name` says which option asked ("--save").
void save_module_atomic(torch::jit::Module& module, const std::string& path, const std::string& name = "--save");

}  // namespace accumplan
