// executor/verify.cpp — accumulated against combined-batch updates. See verify.h.
#include "executor/verify.h"

#include <torch/optim.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "accumplan/errors.h"
#include "accumplan/solver.h"
#include "accumplan/token_model.h"
#include "accumplan/units.h"
#include "executor/executor.h"
#include "runtime/model.h"
#include "runtime/step.h"

namespace accumplan {
namespace {

void clear_grads(const torch::jit::Module& module) {
  for (auto p : trainable_parameters(module)) {
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
  }
}

// One forward in float32 (no autocast: verification compares at float32 precision) through the
// runtime's one step (runtime/step.h), on the device the module's parameters live on.
LossSum forward_loss(torch::jit::Module& module, const Batch& batch, const LossConfig& loss, bool padding_mask) {
  const auto params = trainable_parameters(module);
  StepConfig config{loss, AmpMode::None, params.empty() ? at::Device(at::kCPU) : params.front().device(), nullptr};
  config.padding_mask = padding_mask;
  return accumplan::forward_loss(module, batch, config);
}

std::vector<at::Tensor> snapshot(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone());
  return out;
}

bool all_equal(const std::vector<int64_t>& v) { return std::adjacent_find(v.begin(), v.end(), std::not_equal_to<>()) == v.end(); }

// A copy of `target` where microbatch i (of `sizes`) has the first floor(L·i/(k+1)) positions of
// each row set to ignore_index: microbatch 0 keeps every token, later ones fewer and fewer, so
// the valid counts differ per microbatch (8 positions, k = 3: 8, 6, 4 valid per row).
at::Tensor masked_target(const at::Tensor& target, const std::vector<int64_t>& sizes, int64_t ignore_index) {
  at::Tensor t = target.clone();
  const int64_t L = t.size(1);
  const int64_t k = static_cast<int64_t>(sizes.size());
  int64_t start = 0;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t cut = (L * i) / (k + 1);
    if (cut > 0) t.narrow(0, start, sizes[i]).narrow(1, 0, cut).fill_(ignore_index);
    start += sizes[i];
  }
  return t;
}

}  // namespace

GradientComparison compare_tensors(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b,
                                   const std::vector<std::string>& names) {
  if (a.size() != b.size()) throw InternalError("compare_tensors: lists of different length");
  GradientComparison c;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].sizes() != b[i].sizes()) throw InternalError("compare_tensors: tensors of different shape");
    TensorDiff d;
    d.name = i < names.size() ? names[i] : "tensor " + std::to_string(i);
    const at::Tensor x = a[i].detach().to(at::kDouble), y = b[i].detach().to(at::kDouble);
    d.max_abs = a[i].numel() ? (x - y).abs().max().item<double>() : 0.0;
    d.ref_max_abs = b[i].numel() ? y.abs().max().item<double>() : 0.0;
    if (!std::isfinite(d.max_abs)) d.max_abs = std::numeric_limits<double>::infinity();
    // max|a-b| / max|b|; both zero is agreement, a difference against an all-zero reference is not.
    d.max_rel = d.max_abs == 0 ? 0.0
                : d.ref_max_abs > 0 ? d.max_abs / d.ref_max_abs
                                    : std::numeric_limits<double>::infinity();
    c.max_abs = std::max(c.max_abs, d.max_abs);
    c.max_rel = std::max(c.max_rel, d.max_rel);
    c.tensors.push_back(std::move(d));
  }
  return c;
}

torch::jit::Module clone_module(const torch::jit::Module& module) {
  torch::jit::Module copy;
  {
    at::NoGradGuard no_grad;  // clones without history: leaves
    copy = module.deepcopy();
  }
  const auto src = module.named_parameters(true);
  const auto dst = copy.named_parameters(true);
  auto s = src.begin();
  for (auto d = dst.begin(); d != dst.end() && s != src.end(); ++d, ++s) {
    at::Tensor t = (*d).value;
    t.requires_grad_((*s).value.requires_grad());
  }
  copy.train(module.is_training());
  return copy;
}

