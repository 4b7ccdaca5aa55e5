// runner/probe_runner.cpp — measuring real training steps. See probe_runner.h for the contract.
#include "profiling/probe_runner.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>
#include <torch/optim.h>
#include <torch/script.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <set>
#include <sstream>

#include "accumplan/checked.h"
#include "accumplan/errors.h"
#include "accumplan/memory_model.h"
#include "accumplan/tensor_spec.h"
#include "accumplan/token_model.h"
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

// A profile point from a measured window: the peaks, the step time, and `peak_bytes` — the window's
// peak for a probe, the steady-state one for a confirmation (its first microbatch has its own line).
ProfilePoint point_of(const WindowMeasurement& s, int64_t micro_batch, int64_t peak_bytes,
                      std::optional<int64_t> seq_len = std::nullopt) {
  ProfilePoint pt;
  pt.micro_batch = micro_batch;
  pt.seq_len = seq_len;
  pt.peak_bytes = peak_bytes;
  pt.first_microbatch_peak_bytes = s.first_microbatch_peak_bytes;
  pt.optimizer_step_peak_bytes = s.optimizer_step_peak_bytes;
  pt.reserved_peak_bytes = s.reserved_peak_bytes;
  pt.step_seconds = s.step_seconds;
  return pt;
}

}  // namespace

