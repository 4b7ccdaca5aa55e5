// cli/executor_commands.cpp — `accumplan run` (train with a plan, exactly weighted, recovering
// from OOM) and `accumplan verify` (one accumulated update against one combined-batch update).
//
// What it is: flag parsing, the checks that keep a plan honest before a step is taken (schema
// and version via read_plan_file, the model's SHA-256 against the plan's), the data's source
// (--data or synthetic samples: run/run_data.h loads and checks them), the session
// (run/run_session.h) over the Executor (src/executor/), and the outputs: a human summary on stderr,
// `--stats` JSON, `--plan-out` (the plan after any re-plan), `--save` (the trained TorchScript).
// Data parallel: when WORLD_SIZE > 1 (torchrun --no_python sets RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT), `run` joins a c10d group (Gloo on cpu, NCCL on cuda when built),
// iterates global windows of B = W x per_rank_batch samples in order and gives rank r the strided
// share r, r+W, ... of each (stride_window). Outputs: rank 0 writes --stats/--save/--plan-out; a
// path containing "{rank}" is written by every rank with its rank substituted.
// `run` also shows progress (observe/progress.h: one updating line on a terminal, plain lines in
// a log, --progress), writes a per-window series into --stats, and with --trace a Chrome trace
// of its windows, microbatches, optimizer steps, OOM recoveries and memory (observe/trace.h),
// fed by the executor's instrumentation hooks.
// What it is not: the executor's logic (executor.h), or profiling/planning (device_commands.cpp).
#include <CLI/CLI.hpp>

#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/script.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "accumplan/build_config.h"
#include "accumplan/checked.h"
#include "accumplan/errors.h"
#include "accumplan/ranks.h"
#include "accumplan/json_io.h"
#include "accumplan/memory_probe.h"
#include "accumplan/schema.h"
#include "accumplan/sharding.h"
#include "accumplan/tensor_spec.h"
#include "accumplan/units.h"
#include "cli/commands.h"
#include "cli/plan_options.h"
#include "dist/communicator.h"
#include "executor/executor.h"
#include "accumplan/replan.h"
#include "run/run_data.h"
#include "run/run_session.h"
#include "executor/verify.h"
#include "cli/progress_option.h"
#include "observe/progress.h"
#include "observe/trace.h"
#include "runtime/batch.h"
#include "runtime/host_data.h"
#include "runtime/loss.h"
#include "runtime/loss_setup.h"
#include "runtime/model.h"
#include "runtime/optim.h"
#include "runtime/step.h"
#include "cli/choice.h"

