// solver.cpp — the planner's arithmetic. See solver.h and docs/architecture.md "What the planner solves".
#include "accumplan/solver.h"
#include "accumplan/sharding.h"
#include "accumplan/units.h"

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "accumplan/checked.h"
#include "accumplan/checkpoint.h"
#include "accumplan/errors.h"
#include "accumplan/memory_model.h"
#include "accumplan/step_time.h"
#include "accumplan/tensor_spec.h"
#include "accumplan/terms.h"
#include "accumplan/token_model.h"

namespace accumplan {
namespace {



std::string pct(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g%%", f * 100.0);
  return buf;
}

void validate(const PlanRequest& r) {
  if (r.target_tokens) {
    if (r.target_batch != 0) {
      throw InputError("give " + option_name("--target-batch") + " (samples per update) or " + option_name("--target-tokens") +
                       " (valid tokens per update), not both");
    }
    if (*r.target_tokens < 1) {
      throw InputError(option_name("--target-tokens") + " must be at least 1 (valid tokens per update), got " +
                       std::to_string(*r.target_tokens));
    }
    checked_in_range(*r.target_tokens, 1, kMaxTargetTokens, option_name("--target-tokens"));
  } else if (r.target_batch < 1) {
    throw InputError(option_name("--target-batch") + " must be at least 1, got " + std::to_string(r.target_batch));
  }
  if (!r.target_tokens) checked_in_range(r.target_batch, 1, kMaxSamples, option_name("--target-batch"));
  if (r.world_size < 1) {
    throw InputError(option_name("--world-size") + " must be at least 1, got " + std::to_string(r.world_size));
  }
  checked_in_range(r.world_size, 1, kMaxWorldSize, option_name("--world-size"));
  if (r.headroom.kind == HeadroomSpec::Kind::Fraction && !(r.headroom.fraction >= 0.0 && r.headroom.fraction <= 1.0)) {
    std::ostringstream got;
    got << r.headroom.fraction;
    throw InputError(option_name("--headroom") + " " + got.str() + ": a fraction of the activations must be in [0, 1], e.g. 0.05");
  }
  if (r.headroom.kind == HeadroomSpec::Kind::Bytes && r.headroom.bytes < 0) {
    throw InputError(option_name("--headroom") + " " + std::to_string(r.headroom.bytes) + " bytes: a size must be >= 0");
  }
  if (r.multiple_of && *r.multiple_of < 1) {
    throw InputError(option_name("--multiple-of") + " must be at least 1, got " + std::to_string(*r.multiple_of));
  }
  if (r.max_micro_batch && *r.max_micro_batch < 1) {
    throw InputError(option_name("--max-micro-batch") + " must be at least 1, got " + std::to_string(*r.max_micro_batch));
  }
  if (r.multiple_of) checked_in_range(*r.multiple_of, 1, kMaxSamples, option_name("--multiple-of"));
  if (r.max_micro_batch) checked_in_range(*r.max_micro_batch, 1, kMaxSamples, option_name("--max-micro-batch"));
  if (r.split != "balanced" && r.split != "uniform") {
    throw InputError(option_name("--split") + " must be 'balanced' or 'uniform', got '" + cut_for_message(r.split) + "'");
  }
}

// "B=250 is not divisible by ..." with the nearest valid values either side.
void check_divisible(int64_t target, int64_t step, const std::string& why) {
  if (target % step == 0) return;
  const int64_t below = (target / step) * step;
  const int64_t above = below + step;
  std::string nearest = below > 0 ? std::to_string(below) + " or " + std::to_string(above)
                                  : std::to_string(above);
  throw InfeasibleError(option_name("--target-batch") + " " + std::to_string(target) + " is not divisible by " +
                        why + " (" + std::to_string(step) + "); nearest valid target batches: " +
                        nearest);
}

std::string breakdown(const MemoryModel& model, int64_t at_micro_batch) {
  const Persistent& p = model.persistent();
  const int64_t peak = model.predict_peak_bytes(at_micro_batch);
  std::ostringstream s;
  s << "weights " << format_bytes(p.weights_bytes) << " + gradients " << format_bytes(p.gradients_bytes)
    << " + optimizer state " << format_bytes(p.optimizer_state_bytes) << " + activations at microbatch "
    << at_micro_batch << " " << format_bytes(peak - p.total()) << " = " << format_bytes(peak);
  // Where a fixed activation cost lies: no smaller microbatch removes it.
  const int64_t fixed = model.activation_fixed_bytes();
  if (fixed > 0 && 2 * fixed > peak - p.total()) {
    s << "; " << format_bytes(fixed) << " of those activations is fixed, whatever the microbatch: a transient of "
      << "the step's kernels (on a CPU, oneDNN's convolution backward holds about the convolution weights' size)";
  }
  return s.str();
}

// Bytes rounded up, saturated at 2 PiB (twice checked.h's kMaxBytes): never a cast out of range.
int64_t ceil_bytes(double bytes) {
  constexpr double kCeiling = 2.0 * static_cast<double>(kMaxBytes);
  if (!(bytes < kCeiling)) return static_cast<int64_t>(kCeiling);
  return bytes > 0 ? static_cast<int64_t>(std::ceil(bytes)) : 0;
}

// The margin at microbatch b, part by part (see Margin in schema.h): which parts a measured size
// keeps (run-to-run: the user's own headroom) and which it drops (prediction: the fit's residual
// and, with auto, the activation fraction).
struct MarginModel {
  HeadroomSpec spec;
  int64_t residual_bytes = 0;
  int64_t fixed_bytes = 0;
  double fraction = 0;
  double slope = 0;

