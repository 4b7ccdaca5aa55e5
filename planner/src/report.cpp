// report.cpp — SVG and HTML pictures of a plan, a profile and a run. See report.h.
//
// What it is: reading the inputs (plan, profile, run stats), choosing the format, and putting the
// documents together: the SVG file, or the HTML page with the picture and its tables.
// What it is not: the picture itself: report_draw.cpp draws it.
#include "accumplan/report.h"
#include "accumplan/sharding.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>

#include "accumplan/checkpoint.h"
#include "accumplan/errors.h"
#include "accumplan/json_io.h"
#include "accumplan/memory_model.h"
#include "accumplan/units.h"
#include "report_draw.h"

namespace accumplan {
namespace {

using report_draw::ChartData;
using report_draw::chart_data;
using report_draw::point_bytes;
using report_draw::svg_document;
using report_draw::xml_escape;

std::string table_row(const std::vector<std::string>& cells, const char* tag = "td");

// 1.13: each rank's window where the ranks differ.
std::string ranks_section(const Plan& plan) {
  std::ostringstream h;
  h << "<h2>Ranks that differ: " << plan.world_size << " ranks, each its own share and microbatch</h2>\n<table>\n"
    << table_row({"rank", "budget", "share", "microbatches", "predicted peak", "predicted seconds"}, "th");
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    const RankWindow& w = plan.ranks[r];
    h << table_row({std::to_string(r), format_bytes(w.budget_bytes), std::to_string(w.per_rank_batch),
                    join_sizes(w.microbatch_sizes, 8), format_bytes(w.predicted_peak_bytes),
                    w.window_seconds ? format_seconds(*w.window_seconds) : "-"});
  }
  return h.str() + "</table>\n";
}

std::string table_row(const std::vector<std::string>& cells, const char* tag) {
  std::string r = "<tr>";
  for (const auto& c : cells) r += std::string("<") + tag + ">" + xml_escape(c) + "</" + tag + ">";
  return r + "</tr>\n";
}

}  // namespace

RunStats run_stats_from_json(const nlohmann::json& j) {
  const RunRecord r = run_record_from_json(j);
  RunStats s;
  s.windows = r.windows;
  s.oom_recoveries = r.oom_recoveries;
  s.microbatch_sizes = r.microbatch_sizes;
  s.micro_batch = r.micro_batch ? *r.micro_batch
                  : r.microbatch_sizes.empty() ? 0
                                               : *std::max_element(r.microbatch_sizes.begin(), r.microbatch_sizes.end());
  s.measured_peak_bytes = r.measured_peak_bytes;  // allocated, also on CUDA: what the plan predicts
  s.per_rank_batch = r.per_rank_batch;
  s.predicted_peak_bytes = r.predicted_peak_bytes;
  if (r.final_predicted_peak_bytes && *r.final_predicted_peak_bytes != s.predicted_peak_bytes) {
    s.final_predicted_peak_bytes = r.final_predicted_peak_bytes;
  }
  s.budget_bytes = r.budget_bytes;
  s.final_loss = r.final_loss;
  s.mean_window_seconds = r.mean_window_seconds.value_or(0.0);
  for (RunWindowRecord w : r.window_series) {
    w.replans = w.replans.value_or(w.oom_recoveries);
    w.seconds = w.seconds.value_or(0.0);
    s.series.push_back(std::move(w));
  }
  return s;
}

void check_stats_of_plan(const Plan& plan, const RunStats& stats, const std::string& what) {
  const int64_t predicted = plan.memory.predicted_peak_bytes;
  const bool same_prediction = stats.predicted_peak_bytes == predicted ||
                               (stats.final_predicted_peak_bytes && *stats.final_predicted_peak_bytes == predicted);
  if (stats.per_rank_batch > 0 && stats.per_rank_batch != plan.per_rank_batch) {
    throw InputError(what + " is from a run with a per-rank batch of " + std::to_string(stats.per_rank_batch) +
                     ", this plan's is " + std::to_string(plan.per_rank_batch) + "; give the stats of a run of this plan");
  }
  if (!same_prediction) {
    throw InputError(what + " is from a run of another plan: it predicted " + format_bytes(stats.predicted_peak_bytes) +
                     ", this plan " + format_bytes(predicted) + "; give the stats of a run of this plan");
  }
}

RunStats read_run_stats_file(const std::string& path, const std::string& what) {
  const nlohmann::json j = read_json_file(path, what);
  try {
    return run_stats_from_json(j);
  } catch (const SchemaError& e) {
    throw SchemaError(what + " '" + path_for_message(path) + "': " + e.what());  // which file, as the plan readers say
  }
}

ReportInput report_input_from_plan(const Plan& plan) {
  ReportInput in;
  in.plan = plan;
  in.profile = plan.profile;
  in.title = plan.model.path;
  return in;
}

