// planner/src/window_loop.cpp — the one window algorithm and the one evaluation loop. See
// accumplan/window_loop.h for the contract and docs/weighting.md, docs/oom-contract.md for why
// each rule exists.
#include "accumplan/window_loop.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <utility>

#include "accumplan/errors.h"
#include "accumplan/ranks.h"
#include "accumplan/replan.h"
#include "accumplan/solver.h"
#include "accumplan/terms.h"
#include "accumplan/units.h"

namespace accumplan {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// "22,21,21"; long lists cut after 8 entries so a log line stays one readable line.
std::string join(const std::vector<int64_t>& v) { return join_sizes(v, 8); }

// After an agreement collective: `status[r]` is -1 when rank r hit an error that is not an
// out-of-memory. The failing rank rethrows its own error; every other rank throws one naming it
// (an InputError when the rank's share of the data was refused), so no rank waits for a
// collective its peer will never join.
void throw_if_a_rank_failed(const std::vector<int64_t>& status, const std::exception_ptr& local_error,
                            const std::string& during, bool share_refused) {
  for (size_t r = 0; r < status.size(); ++r) {
    if (status[r] >= 0) continue;
    if (local_error) std::rethrow_exception(local_error);
    const std::string text = "rank " + std::to_string(r) + " failed " + during + " (its own error says why); this rank stops with it";
    if (share_refused) throw InputError(text);
    throw PeerError(text);
  }
}

std::string where_text(const MicrobatchEvent& where) {
  return "window " + std::to_string(where.window) + " at microbatch " + std::to_string(where.index + 1) + " of " +
         std::to_string(where.count);
}

}  // namespace

// How a window is cut into microbatches: by the plan's sizes (window_sizes; an override on a
// first attempt), or packed by tokens. It reads the loop's plan by reference, so a cut after a
// re-plan follows the new plan.
struct WindowLoop::Split {
  Split(const Plan& plan, int64_t samples, std::vector<int64_t> lengths, std::vector<int64_t> sizes_override, int world,
        int rank)
      : plan(plan), rank(rank), n(samples), lengths(std::move(lengths)), override_sizes(std::move(sizes_override)),
        packed(plan.tokens.has_value()) {
    if (override_sizes.empty()) return;
    if (world > 1) {
      throw InputError("microbatch sizes cannot be overridden in a data-parallel window: every rank must know every "
                       "rank's split to run the same number of rounds");
    }
    if (packed) {
      throw InputError("microbatch sizes cannot be overridden under a packed plan: its microbatches are cut by the "
                       "token budget");
    }
    const int64_t sum = std::accumulate(override_sizes.begin(), override_sizes.end(), int64_t{0});
    if (sum != n || *std::min_element(override_sizes.begin(), override_sizes.end()) < 1) {
      throw InputError("microbatch sizes " + join(override_sizes) + " do not split a window of " + std::to_string(n) +
                       " samples");
    }
  }

  // The split of `m` samples of rank `r` under the plan (sample plans): its own window where the ranks differ.
  std::vector<int64_t> split_of(int64_t m, int r) const {
    if (m == 0) return {};
    return window_sizes(plan, m, r);
  }

  // Cuts the window for attempt `attempt` (later ones follow the re-planned plan); packed plans by
  // `packing_cost` (none: each microbatch filled).
  void cut(int64_t attempt, const std::optional<TokenStepCost>& packing_cost) {
    if (!packed) {
      sizes = attempt == 0 && !override_sizes.empty() ? override_sizes : split_of(n, rank);
      return;
    }
    cost = packing_cost;
    groups.clear();
    if (!lengths.empty()) groups = pack_by_token_budget(lengths, plan.tokens->token_budget, cost);
    sizes.clear();
    for (const auto& g : groups) sizes.push_back(static_cast<int64_t>(g.size()));
  }

  int64_t padded_length(size_t i) const { return packed ? lengths[static_cast<size_t>(groups[i].front())] : 0; }
  int64_t padded_tokens(size_t i) const { return packed ? static_cast<int64_t>(groups[i].size()) * padded_length(i) : 0; }

  const Plan& plan;
  int rank;
  int64_t n;
  std::vector<int64_t> lengths;
  std::vector<int64_t> override_sizes;
  bool packed;
  std::vector<std::vector<int64_t>> groups;  // packed: each microbatch's samples
  std::optional<TokenStepCost> cost;         // packed: what the cut minimised
  std::vector<int64_t> sizes;
};