ProbeRunner::ProbeRunner(MemoryProbe& probe, RunnerOptions options)
    : probe_(probe), options_(std::move(options)), device_(torch::kCPU) {
  const ParsedDevice parsed = parse_device(options_.device);
  device_ = parsed.is_cuda() ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(parsed.index)) : torch::Device(torch::kCPU);
  next_seed_ = options_.seed;
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
    if (file_batch_->ragged() && setup.seq_len.empty()) {
      const std::vector<int64_t> lengths = file_batch_->sequence_lengths();
      setup.seq_len = SeqLenRange{*std::min_element(lengths.begin(), lengths.end()),
                                  *std::max_element(lengths.begin(), lengths.end())}.text();
    }
  }
  for (const auto& text : setup.inputs) input_specs_.push_back(parse_tensor_spec(text, "--input"));
  if (!setup.target.empty()) target_spec_ = parse_tensor_spec(setup.target, "--target");
  const bool sequences = std::any_of(input_specs_.begin(), input_specs_.end(), [](const TensorSpec& t) { return t.has_seq_dim(); });
  if (sequences) {
    if (setup.seq_len.empty()) {
      throw InputError("--input " + setup.inputs.front() + " has a sequence dimension T: give the lengths to plan for "
                       "with --seq-len, e.g. --seq-len 16..1024");
    }
    seq_range_ = parse_seq_len(setup.seq_len, "--seq-len");
    setup.seq_len = seq_range_->text();
    seq_len_ = seq_range_->min;  // the persistent-memory step: one shortest sequence
  } else if (!setup.seq_len.empty()) {
    throw InputError(seq_len_source() + " needs variable-length inputs: give every --input a sequence "
                     "dimension T after B, e.g. --input int64[B,T]:50257");
  }
  if (file_batch_) {
    // The data check `run --data` makes, made here first: data planned for is data that trains.
    DataRules rules = data_rules(input_specs_, target_spec_, setup.ignore_index);
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

bool ProbeRunner::can_pass_budget() const { return probe_.budget_is_simulated() && budget_bytes_.has_value(); }

WindowMeasurement ProbeRunner::past_the_budget(const std::function<WindowMeasurement()>& window) {
  if (!can_pass_budget()) return window();
  struct Restore {
    ProbeRunner& runner;
    ~Restore() { runner.enforce(runner.budget_bytes_); }
  } restore{*this};
  enforce(checked_mul(*budget_bytes_, int64_t{2}, "twice the budget"));
  return window();
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
                     : synthetic_batch(input_specs_, target_spec_, samples, next_seed_++, at::kCPU);
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
  return eo;
}

Plan ProbeRunner::window_plan(const std::vector<int64_t>& sizes) const {
  Plan plan;
  plan.target_batch = plan.per_rank_batch = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  set_window(plan, sizes, *std::max_element(sizes.begin(), sizes.end()));
  return plan;
}

WindowMeasurement ProbeRunner::window(const std::vector<int64_t>& sizes) {
  WindowMeasurement m;
  m.sizes = sizes;
  const auto t0 = Clock::now();
  auto sync = [&] {
    // CUDA kernels run asynchronously: without a synchronize the clock would time the launches.
    if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
  };
  const int64_t samples = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  // The window's samples are the data set's, not the training step's: `accumplan run` holds its
  // data outside the budget (on the CPU device it raises the enforced budget by their bytes and
  // reports peaks without them), and so does this. They are made with the budget lifted.
  const std::optional<int64_t> budget = probe_.budget_bytes();
  int64_t data_bytes = 0;

  ExecutorOptions eo = executor_options();
  std::vector<int64_t> peaks;               // per microbatch, allocated (persistent included)
  int64_t reserved = 0;
  std::vector<Clock::time_point> starts;
  auto read_peak = [&] {
    peaks.push_back(probe_.peak_bytes());
    reserved = std::max(reserved, probe_.reserved_peak_bytes().value_or(0));
  };
  eo.before_microbatch = [&](const MicrobatchEvent& e) {
    sync();
    if (e.index > 0) {
      read_peak();
      probe_.reset_peak();
    }
    starts.push_back(Clock::now());
  };
  try {
    probe_.set_budget_bytes(std::nullopt);
    const Batch data = load_host_data(probe_, [&] { return window_data(samples); }, data_bytes);
    enforce_budget_beside(probe_, budget, data_bytes);
    Executor executor(model_.module, *optimizer_, window_plan(sizes), eo);
    WindowStats st = executor.accumulate(data);
    sync();
    const auto end = Clock::now();
    read_peak();
    for (size_t i = 0; i < starts.size(); ++i) {
      const double s = std::chrono::duration<double>((i + 1 < starts.size() ? starts[i + 1] : end) - starts[i]).count();
      m.step_seconds = i == 0 ? s : std::min(m.step_seconds, s);
    }
    probe_.reset_peak();
    executor.apply(st);
    data_bytes += host_bytes_;  // the --batch-file's bytes are host data too
    m.optimizer_step_peak_bytes = probe_.peak_bytes() - data_bytes;
    reserved = std::max(reserved, probe_.reserved_peak_bytes().value_or(0));
    m.peak_bytes = *std::max_element(peaks.begin(), peaks.end()) - data_bytes;
    m.first_microbatch_peak_bytes = peaks.front() - data_bytes;
    m.steady_peak_bytes = peaks.size() > 1 ? *std::max_element(peaks.begin() + 1, peaks.end()) - data_bytes : 0;
    m.max_peak_bytes = std::max(m.peak_bytes, m.optimizer_step_peak_bytes);
    if (probe_.reserved_peak_bytes()) {
      m.reserved_peak_bytes = reserved;
      m.max_peak_bytes = std::max(m.max_peak_bytes, reserved);
    }
  } catch (const ModelRejectedInputError& e) {
    probe_.set_budget_bytes(budget);
    name_the_inputs(e);
  } catch (const std::exception& e) {
    if (!is_oom(e)) {
      probe_.set_budget_bytes(budget);
      throw;
    }
    m.oom = true;
  }
  if (m.oom) {
    // Everything the failed window held was a local of the frames the exception unwound, and the
    // executor dropped its gradients; what remains is cached memory.
    for (auto& p : params_) {
      if (p.grad().defined()) p.mutable_grad() = at::Tensor();
    }
    probe_.clear_oom();
    probe_.release_cached();
    m.peak_bytes = m.max_peak_bytes = 0;
  }
  probe_.set_budget_bytes(budget);
  m.seconds = seconds_since(t0);
  // The runner's budget when one is set: a tail probe measured past it (extend_linear_tail) runs
  // under a raised limit but is judged against the budget the plan is for.
  const std::optional<int64_t> limit = budget_bytes_ ? budget_bytes_ : budget;
  m.fit = !m.oom && (!limit || m.max_peak_bytes <= *limit);
  return m;
}

void ProbeRunner::load_and_measure_persistent() {
  // Attempt 0 runs under the budget. If persistent memory alone does not fit, attempt 1 measures
  // it without the budget, so the error can give the breakdown instead of "out of memory".
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
      // the executor's own window of one sample; its data's bytes are not counted (as in window()).
      const int64_t before_optimizer = probe_.current_bytes();
      optimizer_ = make_optimizer(options_.setup, params_);
      const int64_t after_construct = probe_.current_bytes();
      probe_.reset_peak();
      const Batch data = window_data(1);
      const int64_t with_data = probe_.current_bytes();
      Executor executor(model_.module, *optimizer_, window_plan({1}), executor_options());
      WindowStats st = executor.accumulate(data);
      persistent_.gradients_bytes = probe_.current_bytes() - with_data;
      executor.apply(st);  // steps the optimizer, then sets the gradients to none
      persistent_.optimizer_state_bytes = (after_construct - before_optimizer) + (probe_.current_bytes() - with_data);
      const int64_t peak = probe_peak() - (with_data - after_construct) - host_bytes_;
      trials_.push_back({"probe", 1, !budget_bytes_ || peak <= *budget_bytes_, peak, seconds_since(t0), {1}});
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
      trials_.push_back({"probe", 1, false, 0, seconds_since(t0), {1}});
      if (attempt == 1 || !budget_bytes_) {
        throw InfeasibleError("the model's weights, gradients and optimizer state do not fit on " +
                              probe_.device_name() + " even without a budget; use a smaller model, "
                              "an optimizer with less state (sgd keeps none), or a larger device");
      }
      say("persistent memory does not fit the budget of " + format_bytes(*budget_bytes_) +
          "; measuring it without the budget to report the breakdown");
      persistent_over_budget_ = true;
      probe_.set_budget_bytes(std::nullopt);
    }
  }
}

