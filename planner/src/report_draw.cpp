// planner/src/report_draw.cpp — the SVG picture of a report: the memory chart, the breakdown
// bar, the run window by window and its totals. See report_draw.h; report.cpp reads the inputs and
// wraps the picture.
//
// Geometry is absolute (no transforms): a reader — or a test — maps a marker back to bytes from
// the tick lines and their labels alone. Every coordinate is printed with two decimals.
#include "report_draw.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <utility>
#include <vector>

#include "accumplan/errors.h"
#include "accumplan/units.h"

namespace accumplan::report_draw {
namespace {

// --- layout (pixels) ---------------------------------------------------------------------------
// 1100: the legend right of the plot starts at 792 px and its longest label ("usable = budget −
// margin (--headroom)", 12 px) runs to about 1050; at 1000 it was clipped.
constexpr double kWidth = 1100;
constexpr double kPlotLeft = 100;
constexpr double kPlotWidth = 640;
constexpr double kPlotTop = 92;
constexpr double kPlotHeight = 360;
constexpr double kPlotRight = kPlotLeft + kPlotWidth;
constexpr double kPlotBottom = kPlotTop + kPlotHeight;
constexpr double kLegendLeft = kPlotLeft + kPlotWidth + 30;
constexpr double kBarLeft = kPlotLeft;
constexpr double kBarWidth = 860;
constexpr double kBarTop = 560;
constexpr double kBarHeight = 36;
// The run window by window: two panels (peaks, then losses) this high and this far apart.
constexpr double kPanelHeight = 150, kPanelGap = 66;
constexpr size_t kMostMarkers = 400;  // beyond this, lines only: the file stays small

// Colors of the breakdown's parts, shared by the bar and its legend.
struct Part {
  const char* name;   // class and legend label
  const char* label;
  const char* color;
  int64_t bytes;
};

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

double percent(int64_t part, int64_t whole) {
  return whole > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

std::string percent_text(int64_t part, int64_t whole) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", percent(part, whole));
  return buf;
}

// 1, 2 or 5 times a power of ten, so that `range` holds about `ticks` steps.
double nice_step(double range, double ticks) {
  if (!(range > 0)) return 1;
  const double raw = range / ticks;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  const double f = norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10;
  return f * mag;
}

// A linear axis from 0 to max in one unit, with its tick values.
struct Axis {
  double unit_value = 1;       // bytes per unit (1 for microbatch sizes)
  std::string unit_name;       // "MiB", or "" for sizes
  double step = 1;             // in units
  double max = 1;              // in units, a multiple of step
};

Axis bytes_axis(double max_bytes) {
  Axis a;
  if (max_bytes < 1024.0 * 1024) {
    a.unit_value = 1024, a.unit_name = "KiB";
  } else if (max_bytes < 4.0 * 1024 * 1024 * 1024) {
    a.unit_value = 1024.0 * 1024, a.unit_name = "MiB";
  } else {
    a.unit_value = 1024.0 * 1024 * 1024, a.unit_name = "GiB";
  }
  const double range = std::max(max_bytes / a.unit_value, 1e-9);
  a.step = nice_step(range, 7);
  a.max = std::ceil(range / a.step - 1e-9) * a.step;
  return a;
}

Axis size_axis(double max_size) {
  Axis a;
  const double range = std::max(max_size, 2.0);
  a.step = std::max(1.0, nice_step(range, 8));
  a.max = std::ceil(range / a.step - 1e-9) * a.step;
  return a;
}

// An axis over [lo, hi] (not from 0: a loss axis), in one unit, with its tick values.
struct RangeAxis {
  double lo = 0, hi = 1, step = 1;
};

RangeAxis range_axis(double lo, double hi, double ticks) {
  if (!(hi > lo)) {
    const double pad = std::max(std::fabs(lo) * 0.05, 1e-3);
    lo -= pad, hi += pad;
  }
  RangeAxis a;
  a.step = nice_step(hi - lo, ticks);
  a.lo = std::floor(lo / a.step + 1e-9) * a.step;
  a.hi = std::ceil(hi / a.step - 1e-9) * a.step;
  return a;
}

// An x of 10 by 10 pixels centred on (x, y): a step that ran out of memory.
std::string cross_path(double x, double y) {
  return "<path d=\"M" + num(x - 5) + " " + num(y - 5) + " L" + num(x + 5) + " " + num(y + 5) + " M" + num(x - 5) + " " +
         num(y + 5) + " L" + num(x + 5) + " " + num(y - 5) + "\"/>";
}

std::string tick_label(double value_units, const std::string& unit) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.6g", value_units);
  return unit.empty() ? std::string(buf) : std::string(buf) + " " + unit;
}

class SvgWriter {
 public:
  std::ostringstream s;
  void text(double x, double y, const std::string& body, const std::string& attrs = "") {
    s << "<text x=\"" << num(x) << "\" y=\"" << num(y) << "\"" << (attrs.empty() ? "" : " " + attrs) << ">"
      << xml_escape(body) << "</text>\n";
  }
  void line(const std::string& cls, double x1, double y1, double x2, double y2, const std::string& title = "") {
    s << "<line class=\"" << cls << "\" x1=\"" << num(x1) << "\" y1=\"" << num(y1) << "\" x2=\"" << num(x2)
      << "\" y2=\"" << num(y2) << "\"";
    if (title.empty()) {
      s << "/>\n";
    } else {
      s << "><title>" << xml_escape(title) << "</title></line>\n";
    }
  }
  void circle(const std::string& cls, double cx, double cy, double r, const std::string& title) {
    s << "<circle class=\"" << cls << "\" cx=\"" << num(cx) << "\" cy=\"" << num(cy) << "\" r=\"" << num(r)
      << "\"><title>" << xml_escape(title) << "</title></circle>\n";
  }
};

// A legend right of the plot, an entry a line from `ly` down: swatches without <title>, so they
// are never taken for markers. A swatch is drawn at the entry's height, so make it just before.
struct Legend {
  SvgWriter& w;
  double ly;                          // the next entry's middle
  const double lx = kLegendLeft + 8;  // the swatches' middle
  void entry(const std::string& swatch, const std::string& label) {
    w.s << swatch;
    w.text(kLegendLeft + 22, ly + 4, label, "class=\"label\"");
    ly += 20;
  }
  std::string circle_swatch(const std::string& cls, double r) const {
    return "<circle class=\"" + cls + "\" cx=\"" + num(lx) + "\" cy=\"" + num(ly) + "\" r=\"" + num(r) + "\"/>\n";
  }
  std::string line_swatch(const std::string& cls, bool vertical) const {
    const double dx = vertical ? 0 : 9, dy = vertical ? 7 : 0;
    return "<line class=\"" + cls + "\" x1=\"" + num(lx - dx) + "\" y1=\"" + num(ly - dy) + "\" x2=\"" + num(lx + dx) +
           "\" y2=\"" + num(ly + dy) + "\"/>\n";
  }
  std::string cross_swatch(const std::string& cls) const {
    return "<g class=\"" + cls + "\">" + cross_path(lx, ly) + "</g>\n";
  }
};

// A line through `pts` (nothing for fewer than two).
void draw_polyline(SvgWriter& w, const std::string& cls, const std::vector<std::pair<double, double>>& pts) {
  if (pts.size() < 2) return;
  w.s << "<polyline class=\"" << cls << "\" points=\"";
  for (size_t i = 0; i < pts.size(); ++i) w.s << (i ? " " : "") << num(pts[i].first) << "," << num(pts[i].second);
  w.s << "\"/>\n";
}

const char* kStyle =
    "text{fill:#222}\n"
    ".title{font-size:16px;font-weight:bold}\n"
    ".subtitle{font-size:13px;fill:#555}\n"
    ".axis{stroke:#333;stroke-width:1}\n"
    ".tick line{stroke:#ddd;stroke-width:1}\n"
    ".tick text{font-size:12px;fill:#444}\n"
    ".axis-title{font-size:13px;fill:#333}\n"
    ".budget{stroke:#d62728;stroke-width:2}\n"
    ".usable{stroke:#ff7f0e;stroke-width:2;stroke-dasharray:7 4}\n"
    ".fit{stroke:#444;stroke-width:1.5}\n"
    ".residual-band{fill:#999;fill-opacity:0.35;stroke:none}\n"
    ".planned{stroke:#2ca02c;stroke-width:1.5;stroke-dasharray:4 3}\n"
    ".fit-limit{stroke:#888;stroke-width:1;stroke-dasharray:2 3}\n"
    ".predicted{stroke:#2ca02c;stroke-width:3}\n"
    ".room{stroke:#2ca02c;stroke-width:6;stroke-opacity:0.45}\n"
    ".point{fill:#1f77b4;stroke:#fff;stroke-width:1}\n"
    ".confirm{fill:none;stroke:#2ca02c;stroke-width:2.5}\n"
    ".failed path{stroke:#d62728;stroke-width:3}\n"
    ".run-peak{fill:none;stroke:#9467bd;stroke-width:2;stroke-dasharray:3 2}\n"
    ".label{font-size:12px}\n"
    ".note{font-size:12px;fill:#555}\n"
    ".bar-frame{fill:none;stroke:#333;stroke-width:1}\n"
    ".section{font-size:14px;font-weight:bold}\n"
    ".window-peak{fill:#9467bd;stroke:#fff;stroke-width:0.5}\n"
    ".window-peak-line{fill:none;stroke:#9467bd;stroke-width:1.2}\n"
    ".window-loss{fill:#1f77b4;stroke:#fff;stroke-width:0.5}\n"
    ".window-loss-line{fill:none;stroke:#1f77b4;stroke-width:1.2}\n"
    ".window-predicted{stroke:#2ca02c;stroke-width:1.5;stroke-dasharray:6 3}\n"
    ".window-budget{stroke:#d62728;stroke-width:1.5}\n"
    ".window-oom path{stroke:#d62728;stroke-width:2.5}\n";

std::string describe_sizes(const Plan& p) {
  return std::to_string(p.target_batch) + " = " + std::to_string(p.world_size) + " rank(s) x " +
         std::to_string(p.accumulation_steps) + " microbatch(es) [" + join_sizes(p.microbatch_sizes, 12) + "]";
}

// --- the memory chart ---------------------------------------------------------------------------

// The memory chart's scales: microbatch size across, bytes up, both from 0.
struct ChartFrame {
  Axis xa, ya;
  int64_t fit_limit = 0;  // where the fitted line meets the usable budget (plans only); 0 for none
  double X(double size) const { return kPlotLeft + size / xa.max * kPlotWidth; }
  double Y(double bytes) const { return kPlotTop + kPlotHeight - bytes / (ya.max * ya.unit_value) * kPlotHeight; }
};

// The chart's ranges: every size and every byte count drawn, with some air above and right.
ChartFrame chart_frame(const ReportInput& in, const ChartData& d) {
  ChartFrame f;
  double max_size = 1, max_bytes = 1;
  for (const auto& p : in.profile.points) {
    max_size = std::max(max_size, static_cast<double>(p.micro_batch));
    max_bytes = std::max(max_bytes, static_cast<double>(point_bytes(p, d.reserved)));
  }
  for (const auto& t : in.profile.trials) {
    max_size = std::max(max_size, static_cast<double>(t.micro_batch));
    max_bytes = std::max(max_bytes, static_cast<double>(t.peak_bytes));
  }
  if (in.plan) {
    const Plan& plan = *in.plan;
    max_size = std::max({max_size, static_cast<double>(plan.micro_batch), static_cast<double>(plan.max_micro_batch)});
    max_bytes = std::max(max_bytes, static_cast<double>(plan.memory.predicted_peak_bytes));
    if (d.model && d.usable_bytes) f.fit_limit = d.model->largest_fitting(*d.usable_bytes);
    if (f.fit_limit > 0 && f.fit_limit <= 4 * max_size) max_size = std::max(max_size, static_cast<double>(f.fit_limit));
  }
  if (in.stats) {
    max_size = std::max(max_size, static_cast<double>(in.stats->micro_batch));
    if (in.stats->measured_peak_bytes) max_bytes = std::max(max_bytes, static_cast<double>(*in.stats->measured_peak_bytes));
  }
  if (d.budget_bytes) max_bytes = std::max(max_bytes, static_cast<double>(*d.budget_bytes));
  f.xa = size_axis(max_size * 1.12);
  f.ya = bytes_axis(max_bytes * 1.06);
  return f;
}

// The chart's clip area and title, the grid with its tick labels, the axes and their titles.
void draw_chart_axes(SvgWriter& w, const ChartFrame& f, bool reserved) {
  w.s << "<clipPath id=\"plot-area\"><rect x=\"" << num(kPlotLeft) << "\" y=\"" << num(kPlotTop) << "\" width=\""
      << num(kPlotWidth) << "\" height=\"" << num(kPlotHeight) << "\"/></clipPath>\n";
  w.text(kPlotLeft, kPlotTop - 12, "Peak memory against microbatch size" +
                                       std::string(reserved ? " (reserved bytes, what a GPU runs out on)" : ""),
         "class=\"section\"");
  w.s << "<g class=\"ticks\">\n";
  for (int k = 0; k * f.ya.step <= f.ya.max + 1e-9; ++k) {
    const double v = k * f.ya.step;
    const double y = f.Y(v * f.ya.unit_value);
    w.s << "<g class=\"tick y\">";
    w.line("grid", kPlotLeft, y, kPlotRight, y);
    w.text(kPlotLeft - 8, y + 4, tick_label(v, f.ya.unit_name), "text-anchor=\"end\"");
    w.s << "</g>\n";
  }
  for (int k = 0; k * f.xa.step <= f.xa.max + 1e-9; ++k) {
    const double v = k * f.xa.step;
    const double x = f.X(v);
    w.s << "<g class=\"tick x\">";
    w.line("grid", x, kPlotTop, x, kPlotBottom);
    w.text(x, kPlotBottom + 18, tick_label(v, ""), "text-anchor=\"middle\"");
    w.s << "</g>\n";
  }
  w.s << "</g>\n";
  w.line("axis", kPlotLeft, kPlotBottom, kPlotRight, kPlotBottom);
  w.line("axis", kPlotLeft, kPlotTop, kPlotLeft, kPlotBottom);
  w.text(kPlotLeft + kPlotWidth / 2, kPlotBottom + 40, "microbatch size b (samples)",
         "class=\"axis-title\" text-anchor=\"middle\"");
  w.text(28, kPlotTop + kPlotHeight / 2, "peak memory (" + f.ya.unit_name + ")",
         "class=\"axis-title\" text-anchor=\"middle\" transform=\"rotate(-90 28 " + num(kPlotTop + kPlotHeight / 2) + ")\"");
}

// The budget and the usable budget across the plot, labelled right of it.
void draw_budget_lines(SvgWriter& w, const ChartFrame& f, const ChartData& d) {
  if (d.budget_bytes) {
    const double y = f.Y(static_cast<double>(*d.budget_bytes));
    w.line("budget", kPlotLeft, y, kPlotRight, y, "budget " + format_bytes(*d.budget_bytes));
    w.text(kPlotRight + 6, y + 4, "budget " + format_bytes(*d.budget_bytes), "class=\"label\"");
  }
  if (d.usable_bytes) {
    const double y = f.Y(static_cast<double>(*d.usable_bytes));
    // What is kept free, in bytes: the plan states it so (a fraction of the budget in 1.0/1.1
    // plans, measured parts since), and budget - usable is that number in either.
    const int64_t kept_free = d.budget_bytes ? *d.budget_bytes - *d.usable_bytes : 0;
    w.line("usable", kPlotLeft, y, kPlotRight, y, "usable " + format_bytes(*d.usable_bytes));
    w.text(kPlotRight + 6, y + 16, "usable " + format_bytes(*d.usable_bytes) + " (" + format_bytes(kept_free) + " kept free)",
           "class=\"label\"");
  }
}

// The fitted line with its residual band, clipped to the plot.
void draw_fit_line(SvgWriter& w, const ChartFrame& f, const MemoryModel& model) {
  const double r = model.summary().max_abs_residual_bytes;
  const double b0 = 1, b1 = f.xa.max;
  const double y0 = model.predict_bytes(1), y1 = model.predict_bytes(static_cast<int64_t>(b1));
  w.s << "<g clip-path=\"url(#plot-area)\">\n";
  w.s << "<polygon class=\"residual-band\" points=\"" << num(f.X(b0)) << "," << num(f.Y(y0 + r)) << " " << num(f.X(b1))
      << "," << num(f.Y(y1 + r)) << " " << num(f.X(b1)) << "," << num(f.Y(y1 - r)) << " " << num(f.X(b0)) << ","
      << num(f.Y(y0 - r)) << "\"><title>largest residual of the fit: " << xml_escape(format_bytes(static_cast<int64_t>(std::ceil(r))))
      << "</title></polygon>\n";
  w.line("fit", f.X(b0), f.Y(y0), f.X(b1), f.Y(y1),
         "fitted line: " + format_bytes(static_cast<int64_t>(model.summary().intercept_bytes)) + " + " +
             format_bytes(static_cast<int64_t>(model.summary().slope_bytes_per_sample)) + " per sample");
  w.s << "</g>\n";
}

// Planned size, the room left up to the usable budget, where the line meets the usable budget.
void draw_planned_marker(SvgWriter& w, const ChartFrame& f, const Plan& plan) {
  const double x = f.X(static_cast<double>(plan.micro_batch));
  w.line("planned", x, kPlotTop, x, kPlotBottom, "planned microbatch " + std::to_string(plan.micro_batch));
  w.text(x, kPlotTop + 14, "planned b=" + std::to_string(plan.micro_batch), "class=\"label\" text-anchor=\"end\" dx=\"-4\"");
  const double yp = f.Y(static_cast<double>(plan.memory.predicted_peak_bytes));
  w.line("predicted", x - 10, yp, x + 10, yp, "predicted peak " + format_bytes(plan.memory.predicted_peak_bytes));
  const int64_t room = plan.memory.usable_bytes - plan.memory.predicted_peak_bytes;
  if (room > 0) {
    const double yu = f.Y(static_cast<double>(plan.memory.usable_bytes));
    w.line("room", x, yu, x, yp, "room left " + format_bytes(room));
    w.text(x - 14, (yu + yp) / 2 + 4, "room " + format_bytes(room), "class=\"label\" text-anchor=\"end\"");
  }
  w.text(x - 14, yp + 18, "predicted " + format_bytes(plan.memory.predicted_peak_bytes),
         "class=\"label\" text-anchor=\"end\"");
  const int64_t fit_limit = f.fit_limit;
  if (fit_limit > 0 && fit_limit != plan.micro_batch && f.X(static_cast<double>(fit_limit)) <= kPlotRight) {
    const double xf = f.X(static_cast<double>(fit_limit));
    w.line("fit-limit", xf, kPlotTop, xf, kPlotBottom, "the fitted line reaches the usable budget at " + std::to_string(fit_limit));
    w.text(xf + 4, kPlotBottom - 8, "line meets usable: b=" + std::to_string(fit_limit), "class=\"note\"");
  }
}

// Measured points, confirmations, failed steps, the run's peak.
void draw_measurements(SvgWriter& w, const ChartFrame& f, const ReportInput& in, const ChartData& d) {
  for (const auto& p : in.profile.points) {
    const int64_t bytes = point_bytes(p, d.reserved);
    w.circle("point", f.X(static_cast<double>(p.micro_batch)), f.Y(static_cast<double>(bytes)), 4.5,
             "b=" + std::to_string(p.micro_batch) + ": peak " + format_bytes(bytes));
  }
  for (const auto& t : in.profile.trials) {
    if (t.kind == "confirm" && t.fit) {
      w.circle("confirm", f.X(static_cast<double>(t.micro_batch)), f.Y(static_cast<double>(t.peak_bytes)), 9,
               "confirmed b=" + std::to_string(t.micro_batch) + ": a real window peaked at " + format_bytes(t.peak_bytes));
    } else if (!t.fit) {
      const double x = f.X(static_cast<double>(t.micro_batch)), y = kPlotTop + 8;
      w.s << "<g class=\"failed\" data-micro-batch=\"" << t.micro_batch << "\"><title>" << xml_escape(t.kind)
          << " b=" << t.micro_batch << " ran out of memory</title>" << cross_path(x, y) << "</g>\n";
    }
  }
  if (in.stats && in.stats->measured_peak_bytes) {
    w.circle("run-peak", f.X(static_cast<double>(in.stats->micro_batch)),
             f.Y(static_cast<double>(*in.stats->measured_peak_bytes)), 14,
             "accumplan run: peak " + format_bytes(*in.stats->measured_peak_bytes) + " over " +
                 std::to_string(in.stats->windows) + " window(s)");
  }
}

// The chart's legend, right of the plot: an entry for each kind of mark the chart has.
void draw_chart_legend(SvgWriter& w, const ReportInput& in, const ChartData& d) {
  Legend lg{w, kPlotTop + 120};
  lg.entry(lg.circle_swatch("point", 4.5), "measured window peak");
  const auto& trials = in.profile.trials;
  if (std::any_of(trials.begin(), trials.end(), [](const Trial& t) { return t.kind == "confirm" && t.fit; })) {
    lg.entry(lg.circle_swatch("confirm", 7), "confirmation step");
  }
  if (std::any_of(trials.begin(), trials.end(), [](const Trial& t) { return !t.fit; })) {
    lg.entry(lg.cross_swatch("failed"), "ran out of memory");
  }
  if (d.model) {
    lg.entry(lg.line_swatch("fit", false), "fitted line (planner)");
    lg.entry("<rect class=\"residual-band\" x=\"" + num(lg.lx - 9) + "\" y=\"" + num(lg.ly - 5) +
                 "\" width=\"18\" height=\"10\"/>\n",
             "\u00b1 largest residual " + format_bytes(static_cast<int64_t>(std::ceil(d.model->summary().max_abs_residual_bytes))));
  }
  if (d.budget_bytes) lg.entry(lg.line_swatch("budget", false), "budget");
  if (d.usable_bytes) lg.entry(lg.line_swatch("usable", false), "usable = budget \u2212 margin (--headroom)");
  if (in.plan) {
    lg.entry(lg.line_swatch("planned", true), "planned microbatch");
    lg.entry(lg.line_swatch("room", true), "room: predicted peak to usable");
  }
  if (in.stats && in.stats->measured_peak_bytes) {
    lg.entry(lg.circle_swatch("run-peak", 7), "peak of accumplan run");
  }
}

// The memory chart: returns the y just below it.
double draw_memory_chart(SvgWriter& w, const ReportInput& in, const ChartData& d) {
  const ChartFrame f = chart_frame(in, d);
  draw_chart_axes(w, f, d.reserved);
  draw_budget_lines(w, f, d);
  if (d.model) draw_fit_line(w, f, *d.model);
  if (in.plan) draw_planned_marker(w, f, *in.plan);
  draw_measurements(w, f, in, d);
  draw_chart_legend(w, in, d);
  double y = kPlotBottom + 62;
  if (!d.model_error.empty()) {
    w.text(kPlotLeft, y, "No fitted line: " + d.model_error, "class=\"note\"");
    y += 18;
  }
  return y;
}

// --- the breakdown and the run's totals ---------------------------------------------------------

// One memory bar with its title and legend (the exact sizes and shares, three columns): returns the
// y just below it.
double draw_bar(SvgWriter& w, const std::string& title, const std::string& id, const std::vector<Part>& parts,
                int64_t total, double top) {
  const double bar_top = std::max(top + 30, kBarTop);
  w.text(kBarLeft, bar_top - 12, title, "class=\"section\"");
  double x = kBarLeft;
  for (const Part& p : parts) {
    const double width = total > 0 ? static_cast<double>(p.bytes) / static_cast<double>(total) * kBarWidth : 0;
    w.s << "<rect class=\"segment " << id << " part-" << p.name << "\" x=\"" << num(x) << "\" y=\"" << num(bar_top)
        << "\" width=\"" << num(width) << "\" height=\"" << num(kBarHeight) << "\" fill=\"" << p.color << "\"><title>"
        << xml_escape(std::string(p.label) + " " + format_bytes(p.bytes) + " (" + percent_text(p.bytes, total) + ")")
        << "</title></rect>\n";
    x += width;
  }
  w.s << "<rect class=\"bar-frame\" x=\"" << num(kBarLeft) << "\" y=\"" << num(bar_top) << "\" width=\"" << num(kBarWidth)
      << "\" height=\"" << num(kBarHeight) << "\"><title>" << xml_escape(format_bytes(total))
      << "</title></rect>\n";
  double y = bar_top + kBarHeight + 24;
  for (size_t i = 0; i < parts.size(); ++i) {
    const double cx = kBarLeft + static_cast<double>(i % 3) * 290;
    const double cy = y + static_cast<double>(i / 3) * 22;
    w.s << "<rect x=\"" << num(cx) << "\" y=\"" << num(cy - 11) << "\" width=\"14\" height=\"14\" fill=\""
        << parts[i].color << "\" stroke=\"#666\" stroke-width=\"0.5\"/>\n";
    w.text(cx + 20, cy, std::string(parts[i].label) + " " + format_bytes(parts[i].bytes) + " (" +
                            percent_text(parts[i].bytes, total) + ")",
           "class=\"label\"");
  }
  return y + 22 * static_cast<double>((parts.size() + 2) / 3);
}

// The breakdown at the planned size: returns the y just below it.
double draw_breakdown(SvgWriter& w, const Plan& plan, double top) {
  const MemoryBreakdown& m = plan.memory;
  const int64_t persistent = m.weights_bytes + m.gradients_bytes + m.optimizer_state_bytes;
  const int64_t activations = std::max<int64_t>(0, m.predicted_peak_bytes - persistent);
  const int64_t peak = persistent + activations;
  const int64_t room = std::max<int64_t>(0, m.usable_bytes - peak);
  const int64_t margin = std::max<int64_t>(0, m.budget_bytes - std::max(m.usable_bytes, peak));
  const int64_t total = std::max(m.budget_bytes, peak);
  const std::vector<Part> parts = {
      {"weights", "weights", "#4e79a7", m.weights_bytes},
      {"gradients", "gradients", "#59a14f", m.gradients_bytes},
      {"optimizer-state", "optimizer state", "#edc948", m.optimizer_state_bytes},
      {"activations", "activations and transients", "#e15759", activations},
      {"room", "room left to usable", "#b6e3b0", room},
      {"margin", "margin kept free (--headroom)", "#eeeeee", margin},
  };
  return draw_bar(w,
                  "Memory at the planned microbatch b=" + std::to_string(plan.micro_batch) + " (predicted peak " +
                      format_bytes(m.predicted_peak_bytes) + " of " + format_bytes(m.budget_bytes) + " budget)",
                  "training", parts, total, top);
}

// Beside the training bar, the evaluation batch's (plan.eval, 1.7): the same budget, the weights
// and optimizer state resident, no gradients, the eval activations (and kept outputs).
double draw_eval_breakdown(SvgWriter& w, const Plan& plan, const EvalPlan& e, double top) {
  const MemoryBreakdown& m = plan.memory;
  if (e.micro_batch == 0) {
    w.text(kBarLeft, top + 18, "Evaluation: not even the training microbatch fits beside the weights and optimizer state.",
           "class=\"note\"");
    return top + 40;
  }
  const int64_t resident = e.weights_bytes + e.optimizer_state_bytes;
  const int64_t activations = std::max<int64_t>(0, e.predicted_peak_bytes - resident);
  const int64_t peak = resident + activations;
  const int64_t room = std::max<int64_t>(0, m.usable_bytes - peak);
  const int64_t margin = std::max<int64_t>(0, m.budget_bytes - std::max(m.usable_bytes, peak));
  const std::vector<Part> parts = {
      {"weights", "weights", "#4e79a7", e.weights_bytes},
      {"optimizer-state", "optimizer state", "#edc948", e.optimizer_state_bytes},
      {"eval-activations", e.keep_outputs ? "eval activations and kept outputs" : "eval activations and transients",
       "#f28e2b", activations},
      {"room", "room left to usable", "#b6e3b0", room},
      {"margin", "margin kept free (--headroom)", "#eeeeee", margin},
  };
  return draw_bar(w,
                  "Evaluation at the planned eval microbatch b=" + std::to_string(e.micro_batch) + " (" +
                      num(static_cast<double>(e.micro_batch) / static_cast<double>(std::max<int64_t>(1, plan.micro_batch))) +
                      "x training; predicted peak " + format_bytes(e.predicted_peak_bytes) +
                      (e.confirmed ? ", confirmed" : "") + ")",
                  "eval", parts, std::max(m.budget_bytes, peak), top);
}

std::vector<std::string> stats_lines(const RunStats& s) {
  std::vector<std::string> out;
  // A re-planned run is compared with the plan it ended on, the one its later windows ran.
  const int64_t predicted = s.final_predicted_peak_bytes.value_or(s.predicted_peak_bytes);
  std::string peak = s.measured_peak_bytes ? format_bytes(*s.measured_peak_bytes) : std::string("not measured");
  std::string line = "accumplan run: " + std::to_string(s.windows) + " window(s), " +
                     "peak " + peak + " against " + format_bytes(predicted) +
                     (s.final_predicted_peak_bytes ? " predicted by the re-planned plan" : " predicted");
  if (s.measured_peak_bytes) {
    const int64_t diff = *s.measured_peak_bytes - predicted;
    line += " (" + std::string(diff >= 0 ? "+" : "") + format_bytes(diff) + ")";
  }
  if (s.final_predicted_peak_bytes) {
    line += "; the plan it started from predicted " + format_bytes(s.predicted_peak_bytes);
  }
  if (s.budget_bytes) line += ", budget " + format_bytes(*s.budget_bytes);
  out.push_back(line);
  std::string second = std::to_string(s.oom_recoveries) + " OOM recover" + (s.oom_recoveries == 1 ? "y" : "ies") +
                       "; final microbatches [" + join_sizes(s.microbatch_sizes, 12) + "]; mean window " +
                       format_seconds(s.mean_window_seconds);
  if (s.final_loss) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "; final loss %.5g", *s.final_loss);
    second += buf;
  }
  out.push_back(second);
  if (s.series.empty()) {
    out.push_back("These stats carry no per-window series (written by an accumplan run from before it); "
                  "this shows the run's totals.");
  }
  return out;
}

