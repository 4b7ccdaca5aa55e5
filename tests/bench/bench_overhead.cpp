// bench/bench_overhead.cpp — executor vs hand loop, interleaved. See bench_overhead.h.
#include "bench_overhead.h"

#include <algorithm>
#include <chrono>

#include <torch/torch.h>

#include "accumplan/solver.h"
#include "executor/executor.h"
#include "runtime/batch.h"
#include "runtime/model.h"
#include "runtime/optim.h"

namespace accumplan::bench {
namespace {

// A small fixed window: 4 microbatches of 4 samples. Overhead matters most when microbatches
// are small (the executor's per-microbatch bookkeeping is then the largest share).
constexpr int64_t kMicro = 4;
constexpr int64_t kSteps = 4;

double seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

nlohmann::ordered_json executor_overhead(const nlohmann::json& m, int rounds) {
  const torch::Device cpu(torch::kCPU);
  const std::string path = m["model"].get<std::string>();
  Setup setup;
  setup.optimizer = "sgd";
  setup.lr = 1e-3;
  setup.loss = "cross_entropy";
  setup.inputs = m["inputs"].get<std::vector<std::string>>();
  setup.target = m["target"].get<std::string>();
  std::vector<TensorSpec> in;
  for (const auto& s : setup.inputs) in.push_back(parse_tensor_spec(s, "input"));
  const TensorSpec target = parse_tensor_spec(setup.target, "target");
  const bool tokens = target.dims.size() > 1;

  // Two copies of the model, each with its own optimizer; the executor and the hand loop swap
  // copies every round, so neither side keeps a copy whose memory placement happens to be faster.
  LoadedModel a = load_model(path, cpu), b = load_model(path, cpu);
  auto opt_a = make_optimizer(setup, trainable_parameters(a.module));
  auto opt_b = make_optimizer(setup, trainable_parameters(b.module));

  Plan plan;
  plan.target_batch = plan.per_rank_batch = kMicro * kSteps;
  set_window(plan, std::vector<int64_t>(kSteps, kMicro), kMicro);
  plan.setup = setup;
  ExecutorOptions options;
  options.loss.kind = "cross_entropy";
  options.loss.normalization = tokens ? Normalization::Tokens : Normalization::Samples;
  options.oom_recovery = false;
  Executor executor_a(a.module, *opt_a, plan, options), executor_b(b.module, *opt_b, plan, options);

  auto hand_window = [&](torch::jit::Module& module, torch::optim::Optimizer& opt, const Batch& w) {
    for (auto& p : trainable_parameters(module)) p.mutable_grad() = at::Tensor();
    const int64_t N = tokens ? w.target.ne(-100).sum().item<int64_t>() : w.size();
    for (int64_t i = 0; i < kSteps; ++i) {
      const Batch mb = w.slice(i * kMicro, kMicro);
      std::vector<torch::jit::IValue> args(mb.inputs.begin(), mb.inputs.end());
      at::Tensor out = module.forward(args).toTensor();
      at::Tensor loss;
      if (tokens) {
        loss = torch::nn::functional::cross_entropy(out.reshape({-1, out.size(-1)}), mb.target.reshape({-1}),
                                                    torch::nn::functional::CrossEntropyFuncOptions()
                                                        .ignore_index(-100)
                                                        .reduction(torch::kSum)) /
               static_cast<double>(N);
      } else {
        loss = torch::nn::functional::cross_entropy(out, mb.target) * (static_cast<double>(kMicro) / N);
      }
      loss.backward();
    }
    opt.step();
  };

  std::vector<double> ta, tb, ratios;
  // One warm-up window each: first calls allocate optimizer state and JIT-profile the graph.
  const Batch warm = synthetic_batch(in, target, kMicro * kSteps, 7, cpu);
  executor_a.step(warm);
  executor_b.step(warm);
  hand_window(a.module, *opt_a, warm);
  hand_window(b.module, *opt_b, warm);
  for (int r = 0; r < rounds; ++r) {
    const Batch w = synthetic_batch(in, target, kMicro * kSteps, 100 + r, cpu);
    Executor& executor = r % 2 == 0 ? executor_a : executor_b;
    torch::jit::Module& hand_module = r % 2 == 0 ? b.module : a.module;
    torch::optim::Optimizer& hand_opt = r % 2 == 0 ? *opt_b : *opt_a;
    double sa = 0, sb = 0;
    // ABBA within each round cancels linear drift.
    for (int k = 0; k < 2; ++k) {
      const bool a_first = (r + k) % 2 == 0;
      for (int side = 0; side < 2; ++side) {
        const bool run_a = (side == 0) == a_first;
        const auto t0 = std::chrono::steady_clock::now();
        if (run_a) {
          executor.step(w);
          sa += seconds(t0);
        } else {
          hand_window(hand_module, hand_opt, w);
          sb += seconds(t0);
        }
      }
    }
    ta.push_back(sa / 2);
    tb.push_back(sb / 2);
    ratios.push_back(sa / sb);
  }
  std::vector<double> sorted = ratios;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted.size() % 2 ? sorted[sorted.size() / 2]
                                          : 0.5 * (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]);
  return nlohmann::ordered_json{{"model", m["name"]},
                                {"window", std::to_string(kSteps) + "x" + std::to_string(kMicro)},
                                {"rounds", rounds},
                                {"executor_seconds", ta},
                                {"hand_loop_seconds", tb},
                                {"ratio_median", median},
                                {"ratio_min", sorted.front()},
                                {"ratio_max", sorted.back()}};
}

}  // namespace accumplan::bench