int64_t ProbeRunner::probe_peak() const {
  return std::max(probe_.peak_bytes(), probe_.reserved_peak_bytes().value_or(0));
}

WindowMeasurement ProbeRunner::measure(int64_t micro_batch) {
  // Two microbatches: the first runs with no gradient resident (the executor sets them to none
  // at the start of every window), the second with the first's gradients resident, as every
  // later microbatch of a longer window does; then the optimizer step.
  const std::vector<int64_t> sizes{micro_batch, micro_batch};
  WindowMeasurement m = window(sizes);
  m.micro_batch = micro_batch;
  return m;
}

Profile ProbeRunner::profile() {
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

  if (seq_range_) {
    profile_tokens(p);
    enforce(budget_bytes_);
    p.device.total_bytes = device_total_bytes();
    p.trials = trials_;
    return p;
  }
  std::set<int64_t> sizes;
  for (int64_t b : options_.probe_sizes) {
    if (b < 1) throw InputError("probe sizes must be at least 1, got " + std::to_string(b));
    // Sizes above the per-rank target are never planned, but two points are needed for a fit.
    if (options_.max_probe_micro_batch > 0 && b > std::max<int64_t>(2, options_.max_probe_micro_batch)) continue;
    sizes.insert(b);
  }
  if (sizes.size() < 2) {
    throw InputError("profiling needs at least two probe sizes to fit peak(b) = persistent + a0 + a1*b");
  }

  bool lifted = persistent_over_budget_;  // the budget is not in force
  auto record = [&](const WindowMeasurement& s) {
    trials_.push_back({"probe", s.micro_batch, s.fit, s.max_peak_bytes, s.seconds, s.sizes});
    if (s.oom) {
      say("probe b=" + std::to_string(s.micro_batch) + ": out of memory under the budget of " +
          format_bytes(budget_bytes_.value_or(0)));
      return;
    }
    p.points.push_back(point_of(s, s.micro_batch, s.peak_bytes));
    say("probe b=" + std::to_string(s.micro_batch) + ": peak " + format_bytes(s.peak_bytes) + ", " +
        format_seconds(s.step_seconds) + (s.fit ? "" : " (over the budget)") + (lifted ? " [measured without the budget]" : ""));
  };
  for (int64_t b : sizes) {
    if (lifted && p.points.size() >= 2) break;
    WindowMeasurement s = measure(b);
    record(s);
    if (s.oom) {
      if (p.points.size() >= 2) break;  // larger sizes would fail too; the fit has enough points
      // Fewer than two points: measure this size without the budget, so the planner can explain
      // how far the budget is from what the smallest microbatches need.
      lifted = true;
      probe_.set_budget_bytes(std::nullopt);
      s = measure(b);
      record(s);
      if (s.oom) break;
    }
    if (!s.fit && p.points.size() >= 2) break;
  }
  if (!lifted) extend_linear_tail(p, sizes.empty() ? 1 : *sizes.rbegin(), record);
  enforce(budget_bytes_);
  p.device.total_bytes = device_total_bytes();
  p.trials = trials_;
  if (p.points.size() < 2) {
    throw InfeasibleError("only " + std::to_string(p.points.size()) + " probe size(s) ran on " + probe_.device_name() +
                          "; a memory model needs two. Raise --memory-budget or use a smaller model");
  }
  return p;
}


