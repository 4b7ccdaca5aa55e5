// test_warm_up.cpp — Executor::warm_up, the one forward and backward `accumplan run` makes before
// its first window so that window runs TorchScript's optimized graph, as every later one does.
//
// What it is: the warm-up must change nothing a user could see — a window stepped after it gives
// the parameters (to rounding), and bitwise the buffers (BatchNorm running statistics), loss and
// random stream, of the same window stepped without it, through dropout; and after it a window's measured peak (the
// CPU counting allocator) equals the same window's peak measured again.
// What it is not: a test of TorchScript's executor. Whether a first call allocates less depends
// on the LibTorch version and the model; the figure is reported, not asserted.
#include <torch/torch.h>

#include "accumplan/memory_probe.h"
#include "cpu_counting_probe.h"
#include "executor/executor.h"
#include "executor_fixtures.h"

// Last: torch/torch.h brings glog's CHECK macro, which would shadow Catch's.
#include "catch_after_torch.h"

using namespace accumplan;
using namespace accumplan::test;

namespace {

// x [B,4] -> batch_norm (training statistics, running buffers updated) -> dropout(0.5) -> linear
// -> tanh -> linear -> [B,3]: every piece of state a forward can change besides the gradients.
torch::jit::Module make_stateful_model() {
  torch::manual_seed(21);
  torch::jit::Module m("StatefulNet");
  m.register_parameter("gamma", torch::ones({4}).requires_grad_(), false);
  m.register_parameter("beta", torch::zeros({4}).requires_grad_(), false);
  m.register_buffer("running_mean", torch::zeros({4}));
  m.register_buffer("running_var", torch::ones({4}));
  m.register_parameter("w1", (torch::randn({16, 4}) * 0.5).requires_grad_(), false);
  m.register_parameter("w2", (torch::randn({3, 16}) * 0.5).requires_grad_(), false);
  m.define(R"(
def forward(self, x):
    h = torch.batch_norm(x, self.gamma, self.beta, self.running_mean, self.running_var, True, 0.1, 1e-5, False)
    h = torch.dropout(h, 0.5, True)
    h = torch.tanh(torch.matmul(h, self.w1.t()))
    return torch.matmul(h, self.w2.t())
)");
  m.train();
  return m;
}

struct After {
  std::vector<at::Tensor> params, buffers;
  double loss = 0;
  at::Tensor next_random;  // the first draw of the random stream after the window
  std::vector<int64_t> peaks;
};

// `windows` steps of `window` through a fresh copy of `model` (SGD 0.1), warmed up first or not.
After run(const torch::jit::Module& model, const Batch& window, bool warm, int windows = 1, MemoryProbe* probe = nullptr) {
  auto m = clone_module(model);
  auto params = params_of(m);
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1));
  ExecutorOptions o;
  o.probe = probe;
  Executor ex(m, opt, make_plan_with({3, 3}), o);
  torch::manual_seed(5);
  if (warm) ex.warm_up(window);
  After a;
  for (int i = 0; i < windows; ++i) {
    const WindowStats st = ex.step(window);
    a.loss = st.loss;
    if (st.peak_bytes) a.peaks.push_back(*st.peak_bytes);
  }
  a.next_random = torch::rand({4});
  a.params = values_of(params);
  for (const auto& b : m.named_buffers(true)) a.buffers.push_back(b.value.clone());
  return a;
}

Batch stateful_batch() {
  torch::manual_seed(31);
  Batch b;
  b.inputs = {torch::randn({6, 4})};
  b.target = torch::randint(0, 3, {6}, torch::kLong);
  return b;
}

}  // namespace

TEST_CASE("Warm-up: a window after it is the window without it (parameters, buffers, loss, dropout's stream)",
          "[executor][warm_up]") {
  const torch::jit::Module model = make_stateful_model();
  const Batch window = stateful_batch();
  const After cold = run(model, window, false);
  const After warm = run(model, window, true);
  CHECK(warm.loss == cold.loss);
  REQUIRE(warm.params.size() == cold.params.size());
  // Not bitwise: the warmed window's backward is the optimized graph's autodiff, the cold one's
  // the profiling graph's autograd; the two sum in another order (here up to ~1e-8). A leaked
  // dropout mask or BatchNorm update would differ by the size of the update itself.
  for (size_t i = 0; i < cold.params.size(); ++i) CHECK(torch::allclose(warm.params[i], cold.params[i], 1e-6, 1e-7));
  REQUIRE(cold.buffers.size() == 2);
  REQUIRE(warm.buffers.size() == 2);
  for (size_t i = 0; i < cold.buffers.size(); ++i) CHECK(torch::equal(warm.buffers[i], cold.buffers[i]));
  // The running mean moved from zero: the window's own forward updated it, once, in both runs.
  CHECK(cold.buffers[0].abs().sum().item<double>() > 0);
  CHECK(torch::equal(warm.next_random, cold.next_random));
}

TEST_CASE("Warm-up: the first window's measured peak is the same window's peak measured again", "[executor][warm_up]") {
  auto probe = make_memory_probe({"cpu", "cpu-counting", std::nullopt});
  const torch::jit::Module model = make_stateful_model();
  const Batch window = stateful_batch();
  const After cold = run(model, window, false, 3, probe.get());
  const After warm = run(model, window, true, 3, probe.get());
  REQUIRE(warm.peaks.size() == 3);
  CHECK(warm.peaks[0] == warm.peaks[1]);
  CHECK(warm.peaks[1] == warm.peaks[2]);
  INFO("without the warm-up, first window " << cold.peaks[0] << " B, second " << cold.peaks[1] << " B");
  SUCCEED("first window without a warm-up: " + std::to_string(cold.peaks[0] - cold.peaks[1]) + " B against the second");
}
