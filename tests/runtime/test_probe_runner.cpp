// The probe runner on the CPU counting probe: persistent memory measured exactly, activations
// that grow with the microbatch and a fit that predicts unprobed sizes, and plans confirmed by a
// real step that come close to the largest microbatch that truly fits.
#include <torch/optim.h>

#include <cmath>
#include <iostream>
#include <tuple>
#include <type_traits>

#include "accumplan/errors.h"
#include "accumplan/memory_model.h"
#include "accumplan/solver.h"
#include "fixtures.h"
#include "profiling/probe_runner.h"

#include "catch_after_torch.h"  // last: after glog's CHECK from LibTorch

using namespace accumplan;
using accumplan::test::cpu_probe;
using accumplan::test::make_test_convnet;
using accumplan::test::make_test_mlp;

// LibTorch keeps Adam's and AdamW's step counter as a plain int64_t field of the per-parameter
// state (TORCH_ARG(int64_t, step) in torch/optim/adam.h and adamw.h, 1.13 and 2.x alike), not as a
// tensor as Python's torch.optim does since 1.12. So the counters allocate no device memory and
// Adam's state is exactly two parameter-sized buffers (exp_avg, exp_avg_sq). Checked here at
// compile time so a LibTorch that changes this fails the build rather than the byte counts.
static_assert(std::is_same_v<std::decay_t<decltype(std::declval<const torch::optim::AdamParamState&>().step())>, int64_t>);
static_assert(std::is_same_v<std::decay_t<decltype(std::declval<const torch::optim::AdamWParamState&>().step())>, int64_t>);

namespace {

RunnerOptions mlp_options(const std::string& optimizer, int64_t in = 64, int64_t hidden = 128) {
  RunnerOptions o;
  o.loader = [in, hidden](const torch::Device&) { return make_test_mlp(in, hidden, 10); };
  o.setup.optimizer = optimizer;
  o.setup.inputs = {"float32[B," + std::to_string(in) + "]"};
  o.setup.target = "int64[B]:10";
  return o;
}

RunnerOptions convnet_options() {
  RunnerOptions o;
  o.loader = [](const torch::Device&) { return make_test_convnet(); };
  o.setup.optimizer = "sgd";
  o.setup.inputs = {"float32[B,3,16,16]"};
  o.setup.target = "int64[B]:10";
  return o;
}

double relative_error(double predicted, double measured) { return std::fabs(predicted - measured) / measured; }

}  // namespace

TEST_CASE("persistent memory of an MLP: weights and gradients equal the parameter bytes exactly", "[runner][persistent]") {
  // 64→128→128→10: (64·128 + 128 + 128·128 + 128 + 128·10 + 10) floats = 26,122 · 4 = 104,488 bytes.
  const int64_t param_bytes = (64 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10) * 4;
  struct Case {
    const char* optimizer;
    int64_t state_copies;  // parameter-sized state buffers LibTorch keeps
  };
  const Case cases[] = {{"sgd", 0}, {"momentum", 1}, {"adam", 2}, {"adamw", 2}, {"adagrad", 1}, {"rmsprop", 1}};
  for (const Case& c : cases) {
    INFO("optimizer " << c.optimizer);
    auto probe = cpu_probe();
    ProbeRunner runner(*probe, mlp_options(c.optimizer));
    CHECK(runner.declared_parameter_bytes() == param_bytes);
    CHECK(runner.persistent().weights_bytes == param_bytes);
    CHECK(runner.persistent().gradients_bytes == param_bytes);
    CHECK(runner.persistent().optimizer_state_bytes == c.state_copies * param_bytes);
    // What the probe saw equals what the optimizer says it holds.
    CHECK(runner.declared_optimizer_state_bytes() == runner.persistent().optimizer_state_bytes);
  }
}

