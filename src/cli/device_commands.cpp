// cli/device_commands.cpp — the commands that run a model on a device: the root job
// (`accumplan --model m.pt --target-batch N`: profile, plan, confirm) and `accumplan profile`
// (measure only, for `accumplan plan` to re-plan later without the device).
//
// What it is: flag parsing into a Setup and RunnerOptions, the probe from make_memory_probe, the
// ProbeRunner, and output (JSON to --out or stdout, a human summary and progress on stderr).
// What it is not: the measuring itself (profiler/runner/) or the executor's `run`/`verify`
// (executor_commands.cpp).
#include <CLI/CLI.hpp>

#include <ATen/Parallel.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "accumplan/checked.h"
#include "accumplan/errors.h"
#include "accumplan/json_io.h"
#include "accumplan/tensor_spec.h"
#include "accumplan/memory_probe.h"
#include "accumplan/ranks.h"
#include "accumplan/report.h"
#include "accumplan/schema.h"
#include "accumplan/setup_rules.h"
#include "accumplan/sharding.h"
#include "accumplan/solver.h"
#include "accumplan/units.h"
#include "cli/commands.h"
#include "runtime/host_data.h"
#include "cli/plan_options.h"
#include "cli/progress_option.h"
#include "observe/progress.h"
#include "profiling/probe_runner.h"
#include "runtime/amp.h"
#include "runtime/model.h"
#include "cli/choice.h"

namespace accumplan::cli {
namespace {

struct DeviceArgs {
  std::string model;
  std::vector<std::string> inputs;
  std::string target;
  std::string batch_file;
  std::string loss;
  std::string normalization = "auto";
  int64_t ignore_index = -100;
  std::string optimizer = "sgd";
  std::string shard = "off";  // --shard: off | optimizer (ZeRO-1 over --world-size ranks)
  double lr = 0;
  CLI::Option* lr_option = nullptr;
  CLI::Option* loss_option = nullptr;    // given '' is refused, not taken for the default
  CLI::Option* device_option = nullptr;
  std::map<std::string, double> hyper;  // filled from the options below when given
  double momentum = 0, weight_decay = 0, beta1 = 0, beta2 = 0, eps = 0, alpha = 0;
  std::vector<CLI::Option*> hyper_options;
  std::string amp = "none";
  double max_grad_norm = 0;
  CLI::Option* max_grad_norm_option = nullptr;
  std::string device;
  std::string probe = "auto";
  std::string budget;
  int threads = 0;
  std::string probe_sizes = "2,4";
  std::string progress = "auto";  // --progress (observe/progress.h)
  uint64_t seed = 1234;
  // planning (root job)
  PlanOptionArgs plan;
  std::string out;
  std::string report;  // --report: the plan's picture (accumplan/report.h)
  std::string seq_len;        // --seq-len: variable-length data
  std::string seq_len_file;   // --seq-len-file: observed lengths, their range planned for
  bool padding_mask = false;  // --padding-mask
  bool no_eval = false;           // --no-eval: no evaluation batch in the plan
  bool eval_keep_outputs = false; // --eval-keep-outputs: the eval batch counts outputs kept per microbatch
  std::string checkpointing = "off";  // --checkpointing: only off for a TorchScript model
};

// "0.9 for momentum; 0 for rmsprop": the optimizers that take `key` ("lr": all) grouped by the
// default an absent value means, from the one optimizer table.
std::string defaults_help(const std::string& key) {
  std::vector<std::pair<std::string, std::string>> groups;  // default -> the optimizers, in table order
  for (const OptimizerInfo& row : optimizer_table()) {
    std::optional<double> value;
    if (key == "lr") value = row.default_lr;
    for (const OptimizerHyperparameter& h : row.hyperparameters) {
      if (h.name == key) value = h.plan_default;
    }
    if (!value) continue;
    const std::string text = number_text(*value);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == text; });
    if (it == groups.end()) it = groups.insert(groups.end(), {text, ""});
    it->second += (it->second.empty() ? "" : ", ") + row.name;
  }
  std::string help;
  for (const auto& [value, names] : groups) help += (help.empty() ? "" : "; ") + value + " for " + names;
  return help;
}