// What every rank knows of a window after the counts collective.
// The agreed outcome of one attempt's rounds.
struct WindowLoop::Attempt {
  int64_t failing = 0;  // the smallest size (packed: padded tokens) that ran out of memory; 0: none
  int64_t failed_round = 0;
  int failing_rank = -1;
  std::string what;     // this rank's out-of-memory message, first line
  // Packed plans, this attempt's microbatches that ran; kept only if the attempt completes.
  double microbatch_seconds = 0;
  double rounds_seconds = 0;  // the rounds' wall time, what runs between the microbatches included
  double predicted_seconds = 0;
  bool every_one_predicted = true;
  std::vector<TimedMicrobatch> timed;
  std::vector<double> misses;  // |predicted − measured| / measured
  std::optional<int64_t> predicted_peak_bytes;
};

WindowLoop::WindowLoop(Plan& plan)
    : plan_(plan), packing_cost_(plan.tokens ? plan.tokens->step_cost : std::nullopt) {
  check_plan_window(plan_);  // a plan made in code obeys the reader's rules
  if (plan_.tokens) packed_peak_.emplace(plan_.profile);
}

std::optional<TokenStepCost> WindowLoop::packing_cost(Packing packing) const {
  if (!plan_.tokens || packing == Packing::Fill) return std::nullopt;
  return packing_cost_.cost();
}

WindowCounts WindowLoop::count_window(WindowBackend& b, const std::string& during,
                                      const std::function<void(const ShareCounts&)>& check) const {
  const int W = b.world_size(), r = b.rank();
  const bool packed = plan_.tokens.has_value();
  // This rank's share, counted before the collective; a share that cannot be counted reports -1
  // in its slot and every rank throws after it, so none waits for a peer that left.
  ShareCounts share;
  std::vector<int64_t> local(3 + static_cast<size_t>(W) * (packed ? 2 : 1), 0);
  std::exception_ptr count_error;
  try {
    share = b.count_share();
    if (check) check(share);
    local[0] = share.samples > 0 ? share.units : 0;
    local[1] = share.samples;
    local[2] = share.samples > 0 ? share.valid_tokens : 0;
    local[3 + static_cast<size_t>(r)] = share.samples;
    if (packed && !share.lengths.empty()) {
      local[3 + static_cast<size_t>(W + r)] = *std::max_element(share.lengths.begin(), share.lengths.end());
    }
  } catch (const std::exception&) {
    if (W == 1) throw;
    count_error = std::current_exception();
    local[3 + static_cast<size_t>(r)] = -1;
  }
  const std::vector<int64_t> global = W > 1 ? b.sum_over_ranks(local) : local;
  WindowCounts c;
  c.rank_samples.assign(global.begin() + 3, global.begin() + 3 + W);
  c.longest_sequence = packed ? *std::max_element(global.begin() + 3 + W, global.end()) : 0;
  throw_if_a_rank_failed(c.rank_samples, count_error, during, true);
  c.share = std::move(share);
  c.units = global[0];
  c.samples = global[1];
  c.valid_tokens = global[2];
  return c;
}

