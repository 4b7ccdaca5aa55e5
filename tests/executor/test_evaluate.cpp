// test_evaluate.cpp — the one evaluation loop (executor/evaluate.h): the mean loss does not depend
// on the split, the model is in eval mode while it runs and its flags are put back, an out-of-memory
// re-splits from the failing microbatch at half its size with nothing skipped, one sample that
// does not fit is an error, and kept outputs are handed over one microbatch behind.
//
// What it is: the real CPU counting allocator with injected faults (MemoryProbe::
// fail_allocation_after, armed before a microbatch), so the OOM is a real c10::OutOfMemoryError.
// What it is not: the planner's eval search (tests/planner/test_search.cpp [eval]) or the CLI
// (test_cli_executor.cpp, run --eval-data).
#include <torch/torch.h>

#include "accumplan/errors.h"
#include "accumplan/memory_probe.h"
#include "accumplan/replan.h"
#include "cpu_counting_probe.h"
#include "executor/evaluate.h"
#include "executor/executor.h"
#include "executor_fixtures.h"

// Last: torch/torch.h brings glog's CHECK macro, which would shadow Catch's.
#include "catch_after_torch.h"

using namespace accumplan;
using namespace accumplan::test;

namespace {

// An MLP with dropout p = 0.5 that follows self.training: in training mode two splits of the same
// batch would draw different masks; in eval mode the loss is a function of the batch alone.
torch::jit::Module make_dropout_mlp() {
  torch::manual_seed(7);
  torch::jit::Module m("DropNet");
  m.register_parameter("w1", (torch::randn({16, 6}) * 0.4).requires_grad_(), false);
  m.register_parameter("w2", (torch::randn({3, 16}) * 0.4).requires_grad_(), false);
  m.register_attribute("training", c10::BoolType::get(), true);
  m.define(R"(
def forward(self, x):
    h = torch.dropout(torch.relu(torch.matmul(x, self.w1.t())), 0.5, self.training)
    return torch.matmul(h, self.w2.t())
)");
  m.train();
  return m;
}

EvalStats run_eval(torch::jit::Module& m, const Batch& data, const std::vector<int64_t>& sizes, MemoryProbe* probe,
                   std::function<void(int64_t, int64_t)> hook = {}) {
  EvalOptions o;
  o.probe = probe;
  o.before_microbatch = std::move(hook);
  return evaluate(m, data, sizes, o);
}

}  // namespace

TEST_CASE("Evaluate: the mean loss is the whole batch's in eval mode, whatever the split, its flags put back",
          "[evaluate]") {
  auto m = make_dropout_mlp();
  const Batch data = classification_batch(12, 21);
  const EvalStats whole = run_eval(m, data, {12}, nullptr);
  const EvalStats split = run_eval(m, data, {5, 5, 2}, nullptr);
  CHECK(whole.units == 12);
  CHECK(split.microbatch_sizes == std::vector<int64_t>{5, 5, 2});
  CHECK(std::abs(whole.mean() - split.mean()) <= 1e-6);
  // The reference: one forward of the batch in eval mode, the mean cross-entropy.
  m.eval();
  const at::Tensor out = m.forward({data.inputs[0]}).toTensor();
  m.train();
  const double reference = torch::nn::functional::cross_entropy(out, data.target).item<double>();
  CHECK(std::abs(whole.mean() - reference) <= 1e-6);
  CHECK(m.is_training());  // put back
  CHECK_FALSE(data.inputs[0].requires_grad());
}

TEST_CASE("Evaluate: an out-of-memory re-splits the rest at half the failing size, nothing skipped",
          "[evaluate][oom]") {
  auto probe_owner = make_memory_probe({"cpu", "cpu-counting", std::nullopt});
  auto* probe = dynamic_cast<CpuCountingProbe*>(probe_owner.get());
  REQUIRE(probe != nullptr);
  auto m = make_dropout_mlp();
  const Batch data = classification_batch(12, 22);
  const EvalStats clean = run_eval(m, data, {4, 4, 4}, probe);
  bool fired = false;
  std::vector<std::string> log;
  EvalOptions o;
  o.probe = probe;
  o.log = [&](const std::string& line) { log.push_back(line); };
  o.before_microbatch = [&](int64_t i, int64_t) {
    if (i == 1 && !fired) {
      probe->fail_allocation_after(1);
      fired = true;
    }
  };
  const EvalStats st = evaluate(m, data, {4, 4, 4}, o);
  REQUIRE(fired);
  CHECK(st.oom_recoveries == 1);
  CHECK(st.microbatch_sizes == std::vector<int64_t>{4, 2, 2, 2, 2});
  CHECK(st.units == 12);
  CHECK(std::abs(st.mean() - clean.mean()) <= 1e-6);
  REQUIRE(log.size() == 1);
  CHECK(log[0].find("at a microbatch of 4 samples; the 8 samples from sample 4 on run in microbatches of 2") !=
        std::string::npos);
  CHECK_FALSE(probe->oom_happened());
}

TEST_CASE("Evaluate: out of memory at one sample ends the evaluation, and with recovery off it propagates", "[evaluate][oom]") {
  auto probe_owner = make_memory_probe({"cpu", "cpu-counting", std::nullopt});
  auto* probe = dynamic_cast<CpuCountingProbe*>(probe_owner.get());
  REQUIRE(probe != nullptr);
  auto m = make_dropout_mlp();
  const Batch data = classification_batch(3, 23);
  CHECK_THROWS_AS(run_eval(m, data, {1, 1, 1}, probe, [&](int64_t i, int64_t) {
                    if (i == 2) probe->fail_allocation_after(1);
                  }),
                  ExecutorOomError);
  probe->clear_oom();
  EvalOptions off;
  off.probe = probe;
  off.oom_recovery = false;
  off.before_microbatch = [&](int64_t i, int64_t) {
    if (i == 0) probe->fail_allocation_after(1);
  };
  CHECK_THROWS(evaluate(m, data, {3}, off));
  CHECK(m.is_training());  // put back on the way out too
  probe->clear_oom();
}

TEST_CASE("Evaluate: kept outputs are handed over one microbatch behind, every sample once", "[evaluate]") {
  auto m = make_dropout_mlp();
  const Batch data = classification_batch(10, 24);
  std::vector<int64_t> starts, rows;
  int64_t seen_before_next = -1;
  EvalOptions o;
  o.keep_outputs = true;
  o.before_microbatch = [&](int64_t i, int64_t) {
    if (i == 2) seen_before_next = static_cast<int64_t>(starts.size());
  };
  o.on_outputs = [&](const at::Tensor& out, int64_t start) {
    starts.push_back(start);
    rows.push_back(out.size(0));
  };
  evaluate(m, data, eval_split(10, 4), o);
  CHECK(starts == std::vector<int64_t>{0, 4, 8});
  CHECK(rows == std::vector<int64_t>{4, 4, 2});
  CHECK(seen_before_next == 1);  // microbatch 0's outputs went only after microbatch 1 ran
}
