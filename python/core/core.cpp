// python/core/core.cpp — accumplan._core: the C++ planner's rules, for the Python package.
//
// What it is: the module's entry point and the bindings of what is not a plan's own rule:
//   - the arithmetic and packing rules: balanced_split, largest_divisor_at_most, split_samples,
//     pack_by_token_budget, token_windows, the eval split;
//   - which layers are batch-dependent (is_batch_dependent_type), for train_window's warning;
//   - the measurement search (accumplan/search.h): `search_plan` drives a WindowRunner that Python
//     implements (accumplan/measure.py: windows of the one window loop on the user's module)
//     through the probe schedule, the confirmation and the climb that `accumplan profile` runs on
//     its C++ executor, and returns the plan as a _core.Plan;
//   - activation checkpointing's model and choice (accumplan/checkpoint.h), the optimizer table
//     and the exports.
// The plan itself is plan_object.cpp (_core.Plan, read once), the window and evaluation loops
// window_bindings.cpp; the normalization rule loss_rules.cpp; step-cost ranges and the persistent
// step plan_rules.cpp.
// Errors: accumplan::ExecutorOomError -> _core.ExecutorOomError, InfeasibleError ->
// _core.InfeasibleError, any other InputError (SchemaError included) -> _core.InputError; all
// derive from ValueError, and their messages name Python's arguments (accumplan/terms.h).
// What it is not: a memory probe (accumplan._probes) or a torch executor (accumplan/window.py),
// nor Python's own argument checks (accumplan/_args.py), which run before a call reaches here.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "accumplan/checkpoint.h"
#include "accumplan/errors.h"
#include "accumplan/exporters.h"
#include "accumplan/host_data.h"
#include "accumplan/json_io.h"
#include "accumplan/replan.h"
#include "accumplan/schema.h"
#include "accumplan/search.h"
#include "accumplan/setup_rules.h"
#include "accumplan/solver.h"
#include "accumplan/step_time.h"
#include "accumplan/tensor_spec.h"
#include "accumplan/terms.h"
#include "accumplan/token_model.h"
#include "accumplan/units.h"
#include "accumplan/window_loop.h"
#include "bindings.h"
#include "cli/commands.h"

namespace py = pybind11;