  int64_t activation_bytes(int64_t b) const {
    return ceil_bytes(fraction * slope * static_cast<double>(b));
  }
  // Constant part and fraction that apply to a size nobody ran / to a size a real window ran at.
  int64_t predicted_extra() const { return residual_bytes + fixed_bytes; }
  double predicted_fraction() const { return fraction; }
  int64_t bytes_at(int64_t b, bool measured) const {
    if (measured) return kept_margin(describe(b, true)).bytes_at(slope, b);
    return predicted_extra() + ceil_bytes(predicted_fraction() * slope * static_cast<double>(b));
  }
  Margin describe(int64_t b, bool measured) const {
    Margin m;
    m.headroom = spec.text();
    m.fit_residual_bytes = residual_bytes;
    m.activation_fraction = fraction;
    m.activation_bytes = activation_bytes(b);
    m.fixed_bytes = fixed_bytes;
    m.measured = measured;
    return m;
  }
};

// The one margin rule of sample and token plans: `residual_bytes` is the fit's largest residual,
// `slope` its bytes per unit (a sample; a token for token plans).
MarginModel margin_model(const HeadroomSpec& spec, double residual_bytes, double slope) {
  MarginModel mm;
  mm.spec = spec;
  mm.slope = slope;
  switch (spec.kind) {
    case HeadroomSpec::Kind::Auto:
      mm.residual_bytes = ceil_bytes(residual_bytes);
      mm.fraction = kAutoActivationFraction;
      break;
    case HeadroomSpec::Kind::Fraction:
      mm.fraction = spec.fraction;
      break;
    case HeadroomSpec::Kind::Bytes:
      mm.fixed_bytes = spec.bytes;
      break;
  }
  return mm;
}

MarginModel margin_model(const MemoryModel& model, const Profile& profile, const HeadroomSpec& spec) {
  const FitSummary& fit = model.summary();
  double residual = 0;
  for (size_t i = 0; i < profile.points.size() && i < fit.residuals_bytes.size(); ++i) {
    if (profile.points[i].micro_batch < fit.fitted_from_micro_batch) continue;  // shown, not fitted
    residual = std::max(residual, std::fabs(fit.residuals_bytes[i]));
  }
  return margin_model(spec, residual, fit.slope_bytes_per_sample);
}

// The budget a request plans for: --memory-budget, else the device's memory as profiled.
int64_t resolve_budget(const Profile& profile, const PlanRequest& request) {
  if (request.budget.is_set()) return request.budget.resolve_bytes(profile.device.total_bytes);
  if (profile.device.total_bytes > 0) return profile.device.total_bytes;
  throw InputError("the profile does not record the device's memory; give " + option_name("--memory-budget"));
}

// The sample fields every plan carries: B over W ranks split as `sizes`, at most m_max per
// microbatch, and the uniform alternative.
void fill_window(Plan& plan, int64_t B, int64_t W, const std::vector<int64_t>& sizes, int64_t m_max,
                 const PlanRequest& request) {
  const int64_t T = B / W;
  const int64_t unit = request.multiple_of.value_or(1);
  plan.target_batch = B;
  plan.world_size = W;
  plan.per_rank_batch = T;
  plan.split = request.split;
  plan.multiple_of = request.multiple_of;
  set_window(plan, sizes, m_max, unit);
}

}  // namespace

void set_window(Plan& plan, std::vector<int64_t> sizes, int64_t max_micro_batch, int64_t unit) {
  const int64_t T = plan.per_rank_batch;
  plan.microbatch_sizes = std::move(sizes);
  plan.micro_batch = *std::max_element(plan.microbatch_sizes.begin(), plan.microbatch_sizes.end());
  plan.accumulation_steps = static_cast<int64_t>(plan.microbatch_sizes.size());
  plan.weights.clear();
  for (auto n : plan.microbatch_sizes) plan.weights.push_back(static_cast<double>(n) / static_cast<double>(T));
  plan.max_micro_batch = max_micro_batch;
  plan.uniform.micro_batch = largest_divisor_at_most(T, max_micro_batch, unit);
  if (plan.uniform.micro_batch < 1) plan.uniform.micro_batch = largest_divisor_at_most(T, max_micro_batch, 1);
  plan.uniform.accumulation_steps = T / plan.uniform.micro_batch;
}

Plan plan_for_window(const std::vector<int64_t>& sizes) {
  if (sizes.empty() || *std::min_element(sizes.begin(), sizes.end()) < 1) {
    throw InputError("a measurement window holds at least one microbatch of at least one sample");
  }
  Plan plan;
  plan.target_batch = plan.per_rank_batch = checked_sum(sizes, "the window's samples");
  set_window(plan, sizes, *std::max_element(sizes.begin(), sizes.end()));
  return plan;
}

KeptMargin kept_margin(const Margin& margin) {
  KeptMargin k;
  k.constant_bytes = margin.allocator_fragmentation_bytes + margin.fixed_bytes;
  k.activation_fraction = margin.headroom == "auto" ? 0.0 : margin.activation_fraction;
  return k;
}

int64_t KeptMargin::bytes_at(double slope_bytes_per_sample, int64_t micro_batch) const {
  return constant_bytes + ceil_bytes(activation_fraction * slope_bytes_per_sample * static_cast<double>(micro_batch));
}

namespace {

// What the profile's real windows show under this budget and margin.
struct Evidence {
  int64_t measured_max = 0;  // largest b a window [b, b, ...] ran at within budget less the kept margin
  int64_t failed_min = std::numeric_limits<int64_t>::max();  // smallest size that ran out or over
};

int64_t min_after_first(const std::vector<int64_t>& w) {
  return w.size() < 2 ? 0 : *std::min_element(w.begin() + 1, w.end());
}

Evidence evidence(const Profile& profile, int64_t budget, const MarginModel& mm) {
  Evidence ev;
  for (const auto& t : profile.trials) {
    if (t.window.empty()) continue;  // a 1.0/1.1 trial: its window is unknown
    const int64_t largest = *std::max_element(t.window.begin(), t.window.end());
    if (t.peak_bytes > 0) {
      if (t.peak_bytes + mm.bytes_at(largest, true) <= budget) {
        if (t.window.size() >= 2) ev.measured_max = std::max(ev.measured_max, std::min(t.window.front(), min_after_first(t.window)));
      } else {
        ev.failed_min = std::min(ev.failed_min, largest);
      }
    } else if (!t.fit && profile.budget_bytes && *profile.budget_bytes >= budget) {
      // Out of memory under a budget at least as large as this one: it fails here too.
      ev.failed_min = std::min(ev.failed_min, largest);
    }
  }
  return ev;
}

// The profile's real window that covers a window starting with `head` (its first one or two
// sizes; later sizes are no larger) within the budget less the kept margin: the one with the
// lowest peak, or none. A window covers another when its first microbatch is no smaller and,
// unless the other is a single microbatch, its later ones are no smaller than the other's.
const Trial* covering_trial(const Profile& profile, const std::vector<int64_t>& head, int64_t budget,
                            const MarginModel& mm) {
  const Trial* best = nullptr;
  const int64_t largest = *std::max_element(head.begin(), head.end());
  for (const auto& t : profile.trials) {
    if (t.window.empty() || t.peak_bytes <= 0) continue;
    if (t.peak_bytes + mm.bytes_at(largest, true) > budget) continue;
    if (t.window.front() < head.front()) continue;
    if (head.size() > 1 && (t.window.size() < 2 || min_after_first(t.window) < head[1])) continue;
    if (!best || t.peak_bytes < best->peak_bytes) best = &t;
  }
  return best;
}

[[noreturn]] void infeasible(const MemoryModel& model, const MarginModel& mm, int64_t unit, int64_t budget) {
  const int64_t margin = mm.bytes_at(unit, false);
  const int64_t usable = budget - margin;
  const int64_t need = std::max(model.predict_peak_bytes(unit), model.optimizer_step_peak_bytes());
  std::ostringstream s;
  s << "no microbatch fits: budget " << format_bytes(budget) << " less a margin of " << format_bytes(margin)
    << " (" << option_name("--headroom") << " " << mm.spec.text() << ") leaves " << format_bytes(usable) << ", but ";
  if (model.persistent().total() > usable) {
    s << "the model's persistent memory alone is " << format_bytes(model.persistent().total())
      << " (weights " << format_bytes(model.persistent().weights_bytes) << " + gradients "
      << format_bytes(model.persistent().gradients_bytes) << " + optimizer state "
      << format_bytes(model.persistent().optimizer_state_bytes) << ")";
  } else if (model.optimizer_step_peak_bytes() > usable) {
    s << "the optimizer step peaks at " << format_bytes(model.optimizer_step_peak_bytes());
  } else {
    s << "the smallest microbatch needs " << breakdown(model, unit);
  }
  // The floor, and what sets it: the higher of the smallest microbatch's peak and the step's, plus the margin.
  const bool step_sets_it = model.optimizer_step_peak_bytes() >= model.predict_peak_bytes(unit);
  s << ". Raise " << option_name("--memory-budget") << " to at least " << format_bytes(need + margin) << " ("
    << (step_sets_it ? std::string("the optimizer step's peak") : "a microbatch of " + std::to_string(unit) + "'s peak")
    << " " << format_bytes(need) << " + the margin " << format_bytes(margin) << "), lower "
    << option_name("--headroom") << ", or use an optimizer with less state (sgd keeps none, adam two copies "
       "of the weights)";
  throw InfeasibleError(s.str());
}

}  // namespace

std::vector<int64_t> window_head(const std::vector<int64_t>& sizes) {
  return std::vector<int64_t>(sizes.begin(), sizes.begin() + (sizes.size() == 1 ? 1 : 2));
}

std::vector<int64_t> balanced_split(int64_t total, int64_t parts, int64_t unit) {
  if (parts < 1 || unit < 1 || total % unit != 0 || total / unit < parts) {
    throw InternalError("balanced_split(" + std::to_string(total) + ", " + std::to_string(parts) +
                        ", " + std::to_string(unit) + ") has no solution");
  }
  const int64_t units = total / unit;
  const int64_t q = units / parts;
  const int64_t r = units % parts;
  std::vector<int64_t> sizes(static_cast<size_t>(parts), q * unit);
  for (int64_t i = 0; i < r; ++i) sizes[static_cast<size_t>(i)] += unit;
  return sizes;
}

int64_t largest_divisor_at_most(int64_t total, int64_t limit, int64_t unit) {
  if (total < 1 || limit < 1 || unit < 1) return 0;
  // Divisors come in pairs (i, total / i) with i <= sqrt(total): at most 2^20 steps for the
  // largest per-rank batch accepted (2^40), where counting d down from the limit could take 2^39.
  int64_t best = 0;
  auto consider = [&](int64_t d) {
    if (d <= limit && d % unit == 0 && d > best) best = d;
  };
  for (int64_t i = 1; i <= total / i; ++i) {
    if (total % i != 0) continue;
    consider(i);
    consider(total / i);
  }
  return best;
}

std::vector<int64_t> split_samples(int64_t total, int64_t max_micro_batch, const std::string& split,
                                   int64_t unit) {
  if (total < 1 || max_micro_batch < 1) {
    throw InternalError("split_samples needs positive sizes");
  }
  if (total % unit != 0) unit = 1;  // a short last window need not respect multiple_of
  const int64_t cap = std::max(unit, (max_micro_batch / unit) * unit);
  const int64_t d = split == "uniform" ? largest_divisor_at_most(total, cap, unit) : 0;
  const int64_t units = total / unit;
  const int64_t cap_units = cap / unit;
  const int64_t parts = d ? total / d : (units + cap_units - 1) / cap_units;
  // The vector is the caller's memory: 2^40 samples in microbatches of 1 would be 8 TiB of sizes.
  if (parts > kMaxAccumulationSteps) {
    throw InputError("split_samples: " + std::to_string(total) + " samples in microbatches of at most " +
                     std::to_string(cap) + " need " + std::to_string(parts) + " microbatches; accumplan splits a window into at most " +
                     std::to_string(kMaxAccumulationSteps));
  }
  if (d) return std::vector<int64_t>(static_cast<size_t>(parts), d);
  return balanced_split(total, parts, unit);
}

void check_request(const PlanRequest& request) {
  validate(request);
  if (request.target_tokens) return;  // the window in samples is known only with the longest length
  const int64_t B = request.target_batch;
  const int64_t W = request.world_size;
  check_divisible(B, W, option_name("--world-size"));
  const int64_t unit = request.multiple_of.value_or(1);
  if ((B / W) % unit != 0) check_divisible(B, W * unit, "world size x " + option_name("--multiple-of"));
}

void check_exchange(const Profile& profile, const PlanRequest& request) {
  if (request.world_size < 2 || profile.gradient_exchange) return;
  const std::string ranks = option_name("--world-size") + " " + std::to_string(request.world_size);
  throw InputError("the profile's windows did not make the gradient exchange a rank of " + ranks +
                   " makes (its flat buffers lie on top of the gradients); profile again with " + ranks);
}

namespace {

// The largest microbatch a sample plan may use, and how it was reached (for `reason`).
struct SampleBound {
  int64_t m_line = 0;   // the fitted line plus the whole margin
  int64_t m_fit = 0;    // memory's answer: m_line or a size a real window ran at, below any failure
  int64_t m_max = 0;    // m_fit bounded by T, the whole-batch rule, --max-micro-batch and the unit
  bool user_bound = false;  // --max-micro-batch decided
};

SampleBound sample_bound(const Profile& profile, const PlanRequest& request, const MemoryModel& model,
                         const MarginModel& mm, const Evidence& ev, int64_t budget) {
  const int64_t T = request.target_batch / request.world_size;
  const int64_t unit = request.multiple_of.value_or(1);
  SampleBound sb;
  // Memory's answer, not yet bounded by T: the line plus the whole margin, or a size a real
  // window ran at, whichever is larger; below any size that failed.
  const int64_t below_failure = ev.failed_min == std::numeric_limits<int64_t>::max() ? MemoryModel::kMaxMicroBatch
                                                                                     : ev.failed_min - 1;
  sb.m_line = model.largest_fitting(budget, below_failure, mm.predicted_extra(), mm.predicted_fraction());
  sb.m_fit = std::max(sb.m_line, std::min(ev.measured_max, below_failure));
  const int64_t margin_at_unit = mm.bytes_at(unit, ev.measured_max >= unit);
  if (sb.m_fit < unit || model.persistent().total() + margin_at_unit > budget ||
      model.optimizer_step_peak_bytes() + margin_at_unit > budget) {
    infeasible(model, mm, unit, budget);
  }
  if (request.max_micro_batch && *request.max_micro_batch < unit) {
    throw InputError(option_name("--max-micro-batch") + " " + std::to_string(*request.max_micro_batch) + " is smaller than " +
                     option_name("--multiple-of") + " " + std::to_string(unit));
  }
  sb.m_max = std::min(sb.m_fit, T);
  // The whole per-rank batch as one microbatch: no gradient is resident in a one-microbatch
  // window, so it may fit where a steady-state microbatch of that size would not.
  if (sb.m_max < T && T <= below_failure) {
    const bool ran = covering_trial(profile, {T}, budget, mm) != nullptr;
    // The first-microbatch line is trusted up to twice the largest size measured, the reach the
    // probes keep for the steady line; beyond, the steady line decides. (builtin:mlp: first peaks
    // of 0.98 MB flat from b = 2 to 33 said a window of one microbatch of 256 fits 1200 KiB; it ran
    // out of memory.)
    int64_t largest_point = 0;
    for (const auto& pt : profile.points) largest_point = std::max(largest_point, pt.micro_batch);
    const int64_t one = T <= 2 * largest_point ? model.predict_window_peak_bytes({T}) : model.predict_peak_bytes(T);
    if (ran || one + mm.bytes_at(T, false) <= budget) sb.m_max = T;
  }
  sb.user_bound = request.max_micro_batch && *request.max_micro_batch < sb.m_max;
  if (sb.user_bound) sb.m_max = *request.max_micro_batch;
  sb.m_max = (sb.m_max / unit) * unit;
  // A window is a list of microbatch sizes held in memory (and run one by one): more than 2^20 of
  // them is a request nobody means, and a list of 2^40 entries would not fit on the host.
  const int64_t k_needed = T / sb.m_max + (T % sb.m_max != 0 ? 1 : 0);
  const int64_t k_uniform =
      request.split == "uniform" ? T / std::max<int64_t>(1, largest_divisor_at_most(T, sb.m_max, unit)) : 0;
  if (std::max(k_needed, k_uniform) > kMaxAccumulationSteps) {
    throw InfeasibleError(option_name("--target-batch") + " " + std::to_string(request.target_batch) + ": " + std::to_string(T) +
                          " samples per rank at microbatches of at most " + std::to_string(sb.m_max) + " need " +
                          std::to_string(std::max(k_needed, k_uniform)) + " microbatches per window; accumplan plans at most " +
                          std::to_string(kMaxAccumulationSteps) + ". Lower " + option_name("--target-batch") + " or raise " +
                          option_name("--memory-budget"));
  }
  return sb;
}

// --use-timing: a larger microbatch count when the profile's step times predict it at least 10%
// faster per window. Returns what it did, for `reason` ("" without --use-timing).
std::string choose_by_timing(const std::optional<TimeModel>& time, const PlanRequest& request, int64_t T,
                             std::vector<int64_t>& sizes) {
  if (!request.use_timing) return "";
  const auto k_min = static_cast<int64_t>(sizes.size());  // memory's answer
  if (!time) return "; --use-timing had no effect: the profile has no step times at two sizes or more";
  if (k_min > 4096) return "; --use-timing had no effect: it weighs windows of at most 4096 microbatches";
  if (request.split != "balanced") {
    return "; --use-timing had no effect: it weighs balanced splits only, not --split " + request.split;
  }
  const int64_t unit = request.multiple_of.value_or(1);
  const double t_min = time->window_seconds(sizes);
  double best = t_min;
  std::vector<int64_t> best_sizes = sizes;
  for (int64_t k = k_min + 1; k <= std::min(T / unit, 4 * k_min); ++k) {
    auto candidate = balanced_split(T, k, unit);
    const double t = time->window_seconds(candidate);
    if (t < best) {
      best = t;
      best_sizes = candidate;
    }
  }
  if (!(best <= t_min * (1.0 - kTimingGainFraction))) {  // "at least 10% faster", as --help says
    return "; --use-timing found no split predicted at least " + pct(kTimingGainFraction) + " faster per window";
  }
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "; with --use-timing, measured step times predict %zu microbatches %.0f%% faster per window "
                "than %lld, so %zu are used",
                best_sizes.size(), 100.0 * (1.0 - best / t_min), static_cast<long long>(k_min), best_sizes.size());
  sizes = best_sizes;
  return buf;
}

// A microbatch's peak where real windows ran at sizes on both sides of it (or at it): the chord
// between the nearest two, first microbatches or later ones; what the memory between two
// measurements does, where the tail's line leans toward a farther window. nullopt: not bracketed.
std::optional<int64_t> between_points(const Profile& profile, int64_t b, bool first) {
  const ProfilePoint* lo = nullptr;
  const ProfilePoint* hi = nullptr;
  for (const ProfilePoint& p : profile.points) {
    if (p.seq_len || (first && !p.first_microbatch_peak_bytes)) continue;
    if (p.micro_batch <= b && (!lo || p.micro_batch > lo->micro_batch)) lo = &p;
    if (p.micro_batch >= b && (!hi || p.micro_batch < hi->micro_batch)) hi = &p;
  }
  if (!lo || !hi) return std::nullopt;
  const auto peak = [first](const ProfilePoint& p) { return static_cast<double>(first ? *p.first_microbatch_peak_bytes : p.peak_bytes); };
  if (lo->micro_batch == hi->micro_batch) return static_cast<int64_t>(peak(*lo));
  const double t = static_cast<double>(b - lo->micro_batch) / static_cast<double>(hi->micro_batch - lo->micro_batch);
  return static_cast<int64_t>(std::ceil(peak(*lo) + t * (peak(*hi) - peak(*lo))));
}

// A sample plan's microbatches' peak, its optimizer step's not included: the chords between
// measured windows where they bracket the window's sizes, the fit's lines otherwise.
int64_t predicted_microbatches_peak(const Profile& profile, const MemoryModel& model, const std::vector<int64_t>& sizes) {
  const std::optional<int64_t> first = between_points(profile, sizes.front(), true);
  std::optional<int64_t> steady;
  if (sizes.size() > 1) steady = between_points(profile, *std::max_element(sizes.begin() + 1, sizes.end()), false);
  if (!first || (sizes.size() > 1 && !steady)) return model.predict_microbatches_peak_bytes(sizes);
  return std::max(*first, steady.value_or(0));
}

// The breakdown of a sample plan's memory at its window, and its fit.
void fill_sample_memory(Plan& plan, const Profile& profile, const MemoryModel& model, const MarginModel& mm,
                        int64_t budget, const Trial* ran) {
  MemoryBreakdown& mem = plan.memory;
  mem.budget_bytes = budget;
  mem.margin = mm.describe(plan.micro_batch, plan.confirmed);
  mem.margin_bytes = mm.bytes_at(plan.micro_batch, plan.confirmed);
  mem.usable_bytes = budget - mem.margin_bytes;
  mem.predicted_peak_bytes =
      std::max(predicted_microbatches_peak(profile, model, plan.microbatch_sizes), model.optimizer_step_peak_bytes());
  // A plan never predicts less than a real run of its own window measured; a run of its whole
  // window measured what every such window holds, so that is the prediction.
  if (ran && ran->window == plan.microbatch_sizes) {
    mem.predicted_peak_bytes = ran->peak_bytes;
  } else if (ran && ran->window == window_head(plan.microbatch_sizes)) {
    mem.predicted_peak_bytes = std::max(mem.predicted_peak_bytes, ran->peak_bytes);
  }
  mem.weights_bytes = profile.persistent.weights_bytes;
  mem.gradients_bytes = profile.persistent.gradients_bytes;
  mem.optimizer_state_bytes = profile.persistent.optimizer_state_bytes;
  mem.activation_fixed_bytes = model.activation_fixed_bytes();
  mem.activation_bytes_per_sample = model.summary().slope_bytes_per_sample;
  plan.fit = model.summary();
}

// One sentence: why a sample plan has the window it has. A plan's reason is part of the document,
// so it names options as the command line does whichever front end planned it (terms.h words the
// messages a caller is refused with, not what a plan records); choose_by_timing's note and
// token_reason likewise.
std::string sample_reason(const Plan& plan, const SampleBound& sb, const Evidence& ev, const MarginModel& mm,
                          int64_t k_min, const std::string& timing_note, const PlanRequest& request) {
  const MemoryBreakdown& mem = plan.memory;
  const int64_t T = plan.per_rank_batch;
  const int64_t unit = request.multiple_of.value_or(1);
  const bool whole = sb.m_max >= T && plan.microbatch_sizes.size() == 1;
  std::ostringstream why;
  if (whole) {
    why << "The whole per-rank batch of " << T << " fits (predicted peak " << format_bytes(mem.predicted_peak_bytes)
        << " of " << format_bytes(mem.usable_bytes) << " usable), so no accumulation is needed";
  } else {
    if (sb.user_bound) {
      why << (request.max_micro_batch_set_by.empty() ? std::string("--max-micro-batch") : request.max_micro_batch_set_by)
          << " bounds the microbatch at " << sb.m_max << " (memory alone would allow " << sb.m_fit << ")";
    } else if (sb.m_fit > T) {
      why << "Microbatches are capped at " << sb.m_max;
    } else if (ev.measured_max >= sb.m_fit && ev.measured_max > sb.m_line) {
      why << "The largest microbatch a real window ran at within the " << format_bytes(mem.budget_bytes) << " budget is "
          << sb.m_fit << " (the fitted line with the margin alone allows " << sb.m_line << ")";
      if (sb.m_max != sb.m_fit) why << ", " << sb.m_max << " as a multiple of " << unit;
    } else {
      why << "The largest microbatch predicted to fit the " << format_bytes(mem.budget_bytes)
          << " budget less its margin (--headroom " << mm.spec.text() << ") is " << sb.m_fit;
      if (sb.m_max != sb.m_fit) why << ", " << sb.m_max << " as a multiple of " << unit;
    }
    why << "; " << T << " samples per rank need " << k_min << " microbatches";
  }
  why << timing_note;
  if (!whole) why << (timing_note.empty() ? ", split " : "; split ") << request.split << " as " << join_sizes(plan.microbatch_sizes);
  // The margin is stated once, at the planned microbatch, as memory.margin_bytes and the report's
  // bar state it: it depends on the size (2% of activations) and on whether a window ran there.
  why << "; at " << plan.micro_batch << " the margin kept free is " << format_bytes(mem.margin_bytes)
      << (mem.margin.measured ? " (a real window covering it ran)" : "") << ".";
  return why.str();
}

// The highest peak after the microbatches (exchange and optimizer step) the profile's windows measured.
int64_t profile_step_peak(const Profile& profile) {
  int64_t peak = 0;
  for (const auto& p : profile.points) peak = std::max(peak, p.optimizer_step_peak_bytes.value_or(0));
  return peak;
}

// What a plan records of the profile it was solved from. `microbatches_peak_bytes`: the plan's
// window's peak before its optimizer step, on the rank the windows held.
void copy_provenance(Plan& plan, const Profile& profile, int64_t microbatches_peak_bytes) {
  plan.device = profile.device;
  plan.model = profile.model;
  plan.setup = profile.setup;
  plan.libtorch_version = profile.libtorch_version;
  plan.profile = profile;
  // The windows held the largest state share; the other ranks hold less.
  if (profile.sharding) state_sharding(plan, microbatches_peak_bytes, profile_step_peak(profile));
}

// A sample plan's microbatches' peak (its optimizer step's not included), by the rule
// fill_sample_memory predicts the whole window by: a real run of the window, or of its head,
// measured it where its peak lay above the step's.
int64_t microbatches_peak(const Plan& plan, const Profile& profile, const MemoryModel& model, const Trial* ran) {
  const int64_t line = predicted_microbatches_peak(profile, model, plan.microbatch_sizes);
  if (!ran) return line;
  const bool step_set_it = ran->peak_bytes <= model.optimizer_step_peak_bytes();
  if (ran->window == plan.microbatch_sizes) return step_set_it ? std::min(line, ran->peak_bytes) : ran->peak_bytes;
  if (ran->window == window_head(plan.microbatch_sizes) && !step_set_it) return std::max(line, ran->peak_bytes);
  return line;
}

}  // namespace

