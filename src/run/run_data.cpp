// run/run_data.cpp — the samples of `accumplan run` and `verify`. See run_data.h.
#include "run/run_data.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>

#include "accumplan/checked.h"
#include "accumplan/errors.h"
#include "accumplan/host_data.h"
#include "accumplan/json_io.h"
#include "accumplan/units.h"
#include "runtime/host_data.h"

namespace accumplan {
namespace {

// Variable-length data: the lengths synthetic sequences are drawn from — the plan's setup.seq_len,
// no longer than the longest sequence its token budget holds (a re-planned plan after an OOM
// lowers tokens.max_seq_len). nullopt for fixed shapes.
std::optional<SeqLenRange> synthetic_range(const Plan& plan) {
  if (!plan.setup.seq_len) return std::nullopt;
  SeqLenRange r = *plan.setup.seq_len;
  if (plan.tokens) {
    r.max = std::min(r.max, plan.tokens->max_seq_len);
    r.min = std::min(r.min, r.max);
  }
  return r;
}

// `samples` synthetic lengths, seeded: drawn from the observed lengths when given (each must lie
// in `range`), else uniformly from `range`.
std::vector<int64_t> synthetic_lengths(const RunDataSource& s, const SeqLenRange& range, int64_t samples) {
  std::mt19937_64 rng(s.seed);
  std::vector<int64_t> lengths(static_cast<size_t>(samples));
  if (s.observed_lengths.empty()) {
    std::uniform_int_distribution<int64_t> length(range.min, range.max);
    for (auto& l : lengths) l = length(rng);
    return lengths;
  }
  const std::vector<int64_t>& observed = s.observed_lengths;
  for (size_t i = 0; i < observed.size(); ++i) {
    if (observed[i] > range.max) {
      throw InputError(s.lengths_source + ": length " + std::to_string(observed[i]) + " (entry " + std::to_string(i + 1) +
                       ") is longer than the " + std::to_string(range.max) +
                       " tokens the plan's token budget holds; re-plan with these lengths (--seq-len-file) or truncate");
    }
  }
  std::uniform_int_distribution<size_t> pick(0, observed.size() - 1);
  for (auto& l : lengths) l = observed[pick(rng)];
  return lengths;
}

// Synthetic samples for about `windows` global windows: windows x B, or for a --target-tokens
// plan windows x target_tokens over the mean length less one (next-token targets have one valid
// token fewer than the sequence), so the data holds at least that many windows.
int64_t default_synthetic_samples(const RunDataSource& s, const Plan& plan, int64_t windows) {
  const int64_t B = plan.target_batch;  // the global window
  if (!plan.tokens || !plan.tokens->target_tokens) return checked_mul(windows, B, "the default synthetic samples");
  const std::optional<SeqLenRange> range = synthetic_range(plan);
  double mean = range ? 0.5 * static_cast<double>(range->min + range->max) : 1.0;
  if (range && !s.observed_lengths.empty()) {
    mean = 0;
    for (int64_t l : s.observed_lengths) mean += static_cast<double>(l) / static_cast<double>(s.observed_lengths.size());
  }
  const double tokens = static_cast<double>(windows) * static_cast<double>(*plan.tokens->target_tokens);
  return static_cast<int64_t>(std::min(static_cast<double>(kMaxSyntheticSamples), std::ceil(tokens / std::max(1.0, mean - 1.0))));
}

Batch load_file(const RunDataSource& s, const RunDataSpecs& d) {
  const std::string what = s.data_name + " '" + path_for_message(s.data_path) + "'";
  const Batch b = load_batch_file(s.data_path, d.target.has_value(), s.data_name, d.loss.ignore_index);
  check_batch_matches(b, d.inputs, d.target, what);
  if (batch_samples(b, what) < 1) throw InputError(what + " has no samples");
  DataRules rules = data_rules(d.inputs, d.target, d.loss.ignore_index, d.loss.kind);
  if (d.plan.tokens) rules.max_length = d.plan.tokens->max_seq_len, rules.max_length_source = "the plan (tokens.max_seq_len)";
  check_batch_values(b, rules, what, "re-plan with this data (--batch-file)");
  return b;
}

Batch synthetic(const RunDataSource& s, const RunDataSpecs& d, int64_t default_windows) {
  const int64_t samples = s.synthetic_samples ? *s.synthetic_samples : default_synthetic_samples(s, d.plan, default_windows);
  const std::optional<SeqLenRange> range = synthetic_range(d.plan);
  int64_t bytes_per_sample = 0;
  auto add = [&](const TensorSpec& spec) {
    const int64_t item = static_cast<int64_t>(c10::elementSize(scalar_type_of(spec.dtype)));
    const int64_t elements = spec.elements_per_sample(range ? range->max : 1);
    bytes_per_sample = checked_add(bytes_per_sample, checked_mul(elements, item, "bytes per sample"), "bytes per sample");
  };
  for (const auto& spec : d.inputs) add(spec);
  if (d.target) add(*d.target);
  const int64_t bytes = checked_mul(bytes_per_sample, samples, s.synthetic_samples_name + " x bytes per sample");
  check_host_data_bytes(bytes,
                        s.synthetic_samples_name + " " + std::to_string(samples) +
                            (s.synthetic_samples ? "" : " (the default, " + std::to_string(default_windows) +
                                                               (default_windows == 1 ? " global window)" : " global windows)")),
                        "give fewer " + s.synthetic_samples_name + " (" + format_bytes(bytes_per_sample) +
                            " per sample) or real samples with " + s.data_name);
  if (range) {
    return synthetic_ragged_batch(d.inputs, d.target, synthetic_lengths(s, *range, samples), s.seed, d.loss.ignore_index);
  }
  return synthetic_batch(d.inputs, d.target, samples, s.seed, at::kCPU, d.loss.kind);
}

}  // namespace

std::string data_source_text(const RunDataSource& source) {
  return source.data_path.empty() ? "synthetic samples of the plan's setup.inputs"
                                  : source.data_name + " '" + path_for_message(source.data_path) + "'";
}

Batch load_samples(const RunDataSource& source, const RunDataSpecs& specs, int64_t default_windows) {
  if (source.synthetic_samples) {
    checked_in_range(*source.synthetic_samples, int64_t{1}, kMaxSyntheticSamples, source.synthetic_samples_name);
  }
  return source.data_path.empty() ? synthetic(source, specs, default_windows) : load_file(source, specs);
}

RunData load_run_data(const RunDataSource& source, const RunDataSpecs& specs, MemoryProbe& probe,
                      std::optional<int64_t> budget_bytes, const RunDataSource* eval_source) {
  RunData d;
  // Every rank loads the whole data set (synthetic samples come from the same seed) and takes its
  // share of each window; a sharded loader is the trainer's business, not the plan's. On the CPU
  // device its bytes are host data (runtime/host_data.h): outside every peak and the budget.
  d.data = load_host_data(probe, [&] { return load_samples(source, specs, 4); }, d.host_data_bytes);
  batch_samples(d.data, "the data");  // every tensor holds the same samples
  if (eval_source) {
    int64_t eval_bytes = 0;
    d.eval_data = load_host_data(probe, [&] { return load_samples(*eval_source, specs, 1); }, eval_bytes);
    batch_samples(*d.eval_data, eval_source->data_name);
    d.host_data_bytes += eval_bytes;
  }
  d.budget_bytes = budget_bytes;
  if (budget_bytes) enforce_budget_beside(probe, budget_bytes, d.host_data_bytes);
  return d;
}

void save_module_atomic(torch::jit::Module& module, const std::string& path, const std::string& name) {
  std::ostringstream bytes;
  try {
    module.save(bytes);
  } catch (const c10::Error& e) {
    throw InputError(name + " '" + path_for_message(path) + "': cannot serialize the model (" +
                     cut_for_message(e.what_without_backtrace(), 200) + ")");
  }
  write_text_atomic(path, bytes.str());
}

}  // namespace accumplan