// --- the run, window by window ------------------------------------------------------------------
// Stats with a series: peaks against the prediction and the budget, with each window's OOM
// recoveries and re-plans as a cross over it; then the loss. Ticks carry their own classes ("wx",
// "wpeak", "wloss") so each axis is read back on its own.

// The x axis both panels share. Windows are numbered from 1, as the progress line counts them (the
// stats' "window" is the 0-based index); half a window of air each side, ticks on whole windows only.
struct SeriesX {
  double lo = 0.5, hi = 1.5, step = 1;
  double X(double window) const { return kPlotLeft + (window - lo) / (hi - lo) * kPlotWidth; }
  double of(const RunWindowRecord& r) const { return X(static_cast<double>(r.window + 1)); }  // by the window's number
};

SeriesX series_x(const RunStats& s) {
  SeriesX sx;
  sx.hi = std::max(1.0, static_cast<double>(s.series.size())) + 0.5;
  sx.step = std::max(1.0, std::round(nice_step(sx.hi - sx.lo, 10)));
  return sx;
}

// A panel's window ticks and grid, and its two axes, for the panel whose x axis is at `bottom`.
void draw_window_ticks(SvgWriter& w, const SeriesX& sx, double bottom) {
  for (double v = sx.step == 1.0 ? 1.0 : sx.step; v <= sx.hi; v += sx.step) {
    w.s << "<g class=\"tick wx\">";
    w.line("grid", sx.X(v), bottom - kPanelHeight, sx.X(v), bottom);
    w.text(sx.X(v), bottom + 16, tick_label(v, ""), "text-anchor=\"middle\"");
    w.s << "</g>\n";
  }
  w.line("axis", kPlotLeft, bottom, kPlotRight, bottom);
  w.line("axis", kPlotLeft, bottom - kPanelHeight, kPlotLeft, bottom);
}