Plan make_plan(const Profile& profile, const PlanRequest& request) {
  if (is_token_profile(profile)) return make_token_plan(profile, request);
  check_request(request);
  check_exchange(profile, request);
  if (request.target_tokens) {
    throw InputError(option_name("--target-tokens") + " " + std::to_string(*request.target_tokens) +
                     " needs variable-length data (inputs with a sequence dimension T and " + option_name("--seq-len") +
                     ", or a ragged " + option_name("--batch-file") + "); this profile measured fixed shapes: give " +
                     option_name("--target-batch"));
  }
  const int64_t T = request.target_batch / request.world_size;
  const MemoryModel model = MemoryModel::fit(profile);
  const int64_t budget = resolve_budget(profile, request);
  const MarginModel mm = margin_model(model, profile, request.headroom);
  const Evidence ev = evidence(profile, budget, mm);
  const SampleBound sb = sample_bound(profile, request, model, mm, ev, budget);

  // Fewest microbatches first; then, with --use-timing, a larger count if clearly faster.
  std::vector<int64_t> sizes = split_samples(T, sb.m_max, request.split, request.multiple_of.value_or(1));
  const auto k_min = static_cast<int64_t>(sizes.size());
  std::optional<TimeModel> time;
  if (TimeModel::available(profile)) time = TimeModel::fit(profile);
  const std::string timing_note = choose_by_timing(time, request, T, sizes);

  Plan plan;
  fill_window(plan, request.target_batch, request.world_size, sizes, sb.m_max, request);
  // Confirmed when a real window of the profile covers the plan's (its first two microbatches:
  // later ones are no larger) within the budget less the kept margin.
  const Trial* ran = covering_trial(profile, window_head(sizes), budget, mm);
  plan.confirmed = ran != nullptr;
  if (ran) plan.confirmed_peak_bytes = ran->peak_bytes;
  fill_sample_memory(plan, profile, model, mm, budget, ran);
  if (time) plan.timing = Timing{time->window_seconds(sizes), time->predict_seconds(plan.micro_batch)};
  plan.reason = sample_reason(plan, sb, ev, mm, k_min, timing_note, request);
  copy_provenance(plan, profile, microbatches_peak(plan, profile, model, ran));
  return plan;
}