namespace accumplan::cli {
namespace {

// Exit code of `verify` when accumulated and combined updates differ beyond the tolerance: the
// inputs were fine (not 2), accumplan worked (not 1), the check found a difference.
constexpr int kExitVerifyDiffers = 3;
// Passes over the data: a million is beyond any training run and keeps windows x epochs in int64.
constexpr int64_t kMaxEpochs = 1000000;

struct RunArgs {
  std::string plan;
  std::string model;
  std::string data;
  int64_t steps = 0;
  CLI::Option* steps_option = nullptr;
  int64_t epochs = 0;
  CLI::Option* epochs_option = nullptr;
  double lr = 0;
  CLI::Option* lr_option = nullptr;
  double clip = 0;
  CLI::Option* clip_option = nullptr;
  std::string amp;
  std::string budget;
  std::string device;
  std::string save;
  std::string stats;
  std::string plan_out;
  std::string trace;
  std::string progress = "auto";
  bool force = false;
  bool no_recovery = false;
  int64_t synthetic_samples = 0;
  CLI::Option* synthetic_option = nullptr;
  std::string seq_len_file;  // run: synthetic lengths drawn from these observed ones
  std::string eval_data;     // run: --eval-data, the evaluation set
  int64_t eval_every = 0;    // run: --eval-every N windows (0: after the last)
  CLI::Option* eval_every_option = nullptr;
  std::string packing;       // run, packed plans: time (default) or fill
  CLI::Option* packing_option = nullptr;
  CLI::Option* device_option = nullptr;  // given '' is refused, not taken for the plan's
  CLI::Option* amp_option = nullptr;
  uint64_t seed = 1234;
  int threads = 0;
  int dist_timeout_s = 120;
  // verify only
  double rtol = 1e-5;
  std::string json_out;
  bool freeze_batch_dependent = false;  // verify: those layers in eval mode
  const CLI::App* app = nullptr;  // the subcommand, to tell which outputs were given
};


std::string short_hash(const std::string& h) { return h.size() > 12 ? h.substr(0, 12) + "…" : h; }

// Everything both commands need before touching the executor.
struct Prepared {
  Plan plan;
  std::unique_ptr<MemoryProbe> probe;
  LoadedModel model;
  std::vector<TensorSpec> inputs;
  std::optional<TensorSpec> target;
  LossConfig loss;
  at::Device device = at::kCPU;
  bool hash_matched = true;
};

// `dist`: a data-parallel rank uses the GPU of its LOCAL_RANK, as torchrun intends.
std::string device_of(const RunArgs& a, const Plan& plan, const std::optional<DistEnv>& dist) {
  if (given(a.device_option)) return a.device;
  if (plan.device.type == "cuda") {
    if (!torch::cuda::is_available()) {
      throw InputError("the plan was made for cuda:" + std::to_string(plan.device.index) +
                       " but no CUDA device is available here; pass --device cpu to run it on the CPU");
    }
    return "cuda:" + std::to_string(dist && dist->world_size > 1 ? dist->local_rank : plan.device.index);
  }
  return "cpu";
}

// Prepare for a group of `dist` (nullopt: one process; the plan must be for world size 1).
Prepared prepare(const RunArgs& a, const std::string& command, const std::optional<DistEnv>& dist = std::nullopt) {
  if (a.plan.empty()) throw InputError("--plan is required: the plan.json written by `accumplan --model ...`");
  if (a.model.empty()) throw InputError("--model is required: the TorchScript file (or builtin:NAME) the plan was made for");
  apply_threads(a.threads);
  Prepared p;
  // SchemaError (exit 2) for another schema or major version, or a plan that breaks its own rules.
  p.plan = read_plan_file(a.plan, "--plan");
  if (p.plan.checkpoint) {
    // A TorchScript module's blocks cannot be wrapped: without the checkpointing the plan's
    // microbatches would not fit the memory they were planned for.
    std::string modules;
    for (const std::string& m : p.plan.checkpoint->modules) modules += (modules.empty() ? "" : ", ") + m;
    throw InputError("--plan trains with activation checkpointing of " + cut_for_message(modules, 120) +
                     ", which needs the Python module: train it with accumplan's plan.train_window (or "
                     "plan.apply_checkpointing(model) in your own loop), or re-plan without checkpointing");
  }
  const int world = dist ? dist->world_size : 1;
  if (p.plan.world_size != world) {
    if (command == "run") {
      throw InputError("--plan is for world size " + std::to_string(p.plan.world_size) + " but this run has " +
                       (dist ? "WORLD_SIZE " + std::to_string(world) : std::string("one process (WORLD_SIZE unset)")) +
                       ". Launch " + std::to_string(p.plan.world_size) + " processes (torchrun --no_python "
                       "--nproc_per_node " + std::to_string(p.plan.world_size) + " accumplan run ...), or re-plan with "
                       "--world-size " + std::to_string(world));
    }
    throw InputError("--plan is for world size " + std::to_string(p.plan.world_size) + "; `accumplan " + command +
                     "` runs one process. Re-plan with --world-size 1, or launch your data-parallel trainer with "
                     "the exported settings (`accumplan export`)");
  }
  const std::string device = device_of(a, p.plan, dist);
  ProbeRequest req;
  req.device = device;
  // A trace on a GPU carries CUPTI's device memory timeline where this build has CUPTI.
  const bool cupti_for_trace = !a.trace.empty() && is_cupti_supported() && parse_device(device).is_cuda();
  if (cupti_for_trace) req.backend = "cupti";
  try {
    p.probe = make_memory_probe(req);  // installed before the model loads, so weights are counted
  } catch (const InputError& e) {
    if (!cupti_for_trace) throw;
    std::cerr << "accumplan: note: --trace without CUPTI's memory timeline (" << e.what() << ")\n";
    req.backend = "auto";
    p.probe = make_memory_probe(req);
  }
  p.model = load_model(a.model, torch::Device(device));
  p.device = torch::Device(device);
  if (!p.plan.model.sha256.empty() && p.model.info.sha256 != p.plan.model.sha256) {
    const std::string msg = "--model " + a.model + " has SHA-256 " + short_hash(p.model.info.sha256) +
                            " but the plan was made for " + (p.plan.model.path.empty() ? "another model" : p.plan.model.path) +
                            " (SHA-256 " + short_hash(p.plan.model.sha256) + ")";
    if (!a.force) {
      throw InputError(msg + ". Its memory and weighting were measured on that model; re-plan for this one "
                       "(accumplan --model " + a.model + " ...), or pass --force to run anyway");
    }
    std::cerr << "accumplan: warning: " << msg << "; running anyway (--force)\n";
    p.hash_matched = false;
  }
  const Setup& s = p.plan.setup;
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    p.inputs.push_back(parse_tensor_spec(s.inputs[i], "plan setup.inputs[" + std::to_string(i) + "]"));
  }
  if (p.inputs.empty()) throw InputError("--plan has no input specs (setup.inputs); re-plan with --input");
  if (!s.target.empty()) p.target = parse_tensor_spec(s.target, "plan setup.target");
  p.loss = loss_config(s, p.target, "the plan's setup.target " + cut_for_message(s.target));
  // Record the mode actually used ("auto" resolved), so a --plan-out plan says what ran.
  p.plan.setup.normalization = to_string(p.loss.normalization);
  return p;
}

// Where `run` and `verify` take their samples from: --data, or synthetic ones (--synthetic-samples,
// --seq-len-file, --seed).
RunDataSource data_source(const RunArgs& a) {
  RunDataSource s;
  s.data_path = a.data;
  if (a.synthetic_option && a.synthetic_option->count() > 0) s.synthetic_samples = a.synthetic_samples;
  if (!a.seq_len_file.empty()) {
    s.observed_lengths = read_seq_len_file(a.seq_len_file);
    s.lengths_source = "--seq-len-file '" + path_for_message(a.seq_len_file) + "'";
  }
  s.seed = a.seed;
  return s;
}

// Runs `fn`; a model's rejection of its inputs is rethrown naming where the samples of this run or
// verify came from (the executor does not know).
template <class Fn>
auto naming_data_source(const RunArgs& a, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const ModelRejectedInputError& e) {
    throw ModelRejectedInputError(e.shapes(), e.model_error(), data_source_text(data_source(a)));
  }
}