void ProbeRunner::extend_linear_tail(Profile& p, int64_t largest_scheduled,
                                     const std::function<void(const WindowMeasurement&)>& record) {
  // The phase that sets the peak can change far beyond the probes. (That small probes may sit off
  // the line is the fit's business, memory_model.cpp.) A 256-512-512-10 MLP with SGD grows 7,256
  // bytes/sample up to b=128 (a b-independent backward transient on top of the activations sets
  // the peak) but 11,352 bytes/sample from b=256 on; from b <= 8 its largest microbatch under
  // 16 MiB was predicted at ~1,650 while 1,102 is the truth. So while the largest size worth
  // planning (the budget's predicted maximum, or the per-rank target if smaller) is more than 4x
  // the largest probe, one more probe is taken at half of it (at most two), which bounds the
  // extrapolation the confirmation relies on to about 2x. The first probes stay small (2 and 4:
  // cheap, and past b = 1, whose peak another phase can set: resnet18 at 64x64 peaks at 96.5 MiB
  // at b = 1 and 170.3 MiB at b = 2, then +1.7 MiB per sample), and the size from them is chosen
  // by their slope toward the budget: resnet18 at 209 MiB gets 2, 4, 12 and plans from there.
  constexpr int kMaxExtraProbes = 2;
  constexpr int64_t kMaxExtrapolation = 4;
  // Without a per-rank target the budget bounds the probes; without either, 4x the schedule.
  int64_t bound = options_.max_probe_micro_batch;
  if (bound <= 0) bound = budget_bytes_ ? MemoryModel::kMaxMicroBatch : kMaxExtrapolation * largest_scheduled;
  int64_t unmeasured = 0;  // a tail probe that ran out of memory even past the budget
  for (int extra = 0; extra < kMaxExtraProbes && p.points.size() >= 2; ++extra) {
    if (unmeasured == 0 && !trials_.empty() && !trials_.back().fit) break;  // the last probe already failed the budget
    int64_t predicted_max = 0;
    try {
      predicted_max = MemoryModel::fit(p).largest_fitting(device_total_bytes(), bound);
    } catch (const InputError&) {
      break;  // the planner will say what is wrong with these points
    }
    const int64_t largest = p.points.back().micro_batch;
    if (predicted_max <= kMaxExtrapolation * largest) break;
    // Half the prediction; after a tail probe that ran out of memory unmeasured, the geometric
    // mean of the largest measured size and that one instead: a line from b <= 4 can be off by
    // far more than 2x (lstm_classifier under 35 MiB: predicted 392, truth 40; the probe at 196
    // ran out of memory even under twice the budget and taught the fit nothing; sqrt(4 · 196) =
    // 28 is measured and does).
    const int64_t next = unmeasured > 0 ? static_cast<int64_t>(std::sqrt(static_cast<double>(largest) * static_cast<double>(unmeasured)))
                                        : predicted_max / 2;
    if (next <= largest) break;
    say("the fit predicts up to " + std::to_string(predicted_max) + " samples, far beyond b=" + std::to_string(largest) +
        "; probing b=" + std::to_string(next) + " to check the line there");
    // Where the budget is only simulated, the probe runs under twice it: a size past the budget
    // is then a measured point, not just an OOM, and the fit (weighted toward the large sizes)
    // learns the slope it got wrong. lstm_classifier under 21 MiB: from b = 2 and 4 the line
    // predicted 98 samples, the truth is 13; the OOM at 49 said only "less than 49" and four more
    // windows bisected down to 9.
    const bool past = can_pass_budget();
    const WindowMeasurement s = past_the_budget([&] { return measure(next); });
    record(s);
    if (s.oom && past && unmeasured == 0) {
      unmeasured = next;  // one more try, between the largest measured size and this one
      continue;
    }
    if (!s.fit) break;
  }
}

WindowMeasurement ProbeRunner::measure_tokens(int64_t micro_batch, int64_t seq_len, bool past_budget) {
  seq_len_ = seq_len;
  return past_budget ? past_the_budget([&] { return measure(micro_batch); }) : measure(micro_batch);
}

