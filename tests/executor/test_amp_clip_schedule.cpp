// test_amp_clip_schedule.cpp — fp16 loss scaling, bf16 autocast, clipping of the combined
// gradient, scheduler gating and epoch step counts.
//
// What it is: the "Mixed precision", "clip the combined gradient", "a scheduler advances only
// when the optimizer really stepped" and "last window with its own N" rules of docs/weighting.md, each
// against an independent reference (torch::nn::utils::clip_grad_norm_ on the full-batch gradient;
// counts computed by hand) and each with a comparison that a wrong implementation fails.
// What it is not: a CUDA test. On CPU the fp16 path keeps the forward in float32 (1.13 CPU
// autocast is bf16-only) and exercises the scaler's CPU fallback; CUDA uses ATen's _amp_* ops.
#include <torch/torch.h>

#include <cmath>

#include "runtime/amp.h"
#include "executor/executor.h"
#include "executor/verify.h"
#include "executor_fixtures.h"

// Last: torch/torch.h brings glog's CHECK macro, which would shadow Catch's.
#include "catch_after_torch.h"

using namespace accumplan;
using namespace accumplan::test;

namespace {

}  // namespace

TEST_CASE("fp16: a non-finite gradient skips the step, the scheduler does not advance, the scale backs off",
          "[amp][fp16]") {
  auto model = make_mlp();
  auto params = params_of(model);
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1));
  int64_t scheduler_steps = 0;
  std::vector<int64_t> lr_asked;
  std::vector<std::string> lines;
  ExecutorOptions o;
  o.amp = AmpMode::FP16;
  o.scaler.init_scale = 65536.0;
  o.scaler.growth_interval = 2;
  o.on_step = [&](const StepEvent&) { ++scheduler_steps; };
  o.lr_schedule = [&](int64_t k) {
    lr_asked.push_back(k);
    return 0.1;
  };
  o.log = [&](const std::string& l) { lines.push_back(l); };
  Executor ex(model, opt, make_plan_with({4, 4, 4}), o);

  Batch bad = classification_batch(12);
  bad.inputs[0][9][2] = std::numeric_limits<float>::quiet_NaN();  // one sample of microbatch 3
  const auto before = values_of(params);
  const WindowStats st = ex.step(bad);
  CHECK(st.skipped);
  CHECK_FALSE(st.stepped);
  CHECK(st.loss_scale == 65536.0);
  CHECK(ex.loss_scale() == 32768.0);  // backoff 0.5
  CHECK(scheduler_steps == 0);
  CHECK(lr_asked.empty());
  CHECK(ex.totals().skipped_steps == 1);
  CHECK(ex.totals().optimizer_steps == 0);
  CHECK(compare_tensors(values_of(params), before).max_abs == 0.0);  // parameters untouched
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("skipped") != std::string::npos);
  CHECK(lines[0].find("scheduler does not advance") != std::string::npos);

  // Two clean windows: each steps and advances the scheduler; the second one grows the scale
  // (growth_interval 2): 32768 -> 65536.
  const Batch good = classification_batch(12, 21);
  CHECK(ex.step(good).stepped);
  CHECK(ex.loss_scale() == 32768.0);
  CHECK(ex.step(good).stepped);
  CHECK(ex.loss_scale() == 65536.0);
  CHECK(scheduler_steps == 2);
  CHECK(lr_asked == std::vector<int64_t>{0, 1});
  CHECK(ex.totals().optimizer_steps == 2);
  CHECK(ex.totals().windows == 3);
}

TEST_CASE("fp16: gradients are unscaled once — they equal the float32 full-batch gradient", "[amp][fp16]") {
  const auto model = make_mlp();
  const Batch window = classification_batch(26);
  const auto ref = reference_gradients(clone_module(model), window, "ce");
  auto m = clone_module(model);
  auto params = params_of(m);
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1));
  ExecutorOptions o;
  o.amp = AmpMode::FP16;
  Executor ex(m, opt, make_plan_with({8, 8, 8, 2}), o);
  const WindowStats st = ex.accumulate(window);
  CHECK_FALSE(st.skipped);
  const double rel = compare_tensors(gradients_of(m), ref).max_rel;
  report("fp16 scaler (CPU, float32 forward) 8,8,8,2: max rel grad diff after unscale", rel);
  CHECK(rel <= 1e-5);
  // Had the gradient not been unscaled it would be 65536 times the reference.
  CHECK(gradients_of(m)[0].abs().max().item<double>() < 10 * ref[0].abs().max().item<double>());
}