// Where this rank writes an output: "{rank}" in the path makes every rank write its own file;
// otherwise only rank 0 writes (every rank holds the same parameters and global statistics).
std::string rank_path(const std::string& path, int rank) {
  const std::string key = "{rank}";
  if (path.empty() || path == "-") return rank == 0 ? path : std::string();
  if (path.find(key) == std::string::npos) return rank == 0 ? path : std::string();
  std::string out = path;
  for (size_t at = out.find(key); at != std::string::npos; at = out.find(key, at)) out.replace(at, key.size(), std::to_string(rank));
  return out;
}

// Every output of `run` (for this rank: "{rank}" filled in; a rank > 0 writes only paths with
// "{rank}") or `verify`, and the inputs it must not replace, checked before anything loads.
void check_run_outputs(const RunArgs& a, int rank) {
  // An input path given as '' is refused like every other empty word, never taken for its absence.
  const std::pair<const char*, const std::string*> inputs[] = {
      {"--data", &a.data}, {"--eval-data", &a.eval_data}, {"--seq-len-file", &a.seq_len_file}};
  for (const auto& [name, value] : inputs) {
    if (value->empty() && given(a.app->get_option_no_throw(name))) {
      throw InputError(std::string(name) + " is empty; give the path of a file, or drop " + name);
    }
  }
  auto out = [&](const char* name, const std::string& path) {
    OutputOption o = output_option(a.app, name, path);
    if (o.given && !path.empty()) {
      o.path = rank_path(path, rank);
      o.given = !o.path.empty();
    }
    return o;
  };
  std::vector<OutputOption> outputs;
  if (a.app->get_name() == "verify") {
    // The table always goes to standard output: --json - would mix JSON into it.
    outputs = {OutputOption{"the verification table", "-", false, true}, out("--json", a.json_out)};
  } else {
    outputs = {out("--save", a.save), out("--stats", a.stats), out("--plan-out", a.plan_out), out("--trace", a.trace)};
  }
  check_outputs(outputs, {{"--plan", a.plan}, {"--model", a.model}, {"--data", a.data}, {"--seq-len-file", a.seq_len_file},
                          {"--eval-data", a.eval_data}});
}

// The one parser of --packing (not given: time). Given empty, it is refused as any other word.
Packing parse_packing(const std::string& text, bool given) {
  if (text.empty() && !given) return Packing::Time;
  if (const std::optional<Packing> p = packing_named(text)) return *p;
  throw InputError("--packing must be time or fill, got '" + cut_for_message(text) +
                   "' (time: cut each window where the measured step times predict the least time; fill: each "
                   "microbatch filled to the token budget)");
}

// Every flag of `run` checked before anything loads.
void check_run_flags(const RunArgs& a) {
  if (a.steps_option->count() > 0) checked_in_range(a.steps, 1, kMaxSamples, "--steps (optimizer windows to run)");
  if (a.epochs_option->count() > 0) checked_in_range(a.epochs, 1, kMaxEpochs, "--epochs");
  if (a.steps_option->count() > 0 && a.epochs_option->count() > 0) {
    throw InputError("give --steps or --epochs, not both");
  }
  if (a.synthetic_option && a.synthetic_option->count() > 0) {
    checked_in_range(a.synthetic_samples, 1, kMaxSyntheticSamples, "--synthetic-samples");
  }
  if (a.clip != 0) check_grad_norm(a.clip, "--clip-grad-norm");  // 0: no clipping; nan and inf refused
  parse_progress_mode(a.progress);  // a bad --progress stops the run before anything loads
  parse_packing(a.packing, a.packing_option && a.packing_option->count() > 0);
  if (a.dist_timeout_s < 1) throw InputError("--dist-timeout must be at least 1 second");
  if (a.eval_every_option && a.eval_every_option->count() > 0) {
    if (a.eval_data.empty()) throw InputError("--eval-every evaluates --eval-data FILE; give it too, or drop --eval-every");
    checked_in_range(a.eval_every, 1, kMaxSamples, "--eval-every (windows between evaluations)");
  }
}