// The peak panel's scale: bytes up from 0 to the highest peak, prediction or budget.
struct PeakScale {
  Axis axis;
  double top = 0, bottom = 0;
  bool any_peak = false;  // some window has a peak (a run without a memory probe has none)
  double Y(double bytes) const { return bottom - bytes / (axis.max * axis.unit_value) * kPanelHeight; }
};

PeakScale peak_scale(const RunStats& s, double top) {
  PeakScale ps;
  double max_bytes = static_cast<double>(s.predicted_peak_bytes);
  for (const auto& r : s.series) {
    if (r.peak_bytes) max_bytes = std::max(max_bytes, static_cast<double>(*r.peak_bytes)), ps.any_peak = true;
  }
  if (s.budget_bytes) max_bytes = std::max(max_bytes, static_cast<double>(*s.budget_bytes));
  ps.axis = bytes_axis(std::max(max_bytes, 1.0) * 1.06);
  ps.top = top;
  ps.bottom = top + kPanelHeight;
  return ps;
}

// The peak panel's byte ticks and grid, its window ticks and axes, and its axis title.
void draw_peak_axes(SvgWriter& w, const SeriesX& sx, const PeakScale& ps) {
  const Axis& pa = ps.axis;
  for (int k = 0; k * pa.step <= pa.max + 1e-9; ++k) {
    const double v = k * pa.step;
    w.s << "<g class=\"tick wpeak\">";
    w.line("grid", kPlotLeft, ps.Y(v * pa.unit_value), kPlotRight, ps.Y(v * pa.unit_value));
    w.text(kPlotLeft - 8, ps.Y(v * pa.unit_value) + 4, tick_label(v, pa.unit_name), "text-anchor=\"end\"");
    w.s << "</g>\n";
  }
  draw_window_ticks(w, sx, ps.bottom);
  w.text(28, ps.top + kPanelHeight / 2, "window peak (" + pa.unit_name + ")",
         "class=\"axis-title\" text-anchor=\"middle\" transform=\"rotate(-90 28 " + num(ps.top + kPanelHeight / 2) +
             ")\"");
}

