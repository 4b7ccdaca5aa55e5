// runner/probe_runner.cpp — measuring real training steps. See probe_runner.h for the contract.
#include "profiling/probe_runner.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>
#include <torch/optim.h>
#include <torch/script.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <utility>
#include <sstream>

#include "accumplan/checked.h"
#include "accumplan/errors.h"
#include "accumplan/persistent_step.h"
#include "accumplan/sharding.h"
#include "accumplan/tensor_spec.h"
#include "executor/evaluate.h"
#include "executor/executor.h"
#include "runtime/loss.h"
#include "runtime/loss_setup.h"
#include "runtime/host_data.h"
#include "runtime/optim.h"
#include "runtime/step.h"

namespace accumplan {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

ProbeRunner::ProbeRunner(MemoryProbe& probe, RunnerOptions options)
    : probe_(probe), options_(std::move(options)), device_(torch::kCPU) {
  const ParsedDevice parsed = parse_device(options_.device);
  device_ = parsed.is_cuda() ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(parsed.index)) : torch::Device(torch::kCPU);
  next_seed_ = options_.seed;
  if (options_.world_size >= 2) rehearsal_ = make_rehearsal_communicator();
  Setup& setup = options_.setup;

  // Everything a user can get wrong is checked before the first allocation on the device.
  if (setup.loss != "cross_entropy" && setup.loss != "mse" && setup.loss != "model") {
    throw InputError("--loss '" + setup.loss + "' is unknown; use cross_entropy, mse or model");
  }
  optimizer_hyperparameters(setup);  // an unknown --optimizer, or a hyperparameter it does not take
  check_optimizer_values(setup);  // --lr 1e308, --momentum nan: refused with the option's range
  if (options_.batch_file) {
    // The file is the data set, held on the host like `accumplan run --data` holds it: on the CPU
    // device its bytes are outside every peak and the budget (as run subtracts its host data). A
    // 1600-sequence file (26 MB) once inflated every probe of a token plan by 25 MiB.
    file_batch_ = load_host_data(
        probe_, [&] { return load_batch_file(*options_.batch_file, /*has_target=*/true, "--batch-file", setup.ignore_index); },
        host_bytes_);
    setup.inputs.clear();
    // Ragged data: the padded dimension is the sequence dimension T ("int64[B,T]:50257"), and the
    // file's own lengths are the range planned for unless --seq-len says otherwise.
    auto spec_of = [&](const at::Tensor& t) { return spec_text_of(t, file_batch_->ragged()); };
    for (const auto& t : file_batch_->inputs) setup.inputs.push_back(spec_of(t));
    setup.target = spec_of(file_batch_->target);
    if (file_batch_->ragged() && !setup.seq_len) {
      const std::vector<int64_t> lengths = file_batch_->sequence_lengths();
      setup.seq_len = SeqLenRange{*std::min_element(lengths.begin(), lengths.end()),
                                  *std::max_element(lengths.begin(), lengths.end())};
    }
  }
  for (const auto& text : setup.inputs) input_specs_.push_back(parse_tensor_spec(text, "--input"));
  if (!setup.target.empty()) target_spec_ = parse_tensor_spec(setup.target, "--target");
  const bool sequences = std::any_of(input_specs_.begin(), input_specs_.end(), [](const TensorSpec& t) { return t.has_seq_dim(); });
  if (sequences) {
    if (!setup.seq_len) {
      throw InputError("--input " + setup.inputs.front() + " has a sequence dimension T: give the lengths to plan for "
                       "with --seq-len, e.g. --seq-len 16..1024");
    }
    seq_range_ = setup.seq_len;
    seq_len_ = seq_range_->min;  // the persistent-memory step: one shortest sequence
  } else if (setup.seq_len) {
    throw InputError(seq_len_source() + " needs variable-length inputs: give every --input a sequence "
                     "dimension T after B, e.g. --input int64[B,T]:50257");
  }
  if (file_batch_) {
    // The data check `run --data` makes, made here first: data planned for is data that trains.
    DataRules rules = data_rules(input_specs_, target_spec_, setup.ignore_index, setup.loss);
    // The specs' upper bounds are the file's own largest ids: only the lower bound checks anything.
    rules.input_high.assign(rules.input_high.size(), std::nullopt);
    rules.target_high.reset();
    if (seq_range_) rules.max_length = seq_range_->max, rules.max_length_source = seq_len_source();
    check_batch_values(*file_batch_, rules, "--batch-file '" + path_for_message(*options_.batch_file) + "'",
                       "fix the data or its --ignore-index");
  }
  if (sequences) {
    // Windows of variable-length data are synthetic (exactly T tokens each): a ragged file gave
    // its specs and lengths and is not needed further.
    file_batch_.reset();
    host_bytes_ = 0;
  }
  if (setup.padding_mask && !sequences) {
    throw InputError("--padding-mask needs variable-length inputs (an --input with T, or a ragged --batch-file)");
  }
  if (input_specs_.empty()) {
    throw InputError("the model needs at least one --input spec (one per forward argument), e.g. "
                     "--input float32[B,3,224,224], or a --batch-file");
  }
  if (!target_spec_ && setup.loss != "model") {
    throw InputError("--loss " + setup.loss + " needs a --target spec, e.g. --target int64[B]:1000 (class indices) "
                     "or --target float32[B,10]");
  }
  // Resolving now refuses e.g. --normalization tokens with mse before any step runs.
  loss_ = loss_config(setup, target_spec_,
                      options_.batch_file ? "--batch-file '" + path_for_message(*options_.batch_file) + "'"
                                          : "--target " + cut_for_message(setup.target));
  amp_ = parse_amp_mode(setup.amp, "--amp");
  if (setup.max_grad_norm) check_grad_norm(*setup.max_grad_norm, "--max-grad-norm");
  make_optimizer(setup, {});  // validates hyperparameters and lr with no parameters to allocate for

