// planner/src/step_time.cpp — seconds(b, L) = t0 + t1·b·L + t2·b·L², fitted robustly from timed
// microbatches. See accumplan/step_time.h.
#include "accumplan/step_time.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <set>
#include <utility>

#include "accumplan/token_model.h"
#include "least_squares.h"

namespace accumplan {
namespace {

using Coef = std::array<double, 3>;  // t0, t1, t2

double feature(const TimedMicrobatch& m, size_t column) {
  const double bl = static_cast<double>(m.micro_batch) * static_cast<double>(m.seq_len);
  return column == 0 ? 1.0 : column == 1 ? bl : bl * static_cast<double>(m.seq_len);
}

double predict(const Coef& c, const TimedMicrobatch& m) {
  return c[0] * feature(m, 0) + c[1] * feature(m, 1) + c[2] * feature(m, 2);
}

// Of the weighted fits over t1 and each subset of {t0, t2}, the one of least weighted squared
// error with every coefficient >= 0 and t1 > 0 (a non-negative least squares over three columns,
// by enumeration). nullopt when none qualifies.
std::optional<Coef> nonnegative_fit(const std::vector<TimedMicrobatch>& ms) {
  static const std::vector<std::vector<size_t>> kSubsets = {{0, 1, 2}, {0, 1}, {1, 2}, {1}};
  std::optional<Coef> best;
  double best_error = 0;
  std::vector<double> y, w;
  for (const auto& m : ms) {
    y.push_back(m.seconds);
    w.push_back(1.0 / m.seconds);
  }
  for (const auto& subset : kSubsets) {
    std::vector<std::vector<double>> rows;
    for (const auto& m : ms) {
      std::vector<double> row;
      for (size_t column : subset) row.push_back(feature(m, column));
      rows.push_back(std::move(row));
    }
    const std::optional<std::vector<double>> solved = detail::weighted_least_squares(rows, y, w, subset.size());
    if (!solved) continue;
    Coef c{0, 0, 0};
    for (size_t j = 0; j < subset.size(); ++j) c[subset[j]] = (*solved)[j];
    // t1 > 0 and finite ratios: a per-token time below 1e-30 s is no measurement (and 65536 / t1
    // would overflow the cost's unit).
    if (!(c[1] > 1e-30) || !(c[0] >= 0) || !(c[2] >= 0) || !std::isfinite(c[0] + c[1] + c[2])) continue;
    double error = 0;
    for (size_t i = 0; i < ms.size(); ++i) error += w[i] * (y[i] - predict(c, ms[i])) * (y[i] - predict(c, ms[i]));
    if (!best || error < best_error) {
      best = c;
      best_error = error;
    }
  }
  return best;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  return v[mid];
}

size_t distinct_shapes(const std::vector<TimedMicrobatch>& ms) {
  std::set<std::pair<int64_t, int64_t>> shapes;
  for (const auto& m : ms) shapes.insert({m.micro_batch, m.seq_len});
  return shapes.size();
}

}  // namespace

double StepTimeFit::predict_seconds(int64_t micro_batch, int64_t seq_len) const {
  return predict(Coef{per_microbatch_seconds, per_token_seconds, per_token_squared_seconds},
                 TimedMicrobatch{micro_batch, seq_len, 0});
}

StepTimeFit StepTimeFit::with_microbatch_floor(double seconds) const {
  StepTimeFit f = *this;
  if (std::isfinite(seconds)) f.per_microbatch_seconds = std::max(f.per_microbatch_seconds, seconds);
  return f;
}

double microbatch_overhead_seconds(const std::vector<WindowTime>& windows) {
  std::vector<double> over;
  for (const WindowTime& w : windows) {
    if (w.microbatches < 1 || !std::isfinite(w.seconds - w.step_seconds)) continue;
    over.push_back(std::max(0.0, w.seconds - w.step_seconds) / static_cast<double>(w.microbatches));
  }
  return median(over);
}

TokenStepCost StepTimeFit::cost() const {
  // One unit for all three, so their ratios (what packing trades) survive the integers: a token's
  // time is 65536 units unless t0 or t2 would then pass its field's ceiling (a t1 tiny next to
  // them), and then the unit shrinks until they fit; per_token is at least 1.
  constexpr double kMicrobatchCeiling = static_cast<double>(int64_t{1} << 50);
  constexpr double kSquaredCeiling = static_cast<double>(int64_t{1} << 30);
  double unit = static_cast<double>(kStepCostPerToken) / per_token_seconds;
  if (per_microbatch_seconds * unit > kMicrobatchCeiling) unit = kMicrobatchCeiling / per_microbatch_seconds;
  if (per_token_squared_seconds * unit > kSquaredCeiling) unit = kSquaredCeiling / per_token_squared_seconds;
  TokenStepCost c;
  c.per_token = std::clamp<int64_t>(std::llround(per_token_seconds * unit), 1, kStepCostPerToken);
  c.per_microbatch = std::llround(std::min(per_microbatch_seconds * unit, kMicrobatchCeiling));
  c.per_token_squared = std::llround(std::min(per_token_squared_seconds * unit, kSquaredCeiling));
  c.token_seconds = static_cast<double>(c.per_token) / unit;  // seconds of per_token units
  return c;
}

std::optional<StepTimeFit> fit_step_time(const std::vector<TimedMicrobatch>& microbatches) {
  for (const auto& m : microbatches) {
    if (m.micro_batch < 1 || m.seq_len < 1 || !(m.seconds > 0) || !std::isfinite(m.seconds)) return std::nullopt;
  }
  if (microbatches.size() < 4 || distinct_shapes(microbatches) < 3) return std::nullopt;
  std::vector<TimedMicrobatch> kept = microbatches;
  std::optional<Coef> c = nonnegative_fit(kept);
  if (!c) return std::nullopt;
  // Set aside the microbatches the fit misses by far more than it misses the rest (a preempted
  // step), at most a quarter of them, and fit again; three rounds at most.
  std::vector<bool> set_aside(microbatches.size(), false);
  for (int round = 0; round < 3; ++round) {
    std::vector<std::pair<double, size_t>> misses;
    for (size_t i = 0; i < microbatches.size(); ++i) {
      misses.push_back({std::fabs(predict(*c, microbatches[i]) - microbatches[i].seconds) / microbatches[i].seconds, i});
    }
    std::vector<double> miss_only;
    for (const auto& m : misses) miss_only.push_back(m.first);
    const double limit = std::max(0.10, 5.0 * median(miss_only));
    std::sort(misses.begin(), misses.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
    std::vector<bool> out(microbatches.size(), false);
    for (size_t k = 0; k < microbatches.size() / 4 && misses[k].first > limit; ++k) out[misses[k].second] = true;
    std::vector<TimedMicrobatch> next;
    for (size_t i = 0; i < microbatches.size(); ++i) {
      if (!out[i]) next.push_back(microbatches[i]);
    }
    if (out == set_aside || distinct_shapes(next) < 3) break;  // the same ones as the fit it has
    const std::optional<Coef> refit = nonnegative_fit(next);
    if (!refit) break;
    kept = std::move(next);
    set_aside = std::move(out);
    c = refit;
  }
  StepTimeFit f;
  f.per_microbatch_seconds = (*c)[0];
  f.per_token_seconds = (*c)[1];
  f.per_token_squared_seconds = (*c)[2];
  f.used = static_cast<int64_t>(kept.size());
  f.set_aside = static_cast<int64_t>(microbatches.size() - kept.size());
  std::vector<double> misses;
  for (const auto& m : kept) misses.push_back(std::fabs(predict(*c, m) - m.seconds) / m.seconds);
  f.median_abs_error = median(misses);
  return f;
}

std::optional<double> predicted_seconds(const TokenStepCost& cost, int64_t micro_batch, int64_t seq_len) {
  if (!(cost.token_seconds > 0) || cost.per_token < 1) return std::nullopt;
  const double bl = static_cast<double>(micro_batch) * static_cast<double>(seq_len);
  const double units = static_cast<double>(cost.per_microbatch) + static_cast<double>(cost.per_token) * bl +
                       static_cast<double>(cost.per_token_squared) * bl * static_cast<double>(seq_len);
  return units / static_cast<double>(cost.per_token) * cost.token_seconds;
}

void StepTimeModel::observe(const TimedMicrobatch& microbatch) {
  recent_.push_back(microbatch);
  if (recent_.size() > kRecentMicrobatches) recent_.pop_front();
}

bool StepTimeModel::refit() {
  if (std::optional<StepTimeFit> f = fit_step_time(std::vector<TimedMicrobatch>(recent_.begin(), recent_.end()))) {
    fit_ = std::move(f);
    ++refits_;
  }
  return fit_.has_value();
}

const std::vector<std::string>& packing_names() {
  static const std::vector<std::string> names{"time", "fill"};
  return names;
}

const std::string& packing_name(Packing packing) { return packing_names()[packing == Packing::Time ? 0 : 1]; }

std::optional<Packing> packing_named(const std::string& name) {
  if (name == packing_names()[0]) return Packing::Time;
  if (name == packing_names()[1]) return Packing::Fill;
  return std::nullopt;
}

void PackingCost::observe_window(const std::vector<TimedMicrobatch>& microbatches, std::optional<double> rounds_seconds) {
  for (const auto& t : microbatches) model_.observe(t);
  if (microbatches.empty()) return;
  model_.refit();
  if (!rounds_seconds) return;
  double steps = 0;
  for (const auto& t : microbatches) steps += t.seconds;
  windows_.push_back({*rounds_seconds, steps, static_cast<int64_t>(microbatches.size())});
  if (windows_.size() > kRecentWindows) windows_.pop_front();
}

double PackingCost::microbatch_floor_seconds() const {
  if (!windows_.empty()) return microbatch_overhead_seconds(std::vector<WindowTime>(windows_.begin(), windows_.end()));
  if (!plan_cost_ || !(plan_cost_->token_seconds > 0) || plan_cost_->per_token < 1) return 0;
  return static_cast<double>(plan_cost_->per_microbatch) / static_cast<double>(plan_cost_->per_token) * plan_cost_->token_seconds;
}

std::optional<TokenStepCost> PackingCost::cost() const {
  if (model_.fit()) return model_.fit()->with_microbatch_floor(microbatch_floor_seconds()).cost();
  return plan_cost_;
}

}  // namespace accumplan