std::string HeadroomSpec::text() const {
  switch (kind) {
    case Kind::Auto:
      return "auto";
    case Kind::Fraction: {
      std::ostringstream s;
      s << fraction;
      return s.str();
    }
    case Kind::Bytes:
      return format_bytes(bytes);
  }
  return "auto";
}

HeadroomSpec parse_headroom(const std::string& text, const std::string& option) {
  HeadroomSpec h;
  const std::string shown = text.size() > 80 ? text.substr(0, 77) + "..." : text;
  auto bad = [&](const std::string& why) {
    return InputError(option + " '" + shown + "': " + why +
                      "; use auto (the default: from what was measured), a fraction of the batch-dependent "
                      "activations in [0, 1] such as 0.05, or a size such as 256MiB");
  };
  if (text == "auto") return h;
  if (text.empty()) throw bad("empty");
  // A plain number is a fraction; anything with a unit is a size (units.h's one parser).
  char* end = nullptr;
  errno = 0;
  const double f = std::strtod(text.c_str(), &end);
  if (end && *end == '\0' && errno == 0 && text.find_first_of("xXpPnNiI") == std::string::npos) {
    if (!(f >= 0.0 && f <= 1.0)) throw bad("a fraction must be in [0, 1]");
    h.kind = HeadroomSpec::Kind::Fraction;
    h.fraction = f;
    return h;
  }
  try {
    h.bytes = parse_size_bytes(text, option);
  } catch (const InputError&) {
    throw bad("not a fraction or a size");
  }
  h.kind = HeadroomSpec::Kind::Bytes;
  return h;
}