TEST_CASE("activations grow with the microbatch and the fit predicts an unprobed size within 5%", "[runner][fit]") {
  struct Case {
    const char* name;
    RunnerOptions options;
    int64_t unprobed;
  };
  // 64 and 48 are well beyond the probes (1..8), where a wrong slope shows most: at 64 the MLP's
  // activations are about as large as its persistent memory, at 48 the convnet's are ~97% of its peak.
  Case cases[] = {{"mlp", mlp_options("adam", 256, 512), 64}, {"convnet", convnet_options(), 48}};
  for (Case& c : cases) {
    INFO("model " << c.name);
    auto probe = cpu_probe();
    c.options.probe_sizes = {1, 2, 4, 8};
    c.options.max_probe_micro_batch = 8;  // fit from 1, 2, 4, 8 alone: no probes nearer the prediction
    ProbeRunner runner(*probe, c.options);
    const Profile profile = runner.profile();
    // Every probe (1, 2, 4, 8) ran and stays in the profile; the fit starts at a quarter of the
    // largest size (a small size can be set by another phase), keeping at least three sizes.
    std::vector<int64_t> probed, probe_peaks;
    for (const auto& t : profile.trials) {
      if (t.kind == "probe" && t.fit) {
        probed.push_back(t.micro_batch);
        probe_peaks.push_back(t.peak_bytes);
      }
    }
    REQUIRE(probed.size() >= 5);  // the persistent-memory step at b=1, then 1, 2, 4, 8
    CHECK(profile.points.size() >= 4);  // every probe stays in the profile
    const MemoryModel model = MemoryModel::fit(profile);
    std::vector<ProfilePoint> fitted;
    for (const auto& p : profile.points) {
      if (p.micro_batch >= model.summary().fitted_from_micro_batch) fitted.push_back(p);
    }
    CHECK(fitted.size() >= 3);
    for (size_t i = 1; i < fitted.size(); ++i) {
      CHECK(fitted[i].peak_bytes - profile.persistent.total() > fitted[i - 1].peak_bytes - profile.persistent.total());
    }
    const WindowMeasurement real = runner.measure(c.unprobed);
    REQUIRE_FALSE(real.oom);
    const int64_t predicted = model.predict_peak_bytes(c.unprobed);
    const int64_t persistent = profile.persistent.total();
    std::cerr << "[fit] " << c.name << ": probes (b:peak)";
    for (size_t i = 0; i < probed.size(); ++i) std::cerr << " " << probed[i] << ":" << probe_peaks[i];
    std::cerr << "; fitted on (b:steady peak)";
    for (const auto& p : profile.points) std::cerr << " " << p.micro_batch << ":" << p.peak_bytes;
    std::cerr << "; at b=" << c.unprobed << " predicted " << predicted << " measured " << real.peak_bytes
              << " (error " << 100.0 * relative_error(predicted, real.peak_bytes) << "% of peak, activations predicted "
              << predicted - persistent << " measured " << real.peak_bytes - persistent << ")\n";
    CHECK(relative_error(predicted, real.peak_bytes) < 0.05);
  }
}