WindowStats WindowLoop::accumulate(WindowBackend& b, const WindowOptions& o, const std::vector<int64_t>& sizes) {
  const auto t0 = Clock::now();
  const int W = b.world_size();
  const bool packed = plan_.tokens.has_value();
  WindowStats st;
  st.optimizer_state_ready = b.optimizer_state_exists() || plan_.profile.persistent.optimizer_state_bytes == 0;
  const WindowCounts c = count_window(b, "while counting the units of window " + std::to_string(window_index_),
                                      [&](const ShareCounts& share) {
                                        if (packed && share.samples > 0 && share.lengths.empty()) {
                                          throw InputError("this plan packs ragged data by tokens (plan.tokens) but the "
                                                           "window holds fixed-shape samples with no sequence lengths; " +
                                                           o.ragged_data_fix);
                                        }
                                      });
  const ShareCounts& share = c.share;
  st.local_samples = share.samples;
  st.units = c.units;
  st.samples = c.samples;
  st.valid_tokens = c.valid_tokens;
  st.normalization = share.normalization;
  st.loss_scale = b.loss_scale();
  Split split(plan_, share.samples, packed ? share.lengths : std::vector<int64_t>{}, sizes, W, b.rank());
  check_counts(c, st, packed, W);
  b.begin_attempt();
  if (st.units == 0) {
    st.skipped = true;
    st.skip_reason = "the window has no valid tokens" + std::string(W > 1 ? " on any rank" : "") +
                     " (every target is ignore_index)";
    if (packed || share.samples > 0) split.cut(0, packing_cost(o.packing));
    st.microbatch_sizes = split.sizes;
    st.seconds = seconds_since(t0);
    return st;
  }
  for (int64_t attempt = 0;; ++attempt) {
    if (attempt > 0) b.begin_attempt();
    split.cut(attempt, packing_cost(o.packing));
    st.microbatch_rounds = rounds_for(b, split, c);
    const Attempt a = run_attempt(b, o, split, attempt, st.units);
    if (a.failing == 0) {
      if (packed) keep_times(a, st, b.wall_time_is_device_time());
      break;
    }
    recover(b, o, a, split, st.microbatch_rounds, c.longest_sequence);
    ++st.oom_recoveries;
  }
  st.microbatch_sizes = split.sizes;
  // The one host read of the window (W > 1: after the one gradient exchange, which carries it).
  const double loss_sum = b.exchanges() ? b.exchange_gradients() : b.loss_sum();
  st.loss = loss_sum / static_cast<double>(st.units);
  finish_gradient(b, st, o);  // on the global gradient: every rank decides skip and clip alike
  st.seconds = seconds_since(t0);
  return st;
}

// Every rank sees the same numbers, so every rank throws the same error: nobody is left waiting.
void WindowLoop::check_counts(const WindowCounts& c, const WindowStats& st, bool packed, int W) const {
  const int64_t n = st.local_samples;
  // A plan with target_tokens windows by tokens (token_windows): a window holds any number of samples.
  const bool by_tokens = packed && plan_.tokens->target_tokens.has_value();
  if (W == 1 && n < 1) throw InputError("window " + std::to_string(window_index_) + " holds no samples; pass at least one");
  if (W == 1 && n > rank_batch(plan_, 0) && !by_tokens) {
    throw InputError("a window holds 1.." + std::to_string(plan_.per_rank_batch) +
                     " samples (the plan's per-rank batch); got " + std::to_string(n));
  }
  if (st.samples < 1) throw InputError("window " + std::to_string(window_index_) + " holds no samples on any rank");
  for (int r = 0; r < W && !by_tokens; ++r) {
    const int64_t m = c.rank_samples[static_cast<size_t>(r)];
    if (m <= rank_batch(plan_, r)) continue;
    const std::string handed = "rank " + std::to_string(r) + " was handed " + std::to_string(m) +
                               " samples of a global window of " + std::to_string(st.samples);
    if (!plan_.ranks.empty()) {
      const auto [start, count] = rank_share(plan_, r, plan_.target_batch);
      throw InputError(handed + ", more than its share " + std::to_string(count) + " (plan.ranks): of each global window of " +
                       std::to_string(plan_.target_batch) + " samples, rank " + std::to_string(r) + " takes samples " +
                       std::to_string(start) + ".." + std::to_string(start + count - 1));
    }
    throw InputError(handed + ", more than the plan's per-rank batch " + std::to_string(plan_.per_rank_batch) +
                     ". Shard each global window of " + std::to_string(plan_.per_rank_batch * W) +
                     " samples strided: rank r takes r, r+W, r+2W, ...");
  }
  // The budget was confirmed with sequences of at most max_seq_len tokens; with an attention-like
  // T² cost a longer one under the same budget could need more memory.
  if (packed && c.longest_sequence > plan_.tokens->max_seq_len) {
    throw InputError("window " + std::to_string(window_index_) + " holds a sequence of " +
                     std::to_string(c.longest_sequence) + " tokens" + (W > 1 ? " on any rank" : "") +
                     ", longer than the " + std::to_string(plan_.tokens->max_seq_len) +
                     " tokens the plan's token budget was planned for (plan.tokens.max_seq_len); truncate the "
                     "sequences or plan again with a longer " + option_name("--seq-len"));
  }
}

