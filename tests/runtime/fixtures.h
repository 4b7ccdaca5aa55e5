// tests/runtime/fixtures.h — small TorchScript models built in the tests, and a CPU probe.
//
// What it is: an MLP and a small convolutional net defined in C++ (no files, no Python), handed
// to the ProbeRunner as loaders so that their parameters are allocated under the probe, and the
// byte counts every test compares against. What it is not: the built-in examples (those are
// src/runtime/model.cpp's; these are sized for fast tests and can change with them).
#pragma once

#include <torch/script.h>

#include <memory>

#include "accumplan/memory_probe.h"
#include "runtime/model.h"

namespace accumplan::test {

// in → hidden → hidden → out, ReLU; parameters U(-0.05, 0.05).
inline LoadedModel make_test_mlp(int64_t in, int64_t hidden, int64_t out) {
  torch::jit::Module m("TestMLP");
  if (!m.hasattr("training")) m.register_attribute("training", c10::BoolType::get(), true);
  const int64_t dims[] = {in, hidden, hidden, out};
  for (int i = 0; i < 3; ++i) {
    m.register_parameter("w" + std::to_string(i), at::rand({dims[i + 1], dims[i]}).sub_(0.5).mul_(0.1).requires_grad_(), false);
    m.register_parameter("b" + std::to_string(i), at::zeros({dims[i + 1]}).requires_grad_(), false);
  }
  m.define(R"(
def forward(self, x):
    h = torch.relu(torch.addmm(self.b0, x, self.w0.t()))
    h = torch.relu(torch.addmm(self.b1, h, self.w1.t()))
    return torch.addmm(self.b2, h, self.w2.t())
)");
  m.train(true);
  LoadedModel lm{m, {}};
  lm.info.path = "test:mlp";
  for (const auto& p : m.parameters()) lm.info.parameter_count += p.numel();
  return lm;
}

// [B,3,16,16] → conv3x3(3→16)+ReLU → conv3x3(16→16)+ReLU → mean over pixels → linear 16→10.
inline LoadedModel make_test_convnet() {
  torch::jit::Module m("TestConvNet");
  if (!m.hasattr("training")) m.register_attribute("training", c10::BoolType::get(), true);
  m.register_parameter("c1_w", at::rand({16, 3, 3, 3}).sub_(0.5).mul_(0.2).requires_grad_(), false);
  m.register_parameter("c1_b", at::zeros({16}).requires_grad_(), false);
  m.register_parameter("c2_w", at::rand({16, 16, 3, 3}).sub_(0.5).mul_(0.2).requires_grad_(), false);
  m.register_parameter("c2_b", at::zeros({16}).requires_grad_(), false);
  m.register_parameter("fc_w", at::rand({10, 16}).sub_(0.5).mul_(0.2).requires_grad_(), false);
  m.register_parameter("fc_b", at::zeros({10}).requires_grad_(), false);
  m.define(R"(
def forward(self, x):
    h = torch.relu(torch.conv2d(x, self.c1_w, self.c1_b, [1, 1], [1, 1]))
    h = torch.relu(torch.conv2d(h, self.c2_w, self.c2_b, [1, 1], [1, 1]))
    h = torch.mean(h, [2, 3])
    return torch.addmm(self.fc_b, h, self.fc_w.t())
)");
  m.train(true);
  LoadedModel lm{m, {}};
  lm.info.path = "test:convnet";
  for (const auto& p : m.parameters()) lm.info.parameter_count += p.numel();
  return lm;
}

inline std::unique_ptr<MemoryProbe> cpu_probe() {
  ProbeRequest r;
  r.device = "cpu";
  r.backend = "cpu-counting";
  return make_memory_probe(r);
}

}  // namespace accumplan::test