// The plan's setup with --lr and --amp applied; a mode other than the plan's needs --force.
Setup run_setup(const RunArgs& a, const Plan& plan) {
  Setup setup = plan.setup;
  if (!a.packing.empty() && !plan.tokens) {
    throw InputError("--packing applies to plans that pack variable-length data by tokens (plan.tokens); this plan "
                     "splits fixed-size samples: drop --packing");
  }
  if (a.lr_option->count() > 0) setup.lr = a.lr;
  check_optimizer_values(setup);
  const AmpMode planned_amp = parse_amp_mode(setup.amp, "plan setup.amp");
  const AmpMode amp = given(a.amp_option) ? parse_amp_mode(a.amp, "--amp") : planned_amp;
  if (amp != planned_amp) {
    // Activations in bf16 take about half of float32's bytes: the plan's memory is not this run's.
    const std::string msg = "--amp " + to_string(amp) + " but the plan was measured with amp " + to_string(planned_amp);
    if (!a.force) {
      throw InputError(msg + "; its microbatch sizes and predicted peak are for that mode. Re-profile with --amp " +
                       to_string(amp) + " (accumplan --model ... --amp " + to_string(amp) + "), or pass --force");
    }
    std::cerr << "accumplan: warning: " << msg << "; running anyway (--force)\n";
  }
  setup.amp = to_string(amp);
  return setup;
}

// The run's data, with the budget enforced beside it.
RunData load_run_data(const RunArgs& a, Prepared& p, int rank) {
  if (!a.seq_len_file.empty() && !a.data.empty()) {
    throw InputError("--seq-len-file draws the lengths of synthetic data; with --data the lengths are the data's own");
  }
  if (!a.seq_len_file.empty() && !p.plan.setup.seq_len) {
    throw InputError("--seq-len-file applies to plans for variable-length data (setup.seq_len); this plan is for fixed shapes");
  }
  std::optional<int64_t> budget;
  if (!a.budget.empty()) {  // one for every rank, or this rank's of one per rank
    const std::vector<BudgetSpec> each = parse_rank_budgets(a.budget, p.plan.world_size, "--memory-budget");
    budget = each[each.size() == 1 ? 0 : static_cast<size_t>(rank)].resolve_bytes(p.probe->device_total_bytes());
  }
  RunDataSource eval;
  eval.data_path = a.eval_data;
  eval.data_name = "--eval-data";
  return accumplan::load_run_data(data_source(a), RunDataSpecs{p.plan, p.inputs, p.target, p.loss}, *p.probe, budget,
                                  a.eval_data.empty() ? nullptr : &eval);
}

ExecutorOptions run_executor_options(const RunArgs& a, const Prepared& p, const Setup& setup, Communicator* comm,
                                     int rank) {
  ExecutorOptions eo;
  eo.loss = p.loss;
  eo.amp = parse_amp_mode(setup.amp, "--amp");
  // The plan's clipping (measured with it) unless --clip-grad-norm says otherwise.
  if (a.clip > 0) {
    eo.max_grad_norm = a.clip;
  } else if (a.clip_option->count() == 0) {
    eo.max_grad_norm = setup.max_grad_norm;
  }
  eo.oom_recovery = !a.no_recovery;
  eo.padding_mask = setup.padding_mask;
  eo.packing = parse_packing(a.packing, a.packing_option && a.packing_option->count() > 0);
  eo.probe = p.probe.get();
  eo.plan_out = rank_path(a.plan_out, rank);
  eo.communicator = comm;
  return eo;
}