TEST_CASE("with the default margin the plan is the largest size a window ran at, at least 95% of the brute-force maximum",
          "[runner][confirm][margin]") {
  auto probe = cpu_probe();
  RunnerOptions o = mlp_options("sgd", 256, 512);
  // Persistent: 399,370 parameters · 4 bytes · (weights + gradients) ≈ 3.0 MiB; the other ~13 MiB
  // hold activations of roughly 17 KiB per sample, on the order of 750 samples.
  const int64_t budget = 16 * 1024 * 1024;
  o.budget.bytes = budget;
  o.max_probe_micro_batch = 8192;
  ProbeRunner runner(*probe, o);
  Profile profile = runner.profile();
  const size_t profiled = profile.trials.size();
  PlanRequest req;
  req.target_batch = 8192;  // many microbatches
  const Plan plan = runner.plan_and_confirm(profile, req);
  REQUIRE(plan.confirmed);
  REQUIRE(plan.confirmed_peak_bytes);
  CHECK(*plan.confirmed_peak_bytes <= budget);
  CHECK(plan.accumulation_steps > 1);
  CHECK(plan.memory.margin.measured);
  const std::string last = plan.profile.trials.back().kind;
  CHECK((last == "confirm" || last == "climb"));
  // The plan's largest microbatch is the largest window that ran within the budget.
  int64_t largest_ran = 0, failed = 0;
  for (const auto& t : plan.profile.trials) {
    if (t.window.size() == 2 && t.fit) largest_ran = std::max(largest_ran, t.window[0]);
    failed += t.fit ? 0 : 1;
  }
  CHECK(plan.max_micro_batch == largest_ran);
  CHECK(failed == 0);  // no OOM on the happy path
  CHECK(plan.profile.trials.size() - profiled <= 6);

  // Brute force with real steps: gallop up from the plan until a step no longer fits, then
  // bisect. Each `measure` is a full window plus a steady-state microbatch under the budget.
  int64_t fits = plan.max_micro_batch, fails = 0, steps = 0;
  for (int64_t stride = 8; fails == 0; stride *= 2) {
    const int64_t m = fits + stride / 8;
    ++steps;
    if (runner.measure(m).fit) fits = m;
    else fails = m;
    REQUIRE(stride < 4096);
  }
  while (fails - fits > 1) {
    const int64_t m = fits + (fails - fits) / 2;
    ++steps;
    if (runner.measure(m).fit) fits = m;
    else fails = m;
  }
  const int64_t m_true = fits;
  int64_t confirms = 0;
  for (const auto& t : plan.profile.trials) confirms += t.kind == "confirm";
  std::cerr << "[confirm] mlp 256-512-512-10 sgd, budget 16 MiB, headroom auto: windows";
  for (const auto& t : plan.profile.trials) std::cerr << " " << t.kind << ":" << t.micro_batch << (t.fit ? "" : "!");
  std::cerr << "; plan micro_batch " << plan.micro_batch << " (max " << plan.max_micro_batch << "), predicted peak "
            << plan.memory.predicted_peak_bytes << ", confirmed peak " << *plan.confirmed_peak_bytes << ", " << confirms
            << " confirm step(s); brute-force m_max " << m_true << " (" << steps << " real steps)\n";
  CHECK(plan.max_micro_batch <= m_true);
  CHECK(static_cast<double>(plan.max_micro_batch) >= 0.95 * static_cast<double>(m_true));
}

TEST_CASE("a confirm step that runs out of memory lowers the bound and confirms a smaller plan", "[runner][confirm]") {
  auto probe = cpu_probe();
  RunnerOptions o = mlp_options("sgd");
  o.budget.bytes = 4 * 1024 * 1024;
  o.max_probe_micro_batch = 8;  // probes 2 and 4 only, so the plan is far from any window that ran
  ProbeRunner runner(*probe, o);
  Profile profile = runner.profile();
  PlanRequest req;
  req.target_batch = 1024;
  const Plan first = make_plan(profile, req);
  int64_t largest_probe = 0;
  for (const auto& t : profile.trials) {
    if (t.window.size() == 2 && t.fit) largest_probe = std::max(largest_probe, t.micro_batch);
  }
  REQUIRE(first.max_micro_batch - largest_probe >= 2);
  probe->fail_allocation_after(1);  // the confirm step's first allocation fails as an OOM
  const Plan plan = runner.plan_and_confirm(profile, req);
  REQUIRE(plan.confirmed);
  CHECK(plan.max_micro_batch < first.max_micro_batch);
  // Bisected between the largest probe that fit and the failed size, then up from the size that
  // ran toward the failure (the allocator may have refused what the line allows): the plan is the
  // largest window that ran, above that midpoint, in at most six windows and then one of the plan's
  // own head where only a larger window covered it.
  int64_t failed_confirms = 0, windows = 0, largest_ran = 0;
  for (const auto& t : plan.profile.trials) {
    if (t.kind != "confirm" && t.kind != "climb") continue;
    ++windows;
    failed_confirms += t.kind == "confirm" && !t.fit;
    if (t.fit) largest_ran = std::max(largest_ran, t.micro_batch);
  }
  CHECK(failed_confirms == 1);
  CHECK(windows <= 7);
  CHECK(plan.max_micro_batch == largest_ran);
  CHECK(largest_ran > largest_probe + (first.max_micro_batch - largest_probe) / 2);
  // After the OOM memory went back to the baseline between windows: weights and optimizer state
  // (none for sgd); the executor sets the gradients to none after every window, as in training.
  CHECK(probe->current_bytes() == profile.persistent.weights_bytes + profile.persistent.optimizer_state_bytes);
}