// The budget (if any) and the predicted peak across the peak panel, labelled right of it. Returns
// the y of the lower label.
double draw_prediction_lines(SvgWriter& w, const RunStats& s, const PeakScale& ps) {
  // Labels right of the plot, at least a line apart when the two lines nearly meet.
  const double y_predicted = ps.Y(static_cast<double>(s.predicted_peak_bytes));
  double predicted_label_y = y_predicted + 4;
  if (s.budget_bytes) {
    const double y_budget = ps.Y(static_cast<double>(*s.budget_bytes));
    w.line("window-budget", kPlotLeft, y_budget, kPlotRight, y_budget, "budget " + format_bytes(*s.budget_bytes));
    w.text(kPlotRight + 6, y_budget + 4, "budget " + format_bytes(*s.budget_bytes), "class=\"label\"");
    if (std::fabs(predicted_label_y - (y_budget + 4)) < 14) {
      predicted_label_y = y_predicted >= y_budget ? y_budget + 18 : y_budget - 10;
    }
  }
  w.line("window-predicted", kPlotLeft, y_predicted, kPlotRight, y_predicted,
         "predicted peak " + format_bytes(s.predicted_peak_bytes));
  w.text(kPlotRight + 6, predicted_label_y, "predicted " + format_bytes(s.predicted_peak_bytes), "class=\"label\"");
  double lowest_label_y = predicted_label_y;
  if (s.budget_bytes) lowest_label_y = std::max(lowest_label_y, ps.Y(static_cast<double>(*s.budget_bytes)) + 4);
  return lowest_label_y;
}