void ProbeRunner::profile_tokens(Profile& p) {
  const int64_t t_max = seq_range_->max;
  std::set<int64_t> lengths;
  for (int64_t t : {t_max / 4, t_max / 2, t_max}) lengths.insert(std::max({t, seq_range_->min, int64_t{1}}));
  auto record = [&](const WindowMeasurement& s, int64_t t, const std::string& kind) {
    Trial trial{kind, s.micro_batch, s.fit, s.oom ? 0 : s.max_peak_bytes, s.seconds, s.sizes};
    trial.seq_len = t;
    trials_.push_back(trial);
    if (s.oom) {
      say(kind + " b=" + std::to_string(s.micro_batch) + " x T=" + std::to_string(t) + ": out of memory");
      return;
    }
    p.points.push_back(point_of(s, s.micro_batch, s.peak_bytes, t));
    say(kind + " b=" + std::to_string(s.micro_batch) + " x T=" + std::to_string(t) + ": peak " + format_bytes(s.peak_bytes) +
        ", " + format_seconds(s.step_seconds) + (s.fit ? "" : " (over the budget)"));
  };
  // The grid: two sequence counts at up to three lengths — enough to tell b·T from b·T² and to
  // leave residuals. Measured past a simulated budget, so a point over it still teaches the fit.
  for (int64_t b : {1, 2}) {
    for (int64_t t : lengths) record(measure_tokens(b, t, true), t, "probe");
  }
  // Far more sequences predicted at T_max than measured: one window at half that, as for samples.
  try {
    const TokenMemoryModel model = TokenMemoryModel::fit(p);
    const int64_t cap = budget_bytes_ ? model.largest_micro_batch(t_max, *budget_bytes_) : 0;
    int64_t bound = options_.max_probe_micro_batch > 0 ? options_.max_probe_micro_batch : cap;
    if (cap > 8 && bound > 4) {
      const int64_t b = std::min(cap / 2, bound);
      say("the fit predicts up to " + std::to_string(cap) + " sequences of " + std::to_string(t_max) +
          " tokens; probing b=" + std::to_string(b) + " to check it there");
      record(measure_tokens(b, t_max, true), t_max, "probe");
    }
  } catch (const InputError&) {
    // Too few points for a fit: the planner says what is missing.
  }
}

Plan ProbeRunner::plan_and_confirm_tokens(Profile& profile, PlanRequest request) {
  constexpr int kMaxWindows = 4;
  for (int windows = 0;; ++windows) {
    Plan plan = make_plan(profile, request);
    if (plan.confirmed || windows >= kMaxWindows) return plan;
    const int64_t t = plan.tokens->max_seq_len;
    const int64_t b = std::max<int64_t>(1, plan.tokens->token_budget / t);
    WindowMeasurement s = measure_tokens(b, t, true);
    s.micro_batch = b;
    Trial trial{"confirm", b, s.fit, s.oom ? 0 : s.max_peak_bytes, s.seconds, s.sizes};
    trial.seq_len = t;
    trials_.push_back(trial);
    profile.trials.push_back(trial);
    if (!s.oom) profile.points.push_back(point_of(s, b, s.peak_bytes, t));
    say("confirm b=" + std::to_string(b) + " x T=" + std::to_string(t) + " (token budget " +
        std::to_string(plan.tokens->token_budget) + "): " +
        (s.oom ? std::string("out of memory") : "peak " + format_bytes(s.max_peak_bytes)) + " of " +
        format_bytes(plan.memory.budget_bytes) + " budget (predicted " + format_bytes(plan.memory.predicted_peak_bytes) +
        ")" + (s.fit ? ", fits" : "; lowering the budget"));
  }
}

