// executor/executor.cpp — the accumulation window, its weighting, AMP, clipping, gating and OOM
// recovery. See executor.h for the contract and docs/weighting.md, docs/oom-contract.md for why each rule exists.
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

#include "accumplan/checked.h"
#include "accumplan/errors.h"
#include "accumplan/json_io.h"
#include "accumplan/token_model.h"
#include "accumplan/units.h"
#include "accumplan/replan.h"
#include "executor/step_thread.h"
#include "runtime/model.h"
#include "runtime/optim.h"
#include "runtime/step.h"

namespace accumplan {
namespace {

// "22,21,21"; long lists are cut after 8 entries so a log line stays one readable line.
std::string join(const std::vector<int64_t>& v) { return join_sizes(v, 8); }

// The first line of an exception message: TorchScript's rewrapped errors run to dozens of lines
// of interpreter traceback; the log line only needs what happened.
std::string first_line(const std::string& s) {
  const auto nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

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

// After an agreement collective: `status[r]` is -1 when rank r hit an error that is not an OOM.
// The failing rank rethrows its own error; every other rank throws one that names it, so no rank
// waits for a collective its peer will never join (that would only end at the group's timeout).
void throw_if_a_rank_failed(const std::vector<int64_t>& status, const std::exception_ptr& local_error,
                            const std::string& during) {
  for (size_t r = 0; r < status.size(); ++r) {
    if (status[r] >= 0) continue;
    if (local_error) std::rethrow_exception(local_error);
    throw Error("rank " + std::to_string(r) + " failed " + during + " (its own log says why); this rank stops with it");
  }
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
  return epoch_windows(batch_samples(data, "the data"), checked_mul(plan.per_rank_batch, plan.world_size, "the global window"));
}

Batch shard_window(const Batch& window, int rank, int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw InputError("rank " + std::to_string(rank) + " is not in a group of " + std::to_string(world_size));
  }
  const int64_t n = batch_samples(window);
  // slice(dim, start, end, step); a start past the end gives 0 rows, a rank with no share.
  auto part = [&](const at::Tensor& t) { return t.slice(0, std::min<int64_t>(rank, n), n, world_size); };
  Batch out;
  for (const auto& t : window.inputs) out.inputs.push_back(part(t));
  if (window.target.defined()) out.target = part(window.target);
  if (window.lengths.defined()) out.lengths = part(window.lengths);
  return out;
}

std::vector<std::pair<int64_t, int64_t>> epoch_windows(int64_t samples, int64_t per_rank_batch) {
  if (per_rank_batch < 1) throw InputError("per_rank_batch must be >= 1");
  std::vector<std::pair<int64_t, int64_t>> w;
  for (int64_t start = 0; start < samples; start += per_rank_batch) {
    w.emplace_back(start, std::min(per_rank_batch, samples - start));
  }
  return w;
}

Executor::~Executor() = default;

Executor::Executor(torch::jit::Module module, torch::optim::Optimizer& optimizer, Plan plan, ExecutorOptions options)
    : module_(std::move(module)), optimizer_(optimizer), plan_(std::move(plan)), options_(std::move(options)), device_(at::kCPU) {
  check_plan_window(plan_);  // a plan made in code obeys the reader's rules
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
                     std::to_string(options_.communicator->world_size()) + " ranks; re-plan with --world-size " +
                     std::to_string(options_.communicator->world_size()));
  }
  if (options_.amp == AmpMode::FP16) scaler_.emplace(options_.scaler, device_);
  if (plan_.tokens) {
    // The plan's own memory model, to predict the peak of what each window packs (the planner's
    // rule); the cost the first window is cut by is the plan's.
    packed_peak_.emplace(plan_.profile);
    packing_cost_.emplace(plan_.tokens->step_cost);
  }
  if (options_.max_grad_norm && !(*options_.max_grad_norm > 0)) {
    throw InputError("max gradient norm must be positive, got " + std::to_string(*options_.max_grad_norm));
  }
}

double Executor::loss_scale() const { return scaler_ ? scaler_->scale() : 1.0; }

void Executor::log(const std::string& line) const {
  // Every rank logs the same recoveries; say which rank is speaking.
  const std::string text = options_.communicator && options_.communicator->world_size() > 1
                               ? "rank " + std::to_string(options_.communicator->rank()) + ": " + line
                               : line;
  if (options_.log) {
    options_.log(text);
  } else {
    std::cerr << "accumplan: " << text << "\n" << std::flush;
  }
}