TEST_CASE("a budget below persistent memory is reported with its breakdown", "[runner][errors]") {
  auto probe = cpu_probe();
  RunnerOptions o = mlp_options("adam");  // 104,488 bytes of parameters, 417,952 with grads and Adam
  o.budget.bytes = 300 * 1024;
  ProbeRunner runner(*probe, o);
  CHECK(runner.persistent_over_budget());
  INFO("weights " << runner.persistent().weights_bytes << " gradients " << runner.persistent().gradients_bytes
                  << " state " << runner.persistent().optimizer_state_bytes);
  CHECK(runner.persistent().total() == 4 * 104488);
  Profile profile = runner.profile();
  PlanRequest req;
  req.target_batch = 64;
  CHECK_THROWS_WITH(runner.plan_and_confirm(profile, req), Catch::Contains("persistent memory alone is"));
}

TEST_CASE("bad setups are refused before anything runs", "[runner][errors]") {
  auto probe = cpu_probe();
  RunnerOptions o = mlp_options("sgd");
  o.setup.optimizer = "lion";
  CHECK_THROWS_AS(ProbeRunner(*probe, o), InputError);
  o = mlp_options("sgd");
  o.setup.loss = "hinge";
  CHECK_THROWS_WITH(ProbeRunner(*probe, o), Catch::Contains("--loss 'hinge' is unknown"));
  o = mlp_options("sgd");
  o.setup.inputs = {"float32[B,3]"};  // the MLP takes 64 features
  CHECK_THROWS_WITH(ProbeRunner(*probe, o), Catch::Contains("the model rejected inputs of shape [2,3]"));
  CHECK(probe->current_bytes() == 0);
  // A model whose loss is NaN never steps its optimizer: nothing a plan must hold can be measured.
  o = mlp_options("adam");
  o.loader = [](const torch::Device&) {
    LoadedModel m = make_test_mlp(64, 128, 10);
    for (auto p : m.module.parameters()) p.detach().fill_(std::nan(""));
    return m;
  };
  CHECK_THROWS_WITH(ProbeRunner(*probe, o), Catch::StartsWith("the loss of the first window (2 samples) is nan, so the "
                                                              "optimizer cannot step"));
}

TEST_CASE("windows for two ranks make a rank's gradient exchange: the peak after the microbatches holds its flat buffer",
          "[runner][exchange]") {
  const int64_t param_bytes = (64 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10) * 4;  // one bucket holds them all
  // One probe at a time: LibTorch has one CPU allocator slot.
  auto measured = [](int64_t world_size) {
    auto probe = cpu_probe();
    RunnerOptions o = mlp_options("sgd");
    o.world_size = world_size;
    ProbeRunner runner(*probe, o);
    const WindowMeasurement m = runner.measure(4);
    return std::make_tuple(runner.persistent().total(), m, runner.profile().gradient_exchange);
  };
  const auto [resident, one, one_exchanged] = measured(1);  // SGD: weights and gradients, no state
  // One process: the step of plain SGD adds no buffer of a gradient's size.
  CHECK(one.optimizer_step_peak_bytes < resident + param_bytes / 2);
  CHECK_FALSE(one_exchanged);

  const auto [ranks_resident, two, two_exchanged] = measured(2);
  CHECK(ranks_resident == resident);  // the exchange's buffer is gone once it is made
  // Each rank's exchange flattens every gradient (and the loss sum) into one buffer beside them.
  CHECK(two.optimizer_step_peak_bytes >= resident + param_bytes + 4);
  CHECK(two.optimizer_step_peak_bytes <= resident + param_bytes + 1024);
  CHECK(two.peak_bytes == one.peak_bytes);  // the microbatches themselves hold the same
  CHECK(two_exchanged);
}
