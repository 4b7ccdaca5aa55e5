// test_packing.cpp — ragged data under a packed plan (plan.tokens): the executor packs each window's
// sequences under the token budget, weights by the window's valid tokens, and re-packs after an
// out-of-memory (the executor side).
//
// What it is: every packed window's accumulated gradient is compared with a reference computed
// one sequence at a time, UNPADDED, with ATen's summed cross-entropy divided by the window's valid
// tokens — no padding, no packing, no loss.cpp — so neither a padding nor a weighting bug can hide
// in the reference. OOM is injected with the counting allocator (a real c10::OutOfMemoryError) at
// every microbatch position. A small attention model shows why the padding mask exists: with it
// the packed gradient matches the unpadded one, without it it does not.
// What it is not: the planner's packing rule (tests/planner/test_token_model.cpp) or a benchmark.
#include <torch/torch.h>

#include <random>

#include "accumplan/errors.h"
#include "accumplan/memory_probe.h"
#include "accumplan/token_model.h"
#include "cpu_counting_probe.h"
#include "executor/executor.h"
#include "executor/verify.h"
#include "executor_fixtures.h"

// Last: torch/torch.h brings glog's CHECK macro, which would shadow Catch's.
#include "catch_after_torch.h"

using namespace accumplan;
using namespace accumplan::test;

namespace {

constexpr int64_t kVocab = 7;

struct Ragged {
  std::vector<at::Tensor> sequences;  // 1-D int64, unpadded
  std::vector<at::Tensor> targets;    // same lengths
};

// `n` sequences with lengths drawn from 1..max_len (seeded), tokens and targets in [0, kVocab).
Ragged make_ragged(int64_t n, int64_t max_len, uint64_t seed) {
  std::mt19937 rng(static_cast<unsigned>(seed));
  std::uniform_int_distribution<int64_t> len(1, max_len);
  torch::manual_seed(seed);
  Ragged r;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t l = len(rng);
    r.sequences.push_back(torch::randint(0, kVocab, {l}, torch::kLong));
    r.targets.push_back(torch::randint(0, kVocab, {l}, torch::kLong));
  }
  return r;
}

Plan packed_plan(int64_t samples, int64_t token_budget, int64_t max_seq_len) {
  Plan p = make_plan_with({samples});
  p.tokens = TokenBudget{token_budget, max_seq_len, max_seq_len};
  return p;
}

// The mean per-token loss of the whole window, one unpadded sequence at a time: sum of ATen's
// summed cross-entropy over every sequence, divided by the valid tokens, then backward.
std::vector<at::Tensor> unpadded_reference(torch::jit::Module module, const Ragged& data, bool with_mask) {
  for (auto p : module.parameters()) p.mutable_grad() = at::Tensor();
  at::Tensor sum = torch::zeros({});
  int64_t tokens = 0;
  for (size_t i = 0; i < data.sequences.size(); ++i) {
    const at::Tensor x = data.sequences[i].unsqueeze(0);
    std::vector<c10::IValue> args{x};
    if (with_mask) args.emplace_back(torch::zeros({1, x.size(1)}, torch::kBool));
    const at::Tensor out = module.forward(args).toTensor();
    sum = sum + at::cross_entropy_loss(out.reshape({-1, kVocab}), data.targets[i], {}, at::Reduction::Sum);
    tokens += x.size(1);
  }
  (sum / static_cast<double>(tokens)).backward();
  auto g = gradients_of(module);
  for (auto p : module.parameters()) p.mutable_grad() = at::Tensor();
  return g;
}

struct PackingOutcome {
  std::vector<at::Tensor> grads;
  WindowStats stats;
  Plan plan;
  std::vector<MicrobatchEvent> events;
  std::vector<ReplanEvent> replans;
  std::vector<std::string> log;
};

PackingOutcome run_packed(const torch::jit::Module& model, const Plan& plan, const Batch& window, MemoryProbe* probe,
                   bool padding_mask = false, std::function<void(const MicrobatchEvent&)> hook = {}) {
  auto m = clone_module(model);
  auto params = params_of(m);
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1));
  PackingOutcome out;
  ExecutorOptions o;
  o.loss.normalization = Normalization::Tokens;
  o.probe = probe;
  o.padding_mask = padding_mask;
  o.before_microbatch = [&](const MicrobatchEvent& e) {
    out.events.push_back(e);
    if (hook) hook(e);
  };
  o.on_replan = [&](const ReplanEvent& e) { out.replans.push_back(e); };
  o.log = [&](const std::string& l) { out.log.push_back(l); };
  Executor ex(m, opt, plan, o);
  out.stats = ex.accumulate(window);
  out.grads = gradients_of(m);
  out.plan = ex.plan();
  return out;
}