void Executor::zero_grads() {
  // Set to none rather than filled with zeros: the memory is returned between windows and after
  // an OOM, and the first backward of a window writes the gradient instead of adding to zeros.
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

void Executor::fail_oom(const std::string& message) {
  // The window's gradients are partial (or half unscaled): drop them rather than step on them,
  // and leave the probe ready for whatever the caller does next.
  zero_grads();
  if (options_.probe) options_.probe->clear_oom();
  throw ExecutorOomError(message);
}

void Executor::recover(int64_t failing_size, const MicrobatchEvent& where, const std::string& what) {
  zero_grads();
  if (options_.probe) {
    options_.probe->clear_oom();
    options_.probe->release_cached();
  }
  if (failing_size <= 1) {
    const std::optional<int64_t> budget = options_.probe ? options_.probe->budget_bytes() : std::nullopt;
    throw ExecutorOomError(
        "out of memory in window " + std::to_string(where.window) + " at microbatch " + std::to_string(where.index + 1) +
        " of " + std::to_string(where.count) + " with a single sample: the weights, gradients and optimizer state plus "
        "one sample do not fit" +
        (budget ? " the enforced budget of " + format_bytes(*budget) : std::string(" in device memory")) +
        ". Nothing smaller can be tried; raise the budget, free device memory, or shrink the model or its inputs (" +
        first_line(what) + ")");
  }
  std::string note;
  Plan next = replan_below(plan_, failing_size, &note);
  plan_ = std::move(next);
  ++totals_.oom_recoveries;
  std::ostringstream line;
  line << "out of memory in window " << where.window << " at microbatch " << (where.index + 1) << " of " << where.count
       << " (size " << where.size << "); re-planned to " << plan_.accumulation_steps << " microbatches of at most "
       << plan_.micro_batch << " (" << join(plan_.microbatch_sizes) << ") — " << note
       << "; replaying the window from its first sample";
  log(line.str());
  // Every rank re-plans identically; one writer is enough and avoids W renames onto one path.
  const bool writer = !options_.communicator || options_.communicator->rank() == 0;
  if (!options_.plan_out.empty() && writer) write_text_atomic(options_.plan_out, json_text(to_json(plan_)));
  if (options_.on_replan) options_.on_replan(ReplanEvent{where.window, failing_size, plan_.microbatch_sizes, note});
}

void Executor::recover_packed(int64_t failing_tokens, int64_t longest_sequence, const std::vector<int64_t>& lengths,
                              const MicrobatchEvent& where, const std::string& what) {
  zero_grads();
  if (options_.probe) {
    options_.probe->clear_oom();
    options_.probe->release_cached();
  }
  const int64_t budget = std::min(plan_.tokens->token_budget, failing_tokens - 1);
  if (budget < longest_sequence) {
    const std::optional<int64_t> limit = options_.probe ? options_.probe->budget_bytes() : std::nullopt;
    throw ExecutorOomError(
        "out of memory in window " + std::to_string(where.window) + " at microbatch " + std::to_string(where.index + 1) +
        " of " + std::to_string(where.count) + " (" + std::to_string(failing_tokens) + " padded tokens): a token budget below " +
        std::to_string(failing_tokens) + " cannot hold this window's longest sequence of " + std::to_string(longest_sequence) +
        " tokens, and one sequence cannot be split. Truncate the sequences to fewer tokens, or raise the budget" +
        (limit ? " (enforced: " + format_bytes(*limit) + ")" : std::string()) + " (" + first_line(what) + ")");
  }
  plan_ = repack_below(plan_, failing_tokens);
  ++totals_.oom_recoveries;
  log("out of memory in window " + std::to_string(where.window) + " at microbatch " + std::to_string(where.index + 1) +
      " of " + std::to_string(where.count) + " (" + std::to_string(failing_tokens) +
      " padded tokens); token budget lowered to " + std::to_string(budget) +
      " padded tokens per microbatch; re-packing and replaying the window from its first sample");
  const bool writer = !options_.communicator || options_.communicator->rank() == 0;
  if (!options_.plan_out.empty() && writer) write_text_atomic(options_.plan_out, json_text(to_json(plan_)));
  if (options_.on_replan) {
    std::vector<int64_t> sizes;
    if (!lengths.empty()) {
      for (const auto& g : pack_by_token_budget(lengths, budget, plan_.tokens->step_cost)) {
        sizes.push_back(static_cast<int64_t>(g.size()));
      }
    }
    options_.on_replan(ReplanEvent{where.window, failing_tokens, sizes, "token budget " + std::to_string(budget)});
  }
}

// How a window is cut into microbatches, for sample and packed plans alike: by the plan's sizes
// (window_sizes; an override on a first attempt), or packed by tokens (pack_by_token_budget).
// It reads the executor's plan by reference, so a cut after a re-plan follows the new plan.
class WindowSplit {
 public:
  WindowSplit(const Plan& plan, const Batch& window, int64_t n, const std::vector<int64_t>& sizes_override, int world)
      : plan_(plan), window_(window), n_(n), override_(sizes_override), packed_(plan.tokens.has_value()) {
    if (!override_.empty()) {
      if (world > 1) {
        throw InputError("microbatch sizes cannot be overridden in a data-parallel window: every rank must know every "
                         "rank's split to run the same number of rounds");
      }
      const int64_t sum = std::accumulate(override_.begin(), override_.end(), int64_t{0});
      if (sum != n || *std::min_element(override_.begin(), override_.end()) < 1) {
        throw InputError("microbatch sizes " + join(override_) + " do not split a window of " + std::to_string(n) +
                         " samples");
      }
    }
    if (packed_ && n > 0 && !window.ragged()) {
      throw InputError("this plan packs ragged data by tokens (plan.tokens) but the window holds fixed-shape samples "
                       "with no sequence lengths; load the data from a torch.save([list_of_1d_token_tensors, targets]) file");
    }
    if (packed_ && !override_.empty()) {
      throw InputError("microbatch sizes cannot be overridden under a packed plan: its microbatches are cut by the "
                       "token budget");
    }
    if (packed_ && n > 0) lengths_ = window.sequence_lengths();
  }

  bool packed() const { return packed_; }
  const std::vector<int64_t>& lengths() const { return lengths_; }  // packed: each sample's length
  const std::vector<int64_t>& sizes() const { return sizes_; }
  // The split of `m` samples of another rank under the plan (sample plans).
  std::vector<int64_t> split_of(int64_t m) const { return m == 0 ? std::vector<int64_t>{} : window_sizes(plan_, m); }

  // Cuts the window for attempt `attempt` (0: the first; later ones follow the re-planned plan);
  // packed plans by `cost` (none: each microbatch filled).
  void cut(int64_t attempt, const std::optional<TokenStepCost>& cost) {
    if (packed_) {
      groups_.clear();
      cost_ = cost;
      if (!lengths_.empty()) groups_ = pack_by_token_budget(lengths_, plan_.tokens->token_budget, cost);
      sizes_.clear();
      for (const auto& g : groups_) sizes_.push_back(static_cast<int64_t>(g.size()));
    } else {
      sizes_ = attempt == 0 && !override_.empty() ? override_ : split_of(n_);
    }
  }
  // Microbatch i, which starts at sample `start` (sample plans). Ragged data under a sample plan:
  // the slice, cut to its own longest sequence (samples sorted by length within a window then pad
  // little, as Hugging Face's group_by_length).
  Batch microbatch(int64_t i, int64_t start) const {
    if (packed_) return window_.gather(groups_[static_cast<size_t>(i)]);
    const int64_t size = sizes_[static_cast<size_t>(i)];
    return window_.ragged() ? window_.gather(range_indices(start, size)) : window_.slice(start, size);
  }
  const std::optional<TokenStepCost>& cost() const { return cost_; }  // packed: what the cut minimised
  // Packed: microbatch i's longest sequence, what it is padded to; 0 for sample plans.
  int64_t padded_length(int64_t i) const {
    return packed_ ? lengths_[static_cast<size_t>(groups_[static_cast<size_t>(i)].front())] : 0;
  }
  // Packed: microbatch i's padded tokens (its size × its longest sequence); 0 for sample plans.
  int64_t padded_tokens(int64_t i) const {
    return packed_ ? static_cast<int64_t>(groups_[static_cast<size_t>(i)].size()) * padded_length(i) : 0;
  }

 private:
  const Plan& plan_;
  const Batch& window_;
  int64_t n_;
  std::vector<int64_t> override_;
  bool packed_;
  std::vector<int64_t> lengths_;
  std::vector<std::vector<int64_t>> groups_;  // packed: each microbatch's sample indices
  std::optional<TokenStepCost> cost_;
  std::vector<int64_t> sizes_;
};

// What every rank knows of a window after the counts collective.
struct Executor::WindowCounts {
  std::vector<int64_t> rank_samples;  // samples of rank 0 .. W-1
  int64_t longest_sequence = 0;       // packed: the longest sequence on any rank
};

// The agreed outcome of one attempt's rounds.
struct Executor::RoundsOutcome {
  int64_t failing = 0;       // the smallest size (packed: padded tokens) that ran out of memory; 0 = none
  int64_t failed_round = 0;
  int failing_rank = -1;
  std::string what;          // this rank's out-of-memory message, first line
  // Packed plans, this attempt's microbatches that ran; kept only if the attempt completes (a
  // replay runs them again).
  double microbatch_seconds = 0;               // measured (CPU)
  double predicted_seconds = 0;                // as the cut's cost predicted them
  bool every_one_predicted = true;             // false: predicted_seconds means nothing
  std::vector<TimedMicrobatch> timed;          // for the step time fit
  std::vector<double> misses;                  // |predicted − measured| / measured
  std::optional<int64_t> predicted_peak_bytes; // the memory model's largest
};

int Executor::world() const { return options_.communicator ? options_.communicator->world_size() : 1; }
int Executor::rank() const { return options_.communicator ? options_.communicator->rank() : 0; }

// One process is a group of one: every collective is the identity for it, so it is skipped, and
// the algorithm is otherwise the same for 1 and W ranks.
std::vector<int64_t> Executor::sum_over_ranks(const std::vector<int64_t>& values) const {
  return world() > 1 ? options_.communicator->all_reduce_counters(values) : values;
}

// (a) Counts before the first backward, in ONE collective: [units, samples, valid tokens,
// samples of rank 0 .. W-1]. The per-rank slots let every rank compute every rank's split (hence
// the number of rounds) and check every rank's share identically; a slot of -1 says that rank
// could not count its share, and every rank stops. Counting reads the window's target on the host
// (the data stays there; microbatches move to the device one at a time): no device sync. Packed
// plans add every rank's longest sequence: [..., longest of rank 0 .. W-1].
Executor::WindowCounts Executor::count_window(const Batch& window, const WindowSplit& split, WindowStats& st) {
  const int W = world(), r = rank();
  const int64_t n = st.local_samples;
  std::vector<int64_t> local(3 + static_cast<size_t>(W) * (split.packed() ? 2 : 1), 0);
  std::exception_ptr count_error;
  try {
    if (n > 0) {
      const WindowUnits counted = count_window_units(window, n, options_.loss);
      local[0] = counted.units;
      local[2] = counted.valid_tokens;
    }
    local[1] = n;
    local[3 + static_cast<size_t>(r)] = n;
    const auto& lengths = split.lengths();
    if (!lengths.empty()) local[3 + static_cast<size_t>(W + r)] = *std::max_element(lengths.begin(), lengths.end());
  } catch (const std::exception&) {
    if (W == 1) throw;
    count_error = std::current_exception();
    local[3 + static_cast<size_t>(r)] = -1;
  }
  const std::vector<int64_t> global = sum_over_ranks(local);
  WindowCounts c;
  c.rank_samples.assign(global.begin() + 3, global.begin() + 3 + W);
  c.longest_sequence = split.packed() ? *std::max_element(global.begin() + 3 + W, global.end()) : 0;
  throw_if_a_rank_failed(c.rank_samples, count_error, "while counting the units of window " + std::to_string(window_index_));
  st.units = global[0];
  st.samples = global[1];
  st.valid_tokens = global[2];
  check_window_counts(c, st, split.packed());
  return c;
}

// Every rank sees the same numbers, so every rank throws the same error: nobody is left waiting.
void Executor::check_window_counts(const WindowCounts& c, const WindowStats& st, bool packed) const {
  const int W = world();
  const int64_t n = st.local_samples;
  // A --target-tokens plan's windows are cut by tokens (token_windows) and hold any number of samples.
  const bool by_tokens = packed && plan_.tokens->target_tokens.has_value();
  if (W == 1 && (n < 1 || (n > plan_.per_rank_batch && !by_tokens))) {
    throw InputError("a window holds 1.." + std::to_string(plan_.per_rank_batch) +
                     " samples (the plan's per-rank batch); got " + std::to_string(n));
  }
  if (st.samples < 1) throw InputError("window " + std::to_string(window_index_) + " holds no samples on any rank");
  for (int r = 0; r < W && !by_tokens; ++r) {
    if (c.rank_samples[static_cast<size_t>(r)] > plan_.per_rank_batch) {
      throw InputError("rank " + std::to_string(r) + " was handed " + std::to_string(c.rank_samples[static_cast<size_t>(r)]) +
                       " samples of a global window of " + std::to_string(st.samples) + ", more than the plan's per-rank "
                       "batch " + std::to_string(plan_.per_rank_batch) + ". Shard each global window of " +
                       std::to_string(plan_.per_rank_batch * W) + " samples strided: rank r takes r, r+W, r+2W, ...");
    }
  }
  // A sequence the plan was not made for is refused on every rank alike (every rank knows the
  // longest): the budget was confirmed with sequences of at most max_seq_len tokens, and with an
  // attention-like T^2 cost a longer one under the same budget could need more memory.
  if (packed && c.longest_sequence > plan_.tokens->max_seq_len) {
    throw InputError("window " + std::to_string(window_index_) + " holds a sequence of " + std::to_string(c.longest_sequence) +
                     " tokens" + (W > 1 ? " on any rank" : "") + ", longer than the " +
                     std::to_string(plan_.tokens->max_seq_len) +
                     " tokens the plan's token budget was planned for (plan.tokens.max_seq_len); truncate the "
                     "sequences or plan again with a longer --seq-len");
  }
}

// (b) Same number of rounds everywhere: the largest split of any rank (the plan is the same on
// every rank, and so is every rank's count). 5 and 4 samples under sizes 2,2,1 give 3 and 2
// microbatches: rank 1 runs one empty round. Packed, the counts depend on each rank's lengths:
// one collective of them.
int64_t Executor::rounds_for(const WindowSplit& split, const WindowCounts& c) const {
  int64_t rounds = static_cast<int64_t>(split.sizes().size());
  if (split.packed() && world() > 1) {
    std::vector<int64_t> counts(static_cast<size_t>(world()), 0);
    counts[static_cast<size_t>(rank())] = rounds;
    for (int64_t n : sum_over_ranks(counts)) rounds = std::max(rounds, n);
  } else if (!split.packed()) {
    for (int64_t m : c.rank_samples) rounds = std::max(rounds, static_cast<int64_t>(split.split_of(m).size()));
  }
  return rounds;
}

// Microbatch i of this rank's split: forward, loss, backward on the step thread. Returns 0, the
// size (packed: padded tokens) when it ran out of memory (`what` says how), or -1 for another
// error on a rank of a group (`error` holds it; alone, it is thrown).
int64_t Executor::run_microbatch(const WindowSplit& split, const MicrobatchEvent& where, int64_t start, double units,
                                 at::Tensor& loss_total, std::string& what, std::exception_ptr& error,
                                 double& seconds) {
  int64_t status = 0;
  try {
    if (options_.before_microbatch) options_.before_microbatch(where);
    if (!step_thread_) step_thread_ = std::make_unique<StepThread>(device_);
    // Timed: the microbatch's gather (padding) and its step, not the hooks around them.
    const auto t0 = std::chrono::steady_clock::now();
    const Batch microbatch = split.microbatch(where.index, start);
    StepConfig step{options_.loss, options_.amp, device_, options_.probe};
    step.padding_mask = options_.padding_mask;
    const at::Tensor scale = scaler_ ? scaler_->scale_tensor() : at::Tensor();
    at::Tensor loss_sum;
    step_thread_->run([&] { loss_sum = microbatch_step(module_, microbatch, step, units, scale); });
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    loss_total += loss_sum;
  } catch (const std::exception& e) {
    if (is_out_of_memory(e, options_.probe)) {
      status = split.packed() ? where.padded_tokens : where.size;
      what = first_line(e.what());
    } else {
      if (world() == 1) throw;
      status = -1;
      error = std::current_exception();
    }
  }
  // Out of the catch block: the exception and every tensor of a failed microbatch (its inputs on
  // the device, activations, autograd graph) are released — except what a backward that failed
  // left in its thread's autograd queue, freed by joining the thread.
  if (status > 0) step_thread_.reset();
  if (options_.after_microbatch) options_.after_microbatch(where, status > 0);
  return status;
}

// The rounds of one attempt, each ending at (c) its agreement point: one collective of every
// rank's status, on every rank, whatever happened. Stops at the first round with an OOM anywhere.
Executor::RoundsOutcome Executor::run_rounds(const WindowSplit& split, int64_t attempt, int64_t rounds, double units,
                                             at::Tensor& loss_total) {
  RoundsOutcome out;
  const auto& sizes = split.sizes();
  int64_t start = 0;
  for (int64_t i = 0; i < rounds; ++i) {
    int64_t status = 0;
    std::exception_ptr error;
    if (i < static_cast<int64_t>(sizes.size())) {
      MicrobatchEvent where{window_index_, i, sizes[static_cast<size_t>(i)], static_cast<int64_t>(sizes.size()), attempt};
      where.padded_tokens = split.padded_tokens(i);
      double seconds = 0;
      status = run_microbatch(split, where, start, units, loss_total, out.what, error, seconds);
      if (status == 0 && split.packed()) time_microbatch(split, where, seconds, out);
      start += where.size;
    }
    std::vector<int64_t> flags(static_cast<size_t>(world()), 0);
    flags[static_cast<size_t>(rank())] = status;
    const std::vector<int64_t> all = sum_over_ranks(flags);
    throw_if_a_rank_failed(all, error, "in window " + std::to_string(window_index_) + " at microbatch round " + std::to_string(i + 1));
    for (int r = 0; r < world(); ++r) {
      const int64_t s = all[static_cast<size_t>(r)];
      // The smallest size that failed anywhere: the tightest bound any rank has evidence for,
      // and the same number on every rank, so every rank re-plans to the same split.
      if (s > 0 && (out.failing == 0 || s < out.failing)) {
        out.failing = s;
        out.failing_rank = r;
      }
    }
    if (out.failing > 0) {
      out.failed_round = i;
      break;
    }
  }
  return out;
}

// After an attempt that ran out of memory: re-plan (or re-pack) identically on every rank, or,
// with recovery off, fail naming the microbatch.
void Executor::recover_from(const RoundsOutcome& o, const WindowSplit& split, int64_t attempt, int64_t rounds,
                            int64_t longest_sequence) {
  const MicrobatchEvent where{window_index_, o.failed_round, o.failing, rounds, attempt};
  const std::string on_rank = world() > 1 ? " on rank " + std::to_string(o.failing_rank) : std::string();
  if (!options_.oom_recovery) {
    fail_oom("out of memory in window " + std::to_string(where.window) + " at microbatch " +
             std::to_string(where.index + 1) + " of " + std::to_string(where.count) + " (" +
             (split.packed() ? std::to_string(o.failing) + " padded tokens" : "size " + std::to_string(o.failing)) + ")" +
             on_rank + " and OOM recovery is off" + (o.what.empty() ? std::string() : ": " + o.what));
  }
  const std::string said = o.what.empty() ? on_rank : (on_rank.empty() ? o.what : on_rank + ": " + o.what);
  if (split.packed()) {
    recover_packed(o.failing, longest_sequence, split.lengths(), where, said);
  } else {
    recover(o.failing, where, said);
  }
}

// (d) W > 1: ONE gradient exchange per window: every trainable parameter's gradient (zeros where
// this rank's microbatches produced none, e.g. a rank with no samples, so every rank sends the
// same list) plus this rank's loss sum, which rides in the last bucket instead of costing a
// collective of its own. The gradient sums sum_r sum_i (loss_sum_ri / N) = the global mean.
void Executor::exchange_gradients(at::Tensor& loss_total) {
  std::vector<at::Tensor> exchange;
  exchange.reserve(params_.size() + 1);
  for (auto& p : params_) {
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p.detach());
    exchange.push_back(p.grad());  // same TensorImpl: the exchange writes into .grad in place
  }
  const auto grad_dtype = exchange.back().scalar_type();
  const bool wide = grad_dtype == at::kFloat || grad_dtype == at::kDouble;
  exchange.push_back(loss_total.reshape({1}).to(exchange.back().options().dtype(wide ? grad_dtype : at::kFloat)));
  options_.communicator->all_reduce_gradients(exchange);
  loss_total = exchange.back();
}

