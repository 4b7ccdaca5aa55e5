// executor/evaluate.cpp — the LibTorch backend of the one evaluation loop (accumplan/window_loop.h
// run_eval). See evaluate.h for the contract.
#include "executor/evaluate.h"

#include <torch/script.h>

#include <deque>
#include <numeric>
#include <utility>

#include "accumplan/memory_probe.h"
#include "accumplan/replan.h"
#include "accumplan/window_loop.h"
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

// The evaluation loop's backend: forward and loss sum of a microbatch of `data`, the sums and
// units kept on the device, kept outputs held until the loop hands them over.
class TorchEval : public EvalBackend {
 public:
  TorchEval(torch::jit::Module& module, const Batch& data, const EvalOptions& options)
      : module_(module), data_(data), options_(options), step_(options.step) {
    step_.probe = options.probe;
    total_ = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(step_.device));
  }

  void eval_microbatch(int64_t, int64_t start, int64_t size, bool keep_output) override {
    at::Tensor output;
    const LossSum ls = forward_loss(module_, microbatch_of(data_, start, size), step_, true, keep_output ? &output : nullptr);
    total_ += ls.sum.detach().to(at::kDouble);
    units_ += ls.units;
    if (keep_output) held_.emplace_back(output, start);
  }
  bool is_out_of_memory(const std::exception& e) const override { return accumplan::is_out_of_memory(e, options_.probe); }
  void after_out_of_memory() override {
    if (!options_.probe) return;
    options_.probe->clear_oom();
    options_.probe->release_cached();
  }
  void hand_over_output() override {
    if (options_.on_outputs) options_.on_outputs(held_.front().first, held_.front().second);
    held_.pop_front();
  }
  double loss_sum() const { return total_.item<double>(); }
  int64_t units() const { return units_; }

 private:
  torch::jit::Module& module_;
  const Batch& data_;
  const EvalOptions& options_;
  StepConfig step_;
  at::Tensor total_;
  int64_t units_ = 0;
  std::deque<std::pair<at::Tensor, int64_t>> held_;
};

}  // namespace

EvalStats evaluate(torch::jit::Module& module, const Batch& data, const std::vector<int64_t>& sizes,
                   const EvalOptions& options) {
  EvalMode eval_mode(module);
  at::NoGradGuard no_grad;
  TorchEval backend(module, data, options);
  EvalLoopOptions o;
  o.oom_recovery = options.oom_recovery;
  o.keep_outputs = options.keep_outputs;
  o.log = options.log;
  o.before_microbatch = options.before_microbatch;
  const EvalOutcome out = run_eval(backend, data.size(), sizes, o);
  EvalStats stats;
  stats.microbatch_sizes = out.microbatch_sizes;
  stats.oom_recoveries = out.oom_recoveries;
  stats.units = backend.units();
  stats.samples = data.size();
  stats.loss_sum = backend.loss_sum();
  return stats;
}

}  // namespace accumplan