void add_setup_options(CLI::App* app, DeviceArgs& a) {
  add_progress_option(app, a.progress);
  const std::string model_group = "Model and data";
  app->add_option("--model", a.model,
                  "TorchScript file (torch.jit.script(model).save(path)) or a built-in example: "
                  "builtin:mlp, builtin:convnet, builtin:tinylm")
      ->group(model_group);
  app->add_option("--input", a.inputs,
                  "one per forward argument, B = the microbatch dimension: float32[B,3,224,224], "
                  "int64[B,128]:50257 (integers in [0, 50257)). Built-ins have defaults")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->group(model_group);
  app->add_option("--target", a.target, "the target: int64[B]:1000 (class indices), float32[B,10] (class probabilities with "
                  "cross_entropy, each row summing to 1; values with mse)")->group(model_group);
  app->add_option("--batch-file", a.batch_file,
                  "real samples instead of specs: Python's torch.save([inputs..., target], f), dim 0 = "
                  "samples, tiled to any microbatch; or ragged token data, torch.save([list_of_1d_tensors, "
                  "list_of_targets_or_None], f) (None: next-token targets)")
      ->group(model_group);
  app->add_option("--seq-len", a.seq_len,
                  "variable-length sequences: the lengths to plan for, e.g. 16..1024 (inputs then carry the "
                  "sequence dimension T: --input int64[B,T]:50257); the plan packs each window under a token "
                  "budget. Default with a ragged --batch-file: its shortest..longest")
      ->group(model_group);
  add_seq_len_file_option(app, a.seq_len_file,
                          "variable-length sequences, instead of --seq-len: a text file of observed lengths in tokens "
                          "(one or more per line); their shortest..longest is planned for",
                          model_group);
  app->add_flag("--padding-mask", a.padding_mask,
                "variable-length data: pass the padding mask (bool [b, T], true at padding, as "
                "src_key_padding_mask) as one more forward argument after the inputs")
      ->group(model_group);
  a.loss_option = choice(app->add_option("--loss", a.loss,
                  "cross_entropy ([B,C] or [B,T,C] logits with class indices, or [B,C] logits with a float [B,C] "
                  "target of class probabilities), mse, or model (forward takes the target last and returns the "
                  "loss); default cross_entropy"))
      ->group(model_group);
  choice(app->add_option("--normalization", a.normalization, "samples | tokens | auto (tokens for [B,T,C] cross-entropy)"))
      ->capture_default_str()
      ->group(model_group);
  app->add_option("--ignore-index", a.ignore_index, "target value cross_entropy skips")
      ->capture_default_str()
      ->group(model_group);

  const std::string opt_group = "Optimizer (its state is measured after a real step)";
  std::string names;
  for (const std::string& name : optimizer_names()) names += (names.empty() ? "" : " | ") + name;
  choice(app->add_option("--optimizer", a.optimizer, names))->capture_default_str()->group(opt_group);
  choice(app->add_option("--shard", a.shard,
                         "off | optimizer | auto: optimizer shards the optimizer state over --world-size ranks as "
                         "torch's ZeroRedundancyOptimizer partitions it (ZeRO-1), the windows holding the largest "
                         "rank's share; auto plans unsharded and searches again sharded only when the state it frees "
                         "lets a larger microbatch fit (or not one sample fits unsharded)"))
      ->capture_default_str()
      ->group(opt_group);
  a.lr_option = app->add_option("--lr", a.lr, "learning rate (" + defaults_help("lr") + ")")->group(opt_group);
  a.hyper_options = {
      app->add_option("--momentum", a.momentum, "momentum (" + defaults_help("momentum") + ")")->group(opt_group),
      app->add_option("--weight-decay", a.weight_decay, "weight decay (" + defaults_help("weight_decay") + ")")
          ->group(opt_group),
      app->add_option("--beta1", a.beta1, "beta1 (" + defaults_help("beta1") + ")")->group(opt_group),
      app->add_option("--beta2", a.beta2, "beta2 (" + defaults_help("beta2") + ")")->group(opt_group),
      app->add_option("--eps", a.eps, "epsilon (" + defaults_help("eps") + ")")->group(opt_group),
      app->add_option("--alpha", a.alpha, "smoothing constant (" + defaults_help("alpha") + ")")->group(opt_group),
  };

  const std::string train_group = "Training (measured as `accumplan run` will train)";
  choice(app->add_option("--amp", a.amp,
                  "none | bf16 | fp16: the autocast mode to measure and record in the plan; `accumplan run` "
                  "trains with it (bf16 activations take about half of float32's)"))
      ->capture_default_str()
      ->group(train_group);
  a.max_grad_norm_option =
      app->add_option("--max-grad-norm", a.max_grad_norm,
                      "clip the combined gradient of each window to this 2-norm; measured, recorded in the plan, "
                      "and `accumplan run`'s default --clip-grad-norm")
          ->group(train_group);

  const std::string dev_group = "Device";
  a.device_option =
      choice(app->add_option("--device", a.device, "cpu, cuda or cuda:N (default: cuda when available, else cpu)"))
          ->group(dev_group);
  add_memory_budget_option(app, a.budget, "device memory to stay within, enforced while measuring",
                           "on cpu this makes the CPU a simulated accelerator of that size; the main job also "
                           "takes one per rank (24MiB,64MiB with --world-size 2) to plan ranks that differ",
                           dev_group);
  choice(app->add_option("--probe", a.probe, "memory probe: auto | cpu-counting | cuda-caching-allocator | cupti"))
      ->capture_default_str()
      ->group(dev_group);
  add_threads_option(app, a.threads, dev_group);
  app->add_option("--probe-sizes", a.probe_sizes, "microbatch sizes measured first, comma-separated; then, where the fit predicts far more, one size toward the budget")
      ->capture_default_str()
      ->group(dev_group);
  app->add_option("--seed", a.seed, "seed of the synthetic inputs")->capture_default_str()->group(dev_group);
}