HeadroomSpec headroom_of(const Margin& m) {
  HeadroomSpec h;
  if (m.headroom == "auto") return h;
  if (m.fixed_bytes > 0 || m.activation_fraction == 0) {
    h.kind = HeadroomSpec::Kind::Bytes;
    h.bytes = m.fixed_bytes;
  } else {
    h.kind = HeadroomSpec::Kind::Fraction;
    h.fraction = m.activation_fraction;
  }
  return h;
}

std::string describe_margin(const Margin& m) {
  std::ostringstream s;
  const char* sep = "";
  auto part = [&](const std::string& text) {
    s << sep << text;
    sep = " + ";
  };
  if (m.fit_residual_bytes > 0) part("fit residual " + format_bytes(m.fit_residual_bytes) + (m.measured ? " (dropped: measured)" : ""));
  if (m.activation_fraction > 0) {
    char f[64];
    std::snprintf(f, sizeof f, "%g%% of activations ", 100.0 * m.activation_fraction);
    const bool dropped = m.measured && m.headroom == "auto";
    part(f + format_bytes(m.activation_bytes) + (dropped ? " (dropped: measured)" : ""));
  }
  if (m.allocator_fragmentation_bytes > 0) part("allocator fragmentation " + format_bytes(m.allocator_fragmentation_bytes));
  if (m.fixed_bytes > 0) part("fixed " + format_bytes(m.fixed_bytes));
  if (*sep == '\0') s << "nothing kept free";
  return s.str();
}

int64_t climb_candidate(const Profile& profile, const PlanRequest& request, const Plan& plan) {
  if (plan.accumulation_steps == 1 && plan.micro_batch == plan.per_rank_batch) return 0;  // the whole batch already
  const MemoryModel model = MemoryModel::fit(profile);
  const MarginModel mm = margin_model(model, profile, request.headroom);
  const int64_t budget = plan.memory.budget_bytes;
  const Evidence ev = evidence(profile, budget, mm);
  int64_t cap = plan.per_rank_batch;
  if (ev.failed_min != std::numeric_limits<int64_t>::max()) cap = std::min(cap, ev.failed_min - 1);
  if (request.max_micro_batch) cap = std::min(cap, *request.max_micro_batch);
  const KeptMargin kept = kept_margin(mm.describe(cap, true));
  int64_t c = model.largest_fitting(budget, cap, kept.constant_bytes, kept.activation_fraction);
  const int64_t unit = request.multiple_of.value_or(1);
  c = (c / unit) * unit;
  return c > std::max(ev.measured_max, plan.max_micro_batch) ? c : 0;
}