// The run's one header line on stderr (rank 0; not with --progress none).
void print_run_header(const RunArgs& a, const Prepared& p, const Communicator* comm, const RunData& d,
                      const Setup& setup, int64_t total, size_t windows_per_epoch) {
  const int world = comm ? comm->world_size() : 1;
  const int64_t T = p.plan.per_rank_batch;
  const std::optional<int64_t> target_tokens = p.plan.tokens ? p.plan.tokens->target_tokens : std::nullopt;
  std::cerr << "accumplan: run: " << total << " windows of "
            << (target_tokens ? "at least " + std::to_string(*target_tokens) + " valid tokens"
                              : "up to " + std::to_string(T * world) + " samples")
            << " (" << batch_samples(d.data, "the data") << " samples in " << windows_per_epoch << " windows per epoch, "
            << (a.data.empty() ? "synthetic" : a.data) << ")";
  if (comm) {
    std::cerr << " on " << world << " ranks (" << comm->backend() << "; rank r takes samples r, r+" << world
              << ", ... of each window" << (target_tokens ? ")" : ": up to " + std::to_string(T) + " per rank)");
  }
  if (p.plan.tokens) {
    std::cerr << ", each window packed longest first under a token budget of " << p.plan.tokens->token_budget
              << " padded tokens (sequences up to " << p.plan.tokens->max_seq_len << ")";
  } else {
    std::cerr << ", microbatches " << p.plan.accumulation_steps << " x up to " << p.plan.micro_batch;
  }
  std::cerr << ", normalization " << to_string(p.loss.normalization) << ", amp " << setup.amp;
  if (d.budget_bytes) {
    std::cerr << ", budget " << format_bytes(*d.budget_bytes);
    if (d.host_data_bytes > 0) std::cerr << " (+" << format_bytes(d.host_data_bytes) << " of host data)";
  }
  std::cerr << "\n";
}

// The run's last line on stderr (rank 0).
void print_run_summary(const RunRecord& r, const Plan& final_plan, const Plan& plan) {
  std::cerr << "accumplan: run done: " << r.windows << " windows"
            << (r.world_size > 1 ? " on " + std::to_string(r.world_size) + " ranks (" +
                                       std::to_string(r.collectives.gradient_exchanges) + " gradient exchanges)"
                                 : std::string())
            << ", " << r.optimizer_steps << " optimizer steps (" << r.skipped_steps << " skipped), " << r.samples_seen
            << " samples" << (r.tokens_seen ? ", " + std::to_string(r.tokens_seen) + " tokens" : std::string()) << ", "
            << r.oom_recoveries << " OOM recoveries; ";
  if (final_plan.tokens) {
    std::cerr << "token budget " << final_plan.tokens->token_budget << " padded tokens";
  } else {
    std::cerr << "microbatches " << final_plan.accumulation_steps << " (" << join_sizes(final_plan.microbatch_sizes) << ")";
  }
  if (r.measured_peak_bytes && r.packed_predicted_peak_bytes) {
    // Packed: the prediction for the microbatches this run packed; the plan's is the worst case.
    std::cerr << "; measured peak " << format_bytes(*r.measured_peak_bytes) << " vs predicted "
              << format_bytes(*r.packed_predicted_peak_bytes) << " for what it packed (at most "
              << format_bytes(plan.memory.predicted_peak_bytes) << " under the token budget)";
  } else if (r.measured_peak_bytes) {
    std::cerr << "; measured peak " << format_bytes(*r.measured_peak_bytes) << " vs predicted "
              << format_bytes(r.predicted_peak_bytes) << (plan.sharding ? " on rank " + std::to_string(r.rank) : std::string());
  }
  std::cerr << "; mean window " << format_seconds(r.mean_window_seconds.value_or(0.0));
  if (r.time_model && r.time_model->microbatches > 0) {
    std::cerr << "; step times predicted within " << std::lround(100 * r.time_model->median_abs_error)
              << "% (median over " << r.time_model->microbatches << " microbatches)";
  }
  std::cerr << "\n";
}

// The run's constants, what a RunRecord holds besides what the session measured.
RunRecord run_record_base(const Prepared& p, const Communicator* comm, const RunData& d, const Setup& setup) {
  RunRecord r;
  r.per_rank_batch = rank_batch(p.plan, comm ? comm->rank() : 0);
  r.world_size = comm ? comm->world_size() : 1;
  r.rank = comm ? comm->rank() : 0;
  r.backend = comm ? comm->backend() : std::string("none");
  r.striding = !comm ? "none"
               : p.plan.ranks.empty() ? "strided: rank r takes samples r, r+W, r+2W, ... of each global window"
                                      : "shares: rank r takes the consecutive samples of its share (plan.ranks)";
  r.normalization = to_string(p.loss.normalization);
  r.amp = setup.amp;
  r.predicted_peak_bytes = predicted_peak_of_rank(p.plan, r.rank);  // a sharded plan's ranks differ
  r.budget_bytes = d.budget_bytes;
  r.host_data_bytes = d.host_data_bytes;
  r.probe = p.probe->name();
  r.model_sha256 = p.model.info.sha256;
  r.model_hash_matches_plan = p.hash_matched;
  return r;
}

// One line per evaluation: the mean loss at full precision (the same number whatever the split).
std::string eval_line(const RunEvalRecord& r) {
  std::ostringstream s;
  s.precision(17);
  s << "eval after window " << r.after_window + 1 << ": mean loss " << (r.loss ? *r.loss : std::nan("")) << " over "
    << r.units << (r.units == r.samples ? " samples" : " units (" + std::to_string(r.samples) + " samples)") << " in "
    << r.microbatch_sizes.size() << " microbatches of up to "
    << *std::max_element(r.microbatch_sizes.begin(), r.microbatch_sizes.end())
    << (r.oom_recoveries ? " (" + std::to_string(r.oom_recoveries) + " re-split after out-of-memory)" : std::string())
    << (r.peak_bytes ? ", peak " + format_bytes(*r.peak_bytes) : std::string());
  return s.str();
}

