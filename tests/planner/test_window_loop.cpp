// The one window algorithm and evaluation loop (accumplan/window_loop.h) against a fake backend:
// what the loop hands each microbatch, what it does after an out-of-memory, the update's order,
// and the evaluation's re-split. Torch-free; the executors' own tests run it on real models.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <stdexcept>

#include "accumplan/replan.h"
#include "accumplan/solver.h"
#include "accumplan/terms.h"
#include "accumplan/window_loop.h"
#include "test_helpers.h"

using namespace accumplan;

namespace {

struct FakeOom : std::runtime_error {
  FakeOom() : std::runtime_error("fake device: out of memory\nsecond line") {}
};

// A device that runs out of memory at any microbatch of `fails_above` samples or more (0: never),
// or at the listed (attempt, index) points; records every call in order.
class FakeBackend : public WindowBackend {
 public:
  int64_t samples = 16;
  std::vector<int64_t> lengths;  // ragged data
  int64_t fails_above = 0;
  std::set<std::pair<int64_t, int64_t>> fail_at;  // (attempt, index)
  double loss_per_sample = 0.5;
  double norm = 10;
  bool non_finite_gradient = false;
  std::vector<std::string> calls;
  std::vector<Microbatch> ran;  // microbatches that completed, in order
  double loss = 0;
  double grad_scale = 1;
  bool state = false;