std::vector<std::string> parameter_names(const torch::jit::Module& module) {
  std::vector<std::string> names;
  for (const auto& p : module.named_parameters(true)) {
    if (p.value.requires_grad()) names.push_back(p.name);
  }
  return names;
}

std::vector<at::Tensor> gradients_of(const torch::jit::Module& module) {
  std::vector<at::Tensor> out;
  for (const auto& p : trainable_parameters(module)) {
    out.push_back(p.grad().defined() ? p.grad().detach().clone() : at::zeros_like(p));
  }
  return out;
}

std::vector<at::Tensor> combined_gradients(torch::jit::Module module, const Batch& window, const LossConfig& loss,
                                           double* loss_out, bool padding_mask, bool freeze_batch_dependent) {
  module.train();
  if (freeze_batch_dependent) freeze_batch_dependent_layers(module);
  clear_grads(module);
  const LossSum ls = forward_loss(module, window, loss, padding_mask);
  if (ls.units == 0) throw InputError("the window has no valid units to compute a loss over");
  const at::Tensor mean = ls.sum / static_cast<double>(ls.units);
  if (loss_out) *loss_out = mean.detach().item<double>();
  mean.backward();
  auto g = gradients_of(module);
  clear_grads(module);
  return g;
}

std::vector<at::Tensor> naive_accumulated_gradients(torch::jit::Module module, const Batch& window,
                                                    const std::vector<int64_t>& sizes, const LossConfig& loss,
                                                    NaiveWeighting weighting, int64_t k, bool padding_mask,
                                                    bool freeze_batch_dependent) {
  (void)weighting;  // one recipe so far: MeanOverK
  module.train();
  if (freeze_batch_dependent) freeze_batch_dependent_layers(module);
  clear_grads(module);
  int64_t start = 0;
  for (const int64_t n : sizes) {
    const LossSum ls = forward_loss(module, window.slice(start, n), loss, padding_mask);
    start += n;
    if (ls.units == 0) continue;
    // "loss = criterion(out, y) / accum_iter": the microbatch MEAN over k.
    ((ls.sum / static_cast<double>(ls.units)) / static_cast<double>(k)).backward();
  }
  auto g = gradients_of(module);
  clear_grads(module);
  return g;
}