Plan ProbeRunner::plan_and_confirm(Profile& profile, PlanRequest request) {
  if (!request.budget.is_set() && budget_bytes_) request.budget.bytes = budget_bytes_;
  if (seq_range_) return plan_and_confirm_tokens(profile, request);
  const std::optional<int64_t> user_bound = request.max_micro_batch;
  auto bounded = [&](int64_t b) { return user_bound ? std::min(*user_bound, b) : b; };
  // Climbing runs at most two windows past the first confirmation and none after any window
  // failed: the one promise is no OOM on the happy path, and each climb costs a window at the
  // largest size. Six windows in all is the most any plan spends here.
  constexpr int kMaxClimbs = 2;
  constexpr int kMaxWindows = 6;
  int64_t fits = 0;                                     // largest [b, b] window that ran within budget
  int64_t fails = std::numeric_limits<int64_t>::max();  // smallest size that did not
  for (const auto& t : profile.trials) {
    if (t.window.size() < 2) continue;
    if (t.fit) fits = std::max(fits, t.micro_batch);
    else fails = std::min(fails, t.micro_batch);
  }
  int windows = 0, climbs = 0;
  bool failed = false, out_of_windows = false;
  for (;;) {
    Plan plan = make_plan(profile, request);
    int64_t next = 0;
    std::string kind;
    if (plan.confirmed) {
      if (failed || climbs >= kMaxClimbs || windows >= kMaxWindows) return plan;
      next = climb_candidate(profile, request, plan);
      if (next == 0) next = whole_batch_candidate(profile, request, plan);
      if (next == 0) return plan;
      kind = "climb";
      ++climbs;
    } else if (windows >= kMaxWindows) {
      // Out of windows: the largest size that ran is the plan (unconfirmed if even that is not
      // covered, which the plan then says).
      if (out_of_windows) return plan;
      out_of_windows = true;
      if (fits < 1) {
        throw InfeasibleError("no window ran within the budget of " + format_bytes(plan.memory.budget_bytes) + " on " +
                              probe_.device_name() + " in " + std::to_string(windows) + " tries; raise --memory-budget");
      }
      request.max_micro_batch = bounded(fits);
      continue;
    } else {
      // The plan's largest allowed size: a window there covers every window of the plan.
      next = plan.accumulation_steps == 1 ? plan.micro_batch : plan.max_micro_batch;
      kind = "confirm";
    }
    // A window of two microbatches of `next` (the whole per-rank batch alone when that is the
    // plan: one microbatch, no gradient resident), then the optimizer step.
    const bool whole = next == plan.per_rank_batch && (kind == "climb" || plan.accumulation_steps == 1);
    // A simulated budget is raised to twice itself for the window (as for the tail probes): a
    // window over the budget is then measured, and the refit interpolates instead of bisecting
    // blind. lstm_classifier under 35 MiB: confirm 42 failed, the midpoint 29 fit, true max 40.
    WindowMeasurement s = past_the_budget([&] { return whole ? window({next}) : measure(next); });
    s.micro_batch = next;
    ++windows;
    // Within the budget less the margin's parts a measured size keeps (make_plan's own rule).
    const int64_t kept = kept_margin(plan.memory.margin).bytes_at(plan.fit.slope_bytes_per_sample, next);
    const bool ok = s.fit && s.max_peak_bytes + kept <= plan.memory.budget_bytes;
    const Trial trial{kind, next, ok, s.oom ? 0 : s.max_peak_bytes, s.seconds, s.sizes};
    trials_.push_back(trial);
    profile.trials.push_back(trial);
    // A steady-state point like any probe's, within the budget or measured past it: the fit
    // folds it in.
    const bool measured_point = !whole && !s.oom && s.steady_peak_bytes > 0;
    if (measured_point) {
      profile.points.push_back(point_of(s, next, s.steady_peak_bytes));
    }
    if (ok) {
      say(kind + " b=" + std::to_string(next) + ": peak " + format_bytes(s.max_peak_bytes) + " of " +
          format_bytes(plan.memory.budget_bytes) + " budget (predicted " +
          format_bytes(whole ? MemoryModel::fit(profile).predict_window_peak_bytes({next})
                             : MemoryModel::fit(profile).predict_window_peak_bytes({next, next})) +
          "), fits");
      if (!whole) fits = std::max(fits, next);
      continue;
    }
    say(kind + " b=" + std::to_string(next) + ": " +
        (s.oom ? std::string("out of memory") : "peak " + format_bytes(s.max_peak_bytes) + " over the budget") +
        (kind == "climb" ? "; the plan stays at the largest size that ran" : "; lowering the bound"));
    failed = true;
    fails = std::min(fails, next);
    if (next <= 1) {
      throw InfeasibleError("a real step at microbatch 1 does not fit the budget of " +
                            format_bytes(plan.memory.budget_bytes) + " on " + probe_.device_name() +
                            " although the fit predicted " + format_bytes(plan.memory.predicted_peak_bytes) +
                            "; raise --memory-budget");
    }
    // After a failed climb the plan is the largest size that ran; after a failed confirmation,
    // the refit decides below the failure when the failed window was measured, else bisect
    // between the largest size that ran and the smallest that failed.
    int64_t bound = kind == "climb" ? fits
                    : measured_point || fits >= fails ? next - 1
                                                      : fits + (fails - fits) / 2;
    request.max_micro_batch = bounded(std::max<int64_t>(1, std::min(bound, next - 1)));
  }
}

}  // namespace accumplan
