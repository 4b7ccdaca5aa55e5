// accumplan/memory_model.h — peak(b) = persistent + a0 + a1·b, fitted to measured points.
//
// What it is: a least-squares line through the profile's (micro_batch, peak) points, each weighted
// by its microbatch (the plan lives at the large end), small sizes left out only where they lie
// off the line of the larger ones,
// with residuals kept so a plan can say how well the line explains what was measured. Always on
// allocated bytes: a caching allocator's reserved peak is reported beside them, not fitted (it
// frees its cache and retries before it runs out). Also a time model for microbatch seconds.
// What it is not: a guarantee. The solver keeps headroom and the profiler confirms by a real step,
// because a fitted line is a prediction.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "accumplan/schema.h"

namespace accumplan {

// A line of peak bytes over the microbatch, intercept + slope·b, never below floor_bytes when one
// is set: the one evaluation of such a line. The memory model's steady line, a plan's fit summary
// alone, activation checkpointing's peak with a set checkpointed (accumplan/checkpoint.h) and the
// search's eval line are each one.
struct PeakLine {
  double intercept_bytes = 0;
  double slope_bytes_per_sample = 0;
  // A peak no microbatch size lowers (the optimizer step's transient); none: the line alone.
  std::optional<double> floor_bytes;

  static PeakLine of(const FitSummary& fit);
  // intercept + slope·b (at least the floor), not rounded.
  double bytes(int64_t micro_batch) const;
  // bytes(b) rounded up, saturated at twice checked.h's kMaxBytes: a prediction for 10^12
  // samples is "does not fit", not a conversion out of int64's range.
  int64_t peak_bytes(int64_t micro_batch) const;
  // Largest b in [1, limit_micro_batch] with
  //   ceil(bytes(b)) + extra_bytes + ceil(fraction · max(0, slope) · b) <= budget_bytes,
  // or 0 if even b = 1 does not. From the closed form, settled on the integer rule in a bounded
  // number of steps (settle.h): nothing counts b one at a time.
  int64_t largest_fitting(int64_t budget_bytes, int64_t limit_micro_batch, int64_t extra_bytes = 0,
                          double fraction = 0) const;
};

class MemoryModel {
 public:
  // Throws InputError if the profile has fewer than two distinct microbatch sizes, or peaks that
  // do not grow with the microbatch (slope <= 0, or a drop bigger than measurement noise).
  static MemoryModel fit(const Profile& profile);

  const FitSummary& summary() const { return fit_; }
  const Persistent& persistent() const { return persistent_; }
  // The steady line: intercept + slope·b.
  PeakLine line() const { return PeakLine::of(fit_); }

  double predict_bytes(int64_t micro_batch) const;
  int64_t predict_peak_bytes(int64_t micro_batch) const;  // rounded up
  // The same line from a plan's fit summary alone (intercept + slope·b, rounded up, saturated):
  // what a re-split after an OOM predicts when the plan carries no profile to refit.
  static int64_t line_peak_bytes(const FitSummary& fit, int64_t micro_batch);
  // Largest b in [1, limit_micro_batch] with
  //   predict_peak_bytes(b) + extra_bytes + ceil(fraction · slope · b) <= budget_bytes,
  // or 0 if even b = 1 does not. Closed form, settled against the integer predictor in a bounded
  // number of steps: nothing counts b up one at a time (a slope of one byte per sample and a
  // budget in terabytes must not hang), and no double is converted out of int64's range.
  int64_t largest_fitting(int64_t budget_bytes, int64_t limit_micro_batch = kMaxMicroBatch, int64_t extra_bytes = 0,
                          double fraction = 0) const;
  // The same for a plan's fit summary alone (its line, no extra, no fraction): what a plan read
  // without its profile says fits `budget_bytes` (Plan.largest_fitting in the Python package).
  static int64_t line_largest_fitting(const FitSummary& fit, int64_t budget_bytes);
  // No plan, probe or re-plan goes above this microbatch (2^40 samples).
  static constexpr int64_t kMaxMicroBatch = int64_t{1} << 40;
  // a0 = intercept - persistent, rounded to bytes; may be negative when the fit is poor.
  int64_t activation_fixed_bytes() const;
  // The largest optimizer-step transient peak measured, or 0 if none was recorded.
  int64_t optimizer_step_peak_bytes() const { return optimizer_step_peak_bytes_; }

  // The first microbatch of a window runs with no gradient resident: its own line, fitted to the
  // points' first_microbatch_peak_bytes (nullopt when a point lacks them).
  std::optional<int64_t> predict_first_microbatch_peak_bytes(int64_t micro_batch) const;
  // The peak of a window of these microbatch sizes, in order, before its optimizer step: the first
  // follows the first-microbatch line when known, the others the steady line.
  int64_t predict_microbatches_peak_bytes(const std::vector<int64_t>& sizes) const;
  // The same window's peak, optimizer step included.
  int64_t predict_window_peak_bytes(const std::vector<int64_t>& sizes) const;
  bool fits_in_one_microbatch(int64_t micro_batch, int64_t usable_bytes) const;

 private:
  FitSummary fit_;
  Persistent persistent_;
  int64_t optimizer_step_peak_bytes_ = 0;
  std::optional<double> first_intercept_bytes_;
  double first_slope_bytes_per_sample_ = 0;
  double first_margin_bytes_ = 0;
  int64_t flat_to_micro_batch_ = 0;  // a flat line (slope 0) is known only up to the largest size measured
};

// Seconds per microbatch as a function of its size, from the profile's `step_seconds`:
// piecewise-linear between measured sizes, beyond the largest along the least-squares slope, and
// below the smallest along the first segment (never below that size's seconds scaled down).
// The one time model: the plan's `timing`, --use-timing and activation checkpointing's window
// time (accumplan/checkpoint.h) all predict with it.
class TimeModel {
 public:
  // False when any point lacks step_seconds or fewer than two sizes were timed.
  static bool available(const Profile& profile);
  static TimeModel fit(const Profile& profile);
  // From (size, seconds) points, sizes >= 1 ascending and distinct, seconds >= 0, and the slope
  // beyond the largest (>= 0). InputError naming the bad value otherwise.
  TimeModel(std::vector<std::pair<int64_t, double>> points, double slope_seconds_per_sample);
  // seconds + seconds_per_sample·b for b >= 1: the points (1, seconds + seconds_per_sample) and
  // (2, seconds + 2·seconds_per_sample), the slope seconds_per_sample.
  static TimeModel line(double seconds, double seconds_per_sample);

  double predict_seconds(int64_t micro_batch) const;
  double window_seconds(const std::vector<int64_t>& sizes) const;
  // This model with extra_seconds_per_sample·b added at every size (negative: taken out), each
  // point and the slope kept >= 0. predict_seconds(b) of the result is predict_seconds(b) +
  // extra·b wherever that stays >= 0: interpolation and both extrapolations are linear in the points.
  TimeModel plus_per_sample(double extra_seconds_per_sample) const;

  const std::vector<std::pair<int64_t, double>>& points() const { return points_; }
  double slope_seconds_per_sample() const { return slope_seconds_per_sample_; }

 private:
  TimeModel() = default;
  std::vector<std::pair<int64_t, double>> points_;  // sorted by size, one per size (mean)
  double slope_seconds_per_sample_ = 0;
};

}  // namespace accumplan
