// executor/executor.cpp — the LibTorch backend of the one window algorithm: counting, the
// microbatch step, the gradient exchange, unscaling, clipping and the optimizer step. See
// executor.h and accumplan/window_loop.h for the contract.
#include "executor/executor.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <algorithm>
#include <cmath>
#include <exception>
#include <iostream>
#include <numeric>
#include <sstream>
#include <unordered_set>
#include <utility>

#include "accumplan/checked.h"
#include "accumplan/errors.h"
#include "accumplan/json_io.h"
#include "accumplan/token_model.h"
#include "accumplan/units.h"
#include "accumplan/ranks.h"
#include "accumplan/replan.h"
#include "accumplan/terms.h"
#include "executor/step_thread.h"
#include "runtime/model.h"
#include "runtime/optim.h"
#include "runtime/step.h"

namespace accumplan {
namespace {

std::vector<int64_t> range_indices(int64_t start, int64_t count) {
  std::vector<int64_t> v(static_cast<size_t>(count));
  std::iota(v.begin(), v.end(), start);
  return v;
}

bool token_shaped(const at::Tensor& target, const LossConfig& cfg) {
  return cfg.kind == "cross_entropy" && target.defined() && target.dim() >= 2 && !at::isFloatingType(target.scalar_type());
}

struct WindowUnits {
  int64_t units = 0;         // N: samples, or valid tokens in tokens mode
  int64_t valid_tokens = 0;  // non-ignored target tokens of a [B,T] target, whatever the mode
};

// The units of `n` samples, counted over the whole window at once: one host sync, not one per
// microbatch (the sum over the microbatches' slices is the same number).
WindowUnits count_window_units(const Batch& window, int64_t n, const LossConfig& cfg) {
  WindowUnits u;
  u.units = count_units(window.target, n, cfg);
  if (token_shaped(window.target, cfg)) {
    u.valid_tokens = cfg.normalization == Normalization::Tokens ? u.units
                                                                : window.target.ne(cfg.ignore_index).sum().item<int64_t>();
  }
  return u;
}

}  // namespace

int64_t batch_samples(const Batch& batch, const std::string& what) {
  std::optional<int64_t> n;
  auto check = [&](const at::Tensor& t, const std::string& name) {
    if (!t.defined()) return;
    if (t.dim() < 1) throw InputError(what + ": " + name + " is a scalar; dim 0 must index samples");
    if (n && *n != t.size(0)) {
      throw InputError(what + ": " + name + " has " + std::to_string(t.size(0)) + " samples (dim 0) but the first tensor has " +
                       std::to_string(*n));
    }
    n = t.size(0);
  };
  for (size_t i = 0; i < batch.inputs.size(); ++i) check(batch.inputs[i], "input " + std::to_string(i));
  check(batch.target, "the target");
  if (!n) throw InputError(what + " holds no tensors");
  return *n;
}

std::vector<int64_t> valid_tokens_per_sample(const Batch& data, int64_t ignore_index) {
  if (!data.ragged()) {
    throw InputError("windows by tokens (--target-tokens) need ragged data: a torch.save([list_of_1d_token_tensors, "
                     "targets]) file, or synthetic lengths from the plan's setup.seq_len");
  }
  const at::Tensor& t = data.target;
  if (!t.defined() || t.dim() < 2 || at::isFloatingType(t.scalar_type())) return data.sequence_lengths();
  const at::Tensor counts = t.ne(ignore_index).reshape({t.size(0), -1}).sum(1).to(at::kLong).contiguous();
  return std::vector<int64_t>(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + counts.numel());
}

std::vector<std::pair<int64_t, int64_t>> plan_windows(const Batch& data, const Plan& plan, int64_t ignore_index) {
  if (plan.tokens && plan.tokens->target_tokens) {
    return token_windows(valid_tokens_per_sample(data, ignore_index), *plan.tokens->target_tokens);
  }
  return epoch_windows(batch_samples(data, "the data"), plan.target_batch);  // the global window
}

namespace {
// The window's samples in `s` (views, no copy).
Batch slice_window(const Batch& window, const SampleSlice& s) {
  auto part = [&](const at::Tensor& t) { return t.slice(0, s.start, s.stop, s.step); };
  Batch out;
  for (const auto& t : window.inputs) out.inputs.push_back(part(t));
  if (window.target.defined()) out.target = part(window.target);
  if (window.lengths.defined()) out.lengths = part(window.lengths);
  return out;
}
}  // namespace

Batch stride_window(const Batch& window, int rank, int world_size) {
  return slice_window(window, strided_slice(rank, world_size, batch_samples(window)));
}

Batch rank_window(const Batch& window, const Plan& plan, int rank, int world_size) {
  if (plan.world_size != world_size) {
    throw InputError("the plan is for world size " + std::to_string(plan.world_size) + ", not " + std::to_string(world_size));
  }
  return slice_window(window, rank_slice(plan, rank, batch_samples(window)));
}

std::vector<std::pair<int64_t, int64_t>> epoch_windows(int64_t samples, int64_t per_rank_batch) {
  if (per_rank_batch < 1) throw InputError("per_rank_batch must be >= 1");
  std::vector<std::pair<int64_t, int64_t>> w;
  for (int64_t start = 0; start < samples; start += per_rank_batch) {
    w.emplace_back(start, std::min(per_rank_batch, samples - start));
  }
  return w;
}


// The window loop's backend over this executor's module, optimizer, probe and communicator; the
// window it counts and slices is set for each accumulate().
class Executor::Backend : public WindowBackend {
 public:
  explicit Backend(Executor& e) : e_(e) {}
  const Batch* window = nullptr;