// The series' legend, under the labels (below the lower of them, so "predicted ..." never runs
// into it).
void draw_series_legend(SvgWriter& w, const PeakScale& ps, double lowest_label_y) {
  Legend lg{w, std::max(ps.top + 70, lowest_label_y + 22)};
  lg.entry(lg.line_swatch("window-peak-line", false), "peak of each window");
  lg.entry(lg.cross_swatch("window-oom"), "OOM recovery and re-plan");
}

// Each window's peak: a line through them, and a marker on each when there are not too many.
void draw_window_peaks(SvgWriter& w, const RunStats& s, const SeriesX& sx, const PeakScale& ps) {
  std::vector<std::pair<double, double>> pts;
  for (const auto& r : s.series) {
    if (r.peak_bytes) pts.push_back({sx.of(r), ps.Y(static_cast<double>(*r.peak_bytes))});
  }
  draw_polyline(w, "window-peak-line", pts);
  if (s.series.size() > kMostMarkers) return;
  for (const auto& r : s.series) {
    if (!r.peak_bytes) continue;
    w.circle("window-peak", sx.of(r), ps.Y(static_cast<double>(*r.peak_bytes)), 3,
             "window " + std::to_string(r.window + 1) + ": peak " + format_bytes(*r.peak_bytes) + ", " +
                 std::to_string(r.samples) + " samples, " + format_seconds(r.seconds.value_or(0.0)));
  }
}

