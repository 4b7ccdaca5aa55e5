// examples/trainer/trainer.cpp — a small C++ trainer built on accumplan as a library: measure,
// plan, then train with exact per-token weighting and OOM recovery on a simulated accelerator.
//
// What it is: the whole product in one program, on the CPU with the counting allocator enforcing
// an 8 MiB budget (a small "device"):
//   1. profile builtin:tinylm (token ids [B,32] -> logits [B,32,1000]) with AdamW and plan a
//      target batch of 40 (ProbeRunner: real steps, a fitted line, a confirmed microbatch);
//   2. train a fresh copy for 3 epochs of 100 padded sequences (windows 40, 40, 20 — the last one
//      short, with its own token count) on a learnable task (target = (7 x + 3) mod 1000), with
//      a warm-up schedule and gradient clipping; the executor weights every microbatch by the
//      valid tokens of its whole window;
//   3. after the first epoch, "another tenant" takes enough of the device that the planned
//      microbatch no longer fits (the budget drops to 1.5 samples' activations below the peak
//      measured in epoch 0): the next window runs out of memory, the executor re-plans below the
//      failing size, replays the window and writes the new plan atomically.
// It checks what it promises and exits 1 if any check fails, so CTest runs it as a test:
// optimizer steps == scheduler steps == epochs x ceil(100 / 40), every sample seen once per
// epoch, at least one OOM recovery, every re-planned microbatch below the size that failed, and
// a lower loss in the last epoch than in the first.
// What it is not: a data pipeline or a benchmark; sizes are chosen to run in seconds on 2 cores.
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "accumplan/errors.h"
#include "accumplan/memory_probe.h"
#include "accumplan/schema.h"
#include "accumplan/solver.h"
#include "accumplan/units.h"
#include "executor/executor.h"
#include "profiling/probe_runner.h"
#include "runtime/batch.h"
#include "runtime/loss.h"
#include "runtime/model.h"
#include "runtime/optim.h"

using namespace accumplan;

