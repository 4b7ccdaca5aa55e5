// planner/src/report_draw.h — the drawing behind `accumplan report` (internal to the planner).
//
// What it is: the SVG picture of a report (accumplan/report.h): the memory chart, the breakdown
// bar, the run window by window and the run's totals, laid out in absolute pixels; and the few
// pieces report.cpp's HTML page shares with it (the fit, a point's bytes, escaping).
// What it is not: reading plans, profiles or run stats, or choosing a format (report.cpp does
// those, and wraps the SVG in its XML header or HTML page).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "accumplan/memory_model.h"
#include "accumplan/report.h"
#include "accumplan/schema.h"

namespace accumplan::report_draw {

std::string xml_escape(const std::string& s);

// Everything the memory chart draws, gathered from the input once.
struct ChartData {
  std::optional<MemoryModel> model;
  std::string model_error;            // why there is no line
  bool reserved = false;              // the fit (and the points drawn) use reserved bytes
  std::optional<int64_t> budget_bytes;
  std::optional<int64_t> usable_bytes;
};

ChartData chart_data(const ReportInput& in);

// A measured point's peak as the fit sees it: reserved bytes where the fit uses them.
int64_t point_bytes(const ProfilePoint& p, bool reserved);

// The whole <svg> element, with the SVG namespace or (inside HTML) without it.
std::string svg_document(const ReportInput& in, bool with_namespace);

}  // namespace accumplan::report_draw