WindowStats Executor::accumulate(const Batch& window, const std::vector<int64_t>& sizes_override) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t n = batch_samples(window);
  WindowSplit split(plan_, window, n, sizes_override, world());
  WindowStats st;
  st.local_samples = n;
  if (options_.probe) {
    options_.probe->clear_oom();
    options_.probe->reset_peak();
  }
  const WindowCounts counts = count_window(window, split, st);
  if (scaler_) st.loss_scale = scaler_->scale();
  zero_grads();
  if (st.units == 0) {
    st.skipped = true;
    st.skip_reason = "the window has no valid tokens" + std::string(world() > 1 ? " on any rank" : "") +
                     " (every target is ignore_index)";
    if (split.packed() || n > 0) split.cut(0, step_cost());
    st.microbatch_sizes = split.sizes();
    st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return st;
  }
  // The window's loss sum stays on the device until the window ends: one host read per window.
  at::Tensor loss_total;
  for (int64_t attempt = 0;; ++attempt) {
    zero_grads();
    loss_total = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device_));
    split.cut(attempt, step_cost());
    st.microbatch_rounds = rounds_for(split, counts);
    const RoundsOutcome o = run_rounds(split, attempt, st.microbatch_rounds, static_cast<double>(st.units), loss_total);
    if (o.failing == 0) {
      if (split.packed()) keep_times(o, st);
      break;
    }
    recover_from(o, split, attempt, st.microbatch_rounds, counts.longest_sequence);
    ++st.oom_recoveries;
  }
  st.microbatch_sizes = split.sizes();
  if (world() > 1) exchange_gradients(loss_total);
  // The one host sync of the window.
  st.loss = loss_total.item<double>() / static_cast<double>(st.units);
  finish_gradient(st);  // on the global gradient: every rank decides skip/clip identically
  if (options_.probe) {
    st.peak_bytes = options_.probe->peak_bytes();
    st.reserved_peak_bytes = options_.probe->reserved_peak_bytes();
  }
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