  if (options_.budget.is_set()) {
    budget_bytes_ = options_.budget.resolve_bytes(probe_.device_total_bytes());
  }
  probe_.clear_oom();
  enforce(budget_bytes_);
  load_and_measure_persistent();
}

ProbeRunner::~ProbeRunner() = default;

int64_t ProbeRunner::device_total_bytes() const {
  // CPU: the enforced budget, which carries the host data's bytes on top (enforce()).
  const int64_t total = probe_.device_total_bytes();
  return probe_.budget_bytes() ? std::max<int64_t>(0, total - host_bytes_) : total;
}

void ProbeRunner::enforce(std::optional<int64_t> budget) {
  probe_.set_budget_bytes(budget ? std::optional<int64_t>(checked_add(*budget, host_bytes_, "the budget plus host data"))
                                 : std::nullopt);
}

SearchSettings ProbeRunner::search_settings() const {
  SearchSettings st;
  st.budget_bytes = budget_bytes_;
  st.budget_is_simulated = probe_.budget_is_simulated();
  st.device_total_bytes = device_total_bytes();
  st.device_name = probe_.device_name();
  st.persistent_over_budget = persistent_over_budget_;
  st.probe_sizes = options_.probe_sizes;
  st.max_probe_micro_batch = options_.max_probe_micro_batch;
  st.seq_range = seq_range_;
  st.progress = options_.progress;
  return st;
}

void ProbeRunner::with_budget(std::optional<int64_t> limit_bytes, const std::function<void()>& run) {
  struct Restore {
    ProbeRunner& runner;
    ~Restore() { runner.enforce(runner.budget_bytes_); }
  } restore{*this};
  enforce(limit_bytes);
  run();
}

WindowMeasurement ProbeRunner::run_window(const std::vector<int64_t>& sizes, int64_t seq_len,
                                          std::optional<int64_t> limit_bytes) {
  if (seq_len > 0) seq_len_ = seq_len;
  WindowMeasurement m;
  with_budget(limit_bytes, [&] { m = window(sizes); });
  return m;
}

std::optional<WindowMeasurement> ProbeRunner::run_rank_window(int64_t rank, const std::vector<int64_t>& sizes,
                                                              int64_t seq_len, std::optional<int64_t> limit_bytes) {
  if (!sharding_ || !optimizer_) return std::nullopt;
  // The largest share's optimizer stays alive, its state resident (the search takes it off); the
  // rank's optimizer allocates its share in the first window, and the second is measured.
  std::unique_ptr<torch::optim::Optimizer> largest = std::move(optimizer_);
  optimizer_ = make_optimizer(options_.setup, owned_parameters(params_, owners_, rank));
  WindowMeasurement m;
  try {
    m = run_window(sizes, seq_len, limit_bytes);
    const double first_seconds = m.seconds;
    if (!m.oom) m = run_window(sizes, seq_len, limit_bytes);
    m.seconds += first_seconds;
  } catch (...) {
    optimizer_ = std::move(largest);
    throw;
  }
  optimizer_ = std::move(largest);
  return m;
}