// (b) The same number of rounds everywhere: the largest split of any rank. Sample plans know
// every rank's split from the counts; packed splits depend on each rank's lengths: one collective.
int64_t WindowLoop::rounds_for(WindowBackend& b, const Split& split, const WindowCounts& c) const {
  int64_t rounds = static_cast<int64_t>(split.sizes.size());
  if (split.packed && b.world_size() > 1) {
    std::vector<int64_t> counts(static_cast<size_t>(b.world_size()), 0);
    counts[static_cast<size_t>(b.rank())] = rounds;
    for (int64_t m : b.sum_over_ranks(counts)) rounds = std::max(rounds, m);
  } else if (!split.packed) {
    for (size_t r = 0; r < c.rank_samples.size(); ++r) {
      rounds = std::max(rounds, static_cast<int64_t>(split.split_of(c.rank_samples[r], static_cast<int>(r)).size()));
    }
  }
  return rounds;
}

// One microbatch of this rank's split. Returns 0, the size (packed: padded tokens) when it ran out
// of memory, or -1 for another error on a rank of a group (`error` holds it; alone, it is thrown).
int64_t WindowLoop::run_microbatch(WindowBackend& b, const WindowOptions& o, const Split& split,
                                   const MicrobatchEvent& where, int64_t start, int64_t units, Attempt& out,
                                   std::exception_ptr& error) {
  const size_t i = static_cast<size_t>(where.index);
  Microbatch mb{where, start, split.packed ? split.groups[i] : std::vector<int64_t>{}, split.padded_length(i)};
  int64_t status = 0;
  double seconds = 0;
  try {
    if (o.before_microbatch) o.before_microbatch(where);
    const auto t0 = Clock::now();  // the microbatch's gather and step, not the hooks around them
    b.run_microbatch(mb, units);
    seconds = seconds_since(t0);
  } catch (const std::exception& e) {
    if (b.is_out_of_memory(e)) {
      status = split.packed ? where.padded_tokens : where.size;
      out.what = first_line(e.what());
    } else {
      if (b.world_size() == 1) throw;
      status = -1;
      error = std::current_exception();
    }
  }
  // Out of the catch block: the failed microbatch's exception, and every tensor it referenced, is gone.
  if (o.after_microbatch) o.after_microbatch(where, status > 0);
  if (status != 0 || !split.packed) return status;
  // A packed microbatch that ran: its predicted peak, and on the CPU its time and the prediction's miss.
  const int64_t length = mb.padded_length;
  if (packed_peak_ && packed_peak_->predicts()) {
    const int64_t peak = *packed_peak_->microbatch_peak_bytes(where.size, length, where.index == 0, b.optimizer_state_exists());
    out.predicted_peak_bytes = std::max(out.predicted_peak_bytes.value_or(0), peak);
  }
  if (!b.wall_time_is_device_time()) return 0;
  out.microbatch_seconds += seconds;
  const std::optional<double> predicted = split.cost ? predicted_seconds(*split.cost, where.size, length) : std::nullopt;
  if (predicted) {
    out.predicted_seconds += *predicted;
    if (seconds > 0) out.misses.push_back(std::fabs(*predicted - seconds) / seconds);
  } else {
    out.every_one_predicted = false;
  }
  if (o.packing == Packing::Time) out.timed.push_back({where.size, length, seconds});
  return 0;
}

// The rounds of one attempt, each ending at its agreement point: one collective of every rank's
// status, on every rank, whatever happened. Stops at the first round with an out-of-memory anywhere.
WindowLoop::Attempt WindowLoop::run_attempt(WindowBackend& b, const WindowOptions& o, const Split& split,
                                            int64_t attempt, int64_t units) {
  Attempt out;
  const auto t0 = Clock::now();
  const int W = b.world_size();
  // Each rank runs its own microbatches, stopping at its first failure; the ranks agree once, after
  // the last: a rank with fewer or smaller microbatches never waits for another's between them.
  int64_t start = 0, status = 0, failed_index = 0;
  std::exception_ptr error;
  for (size_t i = 0; i < split.sizes.size() && status == 0; ++i) {
    const MicrobatchEvent where{window_index_, static_cast<int64_t>(i), split.sizes[i],
                                static_cast<int64_t>(split.sizes.size()), attempt, split.padded_tokens(i)};
    status = run_microbatch(b, o, split, where, start, units, out, error);
    failed_index = static_cast<int64_t>(i);
    start += where.size;
  }
  // [status of rank 0 .. W-1 (0, the failing size, -1 for another error), its failing microbatch's index]
  std::vector<int64_t> flags(2 * static_cast<size_t>(W), 0);
  flags[static_cast<size_t>(b.rank())] = status;
  if (status != 0) flags[static_cast<size_t>(W + b.rank())] = failed_index;
  const std::vector<int64_t> all = W > 1 ? b.sum_over_ranks(flags) : flags;
  throw_if_a_rank_failed(std::vector<int64_t>(all.begin(), all.begin() + W), error,
                         "in window " + std::to_string(window_index_), false);
  for (int r = 0; r < W; ++r) {
    const int64_t s = all[static_cast<size_t>(r)];
    // The smallest size that failed anywhere: the same number on every rank, so every rank
    // re-plans to the same split.
    if (s > 0 && (out.failing == 0 || s < out.failing)) {
      out.failing = s;
      out.failing_rank = r;
      out.failed_round = all[static_cast<size_t>(W + r)];
    }
  }
  out.rounds_seconds = seconds_since(t0);
  return out;
}