namespace {

// `sizes` empty: a packed plan, whose executor packs the window under plan.tokens itself.
VerifyScenario run_scenario(const torch::jit::Module& module, const Batch& window, const std::vector<int64_t>& sizes,
                            int64_t naive_k, const Plan& plan, const VerifyOptions& options) {
  VerifyScenario sc;
  sc.ran = true;
  sc.samples = batch_samples(window);
  const bool mask = plan.setup.padding_mask;
  if (sizes.empty()) {
    for (const auto& group : pack_by_token_budget(window.sequence_lengths(), plan.tokens->token_budget, plan.tokens->step_cost)) {
      sc.sizes.push_back(static_cast<int64_t>(group.size()));
      sc.units_per_microbatch.push_back(
          count_units(window.gather(group).target, static_cast<int64_t>(group.size()), options.loss));
    }
  } else {
    sc.sizes = sizes;
    for (int64_t start = 0, i = 0; i < static_cast<int64_t>(sizes.size()); start += sizes[i], ++i) {
      sc.units_per_microbatch.push_back(count_units(window.slice(start, sizes[i]).target, sizes[i], options.loss));
    }
  }
  const auto names = parameter_names(module);

  // Accumulated: the Executor, float32, no clipping, plain SGD so the update is -lr * gradient.
  torch::jit::Module acc = clone_module(module);
  auto acc_params = trainable_parameters(acc);
  torch::optim::SGD acc_opt(acc_params, torch::optim::SGDOptions(options.sgd_lr));
  ExecutorOptions eo;
  eo.loss = options.loss;
  eo.oom_recovery = false;
  eo.padding_mask = mask;
  eo.log = [](const std::string&) {};
  Executor ex(acc, acc_opt, plan, eo);  // sets training mode
  if (options.freeze_batch_dependent) freeze_batch_dependent_layers(acc);
  at::manual_seed(options.seed);
  WindowStats st = ex.accumulate(window, sizes);
  const auto acc_grads = gradients_of(acc);
  ex.apply(st);
  sc.units = st.units;
  sc.loss_accumulated = st.loss;
  sc.accumulated_optimizer_steps = ex.totals().optimizer_steps;
  const auto acc_after = snapshot(acc_params);

  // Combined: one forward/backward over the whole window, one SGD step.
  torch::jit::Module comb = clone_module(module);
  auto comb_params = trainable_parameters(comb);
  torch::optim::SGD comb_opt(comb_params, torch::optim::SGDOptions(options.sgd_lr));
  at::manual_seed(options.seed);
  double comb_loss = 0;
  const auto comb_grads = combined_gradients(comb, window, options.loss, &comb_loss, mask, options.freeze_batch_dependent);
  for (size_t i = 0; i < comb_params.size(); ++i) comb_params[i].mutable_grad() = comb_grads[i].clone();
  comb_opt.step();
  sc.combined_optimizer_steps = 1;
  clear_grads(comb);
  sc.loss_combined = comb_loss;
  const auto comb_after = snapshot(comb_params);

  sc.gradients = compare_tensors(acc_grads, comb_grads, names);
  sc.updates = compare_tensors(acc_after, comb_after, names);
  sc.loss_rel_diff = std::abs(sc.loss_accumulated - sc.loss_combined) / std::max(std::abs(sc.loss_combined), 1e-30);
  if (naive_k > 0 && !sizes.empty()) {
    at::manual_seed(options.seed);
    const auto naive = naive_accumulated_gradients(clone_module(module), window, sizes, options.loss,
                                                   NaiveWeighting::MeanOverK, naive_k, mask, options.freeze_batch_dependent);
    sc.naive_max_rel = compare_tensors(naive, comb_grads, names).max_rel;
  }
  sc.pass = sc.gradients.within(options.rtol) && sc.updates.within(options.rtol) && sc.loss_rel_diff <= options.rtol &&
            sc.accumulated_optimizer_steps == 1 && sc.combined_optimizer_steps == 1;
  return sc;
}

// What batch-dependent layers do to this check: in training mode they make the updates differ;
// frozen (--freeze-batch-dependent) the check is of the weighting alone, unless nothing could be
// frozen (a functional batch_norm in forward is no module to put in eval mode).
std::string batch_dependent_warning(const torch::jit::Module& module, const VerifyOptions& options) {
  std::string layers;
  for (const auto& l : options.batch_dependent_layers) layers += (layers.empty() ? "" : ", ") + l;
  if (options.freeze_batch_dependent && batch_dependent_layers(module).empty()) {
    return "--freeze-batch-dependent froze nothing: the batch-dependent layers (" + layers +
           ") are not BatchNorm or InstanceNorm modules of this model (a functional batch_norm in forward, say), so they "
           "ran in training mode and the differences below include them";
  }
  if (options.freeze_batch_dependent) {
    return "the batch-dependent layers (" + layers +
           ") ran in eval mode for this check (--freeze-batch-dependent): it checks the weighting alone. Training runs "
           "them in training mode, where each microbatch normalises with its own statistics and an accumulated update "
           "cannot equal the combined batch's";
  }
  return "the model has batch-dependent layers (" + layers +
         "): in training mode they normalise with each physical microbatch's own statistics, so an accumulated update "
         "cannot equal the combined batch's (and their running statistics are updated once per microbatch, not once "
         "per window). Differences below come from them, not from the weighting; use a larger microbatch, "
         "GroupNorm/LayerNorm, or accept the difference knowingly (verify --freeze-batch-dependent checks the "
         "weighting with those layers in eval mode)";
}

VerifyScenario not_run(const std::string& name, const std::string& why) {
  VerifyScenario sc;
  sc.name = name;
  sc.not_run_reason = why;
  sc.pass = true;
  return sc;
}

// A packed plan (plan.tokens) checked as it trains: under its token budget, under a budget of the
// window's longest sequence (the most microbatches of the most different lengths), and a short
// window.
void add_packed_scenarios(const torch::jit::Module& module, const Batch& window, const Plan& plan,
                          const VerifyOptions& options, VerifyReport& rep) {
  const int64_t T = batch_samples(window, "the verification window");
  if (!window.ragged()) {
    throw InputError("this plan packs ragged data by tokens (plan.tokens) but the samples have no sequence lengths; "
                     "verify with --data holding torch.save([list_of_1d_token_tensors, targets]) or without --data");
  }
  const std::vector<int64_t> lengths = window.sequence_lengths();
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  auto packed = [&](const std::string& name, const Batch& w, const Plan& p, const std::string& how) {
    auto sc = run_scenario(module, w, {}, 0, p, options);
    sc.name = name;
    sc.description = how + ": " + std::to_string(sc.sizes.size()) + " microbatches of " + join_sizes(sc.sizes) +
                     " sequences, " + join_sizes(sc.units_per_microbatch) + " units";
    rep.scenarios.push_back(std::move(sc));
  };
  packed("packed", window, plan, "packed under the plan's token budget of " + std::to_string(plan.tokens->token_budget));
  Plan tight = plan;
  tight.tokens->token_budget = longest;
  tight.tokens->max_seq_len = std::min(tight.tokens->max_seq_len, longest);
  packed("packed-tight", window, tight, "packed under a token budget of " + std::to_string(longest) + " (the longest sequence)");
  if (T < 2) {
    rep.scenarios.push_back(not_run("partial", "a window of " + std::to_string(T) + " sequence is too small to shorten"));
  } else {
    const int64_t n = T - std::max<int64_t>(1, T / 4);
    packed("partial", window.slice(0, n), tight, "a short window of " + std::to_string(n) + " of " + std::to_string(T) +
                                                    " sequences, packed under " + std::to_string(longest));
  }
}

// A sample plan: equal microbatches, unequal ones, a partial window, and token masks with a
// different number of valid tokens in every microbatch.
void add_sample_scenarios(const torch::jit::Module& module, const Batch& window, const Plan& plan,
                          const VerifyOptions& options, VerifyReport& rep) {
  const int64_t T = batch_samples(window, "the verification window");
  const int64_t m = std::max<int64_t>(1, std::min(plan.micro_batch, T));
  // equal: k >= 2 equal microbatches of at most the plan's microbatch.
  {
    int64_t d = largest_divisor_at_most(T, m);
    if (d == T && T > 1) d = largest_divisor_at_most(T, T / 2);
    const std::vector<int64_t> sizes(static_cast<size_t>(T / d), d);
    auto sc = run_scenario(module, window, sizes, static_cast<int64_t>(sizes.size()), plan, options);
    sc.name = "equal";
    sc.description = std::to_string(sizes.size()) + " equal microbatches of " + std::to_string(d);
    rep.scenarios.push_back(std::move(sc));
  }
  // unequal: the plan's sizes when they differ, else the fewest balanced parts that are unequal.
  std::vector<int64_t> unequal;
  if (!all_equal(plan.microbatch_sizes) && plan.per_rank_batch == T) {
    unequal = plan.microbatch_sizes;
  } else {
    for (int64_t k = std::max<int64_t>(2, (T + m - 1) / m); k <= T && unequal.empty(); ++k) {
      if (T % k != 0) unequal = balanced_split(T, k);
    }
  }
  if (unequal.empty()) {
    rep.scenarios.push_back(not_run("unequal", "every split of " + std::to_string(T) + " samples is equal"));
  } else {
    auto sc = run_scenario(module, window, unequal, static_cast<int64_t>(unequal.size()), plan, options);
    sc.name = "unequal";
    sc.description = "unequal microbatches " + join_sizes(unequal) + " (the mean of microbatch means would differ)";
    rep.scenarios.push_back(std::move(sc));
  }
  // partial: the last window of an epoch, shorter than the plan's per-rank batch, with its own N.
  if (T < 3) {
    rep.scenarios.push_back(not_run("partial", "a window of " + std::to_string(T) + " samples is too small to shorten"));
  } else {
    const int64_t n = T - std::max<int64_t>(1, T / 4);
    const int64_t cap = std::max<int64_t>(1, std::min(m, (n + 1) / 2));
    const auto sizes = split_samples(n, cap, "balanced");
    auto sc = run_scenario(module, window.slice(0, n), sizes, std::max<int64_t>(1, plan.accumulation_steps), plan,
                           options);
    sc.name = "partial";
    sc.description = "a short last window of " + std::to_string(n) + " of " + std::to_string(T) + " samples as " +
                     join_sizes(sizes) + " (dividing by the plan's k = " + std::to_string(plan.accumulation_steps) +
                     " would differ)";
    rep.scenarios.push_back(std::move(sc));
  }
  // token masks: a different number of valid tokens in every microbatch.
  const at::Tensor& target = window.target;
  const bool token_target = options.loss.kind == "cross_entropy" && target.defined() && target.dim() == 2 &&
                            !at::isFloatingType(target.scalar_type()) && target.size(1) >= 2;
  if (!token_target) {
    rep.scenarios.push_back(not_run("token-masks", "the target is not per-token (cross_entropy over [B,T] targets)"));
  } else {
    std::vector<int64_t> sizes = unequal.empty() ? std::vector<int64_t>(static_cast<size_t>(T), 1) : unequal;
    if (sizes.size() < 2) sizes = {T};
    Batch masked = window;
    masked.target = masked_target(target, sizes, options.loss.ignore_index);
    auto sc = run_scenario(module, masked, sizes, static_cast<int64_t>(sizes.size()), plan, options);
    sc.name = "token-masks";
    sc.description = "microbatches " + join_sizes(sizes) + " with " + join_sizes(sc.units_per_microbatch) +
                     " units (" + rep.normalization + " normalization)";
    rep.scenarios.push_back(std::move(sc));
  }
}

}  // namespace