std::vector<int64_t> parse_sizes(const std::string& text) {
  std::vector<int64_t> sizes;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      size_t used = 0;
      const long long v = std::stoll(item, &used);
      if (used != item.size() || v < 1) throw std::invalid_argument(item);
      sizes.push_back(v);
    } catch (const std::exception&) {
      throw InputError("--probe-sizes '" + text + "': '" + item + "' is not a positive integer; e.g. 1,2,4,8");
    }
  }
  return sizes;
}

RunnerOptions runner_options(const DeviceArgs& a) {
  if (a.model.empty()) {
    throw InputError("--model is required: a TorchScript file or builtin:convnet (run `accumplan --help`)");
  }
  RunnerOptions o;
  o.model = a.model;
  Setup& s = o.setup;
  const std::optional<ModelDefaults> defaults = builtin_defaults(a.model);  // InputError for an unknown builtin
  if (!defaults) check_model_file(a.model);
  s.loss = given(a.loss_option) ? a.loss : defaults ? defaults->loss : "cross_entropy";
  s.optimizer = a.optimizer;
  o.world_size = a.plan.world_size;
  if (parse_shard_mode(a.shard, a.plan.world_size) == ShardMode::Optimizer) o.shard_world_size = a.plan.world_size;
  s.lr = a.lr_option->count() > 0 ? a.lr : optimizer_info(a.optimizer).default_lr;  // make_optimizer refuses lr < 0
  const char* names[] = {"momentum", "weight_decay", "beta1", "beta2", "eps", "alpha"};
  const double values[] = {a.momentum, a.weight_decay, a.beta1, a.beta2, a.eps, a.alpha};
  for (size_t i = 0; i < a.hyper_options.size(); ++i) {
    if (a.hyper_options[i]->count() > 0) s.hyperparameters[names[i]] = values[i];
  }
  s.normalization = a.normalization;
  // The range a plan's reader accepts (a 32-bit class index): a plan nobody could read is refused now.
  s.ignore_index = checked_in_range(a.ignore_index, int64_t{-2147483648LL}, int64_t{2147483647}, "--ignore-index");
  s.amp = to_string(parse_amp_mode(a.amp, "--amp"));
  if (a.max_grad_norm_option->count() > 0) s.max_grad_norm = a.max_grad_norm;
  if (!a.seq_len.empty() && !a.seq_len_file.empty()) {
    throw InputError("give --seq-len (a range) or --seq-len-file (observed lengths), not both");
  }
  if (!a.seq_len.empty()) s.seq_len = parse_seq_len(a.seq_len, "--seq-len");
  if (!a.seq_len_file.empty()) {
    const std::vector<int64_t> lengths = read_seq_len_file(a.seq_len_file);
    s.seq_len = SeqLenRange{*std::min_element(lengths.begin(), lengths.end()),
                            *std::max_element(lengths.begin(), lengths.end())};
    o.seq_len_source = "--seq-len-file '" + path_for_message(a.seq_len_file) + "' (lengths " + s.seq_len->text() + ")";
  }
  s.padding_mask = a.padding_mask;
  if (!a.batch_file.empty()) {
    if (!a.inputs.empty() || !a.target.empty()) {
      throw InputError("give either --batch-file or --input/--target specs, not both");
    }
    o.batch_file = a.batch_file;
  } else {
    s.inputs = a.inputs;
    s.target = a.target;
    if (defaults && s.inputs.empty()) s.inputs = defaults->inputs;
    if (defaults && s.target.empty() && s.loss == defaults->loss) s.target = defaults->target;
    if (s.inputs.empty()) {
      throw InputError("--input is required for a TorchScript file: one spec per forward argument, e.g. "
                       "--input float32[B,3,224,224] --target int64[B]:1000 (or give --batch-file)");
    }
  }
  o.device = given(a.device_option) ? a.device : (torch::cuda::is_available() ? "cuda" : "cpu");
  parse_device(o.device);  // InputError for a bad --device before anything is loaded
  // One budget for every rank; the root job plans a list of one per rank (plan_root), nothing else does.
  o.budget = parse_rank_budgets(a.budget, a.plan.world_size, "--memory-budget").front();
  o.probe_sizes = parse_sizes(a.probe_sizes);
  o.seed = a.seed;
  o.progress = [](const std::string& line) { std::cerr << "accumplan: " << line << "\n" << std::flush; };
  return o;
}

