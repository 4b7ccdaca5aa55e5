// executor_fixtures.h — tiny TorchScript models, plans and independent reference gradients for the
// executor tests.
//
// What it is: models built in C++ (no Python, no files) small enough that a whole test run takes
// seconds on 2 cores; plans with hand-chosen microbatch sizes; and full-batch reference gradients
// computed with ATen's own mean-reduced losses (at::cross_entropy_loss with ignore_index divides
// by the valid count, at::mse_loss by the element count) — deliberately NOT through loss.cpp or
// the executor, so a weighting bug in either cannot hide in the reference.
// What it is not: a test; and not a reusable library (everything is inline and test-only).
#pragma once

#include <torch/script.h>
#include <torch/torch.h>

#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "accumplan/schema.h"
#include "accumplan/solver.h"
#include "executor/verify.h"
#include "runtime/batch.h"

namespace accumplan::test {

// x [B,6] -> tanh(x W1^T + b1) W2^T + b2 -> [B,3]. Seeded, so every call builds the same weights.
inline torch::jit::Module make_mlp(uint64_t seed = 1, int64_t in = 6, int64_t hidden = 8, int64_t out = 3) {
  torch::manual_seed(seed);
  torch::jit::Module m("Mlp");
  m.register_parameter("w1", (torch::randn({hidden, in}) * 0.5).requires_grad_(), false);
  m.register_parameter("b1", (torch::randn({hidden}) * 0.1).requires_grad_(), false);
  m.register_parameter("w2", (torch::randn({out, hidden}) * 0.5).requires_grad_(), false);
  m.register_parameter("b2", (torch::randn({out}) * 0.1).requires_grad_(), false);
  m.define(R"(
def forward(self, x):
    h = torch.tanh(torch.matmul(x, self.w1.t()) + self.b1)
    return torch.matmul(h, self.w2.t()) + self.b2
)");
  m.train();
  return m;
}

// Tokens x int64 [B,L] in [0,V) -> [B,L,V] logits: tanh(embedding) @ out.
inline torch::jit::Module make_tiny_lm(uint64_t seed = 2, int64_t vocab = 7, int64_t dim = 5) {
  torch::manual_seed(seed);
  torch::jit::Module m("TinyLm");
  m.register_parameter("emb", (torch::randn({vocab, dim}) * 0.7).requires_grad_(), false);
  m.register_parameter("out", (torch::randn({dim, vocab}) * 0.7).requires_grad_(), false);
  m.define(R"(
def forward(self, x):
    e = torch.embedding(self.emb, x)
    return torch.matmul(torch.tanh(e), self.out)
)");
  m.train();
  return m;
}

// forward(x, y) returns the microbatch's mean squared error: the "model" loss kind.
inline torch::jit::Module make_self_loss_model(uint64_t seed = 3) {
  torch::manual_seed(seed);
  torch::jit::Module m("SelfLoss");
  m.register_parameter("w", (torch::randn({2, 4}) * 0.5).requires_grad_(), false);
  m.define(R"(
def forward(self, x, y):
    out = torch.tanh(torch.matmul(x, self.w.t()))
    return torch.mean((out - y) * (out - y))
)");
  m.train();
  return m;
}

// x [B,4] -> batch_norm (training statistics) -> linear -> [B,3]. Batch-dependent on purpose.
inline torch::jit::Module make_batchnorm_model(uint64_t seed = 4) {
  torch::manual_seed(seed);
  torch::jit::Module m("BnNet");
  m.register_parameter("gamma", torch::ones({4}).requires_grad_(), false);
  m.register_parameter("beta", torch::zeros({4}).requires_grad_(), false);
  m.register_buffer("running_mean", torch::zeros({4}));
  m.register_buffer("running_var", torch::ones({4}));
  m.register_parameter("w", (torch::randn({3, 4}) * 0.5).requires_grad_(), false);
  m.define(R"(
def forward(self, x):
    h = torch.batch_norm(x, self.gamma, self.beta, self.running_mean, self.running_var, True, 0.1, 1e-5, False)
    return torch.matmul(h, self.w.t())
)");
  m.train();
  return m;
}

inline Plan make_plan_with(std::vector<int64_t> sizes, const std::string& loss = "cross_entropy") {
  Plan p;
  p.per_rank_batch = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  p.target_batch = p.per_rank_batch;
  p.world_size = 1;
  const int64_t largest = *std::max_element(sizes.begin(), sizes.end());
  set_window(p, std::move(sizes), largest);
  p.setup.loss = loss;
  p.reason = "test plan.";
  return p;
}

inline Batch classification_batch(int64_t n, uint64_t seed = 11, int64_t in = 6, int64_t classes = 3) {
  torch::manual_seed(seed);
  Batch b;
  b.inputs = {torch::randn({n, in})};
  b.target = torch::randint(0, classes, {n}, torch::kLong);
  return b;
}

inline Batch regression_batch(int64_t n, uint64_t seed = 12, int64_t in = 6, int64_t out = 3) {
  torch::manual_seed(seed);
  Batch b;
  b.inputs = {torch::randn({n, in})};
  b.target = torch::randn({n, out});
  return b;
}

inline Batch token_batch(int64_t n, int64_t len = 8, uint64_t seed = 13, int64_t vocab = 7) {
  torch::manual_seed(seed);
  Batch b;
  b.inputs = {torch::randint(0, vocab, {n, len}, torch::kLong)};
  b.target = torch::randint(0, vocab, {n, len}, torch::kLong);
  return b;
}

// The reference: gradients of ATen's own mean-reduced loss over the whole window.
//   "ce"        at::cross_entropy_loss, mean over samples ([B,C] logits)
//   "ce_tokens" at::cross_entropy_loss over [B*L,V] with ignore_index: mean over valid tokens
//   "mse"       at::mse_loss, mean over every element (equal elements per sample)
//   "model"     the model's own mean loss of the whole window
inline std::vector<at::Tensor> reference_gradients(torch::jit::Module module, const Batch& window,
                                                   const std::string& kind, int64_t ignore_index = -100,
                                                   double* loss_out = nullptr) {
  for (auto p : module.parameters()) {
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
  }
  at::Tensor loss;
  if (kind == "model") {
    loss = module.forward({window.inputs[0], window.target}).toTensor();
  } else {
    const at::Tensor out = module.forward({window.inputs[0]}).toTensor();
    if (kind == "ce") {
      loss = at::cross_entropy_loss(out, window.target);
    } else if (kind == "ce_tokens") {
      loss = at::cross_entropy_loss(out.reshape({-1, out.size(-1)}), window.target.reshape({-1}), {},
                                    at::Reduction::Mean, ignore_index);
    } else {
      loss = at::mse_loss(out, window.target);
    }
  }
  if (loss_out) *loss_out = loss.item<double>();
  loss.backward();
  auto g = gradients_of(module);
  for (auto p : module.parameters()) {
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
  }
  return g;
}

// Prints a figure for the report; Catch does not capture stdout.
inline void report(const std::string& what, double value) {
  std::printf("[figure] %-70s %.3e\n", what.c_str(), value);
  std::fflush(stdout);
}

// The module's parameters (live tensors), and detached copies of their values.
inline std::vector<at::Tensor> params_of(const torch::jit::Module& m) {
  std::vector<at::Tensor> v;
  for (const auto& p : m.parameters()) v.push_back(p);
  return v;
}

inline std::vector<at::Tensor> values_of(const std::vector<at::Tensor>& ps) {
  std::vector<at::Tensor> v;
  for (const auto& p : ps) v.push_back(p.detach().clone());
  return v;
}

}  // namespace accumplan::test
