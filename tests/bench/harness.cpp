// bench/harness.cpp — accumplan against ground truth and the peers' searches, on real models.
//
// What it is: for every model of examples/models/manifest.json (written by
// examples/export_models.py) and two CPU memory budgets per model, in one process:
//   accumplan   profile + plan + confirm + climb, as `accumplan --model` does: real trials, wall
//               seconds, chosen microbatch, predicted peak, the margin;
//   truth       the largest microbatch that really fits the per-rank batch's windows: [T] as one
//               microbatch, else two-microbatch trials (doubling, then bisection) → utilisation;
//   peers       Lightning power/binsearch, Accelerate (x0.9 and legacy x0.5), Composer halving,
//               DeepSpeed autotuning (peer_strategies.h) over the same oracle;
//   overhead    executor vs a hand-written LibTorch accumulation loop (interleaved A/B windows).
//   run         the plan trained by the real binary, `accumplan run --steps 2` under the same
//               budget: the peak training reaches is the truth the prediction is judged by;
//   long run    the plan's largest window trained for 50 windows by `accumplan run`: the plan
//               itself when it is one microbatch, else the same profile planned for a per-rank
//               batch of twice its largest size (every window two microbatches of it), with its
//               OOM recoveries.
// Every trial of every strategy is the same unit of real work: ProbeRunner::measure(b), an
// executor window of two accumulated microbatches of b samples and its optimizer step (the
// training window `accumplan run` executes) — so trial counts compare search strategies, not
// loop details, and "fits" means "a training window fits". Budgets are placed per model from an unbudgeted pre-profile so
// the true maximum lands near `--small` and `--large` samples; that pre-profile is setup and is
// not charged to anyone.
// Progress: one updating line on a terminal (the probe in progress, then the cases done with
// elapsed time and ETA), plain lines in a log (`--progress`, observe/progress.h).
// What it is not: a unit test. Figures are measurements of one run on one machine; compare the
// ratios, not the absolute seconds.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "accumplan/build_config.h"
#include "accumplan/errors.h"
#include "accumplan/json_io.h"
#include "accumplan/memory_model.h"
#include "accumplan/memory_probe.h"
#include "accumplan/units.h"
#include "bench_overhead.h"
#include "cli/progress_option.h"
#include "observe/progress.h"
#include "peer_strategies.h"
#include "accumplan/schema.h"
#include "profiling/probe_runner.h"

using nlohmann::ordered_json;
namespace ap = accumplan;

namespace {

// The harness's one progress display (made in main): phases as messages, probes as steps,
// finished cases as the bar's updates.
std::shared_ptr<ap::Progress> g_progress;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

ap::RunnerOptions runner_options(const nlohmann::json& m, int64_t max_micro_batch) {
  ap::RunnerOptions o;
  o.model = m["model"].get<std::string>();
  o.setup.optimizer = m["optimizer"].get<std::string>();
  o.setup.lr = 0.01;
  o.setup.loss = m["loss"].get<std::string>();
  o.setup.inputs = m["inputs"].get<std::vector<std::string>>();
  o.setup.target = m["target"].get<std::string>();
  o.device = "cpu";
  o.max_probe_micro_batch = max_micro_batch;
  return o;
}

struct BudgetCase {
  std::string label;
  int64_t budget_bytes;
};

// Budgets at which about `small` and `large` samples fit by an unbudgeted profile's line:
// budget = intercept + slope*(n + 0.5).
std::vector<BudgetCase> place_budgets(const nlohmann::json& m, int64_t small, int64_t large, int64_t T) {
  auto probe = ap::make_memory_probe(ap::ProbeRequest{});
  // Unbudgeted, the line predicts the machine's whole memory; capping the probes near `large`
  // keeps this setup step from training vgg11 at hundreds of samples.
  ap::ProbeRunner runner(*probe, runner_options(m, std::min(T, 2 * large)));
  const ap::Profile profile = runner.profile();
  const ap::MemoryModel model = ap::MemoryModel::fit(profile);
  std::vector<BudgetCase> out;
  for (int64_t n : {small, large}) {
    const double bytes = model.summary().intercept_bytes + model.summary().slope_bytes_per_sample * (n + 0.5);
    // Whole KiB: MiB steps are too coarse for small models (builtin:mlp is about 1 MiB in all).
    const int64_t kib = static_cast<int64_t>(std::ceil(bytes / 1024));
    out.push_back({ap::format_bytes(kib << 10), kib << 10});
  }
  return out;
}

ordered_json search_json(const ap::bench::SearchResult& r) {
  return ordered_json{{"strategy", r.strategy}, {"micro_batch", r.micro_batch}, {"trials", r.trials},
                      {"steps", r.steps},       {"ooms", r.ooms},               {"seconds", r.seconds},
                      {"tried", r.tried}};
}

// The plan trained by the real binary for two windows under the budget; the run's stats JSON.
// Two, because the first window runs before the optimizer's first step: Adam's state (7.1 MiB on
// gpt_decoder) is not there yet, and a one-window run peaked that much below training's steady
// state. The second window is the steady state every later one repeats.
nlohmann::json run_plan(const std::string& accumplan, const ap::Plan& plan, const std::string& model,
                        int64_t budget_bytes, const std::string& scratch, int64_t windows = 2) {
  const std::string plan_path = scratch + "/plan.json", stats_path = scratch + "/stats.json";
  ap::write_text_atomic(plan_path, ap::to_json(plan).dump(2) + "\n");
  std::remove(stats_path.c_str());
  const std::string cmd = "'" + accumplan + "' run --plan '" + plan_path + "' --model '" + model +
                          "' --memory-budget " + std::to_string(budget_bytes) + " --steps " + std::to_string(windows) + " --stats '" + stats_path +
                          "' 2>'" + scratch + "/run.log'";
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    throw ap::Error("accumplan run of the plan failed (" + std::to_string(rc) + "): see " + scratch + "/run.log");
  }
  return ap::read_json_file(stats_path, "run stats");
}

