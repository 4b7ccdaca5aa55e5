// test_cli_probability_targets.cpp — `--loss cross_entropy --target float32[B,C]` end to end, through
// the real binary: a scripted MLP is profiled and planned with a probability target (synthetic
// rows), `accumplan run --data` on real probability targets takes one [4,3,3] window whose step
// equals one full-batch SGD step of ATen's soft-target cross-entropy over all 10 samples, and a
// data file whose rows are no distributions is refused naming the row, before anything runs.
//
// What it is not: the loss's unit tests (tests/runtime/test_probability_targets.cpp).
#include <torch/script.h>
#include <torch/torch.h>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "executor_fixtures.h"
#include "torch_save_file.h"

// Last: torch/torch.h brings glog's CHECK macro, which would shadow Catch's.
#include "catch_after_torch.h"

#include "cli_expect.h"  // after Catch

using namespace accumplan::test;
using nlohmann::json;

namespace {

constexpr double kLr = 0.5;

// The inputs [10,6] and probability targets [10,3] of one window: softmax rows, one one-hot row,
// one label-smoothed row.
std::pair<at::Tensor, at::Tensor> probability_window() {
  torch::manual_seed(21);
  const at::Tensor x = torch::randn({10, 6});
  at::Tensor probs = torch::softmax(2 * torch::randn({10, 3}), 1);
  probs[0] = torch::tensor({0.0f, 0.0f, 1.0f});
  probs[1] = torch::tensor({0.05f, 0.9f, 0.05f});
  return {x, probs};
}

std::vector<at::Tensor> parameters_of(const torch::jit::Module& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

}  // namespace

TEST_CASE("CLI probability targets: profile and plan with --target float32[B,C], then run equals one full-batch step",
          "[cli][run][probabilities]") {
  const std::string dir = scratch_dir("probability-targets-" + std::to_string(::getpid()));
  const std::string model = dir + "/mlp.pt", plan = dir + "/plan.json", data = dir + "/data.pt",
                    saved = dir + "/trained.pt", stats = dir + "/stats.json";
  make_mlp(1).save(model);  // x [B,6] -> logits [B,3]
  const auto [x, probs] = probability_window();
  write_torch_save(data, {x, probs});

  // Profile and plan on synthetic probability rows; --max-micro-batch 4 splits 10 as 4,3,3.
  const CliResult p = run_cli({"--model", model, "--target-batch", "10", "--input", "float32[B,6]", "--target",
                               "float32[B,3]", "--loss", "cross_entropy", "--device", "cpu", "--memory-budget", "256MiB",
                               "--optimizer", "sgd", "--lr", "0.5", "--max-micro-batch", "4", "--threads", "1",
                               "--progress", "none", "--out", plan});
  INFO(p.err);
  REQUIRE(p.exit_code == 0);
  const json pj = json::parse(slurp(plan));
  REQUIRE(pj["microbatch_sizes"].get<std::vector<int64_t>>() == std::vector<int64_t>{4, 3, 3});
  CHECK(pj["setup"]["target"] == "float32[B,3]");

  const CliResult r = run_cli({"run", "--plan", plan, "--model", model, "--data", data, "--steps", "1", "--threads", "1",
                               "--stats", stats, "--save", saved});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const json s = json::parse(slurp(stats));
  CHECK(s["normalization"] == "samples");  // "auto" read the dtype: [B,C] probabilities are no tokens
  CHECK(s["optimizer_steps"] == 1);
  CHECK(s["samples_seen"] == 10);

  // The reference: one forward/backward over all 10 samples with ATen's soft-target cross-entropy
  // (mean over samples), one SGD step — not through loss.cpp or the executor.
  torch::jit::Module ref = torch::jit::load(model);
  ref.train();
  const at::Tensor logits = ref.forward({x}).toTensor();
  at::cross_entropy_loss(logits, probs, {}, at::Reduction::Mean).backward();
  std::vector<at::Tensor> want;
  for (const auto& q : ref.parameters()) want.push_back((q - kLr * q.grad()).detach());
  const std::vector<at::Tensor> got = parameters_of(torch::jit::load(saved));
  const std::vector<at::Tensor> before = parameters_of(torch::jit::load(model));
  REQUIRE(got.size() == want.size());
  double worst = 0, moved = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, (got[i] - want[i]).abs().max().item<double>());
    moved = std::max(moved, (got[i] - before[i]).abs().max().item<double>());
  }
  report("run [4,3,3] probability targets vs full-batch step: max |param diff|", worst);
  CHECK(worst <= 1e-6);
  CHECK(moved > 1e-3);  // the step moved the parameters: the comparison could fail
}

TEST_CASE("CLI probability targets: rows that are no distribution are refused naming the row, before any step",
          "[cli][run][probabilities][errors]") {
  const std::string dir = scratch_dir("probability-bad-rows-" + std::to_string(::getpid()));
  const std::string model = dir + "/mlp.pt", plan = dir + "/plan.json";
  make_mlp(1).save(model);
  auto [x, probs] = probability_window();
  at::Tensor negative = probs.clone();
  negative[6][0] = -0.1;
  negative[6][1] = negative[6][1] + 0.1;  // still sums to 1
  at::Tensor short_row = probs.clone();
  short_row[7] *= 0.7;
  const std::string bad_negative = write_torch_save(dir + "/negative.pt", {x, negative});
  const std::string bad_sum = write_torch_save(dir + "/short.pt", {x, short_row});

  // The profiler's --batch-file is checked before anything is measured.
  expect_input_error({"--model", model, "--target-batch", "10", "--batch-file", bad_sum, "--device", "cpu",
                      "--memory-budget", "256MiB", "--progress", "none", "--out", plan},
                     "the target (class probabilities): row 7 sums to 0.7, not 1");
  // `run --data` likewise, on a plan made from the good data.
  const std::string good = write_torch_save(dir + "/good.pt", {x, probs});
  const CliResult p = run_cli({"--model", model, "--target-batch", "10", "--batch-file", good, "--device", "cpu",
                               "--memory-budget", "256MiB", "--max-micro-batch", "4", "--threads", "1", "--progress",
                               "none", "--out", plan});
  INFO(p.err);
  REQUIRE(p.exit_code == 0);
  expect_input_error({"run", "--plan", plan, "--model", model, "--data", bad_negative, "--steps", "1"},
                     "': the target (class probabilities): row 6 holds -0.1 for class 0");
  expect_input_error({"run", "--plan", plan, "--model", model, "--data", bad_sum, "--steps", "1"},
                     "row 7 sums to 0.7, not 1");
}