bool is_token_profile(const Profile& profile) {
  return std::any_of(profile.points.begin(), profile.points.end(), [](const ProfilePoint& p) { return p.seq_len.has_value(); });
}

namespace {

// The longest sequence a token plan is made for: the profile's (--seq-len's longest).
int64_t planned_max_seq_len(const Profile& profile) {
  if (profile.setup.seq_len) return profile.setup.seq_len->max;
  throw InputError("the profile measured variable-length data but records no sequence lengths; give " + option_name("--seq-len"));
}

// The samples of the window the sample fields describe: --target-batch, or with --target-tokens N
// the window at T_max, ceil(N / T_max) sequences rounded up to a multiple of W (windows
// themselves are then cut by token_windows).
int64_t token_window_samples(const PlanRequest& request, int64_t t_max) {
  if (!request.target_tokens) return request.target_batch;
  const int64_t W = request.world_size;
  const int64_t sequences = *request.target_tokens / t_max + (*request.target_tokens % t_max != 0 ? 1 : 0);
  return checked_in_range(checked_mul((sequences + W - 1) / W, W, option_name("--target-tokens") + "' sequences"), 1, kMaxSamples,
                          option_name("--target-tokens") + " / " + option_name("--seq-len") + "'s longest, in sequences");
}

// The token budget and the margin it was solved under.
struct TokenSolution {
  double per_token = 0;  // activation bytes per padded token at T_max
  Margin margin;
  int64_t margin_bytes = 0;
  int64_t usable_bytes = 0;
  int64_t token_budget = 0;
};

// The largest token budget whose worst microbatch plus the margin fits the budget, bounded by the
// per-rank window padded to T_max and below any window at T_max that failed.
TokenSolution solve_token_budget(const Profile& profile, const PlanRequest& request, const TokenMemoryModel& model,
                                 int64_t budget, int64_t t_max, int64_t T) {
  const TokenFit& f = model.summary();
  TokenSolution ts;
  // The margin, by the sample plans' rule (margin_model), on the activations of the worst
  // microbatch: per padded token at T_max.
  ts.per_token = (model.predict_bytes(2, t_max) - model.predict_bytes(1, t_max)) / static_cast<double>(t_max);
  const MarginModel mm = margin_model(request.headroom, f.max_abs_residual_bytes, ts.per_token);
  // c0 + (1 + fraction)·B·per_token + extra <= budget: B from the closed form, then the fraction's
  // bytes at that B, then the model's own settled budget under what is left.
  const double intercept = model.predict_bytes(1, t_max) - ts.per_token * static_cast<double>(t_max);
  const double room = static_cast<double>(budget - mm.predicted_extra()) - intercept;
  const double estimate = room > 0 ? std::floor(room / (ts.per_token * (1.0 + mm.fraction))) : 0.0;
  const int64_t estimate_tokens = static_cast<int64_t>(std::min(estimate, 1e15));
  ts.margin = mm.describe(estimate_tokens, false);
  ts.margin.measured = false;  // a token plan keeps its whole margin: short sequences are never measured alone
  ts.margin_bytes = mm.bytes_at(estimate_tokens, false);
  ts.usable_bytes = budget - ts.margin_bytes;
  ts.token_budget = ts.usable_bytes > 0 ? model.token_budget(ts.usable_bytes, t_max) : 0;
  // No microbatch holds more than the per-rank window; none at T_max as large as one that failed.
  ts.token_budget = std::min(ts.token_budget, checked_mul(T, t_max, "the per-rank batch x " + option_name("--seq-len")));
  for (const auto& t : profile.trials) {
    if (!t.fit && t.seq_len && *t.seq_len >= t_max && !t.window.empty()) {
      const int64_t failed = *std::min_element(t.window.begin(), t.window.end());
      ts.token_budget = std::min(ts.token_budget, checked_mul(failed, t_max, "a failed window's tokens") - 1);
    }
  }
  if (ts.token_budget < t_max) {
    const int64_t alone = ts.usable_bytes > 0 ? model.longest_sequence(ts.usable_bytes) : 0;
    throw InfeasibleError("one sequence of " + std::to_string(t_max) + " tokens (" + option_name("--seq-len") + "'s longest) is predicted to need " +
                          format_bytes(model.predict_peak_bytes(1, t_max) + ts.margin_bytes) + " with the margin, more than the " +
                          format_bytes(budget) + " budget; the longest sequence that fits alone has " +
                          std::to_string(alone) + " tokens. Truncate to that with " + option_name("--seq-len") + ", or raise " +
                          option_name("--memory-budget"));
  }
  return ts;
}

// What packing trades, as the plan starts: the profile's step times (accumplan/step_time.h);
// `accumplan run` refits from its own microbatches as it goes.
std::optional<TokenStepCost> profile_step_cost(const Profile& profile) {
  std::vector<TimedMicrobatch> timed;
  for (const auto& p : profile.points) {
    if (p.seq_len && p.step_seconds && *p.step_seconds > 0) timed.push_back({p.micro_batch, *p.seq_len, *p.step_seconds});
  }
  const std::optional<StepTimeFit> fit = fit_step_time(timed);
  if (!fit) return std::nullopt;
  // A plan's cost may be all a trainer ever packs by (CUDA): one that says a microbatch costs
  // nothing would put every sequence in a microbatch of its own. So t0 is at least what the
  // profile's windows took beyond their microbatches' steps, per microbatch (an upper bound: a
  // point's step is its faster microbatch, and the optimizer step's share is in it), and a cost
  // still without a per-microbatch time is left out (packing fills). A run on the CPU refits from
  // its own microbatches and windows whatever the plan says.
  std::vector<WindowTime> windows;
  for (const Trial& t : profile.trials) {
    if (!t.fit || !t.seq_len || t.window.empty()) continue;
    for (const auto& p : profile.points) {
      if (p.seq_len == t.seq_len && p.micro_batch == t.micro_batch && p.step_seconds) {
        windows.push_back({t.seconds, *p.step_seconds * static_cast<double>(t.window.size()),
                           static_cast<int64_t>(t.window.size())});
        break;
      }
    }
  }
  const TokenStepCost cost = fit->with_microbatch_floor(microbatch_overhead_seconds(windows)).cost();
  if (cost.per_microbatch < 1) return std::nullopt;
  return cost;
}

// The profile's window at T_max of at least the budget's sequences that ran within the budget less
// the kept margin, with the lowest peak; none when no such window ran.
const Trial* token_confirmation(const Profile& profile, const TokenSolution& ts, int64_t t_max, int64_t budget) {
  const Trial* ran = nullptr;
  for (const auto& t : profile.trials) {
    if (!t.fit || !t.seq_len || *t.seq_len < t_max || t.window.empty() || t.peak_bytes <= 0) continue;
    if (*std::min_element(t.window.begin(), t.window.end()) * *t.seq_len < (ts.token_budget / t_max) * t_max) continue;
    // Within the budget less what the margin keeps even for a measured size, as covering_trial.
    const int64_t tokens = *std::max_element(t.window.begin(), t.window.end()) * *t.seq_len;
    if (t.peak_bytes + kept_margin(ts.margin).bytes_at(ts.per_token, tokens) > budget) continue;
    if (!ran || t.peak_bytes < ran->peak_bytes) ran = &t;
  }
  return ran;
}

// The breakdown of a token plan's memory at its worst packed microbatch, and its fit.
void fill_token_memory(Plan& plan, const Profile& profile, const TokenMemoryModel& model, const TokenSolution& ts,
                       int64_t budget) {
  const TokenFit& f = model.summary();
  const int64_t t_max = plan.tokens->max_seq_len;
  MemoryBreakdown& mem = plan.memory;
  mem.budget_bytes = budget;
  mem.margin = ts.margin;
  mem.margin_bytes = ts.margin_bytes;
  mem.usable_bytes = ts.usable_bytes;
  // The worst microbatch the packing can form: whole sequences, so at T_max the budget holds
  // floor(B / T_max) of them (the bound c0 + B·per_token is for fractional sequences).
  mem.predicted_peak_bytes = model.worst_packed_peak_bytes(ts.token_budget, t_max);
  mem.weights_bytes = profile.persistent.weights_bytes;
  mem.gradients_bytes = profile.persistent.gradients_bytes;
  mem.optimizer_state_bytes = profile.persistent.optimizer_state_bytes;
  // One sequence padded to T_max, and what the model holds without any at that length.
  mem.activation_bytes_per_sample = ts.per_token * static_cast<double>(t_max);
  mem.activation_fixed_bytes =
      ceil_bytes(model.predict_bytes(1, t_max) - mem.activation_bytes_per_sample) - profile.persistent.total();
  plan.fit.target = "peak_bytes";
  plan.fit.intercept_bytes = f.intercept_bytes;
  plan.fit.slope_bytes_per_sample = mem.activation_bytes_per_sample;
  plan.fit.residuals_bytes = f.residuals_bytes;
  plan.fit.max_abs_residual_bytes = f.max_abs_residual_bytes;
  plan.fit.rms_residual_bytes = f.rms_residual_bytes;
}

// How the peak was predicted: from the measured lengths, or the fit's formula.
std::string token_peak_source(const TokenMemoryModel& model) {
  const std::vector<TokenColumn>& c = model.columns();
  if (!c.empty()) {
    return "from the windows measured at " + std::to_string(c.size()) + " lengths, " + std::to_string(c.front().seq_len) +
           ".." + std::to_string(c.back().seq_len) + " tokens";
  }
  const TokenFit& f = model.summary();
  return format_bytes(static_cast<int64_t>(f.intercept_bytes)) + " + tokens x " +
         format_bytes(static_cast<int64_t>(f.bytes_per_token)) +
         (f.quadratic ? " + tokens x T x " + std::to_string(f.bytes_per_token_squared) + " bytes" : std::string());
}

// One paragraph: why a token plan packs as it does.
std::string token_reason(const Plan& plan, const TokenMemoryModel& model, const PlanRequest& request) {
  const int64_t t_max = plan.tokens->max_seq_len, token_budget = plan.tokens->token_budget;
  const int64_t budget = plan.memory.budget_bytes, margin_bytes = plan.memory.margin_bytes;
  const int64_t T = plan.per_rank_batch, m_max = plan.max_micro_batch, B = plan.target_batch;
  const MemoryBreakdown& mem = plan.memory;
  const std::vector<int64_t>& sizes = plan.microbatch_sizes;
  std::ostringstream why;
  why << "Sequences of up to " << t_max << " tokens: a token budget of " << token_budget
      << " padded tokens per microbatch is predicted to fit the " << format_bytes(budget) << " budget less a margin of "
      << format_bytes(margin_bytes) << " (peak " << format_bytes(mem.predicted_peak_bytes)
      << (model.columns().empty() ? " = " : ", ") << token_peak_source(model) << ")"
      << "; each window is packed longest first under it, so short sequences share a microbatch"
      << (plan.tokens->step_cost
              ? ", cut where the measured step times predict the least time (a microbatch costs as much as " +
                    std::to_string(std::llround(static_cast<double>(plan.tokens->step_cost->per_microbatch) /
                                                   static_cast<double>(kStepCostPerToken))) +
                    " padded tokens), so microbatches may stay well below the budget and the predicted peak, "
                    "the worst the budget allows"
              : std::string(", as few microbatches as the budget allows (no step times to weigh padding against)"))
      << ". Padded to " << t_max
      << " tokens, " << T << " samples per rank would need " << sizes.size() << " microbatches of at most " << m_max << ".";
  if (request.target_tokens) {
    why << " Each update is a window of consecutive sequences holding at least " << *request.target_tokens
        << " valid tokens over all ranks (--target-tokens); the sample fields size it as " << B << " sequences of "
        << t_max << " tokens, the fewest that can hold it.";
  }
  return why.str();
}

}  // namespace