ReportInput read_report_input(const std::string& path, const std::string& what) {
  const nlohmann::json j = read_json_file(path, what);
  std::string schema;
  try {
    schema = JsonField(j, "$").str("schema");
    if (schema == kPlanSchema) return report_input_from_plan(plan_from_json(j));
    if (schema == kProfileSchema) {
      ReportInput in;
      in.profile = profile_from_json(j);
      in.title = in.profile.model.path;
      return in;
    }
  } catch (const SchemaError& e) {
    throw SchemaError(what + " '" + path_for_message(path) + "': " + e.what());
  }
  throw SchemaError(what + " '" + path_for_message(path) + "': $.schema is \"" + cut_for_message(schema) + "\"; a report reads \"" + kPlanSchema +
                    "\" (plan.json) or \"" + kProfileSchema + "\" (profile.json)");
}

std::string check_report_format(const std::string& format, const std::string& what) {
  if (format == "html" || format == "svg") return format;
  throw InputError(what + " must be html or svg, got '" + cut_for_message(format) + "'");
}

namespace {

// The format a file name names by its extension (.svg; .html or .htm), or "" for none.
std::string format_named_by(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  const std::size_t dot = name.rfind('.');
  if (dot == std::string::npos) return "";
  std::string ext = name.substr(dot + 1);
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (ext == "svg") return "svg";
  if (ext == "html" || ext == "htm") return "html";
  return "";
}

}  // namespace

std::string report_format_for(const std::string& format, const std::string& out_path) {
  const std::string named = format_named_by(out_path);
  if (format.empty()) return named.empty() ? "html" : named;
  const std::string chosen = check_report_format(format);
  if (!named.empty() && named != chosen) {
    throw InputError("--format " + chosen + " but --out '" + path_for_message(out_path) + "' names " +
                     (named == "svg" ? "an SVG" : "an HTML") + " file; drop --format or give --out a ." + chosen +
                     " name");
  }
  return chosen;
}

std::string render_report_svg(const ReportInput& input) {
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n" + svg_document(input, true);
}