std::unique_ptr<MemoryProbe> open_probe(const DeviceArgs& a, const RunnerOptions& o) {
  apply_threads(a.threads);
  ProbeRequest req;
  req.device = o.device;
  req.backend = a.probe;
  return make_memory_probe(req);  // BackendNotBuiltError for cuda on a CPU-only build
}

// `evals`: the eval windows (plan.eval.trials), counted on their own.
std::string steps_summary(const std::vector<Trial>& trials, const std::vector<Trial>& evals = {}) {
  int probes = 0, confirms = 0;
  double seconds = 0;
  int climbs = 0, failed = 0;
  for (const auto& t : trials) {
    (t.kind == "confirm" ? confirms : t.kind == "climb" ? climbs : probes) += 1;
    failed += t.fit ? 0 : 1;
    seconds += t.seconds;
  }
  double eval_seconds = 0;
  for (const auto& t : evals) eval_seconds += t.seconds;
  std::ostringstream s;
  s << "  real windows run     " << trials.size() << " (" << probes << " probe, " << confirms << " confirm, " << climbs
    << " climb; " << failed << " did not fit) in " << format_seconds(seconds);
  if (!evals.empty()) s << ", and " << evals.size() << " eval in " << format_seconds(eval_seconds);
  s << "\n";
  return s.str();
}

}  // namespace

void add_threads_option(CLI::App* app, int& threads, const std::string& group) {
  // More threads than cores only slows LibTorch down; unbounded, 1,000,000 would create threads
  // for ever.
  app->add_option("--threads", threads,
                  "CPU threads for LibTorch (at::set_num_threads), 1.." + std::to_string(kMaxThreads) +
                      "; default: LibTorch's (the number of cores)")
      ->check(CLI::Range(1, kMaxThreads))
      ->group(group);
}

void apply_threads(int threads) {
  if (threads > 0) at::set_num_threads(threads);
}

