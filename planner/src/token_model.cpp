// planner/src/token_model.cpp — peak(b, T) from the measured lengths (or c0 + a1·b·T + a2·b·T²)
// and packing under it. See accumplan/token_model.h.
#include "accumplan/token_model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <string>

#include "accumplan/checked.h"
#include "accumplan/errors.h"
#include "accumplan/terms.h"
#include "accumplan/units.h"
#include "least_squares.h"
#include "settle.h"

namespace accumplan {
namespace {

struct Solved {
  std::vector<double> coef;  // c0, a1[, a2]
  std::vector<double> residuals;
  double max_abs = 0;
  double rms = 0;
};

// Weighted least squares (least_squares.h) over the columns 1, b·T[, b·T²], each point weighted
// by its tokens b·T (the plan lives at the large end, as the sample model weighs by b).
Solved solve(const std::vector<TokenPoint>& pts, size_t columns) {
  auto feature = [](const TokenPoint& p, size_t j) {
    const double bt = static_cast<double>(p.micro_batch) * static_cast<double>(p.seq_len);
    return j == 0 ? 1.0 : j == 1 ? bt : bt * static_cast<double>(p.seq_len);
  };
  std::vector<std::vector<double>> rows;
  std::vector<double> y, w;
  for (const auto& p : pts) {
    rows.push_back({feature(p, 0), feature(p, 1), feature(p, 2)});
    y.push_back(static_cast<double>(p.peak_bytes));
    w.push_back(static_cast<double>(p.micro_batch) * static_cast<double>(p.seq_len));
  }
  const std::optional<std::vector<double>> coef = detail::weighted_least_squares(rows, y, w, columns);
  if (!coef) throw InputError("the token memory fit is singular: measure at least two token counts");
  Solved s;
  s.coef = *coef;
  for (const auto& p : pts) {
    double predicted = 0;
    for (size_t j = 0; j < columns; ++j) predicted += s.coef[j] * feature(p, j);
    s.residuals.push_back(static_cast<double>(p.peak_bytes) - predicted);
    s.max_abs = std::max(s.max_abs, std::fabs(s.residuals.back()));
    s.rms += s.residuals.back() * s.residuals.back();
  }
  s.rms = std::sqrt(s.rms / static_cast<double>(std::max<size_t>(1, pts.size())));
  return s;
}

}  // namespace

TokenMemoryModel TokenMemoryModel::fit(const Profile& profile) {
  std::vector<TokenPoint> pts;
  for (const auto& p : profile.points) {
    if (p.seq_len) pts.push_back({p.micro_batch, *p.seq_len, p.peak_bytes});
  }
  TokenMemoryModel model = fit(pts);
  model.gradients_bytes_ = profile.persistent.gradients_bytes;
  model.optimizer_state_bytes_ = profile.persistent.optimizer_state_bytes;
  // A window's first microbatch from the same windows' first microbatches, where every one was
  // recorded: its gradients appear during its backward, so the peak's moment decides how many
  // are resident (a decoder's long sequences peak with 70% of them, its short ones with none).
  std::vector<TokenPoint> first;
  for (const auto& p : profile.points) {
    if (p.seq_len && p.first_microbatch_peak_bytes) first.push_back({p.micro_batch, *p.seq_len, *p.first_microbatch_peak_bytes});
  }
  if (!model.columns_.empty() && first.size() == pts.size()) {
    try {
      auto f = std::make_shared<const TokenMemoryModel>(fit(first));
      if (!f->columns_.empty()) model.first_microbatch_ = std::move(f);
    } catch (const InputError&) {
      // the steady windows' rule below
    }
  }
  return model;
}

int64_t TokenMemoryModel::predict_microbatch_peak_bytes(int64_t micro_batch, int64_t seq_len, bool first_in_window,
                                                        bool optimizer_state_exists) const {
  int64_t peak = first_in_window && first_microbatch_ ? first_microbatch_->predict_peak_bytes(micro_batch, seq_len)
                                                     : predict_peak_bytes(micro_batch, seq_len);
  if (first_in_window && !first_microbatch_) peak -= gradients_bytes_;
  if (!optimizer_state_exists) peak -= optimizer_state_bytes_;
  return peak;
}

PackedPeakPredictor::PackedPeakPredictor(const Profile& profile) {
  try {
    model_ = TokenMemoryModel::fit(profile);
  } catch (const InputError&) {
    model_.reset();  // no (b, T) points to fit: nothing to predict from
  }
  for (const auto& p : profile.points) {
    if (p.seq_len && p.optimizer_step_peak_bytes) {
      optimizer_step_peak_bytes_ = std::max(optimizer_step_peak_bytes_.value_or(0), *p.optimizer_step_peak_bytes);
    }
  }
}

std::optional<int64_t> PackedPeakPredictor::microbatch_peak_bytes(int64_t micro_batch, int64_t seq_len,
                                                                  bool first_in_window, bool optimizer_state_exists) const {
  if (!model_) return std::nullopt;
  return model_->predict_microbatch_peak_bytes(micro_batch, seq_len, first_in_window, optimizer_state_exists);
}

std::optional<int64_t> PackedPeakPredictor::window_peak_bytes(std::optional<int64_t> microbatches_peak_bytes) const {
  if (microbatches_peak_bytes && optimizer_step_peak_bytes_) {
    return std::max(*microbatches_peak_bytes, *optimizer_step_peak_bytes_);
  }
  return microbatches_peak_bytes;
}

std::optional<int64_t> PackedPeakPredictor::window_peak_bytes(const std::vector<std::pair<int64_t, int64_t>>& microbatches,
                                                              bool optimizer_state_exists) const {
  std::optional<int64_t> peak;
  for (size_t i = 0; i < microbatches.size(); ++i) {
    const std::optional<int64_t> m =
        microbatch_peak_bytes(microbatches[i].first, microbatches[i].second, i == 0, optimizer_state_exists);
    if (m) peak = std::max(peak.value_or(0), *m);
  }
  return window_peak_bytes(peak);
}

TokenMemoryModel TokenMemoryModel::fit(const std::vector<TokenPoint>& points) {
  std::set<double> tokens;
  std::set<int64_t> lengths;
  for (size_t i = 0; i < points.size(); ++i) {
    const TokenPoint& p = points[i];
    const std::string where = "token point " + std::to_string(i);
    checked_in_range(p.micro_batch, 1, kMaxSequences, where + " micro_batch");
    checked_in_range(p.seq_len, 1, kMaxSeqLen, where + " seq_len");
    checked_in_range(p.peak_bytes, 0, kMaxBytes, where + " peak_bytes");
    tokens.insert(static_cast<double>(p.micro_batch) * static_cast<double>(p.seq_len));
    lengths.insert(p.seq_len);
  }
  if (tokens.size() < 2) {
    throw InputError("the token memory model needs windows of at least two different token counts b·T (got " +
                     std::to_string(tokens.size()) + "); measure more (b, T) sizes");
  }
  TokenMemoryModel m;
  const Solved line = solve(points, 2);
  if (!(line.coef[1] > 0)) {
    throw InputError("the measured peaks do not grow with the tokens (" + std::to_string(line.coef[1]) +
                     " bytes per token); the measurements are not of this model's windows");
  }
  m.fit_.intercept_bytes = line.coef[0];
  m.fit_.bytes_per_token = line.coef[1];
  m.fit_.residuals_bytes = line.residuals;
  m.fit_.max_abs_residual_bytes = line.max_abs;
  m.fit_.rms_residual_bytes = line.rms;
  m.fit_.line_max_abs_residual_bytes = line.max_abs;
  // The T² term needs two sequence lengths to be told apart from the line, and four points to
  // leave a residual worth comparing; it must cost memory (a2 > 0, per-token cost still > 0) and
  // halve the line's worst miss, else the simpler model wins.
  if (lengths.size() >= 2 && points.size() >= 4) {
    const Solved quad = solve(points, 3);
    if (quad.coef[2] > 0 && quad.coef[1] > 0 && quad.max_abs < 0.5 * line.max_abs) {
      m.fit_.intercept_bytes = quad.coef[0];
      m.fit_.bytes_per_token = quad.coef[1];
      m.fit_.bytes_per_token_squared = quad.coef[2];
      m.fit_.quadratic = true;
      m.fit_.residuals_bytes = quad.residuals;
      m.fit_.max_abs_residual_bytes = quad.max_abs;
      m.fit_.rms_residual_bytes = quad.rms;
    }
  }
  m.fit_columns(points);
  return m;
}

void TokenMemoryModel::fit_columns(const std::vector<TokenPoint>& points) {
  // Of two windows at one length, a peak that did not grow with the sequences (by less than 0.01%
  // of what it would if it were all per-sequence) is a moment that holds no activations (the
  // gradients and a parameter-sized temporary): it bounds every prediction from below and
  // teaches no column.
  std::vector<bool> flat(points.size(), false);
  for (size_t i = 0; i < points.size(); ++i) {
    for (size_t j = 0; j < points.size(); ++j) {
      const double bi = static_cast<double>(points[i].micro_batch), bj = static_cast<double>(points[j].micro_batch);
      const double yi = static_cast<double>(points[i].peak_bytes), yj = static_cast<double>(points[j].peak_bytes);
      if (points[j].seq_len == points[i].seq_len && bj > bi && yj - yi <= 1e-4 * yi * (bj - bi) / bi) {
        flat[i] = flat[j] = true;
      }
    }
  }
  std::map<int64_t, std::vector<std::pair<double, double>>> by_length;  // T -> (b, peak)
  for (size_t i = 0; i < points.size(); ++i) {
    if (flat[i]) {
      floor_bytes_ = std::max(floor_bytes_, static_cast<double>(points[i].peak_bytes));
      continue;
    }
    by_length[points[i].seq_len].push_back(
        {static_cast<double>(points[i].micro_batch), static_cast<double>(points[i].peak_bytes)});
  }
  std::vector<TokenColumn> all;
  for (auto& [t, xy] : by_length) {
    std::map<double, std::pair<double, int>> by_size;  // b -> (sum of peaks, count): repeats averaged
    for (const auto& [b, peak] : xy) {
      by_size[b].first += peak;
      by_size[b].second += 1;
    }
    TokenColumn c{t, {}, 0};
    for (const auto& [b, sum] : by_size) c.peaks.push_back({b, sum.first / sum.second});
    for (size_t j = 0; j + 1 < c.peaks.size(); ++j) {
      if (!(c.peaks[j + 1].second > c.peaks[j].second)) {  // not growing with b: one least-squares line
        const detail::Line l = detail::weighted_line(xy, [](double b) { return b; });
        if (!(l.slope > 0)) return;  // the fit decides
        c.peaks = {{c.peaks.front().first, l.intercept + l.slope * c.peaks.front().first},
                   {c.peaks.back().first, l.intercept + l.slope * c.peaks.back().first}};
        break;
      }
    }
    all.push_back(std::move(c));
  }
  std::vector<TokenColumn> lines;
  for (const auto& c : all) {
    if (c.peaks.size() >= 2) lines.push_back(c);
  }
  if (lines.empty()) return;
  for (auto& c : all) {
    if (c.peaks.size() >= 2) continue;
    const int64_t t = c.seq_len;
    const TokenColumn& near = *std::min_element(lines.begin(), lines.end(), [t](const auto& x, const auto& y) {
      return std::llabs(x.seq_len - t) < std::llabs(y.seq_len - t);
    });
    c.borrowed_intercept_bytes = near.line_at(c.peaks.front().first).intercept_bytes;
    if (!(c.peaks.front().second > c.borrowed_intercept_bytes)) return;
  }
  if (all.size() >= 2) columns_ = std::move(all);
}

TokenLine TokenColumn::line_at(double micro_batch) const {
  if (peaks.size() == 1) {
    return {borrowed_intercept_bytes, (peaks.front().second - borrowed_intercept_bytes) / peaks.front().first};
  }
  size_t j = 0;
  while (j + 2 < peaks.size() && peaks[j + 1].first < micro_batch) ++j;
  const auto& [b0, y0] = peaks[j];
  const auto& [b1, y1] = peaks[j + 1];
  const double slope = (y1 - y0) / (b1 - b0);
  return {y0 - slope * b0, slope};
}

double TokenMemoryModel::segment_bytes(size_t i, double b, double t) const {
  const TokenLine l = columns_[i].line_at(b), r = columns_[i + 1].line_at(b);
  const double tl = static_cast<double>(columns_[i].seq_len), tr = static_cast<double>(columns_[i + 1].seq_len);
  const double u = (t - tl) / (tr - tl);
  const double per_token = l.bytes_per_sequence / tl + u * (r.bytes_per_sequence / tr - l.bytes_per_sequence / tl);
  const double intercept = std::clamp(l.intercept_bytes + u * (r.intercept_bytes - l.intercept_bytes),
                                      std::min(l.intercept_bytes, r.intercept_bytes),
                                      std::max(l.intercept_bytes, r.intercept_bytes));
  return intercept + b * t * std::max(per_token, 0.0);
}

std::optional<int64_t> TokenMemoryModel::least_certain_length(int64_t tokens, double fraction) const {
  std::optional<int64_t> where;
  double widest = fraction;
  for (size_t i = 0; i + 1 < columns_.size(); ++i) {
    // The geometric middle: a per-sequence cost curves the peak most at the short end.
    const int64_t t = static_cast<int64_t>(
        std::sqrt(static_cast<double>(columns_[i].seq_len) * static_cast<double>(columns_[i + 1].seq_len)));
    if (t <= columns_[i].seq_len) continue;  // neighbours: nothing between them
    const double b = static_cast<double>(std::max<int64_t>(1, tokens / t)), td = static_cast<double>(t);
    const double chord = segment_bytes(i, b, td);
    std::optional<double> floor;  // the neighbouring segments reach in from outside: below the peak
    if (i > 0) floor = segment_bytes(i - 1, b, td);
    if (i + 2 < columns_.size()) floor = std::max(floor.value_or(0.0), segment_bytes(i + 1, b, td));
    if (!floor || !(chord > 0)) continue;
    const double gap = (chord - *floor) / chord;
    if (gap > widest) {
      widest = gap;
      where = t;
    }
  }
  return where;
}

double TokenMemoryModel::predict_bytes(int64_t micro_batch, int64_t seq_len) const {
  const double b = static_cast<double>(micro_batch), t = static_cast<double>(seq_len);
  if (!columns_.empty()) {
    size_t i = 0;  // the interval holding T; the first or last one's line beyond the columns
    while (i + 2 < columns_.size() && columns_[i + 1].seq_len < seq_len) ++i;
    return std::max(floor_bytes_, segment_bytes(i, b, t));
  }
  return fit_.intercept_bytes + fit_.bytes_per_token * b * t + fit_.bytes_per_token_squared * b * t * t;
}

int64_t TokenMemoryModel::predict_peak_bytes(int64_t micro_batch, int64_t seq_len) const {
  // Saturated at 2 PiB, as the sample model: "does not fit", never a cast out of int64's range.
  constexpr double kCeiling = 2.0 * static_cast<double>(kMaxBytes);
  const double bytes = predict_bytes(micro_batch, seq_len);
  if (!(bytes < kCeiling)) return static_cast<int64_t>(kCeiling);
  if (!(bytes > -kCeiling)) return -static_cast<int64_t>(kCeiling);
  return static_cast<int64_t>(std::ceil(bytes));
}

int64_t TokenMemoryModel::largest_micro_batch(int64_t seq_len, int64_t usable_bytes, int64_t limit) const {
  limit = std::min(std::max<int64_t>(limit, 0), kMaxSequences);
  auto fits = [&](int64_t b) { return predict_peak_bytes(b, seq_len) <= usable_bytes; };
  if (limit < 1 || seq_len < 1 || !fits(1)) return 0;
  const double per_sequence = predict_bytes(2, seq_len) - predict_bytes(1, seq_len);
  const double room = static_cast<double>(usable_bytes) - predict_bytes(1, seq_len);
  return detail::settle_largest(1.0 + std::floor(room / per_sequence), limit, fits);
}

int64_t TokenMemoryModel::longest_sequence(int64_t usable_bytes, int64_t limit) const {
  limit = std::min(std::max<int64_t>(limit, 0), kMaxSeqLen);
  auto fits = [&](int64_t t) { return predict_peak_bytes(1, t) <= usable_bytes; };
  if (limit < 1 || !fits(1)) return 0;
  // a2·T² + a1·T <= room: the positive root, or room / a1 for the line.
  const double room = static_cast<double>(usable_bytes) - fit_.intercept_bytes;
  const double a1 = fit_.bytes_per_token, a2 = fit_.bytes_per_token_squared;
  const double root = a2 > 0 ? (-a1 + std::sqrt(a1 * a1 + 4 * a2 * room)) / (2 * a2) : room / a1;
  return detail::settle_largest(std::floor(root), limit, fits);
}

int64_t TokenMemoryModel::token_budget(int64_t usable_bytes, int64_t max_seq_len) const {
  checked_in_range(max_seq_len, 1, kMaxSeqLen, "the longest sequence");
  const int64_t per_sequence = largest_micro_batch(max_seq_len, usable_bytes);
  if (per_sequence < 1) return 0;
  // At T = max_seq_len: b = B / T need not be whole, so the budget may exceed
  // largest_micro_batch(T)·T by up to T − 1 tokens, as the room left above those whole sequences
  // allows at the per-token cost of one more. Capped at 2^40 tokens like a microbatch's samples,
  // so the cast stays inside int64.
  const double t = static_cast<double>(max_seq_len);
  const double whole_bytes = predict_bytes(per_sequence, max_seq_len);
  const double per_token = (predict_bytes(per_sequence + 1, max_seq_len) - whole_bytes) / t;
  const double room = static_cast<double>(usable_bytes) - whole_bytes;
  const double extra = per_token > 0 ? std::clamp(std::floor(room / per_token), 0.0, t - 1) : 0.0;
  const double whole = static_cast<double>(per_sequence) * t;
  const int64_t budget = static_cast<int64_t>(std::min(whole + extra, static_cast<double>(kMaxSequences)));
  // Shorter whole sequences may peak higher at the same tokens: the largest budget below that
  // holds for every length (the worst peak grows with the budget).
  auto fits = [&](int64_t tokens) { return worst_packed_peak_bytes(tokens, max_seq_len) <= usable_bytes; };
  if (fits(budget)) return budget;
  if (budget <= 1) return 0;
  return detail::settle_largest(static_cast<double>(budget - 1), budget - 1, fits);
}

int64_t TokenMemoryModel::worst_packed_peak_bytes(int64_t token_budget, int64_t max_seq_len) const {
  checked_in_range(token_budget, 1, kMaxSequences, "the token budget");
  checked_in_range(max_seq_len, 1, kMaxSeqLen, "the longest sequence");
  int64_t worst = 0;
  // For a fixed b = floor(budget / L) the peak grows with L: the largest L of each b's range.
  for (int64_t l = 1; l <= std::min(max_seq_len, token_budget);) {
    const int64_t b = token_budget / l;
    const int64_t last = std::min(max_seq_len, token_budget / b);
    worst = std::max(worst, predict_peak_bytes(b, last));
    l = last + 1;
  }
  return worst;
}

std::vector<std::vector<int64_t>> pack_by_token_budget(const std::vector<int64_t>& lengths, int64_t token_budget,
                                                       const std::optional<TokenStepCost>& cost) {
  checked_in_range(token_budget, 1, TokenMemoryModel::kMaxSequences, "the token budget");
  for (size_t i = 0; i < lengths.size(); ++i) {
    checked_in_range(lengths[i], 1, TokenMemoryModel::kMaxSeqLen, "sequence " + std::to_string(i) + "'s length");
  }
  std::vector<int64_t> order(lengths.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return lengths[static_cast<size_t>(x)] > lengths[static_cast<size_t>(y)]; });
  if (!order.empty() && lengths[static_cast<size_t>(order.front())] > token_budget) {
    const int64_t longest = lengths[static_cast<size_t>(order.front())];
    throw InfeasibleError("sequence " + std::to_string(order.front()) + " has " + std::to_string(longest) +
                          " tokens, more than the token budget of " + std::to_string(token_budget) +
                          " padded tokens per microbatch; truncate the sequences to at most " +
                          std::to_string(token_budget) + " tokens or raise the budget");
  }
  // Without a measured cost every microbatch costs the same: the fewest microbatches.
  const TokenStepCost c = cost.value_or(TokenStepCost{1, 0, 0});
  // best[i]: the least cost of packing order[i..n); end[i]: where its first microbatch ends.
  // 128-bit sums: b·L² · per_token_squared reaches 2^40 · 2^31 · 2^30 for the largest inputs
  // the ranges allow, and the Python reader's integers are exact too.
  const size_t n = order.size();
  std::vector<__int128> best(n + 1, 0);
  std::vector<size_t> end(n + 1, n);
  for (size_t i = n; i-- > 0;) {
    const __int128 len = lengths[static_cast<size_t>(order[i])];
    const size_t capacity = static_cast<size_t>(token_budget / static_cast<int64_t>(len));
    const size_t last = std::min(n, i + capacity);
    const __int128 per_sequence = c.per_token * len + c.per_token_squared * len * len;
    bool first = true;
    for (size_t j = i + 1; j <= last; ++j) {
      const __int128 total = c.per_microbatch + per_sequence * static_cast<__int128>(j - i) + best[j];
      if (first || total <= best[i]) {  // <=: ties go to the larger first microbatch
        best[i] = total;
        end[i] = j;
        first = false;
      }
    }
  }
  std::vector<std::vector<int64_t>> out;
  for (size_t i = 0; i < n; i = end[i]) {
    out.emplace_back(order.begin() + static_cast<std::ptrdiff_t>(i), order.begin() + static_cast<std::ptrdiff_t>(end[i]));
  }
  return out;
}

std::vector<std::pair<int64_t, int64_t>> token_windows(const std::vector<int64_t>& valid_tokens, int64_t target_tokens) {
  if (target_tokens < 1) {
    throw InputError(option_name("--target-tokens") + " must be at least 1 (valid tokens per update), got " +
                     std::to_string(target_tokens));
  }
  std::vector<std::pair<int64_t, int64_t>> windows;
  int64_t start = 0, tokens = 0;
  const int64_t n = static_cast<int64_t>(valid_tokens.size());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = valid_tokens[static_cast<size_t>(i)];
    if (v < 0) throw InputError("sequence " + std::to_string(i) + " has " + std::to_string(v) + " valid tokens; counts are >= 0");
    tokens += std::min(v, target_tokens);  // saturates: the window closes here either way
    if (tokens >= target_tokens) {
      windows.emplace_back(start, i + 1 - start);
      start = i + 1;
      tokens = 0;
    }
  }
  if (start < n) windows.emplace_back(start, n - start);
  return windows;
}

}  // namespace accumplan