namespace accumplan {
namespace {

// cost: (per_microbatch, per_token, per_token_squared), or None for the fewest microbatches.
std::vector<std::vector<int64_t>> pack(const std::vector<int64_t>& lengths, int64_t token_budget,
                                       const std::optional<std::tuple<int64_t, int64_t, int64_t>>& cost) {
  std::optional<TokenStepCost> c;
  if (cost) c = TokenStepCost{std::get<0>(*cost), std::get<1>(*cost), std::get<2>(*cost), 0.0};
  return pack_by_token_budget(lengths, token_budget, c);
}

// A WindowRunner written in Python: a subclass defines run_window(sizes, seq_len, limit_bytes)
// and returns a WindowMeasurement; limit_bytes is the search's (None: no limit). Its exceptions cross the search unchanged (error_already_set).
class PyWindowRunner : public WindowRunner {
 public:
  using WindowRunner::WindowRunner;
  WindowMeasurement run_window(const std::vector<int64_t>& sizes, int64_t seq_len,
                               std::optional<int64_t> limit_bytes) override {
    PYBIND11_OVERRIDE_PURE(WindowMeasurement, WindowRunner, run_window, sizes, seq_len, limit_bytes);
  }
  // Optional in Python: a runner without run_eval_window does not evaluate (no plan.eval).
  std::optional<EvalMeasurement> run_eval_window(const std::vector<int64_t>& sizes, int64_t seq_len,
                                                 std::optional<int64_t> limit_bytes, bool keep_outputs) override {
    PYBIND11_OVERRIDE(std::optional<EvalMeasurement>, WindowRunner, run_eval_window, sizes, seq_len, limit_bytes,
                      keep_outputs);
  }
  // Optional in Python: accumplan/runner.py holds another rank's share where the windows shard.
  std::optional<WindowMeasurement> run_rank_window(int64_t rank, const std::vector<int64_t>& sizes, int64_t seq_len,
                                                   std::optional<int64_t> limit_bytes) override {
    PYBIND11_OVERRIDE(std::optional<WindowMeasurement>, WindowRunner, run_rank_window, rank, sizes, seq_len,
                      limit_bytes);
  }
  // accumplan/measure.py wraps the named modules (accumplan.checkpointing.apply_checkpointing).
  void set_checkpointing(const std::vector<std::string>& modules) override {
    PYBIND11_OVERRIDE(void, WindowRunner, set_checkpointing, modules);
  }
};

// The budget in bytes: an int, "12GiB" or "90%" of device_total_bytes (the CLI's parser).
int64_t resolve_budget(const std::string& text, int64_t device_total_bytes) {
  return parse_budget(text, "memory_budget").resolve_bytes(device_total_bytes);
}

struct SearchRequest {
  int64_t target_batch = 0;
  int64_t world_size = 1;
  std::string headroom = "auto";
  bool budget_is_simulated = false;
  bool persistent_over_budget = false;
  int64_t target_tokens = 0;  // packed plans: windows of at least this many valid tokens (0: target_batch samples)
  bool eval = true;           // plan the evaluation batch too (Search::plan_eval), as the CLI without --no-eval
  bool eval_keep_outputs = false;
  int64_t max_micro_batch = 0;  // never a microbatch above it (0: none), as --max-micro-batch
};

// The plan request of a search, checked (the solver's rules and the CLI's --headroom parser): a
// bad target, world size or headroom is refused before any window runs.
PlanRequest plan_request(const SearchRequest& r) {
  PlanRequest request;
  request.target_batch = r.target_batch;
  request.world_size = r.world_size;
  request.headroom = parse_headroom(r.headroom, "headroom");
  if (r.target_tokens != 0) request.target_tokens = r.target_tokens;  // the solver checks the range
  if (r.max_micro_batch != 0) request.max_micro_batch = r.max_micro_batch;
  check_request(request);
  return request;
}

// The search's settings for windows on the profile's device under its budget.
SearchSettings settings_of(const Profile& profile, bool budget_is_simulated, const py::object& progress) {
  SearchSettings settings;
  settings.budget_bytes = profile.budget_bytes;
  settings.budget_is_simulated = budget_is_simulated;
  settings.device_total_bytes = profile.device.total_bytes;
  settings.device_name = profile.device.name;
  if (!progress.is_none()) settings.progress = [progress](const std::string& line) { progress(line); };
  return settings;
}

// The confirmed plan (its profile, every window included, is in it): the probe schedule and the
// plan, from a profile whose header (device, model, setup, persistent memory, budget, the
// persistent step's trials) the runner's owner measured and set through _core.Profile.
std::shared_ptr<Plan> search_plan(WindowRunner& runner, Profile profile, const SearchRequest& r,
                                  const py::object& progress) {
  PlanRequest request = plan_request(r);
  check_profile_header(profile);
  if (profile.budget_bytes) request.budget.bytes = profile.budget_bytes;
  SearchSettings settings = settings_of(profile, r.budget_is_simulated, progress);
  settings.persistent_over_budget = r.persistent_over_budget;
  // Probes above the per-rank target are never planned (as `accumplan` passes it); a window of
  // target_tokens holds a number of sequences that depends on their lengths: memory bounds them.
  settings.max_probe_micro_batch = r.target_tokens != 0 ? 0 : r.target_batch / std::max<int64_t>(1, r.world_size);
  // Variable-length data: the header's setup.seq_len is the range the (b, T) grid plans for, as
  // `accumplan profile --seq-len` gives it (accumplan/measure.py gives the data's own range).
  settings.seq_range = profile.setup.seq_len;
  std::vector<Trial> trials = profile.trials;
  Search search(runner, settings, trials);
  search.profile(profile);
  profile.trials = trials;
  Plan plan = search.plan_and_confirm(profile, request);
  if (r.eval) plan.eval = search.plan_eval(plan, r.eval_keep_outputs);
  return std::make_shared<Plan>(std::move(plan));
}

// ---- Activation checkpointing: the planner's model and choice -----------------------------------
// The model crosses as a dict: intercept_bytes, slope_bytes_per_sample, step_time (None, or the
// planner's TimeModel as {"points": [(micro_batch, seconds)], "slope_seconds_per_sample"}),
// window_overhead_seconds, blocks [(name, saved_bytes_per_sample, forward_seconds_per_sample)],
// and optionally optimizer_step_peak_bytes, margin_fraction, gradients_bytes and
// head_bytes_per_sample (accumplan/checkpoint.h).

// Python's [(name, saved_bytes_per_sample, forward_seconds_per_sample)] as the planner's blocks.
using BlockTuples = std::vector<std::tuple<std::string, double, double>>;
std::vector<BlockCost> block_costs_of(const BlockTuples& blocks) {
  std::vector<BlockCost> costs;
  for (const auto& [name, saved, seconds] : blocks) costs.push_back({name, saved, seconds});
  return costs;
}

CheckpointModel checkpoint_model(const py::dict& d) {
  CheckpointModel m;
  m.intercept_bytes = d["intercept_bytes"].cast<double>();
  m.slope_bytes_per_sample = d["slope_bytes_per_sample"].cast<double>();
  if (d.contains("step_time") && !d["step_time"].is_none()) {
    const py::dict t = d["step_time"].cast<py::dict>();
    m.step_time = TimeModel(t["points"].cast<std::vector<std::pair<int64_t, double>>>(),
                            t["slope_seconds_per_sample"].cast<double>());
  }
  if (d.contains("window_overhead_seconds")) m.window_overhead_seconds = d["window_overhead_seconds"].cast<double>();
  m.blocks = block_costs_of(d["blocks"].cast<BlockTuples>());
  if (d.contains("optimizer_step_peak_bytes")) m.optimizer_step_peak_bytes = d["optimizer_step_peak_bytes"].cast<double>();
  if (d.contains("margin_fraction")) m.margin_fraction = d["margin_fraction"].cast<double>();
  if (d.contains("gradients_bytes")) m.gradients_bytes = d["gradients_bytes"].cast<double>();
  if (d.contains("head_bytes_per_sample")) m.head_bytes_per_sample = d["head_bytes_per_sample"].cast<double>();
  return m;
}

// The planner's model of a searched plan (checkpoint_model_of), as the dict checkpoint_model reads.
py::dict checkpoint_model_dict(const Plan& plan, const BlockTuples& blocks, double after,
                               const std::vector<size_t>& applied) {
  const CheckpointModel m = checkpoint_model_of(plan, block_costs_of(blocks),
                                                CheckpointSet{applied, ""}, after);
  py::dict d;
  d["intercept_bytes"] = m.intercept_bytes;
  d["slope_bytes_per_sample"] = m.slope_bytes_per_sample;
  if (m.step_time) {
    py::dict t;
    t["points"] = m.step_time->points();
    t["slope_seconds_per_sample"] = m.step_time->slope_seconds_per_sample();
    d["step_time"] = t;
  } else {
    d["step_time"] = py::none();
  }
  d["window_overhead_seconds"] = m.window_overhead_seconds;
  d["optimizer_step_peak_bytes"] = m.optimizer_step_peak_bytes;
  d["margin_fraction"] = m.margin_fraction;
  d["gradients_bytes"] = m.gradients_bytes;
  d["head_bytes_per_sample"] = m.head_bytes_per_sample;
  d["blocks"] = blocks;
  return d;
}

py::dict option_dict(const CheckpointChoice& c, const CheckpointModel& m) {
  py::dict o;
  std::vector<std::string> names;
  for (size_t i : c.set.blocks) names.push_back(m.blocks[i].name);
  o["rule"] = c.set.rule;
  o["modules"] = names;
  o["micro_batch"] = c.micro_batch;
  o["accumulation_steps"] = c.accumulation_steps;
  o["predicted_peak_bytes"] = c.predicted_peak_bytes;
  o["predicted_window_seconds"] = c.predicted_window_seconds;
  return o;
}

// (every set's figures, the chosen one's index or None).
std::pair<py::list, py::object> checkpoint_options_of(const py::dict& model, int64_t per_rank_batch, int64_t usable) {
  const CheckpointModel m = checkpoint_model(model);
  const std::vector<CheckpointChoice> all = checkpoint_options(m, per_rank_batch, usable);
  py::list options;
  for (const CheckpointChoice& c : all) options.append(option_dict(c, m));
  const std::optional<CheckpointChoice> chosen = choose_checkpointing(all);
  py::object index = py::none();
  if (chosen) {
    const auto sets = checkpoint_sets(m.blocks.size());
    for (size_t i = 0; i < sets.size(); ++i) {
      if (sets[i].blocks == chosen->set.blocks) index = py::int_(i);
    }
  }
  return {options, index};
}

// The plan's activation checkpointing (Search::plan_checkpointing): `plan` searched with the
// candidates `applied` (indices) checkpointed, `blocks` their measured costs from one window of
// (samples, peak bytes, seconds); choose: the planner's choice, confirmed by a window of `runner`
// when it differs from `applied`.
std::shared_ptr<Plan> checkpoint_plan(WindowRunner& runner, const Plan& plan,
                            const BlockTuples& blocks, double after, const std::vector<size_t>& applied, bool choose,
                            bool budget_is_simulated,
                            const std::tuple<int64_t, int64_t, double>& costs_window, const py::object& progress) {
  std::vector<BlockCost> costs = block_costs_of(blocks);
  CheckpointSet set{applied, "given"};
  for (const CheckpointSet& named : checkpoint_sets(costs.size())) {
    if (named.blocks == applied) set.rule = named.rule;
  }
  std::vector<Trial> trials;  // the confirmation goes into plan.checkpoint.trials
  Search search(runner, settings_of(plan.profile, budget_is_simulated, progress), trials);
  const auto& [samples, peak, seconds] = costs_window;
  const Trial measured{"costs", samples, !plan.profile.budget_bytes || peak <= *plan.profile.budget_bytes, peak, seconds,
                       {samples}, std::nullopt};
  return std::make_shared<Plan>(search.plan_checkpointing(plan, std::move(costs), after, set, choose, measured));
}

// ---- The optimizer table and the exports --------------------------------------------------------
// optimizer_table: how accumplan/measure.py recognises a torch optimizer and what it records of
// it, from the one table (accumplan/setup_rules.h): {name: {"torch_class": torch.optim's class,
// "torch_fixed": {keyword: the value that makes the class this optimizer}, "default_lr",
// "hyperparameters": {key: the default an absent one means}, "flags": [on/off options],
// "grouped": {torch's keyword: the hyperparameters it carries, in order}}}, in the table's order. export_plan: `accumplan export`'s exporter, its refusals naming the Python
// arguments (allow_slow, allow_lossy, lightning_datamodule).

py::dict optimizer_table_dict() {
  py::dict table;
  for (const OptimizerInfo& row : optimizer_table()) {
    py::dict entry;
    entry["torch_class"] = row.torch_class;
    py::dict fixed;
    for (const auto& [key, value] : row.torch_fixed) fixed[py::str(key)] = value;
    entry["torch_fixed"] = fixed;
    entry["default_lr"] = row.default_lr;
    entry["hyperparameters"] = optimizer_defaults(row.name);
    entry["flags"] = row.flags;
    py::dict grouped;  // {"betas": ["beta1", "beta2"]} for the Adam rows
    for (const TorchKeyword& k : torch_keywords(row)) {
      if (k.members.size() > 1) grouped[py::str(k.keyword)] = k.members;
    }
    entry["grouped"] = grouped;
    table[py::str(row.name)] = entry;
  }
  return table;
}

// (the export's text, its notes one a line) of `plan`.
std::pair<std::string, std::string> export_text(const Plan& plan, const std::string& target,
                                                const std::string& plan_path, bool allow_slow, bool allow_lossy,
                                                const std::string& lightning_datamodule) {
  ExportOptions options;
  options.plan_path = plan_path;
  options.allow_slow = allow_slow;
  options.allow_lossy = allow_lossy;
  options.lightning_datamodule = lightning_datamodule;
  options.names = {"allow_slow=True", "allow_lossy=True", "lightning_datamodule", "to='lightning'"};
  std::string note;
  std::string text = export_plan(plan, target, &note, options);
  return {text, note};
}

void bind_optimizer_and_exports(py::module_& m) {
  m.def("optimizer_table", &optimizer_table_dict,
        "{optimizer: {'torch_class', 'torch_fixed', 'default_lr', 'hyperparameters': {name: default}, 'flags', "
        "'grouped': {keyword: [names]}}}: "
        "the optimizers a plan's setup records, in order");
  m.attr("EXPORT_TARGETS") = export_targets();
  m.def("export_plan", &export_text, py::arg("plan"), py::arg("target"), py::arg("plan_path"), py::arg("allow_slow"),
        py::arg("allow_lossy"), py::arg("lightning_datamodule"),
        "(text, notes) of `accumplan export --to target`; InputError/InfeasibleError for what it refuses");
}

}  // namespace
}  // namespace accumplan