  int world_size() const override { return e_.options_.communicator ? e_.options_.communicator->world_size() : 1; }
  int rank() const override { return e_.options_.communicator ? e_.options_.communicator->rank() : 0; }
  bool exchanges() const override { return e_.options_.communicator && e_.options_.communicator->exchanges(); }
  std::vector<int64_t> sum_over_ranks(const std::vector<int64_t>& values) override {
    return e_.options_.communicator->all_reduce_counters(values);
  }

  // Counting reads the window's target on the host, where the data lives: no device sync.
  ShareCounts count_share() override {
    ShareCounts c;
    c.samples = batch_samples(*window);
    c.normalization = e_.options_.loss.normalization == Normalization::Tokens ? "tokens" : "samples";
    if (c.samples > 0) {
      const WindowUnits u = count_window_units(*window, c.samples, e_.options_.loss);
      c.units = u.units;
      c.valid_tokens = u.valid_tokens;
    }
    if (c.samples > 0 && window->ragged()) c.lengths = window->sequence_lengths();
    return c;
  }

  void begin_attempt() override {
    e_.zero_grads();
    loss_total_ = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(e_.device_));
  }

  void run_microbatch(const Microbatch& mb, int64_t units) override {
    if (!e_.step_thread_) e_.step_thread_ = std::make_unique<StepThread>(e_.device_);
    // A packed microbatch's samples; else the slice from `start`, ragged data cut to its own longest.
    const Batch microbatch = !mb.samples.empty() ? window->gather(mb.samples)
                             : window->ragged()  ? window->gather(range_indices(mb.start, mb.where.size))
                                                 : window->slice(mb.start, mb.where.size);
    StepConfig step{e_.options_.loss, e_.options_.amp, e_.device_, e_.options_.probe};
    step.padding_mask = e_.options_.padding_mask;
    const at::Tensor scale = e_.scaler_ ? e_.scaler_->scale_tensor() : at::Tensor();
    at::Tensor loss_sum;
    e_.step_thread_->run([&] { loss_sum = microbatch_step(e_.module_, microbatch, step, static_cast<double>(units), scale); });
    loss_total_ += loss_sum;
  }

  bool is_out_of_memory(const std::exception& error) const override { return accumplan::is_out_of_memory(error, e_.options_.probe); }

  void after_out_of_memory() override {
    // The thread's autograd queue may still hold a failed backward's memory: joining frees it.
    e_.step_thread_.reset();
    e_.zero_grads();
    if (e_.options_.probe) {
      e_.options_.probe->clear_oom();
      e_.options_.probe->release_cached();
    }
  }

  void release_cached() override {
    if (e_.options_.probe) e_.options_.probe->release_cached();
  }

  // The window's one host read; the sum's device memory is freed with it.
  double loss_sum() override { return std::exchange(loss_total_, at::Tensor()).item<double>(); }

