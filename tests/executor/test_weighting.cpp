// test_weighting.cpp — accumulated gradients equal full-batch gradients (docs/weighting.md "The
// rule"), and the same comparison rejects the weightings public trainers got wrong.
//
// What it is: for equal, unequal, partial-last-window and per-token windows, the executor's
// accumulated gradient against ATen's mean-reduced loss over the whole window (relative
// difference max|a-b|/max|b| <= 1e-5 in float32), and for each the wrong recipe (mean of
// microbatch means; dividing by the plan's k on a short window) measured by the SAME helper and
// required to exceed 1e-3 — so these tests can fail.
// What it is not: a test of loss.cpp's per-loss arithmetic (that has its own tests).
#include <torch/torch.h>

#include "executor/executor.h"
#include "executor/verify.h"
#include "executor_fixtures.h"

// Last: torch/torch.h brings glog's CHECK macro, which would shadow Catch's.
#include "catch_after_torch.h"

using namespace accumplan;
using namespace accumplan::test;

namespace {

constexpr double kTol = 1e-5;    // float32 sums in a different order
constexpr double kWrong = 1e-3;  // a wrong weighting must miss by far more than rounding

struct Run {
  GradientComparison cmp;
  WindowStats stats;
};

// Accumulates `window` through an Executor built on a copy of `model` and compares with the
// reference gradient of the whole window.
Run accumulate_and_compare(const torch::jit::Module& model, const Plan& plan, const Batch& window, const LossConfig& loss,
                           const std::vector<at::Tensor>& reference) {
  torch::jit::Module m = clone_module(model);
  std::vector<at::Tensor> params;
  for (const auto& p : m.parameters()) params.push_back(p);
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1));
  ExecutorOptions o;
  o.loss = loss;
  Executor ex(m, opt, plan, o);
  Run r;
  r.stats = ex.accumulate(window);
  r.cmp = compare_tensors(gradients_of(m), reference, parameter_names(m));
  return r;
}

}  // namespace

TEST_CASE("equal microbatches: accumulated gradient equals the full-batch gradient", "[weighting]") {
  const auto model = make_mlp();
  const Plan plan = make_plan_with({4, 4, 4});
  const Batch window = classification_batch(12);
  const auto ref = reference_gradients(clone_module(model), window, "ce");
  LossConfig loss;
  const Run r = accumulate_and_compare(model, plan, window, loss, ref);
  report("equal 4,4,4 CE: max rel grad diff", r.cmp.max_rel);
  CHECK(r.stats.microbatch_sizes == std::vector<int64_t>{4, 4, 4});
  CHECK(r.stats.units == 12);
  CHECK(r.cmp.max_rel <= kTol);
  // With equal sizes "mean / k" is the same objective: the helper must agree it passes.
  const auto naive = naive_accumulated_gradients(clone_module(model), window, {4, 4, 4}, loss, NaiveWeighting::MeanOverK, 3);
  CHECK(compare_tensors(naive, ref).max_rel <= kTol);
}

TEST_CASE("unequal microbatches 8,8,8,2: weights n_i/N — the mean of microbatch means fails", "[weighting]") {
  const auto model = make_mlp();
  const Plan plan = make_plan_with({8, 8, 8, 2});
  const Batch window = classification_batch(26);
  double ref_loss = 0;
  const auto ref = reference_gradients(clone_module(model), window, "ce", -100, &ref_loss);
  LossConfig loss;
  const Run r = accumulate_and_compare(model, plan, window, loss, ref);
  report("unequal 8,8,8,2 CE: max rel grad diff", r.cmp.max_rel);
  CHECK(r.cmp.max_rel <= kTol);
  CHECK(r.stats.loss == Approx(ref_loss).epsilon(1e-6));

  const auto wrong = naive_accumulated_gradients(clone_module(model), window, {8, 8, 8, 2}, loss, NaiveWeighting::MeanOverK, 4);
  const double wrong_rel = compare_tensors(wrong, ref).max_rel;
  report("unequal 8,8,8,2 CE: mean of microbatch means, max rel diff", wrong_rel);
  CHECK(wrong_rel > kWrong);
}