Plan make_token_plan(const Profile& profile, const PlanRequest& request) {
  check_request(request);
  check_exchange(profile, request);
  const int64_t W = request.world_size;
  if (request.multiple_of || request.max_micro_batch || request.use_timing) {
    const std::string option =
        request.multiple_of       ? option_name("--multiple-of") + " " + std::to_string(*request.multiple_of)
        : request.max_micro_batch ? option_name("--max-micro-batch") + " " + std::to_string(*request.max_micro_batch)
                                  : option_name("--use-timing");
    throw InputError(option + " applies to sample plans; variable-length data is packed by tokens");
  }
  const TokenMemoryModel model = TokenMemoryModel::fit(profile);
  const int64_t budget = resolve_budget(profile, request);
  const int64_t t_max = planned_max_seq_len(profile);
  const int64_t B = token_window_samples(request, t_max);
  const int64_t T = B / W;
  const TokenSolution ts = solve_token_budget(profile, request, model, budget, t_max, T);
  const int64_t m_max = std::min(ts.token_budget / t_max, T);
  if (T / m_max + (T % m_max != 0 ? 1 : 0) > kMaxAccumulationSteps) {
    throw InfeasibleError(option_name(request.target_tokens ? "--target-tokens" : "--target-batch") + " " +
                          std::to_string(request.target_tokens.value_or(B)) + ": " + std::to_string(T) + " samples per rank padded to " +
                          std::to_string(t_max) + " tokens at " + std::to_string(m_max) + " per microbatch need more than " +
                          std::to_string(kMaxAccumulationSteps) + " microbatches per window. Lower " + option_name("--target-batch") +
                          " or raise " + option_name("--memory-budget"));
  }

  Plan plan;
  fill_window(plan, B, W, split_samples(T, m_max, request.split, 1), m_max, request);
  plan.tokens = TokenBudget{ts.token_budget, t_max, model.longest_sequence(ts.usable_bytes), request.target_tokens,
                            profile_step_cost(profile)};
  const Trial* ran = token_confirmation(profile, ts, t_max, budget);
  plan.confirmed = ran != nullptr;
  if (ran) plan.confirmed_peak_bytes = ran->peak_bytes;
  fill_token_memory(plan, profile, model, ts, budget);
  plan.reason = token_reason(plan, model, request);
  copy_provenance(plan, profile, plan.memory.predicted_peak_bytes);  // the whole window's: no less than its microbatches'
  return plan;
}

int64_t whole_batch_candidate(const Profile& profile, const PlanRequest& request, const Plan& plan) {
  const int64_t T = plan.per_rank_batch;
  if (plan.accumulation_steps <= 1 || T < 1) return 0;
  if (request.max_micro_batch && *request.max_micro_batch < T) return 0;
  if (request.multiple_of && T % *request.multiple_of != 0) return 0;
  for (const auto& t : profile.trials) {
    if (t.window.size() == 1 && t.window.front() == T) return 0;  // ran, fit or not
    if (!t.fit && !t.window.empty() && *std::max_element(t.window.begin(), t.window.end()) >= T) return 0;
  }
  const MemoryModel model = MemoryModel::fit(profile);
  const MarginModel mm = margin_model(model, profile, request.headroom);
  const int64_t one = model.predict_window_peak_bytes({T});
  return one + mm.bytes_at(T, false) <= plan.memory.budget_bytes ? T : 0;
}