// What `accumplan --model` plans under the case's budget: memory alone, the given headroom.
ap::PlanRequest plan_request(int64_t T, const BudgetCase& budget, const std::string& headroom) {
  ap::PlanRequest req;
  req.target_batch = T;
  req.budget.bytes = budget.budget_bytes;
  req.headroom = ap::parse_headroom(headroom);
  // Memory alone, as `accumplan` plans by default: every planned microbatch is the balanced split
  // of max_micro_batch.
  req.use_timing = false;
  return req;
}

// The row's "accumplan" object: the plan's sizes, prediction and margin, and its search's trials.
ordered_json accumplan_json(const ap::Plan& plan, const ap::Profile& profile, double plan_seconds) {
  const int64_t plan_trials = static_cast<int64_t>(profile.trials.size());
  const int64_t plan_ooms = std::count_if(profile.trials.begin(), profile.trials.end(),
                                          [](const ap::Trial& t) { return !t.fit; });
  const ap::Margin& margin = plan.memory.margin;
  return ordered_json{{"micro_batch", plan.micro_batch},
                      {"max_micro_batch", plan.max_micro_batch},
                      {"accumulation_steps", plan.accumulation_steps},
                      {"predicted_peak_bytes", plan.memory.predicted_peak_bytes},
                      {"margin_bytes", plan.memory.margin_bytes},
                      {"margin", ordered_json{{"headroom", margin.headroom},
                                              {"fit_residual_bytes", margin.fit_residual_bytes},
                                              {"activation_bytes", margin.activation_bytes},
                                              {"allocator_fragmentation_bytes", margin.allocator_fragmentation_bytes},
                                              {"fixed_bytes", margin.fixed_bytes},
                                              {"measured", margin.measured}}},
                      {"confirmed", plan.confirmed},
                      {"trial_sizes", [&] {
                         ordered_json a = ordered_json::array();
                         for (const auto& t : profile.trials) {
                           a.push_back(ordered_json{{"kind", t.kind}, {"window", t.window}, {"fit", t.fit}});
                         }
                         return a;
                       }()},
                      {"trials", plan_trials},
                      {"ooms", plan_ooms},
                      {"seconds", plan_seconds},
                      {"probe_sizes", [&] {
                         std::vector<int64_t> s;
                         for (const auto& p : profile.points) s.push_back(p.micro_batch);
                         return s;
                       }()}};
}