TEST_CASE("partial last window uses its own N — dividing by the plan's k fails", "[weighting]") {
  const auto model = make_mlp();
  const Plan plan = make_plan_with({4, 4, 4, 4});  // per-rank batch 16, k = 4
  const Batch window = classification_batch(10);   // the epoch's last 10 samples
  const auto ref = reference_gradients(clone_module(model), window, "ce");
  LossConfig loss;
  const Run r = accumulate_and_compare(model, plan, window, loss, ref);
  report("partial window 10 of 16 (4,3,3): max rel grad diff", r.cmp.max_rel);
  CHECK(r.stats.microbatch_sizes == std::vector<int64_t>{4, 3, 3});
  CHECK(r.stats.units == 10);
  CHECK(r.cmp.max_rel <= kTol);

  const auto wrong = naive_accumulated_gradients(clone_module(model), window, {4, 3, 3}, loss, NaiveWeighting::MeanOverK, 4);
  const double wrong_rel = compare_tensors(wrong, ref).max_rel;
  report("partial window: dividing by the plan's k=4, max rel diff", wrong_rel);
  CHECK(wrong_rel > kWrong);
}

TEST_CASE("token loss: valid tokens of the whole window, different counts per microbatch", "[weighting]") {
  const auto model = make_tiny_lm();
  const Plan plan = make_plan_with({2, 2, 2});
  Batch window = token_batch(6, 8);
  // Microbatch 0 keeps all 16 tokens, microbatch 1 masks 10 of 16, microbatch 2 masks 15 of 16.
  window.target.narrow(0, 2, 2).narrow(1, 0, 5).fill_(-100);
  window.target.narrow(0, 4, 2).narrow(1, 0, 8).fill_(-100);
  window.target[5][7] = 3;
  const int64_t valid = window.target.ne(-100).sum().item<int64_t>();
  REQUIRE(valid == 16 + 6 + 1);

  double ref_loss = 0;
  const auto ref = reference_gradients(clone_module(model), window, "ce_tokens", -100, &ref_loss);
  LossConfig loss;
  loss.normalization = Normalization::Tokens;
  const Run r = accumulate_and_compare(model, plan, window, loss, ref);
  report("tokens 2,2,2 with 16/6/1 valid: max rel grad diff", r.cmp.max_rel);
  CHECK(r.stats.units == valid);
  CHECK(r.stats.valid_tokens == valid);
  CHECK(r.cmp.max_rel <= kTol);
  CHECK(r.stats.loss == Approx(ref_loss).epsilon(1e-6));

  const auto wrong = naive_accumulated_gradients(clone_module(model), window, {2, 2, 2}, loss, NaiveWeighting::MeanOverK, 3);
  const double wrong_rel = compare_tensors(wrong, ref).max_rel;
  report("tokens: mean of per-microbatch token means, max rel diff", wrong_rel);
  CHECK(wrong_rel > kWrong);
}

TEST_CASE("mse and model-computed losses with unequal microbatches", "[weighting]") {
  SECTION("mse") {
    const auto model = make_mlp();
    const Plan plan = make_plan_with({5, 4, 4}, "mse");
    const Batch window = regression_batch(13);
    const auto ref = reference_gradients(clone_module(model), window, "mse");
    LossConfig loss;
    loss.kind = "mse";
    const Run r = accumulate_and_compare(model, plan, window, loss, ref);
    report("mse 5,4,4: max rel grad diff", r.cmp.max_rel);
    CHECK(r.cmp.max_rel <= kTol);
  }
  SECTION("model returns its mean loss") {
    const auto model = make_self_loss_model();
    const Plan plan = make_plan_with({3, 3, 1}, "model");
    torch::manual_seed(5);
    Batch window;
    window.inputs = {torch::randn({7, 4})};
    window.target = torch::randn({7, 2});
    const auto ref = reference_gradients(clone_module(model), window, "model");
    LossConfig loss;
    loss.kind = "model";
    const Run r = accumulate_and_compare(model, plan, window, loss, ref);
    report("model loss 3,3,1: max rel grad diff", r.cmp.max_rel);
    CHECK(r.cmp.max_rel <= kTol);
  }
}