// OOM recoveries and re-plans: a cross at the top of the peak plot, over the window.
void draw_window_crosses(SvgWriter& w, const RunStats& s, const SeriesX& sx, const PeakScale& ps) {
  for (const auto& r : s.series) {
    if (r.oom_recoveries == 0 && r.replans.value_or(0) == 0) continue;
    w.s << "<g class=\"window-oom\" data-window=\"" << r.window + 1 << "\" data-oom-recoveries=\"" << r.oom_recoveries
        << "\" data-replans=\"" << r.replans.value_or(0) << "\"><title>window " << r.window + 1 << ": " << r.oom_recoveries
        << " OOM recover" << (r.oom_recoveries == 1 ? "y" : "ies") << ", " << r.replans.value_or(0) << " re-plan"
        << (r.replans.value_or(0) == 1 ? "" : "s") << "</title>" << cross_path(sx.of(r), ps.top + 8) << "</g>\n";
  }
}

// The peak panel, its top at `top`: returns its bottom.
double draw_peak_panel(SvgWriter& w, const RunStats& s, const SeriesX& sx, double top) {
  const PeakScale ps = peak_scale(s, top);
  draw_peak_axes(w, sx, ps);
  const double lowest_label_y = draw_prediction_lines(w, s, ps);
  draw_series_legend(w, ps, lowest_label_y);
  draw_window_peaks(w, s, sx, ps);
  draw_window_crosses(w, s, sx, ps);
  if (!ps.any_peak) w.text(kPlotLeft + 12, top + 20, "no peaks: the run had no memory probe", "class=\"note\"");
  return ps.bottom;
}

