// test_oom.cpp — OOM recovery inside a window (docs/oom-contract.md) with the real CPU
// counting allocator: injected faults at every microbatch position (forward and backward), a
// tight budget, repeated OOMs, tokens mode, single-sample failure, recovery off, and the re-plan
// arithmetic itself.
//
// What it is: each recovered window's gradient and parameters after the SGD step are compared
// with a window that never ran out of memory (rel <= 1e-5), samples_seen must count every sample
// once, oom_recoveries must count the events, and the re-planned sizes must be below the failing
// size. The fault hook is MemoryProbe::fail_allocation_after, armed from the executor's
// before_microbatch hook, so the OOM is a real c10::OutOfMemoryError raised by the allocator
// inside TorchScript (which rewraps it as std::runtime_error: the probe's flag identifies it).
// What it is not: a CUDA test, nor a test of the probe's counting (tests/probes/).
#include <torch/torch.h>

#include <filesystem>

#include "accumplan/errors.h"
#include "accumplan/memory_probe.h"
#include "cpu_counting_probe.h"
#include "executor/executor.h"
#include "executor/verify.h"
#include "executor_fixtures.h"
#include "cli_runner.h"

// Last: torch/torch.h brings glog's CHECK macro, which would shadow Catch's.
#include "catch_after_torch.h"

using namespace accumplan;
using namespace accumplan::test;

namespace {

struct Outcome {
  std::vector<at::Tensor> grads;   // the combined gradient the optimizer stepped with
  std::vector<at::Tensor> params;  // parameters after the step
  WindowStats stats;
  ExecutorTotals totals;
  Plan plan;
  std::vector<std::string> log;
};

// One window through a fresh copy of `model` with SGD(0.1); `hook` may arm the probe.
Outcome run_window(const torch::jit::Module& model, const Plan& plan, const Batch& window, const LossConfig& loss,
                   MemoryProbe* probe, std::function<void(const MicrobatchEvent&)> hook = {},
                   const std::string& plan_out = "") {
  auto m = clone_module(model);
  auto params = params_of(m);
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1));
  Outcome out;
  ExecutorOptions o;
  o.loss = loss;
  o.probe = probe;
  o.before_microbatch = std::move(hook);
  o.plan_out = plan_out;
  o.log = [&](const std::string& l) { out.log.push_back(l); };
  o.on_step = [&](const StepEvent&) { out.grads = gradients_of(m); };
  Executor ex(m, opt, plan, o);
  out.stats = ex.step(window);
  out.totals = ex.totals();
  out.plan = ex.plan();
  out.params = values_of(params);
  return out;
}

// Allocations each microbatch of `plan` makes (forward + backward), counted by the probe.
std::vector<int64_t> allocations_per_microbatch(const torch::jit::Module& model, const Plan& plan, const Batch& window,
                                                const LossConfig& loss, CpuCountingProbe& probe) {
  std::vector<int64_t> at_start;
  run_window(model, plan, window, loss, &probe, [&](const MicrobatchEvent&) { at_start.push_back(probe.allocation_count()); });
  std::vector<int64_t> counts;
  for (size_t i = 0; i + 1 < at_start.size(); ++i) counts.push_back(at_start[i + 1] - at_start[i]);
  return counts;  // the last microbatch is bounded by the next one's start, which does not exist
}

}  // namespace