std::optional<EvalMeasurement> ProbeRunner::run_eval_window(const std::vector<int64_t>& sizes, int64_t seq_len,
                                                            std::optional<int64_t> limit_bytes, bool keep_outputs) {
  if (seq_len > 0) seq_len_ = seq_len;
  EvalMeasurement m;
  with_budget(limit_bytes, [&] { m = eval_window(sizes, keep_outputs); });
  return m;
}

EvalMeasurement ProbeRunner::eval_window(const std::vector<int64_t>& sizes, bool keep_outputs) {
  EvalMeasurement m;
  m.sizes = sizes;
  const auto t0 = Clock::now();
  // A mid-training evaluation: weights and optimizer state resident, gradients freed as
  // zero_grad(set_to_none=True) leaves them.
  for (auto& p : params_) {
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
  }
  std::vector<int64_t> peaks;  // per microbatch, with the host data
  auto read_peak = [&] {
    if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
    peaks.push_back(probe_.peak_bytes());
  };
  EvalOptions eo;
  eo.step.loss = loss_;
  eo.step.amp = amp_;
  eo.step.device = device_;
  eo.step.padding_mask = options_.setup.padding_mask;
  eo.probe = &probe_;
  eo.oom_recovery = false;  // an OOM is a measurement here
  eo.keep_outputs = keep_outputs;
  eo.before_microbatch = [&](int64_t i, int64_t) {
    if (i > 0) read_peak();
    probe_.reset_peak();
  };
  m.oom = measured(sizes, [&](const Batch& data, int64_t data_bytes) {
    evaluate(model_.module, data, sizes, eo);
    read_peak();
    for (int64_t peak : peaks) m.peak_bytes.push_back(peak - data_bytes);
  });
  if (m.oom) m.peak_bytes.clear();
  m.seconds = seconds_since(t0);
  return m;  // judged by the search (Search::run_eval)
}

bool ProbeRunner::measured(const std::vector<int64_t>& sizes, const std::function<void(const Batch&, int64_t)>& body) {
  // The window's samples are the data set's, not the training step's: `accumplan run` holds its
  // data outside the budget (on the CPU device it raises the enforced budget by their bytes and
  // reports peaks without them), and so does this. They are made with the budget lifted.
  const std::optional<int64_t> budget = probe_.budget_bytes();
  const int64_t samples = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  bool oom = false;
  try {
    probe_.set_budget_bytes(std::nullopt);
    int64_t data_bytes = 0;
    const Batch data = load_host_data(probe_, [&] { return window_data(samples); }, data_bytes);
    enforce_budget_beside(probe_, budget, data_bytes);
    body(data, data_bytes + host_bytes_);  // the --batch-file's bytes are host data too
  } catch (const ModelRejectedInputError& e) {
    probe_.set_budget_bytes(budget);
    name_the_inputs(e);
  } catch (const std::exception& e) {
    if (!is_oom(e)) {
      probe_.set_budget_bytes(budget);
      throw;
    }
    oom = true;
  }
  if (oom) {
    // Everything the failed window held was a local of the frames the exception unwound, and the
    // executor dropped its gradients; what remains is cached memory.
    for (auto& p : params_) {
      if (p.grad().defined()) p.mutable_grad() = at::Tensor();
    }
    probe_.clear_oom();
    probe_.release_cached();
  }
  probe_.set_budget_bytes(budget);
  return oom;
}

Plan ProbeRunner::plan_and_confirm(Profile& profile, PlanRequest request, bool eval, bool keep_outputs) {
  Search search(*this, search_settings(), trials_);
  Plan plan = search.plan_and_confirm(profile, std::move(request));
  if (eval) plan.eval = search.plan_eval(plan, keep_outputs);
  return plan;
}

int64_t ProbeRunner::declared_optimizer_state_bytes() const {
  return optimizer_ ? optimizer_state_bytes(*optimizer_) : 0;
}