  // ONE exchange: every trainable parameter's gradient (zeros where this rank made none, so every
  // rank sends the same list) and this rank's loss sum in the last bucket.
  double exchange_gradients() override {
    std::vector<at::Tensor> exchange;
    exchange.reserve(e_.params_.size() + 1);
    for (auto& p : e_.params_) {
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p.detach());
      exchange.push_back(p.grad());  // same TensorImpl: the exchange writes into .grad in place
    }
    const auto grad_dtype = exchange.back().scalar_type();
    const bool wide = grad_dtype == at::kFloat || grad_dtype == at::kDouble;
    exchange.push_back(loss_total_.reshape({1}).to(exchange.back().options().dtype(wide ? grad_dtype : at::kFloat)));
    e_.options_.communicator->all_reduce_gradients(exchange);
    loss_total_ = at::Tensor();
    return exchange.back().item<double>();
  }

  bool has_scaler() const override { return e_.scaler_.has_value(); }
  double loss_scale() const override { return e_.loss_scale(); }
  bool unscale_finds_non_finite() override { return e_.scaler_ && e_.scaler_->unscale_and_check(e_.params_); }

  double gradient_norm() override {
    std::vector<at::Tensor> norms;
    for (const auto& p : e_.params_) {
      if (p.grad().defined()) norms.push_back(p.grad().detach().norm(2).to(at::kDouble));
    }
    return norms.empty() ? 0.0 : at::stack(norms).norm(2).item<double>();
  }

  void scale_gradients(double coefficient) override {
    for (auto& p : e_.params_) {
      if (p.grad().defined()) p.mutable_grad().mul_(coefficient);
    }
  }

  void optimizer_step(int64_t step) override {
    if (e_.options_.lr_schedule) set_learning_rate(e_.optimizer_, e_.options_.lr_schedule(step));
    e_.optimizer_.step();
    // Sharded state: this rank stepped its own parameters; every rank takes each from its owner.
    if (!e_.options_.parameter_owners.empty()) {
      e_.options_.communicator->broadcast_from_owners(e_.params_, e_.options_.parameter_owners);
    }
  }

  void after_update(bool stepped, const StepEvent& event) override {
    if (e_.scaler_) e_.scaler_->update(!stepped);
    if (stepped && e_.options_.on_step) e_.options_.on_step(event);
  }

  void drop_gradients() override { e_.zero_grads(); }
  bool optimizer_state_exists() const override { return !e_.optimizer_.state().empty(); }
  bool wall_time_is_device_time() const override { return e_.device_.is_cpu(); }
  std::optional<int64_t> budget_bytes() const override {
    return e_.options_.probe ? e_.options_.probe->budget_bytes() : std::nullopt;
  }

 private:
  Executor& e_;
  at::Tensor loss_total_;  // the window's loss sum, on the device until the window's one host read
};

Executor::~Executor() = default;

Executor::Executor(torch::jit::Module module, torch::optim::Optimizer& optimizer, Plan plan, ExecutorOptions options)
    : module_(std::move(module)), optimizer_(optimizer), plan_(std::move(plan)), options_(std::move(options)),
      device_(at::kCPU), loop_(plan_) {
  module_.train();
  std::unordered_set<const void*> in_module;
  params_ = trainable_parameters(module_);
  for (const auto& p : params_) in_module.insert(p.unsafeGetTensorImpl());
  if (params_.empty()) throw InputError("the model has no trainable parameters");
  device_ = params_.front().device();
  for (const auto& group : optimizer_.param_groups()) {
    for (const auto& p : group.params()) {
      if (!in_module.count(p.unsafeGetTensorImpl())) {
        throw InputError("the optimizer holds a tensor that is not a trainable parameter of the model; build it from "
                         "the module's parameters");
      }
    }
  }
  if (options_.communicator && plan_.world_size != options_.communicator->world_size()) {
    throw InputError("the plan is for world size " + std::to_string(plan_.world_size) + " but the process group has " +
                     std::to_string(options_.communicator->world_size()) + " ranks; re-plan with " + option_name("--world-size") + " " +
                     std::to_string(options_.communicator->world_size()));
  }
  if (options_.amp == AmpMode::FP16) scaler_.emplace(options_.scaler, device_);
  if (options_.max_grad_norm && !(*options_.max_grad_norm > 0)) {
    throw InputError("max gradient norm must be positive, got " + std::to_string(*options_.max_grad_norm));
  }
  window_options_ = window_options();
  backend_ = std::make_unique<Backend>(*this);
}

WindowOptions Executor::window_options() {
  WindowOptions w;
  w.oom_recovery = options_.oom_recovery;
  w.max_grad_norm = options_.max_grad_norm;
  w.packing = options_.packing;
  w.log = [this](const std::string& line) { log(line); };
  w.before_microbatch = options_.before_microbatch;
  w.after_microbatch = options_.after_microbatch;
  w.before_optimizer_step = options_.before_optimizer_step;
  w.on_replan = [this](const ReplanEvent& event, const Plan& plan) {
    // Every rank re-plans identically; one writer is enough and avoids W renames onto one path.
    const bool writer = !options_.communicator || options_.communicator->rank() == 0;
    if (!options_.plan_out.empty() && writer) write_text_atomic(options_.plan_out, json_text(to_json(plan)));
    if (options_.on_replan) options_.on_replan(event);
  };
  return w;
}