// embedding -> single-head self-attention (optionally with a key padding mask) -> logits [B,T,V].
torch::jit::Module make_attention_lm(bool takes_mask, uint64_t seed = 5, int64_t dim = 6) {
  torch::manual_seed(seed);
  torch::jit::Module m("AttnLm");
  m.register_parameter("emb", (torch::randn({kVocab, dim}) * 0.7).requires_grad_(), false);
  m.register_parameter("wq", (torch::randn({dim, dim}) * 0.5).requires_grad_(), false);
  m.register_parameter("wk", (torch::randn({dim, dim}) * 0.5).requires_grad_(), false);
  m.register_parameter("wv", (torch::randn({dim, dim}) * 0.5).requires_grad_(), false);
  m.register_parameter("out", (torch::randn({dim, kVocab}) * 0.7).requires_grad_(), false);
  const std::string body = R"(
    e = torch.embedding(self.emb, x)
    q = torch.matmul(e, self.wq)
    k = torch.matmul(e, self.wk)
    v = torch.matmul(e, self.wv)
    s = torch.matmul(q, k.transpose(1, 2)) / 2.0
)";
  const std::string tail = R"(
    a = torch.softmax(s, -1)
    h = torch.tanh(torch.matmul(a, v) + e)
    return torch.matmul(h, self.out)
)";
  if (takes_mask) {
    // nn.MultiheadAttention's key_padding_mask rule: a key at a padding position gets -inf.
    m.define("def forward(self, x, mask):" + body + "    s = s.masked_fill(mask.unsqueeze(1), -1.0e9)" + tail);
  } else {
    m.define("def forward(self, x):" + body + tail);
  }
  m.train();
  return m;
}

}  // namespace

TEST_CASE("Packing: the accumulated gradient equals the unpadded per-token gradient of the window", "[packing]") {
  const auto model = make_tiny_lm(2, kVocab, 5);
  const Ragged data = make_ragged(13, 20, 21);
  const Batch window = ragged_batch(data.sequences, data.targets);
  const std::vector<int64_t> lengths = window.sequence_lengths();
  const int64_t valid = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
  const Plan plan = packed_plan(13, 40, 20);
  const PackingOutcome o = run_packed(model, plan, window, nullptr);

  CHECK(o.stats.units == valid);  // N: the valid tokens, not the padded ones
  CHECK(o.stats.valid_tokens == valid);
  // The microbatches are the planner's packing: the same groups, each within the budget.
  const auto groups = pack_by_token_budget(lengths, 40);
  REQUIRE(o.events.size() == groups.size());
  CHECK(groups.size() > 1);
  int64_t sequences = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    CHECK(o.events[i].size == static_cast<int64_t>(groups[i].size()));
    CHECK(o.events[i].padded_tokens == o.events[i].size * lengths[static_cast<size_t>(groups[i].front())]);
    CHECK(o.events[i].padded_tokens <= 40);
    sequences += o.events[i].size;
  }
  CHECK(sequences == 13);
  const double rel = compare_tensors(o.grads, unpadded_reference(clone_module(model), data, false)).max_rel;
  report("packed gradient vs unpadded reference, tiny LM, max rel", rel);
  CHECK(rel <= 1e-5);
  // Padded to the window's longest in one microbatch (the sample plan's way): the same gradient.
  Plan one = make_plan_with({13});
  const PackingOutcome whole = run_packed(model, one, window, nullptr);
  CHECK(compare_tensors(whole.grads, o.grads).max_rel <= 1e-5);
}