// After an attempt that ran out of memory: re-plan (or re-pack) identically on every rank, or, with
// recovery off, fail naming the microbatch.
void WindowLoop::recover(WindowBackend& b, const WindowOptions& o, const Attempt& a, const Split& split,
                         int64_t rounds, int64_t longest_sequence) {
  const MicrobatchEvent where{window_index_, a.failed_round, a.failing, rounds, 0, 0};
  const std::string on_rank = b.world_size() > 1 ? " on rank " + std::to_string(a.failing_rank) : std::string();
  if (!o.oom_recovery) {
    fail_oom(b, "out of memory in " + where_text(where) + " (" +
                    (split.packed ? std::to_string(a.failing) + " padded tokens" : "size " + std::to_string(a.failing)) +
                    ")" + on_rank + " and OOM recovery is off" + (a.what.empty() ? std::string() : ": " + a.what));
  }
  b.after_out_of_memory();
  const std::string said = a.what.empty() ? on_rank : (on_rank.empty() ? a.what : on_rank + ": " + a.what);
  const ReplanEvent event = split.packed
                                ? repack(a.failing, longest_sequence, split.lengths, where, said, b.budget_bytes())
                                : replan(a.failing, a.failing_rank, where, said, b.budget_bytes());
  ++totals_.oom_recoveries;
  if (o.log) o.log((b.world_size() > 1 ? "rank " + std::to_string(b.rank()) + ": " : std::string()) + event.line);
  if (o.on_replan) o.on_replan(event, plan_);
}

ReplanEvent WindowLoop::replan(int64_t failing_size, int failing_rank, const MicrobatchEvent& where,
                               const std::string& what, std::optional<int64_t> budget) {
  if (failing_size <= 1) {
    throw ExecutorOomError(
        "out of memory in " + where_text(where) + " with a single sample: the weights, gradients and optimizer state "
        "plus one sample do not fit" +
        (budget ? " the enforced budget of " + format_bytes(*budget) : std::string(" in device memory")) +
        ". Nothing smaller can be tried; raise the budget, free device memory, or shrink the model or its inputs (" +
        what + ")");
  }
  std::string note;
  // Where the ranks differ, only the failing rank's window is re-planned; the shares stay.
  const int rank = std::max(failing_rank, 0);  // -1 in one process
  plan_ = replan_rank(plan_, rank, failing_size, &note);
  const std::vector<int64_t>& sizes =
      plan_.ranks.empty() ? plan_.microbatch_sizes : plan_.ranks[static_cast<size_t>(rank)].microbatch_sizes;
  const std::string whose = plan_.ranks.empty() ? std::string() : "rank " + std::to_string(rank) + "'s window ";
  const std::string line = "out of memory in " + where_text(where) + " (size " + std::to_string(where.size) + "); " + whose +
                           "re-planned to " + std::to_string(sizes.size()) + " microbatches of at most " +
                           std::to_string(*std::max_element(sizes.begin(), sizes.end())) + " (" + join(sizes) + ") — " +
                           note + "; replaying the window from its first sample";
  return ReplanEvent{where.window, failing_size, sizes, note, line};
}