VerifyReport verify_accumulation(const torch::jit::Module& module, const Batch& window, const Plan& plan,
                                 const VerifyOptions& options) {
  VerifyReport rep;
  rep.rtol = options.rtol;
  rep.normalization = to_string(options.loss.normalization);
  batch_samples(window, "the verification window");  // refuses an empty or inconsistent window first

  if (!options.batch_dependent_layers.empty()) rep.warnings.push_back(batch_dependent_warning(module, options));

  if (plan.tokens) {
    add_packed_scenarios(module, window, plan, options, rep);
  } else {
    add_sample_scenarios(module, window, plan, options, rep);
  }

  rep.pass = std::all_of(rep.scenarios.begin(), rep.scenarios.end(), [](const VerifyScenario& s) { return s.pass; });
  if (!rep.pass) {
    rep.warnings.push_back(
        "accumulated and combined updates differ beyond the tolerance. Besides batch-dependent layers, "
        "randomness in the forward (dropout) and ops whose result depends on the batch make them differ");
  }
  return rep;
}

nlohmann::ordered_json to_json(const VerifyReport& r) {
  nlohmann::ordered_json j;
  j["pass"] = r.pass;
  j["rtol"] = r.rtol;
  j["normalization"] = r.normalization;
  j["warnings"] = r.warnings;
  j["scenarios"] = nlohmann::ordered_json::array();
  for (const auto& s : r.scenarios) {
    nlohmann::ordered_json o;
    o["name"] = s.name;
    o["ran"] = s.ran;
    if (!s.ran) {
      o["reason"] = s.not_run_reason;
      j["scenarios"].push_back(o);
      continue;
    }
    o["pass"] = s.pass;
    o["description"] = s.description;
    o["samples"] = s.samples;
    o["units"] = s.units;
    o["microbatch_sizes"] = s.sizes;
    o["units_per_microbatch"] = s.units_per_microbatch;
    o["loss_accumulated"] = s.loss_accumulated;
    o["loss_combined"] = s.loss_combined;
    o["loss_rel_diff"] = s.loss_rel_diff;
    o["accumulated_optimizer_steps"] = s.accumulated_optimizer_steps;
    o["combined_optimizer_steps"] = s.combined_optimizer_steps;
    o["grad_max_abs_diff"] = s.gradients.max_abs;
    o["grad_max_rel_diff"] = s.gradients.max_rel;
    o["params_after_step_max_rel_diff"] = s.updates.max_rel;
    if (s.naive_max_rel >= 0) o["naive_loss_over_k_grad_max_rel_diff"] = s.naive_max_rel;
    nlohmann::ordered_json params = nlohmann::ordered_json::array();
    for (size_t i = 0; i < s.gradients.tensors.size(); ++i) {
      const auto& d = s.gradients.tensors[i];
      params.push_back({{"name", d.name}, {"grad_max_abs_diff", d.max_abs}, {"grad_max_rel_diff", d.max_rel},
                        {"params_after_step_max_rel_diff", s.updates.tensors[i].max_rel}});
    }
    o["parameters"] = params;
    j["scenarios"].push_back(o);
  }
  return j;
}