TEST_CASE("Packing: with a step cost the executor cuts where it is cheapest, and the gradient is unchanged",
          "[packing][step-cost]") {
  const auto model = make_tiny_lm(2, kVocab, 5);
  const Ragged data = make_ragged(13, 20, 21);
  const Batch window = ragged_batch(data.sequences, data.targets);
  const std::vector<int64_t> lengths = window.sequence_lengths();
  Plan plan = packed_plan(13, 40, 20);
  // A microbatch costs as much as 2 padded tokens: padding weighs more than filling the budget.
  plan.tokens->step_cost = TokenStepCost{2 * kStepCostPerToken, kStepCostPerToken, 0};
  const PackingOutcome o = run_packed(model, plan, window, nullptr);
  const auto groups = pack_by_token_budget(lengths, 40, plan.tokens->step_cost);
  CHECK(groups != pack_by_token_budget(lengths, 40));  // not the fill
  REQUIRE(o.events.size() == groups.size());
  int64_t padded = 0, filled = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    CHECK(o.events[i].size == static_cast<int64_t>(groups[i].size()));
    CHECK(o.events[i].padded_tokens <= 40);
    padded += o.events[i].padded_tokens;
  }
  for (const auto& g : pack_by_token_budget(lengths, 40)) filled += int64_t(g.size()) * lengths[size_t(g.front())];
  CHECK(padded < filled);  // fewer padded tokens than the fill, at more microbatches
  const double rel = compare_tensors(o.grads, unpadded_reference(clone_module(model), data, false)).max_rel;
  report("packed by step cost vs unpadded reference, tiny LM, max rel", rel);
  CHECK(rel <= 1e-5);
}

TEST_CASE("Packing: a sample plan on ragged data cuts each microbatch to its own longest sequence", "[packing]") {
  // Token ids 1..6, so 0 is padding only; the model refuses a last column that is all padding,
  // which a slice padded to the window's longest would have.
  torch::manual_seed(2);
  torch::jit::Module strict("StrictLm");
  strict.register_parameter("emb", (torch::randn({kVocab, 5}) * 0.7).requires_grad_(), false);
  strict.register_parameter("out", (torch::randn({5, kVocab}) * 0.7).requires_grad_(), false);
  strict.define(R"(
def forward(self, x):
    assert not bool((x[:, -1] == 0).all()), "padded past the microbatch's longest sequence"
    return torch.matmul(torch.tanh(torch.embedding(self.emb, x)), self.out)
)");
  Ragged data = make_ragged(12, 20, 23);
  for (auto& seq : data.sequences) seq = seq.remainder(kVocab - 1) + 1;
  const Batch window = ragged_batch(data.sequences, data.targets);
  const std::vector<int64_t> lengths = window.sequence_lengths();
  int64_t shorter = 0;  // slices whose own longest is below the window's
  for (int64_t start = 0; start < 12; start += 4) {
    shorter += *std::max_element(lengths.begin() + start, lengths.begin() + start + 4) < window.padded_length() ? 1 : 0;
  }
  REQUIRE(shorter > 0);
  const PackingOutcome o = run_packed(strict, make_plan_with({4, 4, 4}), window, nullptr);
  CHECK(o.stats.microbatch_sizes == std::vector<int64_t>{4, 4, 4});
  const double rel = compare_tensors(o.grads, unpadded_reference(clone_module(strict), data, false)).max_rel;
  CHECK(rel <= 1e-5);
}