TEST_CASE("clipping the combined gradient matches clipping the full-batch gradient", "[clip]") {
  const auto model = make_mlp();
  const Batch window = classification_batch(26);
  auto ref = reference_gradients(clone_module(model), window, "ce");
  // Reference: LibTorch's clip_grad_norm_ on the full-batch gradient.
  auto ref_model = clone_module(model);
  auto ref_params = params_of(ref_model);
  for (size_t i = 0; i < ref_params.size(); ++i) ref_params[i].mutable_grad() = ref[i].clone();
  const double full_norm = torch::nn::utils::clip_grad_norm_(ref_params, 0.05);
  REQUIRE(full_norm > 0.05 * 2);  // the clip really bites (norm well above the limit)
  const auto clipped_ref = gradients_of(ref_model);

  for (const AmpMode amp : {AmpMode::None, AmpMode::FP16}) {
    auto m = clone_module(model);
    auto params = params_of(m);
    torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1));
    ExecutorOptions o;
    o.amp = amp;
    o.max_grad_norm = 0.05;
    Executor ex(m, opt, make_plan_with({8, 8, 8, 2}), o);
    const WindowStats st = ex.accumulate(window);
    CHECK(st.grad_norm == Approx(full_norm).epsilon(1e-5));
    const double rel = compare_tensors(gradients_of(m), clipped_ref).max_rel;
    report("clip 0.05 of combined gradient (" + to_string(amp) + "): max rel diff vs clipped full batch", rel);
    CHECK(rel <= 1e-5);
  }

  // Clipping each microbatch's contribution separately is a different update.
  auto m = clone_module(model);
  auto params = params_of(m);
  std::vector<at::Tensor> sum;
  int64_t start = 0;
  for (const int64_t n : {8, 8, 8, 2}) {
    const Batch mb = window.slice(start, n);
    start += n;
    for (auto& p : params) p.mutable_grad() = at::Tensor();
    (at::cross_entropy_loss(m.forward({mb.inputs[0]}).toTensor(), mb.target, {}, at::Reduction::Sum) / 26.0).backward();
    torch::nn::utils::clip_grad_norm_(params, 0.05);
    const auto g = gradients_of(m);
    if (sum.empty()) {
      sum = g;
    } else {
      for (size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
    }
  }
  const double wrong = compare_tensors(sum, clipped_ref).max_rel;
  report("clip per microbatch: max rel diff vs clipped full batch", wrong);
  CHECK(wrong > 1e-3);
}

TEST_CASE("bf16 autocast: close to float32, float gradients, autocast restored", "[amp][bf16]") {
  const auto model = make_mlp(1, 16, 32, 5);
  const Batch window = classification_batch(24, 31, 16, 5);
  double ref_loss = 0;
  const auto ref = reference_gradients(clone_module(model), window, "ce", -100, &ref_loss);
  auto m = clone_module(model);
  auto params = params_of(m);
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1));
  ExecutorOptions o;
  o.amp = AmpMode::BF16;
  Executor ex(m, opt, make_plan_with({8, 8, 8}), o);
  REQUIRE_FALSE(cpu_autocast_enabled());
  const WindowStats st = ex.accumulate(window);
  CHECK_FALSE(cpu_autocast_enabled());
  for (const auto& p : params) {
    REQUIRE(p.grad().defined());
    CHECK(p.grad().scalar_type() == at::kFloat);
  }
  const double rel = compare_tensors(gradients_of(m), ref).max_rel;
  report("bf16 autocast 8,8,8: max rel grad diff vs float32 full batch", rel);
  report("bf16 autocast: |loss_bf16 - loss_fp32| / loss_fp32", std::abs(st.loss - ref_loss) / ref_loss);
  CHECK(rel < 5e-2);        // bf16 keeps 8 bits of mantissa: about 2-3 significant digits
  CHECK(st.loss != ref_loss);  // and autocast really ran: the float32 loss is not reproduced bit for bit
  CHECK(std::abs(st.loss - ref_loss) / ref_loss < 2e-2);
}

TEST_CASE("an epoch of N samples with target B: ceil(N/B) optimizer steps and as many scheduler steps",
          "[epoch]") {
  for (const auto& [N, B] : std::vector<std::pair<int64_t, int64_t>>{{50, 16}, {48, 16}, {5, 16}}) {
    auto model = make_mlp();
    auto params = params_of(model);
    torch::optim::SGD opt(params, torch::optim::SGDOptions(0.05));
    int64_t scheduler_steps = 0;
    ExecutorOptions o;
    o.on_step = [&](const StepEvent&) { ++scheduler_steps; };
    Executor ex(model, opt, make_plan_with({6, 5, 5}), o);
    REQUIRE(ex.plan().per_rank_batch == B);
    const Batch data = classification_batch(N, 41);
    std::vector<int64_t> window_samples;
    for (const auto& [start, count] : epoch_windows(N, B)) {
      const WindowStats st = ex.step(data.slice(start, count));
      window_samples.push_back(st.samples);
      CHECK(st.units == count);
    }
    const int64_t expected = (N + B - 1) / B;
    INFO("N=" << N << " B=" << B);
    CHECK(ex.totals().optimizer_steps == expected);
    CHECK(scheduler_steps == expected);
    CHECK(ex.totals().samples_seen == N);
    CHECK(ex.totals().windows == expected);
  }
  CHECK(epoch_windows(50, 16) == std::vector<std::pair<int64_t, int64_t>>{{0, 16}, {16, 16}, {32, 16}, {48, 2}});
}