std::string format_table(const VerifyReport& r) {
  std::ostringstream out;
  char buf[512];
  std::snprintf(buf, sizeof buf, "%-12s %-16s %8s %12s %12s %10s %10s %6s %11s  %s\n", "scenario", "microbatches", "N",
                "loss acc", "loss comb", "max|dg|", "max rel", "steps", "loss/k rel", "result");
  out << buf;
  for (const auto& s : r.scenarios) {
    if (!s.ran) {
      out << "  " << s.name << ": not run (" << s.not_run_reason << ")\n";
      continue;
    }
    std::string sizes = join_sizes(s.sizes);
    if (sizes.size() > 16) sizes = sizes.substr(0, 13) + "...";
    std::snprintf(buf, sizeof buf, "%-12s %-16s %8lld %12.6g %12.6g %10.2e %10.2e %3lld/%-2lld %11s  %s\n", s.name.c_str(),
                  sizes.c_str(), static_cast<long long>(s.units), s.loss_accumulated, s.loss_combined, s.gradients.max_abs,
                  s.gradients.max_rel, static_cast<long long>(s.accumulated_optimizer_steps),
                  static_cast<long long>(s.combined_optimizer_steps),
                  s.naive_max_rel >= 0 ? (std::to_string(s.naive_max_rel).substr(0, 9)).c_str() : "-",
                  s.pass ? "ok" : "DIFFERS");
    out << buf;
  }
  out << "\nper parameter (max abs / max rel gradient difference, accumulated vs combined):\n";
  for (const auto& s : r.scenarios) {
    if (!s.ran) continue;
    for (const auto& d : s.gradients.tensors) {
      std::snprintf(buf, sizeof buf, "  %-12s %-32s %10.2e %10.2e\n", s.name.c_str(), d.name.c_str(), d.max_abs, d.max_rel);
      out << buf;
    }
  }
  std::snprintf(buf, sizeof buf, "\ntolerance: relative %.0e (float32); 'loss/k rel' is what dividing each microbatch mean by k would give.\n",
                r.rtol);
  out << buf;
  // Warnings go to stderr (and the JSON), once: not repeated in this table.
  out << (r.pass ? "verify: accumulated updates equal combined-batch updates\n"
                 : "verify: accumulated updates DIFFER from combined-batch updates\n");
  return out.str();
}

}  // namespace accumplan