void Executor::finish_gradient(WindowStats& st) {
  // A non-finite loss means a non-finite gradient: skip without looking at the gradient at all.
  bool non_finite = !std::isfinite(st.loss);
  std::string why = "non-finite loss";
  try {
    if (scaler_ && scaler_->unscale_and_check(params_)) {
      non_finite = true;
      why = "non-finite gradient at loss scale " + std::to_string(st.loss_scale);
    }
    // The combined gradient's 2-norm, as torch.nn.utils.clip_grad_norm_ computes it: a pass over
    // every gradient and a host sync, so only when clipping needs it.
    if (options_.max_grad_norm && !non_finite) {
      std::vector<at::Tensor> norms;
      for (const auto& p : params_) {
        if (p.grad().defined()) norms.push_back(p.grad().detach().norm(2).to(at::kDouble));
      }
      st.grad_norm = norms.empty() ? 0.0 : at::stack(norms).norm(2).item<double>();
      if (!std::isfinite(*st.grad_norm)) {
        non_finite = true;
        why = "non-finite gradient norm";
      }
    }
  } catch (const std::exception& e) {
    if (!is_out_of_memory(e, options_.probe)) throw;
    // A few scalars per parameter: smaller microbatches would not help, so no re-plan.
    const std::string what = first_line(e.what());
    fail_oom("out of memory while combining the gradients of window " + std::to_string(window_index_) +
             " (unscale and norm, after the last backward): " + what +
             ". The budget leaves no room beyond the microbatches' peak; raise it or lower --headroom's "
             "share used by the plan");
  }
  if (non_finite) {
    st.skipped = true;
    st.skip_reason = why;
  } else if (options_.max_grad_norm) {
    // Clip once, the combined gradient; clipping per microbatch would change the update.
    const double coef = *options_.max_grad_norm / (*st.grad_norm + 1e-6);
    if (coef < 1.0) {
      for (auto& p : params_) {
        if (p.grad().defined()) p.mutable_grad().mul_(coef);
      }
    }
  }
}