namespace accumplan {
namespace {

// The core's errors as Python exceptions: InputError is a ValueError; InfeasibleError and
// ExecutorOomError (what the window loop cannot recover from) are InputErrors; PeerError (another
// rank failed) a RuntimeError.
void bind_errors(py::module_& m) {
  static py::exception<InputError> input_error(m, "InputError", PyExc_ValueError);
  static py::exception<InfeasibleError> infeasible_error(m, "InfeasibleError", input_error.ptr());
  static py::exception<ExecutorOomError> executor_oom_error(m, "ExecutorOomError", infeasible_error.ptr());
  static py::exception<PeerError> peer_error(m, "PeerError", PyExc_RuntimeError);
  // A message that echoes a non-UTF-8 path (load_plan(b'\xff\xfe.json')) is decoded with U+FFFD for
  // the bad bytes: pybind11's own conversion would fail and the error arrive with an empty message.
  static const auto raise_as = [](PyObject* type, const char* what) {
    const std::string text = what;
    PyObject* message = PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "replace");
    PyErr_SetObject(type, message);
    Py_XDECREF(message);
  };
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ExecutorOomError& e) {
      raise_as(executor_oom_error.ptr(), e.what());
    } catch (const InfeasibleError& e) {
      raise_as(infeasible_error.ptr(), e.what());
    } catch (const InputError& e) {
      raise_as(input_error.ptr(), e.what());
    } catch (const PeerError& e) {
      raise_as(peer_error.ptr(), e.what());
    }
  });
}