void ProbeRunner::say(const std::string& line) const {
  if (options_.progress) options_.progress(line);
}

void ProbeRunner::name_the_inputs(const ModelRejectedInputError& e) const {
  const std::string source = options_.batch_file ? "--batch-file " + *options_.batch_file
                                         : "--input " + options_.setup.inputs.front() +
                                               (options_.setup.inputs.size() > 1 ? " ..." : "");
  throw ModelRejectedInputError(e.shapes(), e.model_error(), source);
}

bool ProbeRunner::is_oom(const std::exception& e) const {
  // The executor reports an unrecovered OOM as ExecutorOomError (and has cleared the flag by then).
  return dynamic_cast<const ExecutorOomError*>(&e) != nullptr || is_out_of_memory(e, &probe_);
}

Batch ProbeRunner::window_data(int64_t samples) {
  // On the host, as `accumplan run` keeps its data: the executor moves each microbatch to the
  // device. (On the CPU device the host IS the device; window() subtracts these bytes.)
  if (seq_range_) {
    try {
      return synthetic_ragged_batch(input_specs_, target_spec_, std::vector<int64_t>(static_cast<size_t>(samples), seq_len_),
                                    next_seed_++, options_.setup.ignore_index);
    } catch (const InputError& e) {
      // The lengths are the user's: say where they came from.
      throw InputError(std::string(e.what()) + " (the lengths planned for: " + seq_len_source() + ")");
    }
  }
  return file_batch_ ? tile_batch(*file_batch_, samples)
                     : synthetic_batch(input_specs_, target_spec_, samples, next_seed_++, at::kCPU, loss_.kind);
}

ExecutorOptions ProbeRunner::executor_options() {
  ExecutorOptions eo;
  eo.loss = loss_;
  eo.amp = amp_;
  eo.max_grad_norm = options_.setup.max_grad_norm;
  eo.oom_recovery = false;  // an OOM is a measurement here, reported, not recovered from
  eo.padding_mask = options_.setup.padding_mask;
  eo.probe = &probe_;
  eo.log = [](const std::string&) {};
  eo.communicator = rehearsal_.get();
  if (rehearsal_ && sharding_) eo.parameter_owners = owners_;
  return eo;
}

WindowMeasurement ProbeRunner::window(const std::vector<int64_t>& sizes) {
  WindowMeasurement m;
  m.sizes = sizes;
  const auto t0 = Clock::now();
  auto sync = [&] {
    // CUDA kernels run asynchronously: without a synchronize the clock would time the launches.
    if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
  };
  ExecutorOptions eo = executor_options();
  std::vector<int64_t> peaks;               // per microbatch, allocated (persistent included)
  int64_t reserved = 0;
  std::vector<Clock::time_point> starts;
  auto read_peak = [&] {
    peaks.push_back(probe_.peak_bytes());
    reserved = std::max(reserved, probe_.reserved_peak_bytes().value_or(0));
  };
  eo.before_microbatch = [&](const MicrobatchEvent&) {
    sync();
    starts.push_back(Clock::now());
  };
  eo.after_microbatch = [&](const MicrobatchEvent&, bool) {
    sync();
    read_peak();
    probe_.reset_peak();
  };
  m.oom = measured(sizes, [&](const Batch& data, int64_t data_bytes) {
    Executor executor(model_.module, *optimizer_, plan_for_window(sizes), eo);
    if (!warmed_up_) {  // the windows then time TorchScript's optimized graph, as a run's windows do
      warmed_up_ = true;
      executor.warm_up(data);
      sync();
      probe_.reset_peak();
    }
    WindowStats st = executor.accumulate(data);
    sync();
    const auto end = Clock::now();
    // Between the last microbatch and the step: the gradient exchange, where the windows make one.
    const int64_t exchange_peak = probe_.peak_bytes();
    for (size_t i = 0; i < starts.size(); ++i) {
      const double s = std::chrono::duration<double>((i + 1 < starts.size() ? starts[i + 1] : end) - starts[i]).count();
      m.step_seconds = i == 0 ? s : std::min(m.step_seconds, s);
    }
    probe_.reset_peak();
    executor.apply(st);
    m.optimizer_step_peak_bytes = std::max(exchange_peak, probe_.peak_bytes()) - data_bytes;
    reserved = std::max(reserved, probe_.reserved_peak_bytes().value_or(0));
    m.peak_bytes = *std::max_element(peaks.begin(), peaks.end()) - data_bytes;
    m.first_microbatch_peak_bytes = peaks.front() - data_bytes;
    m.steady_peak_bytes = peaks.size() > 1 ? *std::max_element(peaks.begin() + 1, peaks.end()) - data_bytes : 0;
    m.max_peak_bytes = std::max(m.peak_bytes, m.optimizer_step_peak_bytes);
    // Reported, not judged: a caching allocator frees its cache and retries before it runs out,
    // so what it reserved above the allocated bytes is cache the cap left room for (resnet18 on an
    // H200 under 8 GiB: 8,256 MB reserved at 189 samples against 4,539 MB allocated, while a
    // plain window of 366 samples fit under the same cap).
    if (probe_.reserved_peak_bytes()) m.reserved_peak_bytes = reserved;
  });
  if (m.oom) m.peak_bytes = m.max_peak_bytes = 0;
  m.seconds = seconds_since(t0);
  return m;  // judged against the budget by the search (Search::run)
}

