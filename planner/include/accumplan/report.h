// accumplan/report.h — `accumplan report`: a picture of a plan (or a profile) and of a run.
//
// What it is: one self-contained SVG (or an HTML page wrapping it) that shows memory against
// microbatch size — every measured point, confirmation and failed step, the fitted line the
// planner uses (MemoryModel) with its residual band, the budget, the usable budget, the margin,
// the planned size and, given a run's stats, the peak training reached — and a stacked bar of the
// memory at the planned size (weights, gradients, optimizer state, activations, margin, headroom),
// and, given a run's stats with their per-window series, the run window by window: each window's
// peak against the prediction and the budget, its loss, and its OOM recoveries and re-plans.
// The file loads nothing: no network, no other files, no JavaScript; tooltips are SVG <title>s.
// The HTML is also well-formed XML, so any XML parser can read it.
// What it is not: a timeline within a window (`accumplan run --trace` writes that, for a trace
// viewer). Stats from before the per-window series show the run by its totals only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "accumplan/schema.h"

namespace accumplan {

// The report's view of `accumplan run --stats` (a RunRecord, schema.h): the fields it draws, with
// the defaults applied.
struct RunStats {
  int64_t windows = 0;
  int64_t oom_recoveries = 0;
  std::vector<int64_t> microbatch_sizes;   // after any re-plan
  int64_t micro_batch = 0;                 // the largest of them
  // The run's allocated peak, what the plan predicts (on CUDA too: the caching allocator's reserved
  // bytes above it are cache it frees before it runs out).
  std::optional<int64_t> measured_peak_bytes;
  int64_t per_rank_batch = 0;              // the plan's per-rank batch (0 in stats from before 1.4)
  int64_t predicted_peak_bytes = 0;        // the plan's prediction the run started from
  // The prediction of the plan the run ended on, when an OOM recovery re-planned it (the peak of
  // a re-planned run is compared with this one); nullopt when the run kept its plan.
  std::optional<int64_t> final_predicted_peak_bytes;
  std::optional<int64_t> budget_bytes;     // enforced during the run, if any
  std::optional<double> final_loss;
  double mean_window_seconds = 0;
  // Per window, as read (RunWindowRecord, schema.h): replans defaults to the OOM recoveries,
  // seconds to 0.
  std::vector<RunWindowRecord> series;     // empty in stats written before the series existed
};

// Reads through run_record_from_json (schema.h), the one reader of the format.
RunStats run_stats_from_json(const nlohmann::json& j);
// Stats drawn beside a plan must come from a run of that plan (or of the plan a run re-planned it
// to): the same per-rank batch, and the plan's predicted peak is the run's starting or final
// prediction. InputError naming `what` otherwise: a report mixing two runs would mislead.
void check_stats_of_plan(const Plan& plan, const RunStats& stats, const std::string& what = "--stats");
// InputError if missing or not JSON, SchemaError naming the field if it is not run stats.
RunStats read_run_stats_file(const std::string& path, const std::string& what = "--stats");

// What a report draws: a plan (its profile inside), or only a profile (no budget line unless the
// profile was measured under one, no planned size, no breakdown bar).
struct ReportInput {
  std::optional<Plan> plan;
  Profile profile;                   // plan->profile when a plan is given
  std::optional<RunStats> stats;
  std::string title;                 // e.g. the model path
};

ReportInput report_input_from_plan(const Plan& plan);
// Reads plan.json (1.0 or 1.1) or profile.json, told apart by their "schema" field.
ReportInput read_report_input(const std::string& path, const std::string& what = "report input");

// "html" or "svg"; InputError naming the value otherwise.
std::string check_report_format(const std::string& format, const std::string& what = "--format");
// The one rule for a report's format: `format` (--format; "" when not given) if it agrees with
// what `out_path`'s extension names (.svg, .html, .htm, any case), else InputError saying both;
// without --format the extension decides, and html where it names none (stdout, report.txt).
std::string report_format_for(const std::string& format, const std::string& out_path);

std::string render_report_svg(const ReportInput& input);
std::string render_report_html(const ReportInput& input);
std::string render_report(const ReportInput& input, const std::string& format);

}  // namespace accumplan
