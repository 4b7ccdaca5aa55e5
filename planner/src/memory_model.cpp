// memory_model.cpp — least-squares fits of peak bytes and step seconds. See memory_model.h.
#include "accumplan/memory_model.h"

#include "least_squares.h"
#include "settle.h"

#include <algorithm>
#include <iterator>
#include <cmath>
#include <map>
#include <optional>

#include "accumplan/checked.h"
#include "accumplan/errors.h"
#include "accumplan/units.h"

namespace accumplan {
namespace {

// A drop in peak between two larger/smaller probe sizes within this fraction is allocator noise
// (CPU: a reused buffer; CUDA: a segment that happened to be free). Bigger drops mean the
// measurement is broken (another process, a leak that was freed) and the profile is refused.
constexpr double kNoiseDropFraction = 0.02;

using detail::Line;
using detail::weighted_line;

Line least_squares(const std::vector<std::pair<double, double>>& xy) {
  return weighted_line(xy, [](double) { return 1.0; });
}

// The memory fit weighs each point by its microbatch: plans live at the large end, and the
// smallest sizes carry phases that hardly grow with b (a workspace, a gradient transient). On
// builtin:tinylm the ordinary line through b = 2, 4, 8 missed the peak at 10 by +4%; weighted, the
// large points (confirmations included) set the line where the plan is.
Line memory_fit(const std::vector<std::pair<double, double>>& xy) {
  return weighted_line(xy, [](double b) { return b; });
}

// The smallest microbatch the line is fitted from. Small sizes can be set by another phase than
// the one that sets the peak where plans are: resnet18 (64x64, sgd) peaks at 96.5 MiB at b = 1
// and 170.3 MiB at b = 2, then grows 1.7 MiB per sample to b = 8 — with b = 1 in the fit the
// slope comes out near 7 MiB/sample and the plan uses 8 where 21 fit. The test convnet
// (tests/runtime/fixtures.h) peaks at 229,416 bytes at b = 1, 196,648 at b = 2, then grows 81,920
// per sample. So the line of the sizes from a quarter of the largest up (at least three sizes) is
// fitted first, and each smaller size joins it while it lies on that line: within half a
// sample's bytes, or 0.5% of its peak. A probe is left out only when it is off the line; every
// point keeps its residual, and the plan says where the fit starts.
std::vector<std::pair<double, double>> from_size(const std::vector<std::pair<double, double>>& xy, int64_t start);

int64_t tail_start(const std::vector<std::pair<double, double>>& xy) {
  std::vector<int64_t> sizes;
  for (const auto& [x, y] : xy) sizes.push_back(static_cast<int64_t>(x));
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  if (sizes.size() < 3) return sizes.empty() ? 0 : sizes.front();
  // At least three sizes stay in the fit, so its residuals still say how straight the line is.
  const int64_t tail = std::min(std::max<int64_t>(1, sizes.back() / 4), sizes[sizes.size() - 3]);
  const Line line = memory_fit(from_size(xy, tail));
  int64_t start = tail;
  for (auto it = sizes.rbegin(); it != sizes.rend(); ++it) {
    const int64_t b = *it;
    if (b >= tail) continue;
    bool on_line = true;
    for (const auto& [x, y] : xy) {
      if (static_cast<int64_t>(x) != b) continue;
      const double r = std::fabs(y - (line.intercept + line.slope * x));
      if (r > std::max(0.5 * std::fabs(line.slope), 0.005 * std::fabs(y))) on_line = false;
    }
    if (!on_line) break;
    start = b;
  }
  return start;
}

std::vector<std::pair<double, double>> from_size(const std::vector<std::pair<double, double>>& xy, int64_t start) {
  std::vector<std::pair<double, double>> out;
  for (const auto& p : xy) {
    if (p.first >= static_cast<double>(start)) out.push_back(p);
  }
  return out;
}

// Bytes rounded up, saturated at twice the largest byte count anything accepts (checked.h's
// kMaxBytes, 1 PiB): a prediction for 10^12 samples is "does not fit", not a cast out of int64's
// range (UBSan's float-cast-overflow found those in the solver fuzz corpus).
int64_t saturated_bytes(double bytes) {
  constexpr double kCeiling = 2.0 * static_cast<double>(kMaxBytes);
  if (!(bytes < kCeiling)) return static_cast<int64_t>(kCeiling);
  if (!(bytes > -kCeiling)) return -static_cast<int64_t>(kCeiling);
  return static_cast<int64_t>(std::ceil(bytes));
}

// Non-increasing peaks among the fitted sizes (from `start` on): small drops are noise, large ones
// make the profile untrustworthy. (Below the fit's start a peak may be set by another phase: the
// test convnet peaks at 224 KiB at b = 1 and 192 KiB at b = 2, then grows 80 KiB per sample.)
void check_peaks_grow(const std::map<int64_t, std::vector<double>>& by_size, int64_t start) {
  double prev_mean = -1;
  int64_t prev_size = 0;
  for (const auto& [size, ys] : by_size) {
    if (size < start) continue;
    double mean = 0;
    for (double y : ys) mean += y;
    mean /= static_cast<double>(ys.size());
    if (prev_mean >= 0 && mean < prev_mean * (1.0 - kNoiseDropFraction)) {
      throw InputError("the profile's peak falls from " + format_bytes(static_cast<int64_t>(prev_mean)) +
                       " at microbatch " + std::to_string(prev_size) + " to " +
                       format_bytes(static_cast<int64_t>(mean)) + " at microbatch " +
                       std::to_string(size) +
                       "; peaks must grow with the microbatch. Was something else using the "
                       "device while profiling? Profile again");
    }
    prev_mean = mean;
    prev_size = size;
  }
}

// The first microbatch of a window runs with no gradient resident (the executor sets gradients
// to none at every window start), so its peak follows the points' first-microbatch peaks, not
// the steady ones. builtin:mlp (sgd): first 956,584 bytes at every b <= 64 against a steady
// 1,023,160 + 3,146·b — the steady line over-predicted a one-microbatch plan of 64 by 28%.
// Fitted where two sizes or more have it. The line's largest shortfall below a measured first
// peak is its margin: never under.
struct FirstLine {
  double intercept_bytes = 0;
  double slope_bytes_per_sample = 0;
  double margin_bytes = 0;
};
std::optional<FirstLine> first_microbatch_line(const std::vector<ProfilePoint>& pts) {
  std::vector<std::pair<double, double>> first;
  std::map<int64_t, int> first_sizes;
  for (const auto& p : pts) {
    if (!p.first_microbatch_peak_bytes) continue;
    first.emplace_back(static_cast<double>(p.micro_batch), static_cast<double>(*p.first_microbatch_peak_bytes));
    ++first_sizes[p.micro_batch];
  }
  if (first_sizes.size() < 2) return std::nullopt;
  first = from_size(first, tail_start(first));
  const Line f = memory_fit(first);
  FirstLine out{f.intercept, std::max(0.0, f.slope), 0.0};
  for (const auto& [x, y] : first) {
    out.margin_bytes = std::max(out.margin_bytes, y - (f.intercept + out.slope_bytes_per_sample * x));
  }
  return out;
}

}  // namespace

MemoryModel MemoryModel::fit(const Profile& profile) {
  MemoryModel m;
  m.persistent_ = profile.persistent;
  const auto& pts = profile.points;
  // Allocated bytes, also on a caching allocator: it frees its cache and retries before it runs
  // out, so its reserved peak is cache the cap left room for, not need. resnet18 on an H200 under
  // 8 GiB reserved 8,256 MB at 189 samples and at 106 (the first window's cache kept) against
  // 4,539 and 2,673 MB allocated; fitted on those, the line's residual was 6.4 GB and the plan 4
  // samples, where a plain window of 366 fit under the same cap.
  m.fit_.target = "peak_bytes";

  std::map<int64_t, std::vector<double>> by_size;
  std::vector<std::pair<double, double>> xy;
  for (const auto& p : pts) {
    if (p.micro_batch < 1) {
      throw InputError("profile point with micro_batch " + std::to_string(p.micro_batch) +
                       ": sizes must be >= 1");
    }
    const double y = static_cast<double>(p.peak_bytes);
    by_size[p.micro_batch].push_back(y);
    xy.emplace_back(static_cast<double>(p.micro_batch), y);
    if (p.optimizer_step_peak_bytes) {
      m.optimizer_step_peak_bytes_ = std::max(m.optimizer_step_peak_bytes_, *p.optimizer_step_peak_bytes);
    }
  }
  if (by_size.size() < 2) {
    throw InputError("the profile has " + std::to_string(by_size.size()) +
                     " distinct microbatch size(s); a memory model needs at least two (profile "
                     "again with more probe sizes)");
  }

  const int64_t start = tail_start(xy);
  check_peaks_grow(by_size, start);

  const Line line = memory_fit(from_size(xy, start));
  m.fit_.fitted_from_micro_batch = start;
  // A peak that is the same at every size measured (a b-independent phase sets it up to the
  // largest: the search doubles its probes up to the per-rank target first) is a flat line, known
  // only that far: nothing larger is planned from it. One that falls is no line at all.
  const bool flat = line.slope == 0;
  if (!(line.slope > 0) && !flat) {
    throw InputError("the profile's peak does not grow with the microbatch (fitted slope " +
                     std::to_string(line.slope) +
                     " bytes/sample); probe sizes further apart so activations show");
  }
  if (flat) m.flat_to_micro_batch_ = by_size.rbegin()->first;
  m.fit_.intercept_bytes = line.intercept;
  m.fit_.slope_bytes_per_sample = line.slope;
  double sum_sq = 0;
  int fitted = 0;
  for (const auto& [x, y] : xy) {
    const double r = y - (line.intercept + line.slope * x);
    m.fit_.residuals_bytes.push_back(r);
    if (x < static_cast<double>(start)) continue;  // shown, not fitted: not part of the fit's error
    m.fit_.max_abs_residual_bytes = std::max(m.fit_.max_abs_residual_bytes, std::fabs(r));
    sum_sq += r * r;
    ++fitted;
  }
  m.fit_.rms_residual_bytes = std::sqrt(sum_sq / static_cast<double>(std::max(1, fitted)));

  if (const std::optional<FirstLine> f = first_microbatch_line(pts)) {
    m.first_intercept_bytes_ = f->intercept_bytes;
    m.first_slope_bytes_per_sample_ = f->slope_bytes_per_sample;
    m.first_margin_bytes_ = f->margin_bytes;
  }
  return m;
}

std::optional<int64_t> MemoryModel::predict_first_microbatch_peak_bytes(int64_t micro_batch) const {
  if (!first_intercept_bytes_) return std::nullopt;
  return saturated_bytes(*first_intercept_bytes_ + first_slope_bytes_per_sample_ * static_cast<double>(micro_batch) +
                         first_margin_bytes_);
}

int64_t MemoryModel::predict_window_peak_bytes(const std::vector<int64_t>& sizes) const {
  return std::max(predict_microbatches_peak_bytes(sizes), optimizer_step_peak_bytes_);
}

int64_t MemoryModel::predict_microbatches_peak_bytes(const std::vector<int64_t>& sizes) const {
  if (sizes.empty()) throw InternalError("predict_microbatches_peak_bytes of an empty window");
  // The first microbatch with no gradient resident, every later one with the window's gradients
  // resident: for 10,9,9,... that is max(first(10), steady(9)), which on builtin:tinylm is one
  // sample's activations (5% of its peak) below steady(10).
  const int64_t first = predict_first_microbatch_peak_bytes(sizes.front()).value_or(predict_peak_bytes(sizes.front()));
  int64_t peak = first;
  if (sizes.size() > 1) peak = std::max(peak, predict_peak_bytes(*std::max_element(sizes.begin() + 1, sizes.end())));
  return peak;
}

bool MemoryModel::fits_in_one_microbatch(int64_t micro_batch, int64_t usable_bytes) const {
  return predict_window_peak_bytes({micro_batch}) <= usable_bytes;
}

PeakLine PeakLine::of(const FitSummary& fit) {
  return {fit.intercept_bytes, fit.slope_bytes_per_sample, std::nullopt};
}

double PeakLine::bytes(int64_t micro_batch) const {
  const double line = intercept_bytes + slope_bytes_per_sample * static_cast<double>(micro_batch);
  return floor_bytes ? std::max(line, *floor_bytes) : line;
}

int64_t PeakLine::peak_bytes(int64_t micro_batch) const { return saturated_bytes(bytes(micro_batch)); }

int64_t PeakLine::largest_fitting(int64_t budget_bytes, int64_t limit_micro_batch, int64_t extra_bytes,
                                  double fraction) const {
  const int64_t limit = std::max<int64_t>(limit_micro_batch, 0);
  const double margin_slope = fraction * std::max(0.0, slope_bytes_per_sample);
  auto fits = [&](int64_t b) {
    const double need = std::ceil(bytes(b)) + static_cast<double>(extra_bytes) +
                        std::ceil(margin_slope * static_cast<double>(b));
    return need <= static_cast<double>(budget_bytes);
  };
  if (limit < 1 || !fits(1)) return 0;
  // Closed form in doubles, clamped to [1, limit] before it becomes an integer.
  const double room = static_cast<double>(budget_bytes) - intercept_bytes - static_cast<double>(extra_bytes);
  const double per_sample = slope_bytes_per_sample * (1.0 + fraction);
  const double estimate = per_sample > 0 ? std::floor(room / per_sample) : static_cast<double>(limit);
  return detail::settle_largest(estimate, limit, fits);
}

double MemoryModel::predict_bytes(int64_t micro_batch) const { return line().bytes(micro_batch); }

int64_t MemoryModel::predict_peak_bytes(int64_t micro_batch) const { return line().peak_bytes(micro_batch); }

int64_t MemoryModel::line_peak_bytes(const FitSummary& fit, int64_t micro_batch) {
  return PeakLine::of(fit).peak_bytes(micro_batch);
}

int64_t MemoryModel::largest_fitting(int64_t budget_bytes, int64_t limit_micro_batch, int64_t extra_bytes,
                                     double fraction) const {
  int64_t limit = std::min(std::max<int64_t>(limit_micro_batch, 0), kMaxMicroBatch);
  if (flat_to_micro_batch_ > 0) limit = std::min(limit, flat_to_micro_batch_);  // measured flat only that far
  return line().largest_fitting(budget_bytes, limit, extra_bytes, fraction);
}

int64_t MemoryModel::line_largest_fitting(const FitSummary& fit, int64_t budget_bytes) {
  MemoryModel line;
  line.fit_ = fit;
  return line.largest_fitting(budget_bytes);
}

int64_t MemoryModel::activation_fixed_bytes() const {
  return static_cast<int64_t>(std::llround(fit_.intercept_bytes - static_cast<double>(persistent_.total())));
}

bool TimeModel::available(const Profile& profile) {
  std::map<int64_t, int> sizes;
  for (const auto& p : profile.points) {
    if (!p.step_seconds || !(*p.step_seconds > 0)) return false;
    sizes[p.micro_batch]++;
  }
  return sizes.size() >= 2;
}

TimeModel TimeModel::fit(const Profile& profile) {
  if (!available(profile)) throw InternalError("TimeModel::fit without step times");
  std::map<int64_t, std::pair<double, int>> acc;
  std::vector<std::pair<double, double>> xy;
  for (const auto& p : profile.points) {
    acc[p.micro_batch].first += *p.step_seconds;
    acc[p.micro_batch].second += 1;
    xy.emplace_back(static_cast<double>(p.micro_batch), *p.step_seconds);
  }
  TimeModel t;
  for (const auto& [size, sum_n] : acc) t.points_.emplace_back(size, sum_n.first / sum_n.second);
  t.slope_seconds_per_sample_ = std::max(0.0, least_squares(xy).slope);
  return t;
}

TimeModel::TimeModel(std::vector<std::pair<int64_t, double>> points, double slope_seconds_per_sample)
    : points_(std::move(points)), slope_seconds_per_sample_(slope_seconds_per_sample) {
  if (points_.empty()) throw InputError("a time model needs at least one timed microbatch size");
  for (size_t i = 0; i < points_.size(); ++i) {
    const auto& [size, seconds] = points_[i];
    const std::string at = "a time model's point " + std::to_string(i) + " (size " + std::to_string(size) + ")";
    if (size < 1 || (i > 0 && size <= points_[i - 1].first)) {
      throw InputError(at + ": sizes must be >= 1 and ascending, one point per size");
    }
    if (!(seconds >= 0) || !std::isfinite(seconds)) {
      throw InputError(at + ": seconds must be finite and >= 0, got " + std::to_string(seconds));
    }
  }
  if (!(slope_seconds_per_sample >= 0) || !std::isfinite(slope_seconds_per_sample)) {
    throw InputError("a time model's slope must be finite and >= 0 seconds per sample, got " +
                     std::to_string(slope_seconds_per_sample));
  }
}

TimeModel TimeModel::line(double seconds, double seconds_per_sample) {
  return TimeModel({{1, seconds + seconds_per_sample}, {2, seconds + 2 * seconds_per_sample}}, seconds_per_sample);
}

TimeModel TimeModel::plus_per_sample(double extra_seconds_per_sample) const {
  TimeModel t = *this;
  for (auto& [size, seconds] : t.points_) {
    seconds = std::max(0.0, seconds + extra_seconds_per_sample * static_cast<double>(size));
  }
  t.slope_seconds_per_sample_ = std::max(0.0, slope_seconds_per_sample_ + extra_seconds_per_sample);
  return t;
}

double TimeModel::predict_seconds(int64_t micro_batch) const {
  const double b = static_cast<double>(micro_batch);
  const auto& first = points_.front();
  const auto& last = points_.back();
  if (micro_batch >= last.first) {
    return last.second + slope_seconds_per_sample_ * (b - static_cast<double>(last.first));
  }
  if (micro_batch <= first.first) {
    // Below the smallest size timed: along the first segment (the slope beyond the largest with one
    // point), so a per-microbatch cost stays in; never below scaling that size's seconds down
    // proportionally, which would mean a negative per-microbatch cost. Scaled proportionally
    // alone, a 50 ms + 1 ms/sample step timed at 2 and 4 would be 26 ms at 1, not 51, and
    // checkpointing's choice would take 64 microbatches of 1 for faster than 32 of 2.
    const double x0 = static_cast<double>(first.first);
    const double slope = points_.size() >= 2 ? (points_[1].second - first.second) / static_cast<double>(points_[1].first - first.first)
                                             : slope_seconds_per_sample_;
    return std::max(first.second * b / x0, first.second - slope * (x0 - b));
  }
  for (size_t i = 1; i < points_.size(); ++i) {
    if (micro_batch <= points_[i].first) {
      const auto& [x0, y0] = points_[i - 1];
      const auto& [x1, y1] = points_[i];
      return y0 + (y1 - y0) * (b - static_cast<double>(x0)) / static_cast<double>(x1 - x0);
    }
  }
  return last.second;
}

double TimeModel::window_seconds(const std::vector<int64_t>& sizes) const {
  double s = 0;
  for (auto n : sizes) s += predict_seconds(n);
  return s;
}

}  // namespace accumplan
