// executor/evaluate.cpp — the one evaluation loop. See evaluate.h for the contract.
#include "executor/evaluate.h"

#include <torch/script.h>

#include <numeric>
#include <utility>

#include "accumplan/memory_probe.h"
#include "accumplan/replan.h"
#include "executor/executor.h"

namespace accumplan {
namespace {

// Every submodule in eval mode while it lives; each one's own training flag put back after (a
// model may keep a frozen BatchNorm in eval mode while training: module.train() would undo that).
class EvalMode {
 public:
  explicit EvalMode(torch::jit::Module& module) {
    for (torch::jit::Module m : module.modules()) flags_.emplace_back(m, m.is_training());
    module.eval();
  }
  ~EvalMode() {
    // train(bool) sets a whole subtree; modules() is pre-order, so each module's own flag wins.
    for (auto& [m, training] : flags_) m.train(training);
  }
  EvalMode(const EvalMode&) = delete;
  EvalMode& operator=(const EvalMode&) = delete;

 private:
  std::vector<std::pair<torch::jit::Module, bool>> flags_;
};

Batch microbatch_of(const Batch& data, int64_t start, int64_t size) {
  if (!data.ragged()) return data.slice(start, size);
  std::vector<int64_t> idx(static_cast<size_t>(size));
  std::iota(idx.begin(), idx.end(), start);
  return data.gather(idx);  // cut to its own longest sequence
}

}  // namespace

EvalStats evaluate(torch::jit::Module& module, const Batch& data, const std::vector<int64_t>& sizes,
                   const EvalOptions& options) {
  EvalStats stats;
  const int64_t n = data.size();
  if (std::accumulate(sizes.begin(), sizes.end(), int64_t{0}) != n) {
    throw InputError("evaluation sizes sum to " + std::to_string(std::accumulate(sizes.begin(), sizes.end(), int64_t{0})) +
                     " but the batch holds " + std::to_string(n) + " samples");
  }
  EvalMode eval_mode(module);
  StepConfig step = options.step;
  step.probe = options.probe;
  at::NoGradGuard no_grad;
  std::vector<int64_t> plan = sizes;
  at::Tensor total = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(step.device));
  at::Tensor held;
  int64_t held_start = 0;
  int64_t start = 0;
  size_t i = 0;
  while (i < plan.size()) {
    const int64_t size = plan[i];
    if (options.before_microbatch) options.before_microbatch(static_cast<int64_t>(i), size);
    try {
      at::Tensor output;
      const LossSum ls = forward_loss(module, microbatch_of(data, start, size), step, true,
                                      options.keep_outputs ? &output : nullptr);
      total += ls.sum.detach().to(at::kDouble);
      stats.units += ls.units;
      if (options.keep_outputs) {
        if (held.defined() && options.on_outputs) options.on_outputs(held, held_start);
        held = output;
        held_start = start;
      }
    } catch (const std::exception& e) {
      if (!options.oom_recovery || !is_out_of_memory(e, options.probe)) throw;
      int64_t smaller = 0;
      try {
        smaller = eval_size_after_oom(size);
      } catch (const InfeasibleError& none) {
        throw ExecutorOomError(std::string(none.what()) + " (sample " + std::to_string(start) + ")");
      }
      if (options.probe) {
        options.probe->clear_oom();
        options.probe->release_cached();
      }
      std::vector<int64_t> rest = eval_split(n - start, smaller);
      plan.resize(i);
      plan.insert(plan.end(), rest.begin(), rest.end());
      ++stats.oom_recoveries;
      if (options.log) {
        options.log("evaluation ran out of memory at a microbatch of " + std::to_string(size) + " samples; the " +
                    std::to_string(n - start) + " samples from sample " + std::to_string(start) +
                    " on run in microbatches of " + std::to_string(smaller));
      }
      continue;  // microbatch i again, now of the smaller size
    }
    stats.microbatch_sizes.push_back(size);
    start += size;
    ++i;
  }
  if (held.defined() && options.on_outputs) options.on_outputs(held, held_start);
  stats.samples = n;
  stats.loss_sum = total.item<double>();
  return stats;
}

}  // namespace accumplan