void add_seq_len_file_option(CLI::App* app, std::string& path, const std::string& help, const std::string& group) {
  app->add_option("--seq-len-file", path, help)->group(group);
}

std::vector<int64_t> read_seq_len_file(const std::string& path) {
  return parse_seq_len_list(read_text_file(path, "--seq-len-file", "a text file of sequence lengths"), "--seq-len-file '" + path_for_message(path) + "'");
}

// Every device command's run, with a host allocation LibTorch could not make said in one line
// (exit 2) instead of an internal error with a C++ backtrace.
std::function<int()> with_host_memory_errors(std::function<int()> run) {
  return [run = std::move(run)]() -> int {
    try {
      return run();
    } catch (const accumplan::Error&) {
      throw;
    } catch (const std::exception& e) {
      if (const auto bytes = failed_host_allocation_bytes(e.what())) throw host_out_of_memory(*bytes, "");
      throw;
    }
  };
}

// `accumplan profile`: measure only.
// --no-eval and --eval-keep-outputs, declared once for the main job and `profile`; `what` says
// what the evaluation measurement is in that command.
// --checkpointing, declared with the eval options: activation checkpointing wraps a Python
// module's blocks, which a TorchScript file does not have; `accumplan.plan(checkpointing="auto")`
// plans it. Any value but off is refused in one line, before anything loads.
static void check_checkpointing(const DeviceArgs& a) {
  if (a.checkpointing != "off") {
    throw InputError("--checkpointing " + cut_for_message(a.checkpointing) + ": activation checkpointing needs the "
                     "Python module, not a TorchScript file; plan it from Python with accumplan.plan(model, ..., "
                     "checkpointing=\"auto\"), or drop --checkpointing");
  }
}

static void add_eval_options(CLI::App* app, DeviceArgs& a, const std::string& what, const std::string& group) {
  CLI::Option* no_eval =
      app->add_flag("--no-eval", a.no_eval, "measure no evaluation batch (by default " + what + ")")->group(group);
  app->add_flag("--eval-keep-outputs", a.eval_keep_outputs,
                "the evaluation keeps each microbatch's outputs (logits for metrics) on the device until the next "
                "microbatch's forward has finished; the eval batch is measured with them counted")
      ->excludes(no_eval)
      ->group(group);
  app->add_option("--checkpointing", a.checkpointing,
                  "off (the only choice for a TorchScript model: activation checkpointing is planned from Python, "
                  "accumplan.plan(..., checkpointing=\"auto\"))")
      ->capture_default_str()
      ->group(group);
}