TEST_CASE("the comparison helper itself can fail", "[weighting]") {
  const auto a = std::vector<at::Tensor>{torch::tensor({1.0f, 2.0f, 3.0f})};
  const auto b = std::vector<at::Tensor>{torch::tensor({1.0f, 2.0f, 3.0001f})};
  CHECK(compare_tensors(a, a).max_rel == 0.0);
  CHECK(compare_tensors(a, b).max_rel == Approx(1e-4 / 3.0001).epsilon(1e-2));
  CHECK_FALSE(compare_tensors(a, b).within(kTol));
  const auto nan = std::vector<at::Tensor>{torch::tensor({1.0f, NAN, 3.0f})};
  CHECK_FALSE(compare_tensors(nan, a).within(kTol));
}

TEST_CASE("one optimizer step per window, gradients set to none at its start", "[weighting]") {
  auto model = make_mlp();
  std::vector<at::Tensor> params;
  for (const auto& p : model.parameters()) params.push_back(p);
  // Stale gradient from "somewhere else": the window must not add to it.
  for (auto& p : params) p.mutable_grad() = torch::full_like(p, 100.0);
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1));
  const Batch window = classification_batch(12);
  const auto ref = reference_gradients(clone_module(model), window, "ce");
  ExecutorOptions o;
  Executor ex(model, opt, make_plan_with({4, 4, 4}), o);
  const auto before = std::vector<at::Tensor>{params[0].detach().clone()};
  WindowStats st = ex.accumulate(window);
  CHECK(compare_tensors(gradients_of(model), ref).max_rel <= kTol);
  ex.apply(st);
  CHECK(st.stepped);
  CHECK(ex.totals().optimizer_steps == 1);
  // SGD: w' = w - 0.1 g, exactly one step.
  const auto expected = std::vector<at::Tensor>{before[0] - 0.1 * ref[0]};
  CHECK(compare_tensors({params[0].detach()}, expected).max_rel <= kTol);
  CHECK_FALSE(params[0].grad().defined());  // zeroed again after the step
}

TEST_CASE("a float64 model's window keeps float64: the accumulated gradient equals the full-batch one to 1e-12",
          "[weighting][float64]") {
  const Plan plan = make_plan_with({5, 4, 3});
  struct Case {
    const char* kind;
    Batch window;
  };
  std::vector<Case> cases{{"ce", classification_batch(12)}, {"mse", regression_batch(12)}};
  for (Case& c : cases) {
    INFO("loss " << c.kind);
    torch::jit::Module model = make_mlp();
    model.to(at::kDouble);
    c.window.inputs[0] = c.window.inputs[0].to(at::kDouble);
    if (std::string(c.kind) == "mse") c.window.target = c.window.target.to(at::kDouble);
    const auto ref = reference_gradients(clone_module(model), c.window, c.kind);
    REQUIRE(ref[0].scalar_type() == at::kDouble);
    LossConfig loss;
    loss.kind = std::string(c.kind) == "ce" ? "cross_entropy" : "mse";
    const Run r = accumulate_and_compare(model, plan, c.window, loss, ref);
    report(std::string("float64 5,4,3 ") + c.kind + ": max rel grad diff", r.cmp.max_rel);
    CHECK(r.cmp.max_rel <= 1e-12);  // a loss summed in float32 misses by about 1e-8
  }
}