ReplanEvent WindowLoop::repack(int64_t failing_tokens, int64_t longest_sequence, const std::vector<int64_t>& lengths,
                               const MicrobatchEvent& where, const std::string& what, std::optional<int64_t> budget) {
  const int64_t token_budget = std::min(plan_.tokens->token_budget, failing_tokens - 1);
  if (token_budget < longest_sequence) {
    throw ExecutorOomError(
        "out of memory in " + where_text(where) + " (" + std::to_string(failing_tokens) +
        " padded tokens): a token budget below " + std::to_string(failing_tokens) +
        " cannot hold this window's longest sequence of " + std::to_string(longest_sequence) +
        " tokens, and one sequence cannot be split. Truncate the sequences to fewer tokens, or raise the budget" +
        (budget ? " (enforced: " + format_bytes(*budget) + ")" : std::string()) + " (" + what + ")");
  }
  plan_ = repack_below(plan_, failing_tokens);
  const std::string line = "out of memory in " + where_text(where) + " (" + std::to_string(failing_tokens) +
                           " padded tokens); token budget lowered to " + std::to_string(token_budget) +
                           " padded tokens per microbatch; re-packing and replaying the window from its first sample";
  std::vector<int64_t> sizes;
  if (!lengths.empty()) {
    for (const auto& g : pack_by_token_budget(lengths, token_budget, plan_.tokens->step_cost)) {
      sizes.push_back(static_cast<int64_t>(g.size()));
    }
  }
  return ReplanEvent{where.window, failing_tokens, sizes, "token budget " + std::to_string(token_budget), line};
}

void WindowLoop::fail_oom(WindowBackend& b, const std::string& message) const {
  // The window's gradients are partial (or half unscaled): drop them rather than step on them,
  // and leave the device ready for whatever the caller does next.
  b.after_out_of_memory();
  throw ExecutorOomError(message);
}

void WindowLoop::finish_gradient(WindowBackend& b, WindowStats& st, const WindowOptions& o) {
  // A non-finite loss means a non-finite gradient: skip without looking at the gradient.
  bool non_finite = !std::isfinite(st.loss);
  std::string why = "non-finite loss";
  try {
    if (b.unscale_finds_non_finite()) {
      non_finite = true;
      why = "non-finite gradient at loss scale " + std::to_string(st.loss_scale);
    }
    // The combined gradient's 2-norm (torch.nn.utils.clip_grad_norm_'s): a pass over every
    // gradient and a host sync, so only when clipping needs it.
    if (o.max_grad_norm && !non_finite) {
      st.grad_norm = b.gradient_norm();
      if (!std::isfinite(*st.grad_norm)) {
        non_finite = true;
        why = "non-finite gradient norm";
      }
    }
  } catch (const std::exception& e) {
    if (!b.is_out_of_memory(e)) throw;
    // A few scalars per parameter: smaller microbatches would not help, so no re-plan.
    fail_oom(b, "out of memory while combining the gradients of window " + std::to_string(window_index_) +
                    " (unscale and norm, after the last backward): " + first_line(e.what()) +
                    ". The budget leaves no room beyond the microbatches' peak; raise it or lower " +
                    option_name("--headroom"));
  }
  if (non_finite) {
    st.skipped = true;
    st.skip_reason = why;
  } else if (o.max_grad_norm) {
    // Clip once, the combined gradient; clipping per microbatch would change the update.
    const double coef = *o.max_grad_norm / (*st.grad_norm + 1e-6);
    if (coef < 1.0) b.scale_gradients(coef);
  }
}

void WindowLoop::apply(WindowBackend& b, const WindowOptions& o, WindowStats& st) {
  const auto t0 = Clock::now();
  if (st.skipped) {
    // fp16 overflow: the scale backs off. A window without valid tokens says nothing about it.
    if (st.units > 0) b.after_update(false, StepEvent{totals_.optimizer_steps, window_index_, st.loss});
    ++totals_.skipped_steps;
    if (o.log) {
      o.log("window " + std::to_string(window_index_) + ": optimizer step skipped (" + st.skip_reason + ")" +
            (b.has_scaler() && st.units > 0 ? "; loss scale now " + std::to_string(b.loss_scale()) : std::string()) +
            "; the scheduler does not advance");
    }
  } else {
    if (o.before_optimizer_step) o.before_optimizer_step(window_index_);
    if (totals_.optimizer_steps == 0 && !b.optimizer_state_exists()) b.release_cached();  // once: the state's first step
    try {
      b.optimizer_step(totals_.optimizer_steps);
    } catch (const std::exception& e) {
      if (!b.is_out_of_memory(e)) throw;
      fail_oom(b, "out of memory during the optimizer step of window " + std::to_string(window_index_) + " (" +
                      first_line(e.what()) +
                      "). Some parameters may already be updated, so the window cannot be replayed; the budget must "
                      "hold the optimizer step's transient memory (plan.memory)");
    }
    st.stepped = true;
    ++totals_.optimizer_steps;
    b.after_update(true, StepEvent{totals_.optimizer_steps, window_index_, st.loss});
  }
  b.drop_gradients();
  st.seconds += seconds_since(t0);
  ++totals_.windows;
  totals_.samples_seen += st.samples;
  totals_.tokens_seen += st.valid_tokens;
  totals_.seconds += st.seconds;
  ++window_index_;
}