static void add_profile_command(CLI::App& root, std::vector<Command>& commands) {
  auto pargs = std::make_shared<DeviceArgs>();
  CLI::App* profile = root.add_subcommand(
      "profile",
      "Measure weights, gradients, optimizer state and activations at a few microbatch sizes on the device; "
      "write profile.json for `accumplan plan` (no planning, no confirmation).");
  add_setup_options(profile, *pargs);
  profile->add_option("--target-batch", pargs->plan.target_batch,
                      "optional: the effective batch to be planned; probe sizes above B / W are skipped");
  profile->add_option("--world-size", pargs->plan.world_size, "data-parallel ranks (bounds probes by B / W)")
      ->capture_default_str();
  profile->add_option("--out", pargs->out, "write profile.json here (atomically); default stdout");
  add_eval_options(profile, *pargs, "one more real window measures eval microbatches at the two largest sizes, for "
                                    "`accumplan plan` to state plan.eval from",
                   "Options");
  commands.push_back({profile, [pargs, profile]() {
                        check_outputs({output_option(profile, "--out", pargs->out, true)},
                                      {{"--model", pargs->model}, {"--batch-file", pargs->batch_file},
                                       {"--seq-len-file", pargs->seq_len_file}});
                        check_checkpointing(*pargs);
                        RunnerOptions o = runner_options(*pargs);
                        if (parse_shard_mode(pargs->shard, pargs->plan.world_size) == ShardMode::Auto) {
                          throw InputError("--shard auto chooses while planning; `accumplan profile` measures one way: "
                                           "give --shard off or --shard optimizer");
                        }
                        if (pargs->budget.find(',') != std::string::npos) {
                          throw InputError("--memory-budget '" + cut_for_message(pargs->budget) + "': `accumplan profile` "
                                           "measures one device under one budget; profile each rank on its own and "
                                           "give `accumplan plan` one --profile per rank");
                        }
                        const std::shared_ptr<Progress> progress = make_stderr_progress(pargs->progress, "step", 0);
                        o.progress = step_callback(progress);
                        if (pargs->plan.target_batch < 0 || pargs->plan.world_size < 1) {
                          throw InputError("--target-batch and --world-size must be positive");
                        }
                        if (pargs->plan.target_batch > 0) {
                          checked_in_range(pargs->plan.target_batch, 1, kMaxSamples, "--target-batch");
                          checked_in_range(pargs->plan.world_size, 1, kMaxWorldSize, "--world-size");
                          o.max_probe_micro_batch = std::max<int64_t>(1, pargs->plan.target_batch / pargs->plan.world_size);
                        }
                        auto probe = open_probe(*pargs, o);
                        ProbeRunner runner(*probe, o);
                        const Profile p = runner.profile(!pargs->no_eval, pargs->eval_keep_outputs);
                        progress->finish();
                        emit_output(pargs->out, json_text(to_json(p)));  // first: no summary of an unsaved profile
                        std::cerr << "profile: weights " << format_bytes(p.persistent.weights_bytes) << " + gradients "
                                  << format_bytes(p.persistent.gradients_bytes) << " + optimizer state "
                                  << format_bytes(p.persistent.optimizer_state_bytes) << "; " << p.points.size()
                                  << " microbatch sizes measured on " << p.device.name << "\n"
                                  << steps_summary(p.trials);
                        return 0;
                      }});
}

// The root job's search on the device: one, or under --shard auto the core's choice between an
// unsharded search and a sharded one (plan_auto_sharding), each on a runner of its own.
static Plan plan_on_device(const DeviceArgs& a, const RunnerOptions& o, PlanRequest req) {
  auto probe = open_probe(a, o);
  int64_t freed = 0;
  auto search = [&](const RunnerOptions& with, bool weigh_sharding) {
    ProbeRunner runner(*probe, with);
    if (weigh_sharding) freed = runner.freed_by_sharding(a.plan.world_size);
    Profile profile = runner.profile();
    if (runner.budget_bytes()) req.budget.bytes = runner.budget_bytes();
    return runner.plan_and_confirm(profile, req, !a.no_eval, a.eval_keep_outputs);
  };
  if (parse_shard_mode(a.shard, a.plan.world_size) != ShardMode::Auto) return search(o, false);
  RunnerOptions sharded = o;
  sharded.shard_world_size = a.plan.world_size;
  auto unsharded = [&]() -> std::optional<Plan> {
    try {
      return search(o, true);
    } catch (const InfeasibleError&) {
      return std::nullopt;
    }
  };
  return plan_auto_sharding(unsharded, [&] { return search(sharded, false); }, a.plan.world_size,
                            [&] { return freed; }, o.progress);
}

// The root job's plan: one search, or with one --memory-budget per rank one search per distinct
// budget on this device (every rank at this device's speed), combined by plan_ranks.
static Plan plan_root(const DeviceArgs& a, const RunnerOptions& o, const PlanRequest& req) {
  const std::vector<BudgetSpec> budgets = parse_rank_budgets(a.budget, req.world_size, "--memory-budget");
  if (budgets.size() == 1) return plan_on_device(a, o, req);
  if (parse_shard_mode(a.shard, req.world_size) != ShardMode::Off || req.target_tokens) {
    throw InputError("--memory-budget with one budget per rank plans fixed-shape samples with the whole optimizer "
                     "state; give one --memory-budget with --shard or --target-tokens");
  }
  std::vector<Plan> own;
  for (size_t r = 0; r < budgets.size(); ++r) {
    size_t same = 0;
    while (same < r && !(budgets[same].bytes == budgets[r].bytes && budgets[same].fraction == budgets[r].fraction)) ++same;
    if (same < r) {
      own.push_back(own[same]);
      continue;
    }
    RunnerOptions rank = o;
    rank.budget = budgets[r];
    own.push_back(plan_on_device(a, rank, req));
  }
  return plan_ranks(own);
}