// The planner's names and bounds, for Python's argument checks (accumplan/_args.py and its
// siblings read them from here: Python copies none).
void bind_constants(py::module_& m) {
  m.attr("PACKINGS") = py::tuple(py::cast(packing_names()));  // train_window(packing=), as run --packing
  m.attr("SCHEMA_VERSION") = schema_version_string();
  m.attr("PYTHON_MODEL_PREFIX") = kPythonModelPrefix;  // a plan's model.path when measured in Python
  m.attr("PERSISTENT_WINDOW_SAMPLES") = kPersistentWindowSamples;
  m.attr("MAX_SAMPLES") = kMaxSamples;
  m.attr("INT32_MIN") = std::numeric_limits<int32_t>::min();
  m.attr("INT32_MAX") = std::numeric_limits<int32_t>::max();
  m.attr("MAX_ACCUMULATION_STEPS") = kMaxAccumulationSteps;
  m.attr("MAX_WORLD_SIZE") = kMaxWorldSize;
  m.attr("MAX_JSON_DEPTH") = kMaxJsonDepth;
  m.attr("MAX_TARGET_TOKENS") = kMaxTargetTokens;
  m.attr("SPLITS") = py::tuple(py::cast(kSplitKinds));
  py::list terms;
  for (const auto& term : kStepCostTermRanges) terms.append(term.name);
  m.attr("STEP_COST_TERMS") = py::tuple(terms);
  m.attr("MAX_BYTES") = kMaxBytes;
  m.attr("LOSSES") = py::tuple(py::cast(kLosses));
  m.def("documented_range",
        [](const std::string& key) -> py::object {
          const std::optional<ValueRange> r = documented_range(key);
          if (!r) return py::none();
          return py::make_tuple(r->lo, r->hi, r->lo_open, r->hi_open);
        },
        py::arg("key"), "(lo, hi, lo_open, hi_open) of a plan's number by its key, as the readers check it; None if none");
  m.def("option_name", &option_name, py::arg("cli_option"),
        "how the core's messages name a command-line option for Python ('--target-batch' -> 'target_batch')");
  m.def("memory_fraction", &device_memory_fraction, py::arg("budget_bytes"), py::arg("total_bytes"), py::arg("device"),
        "the caching allocator's memory fraction that holds budget_bytes; InputError above the device's total");
}