namespace {

constexpr int64_t kBudgetBytes = 8 * 1024 * 1024;  // tinylm + AdamW persist about 3.1 MiB
constexpr int64_t kTargetBatch = 40;
constexpr int64_t kSamples = 100;                  // windows of 40, 40, 20
constexpr int64_t kEpochs = 3;
constexpr int64_t kSeqLen = 32, kVocab = 1000;

// Padded sequences: sample i has a random length in [8, 32]; positions past it hold token 0 and
// target ignore_index, so microbatches carry different numbers of valid tokens.
Batch make_data(int64_t n, int64_t ignore_index) {
  torch::manual_seed(7);
  at::Tensor x = torch::randint(1, kVocab, {n, kSeqLen}, torch::kLong);
  at::Tensor y = (x * 7 + 3).remainder(kVocab);
  const at::Tensor lengths = torch::randint(8, kSeqLen + 1, {n}, torch::kLong);
  const at::Tensor pad = torch::arange(kSeqLen).unsqueeze(0).ge(lengths.unsqueeze(1));
  x.masked_fill_(pad, 0);
  y.masked_fill_(pad, ignore_index);
  Batch b;
  b.inputs = {x};
  b.target = y;
  return b;
}

int failures = 0;
void check(bool ok, const std::string& what) {
  std::printf("  [%s] %s\n", ok ? "ok" : "FAILED", what.c_str());
  if (!ok) ++failures;
}

// builtin:tinylm's inputs, target and loss with AdamW at 1e-2, normalized per token.
Setup tinylm_setup() {
  Setup setup;
  const auto defaults = builtin_defaults("builtin:tinylm");
  setup.inputs = defaults->inputs;
  setup.target = defaults->target;
  setup.loss = defaults->loss;
  setup.optimizer = "adamw";
  setup.lr = 1e-2;
  setup.normalization = "auto";  // [B,T,C] cross-entropy: tokens
  return setup;
}

// Step 1: measure and plan as `accumplan --model builtin:tinylm ...` does (the runner's model freed on return).
Plan measure_and_plan(MemoryProbe& probe, const Setup& setup) {
  RunnerOptions ro;
  ro.model = "builtin:tinylm";
  ro.setup = setup;
  ro.budget.bytes = kBudgetBytes;
  ro.max_probe_micro_batch = kTargetBatch;
  ro.progress = [](const std::string& line) { std::cerr << "  profiler: " << line << "\n"; };
  ProbeRunner runner(probe, ro);
  Profile profile = runner.profile();
  PlanRequest req;
  req.target_batch = kTargetBatch;
  req.budget.bytes = kBudgetBytes;
  return runner.plan_and_confirm(profile, req);
}

// The executor's options: per-token loss, clipping, OOM recovery, a warm-up, steps counted in `scheduler_steps`.
ExecutorOptions executor_options(const Setup& setup, MemoryProbe* probe, const std::string& out_dir,
                                 int64_t& scheduler_steps) {
  const int64_t target_dims = 2;  // int64[B,32]
  ExecutorOptions eo;
  eo.loss.kind = setup.loss;
  eo.loss.ignore_index = setup.ignore_index;
  eo.loss.normalization = resolve_normalization(setup.normalization, setup.loss, target_dims);
  eo.max_grad_norm = 1.0;
  eo.oom_recovery = true;
  eo.probe = probe;
  eo.plan_out = out_dir + "/replanned-plan.json";
  const double lr = setup.lr;
  eo.lr_schedule = [lr](int64_t step) { return lr * std::min(1.0, (step + 1) / 3.0); };  // 3-step warm-up
  eo.on_step = [&scheduler_steps](const StepEvent&) { ++scheduler_steps; };
  return eo;
}

// Step 2: trains every epoch of `data`, the budget shrunk before epoch 1; returns each epoch's loss per token.
std::vector<double> train_epochs(Executor& executor, MemoryProbe& probe, const Plan& plan, const Batch& data) {
  std::vector<double> epoch_loss;
  for (int64_t epoch = 0; epoch < kEpochs; ++epoch) {
    if (epoch == 1) {
      // Leave room for 1.5 samples fewer than the planned microbatch really used in epoch 0:
      // that size must fail, one sample less fails too, two less fits with half a sample spare.
      const double per_sample = plan.memory.activation_bytes_per_sample;
      const int64_t shrunk = executor.totals().peak_bytes.value_or(kBudgetBytes) - static_cast<int64_t>(1.5 * per_sample);
      std::cout << "-- another tenant takes " << format_bytes(kBudgetBytes - shrunk) << " of the device --\n";
      probe.set_budget_bytes(shrunk);
    }
    double loss_sum = 0, tokens = 0;
    for (const auto& [start, count] : epoch_windows(kSamples, plan.per_rank_batch)) {
      const WindowStats st = executor.step(data.slice(start, count));
      std::printf("epoch %lld window @%3lld: %2lld samples, %4lld tokens, %zu microbatches, loss %.4f, grad norm %.3f%s%s\n",
                  static_cast<long long>(epoch), static_cast<long long>(start), static_cast<long long>(st.samples),
                  static_cast<long long>(st.units), st.microbatch_sizes.size(), st.loss, st.grad_norm.value_or(0.0),
                  st.oom_recoveries ? " (recovered from OOM)" : "", st.stepped ? "" : " (skipped)");
      loss_sum += st.loss * static_cast<double>(st.units);
      tokens += static_cast<double>(st.units);
    }
    epoch_loss.push_back(loss_sum / tokens);
  }
  return epoch_loss;
}

// Step 3: prints and counts every check of what the run promised.
void check_promises(const Executor& executor, const std::string& plan_out, int64_t scheduler_steps,
                    int64_t planned_micro_batch, const std::vector<double>& epoch_loss) {
  const ExecutorTotals& t = executor.totals();
  const int64_t windows_per_epoch = (kSamples + kTargetBatch - 1) / kTargetBatch;
  std::printf("\nchecks:\n");
  check(t.optimizer_steps == kEpochs * windows_per_epoch,
        "optimizer steps " + std::to_string(t.optimizer_steps) + " == epochs x ceil(N/B) = " +
            std::to_string(kEpochs * windows_per_epoch));
  check(scheduler_steps == t.optimizer_steps, "scheduler steps " + std::to_string(scheduler_steps) + " == optimizer steps");
  check(t.samples_seen == kEpochs * kSamples, "samples seen " + std::to_string(t.samples_seen) + " == epochs x N");
  check(t.oom_recoveries >= 1, "OOM recoveries " + std::to_string(t.oom_recoveries) + " >= 1");
  check(executor.plan().micro_batch < planned_micro_batch,
        "re-planned microbatch " + std::to_string(executor.plan().micro_batch) + " < planned " +
            std::to_string(planned_micro_batch));
  check(std::filesystem::exists(plan_out) && read_plan_file(plan_out).micro_batch == executor.plan().micro_batch,
        "the re-planned plan was written to " + plan_out);
  check(t.peak_bytes && *t.peak_bytes <= kBudgetBytes,
        "peak " + format_bytes(t.peak_bytes.value_or(0)) + " within the " + format_bytes(kBudgetBytes) + " budget");
  char buf[128];
  std::snprintf(buf, sizeof buf, "loss per token fell: epoch 0 %.4f -> epoch %lld %.4f", epoch_loss.front(),
                static_cast<long long>(kEpochs - 1), epoch_loss.back());
  check(epoch_loss.back() < epoch_loss.front(), buf);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string out_dir = argc > 1 ? argv[1] : "trainer-out";
  std::filesystem::create_directories(out_dir);
  try {
    auto probe = make_memory_probe({"cpu", "cpu-counting", std::nullopt});

    // 1. Measure and plan, exactly as `accumplan --model builtin:tinylm ...` does.
    const Setup setup = tinylm_setup();
    const Plan plan = measure_and_plan(*probe, setup);
    std::cout << describe_plan(plan);

    // 2. A fresh model and optimizer; the executor on the plan, OOM recovery on.
    LoadedModel model = load_model("builtin:tinylm", torch::kCPU);
    auto optimizer = make_optimizer(setup, trainable_parameters(model.module));
    int64_t scheduler_steps = 0;
    const ExecutorOptions eo = executor_options(setup, probe.get(), out_dir, scheduler_steps);
    Executor executor(model.module, *optimizer, plan, eo);

    const Batch data = make_data(kSamples, setup.ignore_index);
    probe->set_budget_bytes(kBudgetBytes);
    const int64_t planned_micro_batch = plan.micro_batch;
    const std::vector<double> epoch_loss = train_epochs(executor, *probe, plan, data);

    // 3. What the run promised.
    check_promises(executor, eo.plan_out, scheduler_steps, planned_micro_batch, epoch_loss);
    return failures == 0 ? 0 : 1;
  } catch (const Error& e) {
    std::cerr << "trainer: error: " << e.what() << "\n";
    return e.exit_code();
  } catch (const std::exception& e) {
    std::cerr << "trainer: internal error: " << e.what() << "\n";
    return 1;
  }
}