TEST_CASE("OOM injected at each microbatch position gives the no-OOM update", "[oom]") {
  auto probe_owner = make_memory_probe({"cpu", "cpu-counting", std::nullopt});
  auto* probe = dynamic_cast<CpuCountingProbe*>(probe_owner.get());
  REQUIRE(probe != nullptr);
  const auto model = make_mlp(1, 16, 32, 5);
  const Plan plan = make_plan_with({4, 4, 4});
  const Batch window = classification_batch(12, 51, 16, 5);
  LossConfig loss;
  const Outcome clean = run_window(model, plan, window, loss, probe);
  REQUIRE(clean.stats.stepped);
  REQUIRE(clean.totals.oom_recoveries == 0);

  const auto per_mb = allocations_per_microbatch(model, plan, window, loss, *probe);
  REQUIRE(per_mb.size() == 2);
  // Microbatch 1 also allocates the .grad tensors; later ones accumulate into them.
  REQUIRE(per_mb[1] >= 6);  // forward and backward of a 2-layer MLP allocate at least this many tensors
  REQUIRE(per_mb[0] >= per_mb[1]);
  INFO("allocations in microbatch 1: " << per_mb[0] << ", in later ones: " << per_mb[1]);

  double worst_grad = 0, worst_param = 0;
  int runs = 0;
  // Nothing outlives a recovered window: an out-of-memory inside backward can leave that
  // backward's remaining autograd work (gradient buffers, saved activations) queued on the thread
  // for good (PyTorch #82218); the executor's step thread is joined after every OOM to free it.
  const int64_t live_bytes = probe->current_bytes();
  for (int64_t position = 0; position < 3; ++position) {
    const int64_t count = position == 0 ? per_mb[0] : per_mb[1];
    // First allocation (forward), the middle one, and the last one of the microbatch (backward).
    for (const int64_t nth : {int64_t{1}, count / 2, count}) {
      CHECK(probe->current_bytes() == live_bytes);  // what the previous case left behind
      bool fired = false;
      const Outcome o = run_window(model, plan, window, loss, probe, [&](const MicrobatchEvent& e) {
        if (e.attempt == 0 && e.index == position) {
          probe->fail_allocation_after(nth);
          fired = true;
        }
      });
      INFO("position " << position << ", allocation " << nth);
      REQUIRE(fired);
      CHECK(o.stats.oom_recoveries == 1);
      CHECK(o.totals.oom_recoveries == 1);
      CHECK(o.totals.samples_seen == 12);
      CHECK(o.stats.units == 12);
      CHECK(o.stats.stepped);
      CHECK(o.totals.optimizer_steps == 1);
      CHECK(o.plan.microbatch_sizes == std::vector<int64_t>{3, 3, 3, 3});
      CHECK(o.stats.microbatch_sizes == std::vector<int64_t>{3, 3, 3, 3});
      REQUIRE(o.log.size() == 1);
      CHECK(o.log[0].find("out of memory in window 0 at microbatch " + std::to_string(position + 1) + " of 3 (size 4)") !=
            std::string::npos);
      CHECK(o.log[0].find("replaying the window from its first sample") != std::string::npos);
      const double g = compare_tensors(o.grads, clean.grads).max_rel;
      const double p = compare_tensors(o.params, clean.params).max_rel;
      CHECK(g <= 1e-5);
      CHECK(p <= 1e-5);
      worst_grad = std::max(worst_grad, g);
      worst_param = std::max(worst_param, p);
      CHECK_FALSE(probe->oom_happened());
      ++runs;
    }
  }
  CHECK(runs == 9);
  CHECK(probe->current_bytes() == live_bytes);

  // One allocation past the last microbatch lands in combining the gradients (the norm, computed
  // when clipping: a limit no gradient reaches turns it on): not a microbatch problem, so a clear
  // error rather than a re-plan, and no step on half a gradient.
  auto m = clone_module(model);
  auto params = params_of(m);
  const auto before = values_of(params);
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1));
  ExecutorOptions eo;
  eo.max_grad_norm = 1e30;
  eo.probe = probe;
  eo.log = [](const std::string&) {};
  eo.before_microbatch = [&](const MicrobatchEvent& e) {
    if (e.index == 2) probe->fail_allocation_after(per_mb[1] + 1);
  };
  Executor ex(m, opt, plan, eo);
  CHECK_THROWS_WITH(ex.step(window), Catch::Contains("while combining the gradients"));
  CHECK(ex.totals().optimizer_steps == 0);
  CHECK(compare_tensors(values_of(params), before).max_abs == 0.0);
  CHECK_FALSE(probe->oom_happened());
  report("OOM at each of 3 positions x 3 allocations: worst max rel grad diff vs no-OOM", worst_grad);
  report("OOM at each of 3 positions x 3 allocations: worst max rel param diff after step", worst_param);

  // Had the failed microbatch's partial gradient been kept, the update would differ: check that
  // the comparison sees a double-counted microbatch.
  std::vector<at::Tensor> doubled = clean.grads;
  const auto one_mb = naive_accumulated_gradients(clone_module(model), window.slice(0, 4), {4},
                                                  loss, NaiveWeighting::MeanOverK, 3);
  for (size_t i = 0; i < doubled.size(); ++i) doubled[i] = doubled[i] + one_mb[i];
  CHECK(compare_tensors(doubled, clean.grads).max_rel > 1e-2);
}