void Executor::apply(WindowStats& st) {
  const auto t0 = std::chrono::steady_clock::now();
  if (st.skipped) {
    // fp16 overflow: back the scale off. A window without valid tokens says nothing about it.
    if (scaler_ && st.units > 0) scaler_->update(true);
    ++totals_.skipped_steps;
    log("window " + std::to_string(window_index_) + ": optimizer step skipped (" + st.skip_reason + ")" +
        (scaler_ && st.units > 0 ? "; loss scale now " + std::to_string(scaler_->scale()) : std::string()) +
        "; the scheduler does not advance");
  } else {
    if (options_.lr_schedule) set_learning_rate(optimizer_, options_.lr_schedule(totals_.optimizer_steps));
    if (options_.before_optimizer_step) options_.before_optimizer_step(window_index_);
    try {
      optimizer_.step();
    } catch (const std::exception& e) {
      if (!is_out_of_memory(e, options_.probe)) throw;
      const std::string what = first_line(e.what());
      fail_oom("out of memory during the optimizer step of window " + std::to_string(window_index_) +
               " (" + what +
               "). Some parameters may already be updated, so the window cannot be replayed; the "
               "budget must hold the optimizer step's transient memory (plan.memory)");
    }
    st.stepped = true;
    ++totals_.optimizer_steps;
    if (scaler_) scaler_->update(false);
    if (options_.on_step) options_.on_step(StepEvent{totals_.optimizer_steps, window_index_, st.loss});
  }
  zero_grads();
  st.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (options_.probe) {
    const int64_t peak = std::max(st.peak_bytes.value_or(0), options_.probe->peak_bytes());
    st.peak_bytes = peak;
    totals_.peak_bytes = std::max(totals_.peak_bytes.value_or(0), peak);
    if (const std::optional<int64_t> reserved = options_.probe->reserved_peak_bytes()) {
      st.reserved_peak_bytes = std::max(st.reserved_peak_bytes.value_or(0), *reserved);
      totals_.reserved_peak_bytes = std::max(totals_.reserved_peak_bytes.value_or(0), *st.reserved_peak_bytes);
    }
  }
  ++totals_.windows;
  totals_.samples_seen += st.samples;
  totals_.tokens_seen += st.valid_tokens;
  totals_.seconds += st.seconds;
  ++window_index_;
}