// The planner's arithmetic on windows, budgets and host data.
void bind_arithmetic(py::module_& m) {
  m.def("balanced_split", &balanced_split, py::arg("total"), py::arg("parts"), py::arg("unit") = 1);
  m.def("largest_divisor_at_most", &largest_divisor_at_most, py::arg("total"), py::arg("limit"), py::arg("unit") = 1);
  m.def("split_samples", &split_samples, py::arg("total"), py::arg("max_micro_batch"), py::arg("split"),
        py::arg("unit") = 1);
  m.def("pack_by_token_budget", &pack, py::arg("lengths"), py::arg("token_budget"), py::arg("cost") = py::none());
  m.def("token_windows", &token_windows, py::arg("valid_tokens"), py::arg("target_tokens"));
  m.def("gradient_buckets", [](const std::vector<std::pair<std::string, int64_t>>& g) { return gradient_buckets(g); },
        py::arg("gradients"), "the gradient exchange's buckets of [(dtype, bytes)] in order: each bucket's indices");
  m.def("is_batch_dependent_type", &is_batch_dependent_type, py::arg("type"), py::arg("tracks_running_stats"),
        "whether a module of this class name mixes the samples of its batch (BatchNorm*, tracking InstanceNorm*)");
  m.def("resolve_budget", &resolve_budget, py::arg("text"), py::arg("device_total_bytes"),
        "the budget in bytes: '12GiB', '90%' (of device_total_bytes) or a byte count, as --memory-budget reads it");
  m.def("parse_size_bytes", &parse_size_bytes, py::arg("text"), py::arg("what"), "'256MiB' -> bytes, as the CLI reads sizes");
  m.def("check_host_data", &check_host_data_bytes, py::arg("bytes"), py::arg("what"), py::arg("fix"),
        "InputError when host data of `bytes` is over the host-data limit (ACCUMPLAN_MAX_HOST_DATA), as the CLI refuses it");
  m.def("max_host_data_bytes", &max_host_data_bytes, "the host-data limit: 16 GiB, half the machine, or ACCUMPLAN_MAX_HOST_DATA");
  m.def("failed_host_allocation_bytes", &failed_host_allocation_bytes, py::arg("error_text"),
        "the bytes LibTorch's CPU allocator failed to allocate (0: unknown), or None for another error");
  m.def("host_out_of_memory", [](int64_t bytes, const std::string& during) {
          return std::string(host_out_of_memory(bytes, during).what());
        }, py::arg("bytes"), py::arg("during"), "the one line for the host running out of memory");

}