namespace {

// The state one step of `setup`'s optimizer leaves on a parameter of `elements` elements of
// `like`'s dtype and device (its gradient all ones).
int64_t state_after_one_step(const Setup& setup, const at::Tensor& like, int64_t elements) {
  at::Tensor p = at::zeros({elements}, like.options().requires_grad(false));
  p.set_requires_grad(true);
  p.mutable_grad() = at::ones_like(p);
  auto optimizer = make_optimizer(setup, {p});
  optimizer->step();
  return optimizer_state_bytes(*optimizer);
}

}  // namespace

Sharding ProbeRunner::shard_over(int64_t world_size, std::vector<int64_t>* owners) const {
  std::vector<int64_t> numels;
  for (const at::Tensor& t : params_) {
    if (t.scalar_type() != params_.front().scalar_type()) {
      throw InputError("--shard: the model's parameters are of more than one dtype; sharding is planned for one");
    }
    numels.push_back(t.numel());
  }
  const StateLayout layout = state_layout(state_after_one_step(options_.setup, params_.front(), 1),
                                          state_after_one_step(options_.setup, params_.front(), 2));
  return shard_optimizer_state({numels}, world_size, layout, owners);
}

int64_t ProbeRunner::freed_by_sharding(int64_t world_size) const {
  return freed_state_bytes(shard_over(world_size, nullptr));
}

std::vector<at::Tensor> ProbeRunner::shard_held_parameters() {
  if (options_.shard_world_size == 0) return params_;
  const bool said = sharding_.has_value();  // a second persistent attempt loads the model again: said once
  sharding_ = shard_over(options_.shard_world_size, &owners_);
  const std::vector<at::Tensor> held = owned_parameters(params_, owners_, sharding_->measured_rank);
  if (!said) {
    say("the optimizer state sharded over " + std::to_string(sharding_->world_size) + " ranks: the windows hold rank " +
        std::to_string(sharding_->measured_rank) + "'s share, the largest (" + std::to_string(held.size()) + " of " +
        std::to_string(params_.size()) + " parameters)");
  }
  return held;
}