TEST_CASE("Packing: an out-of-memory at any microbatch re-packs under a lower budget and gives the same gradient",
          "[packing][oom]") {
  auto probe_owner = make_memory_probe({"cpu", "cpu-counting", std::nullopt});
  auto* probe = dynamic_cast<CpuCountingProbe*>(probe_owner.get());
  REQUIRE(probe != nullptr);
  const auto model = make_tiny_lm(2, kVocab, 5);
  const Ragged data = make_ragged(17, 24, 33);
  const Batch window = ragged_batch(data.sequences, data.targets);
  // Filled to the budget, and cut by a step cost (a microbatch worth 3 padded tokens).
  Plan plan = packed_plan(17, 60, 24);
  if (GENERATE(false, true)) plan.tokens->step_cost = TokenStepCost{3 * kStepCostPerToken, kStepCostPerToken, 0};
  INFO("step cost: " << (plan.tokens->step_cost ? "yes" : "none"));
  const auto reference = unpadded_reference(clone_module(model), data, false);
  const PackingOutcome clean = run_packed(model, plan, window, probe);
  const int64_t count = static_cast<int64_t>(clean.events.size());
  REQUIRE(count >= 3);
  double worst = 0;
  const std::vector<int64_t> lengths = window.sequence_lengths();
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  int64_t recovered = 0;
  for (int64_t position = 0; position < count; ++position) {
    const int64_t failing_tokens = clean.events[static_cast<size_t>(position)].padded_tokens;
    bool fired = false;
    auto fail_here = [&](const MicrobatchEvent& e) {
      if (e.attempt == 0 && e.index == position) {
        probe->fail_allocation_after(1);
        fired = true;
      }
    };
    INFO("OOM at microbatch " << position + 1 << " of " << count << " (" << failing_tokens << " padded tokens)");
    if (std::min<int64_t>(60, failing_tokens - 1) < longest) {
      // A microbatch smaller than the window's longest sequence ran out of memory (cut by a step
      // cost, microbatches can be): no budget below it holds that sequence, and the run says so.
      CHECK_THROWS_WITH(run_packed(model, plan, window, probe, false, fail_here),
                        Catch::Contains("cannot hold this window's longest sequence of " + std::to_string(longest)));
      CHECK(fired);
      continue;
    }
    ++recovered;
    const PackingOutcome o = run_packed(model, plan, window, probe, false, fail_here);
    REQUIRE(fired);
    CHECK(o.stats.oom_recoveries == 1);
    REQUIRE(o.plan.tokens.has_value());
    CHECK(o.plan.tokens->token_budget == std::min<int64_t>(60, failing_tokens - 1));
    REQUIRE(o.replans.size() == 1);
    CHECK(o.replans[0].failing_size == failing_tokens);
    // The replay: every sequence once, every microbatch under the new budget.
    int64_t sequences = 0;
    for (const auto& e : o.events) {
      if (e.attempt != 1) continue;
      sequences += e.size;
      CHECK(e.padded_tokens <= o.plan.tokens->token_budget);
    }
    CHECK(sequences == 17);
    CHECK(o.stats.microbatch_sizes == o.replans[0].microbatch_sizes);
    REQUIRE(o.log.size() == 1);
    CHECK_THAT(o.log[0], Catch::Contains("(" + std::to_string(failing_tokens) + " padded tokens); token budget lowered to"));
    const double rel = compare_tensors(o.grads, reference).max_rel;
    worst = std::max(worst, rel);
    CHECK(rel <= 1e-5);
  }
  CHECK(recovered >= 3);
  report("packed gradient after an OOM at any microbatch vs unpadded reference, max rel", worst);
}

TEST_CASE("Packing: the padding mask keeps attention off the padding", "[packing][mask]") {
  const Ragged data = make_ragged(9, 12, 41);
  const Batch window = ragged_batch(data.sequences, data.targets);
  const Plan plan = packed_plan(9, 30, 12);
  const auto masked = make_attention_lm(true);
  const PackingOutcome with_mask = run_packed(masked, plan, window, nullptr, /*padding_mask=*/true);
  const double rel = compare_tensors(with_mask.grads, unpadded_reference(clone_module(masked), data, true)).max_rel;
  report("packed attention gradient with the padding mask vs unpadded reference, max rel", rel);
  CHECK(rel <= 1e-5);
  // The same weights without the mask: valid positions attend to padding, the gradient moves.
  const auto unmasked = make_attention_lm(false);
  const PackingOutcome without = run_packed(unmasked, plan, window, nullptr, /*padding_mask=*/false);
  const double off = compare_tensors(without.grads, unpadded_reference(clone_module(unmasked), data, false)).max_rel;
  INFO("without the mask: max rel " << off);
  CHECK(off > 1e-3);
}