TEST_CASE("an out-of-memory at any allocation of a microbatch leaves no bytes behind", "[oom][leak]") {
  // The contract: a recovered window leaves nothing allocated. Every allocation of the second
  // microbatch, forward and backward, is made to fail in turn. What this guards: on LibTorch
  // 1.13's CPU device, squeezenet1_1 running out of memory in a window of two microbatches of 15
  // under 23.5 MiB left 21.7 MB allocated on the thread that ran it, for good (the benchmark's
  // oracle; running the window on a fresh thread left 0), in line with PyTorch #82218 (an
  // out-of-memory in backward leaks its intermediates). The executor therefore runs steps on a
  // thread it joins after every out-of-memory (executor/step_thread.h). This miniature fire
  // module did not leave bytes behind even without that (tried on this machine), so the test
  // states the contract rather than reproducing the leak.
  auto probe_owner = make_memory_probe({"cpu", "cpu-counting", std::nullopt});
  auto* probe = dynamic_cast<CpuCountingProbe*>(probe_owner.get());
  REQUIRE(probe != nullptr);
  // A squeezenet fire module in miniature: one activation feeds two convolutions whose outputs
  // are concatenated.
  torch::manual_seed(11);
  torch::jit::Module model("Fire");
  model.register_parameter("w0", (torch::randn({8, 3, 3, 3}) * 0.3).requires_grad_(), false);
  model.register_parameter("w1", (torch::randn({8, 8, 1, 1}) * 0.3).requires_grad_(), false);
  model.register_parameter("w3", (torch::randn({8, 8, 3, 3}) * 0.1).requires_grad_(), false);
  model.register_parameter("fc", (torch::randn({5, 16}) * 0.3).requires_grad_(), false);
  model.define(R"(
def forward(self, x):
    s = torch.relu(torch.conv2d(x, self.w0, None, [1, 1], [1, 1]))
    e = torch.cat([torch.relu(torch.conv2d(s, self.w1)), torch.relu(torch.conv2d(s, self.w3, None, [1, 1], [1, 1]))], 1)
    p = torch.max_pool2d(e, [2, 2], [2, 2], [0, 0], [1, 1], True)
    return torch.matmul(torch.mean(p, [2, 3]), self.fc.t())
)");
  model.train();
  const Plan plan = make_plan_with({4, 4, 4});
  torch::manual_seed(12);
  Batch window;
  window.inputs = {torch::randn({12, 3, 9, 9})};
  window.target = torch::randint(0, 5, {12}, torch::kLong);
  LossConfig loss;
  const auto per_mb = allocations_per_microbatch(model, plan, window, loss, *probe);
  REQUIRE(per_mb.size() == 2);
  const int64_t live_bytes = probe->current_bytes();
  int64_t leaks = 0;
  for (int64_t nth = 1; nth <= per_mb[1]; ++nth) {
    {
      const Outcome o = run_window(model, plan, window, loss, probe, [&](const MicrobatchEvent& e) {
        if (e.attempt == 0 && e.index == 1) probe->fail_allocation_after(nth);
      });
      CHECK(o.stats.oom_recoveries == 1);
      CHECK(o.stats.stepped);
    }
    const int64_t left = probe->current_bytes() - live_bytes;
    INFO("allocation " << nth << " of " << per_mb[1] << " failed; bytes left behind: " << left);
    CHECK(left == 0);
    leaks += left != 0 ? 1 : 0;
  }
  report("OOM at each allocation of microbatch 2: cases that left bytes behind", static_cast<double>(leaks));
}

TEST_CASE("two OOMs in one window: both counted, sizes shrink twice, same update", "[oom]") {
  auto probe = make_memory_probe({"cpu", "cpu-counting", std::nullopt});
  const auto model = make_mlp();
  const Plan plan = make_plan_with({4, 4, 4});
  const Batch window = classification_batch(12);
  LossConfig loss;
  const Outcome clean = run_window(model, plan, window, loss, probe.get());
  const Outcome o = run_window(model, plan, window, loss, probe.get(), [&](const MicrobatchEvent& e) {
    if ((e.attempt == 0 && e.index == 1) || (e.attempt == 1 && e.index == 3)) probe->fail_allocation_after(2);
  });
  CHECK(o.stats.oom_recoveries == 2);
  CHECK(o.totals.oom_recoveries == 2);
  CHECK(o.log.size() == 2);
  CHECK(o.plan.microbatch_sizes == std::vector<int64_t>{2, 2, 2, 2, 2, 2});
  CHECK(o.plan.max_micro_batch == 2);
  CHECK(o.totals.samples_seen == 12);
  CHECK(compare_tensors(o.grads, clean.grads).max_rel <= 1e-5);
  CHECK(compare_tensors(o.params, clean.params).max_rel <= 1e-5);
}

TEST_CASE("OOM in tokens mode: N counted once before the first backward, same update", "[oom][tokens]") {
  auto probe = make_memory_probe({"cpu", "cpu-counting", std::nullopt});
  const auto model = make_tiny_lm();
  const Plan plan = make_plan_with({3, 3});
  Batch window = token_batch(6, 8);
  window.target.narrow(0, 3, 3).narrow(1, 0, 6).fill_(-100);  // microbatch 2: 6 of 24 tokens valid
  LossConfig loss;
  loss.normalization = Normalization::Tokens;
  const Outcome clean = run_window(model, plan, window, loss, probe.get());
  const Outcome o = run_window(model, plan, window, loss, probe.get(), [&](const MicrobatchEvent& e) {
    if (e.attempt == 0 && e.index == 1) probe->fail_allocation_after(3);
  });
  CHECK(o.stats.oom_recoveries == 1);
  CHECK(o.stats.units == 24 + 6);
  CHECK(o.totals.tokens_seen == 30);
  CHECK(o.plan.microbatch_sizes == std::vector<int64_t>{2, 2, 2});
  const double g = compare_tensors(o.grads, clean.grads).max_rel;
  report("tokens mode, OOM at microbatch 2: max rel grad diff vs no-OOM", g);
  CHECK(g <= 1e-5);
}