void WindowLoop::keep_times(const Attempt& a, WindowStats& st, bool device_times) {
  // The measured peak (the caller merges the optimizer step's) is held against the larger of the
  // microbatches' and the profile's optimizer step: a window of a few short sequences peaks there.
  st.predicted_peak_bytes = packed_peak_ ? packed_peak_->window_peak_bytes(a.predicted_peak_bytes) : std::nullopt;
  if (!device_times) return;
  st.microbatch_seconds = a.microbatch_seconds;
  if (a.every_one_predicted && !a.timed.empty()) st.predicted_seconds = a.predicted_seconds;
  for (double m : a.misses) {
    if (time_errors_.size() < kMaxTimeErrors) time_errors_.push_back(m);
  }
  // The next window is cut by the fit over every microbatch so far, this window's included.
  packing_cost_.observe_window(a.timed, a.rounds_seconds);
}

std::optional<RunTimeModel> WindowLoop::time_model(Packing packing) const {
  if (!plan_.tokens) return std::nullopt;
  RunTimeModel t;
  t.packing = packing_name(packing);
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
  t.refits = packing_cost_.model().refits();
  t.final_cost = packing_cost(packing);
  return t;
}

// ---- The evaluation loop ----

EvalOutcome run_eval(EvalBackend& b, int64_t samples, const std::vector<int64_t>& sizes, const EvalLoopOptions& o) {
  const int64_t sum = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  if (sum != samples) {
    throw InputError("evaluation sizes sum to " + std::to_string(sum) + " but the batch holds " + std::to_string(samples) +
                     " samples");
  }
  EvalOutcome out;
  std::vector<int64_t> plan = sizes;
  int64_t start = 0, held = 0;
  size_t i = 0;
  while (i < plan.size()) {
    const int64_t size = plan[i];
    if (o.before_microbatch) o.before_microbatch(static_cast<int64_t>(i), size);
    bool failed = false;
    try {
      b.eval_microbatch(static_cast<int64_t>(i), start, size, o.keep_outputs);
    } catch (const std::exception& e) {
      if (!o.oom_recovery || !b.is_out_of_memory(e)) throw;
      failed = true;
    }
    if (failed) {  // out of the catch block: the failed microbatch's memory is released
      int64_t smaller = 0;
      try {
        smaller = eval_size_after_oom(size);
      } catch (const InfeasibleError& none) {
        throw ExecutorOomError(std::string(none.what()) + " (sample " + std::to_string(start) + ")");
      }
      b.after_out_of_memory();
      const std::vector<int64_t> rest = eval_split(samples - start, smaller);
      plan.resize(i);
      plan.insert(plan.end(), rest.begin(), rest.end());
      ++out.oom_recoveries;
      if (o.log) {
        o.log("evaluation ran out of memory at a microbatch of " + std::to_string(size) + " samples; the " +
              std::to_string(samples - start) + " samples from sample " + std::to_string(start) +
              " on run in microbatches of " + std::to_string(smaller));
      }
      continue;  // microbatch i again, now of the smaller size
    }
    // A kept output goes to the caller once the next microbatch's forward has finished.
    if (o.keep_outputs && ++held == 2) {
      b.hand_over_output();
      held = 1;
    }
    out.microbatch_sizes.push_back(size);
    start += size;
    ++i;
  }
  if (held > 0) b.hand_over_output();
  return out;
}

std::vector<std::vector<size_t>> gradient_buckets(const std::vector<std::pair<std::string, int64_t>>& gradients,
                                                  int64_t bucket_bytes) {
  std::vector<std::vector<size_t>> buckets;
  int64_t bytes = 0;
  for (size_t i = 0; i < gradients.size(); ++i) {
    const bool joins = !buckets.empty() && gradients[buckets.back().front()].first == gradients[i].first &&
                       bytes + gradients[i].second <= bucket_bytes;
    if (!joins) {
      buckets.emplace_back();
      bytes = 0;
    }
    buckets.back().push_back(i);
    bytes += gradients[i].second;
  }
  return buckets;
}

}  // namespace accumplan