std::optional<TokenStepCost> Executor::step_cost() const {
  if (!packing_cost_ || options_.packing == Packing::Fill) return std::nullopt;
  return packing_cost_->cost();
}

void Executor::time_microbatch(const WindowSplit& split, const MicrobatchEvent& where, double seconds,
                               RoundsOutcome& out) const {
  const int64_t length = split.padded_length(where.index);
  if (packed_peak_ && packed_peak_->predicts()) {
    const int64_t peak =
        *packed_peak_->microbatch_peak_bytes(where.size, length, where.index == 0, !optimizer_.state().empty());
    out.predicted_peak_bytes = std::max(out.predicted_peak_bytes.value_or(0), peak);
  }
  // On CUDA the wall time of a queued step is not its device time: nothing to learn or judge.
  if (!device_.is_cpu()) return;
  out.microbatch_seconds += seconds;
  const std::optional<double> predicted =
      split.cost() ? predicted_seconds(*split.cost(), where.size, length) : std::optional<double>();
  if (predicted) {
    out.predicted_seconds += *predicted;
    if (seconds > 0) out.misses.push_back(std::fabs(*predicted - seconds) / seconds);
  } else {
    out.every_one_predicted = false;
  }
  if (options_.packing == Packing::Time) out.timed.push_back({where.size, length, seconds});
}