int run_command(const RunArgs& a) {
  check_run_flags(a);
  const std::optional<DistEnv> dist = dist_env_from_environment();
  check_run_outputs(a, dist ? dist->rank : 0);
  Prepared p = prepare(a, "run", dist);
  // Join the group once the inputs are known good here; every rank checks the same plan and data
  // specs, so a bad input stops every rank before the rendezvous, not one rank inside it.
  std::unique_ptr<Communicator> comm;
  if (dist && dist->world_size > 1) {
    const std::chrono::milliseconds timeout(int64_t{a.dist_timeout_s} * 1000);
    comm = p.device.is_cuda() ? make_nccl_communicator(*dist, timeout) : make_gloo_communicator(*dist, timeout);
  }
  const int rank = comm ? comm->rank() : 0;
  const bool lead = rank == 0;  // writes the human progress lines
  const Setup setup = run_setup(a, p.plan);
  const RunData d = load_run_data(a, p, rank);
  const std::vector<at::Tensor> params = trainable_parameters(p.model.module);
  ExecutorOptions eo = run_executor_options(a, p, setup, comm.get(), rank);
  if (p.plan.sharding) eo.parameter_owners = parameter_owners(params, p.plan.world_size);
  auto optimizer = make_optimizer(setup, eo.parameter_owners.empty() ? params : owned_parameters(params, eo.parameter_owners, rank));

  auto windows = plan_windows(d.data, p.plan, p.loss.ignore_index);
  const size_t per_epoch = windows.size();
  const int64_t total = a.steps_option->count() > 0
                            ? a.steps
                            : checked_mul(static_cast<int64_t>(per_epoch), a.epochs_option->count() > 0 ? a.epochs : 1,
                                          "windows per epoch x --epochs");
  // Rank 0 shows progress; every rank's executor log lines go through it (above the bar).
  const std::shared_ptr<Progress> progress = make_stderr_progress(lead ? a.progress : "none", "window", total);
  if (lead) eo.log = [progress](const std::string& line) { progress->message(line); };
  const std::string trace_path = rank_path(a.trace, rank);
  std::optional<RunTrace> trace;
  if (!trace_path.empty()) trace.emplace(rank);
  RunSessionOptions so;
  so.total_windows = total;
  so.host_data_bytes = d.host_data_bytes;
  so.trace = trace ? &*trace : nullptr;
  so.guard = [&a](const std::function<WindowStats()>& step) { return naming_data_source(a, step); };
  so.on_window = [&progress](int64_t w, int64_t samples_done, const RunWindowRecord& r) {
    std::ostringstream detail;
    detail << "loss " << (r.loss ? *r.loss : std::nan("")) << ", " << r.samples << " samples in "
           << r.microbatch_sizes.size() << " microbatches" << (r.stepped ? "" : ", step skipped")
           << (r.peak_bytes ? ", peak " + format_bytes(*r.peak_bytes) : std::string());
    progress->update(w + 1, samples_done, detail.str());
  };
  if (d.eval_data) {
    so.eval_data = &*d.eval_data;
    so.eval_every = a.eval_every;
    so.on_eval = [&progress](const RunEvalRecord& r) { progress->message(eval_line(r)); };
  }
  RunSession session(p.model.module, *optimizer, p.plan, std::move(eo), d.data, std::move(windows), std::move(so));
  if (lead && parse_progress_mode(a.progress) != ProgressMode::None) {  // --progress none: errors only
    print_run_header(a, p, comm.get(), d, setup, total, per_epoch);
  }
  session.run();
  progress->finish();

  const Plan final_plan = session.final_plan();
  const bool replicas_identical = session.replicas_identical();
  if (!replicas_identical) {
    std::cerr << "accumplan: warning: rank " << rank << ": the ranks' parameters differ after the run; every rank "
              << "stepped with the same all-reduced gradient, so this is a bug worth reporting\n";
  }
  if (session.executor().totals().optimizer_steps == 0) {
    // Exit 0 here once told a script that it had trained. Nothing is written: no model changed.
    throw InputError("the run took no optimizer step: all " + std::to_string(total) + " window(s) were skipped (window 0: " +
                     session.first_skip_reason() + "); nothing was written. Check the data and the loss");
  }
  const std::string plan_out = rank_path(a.plan_out, rank), save = rank_path(a.save, rank), stats = rank_path(a.stats, rank);
  if (!plan_out.empty()) write_text_atomic(plan_out, json_text(to_json(final_plan)));
  if (!save.empty()) save_module_atomic(p.model.module, save);
  if (trace) {
    session.add_device_timeline(*p.probe);
    emit_output(trace_path, trace->dump());
  }
  const RunRecord record = session.record(run_record_base(p, comm.get(), d, setup), final_plan, replicas_identical);
  if (!stats.empty()) emit_output(stats, json_text(to_json(record)));
  if (lead) print_run_summary(record, final_plan, p.plan);
  return 0;
}