// The loss panel, its top at `top`: ticks over the losses' range, a line through them and a marker
// on each when there are not too many. Returns its bottom.
double draw_loss_panel(SvgWriter& w, const RunStats& s, const SeriesX& sx, double top) {
  std::optional<double> lo, hi;
  for (const auto& r : s.series) {
    if (!r.loss) continue;
    lo = lo ? std::min(*lo, *r.loss) : *r.loss;
    hi = hi ? std::max(*hi, *r.loss) : *r.loss;
  }
  const RangeAxis la = range_axis(lo.value_or(0), hi.value_or(1), 5);
  const double loss_bottom = top + kPanelHeight;
  auto YL = [&](double loss) { return loss_bottom - (loss - la.lo) / (la.hi - la.lo) * kPanelHeight; };
  for (int k = 0; la.lo + k * la.step <= la.hi + 1e-9 * la.step; ++k) {
    const double v = la.lo + k * la.step;
    w.s << "<g class=\"tick wloss\">";
    w.line("grid", kPlotLeft, YL(v), kPlotRight, YL(v));
    w.text(kPlotLeft - 8, YL(v) + 4, tick_label(v, ""), "text-anchor=\"end\"");
    w.s << "</g>\n";
  }
  draw_window_ticks(w, sx, loss_bottom);
  w.text(28, top + kPanelHeight / 2, "loss", "class=\"axis-title\" text-anchor=\"middle\" transform=\"rotate(-90 28 " +
                                               num(top + kPanelHeight / 2) + ")\"");
  w.text(kPlotLeft + kPlotWidth / 2, loss_bottom + 36, "window", "class=\"axis-title\" text-anchor=\"middle\"");
  std::vector<std::pair<double, double>> pts;
  for (const auto& r : s.series) {
    if (r.loss) pts.push_back({sx.of(r), YL(*r.loss)});
  }
  draw_polyline(w, "window-loss-line", pts);
  if (s.series.size() <= kMostMarkers) {
    for (const auto& r : s.series) {
      if (!r.loss) continue;
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.6g", *r.loss);
      w.circle("window-loss", sx.of(r), YL(*r.loss), 3, "window " + std::to_string(r.window + 1) + ": loss " + buf);
    }
  }
  return loss_bottom;
}

