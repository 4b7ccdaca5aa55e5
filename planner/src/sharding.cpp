// sharding.cpp — ZeroRedundancyOptimizer's partition, each rank's share of the optimizer state,
// and what a sharded plan says (accumplan/sharding.h).
#include "accumplan/sharding.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <string>

#include "accumplan/checked.h"
#include "accumplan/errors.h"
#include "accumplan/memory_model.h"
#include "accumplan/terms.h"
#include "accumplan/units.h"

namespace accumplan {
namespace {

// The shard option with a value, in the words of the front end: "--shard off", "shard='off'".
std::string shard_words(const std::string& value) {
  return front_end() == FrontEnd::Python ? "shard='" + value + "'" : "--shard " + value;
}

}  // namespace

StateLayout state_layout(int64_t state_bytes_one_element, int64_t state_bytes_two_elements) {
  if (state_bytes_one_element < 0 || state_bytes_two_elements < state_bytes_one_element) {
    throw InputError("the optimizer's state on parameters of one and two elements (" +
                     std::to_string(state_bytes_one_element) + " and " + std::to_string(state_bytes_two_elements) +
                     " bytes) does not grow with the parameter; its state cannot be sharded by size");
  }
  const int64_t per_element = state_bytes_two_elements - state_bytes_one_element;
  return StateLayout{per_element, state_bytes_one_element - per_element};
}

std::vector<int64_t> zero_partition(const std::vector<std::vector<int64_t>>& group_numels, int64_t world_size) {
  std::vector<int64_t> elements(static_cast<size_t>(world_size), 0);
  std::vector<int64_t> ranks;
  for (const auto& group : group_numels) {
    std::vector<size_t> order(group.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return group[a] > group[b]; });
    std::vector<int64_t> group_ranks(group.size());
    for (size_t i : order) {
      const auto fewest = std::min_element(elements.begin(), elements.end()) - elements.begin();
      group_ranks[i] = fewest;
      elements[static_cast<size_t>(fewest)] = checked_add(elements[static_cast<size_t>(fewest)], group[i], "parameter elements");
    }
    ranks.insert(ranks.end(), group_ranks.begin(), group_ranks.end());
  }
  return ranks;
}

namespace {

void check_shard_world_size(int64_t world_size) {
  if (world_size < 2 || world_size > kMaxWorldSize) {
    throw InputError(option_name("--world-size") + " " + std::to_string(world_size) +
                     ": sharding the optimizer state needs 2 to " + std::to_string(kMaxWorldSize) + " ranks");
  }
}

}  // namespace

Sharding shard_state(const std::vector<std::vector<int64_t>>& group_numels, const std::vector<int64_t>& state_bytes,
                     int64_t world_size, std::vector<int64_t>* partition) {
  check_shard_world_size(world_size);
  const std::vector<int64_t> ranks = zero_partition(group_numels, world_size);
  if (ranks.empty()) throw InputError("the optimizer holds no parameters; there is no state to shard");
  if (state_bytes.size() != ranks.size()) {
    throw InputError("the optimizer's state was given for " + std::to_string(state_bytes.size()) + " parameters, but its groups hold " +
                     std::to_string(ranks.size()));
  }
  Sharding s;
  s.world_size = world_size;
  s.per_rank_state_bytes.assign(static_cast<size_t>(world_size), 0);
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (state_bytes[i] < 0) throw InputError("a parameter's optimizer state of " + std::to_string(state_bytes[i]) + " bytes");
    int64_t& share = s.per_rank_state_bytes[static_cast<size_t>(ranks[i])];
    share = checked_add(share, state_bytes[i], "state bytes");
  }
  if (checked_sum(s.per_rank_state_bytes, "the optimizer state") == 0) {
    throw InputError("one step of the optimizer leaves no state on any of its parameters (plain SGD, or parameters that "
                     "get no gradient), so there is nothing to shard; plan with " + shard_words("off"));
  }
  if (partition) *partition = ranks;
  s.measured_rank = std::max_element(s.per_rank_state_bytes.begin(), s.per_rank_state_bytes.end()) - s.per_rank_state_bytes.begin();
  return s;
}

Sharding shard_optimizer_state(const std::vector<std::vector<int64_t>>& group_numels, int64_t world_size,
                               const StateLayout& layout, std::vector<int64_t>* partition) {
  check_shard_world_size(world_size);
  if (layout.bytes_per_element == 0 && layout.bytes_per_parameter == 0) {
    throw InputError("the optimizer keeps no state per parameter (plain SGD), so there is nothing to shard; plan with " +
                     shard_words("off"));
  }
  std::vector<int64_t> state_bytes;
  for (const auto& group : group_numels) {
    for (int64_t numel : group) {
      state_bytes.push_back(checked_add(checked_mul(numel, layout.bytes_per_element, "state bytes"), layout.bytes_per_parameter,
                                        "state bytes"));
    }
  }
  return shard_state(group_numels, state_bytes, world_size, partition);
}