// The largest microbatch the per-rank batch T really fits (0: none), searched from the plan's largest.
int64_t true_max_micro_batch(ap::ProbeRunner& runner, const ap::bench::Oracle& oracle, int64_t plan_max, int64_t T) {
  // Ground truth: the largest microbatch the per-rank batch T can use. T itself is a window of
  // ONE microbatch (no gradient resident while it runs: vgg11 at 1.4 GiB fits [24] in one but
  // only 4 in a window of two); any smaller size is a window of two or more, whose second
  // microbatch runs with the first's gradients resident. So [T] is tried first, then the largest
  // b < T whose two-microbatch trial fits (monotone in b): doubling from the plan's size, then
  // bisection, exact either way.
  int64_t lo = 0, hi = T;  // lo fits (0: nothing does), hi does not (T: not tried as two)
  if (runner.measure_window({T}).fit) {
    lo = T;
  } else if (T > 1) {
    const int64_t start = std::max<int64_t>(1, std::min<int64_t>(plan_max, T - 1));
    if (oracle(start, 1).fit) lo = start; else hi = start;
    while (hi == T && lo < T - 1) {
      const int64_t b = std::min<int64_t>(T - 1, std::max<int64_t>(1, lo * 2));
      if (oracle(b, 1).fit) lo = b; else hi = b;
    }
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (oracle(mid, 1).fit) lo = mid; else hi = mid;
    }
  }
  return lo;
}

// The row's "long_run" object: the plan's largest window trained `long_windows` times by `accumplan run`.
ordered_json long_run_json(const std::string& accumplan, const ap::Plan& plan, const ap::Profile& profile,
                           const ap::PlanRequest& req, const std::string& model, int64_t budget_bytes,
                           const std::string& scratch, int64_t long_windows) {
  // The plan's largest window: the plan itself when it is one microbatch ([T]); else two
  // microbatches of its largest size, bounded so the solver cannot merge them into one [2m]
  // (the first-microbatch line may allow that, and it is not the window being tested).
  ap::Plan plan2 = plan;
  if (plan.accumulation_steps > 1) {
    ap::PlanRequest r2 = req;
    r2.target_batch = 2 * plan.max_micro_batch;
    r2.max_micro_batch = plan.max_micro_batch;
    plan2 = ap::make_plan(profile, r2);
  }
  const nlohmann::json lr = run_plan(accumplan, plan2, model, budget_bytes, scratch, long_windows);
  return ordered_json{{"microbatch_sizes", plan2.microbatch_sizes},
                      {"confirmed", plan2.confirmed},
                      {"windows", lr["windows"]},
                      {"measured_peak_bytes", lr["measured_peak_bytes"]},
                      {"predicted_peak_bytes", plan2.memory.predicted_peak_bytes},
                      {"oom_recoveries", lr["oom_recoveries"]},
                      {"replans", lr.value("replans", nlohmann::json(nullptr))}};
}

// The row's "truth" object: the true largest microbatch, the run's peak, the error and the utilisation.
ordered_json truth_json(const ap::Plan& plan, int64_t T, int64_t lo, int64_t run_peak, double error) {
  return ordered_json{{"max_micro_batch", lo},
                      {"run_peak_bytes", run_peak},
                      {"prediction_error_percent", error},
                      // The largest microbatch the plan allows over what fits; and the
                      // largest of the balanced split (ceil(T / k): the same k, so the
                      // same number of microbatches) over what fits.
                      {"utilisation", lo > 0 ? static_cast<double>(plan.max_micro_batch) / static_cast<double>(lo) : 0.0},
                      {"utilisation_split", lo > 0 ? static_cast<double>(plan.micro_batch) / static_cast<double>(lo) : 0.0},
                      {"best_accumulation_steps", lo > 0 ? (T + lo - 1) / lo : 0}};
}

// The row's "peers" array: every peer's search over the same oracle, in a fixed order.
ordered_json peer_searches(const ap::bench::Oracle& oracle, int64_t T, int64_t budget_bytes, int64_t state_bytes) {
  ordered_json peers = ordered_json::array();
  peers.push_back(search_json(ap::bench::lightning_power(oracle, T)));
  peers.push_back(search_json(ap::bench::lightning_binsearch(oracle, T)));
  // Accelerate starts at 128, or at the per-rank batch when that is smaller: nobody asks for a
  // microbatch larger than the batch they need.
  const int64_t accelerate_start = std::min<int64_t>(128, T);
  peers.push_back(search_json(ap::bench::accelerate_find_executable(oracle, accelerate_start)));
  peers.push_back(search_json(ap::bench::accelerate_find_executable(oracle, accelerate_start, true)));
  peers.push_back(search_json(ap::bench::composer_auto_microbatch(oracle, T)));
  peers.push_back(search_json(ap::bench::deepspeed_autotune(oracle, budget_bytes, state_bytes, T)));
  return peers;
}