int verify_command(const RunArgs& a) {
  if (!(a.rtol > 0)) throw InputError("--rtol must be positive, got " + std::to_string(a.rtol));
  check_run_outputs(a, 0);
  Prepared p = prepare(a, "verify");
  const int64_t T = p.plan.per_rank_batch;
  Batch data = load_samples(data_source(a), RunDataSpecs{p.plan, p.inputs, p.target, p.loss}, 1);
  const int64_t n = batch_samples(data, "the data");
  Batch window;
  std::vector<std::string> notes;  // said after the check ran: a refusal stays one line
  if (p.plan.tokens && p.plan.tokens->target_tokens) {
    // The plan's first window: the sequences that first reach target_tokens valid tokens.
    const auto [start, count] = plan_windows(data, p.plan, p.loss.ignore_index).front();
    window = data.slice(start, count);
  } else {
    if (n < T) {
      notes.push_back("--data holds " + std::to_string(n) + " samples, fewer than the plan's per-rank batch " +
                      std::to_string(T) + "; verifying on a window of " + std::to_string(n));
    }
    window = data.slice(0, std::min(n, T));
  }
  VerifyOptions vo;
  vo.loss = p.loss;
  vo.rtol = a.rtol;
  vo.seed = a.seed;
  vo.freeze_batch_dependent = a.freeze_batch_dependent;
  vo.batch_dependent_layers = batch_dependent_layers(p.model.module);
  for (const auto& listed : p.plan.model.batch_dependent_layers) {
    const std::string l = cut_for_message(listed, 120);  // plan text: one line, bounded
    if (std::find(vo.batch_dependent_layers.begin(), vo.batch_dependent_layers.end(), l) == vo.batch_dependent_layers.end()) {
      vo.batch_dependent_layers.push_back(l);
    }
  }
  if (p.plan.setup.amp != "none") {
    std::ostringstream note;
    note << "verification runs in float32, where " << a.rtol << " is a meaningful tolerance; the plan trains with "
         << p.plan.setup.amp << ", whose rounding is not part of this check";
    notes.push_back(note.str());
  }
  const VerifyReport rep = naming_data_source(a, [&] { return verify_accumulation(p.model.module, window, p.plan, vo); });
  // The table and --json written together, files first: a --json that cannot be written (a full
  // disk) is one error line with no table before it, and a table that cannot be written is one too.
  std::vector<std::pair<std::string, std::string>> outputs = {{"-", format_table(rep)}};
  if (!a.json_out.empty()) outputs.emplace_back(a.json_out, json_text(to_json(rep)));
  emit_outputs(outputs);
  for (const auto& note : notes) std::cerr << "accumplan: note: " << note << "\n";
  for (const auto& w : rep.warnings) std::cerr << "accumplan: warning: " << w << "\n";
  return rep.pass ? 0 : kExitVerifyDiffers;
}

void add_common(CLI::App* app, RunArgs& a) {
  app->add_option("--plan", a.plan, "plan.json from `accumplan --model ...` or `accumplan plan`")->required();
  app->add_option("--model", a.model, "the TorchScript file (or builtin:NAME) the plan was made for; its SHA-256 is checked")
      ->required();
  app->add_option("--data", a.data,
                  "samples: Python's torch.save([inputs..., target], f), dim 0 = samples, in order; default: "
                  "synthetic samples from the plan's input specs");
  a.device_option = choice(app->add_option("--device", a.device, "cpu, cuda or cuda:N (default: the plan's device)"));
  app->add_flag("--force", a.force, "run even if --model's SHA-256 (or --amp) differs from the plan's");
  app->add_option("--seed", a.seed, "seed of the synthetic samples")->capture_default_str();
  add_threads_option(app, a.threads, "Options");  // CLI11's default group ("" would hide it)
}

}  // namespace