int64_t freed_state_bytes(const Sharding& sharding) {
  const int64_t whole = checked_sum(sharding.per_rank_state_bytes, "the optimizer state");
  return whole - sharding.per_rank_state_bytes.at(static_cast<size_t>(sharding.measured_rank));
}

int64_t line_micro_batch(const Plan& plan, int64_t extra_bytes) {
  const int64_t budget = checked_add(plan.memory.usable_bytes, -extra_bytes, "the usable bytes less the state");
  return std::min(plan.per_rank_batch, MemoryModel::line_largest_fitting(plan.fit, budget));
}

std::vector<int64_t> ranks_to_measure(const Sharding& sharding) {
  const std::vector<int64_t>& shares = sharding.per_rank_state_bytes;
  const int64_t measured = shares.at(static_cast<size_t>(sharding.measured_rank));
  std::map<int64_t, int64_t, std::greater<>> lowest_of;  // share -> its lowest rank, largest share first
  for (size_t r = 0; r < shares.size(); ++r) {
    if (shares[r] != measured) lowest_of.emplace(shares[r], static_cast<int64_t>(r));
  }
  std::vector<int64_t> ranks;
  for (const auto& [share, rank] : lowest_of) {
    if (ranks.size() == kMaxOtherRanksMeasured) break;
    ranks.push_back(rank);
  }
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

std::vector<int64_t> per_rank_peaks(const Sharding& sharding, int64_t microbatches_peak_bytes, int64_t step_peak_bytes) {
  const std::vector<int64_t>& shares = sharding.per_rank_state_bytes;
  const int64_t measured = shares.at(static_cast<size_t>(sharding.measured_rank));
  std::map<int64_t, int64_t> step_of = {{measured, step_peak_bytes}};  // share -> its measured step peak
  for (const RankStepPeak& r : sharding.other_ranks) step_of[shares.at(static_cast<size_t>(r.rank))] = r.optimizer_step_peak_bytes;
  std::vector<int64_t> peaks;
  for (const int64_t share : shares) {
    const int64_t step = step_of.lower_bound(share)->second;  // the smallest measured share at least this one
    peaks.push_back(std::max(microbatches_peak_bytes - (measured - share), step));
  }
  return peaks;
}

void state_sharding(Plan& plan, int64_t microbatches_peak_bytes, int64_t step_peak_bytes) {
  Sharding s = *plan.profile.sharding;
  if (s.world_size != plan.world_size) {
    throw InputError("the profile's windows held the largest optimizer-state share of " + std::to_string(s.world_size) +
                     " ranks, but the plan is for " + std::to_string(plan.world_size) + "; plan with " +
                     option_name("--world-size") + " " + std::to_string(s.world_size));
  }
  const int64_t freed = freed_state_bytes(s);
  // Unsharded, the optimizer step holds the whole state: where that alone passes the usable bytes,
  // not one sample fits (what planning unsharded says), whatever the activations' line allows.
  const bool step_fits = checked_add(step_peak_bytes, freed, "the unsharded step") <= plan.memory.usable_bytes;
  s.unsharded_micro_batch = step_fits ? line_micro_batch(plan, freed) : 0;
  s.per_rank_peak_bytes = per_rank_peaks(s, microbatches_peak_bytes, step_peak_bytes);
  const int64_t largest = s.per_rank_state_bytes[static_cast<size_t>(s.measured_rank)];
  for (size_t r = 0; r < s.per_rank_peak_bytes.size(); ++r) {
    // The plan's prediction is the largest share's: its own ranks peak at it, no rank above it.
    int64_t& peak = s.per_rank_peak_bytes[r];
    peak = s.per_rank_state_bytes[r] == largest ? plan.memory.predicted_peak_bytes : std::min(peak, plan.memory.predicted_peak_bytes);
  }
  plan.sharding = s;
  const int64_t share = s.per_rank_state_bytes[static_cast<size_t>(s.measured_rank)];
  plan.reason += " The optimizer state is sharded over " + std::to_string(s.world_size) +
                 " ranks as ZeroRedundancyOptimizer partitions it: the windows held rank " + std::to_string(s.measured_rank) +
                 "'s share, the largest (" + format_bytes(share) + " of " + format_bytes(share + freed) + "), so " +
                 format_bytes(freed) + " stays free on every rank; unsharded, the same line gives a microbatch of " +
                 (*s.unsharded_micro_batch > 0 ? std::to_string(*s.unsharded_micro_batch)
                  : step_fits ? std::string("none (not one sample fits)")
                              : "none (the optimizer step alone, " + format_bytes(step_peak_bytes + freed) +
                                    " with the whole state, passes the " + format_bytes(plan.memory.usable_bytes) +
                                    " usable)") +
                 ".";
  const auto [low, high] = std::minmax_element(s.per_rank_peak_bytes.begin(), s.per_rank_peak_bytes.end());
  if (*low < *high) {
    plan.reason += " The ranks' peaks are predicted from " + format_bytes(*low) + " to " + format_bytes(*high) + " (" +
                   (s.other_ranks.empty() ? std::string("no other share's optimizer step measured, each taken as the largest's")
                                          : std::to_string(s.other_ranks.size()) + " other share(s)' optimizer step measured") +
                   ").";
  }
}

int64_t predicted_peak_of_rank(const Plan& plan, int64_t rank) {
  if (rank >= 0 && rank < static_cast<int64_t>(plan.ranks.size())) return plan.ranks[static_cast<size_t>(rank)].predicted_peak_bytes;
  if (!plan.sharding || rank < 0 || rank >= static_cast<int64_t>(plan.sharding->per_rank_peak_bytes.size())) {
    return plan.memory.predicted_peak_bytes;
  }
  return plan.sharding->per_rank_peak_bytes[static_cast<size_t>(rank)];
}

std::optional<int64_t> sharding_gain(const Plan& unsharded, int64_t freed_bytes) {
  const int64_t b = line_micro_batch(unsharded, -freed_bytes);
  if (b > unsharded.max_micro_batch) return b;
  return std::nullopt;
}

std::string auto_sharding_note(const Plan& plan, int64_t world_size, int64_t freed_bytes, bool sharded) {
  const std::string shard = shard_words("auto");
  if (sharded) {
    const int64_t unsharded = plan.sharding ? plan.sharding->unsharded_micro_batch.value_or(0) : 0;
    return " " + shard + " sharded it: unsharded, " +
           (unsharded > 0 ? "the largest microbatch that fits is smaller (" + std::to_string(unsharded) + ")."
                          : std::string("not one sample fits."));
  }
  return " " + shard + " did not shard the optimizer state: over " + std::to_string(world_size) + " ranks it would free " +
         format_bytes(freed_bytes) + " per rank, which the line says gives no larger microbatch than " +
         std::to_string(plan.micro_batch) + ".";
}

const std::vector<std::string>& shard_mode_names() {
  static const std::vector<std::string> names = {"off", "optimizer", "auto"};
  return names;
}

ShardMode parse_shard_mode(const std::string& value, int64_t world_size) {
  const std::vector<std::string>& names = shard_mode_names();
  const auto at = std::find(names.begin(), names.end(), value);
  if (at == names.end()) {
    throw InputError(option_name("--shard") + " '" + cut_for_message(value) + "': choose off, optimizer or auto");
  }
  const ShardMode mode = static_cast<ShardMode>(at - names.begin());
  if (mode != ShardMode::Off && world_size < 2) {
    const bool python = front_end() == FrontEnd::Python;
    throw InputError(shard_words(value) + " shards the optimizer state over the ranks: " +
                     (python ? "pass world_size=" : "give --world-size") + " of at least 2, or " + shard_words("off"));
  }
  return mode;
}

Plan plan_auto_sharding(const std::function<std::optional<Plan>()>& unsharded, const std::function<Plan()>& sharded,
                        int64_t world_size, const std::function<int64_t()>& freed_bytes,
                        const std::function<void(const std::string&)>& say) {
  std::optional<Plan> plan = unsharded();
  std::string why = "not one sample fits with the whole optimizer state on every rank";
  if (plan) {
    const int64_t freed = freed_bytes();
    if (!sharding_gain(*plan, freed)) {
      plan->reason += auto_sharding_note(*plan, world_size, freed, false);
      return *plan;
    }
    why = "sharding the optimizer state over " + std::to_string(world_size) + " ranks frees " + format_bytes(freed) +
          " per rank";
  }
  if (say) say(why + ": searching again sharded");
  Plan kept = sharded();
  kept.reason += auto_sharding_note(kept, world_size, 0, true);
  return kept;
}

}  // namespace accumplan