double Executor::loss_scale() const { return scaler_ ? scaler_->scale() : 1.0; }

void Executor::log(const std::string& line) const {
  if (options_.log) {
    options_.log(line);
  } else {
    std::cerr << "accumplan: " << line << "\n" << std::flush;
  }
}

void Executor::zero_grads() {
  // Set to none rather than filled with zeros: the memory is returned between windows and after
  // an out-of-memory, and the first backward of a window writes the gradient instead of adding.
  for (auto& p : params_) {
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
  }
}

void Executor::warm_up(const Batch& window) {
  if (window.size() < 1) return;  // a rank of a group may hold no sample of a small window
  int64_t pick = 0;
  if (window.ragged()) {
    const std::vector<int64_t> lengths = window.sequence_lengths();
    pick = std::min_element(lengths.begin(), lengths.end()) - lengths.begin();
  }
  const Batch sample = window.ragged() ? window.gather({pick}) : window.slice(0, 1);
  // What the step changes besides the gradients: (the module's own tensor, its value before).
  std::vector<std::pair<at::Tensor, at::Tensor>> buffers;
  for (const auto& b : module_.named_buffers(/*recurse=*/true)) buffers.emplace_back(b.value, b.value.clone());
  std::vector<std::pair<at::Generator, at::Tensor>> generators;
  for (const at::Device d : {at::Device(at::kCPU), device_}) {
    if (d.is_cpu() && !generators.empty()) continue;
    at::Generator g = at::globalContext().defaultGenerator(d);
    generators.emplace_back(g, g.get_state());
  }
  StepConfig step{options_.loss, options_.amp, device_, options_.probe};
  step.padding_mask = options_.padding_mask;
  try {
    if (!step_thread_) step_thread_ = std::make_unique<StepThread>(device_);
    step_thread_->run([&] { microbatch_step(module_, sample, step, 1.0, at::Tensor()); });
  } catch (const std::exception&) {
    // Left to the first window, which raises its own error with its own shapes, or recovers from
    // its own out-of-memory. One sample may fail where a window does not: BatchNorm1d refuses a
    // batch of one in training.
    step_thread_.reset();
    if (options_.probe) options_.probe->clear_oom();
  }
  zero_grads();
  {
    at::NoGradGuard no_grad;
    for (auto& [tensor, before] : buffers) tensor.copy_(before);
  }
  for (auto& [g, state] : generators) g.set_state(state);
}


WindowStats Executor::accumulate(const Batch& window, const std::vector<int64_t>& sizes) {
  if (options_.probe) {
    options_.probe->clear_oom();
    options_.probe->reset_peak();
  }
  backend_->window = &window;
  struct Release {
    Backend& b;
    ~Release() { b.window = nullptr; }
  } release{*backend_};
  WindowStats st = loop_.accumulate(*backend_, window_options_, sizes);
  if (options_.probe) {
    st.peak_bytes = options_.probe->peak_bytes();
    st.reserved_peak_bytes = options_.probe->reserved_peak_bytes();
  }
  return st;
}

void Executor::apply(WindowStats& st) {
  loop_.apply(*backend_, window_options_, st);
  if (!options_.probe) return;
  // The window's peak, its optimizer step included.
  WindowTotals& totals = loop_.totals();
  const int64_t peak = std::max(st.peak_bytes.value_or(0), options_.probe->peak_bytes());
  st.peak_bytes = peak;
  totals.peak_bytes = std::max(totals.peak_bytes.value_or(0), peak);
  if (const std::optional<int64_t> reserved = options_.probe->reserved_peak_bytes()) {
    st.reserved_peak_bytes = std::max(st.reserved_peak_bytes.value_or(0), *reserved);
    totals.reserved_peak_bytes = std::max(totals.reserved_peak_bytes.value_or(0), *st.reserved_peak_bytes);
  }
}

std::optional<RunTimeModel> Executor::time_model() const { return loop_.time_model(options_.packing); }

WindowStats Executor::step(const Batch& window) {
  WindowStats st = accumulate(window);
  apply(st);
  return st;
}

}  // namespace accumplan