void add_executor_commands(CLI::App& root, std::vector<Command>& commands) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* run = root.add_subcommand(
      "run",
      "Train with a plan: each window of the plan's per-rank batch is split into its microbatches, weighted "
      "exactly (samples or valid tokens of the window), stepped once; OOM re-plans below the failing size and "
      "replays the window.");
  add_common(run, *args);
  args->steps_option = run->add_option("--steps", args->steps, "optimizer windows to run (cycling through the data)");
  args->epochs_option = run->add_option("--epochs", args->epochs, "passes over the data (default 1); the last window of "
                                                                  "each pass may be short and has its own N");
  args->lr_option = run->add_option("--lr", args->lr, "learning rate (default: the plan's setup)");
  args->clip_option = run->add_option("--clip-grad-norm", args->clip,
                                      "clip the combined gradient of each window to this 2-norm (default: the plan's "
                                      "setup.max_grad_norm; 0 turns clipping off)");
  args->amp_option = choice(run->add_option("--amp", args->amp,
                  "none | bf16 | fp16 (default: the plan's setup.amp; another mode than the plan was measured with "
                  "needs --force); fp16 uses a dynamic loss scale"));
  add_memory_budget_option(run, args->budget, "device memory to enforce while training",
                           "on cpu the counting allocator makes the CPU a simulated device of that size, as when "
                           "planning", "");
  run->add_option("--save", args->save, "write the trained TorchScript module here (atomically)");
  run->add_option("--stats", args->stats,
                  "write run statistics JSON here (atomically; - for stdout): totals and window_series, one record "
                  "per window (samples, loss, peak_bytes, oom_recoveries, replans, seconds). On cpu, peaks exclude "
                  "the data set held in memory (host_data_bytes), as a device would");
  run->add_option("--plan-out", args->plan_out, "write the plan (re-planned after any OOM) here, atomically");
  run->add_option("--trace", args->trace,
                  "write a Chrome trace (open in ui.perfetto.dev or chrome://tracing) here, atomically: windows, "
                  "microbatches, optimizer steps, OOM recoveries and re-plans, memory counters (and CUPTI's device "
                  "memory timeline on a CUDA build with CUPTI)");
  add_progress_option(run, args->progress);
  run->add_flag("--no-oom-recovery", args->no_recovery, "fail on the first out-of-memory instead of re-planning");
  args->packing_option = choice(run->add_option("--packing", args->packing,
                         "plans packed by tokens: time (default) cuts each window where the step times predict the "
                         "least time, the plan's at first, then those of this run's own microbatches (cpu); fill "
                         "fills each microbatch to the token budget"));
  run->add_option("--eval-data", args->eval_data,
                  "an evaluation set (as --data: torch.save([inputs..., target], f)), evaluated forward only in the "
                  "model's eval mode in the plan's eval microbatches (plan.eval), re-split after an out-of-memory; "
                  "the mean loss goes to stderr and --stats evaluations");
  args->eval_every_option =
      run->add_option("--eval-every", args->eval_every, "evaluate --eval-data after every N windows (default: after the last)");
  args->synthetic_option =
      run->add_option("--synthetic-samples", args->synthetic_samples,
                      "samples in the synthetic data set when --data is absent, 1.." +
                          std::to_string(kMaxSyntheticSamples) + " (default 4 global windows); held in host memory");
  add_seq_len_file_option(run, args->seq_len_file,
                          "variable-length plans without --data: draw the synthetic sequences' lengths from this text "
                          "file of observed lengths (default: uniform over the plan's setup.seq_len)",
                          "Options");
  run->add_option("--dist-timeout", args->dist_timeout_s,
                  "seconds a rank waits for its peers (rendezvous and every collective) before failing")
      ->capture_default_str();
  run->footer(
      "Data parallel: launch with torchrun --no_python --nproc_per_node W accumplan run --plan plan.json ... "
      "(a plan made with --world-size W). Each global window of B samples is split strided: rank r takes "
      "samples r, r+W, r+2W, ...; under a plan whose ranks differ (plan.ranks), rank r takes its own consecutive "
      "share, and --memory-budget may give one budget per rank (24MiB,64MiB). Rank 0 writes --stats/--save/--plan-out/--trace; put {rank} in a path to have every rank "
      "write its own.");
  args->app = run;
  commands.push_back({run, [args]() { return run_command(*args); }});

  auto vargs = std::make_shared<RunArgs>();
  CLI::App* verify = root.add_subcommand(
      "verify",
      "Compare one accumulated update with one combined-batch update on the model and samples (equal, unequal, "
      "partial-window and token-mask splits); exit 3 when they differ beyond --rtol.");
  add_common(verify, *vargs);
  verify->add_option("--rtol", vargs->rtol, "relative tolerance max|a-b|/max|b| (float32)")->capture_default_str();
  verify->add_option("--json", vargs->json_out, "write the report as JSON here (atomically; - for stdout)");
  verify->add_flag("--freeze-batch-dependent", vargs->freeze_batch_dependent,
                   "BatchNorm and other batch-dependent layers in eval mode (their running statistics) in both "
                   "updates: a check of the weighting alone, which such layers otherwise make differ");
  verify->footer("Exit codes: 0 equal within --rtol, 3 they differ, 2 bad input, 1 internal error.");
  vargs->app = verify;
  commands.push_back({verify, [vargs]() { return verify_command(*vargs); }});
}

}  // namespace accumplan::cli
