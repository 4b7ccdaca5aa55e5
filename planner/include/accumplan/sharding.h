// accumplan/sharding.h — optimizer state sharded over data-parallel ranks (ZeRO-1), the planner's rules.
//
// What it is: PyTorch ZeroRedundancyOptimizer's partition of the parameters over W ranks (each
// parameter whole to one rank), each rank's share of the optimizer state under the state layout
// one real optimizer step showed, and what a sharded profile and plan record. The windows of a
// sharded plan run in one process that holds the whole weights and gradients but the optimizer
// state of the rank with the largest share only, so every peak they measure is that rank's, the
// worst; the other ranks hold less. A plan states the microbatch the same line gives without
// sharding, and `shard="auto"` asks sharding_gain whether sharding is worth a search. The other
// ranks' peaks are the measured one's less the state they do not hold, or their own optimizer
// step's, measured by a window holding their share (ranks_to_measure, per_rank_peaks).
// What it is not: a collective, an optimizer or a measurement (python/accumplan/measure.py holds
// the measuring optimizer; a ZeroRedundancyOptimizer trains the plan); gradient and parameter
// sharding (ZeRO-2/3, FSDP) are not planned here.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "accumplan/schema.h"

namespace accumplan {

// One optimizer's state per parameter, read from the state tensors one step left on a parameter
// of one element and on one of two elements of the model's dtype.
struct StateLayout {
  int64_t bytes_per_element = 0;    // state shaped like the parameter (Adam: two copies of it)
  int64_t bytes_per_parameter = 0;  // state of a fixed size (torch's Adam step counter, a scalar tensor)
};
// InputError when the two do not make a layout (fewer bytes for two elements than for one).
StateLayout state_layout(int64_t state_bytes_one_element, int64_t state_bytes_two_elements);

// ZeroRedundancyOptimizer's partition: within each parameter group the largest parameter first
// (equal sizes in their order), each to the rank with the fewest elements so far over all groups
// (the lowest such rank). Each parameter's rank, in group order.
std::vector<int64_t> zero_partition(const std::vector<std::vector<int64_t>>& group_numels, int64_t world_size);

// Each rank's share of the state of `group_numels` under `layout`, partitioned by zero_partition
// (each parameter's rank into `partition` when given), and the rank whose share the windows hold:
// the largest (the lowest such rank). InputError for a world size outside [2, 2^20], no
// parameters, or a layout of no state.
Sharding shard_optimizer_state(const std::vector<std::vector<int64_t>>& group_numels, int64_t world_size,
                               const StateLayout& layout, std::vector<int64_t>* partition = nullptr);

// Each rank's share of the state when parameter i (group order) holds state_bytes[i] after one
// step (0 for one that gets no gradient, a frozen or foreign parameter), partitioned by
// zero_partition, and the largest share's rank (the lowest such rank). InputError for a world size
// outside [2, 2^20], no parameters, a count that is not the groups', or no state at all.
Sharding shard_state(const std::vector<std::vector<int64_t>>& group_numels, const std::vector<int64_t>& state_bytes,
                     int64_t world_size, std::vector<int64_t>* partition = nullptr);

// What sharding frees on the rank with the largest share: the whole state less that share.
int64_t freed_state_bytes(const Sharding& sharding);

// The largest microbatch (at most per_rank_batch) a plan's fitting line allows under its usable
// bytes with `extra_bytes` more resident (negative: freed), by MemoryModel::line_largest_fitting;
// 0 when not one sample fits.
int64_t line_micro_batch(const Plan& plan, int64_t extra_bytes);

// The ranks whose optimizer step the profile measures beside the measured rank's: the lowest rank
// of each other share, the largest shares first, at most kMaxOtherRanksMeasured, rank order.
inline constexpr size_t kMaxOtherRanksMeasured = 8;
std::vector<int64_t> ranks_to_measure(const Sharding& sharding);

// Each rank's predicted peak, rank order: the microbatches' peak less the state the rank does not
// hold, or its optimizer step's peak, whichever is higher. A rank's step is the measured one of
// the smallest share at least its own (sharding.other_ranks, or the measured rank's `step_peak_bytes`).
std::vector<int64_t> per_rank_peaks(const Sharding& sharding, int64_t microbatches_peak_bytes, int64_t step_peak_bytes);

// A plan made from a sharded profile: plan.sharding from the profile's, the unsharded
// microbatch the same line gives with the whole state resident, each rank's peak
// (per_rank_peaks of the measured rank's microbatches and step), and the reason's sentence.
// InputError when the plan's world size is not the profile's sharding's.
void state_sharding(Plan& plan, int64_t microbatches_peak_bytes, int64_t step_peak_bytes);

// The peak a plan predicts on `rank`: its own where the ranks differ (plan.ranks), its sharding's
// per_rank_peak_bytes where it has them, otherwise memory.predicted_peak_bytes (every rank holds the same).
int64_t predicted_peak_of_rank(const Plan& plan, int64_t rank);

// shard="auto": the microbatch `unsharded`'s line gives with `freed_bytes` freed, when larger than
// the largest it allows (max_micro_batch); nullopt: sharding gains nothing.
std::optional<int64_t> sharding_gain(const Plan& unsharded, int64_t freed_bytes);

// shard="auto" chose: the sentence appended to the reason of the plan it keeps. `sharded`: the
// sharded plan (freed_bytes unused); otherwise the unsharded one.
std::string auto_sharding_note(const Plan& plan, int64_t world_size, int64_t freed_bytes, bool sharded);

// The shard option (`--shard`, `shard=`): the optimizer state whole on every rank, sharded over
// the ranks (ZeRO-1), or whichever of the two the planner chooses (plan_auto_sharding).
enum class ShardMode { Off, Optimizer, Auto };
const std::vector<std::string>& shard_mode_names();  // off optimizer auto
// The one reading of the shard option on `world_size` ranks: InputError naming the value and the
// choices, or a sharded mode with fewer than two ranks.
ShardMode parse_shard_mode(const std::string& value, int64_t world_size);

// shard="auto": the unsharded search's plan (nullopt: not one sample fit unsharded) unless
// sharding_gain says what sharding frees (`freed_bytes`, asked after that search) fits a larger
// microbatch, or nothing fit: then the sharded search's. The kept plan's reason says which;
// `say` announces the second search.
Plan plan_auto_sharding(const std::function<std::optional<Plan>()>& unsharded, const std::function<Plan()>& sharded,
                        int64_t world_size, const std::function<int64_t()>& freed_bytes,
                        const std::function<void(const std::string&)>& say);

}  // namespace accumplan
