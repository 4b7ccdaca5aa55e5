// planner/src/least_squares.h — weighted least squares over a few columns (internal to the
// planner).
//
// What it is: the planner's two least-squares solvers. `weighted_least_squares` over a few
// columns: the token memory fit (token_model.cpp) and the microbatch time fit (step_time.cpp).
// `weighted_line`, one x: the sample memory and time lines (memory_model.cpp; checkpointing's
// window time is the same TimeModel). Each column is scaled to a largest entry of 1 before the normal
// equations, so b·T² near 1e12 and 1 in the same system stay well conditioned; then Gaussian
// elimination with partial pivoting (at most 3×3 here).
// What it is not: a general linear-algebra routine: no rank detection beyond a zero pivot, and
// nothing robust about outliers (callers trim and refit).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

namespace accumplan::detail {

// rows[i][j]: column j of row i (every row has `columns` entries); y[i] its value; w[i] >= 0 its
// weight. The coefficients minimising sum_i w_i·(y_i − rows_i·coef)², or nullopt when the normal
// equations are singular (fewer independent rows than columns).
inline std::optional<std::vector<double>> weighted_least_squares(const std::vector<std::vector<double>>& rows,
                                                                 const std::vector<double>& y,
                                                                 const std::vector<double>& w, size_t columns) {
  std::vector<double> scale(columns, 0.0);
  for (const auto& r : rows) {
    for (size_t j = 0; j < columns; ++j) scale[j] = std::max(scale[j], std::fabs(r[j]));
  }
  for (auto& s : scale) s = s > 0 ? s : 1.0;
  std::vector<std::vector<double>> a(columns, std::vector<double>(columns + 1, 0.0));
  for (size_t n = 0; n < rows.size(); ++n) {
    for (size_t i = 0; i < columns; ++i) {
      const double fi = rows[n][i] / scale[i];
      for (size_t j = 0; j < columns; ++j) a[i][j] += w[n] * fi * rows[n][j] / scale[j];
      a[i][columns] += w[n] * fi * y[n];
    }
  }
  for (size_t c = 0; c < columns; ++c) {
    size_t pivot = c;
    for (size_t r = c + 1; r < columns; ++r) {
      if (std::fabs(a[r][c]) > std::fabs(a[pivot][c])) pivot = r;
    }
    std::swap(a[c], a[pivot]);
    if (std::fabs(a[c][c]) < 1e-300) return std::nullopt;
    for (size_t r = 0; r < columns; ++r) {
      if (r == c) continue;
      const double f = a[r][c] / a[c][c];
      for (size_t k = c; k <= columns; ++k) a[r][k] -= f * a[c][k];
    }
  }
  std::vector<double> coef;
  for (size_t j = 0; j < columns; ++j) coef.push_back(a[j][columns] / a[j][j] / scale[j]);
  return coef;
}

struct Line {
  double intercept = 0;
  double slope = 0;
};

// y = intercept + slope·x, each point weighted by `weight(x)`; flat at the weighted mean where every
// point has the same x. Centred on the weighted means rather than through the normal equations
// above: points on an exact line come back exact, which byte figures rounded up rely on (a window
// of 10,000,000 + 1,000,000·26 bytes comes out 36,000,001 through the normal equations).
template <class Weight>
Line weighted_line(const std::vector<std::pair<double, double>>& xy, Weight weight) {
  double n = 0, mx = 0, my = 0;
  for (const auto& [x, y] : xy) {
    const double w = weight(x);
    n += w;
    mx += w * x;
    my += w * y;
  }
  if (!(n > 0)) return Line{};
  mx /= n;
  my /= n;
  double sxx = 0, sxy = 0;
  for (const auto& [x, y] : xy) {
    const double w = weight(x);
    sxx += w * (x - mx) * (x - mx);
    sxy += w * (x - mx) * (y - my);
  }
  Line l;
  l.slope = sxx > 0 ? sxy / sxx : 0;
  l.intercept = my - l.slope * mx;
  return l;
}

}  // namespace accumplan::detail