TEST_CASE("Packing: what a packed plan cannot run is refused with the fix", "[packing][errors]") {
  auto probe_owner = make_memory_probe({"cpu", "cpu-counting", std::nullopt});
  auto* probe = dynamic_cast<CpuCountingProbe*>(probe_owner.get());
  const auto model = make_tiny_lm(2, kVocab, 5);
  const Ragged data = make_ragged(6, 10, 51);
  const Batch window = ragged_batch(data.sequences, data.targets);
  const int64_t longest = window.padded_length();
  // A sequence longer than the plan's max_seq_len.
  CHECK_THROWS_WITH(run_packed(model, packed_plan(6, 100, longest - 1), window, nullptr),
                    Catch::Contains("holds a sequence of " + std::to_string(longest) + " tokens") &&
                        Catch::Contains("truncate the sequences or plan again with a longer --seq-len"));
  // A fixed-shape window under a packed plan.
  CHECK_THROWS_WITH(run_packed(model, packed_plan(6, 100, 10), token_batch(6, 8, 13, kVocab), nullptr),
                    Catch::Contains("holds fixed-shape samples with no sequence lengths"));
  // An OOM with the longest sequence alone: no budget below it can hold it.
  const std::vector<int64_t> lengths = window.sequence_lengths();
  const Plan tight = packed_plan(6, longest, longest);  // the longest sequence gets a microbatch of its own
  CHECK_THROWS_AS(run_packed(model, tight, window, probe, false,
                             [&](const MicrobatchEvent& e) {
                               if (e.index == 0) probe->fail_allocation_after(1);
                             }),
                  ExecutorOomError);
  CHECK_THROWS_WITH(run_packed(model, tight, window, probe, false,
                               [&](const MicrobatchEvent& e) {
                                 if (e.index == 0) probe->fail_allocation_after(1);
                               }),
                    Catch::Contains("cannot hold this window's longest sequence of " + std::to_string(longest) +
                                    " tokens") &&
                        Catch::Contains("Truncate the sequences"));
  CHECK(probe->current_bytes() >= 0);
}

TEST_CASE("Packing: a run cuts later windows by the fit over its own microbatch times; fill fills",
          "[packing][step-time]") {
  const auto model = make_tiny_lm(2, kVocab, 5);
  std::vector<Batch> windows;
  for (uint64_t seed = 31; seed < 36; ++seed) {
    const Ragged data = make_ragged(13, 20, seed);
    windows.push_back(ragged_batch(data.sequences, data.targets));
  }
  const Plan plan = packed_plan(13, 40, 20);  // no step cost: the first window is filled
  int64_t predicted = 0;  // microbatches of windows cut by a cost with seconds
  auto run = [&](Packing packing, const std::function<void(Executor&, size_t, const std::vector<MicrobatchEvent>&)>& check) {
    predicted = 0;
    auto m = clone_module(model);
    auto params = params_of(m);
    torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1));
    std::vector<MicrobatchEvent> events;
    ExecutorOptions o;
    o.loss.normalization = Normalization::Tokens;
    o.packing = packing;
    o.before_microbatch = [&](const MicrobatchEvent& e) { events.push_back(e); };
    Executor ex(m, opt, plan, o);
    for (size_t w = 0; w < windows.size(); ++w) {
      events.clear();
      const std::optional<TokenStepCost> next = ex.time_model()->final_cost;  // what window w is cut by
      const WindowStats st = ex.step(windows[w]);
      const auto groups = pack_by_token_budget(windows[w].sequence_lengths(), 40, next);
      REQUIRE(events.size() == groups.size());
      for (size_t i = 0; i < groups.size(); ++i) CHECK(events[i].size == static_cast<int64_t>(groups[i].size()));
      CHECK(st.microbatch_seconds.value_or(0) > 0);
      CHECK(st.predicted_seconds.has_value() == (next && next->token_seconds > 0));
      if (st.predicted_seconds) predicted += static_cast<int64_t>(events.size());
      check(ex, w, events);
    }
    return *ex.time_model();
  };
  // Time: the first window has no cost (filled); every later one is cut by a fit with seconds,
  // made from the windows before it.
  const RunTimeModel learned = run(Packing::Time, [](Executor& ex, size_t, const std::vector<MicrobatchEvent>&) {
    const std::optional<TokenStepCost> c = ex.time_model()->final_cost;
    REQUIRE(c.has_value());
    CHECK(c->token_seconds > 0);
  });
  CHECK(learned.packing == "time");
  CHECK(learned.refits == static_cast<int64_t>(windows.size()));
  CHECK(learned.microbatches == predicted);  // every microbatch of windows 1..4 had a prediction
  CHECK(predicted > 0);
  // Fill: never a cost, every window filled, no fit.
  const RunTimeModel filled = run(Packing::Fill, [](Executor& ex, size_t, const std::vector<MicrobatchEvent>&) {
    CHECK_FALSE(ex.time_model()->final_cost.has_value());
  });
  CHECK(filled.packing == "fill");
  CHECK(filled.refits == 0);
  CHECK(filled.microbatches == 0);
}