// The summary's checkpointing line (1.7): the set, and the trade against no checkpointing.
std::string describe_checkpoint(const PlanCheckpoint& c, const Plan& p) {
  std::ostringstream s;
  s << "  checkpointing        " << c.rule << " (" << c.modules.size() << " of " << c.candidates.size()
    << " blocks): frees " << format_bytes(static_cast<int64_t>(c.saved_bytes_per_sample)) << "/sample, recomputes "
    << format_seconds(c.recompute_seconds) << " per window; predicted " << format_seconds(c.predicted_seconds_per_window)
    << " per window at microbatch " << p.micro_batch << "; without: "
    << (c.without.micro_batch > 0 ? "microbatch " + std::to_string(c.without.micro_batch) + ", " +
                                        format_seconds(c.without.predicted_seconds_per_window) + " per window"
                                  : std::string("not one sample fits"))
    << "\n";
  return s.str();
}

// The summary's eval line (1.7).
std::string describe_eval(const EvalPlan& e, int64_t train_micro_batch) {
  if (e.micro_batch == 0) {
    return "  eval microbatch      none fits: not even the training microbatch evaluates beside the weights and "
           "optimizer state\n";
  }
  char line[256];
  std::snprintf(line, sizeof line, "  eval microbatch      %lld (%.1fx the training %lld), predicted peak %s%s%s\n",
                static_cast<long long>(e.micro_batch),
                static_cast<double>(e.micro_batch) / static_cast<double>(std::max<int64_t>(1, train_micro_batch)),
                static_cast<long long>(train_micro_batch), format_bytes(e.predicted_peak_bytes).c_str(),
                e.keep_outputs ? ", outputs kept" : "", e.confirmed ? "; confirmed by a real eval window" : "");
  return line;
}

std::string describe_plan(const Plan& p) {
  const MemoryBreakdown& m = p.memory;
  const int64_t persistent = m.weights_bytes + m.gradients_bytes + m.optimizer_state_bytes;
  const int64_t activations = m.predicted_peak_bytes - persistent;
  char line[256];
  std::ostringstream s;
  if (p.tokens && p.tokens->target_tokens) {
    // Windows by valid tokens: the sample fields are a sizing at the longest length, not the window.
    s << "plan: windows of at least " << *p.tokens->target_tokens << " valid tokens over " << p.world_size
      << " rank(s), packed under the token budget; at " << p.tokens->max_seq_len << " tokens a sequence, "
      << p.target_batch << " sequences in microbatches of at most " << p.max_micro_batch << "\n";
  } else if (!p.ranks.empty()) {
    s << "plan: target batch " << p.target_batch << " over " << p.world_size << " ranks that differ; below, rank 0's window\n";
    for (size_t r = 0; r < p.ranks.size(); ++r) {
      const RankWindow& w = p.ranks[r];
      std::snprintf(line, sizeof line, "  rank %-13zu share %lld = %lld microbatch(es) [%s], budget %s, predicted peak %s\n",
                    r, static_cast<long long>(w.per_rank_batch), static_cast<long long>(w.microbatch_sizes.size()),
                    join_sizes(w.microbatch_sizes, 8).c_str(), format_bytes(w.budget_bytes).c_str(),
                    format_bytes(w.predicted_peak_bytes).c_str());
      s << line;
    }
  } else {
    s << "plan: target batch " << p.target_batch << " = " << p.world_size << " rank(s) x " << p.per_rank_batch << " = "
      << p.accumulation_steps << " microbatch(es) [" << join_sizes(p.microbatch_sizes) << "]\n";
  }
  std::snprintf(line, sizeof line, "  %-18s %12s\n", "budget", format_bytes(m.budget_bytes).c_str());
  s << line;
  std::snprintf(line, sizeof line, "  %-18s %12s  (%s %s: %s; usable %s)\n", "margin",
                format_bytes(m.margin_bytes).c_str(), option_name("--headroom").c_str(), m.margin.headroom.c_str(), describe_margin(m.margin).c_str(),
                format_bytes(m.usable_bytes).c_str());
  s << line;
  auto row = [&](const char* name, int64_t bytes) {
    std::snprintf(line, sizeof line, "  %-18s %12s\n", name, format_bytes(bytes).c_str());
    s << line;
  };
  row("weights", m.weights_bytes);
  row("gradients", m.gradients_bytes);
  row("optimizer state", m.optimizer_state_bytes);
  std::snprintf(line, sizeof line, "  %-18s %12s  (at microbatch %lld: %s fixed + %s/sample)\n", "activations",
                format_bytes(activations).c_str(), static_cast<long long>(p.micro_batch),
                format_bytes(m.activation_fixed_bytes).c_str(),
                format_bytes(static_cast<int64_t>(m.activation_bytes_per_sample)).c_str());
  s << line;
  std::snprintf(line, sizeof line, "  %-18s %12s  of %s usable (%.1f%%; fit residual up to %s)\n", "predicted peak",
                format_bytes(m.predicted_peak_bytes).c_str(), format_bytes(m.usable_bytes).c_str(),
                100.0 * static_cast<double>(m.predicted_peak_bytes) / static_cast<double>(std::max<int64_t>(1, m.usable_bytes)),
                format_bytes(static_cast<int64_t>(p.fit.max_abs_residual_bytes)).c_str());
  s << line;
  if (p.tokens) {
    s << "  token budget       " << p.tokens->token_budget << " padded tokens per microbatch (sequences up to "
      << p.tokens->max_seq_len << " tokens; the longest that fits alone: " << p.tokens->longest_sequence_alone
      << "); windows are packed longest first\n";
  }
  if (p.timing && !p.checkpoint) {  // a checkpointed plan's line below states its window's time
    s << "  predicted window     " << format_seconds(p.timing->window_seconds) << "\n";
  }
  if (p.confirmed) {
    // The window that covers the plan: the one whose peak the plan records.
    std::string window;
    for (const auto& t : p.profile.trials) {
      if (!t.window.empty() && t.peak_bytes == p.confirmed_peak_bytes.value_or(-1)) window = join_sizes(t.window);
    }
    s << "  confirmed            yes: a real window" << (window.empty() ? "" : " [" + window + "]")
      << " covering the plan's ran within the budget, peak " << format_bytes(p.confirmed_peak_bytes.value_or(0)) << "\n";
  } else {
    s << "  confirmed            no (no real window covering the plan's was run)\n";
  }
  if (p.eval) s << describe_eval(*p.eval, p.micro_batch);
  if (p.checkpoint) s << describe_checkpoint(*p.checkpoint, p);
  if (p.checkpoint_choice) s << "  " << describe_choice(*p.checkpoint_choice) << "\n";
  if (p.sharding) {
    const Sharding& sh = *p.sharding;
    s << "  sharding           optimizer state over " << sh.world_size << " ranks (ZeRO-1): largest share "
      << format_bytes(sh.per_rank_state_bytes[static_cast<size_t>(sh.measured_rank)]) << " on rank " << sh.measured_rank
      << ", " << format_bytes(freed_state_bytes(sh)) << " freed per rank; unsharded microbatch "
      << (sh.unsharded_micro_batch.value_or(0) > 0 ? std::to_string(*sh.unsharded_micro_batch) : std::string("none")) << "\n";
  }
  if (!p.model.batch_dependent_layers.empty()) {
    s << "  warning: " << p.model.batch_dependent_layers.size()
      << " batch-dependent layer(s) (e.g. " << p.model.batch_dependent_layers.front()
      << "): accumulation will not reproduce one large batch for them\n";
  }
  s << "  " << p.reason << "\n";
  return s.str();
}

}  // namespace accumplan