std::string render_report_html(const ReportInput& in) {
  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n<title>accumplan report: "
    << xml_escape(in.title) << "</title>\n<style>\n"
    << "body{font-family:'DejaVu Sans',Helvetica,Arial,sans-serif;margin:16px 24px;color:#222}\n"
    << "table{border-collapse:collapse;margin:8px 0 16px}\n"
    << "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right;font-size:13px}\n"
    << "th{background:#f4f4f4}\nh2{font-size:16px;margin-top:18px}\n.reason{max-width:980px;font-size:13px}\n"
    << "</style>\n</head>\n<body>\n";
  h << svg_document(in, false);
  if (in.plan) h << "<h2>Why this plan</h2>\n<p class=\"reason\">" << xml_escape(in.plan->reason) << "</p>\n";
  if (in.plan && in.plan->checkpoint) {
    // The trade (1.7): memory and seconds with the plan's checkpointing and without it.
    const PlanCheckpoint& c = *in.plan->checkpoint;
    std::string modules;
    for (const std::string& m : c.modules) modules += (modules.empty() ? "" : ", ") + m;
    h << "<h2>Activation checkpointing: " << xml_escape(c.rule) << " (" << xml_escape(modules) << ")</h2>\n<table>\n"
      << table_row({"", "microbatch", "accumulation", "predicted peak", "predicted seconds per window"}, "th")
      << table_row({"with", std::to_string(in.plan->micro_batch), std::to_string(in.plan->accumulation_steps),
                    format_bytes(in.plan->memory.predicted_peak_bytes), format_seconds(c.predicted_seconds_per_window)})
      << table_row({"without", c.without.micro_batch > 0 ? std::to_string(c.without.micro_batch) : "none fits",
                    c.without.micro_batch > 0 ? std::to_string(c.without.accumulation_steps) : "-",
                    c.without.micro_batch > 0 ? format_bytes(c.without.predicted_peak_bytes) : "-",
                    c.without.micro_batch > 0 ? format_seconds(c.without.predicted_seconds_per_window) : "-"})
      << "</table>\n<table>\n" << table_row({"candidate", "frees per sample", "recompute per sample", "checkpointed"}, "th");
    for (const BlockCost& b : c.candidates) {
      const bool on = std::find(c.modules.begin(), c.modules.end(), b.name) != c.modules.end();
      h << table_row({b.name, format_bytes(static_cast<int64_t>(b.saved_bytes_per_sample)),
                      format_seconds(b.forward_seconds_per_sample), on ? "yes" : "no"});
    }
    h << "</table>\n";
  }
  if (in.plan && in.plan->checkpoint_choice) {  // 1.8: every set "auto" weighed, the chosen one marked
    const CheckpointChoiceRecord& r = *in.plan->checkpoint_choice;
    h << "<h2>Checkpoint sets considered</h2>\n<p>" << xml_escape(describe_choice(r)) << "</p>\n<table>\n"
      << table_row({"set", "microbatch", "accumulation", "predicted peak", "predicted seconds per window", "chosen"}, "th");
    for (const CheckpointOption& o : r.options) {
      const bool fits = o.micro_batch > 0;
      h << table_row({o.rule, fits ? std::to_string(o.micro_batch) : "none fits",
                      fits ? std::to_string(o.accumulation_steps) : "-", fits ? format_bytes(o.predicted_peak_bytes) : "-",
                      fits ? format_seconds(o.predicted_seconds_per_window) : "-", o.rule == r.chosen ? "yes" : ""});
    }
    h << "</table>\n";
  }
  if (in.plan && in.plan->sharding) {  // 1.9: each rank's share of the optimizer state
    const Sharding& sh = *in.plan->sharding;
    h << "<h2>Optimizer state sharded over " << sh.world_size << " ranks (ZeRO-1)</h2>\n<p>The windows held rank "
      << sh.measured_rank << "'s share, the largest; " << format_bytes(freed_state_bytes(sh))
      << " of the state stays free on it. Unsharded, the same line gives a microbatch of "
      << (sh.unsharded_micro_batch.value_or(0) > 0 ? std::to_string(*sh.unsharded_micro_batch) : std::string("none"))
      << " (predicted).</p>\n<table>\n" << table_row({"rank", "optimizer state", "the windows held it"}, "th");
    for (size_t r = 0; r < sh.per_rank_state_bytes.size(); ++r) {
      h << table_row({std::to_string(r), format_bytes(sh.per_rank_state_bytes[r]),
                      static_cast<int64_t>(r) == sh.measured_rank ? "yes" : ""});
    }
    h << "</table>\n";
  }
  if (in.plan && !in.plan->ranks.empty()) h << ranks_section(*in.plan);
  const ChartData d = chart_data(in);
  h << "<h2>Measured windows</h2>\n<table>\n"
    << table_row({"microbatch", d.reserved ? "reserved peak" : "peak", "fitted", "residual", "first microbatch peak",
                  "optimizer step peak", "step seconds"},
                 "th");
  for (const auto& p : in.profile.points) {
    const int64_t bytes = point_bytes(p, d.reserved);
    std::string fitted = "-", residual = "-";
    if (d.model) {
      const double f = d.model->predict_bytes(p.micro_batch);
      fitted = format_bytes(static_cast<int64_t>(std::llround(f)));
      residual = format_bytes(static_cast<int64_t>(std::llround(static_cast<double>(bytes) - f)));
    }
    h << table_row({std::to_string(p.micro_batch), format_bytes(bytes), fitted, residual,
                    p.first_microbatch_peak_bytes ? format_bytes(*p.first_microbatch_peak_bytes) : "-",
                    p.optimizer_step_peak_bytes ? format_bytes(*p.optimizer_step_peak_bytes) : "-",
                    p.step_seconds ? format_seconds(*p.step_seconds) : "-"});
  }
  h << "</table>\n<h2>Every real step taken</h2>\n<table>\n"
    << table_row({"kind", "microbatch", "fit", "peak", "seconds"}, "th");
  for (const auto& t : in.profile.trials) {
    h << table_row({t.kind, std::to_string(t.micro_batch), t.fit ? "yes" : "out of memory",
                    t.fit ? format_bytes(t.peak_bytes) : "-", format_seconds(t.seconds)});
  }
  h << "</table>\n";
  if (in.stats && !in.stats->series.empty() && in.stats->series.size() <= 400) {
    h << "<h2>The run, window by window</h2>\n<table>\n"
      << table_row({"window", "samples", "loss", "peak", "OOM recoveries", "re-plans", "seconds"}, "th");
    for (const RunWindowRecord& r : in.stats->series) {
      char loss[48] = "-";
      if (r.loss) std::snprintf(loss, sizeof loss, "%.6g", *r.loss);
      h << table_row({std::to_string(r.window + 1), std::to_string(r.samples), loss,
                      r.peak_bytes ? format_bytes(*r.peak_bytes) : "-", std::to_string(r.oom_recoveries),
                      std::to_string(r.replans.value_or(0)), format_seconds(r.seconds.value_or(0.0))});
    }
    h << "</table>\n";
  }
  h << "</body>\n</html>\n";
  return h.str();
}

std::string render_report(const ReportInput& input, const std::string& format) {
  return check_report_format(format) == "svg" ? render_report_svg(input) : render_report_html(input);
}

}  // namespace accumplan