TEST_CASE("a tight CPU budget: the planned size runs out of memory, the re-planned one fits", "[oom][budget]") {
  auto probe = make_memory_probe({"cpu", "cpu-counting", std::nullopt});
  const auto model = make_mlp(1, 64, 256, 10);
  const Batch window = classification_batch(16, 61, 64, 10);
  LossConfig loss;
  // Peaks of the two splits above what was resident before each run (results of earlier runs
  // stay allocated, so absolute peaks are not comparable), measured without a budget.
  const int64_t base8 = probe->current_bytes();
  const Outcome big = run_window(model, make_plan_with({8, 8}), window, loss, probe.get());
  const int64_t base4 = probe->current_bytes();
  const Outcome small = run_window(model, make_plan_with({4, 4, 4, 4}), window, loss, probe.get());
  REQUIRE(big.stats.peak_bytes.has_value());
  REQUIRE(small.stats.peak_bytes.has_value());
  const int64_t p8 = *big.stats.peak_bytes - base8, p4 = *small.stats.peak_bytes - base4;
  INFO("peak above resident at 8: " << p8 << " bytes, at 4: " << p4);
  REQUIRE(p8 > p4 + 4096);  // 256 hidden floats x 4 more samples x a few tensors: over 4 KiB apart
  // Halfway between: microbatches of 8 cannot fit, 4 can.
  const int64_t base = probe->current_bytes();
  const int64_t budget = base + (p8 + p4) / 2;
  probe->set_budget_bytes(budget);
  std::string plan_out = scratch_dir("executor-oom-budget") + "/plan.json";
  const Outcome o = run_window(model, make_plan_with({8, 8}), window, loss, probe.get(), {}, plan_out);
  probe->set_budget_bytes(std::nullopt);
  report("tight budget: bytes between the peaks at 8 and 4 (p8 - p4)", static_cast<double>(p8 - p4));
  CHECK(o.stats.oom_recoveries >= 1);
  CHECK(o.stats.stepped);
  CHECK(o.plan.micro_batch <= 7);
  CHECK(o.plan.micro_batch >= 4);
  CHECK(o.totals.samples_seen == 16);
  REQUIRE(o.stats.peak_bytes.has_value());
  CHECK(*o.stats.peak_bytes <= budget);
  CHECK(compare_tensors(o.grads, big.grads).max_rel <= 1e-5);
  CHECK(compare_tensors(o.params, big.params).max_rel <= 1e-5);
  // The re-planned plan was written atomically and reads back as a valid plan.
  const Plan written = read_plan_file(plan_out);
  CHECK(written.microbatch_sizes == o.plan.microbatch_sizes);
  CHECK(written.max_micro_batch == o.plan.max_micro_batch);
  CHECK_FALSE(std::filesystem::exists(plan_out + ".tmp"));
}

TEST_CASE("OOM at microbatch size 1 is a clear error, not a loop — recovery off fails at once", "[oom]") {
  auto probe = make_memory_probe({"cpu", "cpu-counting", std::nullopt});
  const auto model = make_mlp();
  const Batch window = classification_batch(3);
  LossConfig loss;
  int64_t attempts = 0;
  try {
    run_window(model, make_plan_with({1, 1, 1}), window, loss, probe.get(), [&](const MicrobatchEvent& e) {
      ++attempts;
      if (e.index == 0) probe->fail_allocation_after(1);
    });
    FAIL("expected ExecutorOomError");
  } catch (const ExecutorOomError& e) {
    const std::string msg = e.what();
    CHECK(msg.find("single sample") != std::string::npos);
    CHECK(e.exit_code() == 2);
  }
  CHECK(attempts == 1);
  CHECK_FALSE(probe->oom_happened());

  // Recovery off: the first OOM is an error naming the microbatch; nothing is re-planned.
  auto m = clone_module(model);
  auto params = params_of(m);
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1));
  ExecutorOptions o;
  o.probe = probe.get();
  o.oom_recovery = false;
  o.before_microbatch = [&](const MicrobatchEvent& e) {
    if (e.index == 1) probe->fail_allocation_after(1);
  };
  Executor ex(m, opt, make_plan_with({2, 1}), o);
  CHECK_THROWS_WITH(ex.step(window), Catch::Contains("microbatch 2 of 2 (size 1) and OOM recovery is off"));
  CHECK(ex.totals().oom_recoveries == 0);
  CHECK(ex.plan().microbatch_sizes == std::vector<int64_t>{2, 1});
}