// The run window by window (stats with a series), under the section's title: returns the y just
// below it.
double draw_window_series(SvgWriter& w, const RunStats& s, double top) {
  const SeriesX sx = series_x(s);
  const double y = top + 30;
  w.text(kPlotLeft, y - 12, "The run, window by window", "class=\"section\"");
  const double peak_bottom = draw_peak_panel(w, s, sx, y);
  return draw_loss_panel(w, s, sx, peak_bottom + kPanelGap) + 56;
}

// --- the document -------------------------------------------------------------------------------

std::string header_line(const ReportInput& in) {
  if (in.plan) {
    const Plan& p = *in.plan;
    return "target batch " + describe_sizes(p) + ", " + p.setup.optimizer + ", " + p.device.name +
           (p.confirmed ? ", confirmed by a real step" : ", not confirmed");
  }
  return "profile: " + std::to_string(in.profile.points.size()) + " microbatch sizes measured on " +
         in.profile.device.name + ", " + in.profile.setup.optimizer + " (no plan: run `accumplan plan --profile ...`)";
}

}  // namespace

// Also keeps the document well-formed XML whatever a plan's strings hold: control characters
// (an ESC in a model path, 0x01 in a device name) become '?' and the non-characters U+FFFE and
// U+FFFF become U+FFFD — XML 1.0 allows neither, and a browser or xmllint refused the report.
std::string xml_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\t' && c != '\n' && c != '\r') || u == 0x7F) {
      out += '?';
      continue;
    }
    if (u == 0xEF && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0xBF &&
        (static_cast<unsigned char>(s[i + 2]) & 0xFE) == 0xBE) {
      out += "\xEF\xBF\xBD";
      i += 2;
      continue;
    }
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

ChartData chart_data(const ReportInput& in) {
  ChartData d;
  try {
    d.model = MemoryModel::fit(in.profile);
    d.reserved = d.model->summary().target == "reserved_peak_bytes";
  } catch (const InputError& e) {
    d.model_error = e.what();
  }
  if (in.plan) {
    d.budget_bytes = in.plan->memory.budget_bytes;
    d.usable_bytes = in.plan->memory.usable_bytes;
  } else if (in.profile.budget_bytes) {
    d.budget_bytes = in.profile.budget_bytes;
  }
  return d;
}

int64_t point_bytes(const ProfilePoint& p, bool reserved) {
  return reserved && p.reserved_peak_bytes ? *p.reserved_peak_bytes : p.peak_bytes;
}

std::string svg_document(const ReportInput& in, bool with_namespace) {
  const ChartData d = chart_data(in);
  SvgWriter w;
  w.text(kPlotLeft - 80, 24, "accumplan report: " + in.title, "class=\"title\"");
  w.text(kPlotLeft - 80, 44, header_line(in), "class=\"subtitle\"");
  double y = draw_memory_chart(w, in, d);
  if (in.plan) {
    y = draw_breakdown(w, *in.plan, y);
    if (in.plan->eval) y = draw_eval_breakdown(w, *in.plan, *in.plan->eval, y);
  } else {
    w.text(kPlotLeft, y + 10, "A profile has no planned size: plan it (accumplan plan --profile ...) for the breakdown.",
           "class=\"note\"");
    y += 30;
  }
  if (in.stats && !in.stats->series.empty()) y = draw_window_series(w, *in.stats, y);
  if (in.stats) {
    w.text(kBarLeft, y + 10, "The run", "class=\"section\"");
    y += 32;
    for (const std::string& l : stats_lines(*in.stats)) {
      w.text(kBarLeft, y, l, "class=\"label\"");
      y += 18;
    }
  }
  const double height = std::ceil(y + 10);
  std::ostringstream out;
  out << "<svg" << (with_namespace ? " xmlns=\"http://www.w3.org/2000/svg\"" : "") << " width=\"" << num(kWidth)
      << "\" height=\"" << num(height) << "\" viewBox=\"0 0 " << num(kWidth) << " " << num(height)
      << "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"13\">\n"
      << "<style>\n" << kStyle << "</style>\n"
      << "<rect x=\"0\" y=\"0\" width=\"" << num(kWidth) << "\" height=\"" << num(height) << "\" fill=\"#ffffff\"/>\n"
      << w.s.str() << "</svg>\n";
  return out.str();
}

}  // namespace accumplan::report_draw
