// memory_model.cpp — least-squares fits of peak bytes and step seconds. See memory_model.h.
#include "accumplan/memory_model.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "accumplan/errors.h"
#include "accumplan/units.h"

namespace accumplan {
namespace {

// A drop in peak between two larger/smaller probe sizes within this fraction is allocator noise
// (CPU: a reused buffer; CUDA: a segment that happened to be free). Bigger drops mean the
// measurement is broken (another process, a leak that was freed) and the profile is refused.
constexpr double kNoiseDropFraction = 0.02;

struct Line {
  double intercept = 0;
  double slope = 0;
};

Line least_squares(const std::vector<std::pair<double, double>>& xy) {
  const double n = static_cast<double>(xy.size());
  double mx = 0, my = 0;
  for (const auto& [x, y] : xy) {
    mx += x;
    my += y;
  }
  mx /= n;
  my /= n;
  double sxx = 0, sxy = 0;
  for (const auto& [x, y] : xy) {
    sxx += (x - mx) * (x - mx);
    sxy += (x - mx) * (y - my);
  }
  Line l;
  l.slope = sxx > 0 ? sxy / sxx : 0;
  l.intercept = my - l.slope * mx;
  return l;
}

}  // namespace

MemoryModel MemoryModel::fit(const Profile& profile) {
  MemoryModel m;
  m.persistent_ = profile.persistent;
  const auto& pts = profile.points;
  const bool reserved = !pts.empty() && std::all_of(pts.begin(), pts.end(), [](const ProfilePoint& p) {
    return p.reserved_peak_bytes.has_value();
  });
  m.fit_.target = reserved ? "reserved_peak_bytes" : "peak_bytes";

  std::map<int64_t, std::vector<double>> by_size;
  std::vector<std::pair<double, double>> xy;
  for (const auto& p : pts) {
    if (p.micro_batch < 1) {
      throw InputError("profile point with micro_batch " + std::to_string(p.micro_batch) +
                       ": sizes must be >= 1");
    }
    const double y = static_cast<double>(reserved ? *p.reserved_peak_bytes : p.peak_bytes);
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

  // Non-increasing peaks: small drops are noise, large ones make the profile untrustworthy.
  double prev_mean = -1;
  int64_t prev_size = 0;
  for (const auto& [size, ys] : by_size) {
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

  const Line line = least_squares(xy);
  if (!(line.slope > 0)) {
    throw InputError("the profile's peak does not grow with the microbatch (fitted slope " +
                     std::to_string(line.slope) +
                     " bytes/sample); probe sizes further apart so activations show");
  }
  m.fit_.intercept_bytes = line.intercept;
  m.fit_.slope_bytes_per_sample = line.slope;
  double sum_sq = 0;
  for (const auto& [x, y] : xy) {
    const double r = y - (line.intercept + line.slope * x);
    m.fit_.residuals_bytes.push_back(r);
    m.fit_.max_abs_residual_bytes = std::max(m.fit_.max_abs_residual_bytes, std::fabs(r));
    sum_sq += r * r;
  }
  m.fit_.rms_residual_bytes = std::sqrt(sum_sq / static_cast<double>(xy.size()));
  return m;
}

double MemoryModel::predict_bytes(int64_t micro_batch) const {
  return fit_.intercept_bytes + fit_.slope_bytes_per_sample * static_cast<double>(micro_batch);
}

int64_t MemoryModel::predict_peak_bytes(int64_t micro_batch) const {
  return static_cast<int64_t>(std::ceil(predict_bytes(micro_batch)));
}

int64_t MemoryModel::largest_fitting(int64_t usable_bytes) const {
  const double room = static_cast<double>(usable_bytes) - fit_.intercept_bytes;
  if (room < fit_.slope_bytes_per_sample) {
    return predict_peak_bytes(1) <= usable_bytes ? 1 : 0;
  }
  // Closed form, then settle the last step exactly against the integer predictor (floating
  // point can be off by one at the boundary for budgets in the terabytes).
  int64_t b = static_cast<int64_t>(std::floor(room / fit_.slope_bytes_per_sample));
  b = std::max<int64_t>(b, 1);
  while (b > 1 && predict_peak_bytes(b) > usable_bytes) --b;
  while (predict_peak_bytes(b + 1) <= usable_bytes) ++b;
  return predict_peak_bytes(b) <= usable_bytes ? b : 0;
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

double TimeModel::predict_seconds(int64_t micro_batch) const {
  const double b = static_cast<double>(micro_batch);
  const auto& first = points_.front();
  const auto& last = points_.back();
  if (micro_batch >= last.first) {
    return last.second + slope_seconds_per_sample_ * (b - static_cast<double>(last.first));
  }
  if (micro_batch <= first.first) {
    // Below the smallest probe: scale down proportionally; never predict less than zero.
    return first.second * b / static_cast<double>(first.first);
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