void ProbeRunner::load_and_measure_persistent() {
  // Attempt 0 runs under the budget. If persistent memory alone does not fit, attempt 1 measures
  // it without the budget, so the error can give the breakdown instead of "out of memory": the
  // protocol and its verdicts are PersistentStep's (accumplan/persistent_step.h), accumplan.plan's too.
  // On the CPU the attempt without the budget is still held to the host-data limit.
  PersistentStep step(budget_bytes_, probe_.budget_is_simulated() ? std::optional<int64_t>(max_host_data_bytes())
                                                                  : std::nullopt);
  for (int attempt = 0; attempt < 2; ++attempt) {
    const auto t0 = Clock::now();
    try {
      const int64_t baseline = probe_.current_bytes();
      model_ = options_.loader ? options_.loader(device_) : load_model(options_.model, device_);
      persistent_.weights_bytes = probe_.current_bytes() - baseline;
      declared_parameter_bytes_ = parameter_bytes(model_.module);
      declared_weight_bytes_ = parameter_and_buffer_bytes(model_.module);
      params_ = trainable_parameters(model_.module);
      if (params_.empty()) throw InputError("the model has no trainable parameters; there is nothing to plan for");

      // Adagrad allocates its state when constructed, Adam and momentum on the first step: the
      // state is the delta across both, less the gradients allocated in between. The step is
      // the executor's own window of kPersistentWindowSamples; its data's bytes are not counted (as in window()).
      const std::vector<at::Tensor> held = shard_held_parameters();
      const int64_t before_optimizer = probe_.current_bytes();
      optimizer_ = make_optimizer(options_.setup, held);
      const int64_t after_construct = probe_.current_bytes();
      probe_.reset_peak();
      const Batch data = window_data(kPersistentWindowSamples);
      const int64_t with_data = probe_.current_bytes();
      Executor executor(model_.module, *optimizer_, plan_for_window({kPersistentWindowSamples}), executor_options());
      WindowStats st = executor.accumulate(data);
      PersistentStep::check_loss(st.loss);
      persistent_.gradients_bytes = probe_.current_bytes() - with_data;
      executor.apply(st);  // steps the optimizer, then sets the gradients to none
      persistent_.optimizer_state_bytes = (after_construct - before_optimizer) + (probe_.current_bytes() - with_data);
      const int64_t peak = probe_.peak_bytes() - (with_data - after_construct) - host_bytes_;
      trials_.push_back(step.measured(peak, seconds_since(t0)));
      say("measured persistent memory: weights " + format_bytes(persistent_.weights_bytes) + ", gradients " +
          format_bytes(persistent_.gradients_bytes) + ", optimizer state " +
          format_bytes(persistent_.optimizer_state_bytes) + " (" + options_.setup.optimizer + ")");
      if (persistent_.weights_bytes != declared_weight_bytes_) {
        // Exact byte counts: the difference (e.g. a TorchScript constant, a num_batches_tracked
        // counter) is often smaller than format_bytes can show.
        say("note: loading the model allocated " + std::to_string(persistent_.weights_bytes) +
            " bytes while its parameters and buffers hold " + std::to_string(declared_weight_bytes_) +
            " bytes; the measured figure is used");
      }
      return;
    } catch (const ModelRejectedInputError& e) {
      name_the_inputs(e);
    } catch (const std::exception& e) {
      if (!is_oom(e)) throw;
      optimizer_.reset();
      params_.clear();
      model_ = LoadedModel{};
      probe_.clear_oom();
      probe_.release_cached();
      trials_.push_back(step.out_of_memory(seconds_since(t0), probe_.device_name()));  // throws without a budget
      say("persistent memory does not fit the budget of " + format_bytes(*budget_bytes_) +
          "; measuring it without the budget to report the breakdown");
      persistent_over_budget_ = step.over_budget();
      enforce(step.attempt_budget_bytes());
    }
  }
}


WindowMeasurement ProbeRunner::measure(int64_t micro_batch) {
  // Two microbatches: the first runs with no gradient resident (the executor sets them to none
  // at the start of every window), the second with the first's gradients resident, as every
  // later microbatch of a longer window does; then the optimizer step.
  std::vector<Trial> unrecorded;
  return Search(*this, search_settings(), unrecorded).run({micro_batch, micro_batch}, micro_batch, 0, own_budget());
}

WindowMeasurement ProbeRunner::measure_window(const std::vector<int64_t>& sizes) {
  std::vector<Trial> unrecorded;
  return Search(*this, search_settings(), unrecorded).run(sizes, sizes.empty() ? 0 : sizes.front(), 0, own_budget());
}

Profile ProbeRunner::profile(bool eval, bool keep_outputs) {
  Profile p;
  const ParsedDevice parsed = parse_device(options_.device);
  p.device.type = parsed.type;
  p.device.index = parsed.index;
  p.device.name = probe_.device_name();
  p.model = model_.info;
  p.setup = options_.setup;
  p.libtorch_version = TORCH_VERSION;
  p.probe = probe_.name();
  p.budget_bytes = budget_bytes_;
  p.persistent = persistent_;
  p.sharding = sharding_;
  p.gradient_exchange = rehearsal_ != nullptr;

  Search search(*this, search_settings(), trials_);
  search.profile(p);
  if (eval) search.profile_eval(p, keep_outputs);
  enforce(budget_bytes_);
  p.device.total_bytes = device_total_bytes();
  p.trials = trials_;
  return p;
}



}  // namespace accumplan
