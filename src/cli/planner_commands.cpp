// cli/planner_commands.cpp — `accumplan plan`, `accumplan export` and `accumplan report`:
// torch-free commands that turn a profile into a plan, a plan into trainer settings, and either
// (with a run's stats) into a picture, without touching a device.
#include <CLI/CLI.hpp>

#include <iostream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "accumplan/errors.h"
#include "accumplan/exporters.h"
#include "accumplan/json_io.h"
#include "accumplan/ranks.h"
#include "accumplan/report.h"
#include "accumplan/schema.h"
#include "accumplan/search.h"
#include "accumplan/solver.h"
#include "accumplan/units.h"
#include "cli/commands.h"
#include "cli/plan_options.h"
#include "cli/choice.h"

namespace accumplan::cli {
namespace {

struct PlanArgs {
  std::vector<std::string> profiles;
  std::string budget;
  PlanOptionArgs plan;
  std::string out;
};

struct ExportArgs {
  std::string plan;
  std::string to;
  std::string out;
  std::string binary = "accumplan";
  bool allow_slow = false;
  bool allow_lossy = false;
  std::string lightning_datamodule;
};

struct ReportArgs {
  std::string input;
  std::string stats;
  std::string out;
  std::string format;  // "": the --out name's extension decides
};

}  // namespace

void add_planner_commands(CLI::App& root, std::vector<Command>& commands) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* plan = root.add_subcommand(
      "plan", "Plan from a saved profile (no device needed): microbatch, accumulation, weights.");
  plan->add_option("--profile", args->profiles,
                   "profile.json written by `accumplan profile`; give it once per rank (each profiled on its own "
                   "device and threads, with --world-size W) to plan ranks that differ in speed")
      ->required();
  add_plan_options(plan, args->plan, "Plan");
  add_memory_budget_option(plan, args->budget, "device memory to plan for",
                           "default: the profiled device's total; one per rank, comma-separated (24GiB,80GiB), to plan "
                           "ranks that differ in memory",
                           "Plan");
  plan->add_option("--out", args->out, "write plan.json here (atomically); default stdout");

  commands.push_back({plan, [args, plan]() {
                        std::vector<InputOption> inputs;
                        for (const std::string& path : args->profiles) inputs.push_back({"--profile", path});
                        check_outputs({output_option(plan, "--out", args->out, true)}, inputs);
                        std::vector<Profile> profiles;
                        for (const std::string& path : args->profiles) profiles.push_back(read_profile_file(path, "--profile"));
                        PlanRequest req = plan_request_from(args->plan);
                        const std::vector<BudgetSpec> budgets =
                            parse_rank_budgets(args->budget, req.world_size, "--memory-budget");
                        req.budget = budgets.front();
                        // Ranks that differ: a profile or a budget per rank.
                        Plan p = profiles.size() > 1 || budgets.size() > 1 ? plan_ranks(profiles, budgets, req)
                                                                           : make_plan(profiles.front(), req);
                        p.eval = eval_from_profile(p);  // 1.7: from the profile's eval window, if it ran one
                        // Written first: a bad --out is then one error line, not a summary of a
                        // plan that was never saved followed by the error.
                        emit_output(args->out, json_text(to_json(p)));
                        std::cerr << describe_plan(p);
                        return 0;
                      }});

  auto eargs = std::make_shared<ExportArgs>();
  CLI::App* exp = root.add_subcommand(
      "export", "Render a plan as trainer settings (DeepSpeed, Accelerate, Lightning, HF Trainer, torchrun).");
  exp->add_option("--plan", eargs->plan, "plan.json")->required();
  std::string targets;
  for (const std::string& t : export_targets()) targets += (targets.empty() ? "" : " | ") + t;
  choice(exp->add_option("--to", eargs->to, targets))->required();
  exp->add_option("--out", eargs->out, "write here (atomically); default stdout");
  exp->add_flag("--allow-slow", eargs->allow_slow,
                "export the trainer's equal-microbatch split even when it is predicted more than 25% slower "
                "per window than the plan (otherwise exit 2 naming target batches that split evenly)");
  exp->add_flag("--allow-lossy", eargs->allow_lossy,
                "write the export even when the trainer cannot carry every value of the plan's optimizer "
                "(parameter groups with different values: the first group's are written); the loss is named "
                "inside the file (otherwise exit 2 naming the value)");
  exp->add_option("--binary", eargs->binary, "the accumplan the torchrun line launches")->capture_default_str();
  exp->add_option("--lightning-datamodule", eargs->lightning_datamodule,
                  "lightning: your LightningDataModule's class path (my_project.data.TextDataModule); the "
                  "batch size then goes to data: class_path/init_args, as LightningCLI's subclass mode reads it");
  commands.push_back({exp, [eargs, exp]() {
                        check_lightning_datamodule(eargs->lightning_datamodule);  // before reading anything
                        check_outputs({output_option(exp, "--out", eargs->out, true)}, {{"--plan", eargs->plan}});
                        const Plan p = read_plan_file(eargs->plan, "--plan");
                        std::string note;
                        ExportOptions options;
                        options.plan_path = eargs->plan;
                        options.binary = eargs->binary;
                        options.allow_slow = eargs->allow_slow;
                        options.allow_lossy = eargs->allow_lossy;
                        options.lightning_datamodule = eargs->lightning_datamodule;
                        const std::string text = export_plan(p, eargs->to, &note, options);
                        emit_output(eargs->out, text);
                        // After the file is written: a note must not precede a refusal.
                        std::istringstream notes(note);
                        for (std::string line; std::getline(notes, line);) std::cerr << "accumplan: note: " << line << "\n";
                        return 0;
                      }});

  auto rargs = std::make_shared<ReportArgs>();
  CLI::App* rep = root.add_subcommand(
      "report", "Draw a plan or profile (and a run's stats) as one self-contained HTML or SVG file: memory against "
                "microbatch size, the fitted line, budget, planned size, and the breakdown at the planned size.");
  rep->add_option("input", rargs->input, "plan.json or profile.json")->required();
  rep->add_option("--stats", rargs->stats, "run statistics from `accumplan run --stats`: the run's peak and OOM recoveries");
  rep->add_option("--out", rargs->out, "write the report here (atomically); - for stdout")->required();
  choice(rep->add_option("--format", rargs->format, "html | svg (default: what --out's extension names, else html)"));
  commands.push_back({rep, [rargs, rep]() {
                        // Given empty, --format is refused as any other word (absent: --out's extension decides).
                        if (rep->count("--format") > 0) check_report_format(rargs->format, "--format");
                        const std::string format = report_format_for(rargs->format, rargs->out);
                        check_outputs({output_option(rep, "--out", rargs->out)},
                                      {{"report input", rargs->input}, {"--stats", rargs->stats}});
                        ReportInput in = read_report_input(rargs->input, "report input");
                        if (!rargs->stats.empty()) {
                          in.stats = read_run_stats_file(rargs->stats, "--stats");
                          if (in.plan) check_stats_of_plan(*in.plan, *in.stats);
                        }
                        emit_output(rargs->out, render_report(in, format));
                        return 0;
                      }});
}

}  // namespace accumplan::cli