  ShareCounts count_share() override {
    calls.push_back("count");
    return ShareCounts{samples, samples, 0, lengths, "samples"};
  }
  void begin_attempt() override {
    calls.push_back("begin");
    loss = 0;
  }
  void run_microbatch(const Microbatch& mb, int64_t) override {
    calls.push_back("mb" + std::to_string(mb.where.size));
    if ((fails_above > 0 && mb.where.size >= fails_above) || fail_at.count({mb.where.attempt, mb.where.index})) {
      throw FakeOom();
    }
    ran.push_back(mb);
    loss += loss_per_sample * static_cast<double>(mb.where.size);
  }
  bool is_out_of_memory(const std::exception& e) const override { return dynamic_cast<const FakeOom*>(&e) != nullptr; }
  void after_out_of_memory() override { calls.push_back("released"); }
  double loss_sum() override { return loss; }
  bool unscale_finds_non_finite() override { return non_finite_gradient; }
  double gradient_norm() override {
    calls.push_back("norm");
    return norm;
  }
  void scale_gradients(double c) override {
    calls.push_back("scale");
    grad_scale = c;
  }
  void optimizer_step(int64_t step) override {
    calls.push_back("step" + std::to_string(step));
    state = true;
  }
  void after_update(bool stepped, const StepEvent&) override { calls.push_back(stepped ? "updated" : "backed-off"); }
  void drop_gradients() override { calls.push_back("drop"); }
  bool optimizer_state_exists() const override { return state; }
  bool wall_time_is_device_time() const override { return true; }
};

Plan plan_with(std::vector<int64_t> sizes) {
  Plan p;
  p.per_rank_batch = p.target_batch = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  const int64_t largest = *std::max_element(sizes.begin(), sizes.end());
  set_window(p, std::move(sizes), largest);
  p.reason = "test plan.";
  return p;
}

// Every sample of a window of n, from the microbatches that completed since `from`.
std::vector<int64_t> samples_covered(const std::vector<Microbatch>& ran, size_t from) {
  std::vector<int64_t> seen;
  for (size_t i = from; i < ran.size(); ++i) {
    if (ran[i].samples.empty()) {
      for (int64_t s = ran[i].start; s < ran[i].start + ran[i].where.size; ++s) seen.push_back(s);
    } else {
      seen.insert(seen.end(), ran[i].samples.begin(), ran[i].samples.end());
    }
  }
  std::sort(seen.begin(), seen.end());
  return seen;
}

std::vector<int64_t> iota_of(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

}  // namespace

TEST_CASE("Window loop: a window runs the plan's microbatches in order, then one update", "[window-loop]") {
  Plan plan = plan_with({6, 5, 5});
  WindowLoop loop(plan);
  FakeBackend b;
  WindowStats st = loop.accumulate(b, WindowOptions{});
  CHECK(st.microbatch_sizes == std::vector<int64_t>{6, 5, 5});
  CHECK(st.units == 16);
  CHECK(st.loss == Approx(0.5));
  CHECK(b.ran[1].start == 6);
  CHECK(b.ran[2].start == 11);
  loop.apply(b, WindowOptions{}, st);
  CHECK(st.stepped);
  CHECK(b.calls == std::vector<std::string>{"count", "begin", "mb6", "mb5", "mb5", "step0", "updated", "drop"});
  CHECK(loop.totals().optimizer_steps == 1);
  CHECK(loop.totals().samples_seen == 16);
  CHECK(loop.window_index() == 1);
}

TEST_CASE("Window loop: a window says whether the optimizer state existed before it", "[window-loop]") {
  Plan plan = plan_with({8, 8});
  plan.profile.persistent.optimizer_state_bytes = 4096;
  WindowLoop loop(plan);
  FakeBackend b;
  WindowStats first = loop.accumulate(b, WindowOptions{});
  CHECK_FALSE(first.optimizer_state_ready);  // its step creates the state: a lower peak than the steady ones
  loop.apply(b, WindowOptions{}, first);
  WindowStats second = loop.accumulate(b, WindowOptions{});
  CHECK(second.optimizer_state_ready);
  Plan stateless = plan_with({8, 8});  // an optimizer that keeps no state is steady from the first window
  WindowLoop plain(stateless);
  FakeBackend fresh;
  CHECK(plain.accumulate(fresh, WindowOptions{}).optimizer_state_ready);
}

TEST_CASE("Window loop: the cache is released once, before the step that makes the optimizer's state", "[window-loop]") {
  struct Caching : FakeBackend {
    void release_cached() override { calls.push_back("release"); }
  };
  Plan plan = plan_with({8, 8});
  WindowLoop loop(plan);
  Caching b;
  for (int window = 0; window < 2; ++window) {
    WindowStats st = loop.accumulate(b, WindowOptions{});
    loop.apply(b, WindowOptions{}, st);
  }
  CHECK(b.calls == std::vector<std::string>{"count", "begin", "mb8", "mb8", "release", "step0", "updated", "drop",
                                            "count", "begin", "mb8", "mb8", "step1", "updated", "drop"});
  // An optimizer that keeps no state (plain SGD) still releases only once.
  struct Stateless : Caching {
    bool optimizer_state_exists() const override { return false; }
  };
  WindowLoop plain(plan);
  Stateless s;
  for (int window = 0; window < 3; ++window) {
    WindowStats st = plain.accumulate(s, WindowOptions{});
    plain.apply(s, WindowOptions{}, st);
  }
  CHECK(std::count(s.calls.begin(), s.calls.end(), "release") == 1);
}

TEST_CASE("Window loop: an out-of-memory re-plans below the failing size and replays every sample once",
          "[window-loop]") {
  Plan plan = plan_with({6, 5, 5});
  WindowLoop loop(plan);
  FakeBackend b;
  b.fails_above = 6;
  std::vector<std::string> logged;
  std::vector<ReplanEvent> replans;
  WindowOptions o;
  o.log = [&](const std::string& line) { logged.push_back(line); };
  o.on_replan = [&](const ReplanEvent& e, const Plan& p) {
    replans.push_back(e);
    CHECK(p.micro_batch < 6);
  };
  WindowStats st = loop.accumulate(b, o);
  CHECK(st.oom_recoveries == 1);
  CHECK(loop.plan().micro_batch <= 5);
  CHECK(st.microbatch_sizes == loop.plan().microbatch_sizes);
  // Nothing of the failed attempt is in the loss, and the replay covers each sample once.
  CHECK(st.loss == Approx(0.5));
  CHECK(samples_covered(b.ran, 0) == iota_of(16));
  // The device is released after the failure, before the replay's fresh attempt.
  const auto released = std::find(b.calls.begin(), b.calls.end(), "released");
  REQUIRE(released != b.calls.end());
  CHECK(*std::next(released) == "begin");
  REQUIRE(replans.size() == 1);
  CHECK(replans[0].failing_size == 6);
  REQUIRE(logged.size() == 1);
  CHECK_THAT(logged[0], Catch::StartsWith("out of memory in window 0 at microbatch 1 of 3 (size 6); re-planned to"));
  CHECK(logged[0] == replans[0].line);
  CHECK(loop.totals().oom_recoveries == 1);
}

TEST_CASE("Window loop: out of memory at one sample, or with recovery off, is ExecutorOomError", "[window-loop]") {
  Plan plan = plan_with({1, 1});
  WindowLoop loop(plan);
  FakeBackend b;
  b.samples = 2;
  b.fails_above = 1;
  CHECK_THROWS_WITH(loop.accumulate(b, WindowOptions{}), Catch::Contains("with a single sample") &&
                                                              Catch::Contains("fake device: out of memory") &&
                                                              !Catch::Contains("second line"));
  Plan big = plan_with({8, 8});
  WindowLoop off_loop(big);
  FakeBackend c;
  c.fails_above = 8;
  WindowOptions off;
  off.oom_recovery = false;
  CHECK_THROWS_AS(off_loop.accumulate(c, off), ExecutorOomError);
  CHECK(c.calls.back() == "released");
  CHECK(big.microbatch_sizes == std::vector<int64_t>{8, 8});  // not re-planned
}

TEST_CASE("Window loop: another error passes through unchanged, and nothing is re-planned", "[window-loop]") {
  struct Broken : FakeBackend {
    void run_microbatch(const Microbatch&, int64_t) override { throw std::logic_error("the model's own bug"); }
  };
  Plan plan = plan_with({4, 4});
  WindowLoop loop(plan);
  Broken b;
  b.samples = 8;
  CHECK_THROWS_AS(loop.accumulate(b, WindowOptions{}), std::logic_error);
  CHECK(plan.microbatch_sizes == std::vector<int64_t>{4, 4});
}

TEST_CASE("Window loop: the update clips the combined gradient once, and skips on a non-finite one", "[window-loop]") {
  Plan plan = plan_with({8, 8});
  WindowLoop loop(plan);
  FakeBackend b;
  WindowOptions o;
  o.max_grad_norm = 1.0;
  WindowStats st = loop.accumulate(b, o);
  REQUIRE(st.grad_norm);
  CHECK(*st.grad_norm == 10);
  CHECK(b.grad_scale == Approx(1.0 / (10 + 1e-6)));
  loop.apply(b, o, st);
  CHECK(st.stepped);

  FakeBackend nan;
  nan.non_finite_gradient = true;
  WindowStats skipped = loop.accumulate(nan, o);
  CHECK(skipped.skipped);
  CHECK_THAT(skipped.skip_reason, Catch::StartsWith("non-finite gradient"));
  CHECK(std::count(nan.calls.begin(), nan.calls.end(), "norm") == 0);
  loop.apply(nan, o, skipped);
  CHECK_FALSE(skipped.stepped);
  CHECK(nan.calls.back() == "drop");
  CHECK(std::find(nan.calls.begin(), nan.calls.end(), "backed-off") != nan.calls.end());
  CHECK(loop.totals().optimizer_steps == 1);
  CHECK(loop.totals().skipped_steps == 1);
}

TEST_CASE("Window loop: a share that breaks the plan's window is refused before any microbatch", "[window-loop]") {
  Plan plan = plan_with({4, 4});
  WindowLoop loop(plan);
  FakeBackend b;
  b.samples = 9;
  CHECK_THROWS_WITH(loop.accumulate(b, WindowOptions{}), Catch::Contains("a window holds 1..8 samples"));
  CHECK(b.ran.empty());
  b.samples = 6;  // a short last window: split under the plan's largest microbatch
  CHECK(loop.accumulate(b, WindowOptions{}).microbatch_sizes == std::vector<int64_t>{3, 3});
  CHECK_THROWS_AS(loop.accumulate(b, WindowOptions{}, {5, 2}), InputError);
}

TEST_CASE("Window loop: a packed window is cut by the token budget and re-packed after an out-of-memory",
          "[window-loop][tokens]") {
  Plan plan = plan_with({4, 4});
  plan.tokens = TokenBudget{40, 10, 40, std::nullopt, std::nullopt};
  WindowLoop loop(plan);
  FakeBackend b;
  b.samples = 8;
  b.lengths = {10, 3, 7, 10, 2, 9, 5, 4};
  WindowStats st = loop.accumulate(b, WindowOptions{});
  // Longest first, each microbatch padded to its first member: 4 of 10 (40 tokens), then the rest.
  REQUIRE_FALSE(b.ran.empty());
  CHECK(b.ran[0].padded_length == 10);
  CHECK(samples_covered(b.ran, 0) == iota_of(8));

  FakeBackend c = b;
  c.ran.clear();
  c.calls.clear();
  c.fail_at = {{0, 0}};
  WindowStats again = loop.accumulate(c, WindowOptions{});
  CHECK(again.oom_recoveries == 1);
  CHECK(loop.plan().tokens->token_budget < 40);
  CHECK(samples_covered(c.ran, 0) == iota_of(8));
  (void)st;

  FakeBackend longer = b;
  longer.lengths = {11, 3, 7, 10, 2, 9, 5, 4};
  CHECK_THROWS_WITH(loop.accumulate(longer, WindowOptions{}), Catch::Contains("plan again with a longer --seq-len"));
  set_front_end(FrontEnd::Python);
  CHECK_THROWS_WITH(loop.accumulate(longer, WindowOptions{}), Catch::Contains("plan again with a longer max_seq_len"));
  set_front_end(FrontEnd::Cli);
}

namespace {

class FakeEval : public EvalBackend {
 public:
  int64_t fails_above = 0;
  std::vector<std::pair<int64_t, int64_t>> ran;  // (start, size)
  std::vector<int64_t> held, handed;
  void eval_microbatch(int64_t, int64_t start, int64_t size, bool keep) override {
    if (fails_above > 0 && size >= fails_above) throw FakeOom();
    ran.emplace_back(start, size);
    if (keep) held.push_back(start);
  }
  bool is_out_of_memory(const std::exception& e) const override { return dynamic_cast<const FakeOom*>(&e) != nullptr; }
  void after_out_of_memory() override {}
  void hand_over_output() override {
    handed.push_back(held.front());
    held.erase(held.begin());
  }
};

}  // namespace

TEST_CASE("Eval loop: after an out-of-memory the rest runs at half the size, nothing skipped or twice", "[window-loop][eval]") {
  FakeEval b;
  b.fails_above = 8;
  std::vector<std::string> logged;
  EvalLoopOptions o;
  o.log = [&](const std::string& line) { logged.push_back(line); };
  const EvalOutcome out = run_eval(b, 20, {8, 8, 4}, o);
  CHECK(out.microbatch_sizes == std::vector<int64_t>{4, 4, 4, 4, 4});
  CHECK(out.oom_recoveries == 1);
  REQUIRE(logged.size() == 1);
  CHECK(logged[0] == "evaluation ran out of memory at a microbatch of 8 samples; the 20 samples from sample 0 on run "
                     "in microbatches of 4");
  FakeEval one;
  one.fails_above = 1;
  CHECK_THROWS_AS(run_eval(one, 2, {2}, o), ExecutorOomError);
  CHECK_THROWS_AS(run_eval(b, 21, {8, 8, 4}, o), InputError);
}

TEST_CASE("Eval loop: a kept output is handed over once the next microbatch's forward has finished",
          "[window-loop][eval]") {
  FakeEval b;
  EvalLoopOptions o;
  o.keep_outputs = true;
  run_eval(b, 9, {3, 3, 3}, o);
  CHECK(b.handed == std::vector<int64_t>{0, 3, 6});
  CHECK(b.held.empty());
}

TEST_CASE("Window loop: the gradient exchange's buckets are consecutive runs of one dtype up to the bucket size",
          "[window-loop][exchange]") {
  using G = std::vector<std::pair<std::string, int64_t>>;
  using B = std::vector<std::vector<size_t>>;
  CHECK(gradient_buckets(G{}, 30).empty());
  // 10 + 20 fill a bucket of 30; a dtype change starts one; 30 + 1 would overflow; 100 goes alone.
  CHECK(gradient_buckets(G{{"float", 10}, {"float", 20}, {"half", 5}, {"float", 30}, {"float", 1}, {"float", 100}}, 30) ==
        B{{0, 1}, {2}, {3}, {4}, {5}});
  CHECK(gradient_buckets(G{{"float", 1}, {"half", 1}, {"float", 1}}, 30) == B{{0}, {1}, {2}});
  CHECK(gradient_buckets(G(62, {"float", 1 << 20})).size() == 3);  // 62 MiB in buckets of 25 MiB
}

TEST_CASE("Window loop: the counting step alone agrees on the share and runs nothing", "[window-loop]") {
  // Two ranks seen from rank 1: the group's sums arrive as a fake peer adds its own slots.
  struct RankOne : FakeBackend {
    std::vector<int64_t> peer;  // rank 0's slots: [units, samples, valid tokens, samples per rank]
    int world_size() const override { return 2; }
    int rank() const override { return 1; }
    std::vector<int64_t> sum_over_ranks(const std::vector<int64_t>& v) override {
      std::vector<int64_t> sum = v;
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += peer[i];
      return sum;
    }
  };
  Plan plan = plan_with({6, 5, 5});
  plan.world_size = 2;
  plan.target_batch = 2 * plan.per_rank_batch;
  const WindowLoop loop(plan);
  RankOne b;
  b.samples = 10;
  b.peer = {12, 12, 0, 12, 0};
  const WindowCounts c = loop.count_window(b, "while testing");
  CHECK(c.units == 22);
  CHECK(c.samples == 22);
  CHECK(c.rank_samples == std::vector<int64_t>{12, 10});
  CHECK(c.share.samples == 10);
  CHECK(b.calls == std::vector<std::string>{"count"});  // nothing ran, nothing began
  // A peer that could not count its share: this rank throws, naming it and what it was doing.
  b.peer = {0, 0, 0, -1, 0};
  CHECK_THROWS_WITH(loop.count_window(b, "while testing"),
                    Catch::Contains("rank 0 failed while testing (its own error says why)"));
  // This rank's own refusal (`check`) is its own error, thrown after the collective.
  b.peer = {12, 12, 0, 12, 0};
  CHECK_THROWS_WITH(loop.count_window(b, "while testing", [](const ShareCounts&) { throw InputError("bad share"); }),
                    Catch::Equals("bad share"));
}