void Executor::keep_times(const RoundsOutcome& o, WindowStats& st) {
  // The window's peak as measured (apply() merges the optimizer step's) against the larger of
  // its microbatches' and the optimizer step's the profile measured: a window of a few short
  // sequences peaks in the optimizer step.
  st.predicted_peak_bytes = packed_peak_ ? packed_peak_->window_peak_bytes(o.predicted_peak_bytes) : std::nullopt;
  if (!device_.is_cpu()) return;
  st.microbatch_seconds = o.microbatch_seconds;
  if (o.every_one_predicted && !o.timed.empty()) st.predicted_seconds = o.predicted_seconds;
  for (double m : o.misses) {
    if (time_errors_.size() < kMaxTimeErrors) time_errors_.push_back(m);
  }
  // The next window is cut by the fit over every microbatch so far, this window's included.
  if (packing_cost_) packing_cost_->observe_window(o.timed);
}

std::optional<RunTimeModel> Executor::time_model() const {
  if (!plan_.tokens) return std::nullopt;
  RunTimeModel t;
  t.packing = packing_name(options_.packing);
  t.microbatches = static_cast<int64_t>(time_errors_.size());
  if (!time_errors_.empty()) {
    // Nearest rank: the smallest miss with at least p of them at or below it.
    std::vector<double> sorted = time_errors_;
    std::sort(sorted.begin(), sorted.end());
    auto rank = [&](double p) {
      const size_t k = static_cast<size_t>(std::ceil(p * static_cast<double>(sorted.size())));
      return sorted[std::clamp<size_t>(k, 1, sorted.size()) - 1];
    };
    t.median_abs_error = rank(0.5);
    t.p90_abs_error = rank(0.9);
  }
  t.refits = packing_cost_ ? packing_cost_->model().refits() : 0;
  t.final_cost = step_cost();
  return t;
}

WindowStats Executor::step(const Batch& window) {
  WindowStats st = accumulate(window);
  apply(st);
  return st;
}

}  // namespace accumplan