Command add_device_commands(CLI::App& root, std::vector<Command>& commands) {
  const size_t first_device_command = commands.size();
  // --- the root job: profile, plan, confirm ---------------------------------------------------
  auto args = std::make_shared<DeviceArgs>();
  add_setup_options(&root, *args);
  const std::string plan_group = "Plan (the main job)";
  add_plan_options(&root, args->plan, plan_group);
  root.add_option("--out", args->out, "write plan.json here (atomically); default stdout")->group(plan_group);
  root.add_option("--report", args->report,
                  "also write the plan's picture here (atomically): self-contained HTML, or SVG for a .svg path "
                  "(as `accumplan report`)")
      ->group(plan_group);
  add_eval_options(&root, *args, "at most two more real windows measure the largest eval microbatch that fits "
                                 "beside the weights and optimizer state: plan.eval",
                   plan_group);

  add_profile_command(root, commands);
  add_executor_commands(root, commands);
  for (size_t i = first_device_command; i < commands.size(); ++i) commands[i].run = with_host_memory_errors(commands[i].run);
  return {&root, with_host_memory_errors([args, &root]() -> int {
            const bool by_tokens = args->plan.target_tokens_option->count() > 0;
            if (args->model.empty() && args->plan.target_batch == 0 && !by_tokens) {
              throw InputError("nothing to do: give --model and --target-batch (e.g. accumplan --model "
                               "builtin:convnet --target-batch 256 --device cpu --memory-budget 256MiB), or a "
                               "subcommand; run `accumplan --help`");
            }
            if (args->plan.target_batch < 1 && !by_tokens) {
              throw InputError("--target-batch is required and must be at least 1 (the effective batch per optimizer "
                               "step), got " + std::to_string(args->plan.target_batch) +
                               "; for variable-length data --target-tokens N may be given instead");
            }
            PlanRequest req = plan_request_from(args->plan);
            check_request(req);  // the planner's own checks, before the device is touched
            check_checkpointing(*args);
            check_outputs({output_option(&root, "--out", args->out, true), output_option(&root, "--report", args->report)},
                          {{"--model", args->model}, {"--batch-file", args->batch_file},
                           {"--seq-len-file", args->seq_len_file}});
            if (!args->report.empty()) report_format_for("", args->report);
            RunnerOptions o = runner_options(*args);
            if (by_tokens && !o.setup.seq_len && !o.batch_file) {
              throw InputError("--target-tokens " + std::to_string(args->plan.target_tokens) + " counts the tokens of "
                               "variable-length data: give inputs with a sequence dimension and --seq-len (--input "
                               "int64[B,T]:50257 --seq-len 16..1024), or a ragged --batch-file; otherwise use --target-batch");
            }
            const std::shared_ptr<Progress> progress = make_stderr_progress(args->progress, "step", 0);
            o.progress = step_callback(progress);
            // With --target-tokens the window in sequences depends on the lengths: probes are bounded by memory alone.
            o.max_probe_micro_batch = by_tokens ? 0 : args->plan.target_batch / args->plan.world_size;
            const Plan plan = plan_root(*args, o, req);
            progress->finish();
            // Written before the summary, files before stdout: an output that cannot be written (a
            // full disk) is one error line, with no summary of a plan never saved and no plan on stdout.
            std::vector<std::pair<std::string, std::string>> outputs = {{args->out, json_text(to_json(plan))}};
            if (!args->report.empty()) {
              outputs.emplace_back(args->report,
                                   render_report(report_input_from_plan(plan), report_format_for("", args->report)));
            }
            emit_outputs(outputs);
            std::cerr << describe_plan(plan)
                      << steps_summary(plan.profile.trials, plan.eval ? plan.eval->trials : std::vector<Trial>{});
            return 0;
          })};
}

}  // namespace accumplan::cli