// One row of results.json: accumplan's plan of model `m` under `budget`, its truth, long run and peers.
ordered_json run_case(const nlohmann::json& m, const BudgetCase& budget, int64_t T, const std::string& headroom,
                      const std::string& accumplan, const std::string& scratch, int64_t long_windows) {
  auto probe = ap::make_memory_probe(ap::ProbeRequest{"cpu", "auto", budget.budget_bytes});
  ap::RunnerOptions opts = runner_options(m, T);
  opts.budget.bytes = budget.budget_bytes;
  opts.progress = [](const std::string& line) { g_progress->step("    " + line); };
  ap::ProbeRunner runner(*probe, opts);
  ordered_json row;
  row["model"] = m["name"];
  row["target_batch"] = T;
  row["budget"] = budget.label;
  row["budget_bytes"] = budget.budget_bytes;
  row["persistent_bytes"] = runner.persistent().total();

  // accumplan: profile + plan + confirm + climb.
  auto t0 = std::chrono::steady_clock::now();
  ap::Profile profile = runner.profile();
  const ap::PlanRequest req = plan_request(T, budget, headroom);
  const ap::Plan plan = runner.plan_and_confirm(profile, req);
  const double plan_seconds = seconds_since(t0);
  row["accumplan"] = accumplan_json(plan, profile, plan_seconds);

  // Oracle shared by the truth search and the peers: one real steady-state trial.
  ap::bench::Oracle oracle = [&](int64_t b, int) {
    const ap::WindowMeasurement s = runner.measure(b);
    return ap::bench::StepOutcome{s.fit, s.peak_bytes};
  };

  // Prediction error at the chosen plan: the plan's predicted peak against the peak that
  // `accumplan run` of that plan reaches under the same budget (a separate process: nothing of
  // this harness's measuring is shared with it but the executor that training is).
  const std::string model = m["model"].get<std::string>();
  const nlohmann::json run = run_plan(accumplan, plan, model, budget.budget_bytes, scratch);
  const int64_t run_peak = run["measured_peak_bytes"].is_number() ? run["measured_peak_bytes"].get<int64_t>() : 0;
  const double error = run_peak > 0 ? 100.0 * static_cast<double>(plan.memory.predicted_peak_bytes - run_peak) /
                                          static_cast<double>(run_peak)
                                    : NAN;
  const int64_t lo = true_max_micro_batch(runner, oracle, plan.max_micro_batch, T);
  // The plan's largest microbatch for `long_windows` windows: the same profile, budget and margin
  // planned for a per-rank batch of two of it, so every window is the plan's largest.
  ordered_json long_run = nullptr;
  if (long_windows > 0) {
    long_run = long_run_json(accumplan, plan, profile, req, model, budget.budget_bytes, scratch, long_windows);
  }
  row["long_run"] = long_run;
  row["run"] = ordered_json{{"windows", run["windows"]},
                            {"measured_peak_bytes", run_peak},
                            {"oom_recoveries", run["oom_recoveries"]},
                            {"microbatch_sizes", run["microbatch_sizes"]},
                            {"mean_window_seconds", run["mean_window_seconds"]}};
  row["truth"] = truth_json(plan, T, lo, run_peak, error);
  row["peers"] = peer_searches(oracle, T, budget.budget_bytes, runner.persistent().total());
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"accumplan benchmark harness: prediction error, search cost against peers, executor overhead"};
  std::string manifest_path = "examples/models/manifest.json", out_path = "tests/bench/results.json";
  std::vector<std::string> only;
  int64_t target = 512, small = 12, large = 40;
  std::string headroom = "auto";
  int64_t long_windows = 50;
  int overhead_models = 3, overhead_rounds = 6;
  bool quick = false;
  std::string accumplan = ACCUMPLAN_BIN, scratch = "build/bench-scratch", progress_mode = "auto";
  app.add_option("--manifest", manifest_path, "models to run (examples/export_models.py writes it)")->capture_default_str();
  app.add_option("--out", out_path, "results JSON (written atomically)")->capture_default_str();
  app.add_option("--models", only, "only these model names");
  app.add_option("--target-batch", target, "per-rank target batch T (caps every search)")->capture_default_str();
  app.add_option("--small", small, "place the first budget so about this many samples fit")->capture_default_str();
  app.add_option("--large", large, "place the second budget so about this many samples fit")->capture_default_str();
  app.add_option("--headroom", headroom, "accumplan's --headroom")->capture_default_str();
  app.add_option("--long-windows", long_windows, "windows of the long run of each plan's largest microbatch (0: none)")
      ->capture_default_str();
  app.add_option("--overhead-models", overhead_models, "models for the executor-overhead A/B")->capture_default_str();
  app.add_option("--overhead-rounds", overhead_rounds, "interleaved A/B rounds per model")->capture_default_str();
  app.add_flag("--quick", quick, "smoke mode: first model, one budget, 2 overhead rounds");
  app.add_option("--accumplan", accumplan, "the accumplan binary whose `run` is the prediction's truth")->capture_default_str();
  app.add_option("--scratch", scratch, "folder for the plans and stats of those runs")->capture_default_str();
  ap::add_progress_option(&app, progress_mode);
  CLI11_PARSE(app, argc, argv);

  try {
    const nlohmann::json manifest = ap::read_json_file(manifest_path, "--manifest");
    ordered_json results;
    results["schema"] = "accumplan.bench";
    results["schema_version"] = "1.0";
    results["build"] = ap::build_summary();
    results["threads"] = at::get_num_threads();
    results["target_batch"] = target;
    results["headroom"] = headroom;
    results["rows"] = ordered_json::array();
    results["overhead"] = ordered_json::array();
    results["failures"] = ordered_json::array();
    const auto t_all = std::chrono::steady_clock::now();
    // Cases to run: two budgets per model (one with --quick, which runs the first model only).
    int64_t cases = 0;
    for (const auto& m : manifest["models"]) {
      if (!only.empty() && std::find(only.begin(), only.end(), m["name"].get<std::string>()) == only.end()) continue;
      cases += quick ? 1 : 2;
      if (quick) break;
    }
    g_progress = ap::make_stderr_progress(progress_mode, "case", cases, "");
    int64_t cases_done = 0;
    int done = 0;
    for (const auto& m : manifest["models"]) {
      const std::string name = m["name"];
      if (!only.empty() && std::find(only.begin(), only.end(), name) == only.end()) continue;
      if (quick && done > 0) break;
      // A model may cap its own searches: vgg11 spends about 0.4 s per sample per trial on this CPU,
      // so searching it up to 512 samples would take most of the half hour the run is allowed.
      const int64_t T = m.value("bench_target_batch", target);
      const int64_t m_small = m.value("bench_small", small), m_large = m.value("bench_large", large);
      g_progress->message("[" + std::to_string(static_cast<int>(seconds_since(t_all))) + " s] " + name + ": placing budgets");
      auto budgets = place_budgets(m, m_small, m_large, T);
      if (quick) budgets.resize(1);
      for (const auto& b : budgets) {
        g_progress->message("[" + std::to_string(static_cast<int>(seconds_since(t_all))) + " s] " + name + " @ " + b.label);
        try {
          std::filesystem::create_directories(scratch);
          results["rows"].push_back(run_case(m, b, T, headroom, accumplan, scratch, quick ? 3 : long_windows));
        } catch (const std::exception& e) {
          // One model's failure is a finding to report, not a reason to lose the other rows.
          g_progress->message(std::string("  failed: ") + e.what());
          results["failures"].push_back(ordered_json{{"model", name}, {"budget", b.label}, {"error", e.what()}});
        }
        g_progress->update(++cases_done, 0, name + " @ " + b.label);
      }
      if (done < overhead_models) {
        g_progress->message("[" + std::to_string(static_cast<int>(seconds_since(t_all))) + " s] " + name + ": executor overhead");
        results["overhead"].push_back(accumplan::bench::executor_overhead(m, quick ? 2 : overhead_rounds));
      }
      ++done;
      // Rows so far, in case a later model takes the process down.
      results["wall_seconds"] = seconds_since(t_all);
      ap::write_text_atomic(out_path, results.dump(2) + "\n");
    }
    results["wall_seconds"] = seconds_since(t_all);
    ap::write_text_atomic(out_path, results.dump(2) + "\n");
    g_progress->finish();
    std::cerr << "wrote " << out_path << " (" << static_cast<int>(seconds_since(t_all)) << " s)\n";
    return 0;
  } catch (const ap::Error& e) {
    if (g_progress) g_progress->finish();
    std::cerr << "accumplan_bench: error: " << e.what() << "\n";
    return e.exit_code();
  } catch (const std::exception& e) {
    if (g_progress) g_progress->finish();
    std::cerr << "accumplan_bench: error: " << e.what() << "\n";
    return 1;
  }
}
