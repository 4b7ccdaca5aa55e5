// solver.cpp — the planner's arithmetic. See solver.h and docs/architecture.md "What the planner solves".
#include "accumplan/solver.h"
#include "accumplan/units.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "accumplan/errors.h"
#include "accumplan/memory_model.h"

namespace accumplan {
namespace {

// With --use-timing, a larger accumulation count is chosen only when predicted this much faster.
// Step times come from a handful of probe steps and are noisy: with 5% and one timed step per
// size, the same command on builtin:mlp (1 ms steps, 2 busy cores) planned 3 x 22 in one run and
// 8 x 8 in the next, and even the faster of two timed steps put tinylm's b=8 at 72 ms against
// 23 ms at b=4 with another process on the machine (a "36% faster" 10 x 4 where 5 x 8 fit).
// That is why timing is opt-in and memory alone decides by default.
constexpr double kFasterBy = 0.10;


std::string pct(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g%%", f * 100.0);
  return buf;
}

void validate(const PlanRequest& r) {
  if (r.target_batch < 1) {
    throw InputError("--target-batch must be at least 1, got " + std::to_string(r.target_batch));
  }
  if (r.world_size < 1) {
    throw InputError("--world-size must be at least 1, got " + std::to_string(r.world_size));
  }
  if (!(r.headroom >= 0.0 && r.headroom < 1.0)) {
    std::ostringstream got;
    got << r.headroom;
    throw InputError("--headroom must be a fraction in [0, 1), e.g. 0.1 for 10%; got " + got.str());
  }
  if (r.multiple_of && *r.multiple_of < 1) {
    throw InputError("--multiple-of must be at least 1, got " + std::to_string(*r.multiple_of));
  }
  if (r.max_micro_batch && *r.max_micro_batch < 1) {
    throw InputError("--max-micro-batch must be at least 1, got " + std::to_string(*r.max_micro_batch));
  }
  if (r.split != "balanced" && r.split != "uniform") {
    throw InputError("--split must be 'balanced' or 'uniform', got '" + r.split + "'");
  }
}

// "B=250 is not divisible by ..." with the nearest valid values either side.
void check_divisible(int64_t target, int64_t step, const std::string& why) {
  if (target % step == 0) return;
  const int64_t below = (target / step) * step;
  const int64_t above = below + step;
  std::string nearest = below > 0 ? std::to_string(below) + " or " + std::to_string(above)
                                  : std::to_string(above);
  throw InfeasibleError("--target-batch " + std::to_string(target) + " is not divisible by " +
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
  return s.str();
}

[[noreturn]] void infeasible(const MemoryModel& model, int64_t unit, int64_t budget, double headroom,
                             int64_t usable) {
  const int64_t need = std::max(model.predict_peak_bytes(unit), model.optimizer_step_peak_bytes());
  const int64_t need_budget = static_cast<int64_t>(std::ceil(static_cast<double>(need) / (1.0 - headroom)));
  std::ostringstream s;
  s << "no microbatch fits: budget " << format_bytes(budget) << " minus " << pct(headroom)
    << " headroom leaves " << format_bytes(usable) << " usable, but ";
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
  s << ". Raise --memory-budget to at least " << format_bytes(need_budget)
    << ", lower --headroom, or use an optimizer with less state (sgd keeps none, adam two copies "
       "of the weights)";
  throw InfeasibleError(s.str());
}

}  // namespace

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
  for (int64_t d = std::min(limit, total); d >= 1; --d) {
    if (d % unit == 0 && total % d == 0) return d;
  }
  return 0;
}

std::vector<int64_t> split_samples(int64_t total, int64_t max_micro_batch, const std::string& split,
                                   int64_t unit) {
  if (total < 1 || max_micro_batch < 1) {
    throw InternalError("split_samples needs positive sizes");
  }
  if (total % unit != 0) unit = 1;  // a short last window need not respect multiple_of
  const int64_t cap = std::max(unit, (max_micro_batch / unit) * unit);
  if (split == "uniform") {
    const int64_t d = largest_divisor_at_most(total, cap, unit);
    return std::vector<int64_t>(static_cast<size_t>(total / d), d);
  }
  const int64_t units = total / unit;
  const int64_t cap_units = cap / unit;
  const int64_t parts = (units + cap_units - 1) / cap_units;
  return balanced_split(total, parts, unit);
}

void check_request(const PlanRequest& request) {
  validate(request);
  const int64_t B = request.target_batch;
  const int64_t W = request.world_size;
  check_divisible(B, W, "--world-size");
  const int64_t unit = request.multiple_of.value_or(1);
  if ((B / W) % unit != 0) check_divisible(B, W * unit, "world size x --multiple-of");
}

Plan make_plan(const Profile& profile, const PlanRequest& request) {
  check_request(request);
  const int64_t B = request.target_batch;
  const int64_t W = request.world_size;
  const int64_t T = B / W;
  const int64_t unit = request.multiple_of.value_or(1);

  const MemoryModel model = MemoryModel::fit(profile);

  int64_t budget = 0;
  if (request.budget.is_set()) {
    budget = request.budget.resolve_bytes(profile.device.total_bytes);
  } else if (profile.device.total_bytes > 0) {
    budget = profile.device.total_bytes;
  } else {
    throw InputError("the profile does not record the device's memory; give --memory-budget");
  }
  const int64_t usable = static_cast<int64_t>(std::floor(static_cast<double>(budget) * (1.0 - request.headroom)));

  const int64_t m_fit = model.largest_fitting(usable);
  if (m_fit < unit || model.persistent().total() > usable || model.optimizer_step_peak_bytes() > usable) {
    infeasible(model, unit, budget, request.headroom, usable);
  }
  if (request.max_micro_batch && *request.max_micro_batch < unit) {
    throw InputError("--max-micro-batch " + std::to_string(*request.max_micro_batch) +
                     " is smaller than --multiple-of " + std::to_string(unit));
  }
  int64_t m_max = std::min(m_fit, T);
  // The whole per-rank batch as one microbatch: no gradient is resident in a one-microbatch
  // window, so it may fit where a steady-state microbatch of that size would not.
  if (m_max < T && model.fits_in_one_microbatch(T, usable)) m_max = T;
  const bool user_bound = request.max_micro_batch && *request.max_micro_batch < m_max;
  if (user_bound) m_max = *request.max_micro_batch;
  m_max = (m_max / unit) * unit;

  // Fewest microbatches first; then, with --use-timing, a larger count if clearly faster.
  std::vector<int64_t> sizes = split_samples(T, m_max, request.split, unit);
  const auto k_min = static_cast<int64_t>(sizes.size());  // memory's answer
  std::string timing_note;  // what --use-timing did, for `reason`; empty without it
  std::optional<TimeModel> time;
  if (TimeModel::available(profile)) time = TimeModel::fit(profile);
  if (request.use_timing && !time) {
    timing_note = "; --use-timing had no effect: the profile has no step times at two sizes or more";
  } else if (request.use_timing && request.split != "balanced") {
    timing_note = "; --use-timing had no effect: it weighs balanced splits only, not --split " + request.split;
  } else if (request.use_timing) {
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
    if (best <= t_min * (1.0 - kFasterBy)) {  // "at least 10% faster", as --help says
      char buf[160];
      std::snprintf(buf, sizeof buf,
                    "; with --use-timing, measured step times predict %zu microbatches %.0f%% faster per window "
                    "than %lld, so %zu are used",
                    best_sizes.size(), 100.0 * (1.0 - best / t_min), static_cast<long long>(k_min),
                    best_sizes.size());
      timing_note = buf;
      sizes = best_sizes;
    } else {
      timing_note = "; --use-timing found no split predicted at least " + pct(kFasterBy) + " faster per window";
    }
  }

  Plan plan;
  plan.target_batch = B;
  plan.world_size = W;
  plan.per_rank_batch = T;
  plan.microbatch_sizes = sizes;
  plan.micro_batch = *std::max_element(sizes.begin(), sizes.end());
  plan.accumulation_steps = static_cast<int64_t>(sizes.size());
  for (auto n : sizes) plan.weights.push_back(static_cast<double>(n) / static_cast<double>(T));
  plan.max_micro_batch = m_max;
  plan.split = request.split;
  plan.multiple_of = request.multiple_of;
  plan.uniform.micro_batch = largest_divisor_at_most(T, m_max, unit);
  plan.uniform.accumulation_steps = T / plan.uniform.micro_batch;

  MemoryBreakdown& mem = plan.memory;
  mem.budget_bytes = budget;
  mem.headroom = request.headroom;
  mem.usable_bytes = usable;
  mem.predicted_peak_bytes = model.predict_window_peak_bytes(sizes);
  mem.weights_bytes = profile.persistent.weights_bytes;
  mem.gradients_bytes = profile.persistent.gradients_bytes;
  mem.optimizer_state_bytes = profile.persistent.optimizer_state_bytes;
  mem.activation_fixed_bytes = model.activation_fixed_bytes();
  mem.activation_bytes_per_sample = model.summary().slope_bytes_per_sample;
  plan.fit = model.summary();
  if (time) {
    plan.timing = Timing{time->window_seconds(sizes), time->predict_seconds(plan.micro_batch)};
  }

  std::ostringstream why;
  if (m_max >= T && sizes.size() == 1) {
    why << "The whole per-rank batch of " << T << " fits (predicted peak "
        << format_bytes(mem.predicted_peak_bytes) << " of " << format_bytes(usable)
        << " usable), so no accumulation is needed";
  } else {
    if (user_bound) {
      why << "--max-micro-batch bounds the microbatch at " << m_max << " (memory alone would allow "
          << m_fit << ")";
    } else if (m_fit > T) {
      why << "Microbatches are capped at " << m_max;
    } else {
      why << "The largest microbatch predicted to fit " << format_bytes(usable) << " usable ("
          << format_bytes(budget) << " budget less " << pct(request.headroom) << " headroom) is "
          << m_fit;
      if (m_max != m_fit) why << ", " << m_max << " as a multiple of " << unit;
    }
    why << "; " << T << " samples per rank need " << k_min << " microbatches";
  }
  why << timing_note;
  if (!(m_max >= T && sizes.size() == 1)) {
    why << (timing_note.empty() ? ", split " : "; split ") << request.split << " as " << join_sizes(sizes);
  }
  why << ".";
  plan.reason = why.str();

  plan.device = profile.device;
  plan.model = profile.model;
  plan.setup = profile.setup;
  plan.libtorch_version = profile.libtorch_version;
  plan.profile = profile;
  return plan;
}

std::string describe_plan(const Plan& p) {
  const MemoryBreakdown& m = p.memory;
  const int64_t persistent = m.weights_bytes + m.gradients_bytes + m.optimizer_state_bytes;
  const int64_t activations = m.predicted_peak_bytes - persistent;
  char line[256];
  std::ostringstream s;
  s << "plan: target batch " << p.target_batch << " = " << p.world_size << " rank(s) x "
    << p.per_rank_batch << " = " << p.accumulation_steps << " microbatch(es) [" << join_sizes(p.microbatch_sizes)
    << "]\n";
  std::snprintf(line, sizeof line, "  %-18s %12s  (%s headroom, usable %s)\n", "budget",
                format_bytes(m.budget_bytes).c_str(), pct(m.headroom).c_str(), format_bytes(m.usable_bytes).c_str());
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
  if (p.timing) {
    s << "  predicted window     " << format_seconds(p.timing->window_seconds) << "\n";
  }
  if (p.confirmed) {
    s << "  confirmed            yes: a real step at microbatch " << p.micro_batch << " peaked at "
      << format_bytes(p.confirmed_peak_bytes.value_or(0)) << "\n";
  } else {
    s << "  confirmed            no (no real step at microbatch " << p.micro_batch << " was run)\n";
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