// The measurement search over a Python WindowRunner, and the checkpointing choice after it.
// The executable's planner commands on `args` (argv without the program), worded for the command
// line: the front end is the CLI's while they run.
int command_line(const std::vector<std::string>& args) {
  std::vector<std::string> all{"accumplan"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  set_front_end(FrontEnd::Cli);
  const int code = cli::run_command_line(static_cast<int>(argv.size()), argv.data(), nullptr);
  set_front_end(FrontEnd::Python);
  return code;
}

void bind_search(py::module_& m) {
  py::class_<WindowMeasurement>(m, "WindowMeasurement")
      .def(py::init<>())
      .def_readwrite("oom", &WindowMeasurement::oom)
      .def_readwrite("peak_bytes", &WindowMeasurement::peak_bytes)
      .def_readwrite("first_microbatch_peak_bytes", &WindowMeasurement::first_microbatch_peak_bytes)
      .def_readwrite("steady_peak_bytes", &WindowMeasurement::steady_peak_bytes)
      .def_readwrite("optimizer_step_peak_bytes", &WindowMeasurement::optimizer_step_peak_bytes)
      .def_readwrite("max_peak_bytes", &WindowMeasurement::max_peak_bytes)
      .def_readwrite("reserved_peak_bytes", &WindowMeasurement::reserved_peak_bytes)
      .def_readwrite("step_seconds", &WindowMeasurement::step_seconds)
      .def_readwrite("seconds", &WindowMeasurement::seconds)
      .def_readonly("fit", &WindowMeasurement::fit)
      .def_readonly("sizes", &WindowMeasurement::sizes);
  py::class_<EvalMeasurement>(m, "EvalMeasurement")
      .def(py::init<>())
      .def_readwrite("oom", &EvalMeasurement::oom)
      .def_readwrite("peak_bytes", &EvalMeasurement::peak_bytes)
      .def_readwrite("seconds", &EvalMeasurement::seconds)
      .def_readonly("fit", &EvalMeasurement::fit)
      .def_readonly("sizes", &EvalMeasurement::sizes);
  py::class_<WindowRunner, PyWindowRunner>(m, "WindowRunner")
      .def(py::init<>())
      .def("run_window", &WindowRunner::run_window, py::arg("sizes"), py::arg("seq_len"), py::arg("limit_bytes"))
      .def("run_eval_window", &WindowRunner::run_eval_window, py::arg("sizes"), py::arg("seq_len"), py::arg("limit_bytes"),
           py::arg("keep_outputs"))
      .def("run_rank_window", &WindowRunner::run_rank_window, py::arg("rank"), py::arg("sizes"), py::arg("seq_len"),
           py::arg("limit_bytes"))
      .def("set_checkpointing", &WindowRunner::set_checkpointing, py::arg("modules"));
  py::class_<SearchRequest>(m, "SearchRequest")
      .def(py::init<>())
      .def_readwrite("target_batch", &SearchRequest::target_batch)
      .def_readwrite("world_size", &SearchRequest::world_size)
      .def_readwrite("headroom", &SearchRequest::headroom)
      .def_readwrite("budget_is_simulated", &SearchRequest::budget_is_simulated)
      .def_readwrite("persistent_over_budget", &SearchRequest::persistent_over_budget)
      .def_readwrite("target_tokens", &SearchRequest::target_tokens)
      .def_readwrite("eval", &SearchRequest::eval)
      .def_readwrite("eval_keep_outputs", &SearchRequest::eval_keep_outputs)
      .def_readwrite("max_micro_batch", &SearchRequest::max_micro_batch);
  m.def("check_request", [](const SearchRequest& r) { plan_request(r); }, py::arg("request"),
        "InputError naming a bad target_batch, world_size, headroom or max_micro_batch");
  m.def("checkpoint_options", &checkpoint_options_of, py::arg("model"), py::arg("per_rank_batch"), py::arg("usable_bytes"),
        "(every checkpoint set's {rule, modules, micro_batch, accumulation_steps, predicted_peak_bytes, "
        "predicted_window_seconds}, the chosen set's index or None): accumplan/checkpoint.h");
  m.def("checkpoint_model_of", &checkpoint_model_dict, py::arg("plan"), py::arg("blocks"),
        py::arg("head_bytes_per_sample"), py::arg("applied"),
        "the planner's checkpoint model of a searched plan (its lines without checkpointing, the measured blocks)");
  m.def("checkpoint_peak_bytes", [](const py::dict& model, const std::vector<size_t>& blocks, int64_t micro_batch) {
          return checkpoint_model(model).predicted_peak_bytes(CheckpointSet{blocks, "given"}, micro_batch);
        }, py::arg("model"), py::arg("blocks"), py::arg("micro_batch"),
        "the planner's predicted training peak with these candidate blocks checkpointed");
  m.def("checkpoint_window_peak_bytes", [](const py::dict& model, const std::vector<size_t>& blocks,
                                           const std::vector<int64_t>& sizes) {
          return checkpoint_model(model).predicted_window_peak_bytes(CheckpointSet{blocks, "given"}, sizes);
        }, py::arg("model"), py::arg("blocks"), py::arg("sizes"),
        "the planner's predicted peak of a window of these microbatch sizes with these blocks checkpointed");
  m.def("checkpoint_plan", &checkpoint_plan, py::arg("runner"), py::arg("plan"), py::arg("blocks"),
        py::arg("head_bytes_per_sample"), py::arg("applied"),
        py::arg("choose"), py::arg("budget_is_simulated"), py::arg("costs_window"), py::arg("progress") = py::none(),
        "the searched plan with its activation checkpointing chosen (and confirmed by a window) or stated");
  m.def("search_plan", &search_plan, py::arg("runner"), py::arg("profile"), py::arg("request"),
        py::arg("progress") = py::none(),
        "the plan of the measurement search `accumplan profile` runs, on the runner's windows, from the profile's "
        "header (_core.Profile)");
  m.def("main", &command_line, py::arg("args"),
        "`accumplan plan|export|report ARGS...` as the executable runs them (its code, options, messages and exit "
        "codes): python -m accumplan");
}

}  // namespace
}  // namespace accumplan

PYBIND11_MODULE(_core, m) {
  accumplan::set_front_end(accumplan::FrontEnd::Python);  // the planner's messages name Python's arguments
  using namespace accumplan;
  m.doc() = "accumplan's C++ planner (plan, splits, re-plans, packing, the window loop, the search); see accumplan.plan";
  bind_errors(m);
  bind_loss_rules(m);
  bind_plan_rules(m);
  bind_plan_object(m);
  bind_profile_object(m);
  bind_window_loop(m);
  bind_constants(m);
  bind_arithmetic(m);
  bind_search(m);
  bind_optimizer_and_exports(m);
}
