// accumplan/checkpoint.h — activation checkpointing as a planned knob: the model that
// turns a checkpoint set and a microbatch into a predicted peak and a predicted window time, and
// the choice of the set with the least predicted seconds per effective batch.
//
// What it is: torch-free arithmetic over measured costs. Each candidate block (a transformer layer,
// a ResNet stage: accumplan/checkpointing.py finds them) carries two measured figures:
//   saved_bytes_per_sample      what checkpointing it frees per sample: the tensors its forward
//                               saves for backward, less the input a checkpoint keeps;
//   forward_seconds_per_sample  what recomputing it costs per sample: its forward again.
// With no block checkpointed, a training microbatch of b peaks at intercept + slope·b (the plan's
// own measured line, gradients resident) and takes time(b) seconds (forward + backward: the plan's
// TimeModel, accumplan/memory_model.h, the one the plan's `timing` predicts with). With a
// set S checkpointed (non-reentrant torch.utils.checkpoint: one block is recomputed at a time,
// during its own backward, after every later block's backward freed its activations):
//   peak(S, b)    = intercept + b·per_sample(S)
//   per_sample(S) = max(slope − Σ_{i∈S} saved_i,                                  the forward's end
//                       max_{i∈S} (slope − Σ_j saved_j − head                     a recompute: the
//                               + Σ_{j<i, j∉S} saved_j + saved_i))                head's backward done
//   seconds(S, b) = time(b) + b·Σ_{i∈S} forward_i
// `head` is what the no-checkpoint peak holds beyond the blocks' backward (measured: the peak less
// the blocks' backward's own peak), so the recompute term is that backward's peak less what S and
// the later blocks do not hold.
// and a window of T samples in the largest b that fits is ceil(T / b) microbatches (a balanced
// split of T), so its predicted time is Σ time(b_k) + T·Σ forward_i + the window's overhead. The sets considered
// over n candidates: none, every k-th block for k = n, n−1, ..., 2 (blocks k−1, 2k−1, ...: the
// deepest of each group, whose activations live longest), and all. Among those whose largest
// microbatch is at least one sample, the chosen set has the least predicted window time if that
// is at least kTimingGainFraction (10%, accumplan/solver.h) less than the fitting set with the
// fewest checkpointed blocks; otherwise that set (none whenever it fits): step times are noisy,
// and a predicted gain of a few percent is as often a loss (resnet18 on the CPU).
// What it is not: a measurement (Python measures the costs on the module), nor the confirmation:
// the chosen set is confirmed by a real window, like every plan.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "accumplan/memory_model.h"  // PeakLine, TimeModel
#include "accumplan/schema.h"        // BlockCost

namespace accumplan {

struct CheckpointSet {
  std::vector<size_t> blocks;  // indices into the candidates, ascending
  std::string rule;            // "none", "every 3rd block", "all"
};

// none, every k-th for k = n .. 2, all (n >= 1; for n = 1: none and all).
std::vector<CheckpointSet> checkpoint_sets(size_t candidates);

struct CheckpointModel {
  double intercept_bytes = 0;         // no checkpointing: peak(b) = intercept + slope·b
  double slope_bytes_per_sample = 0;
  // A microbatch's seconds without checkpointing (absent: no two sizes timed, every step 0 s).
  std::optional<TimeModel> step_time;
  // What a window costs beyond its microbatches' steps (the optimizer step, zero_grad, slicing the
  // data), the same whatever is checkpointed: the median over the profile's windows that fit of
  // their seconds less step_time of each microbatch (0: none timed). Without it resnet18's windows
  // (11.2 M parameters, AdamW) ran 25-52% longer than predicted on the CPU, and every set's ratio
  // to another was overstated, since the same seconds are added to both.
  double window_overhead_seconds = 0;
  std::vector<BlockCost> blocks;      // the candidates, in model order
  // What the no-checkpoint peak holds per sample beyond the blocks' backward: the head's saved
  // tensors and its backward's gradients (an LM head's logits), gone before any block is
  // recomputed; 0 when the peak is in the blocks' backward. Measured in the costs window.
  double head_bytes_per_sample = 0;
  // The optimizer step's transient peak, which no checkpointing lowers: a predicted peak is never
  // below it (0: not measured).
  double optimizer_step_peak_bytes = 0;
  // The gradients, which the first microbatch of a window runs without (the plan's persistent
  // gradients): its peak is the line less them.
  double gradients_bytes = 0;
  // Kept free at a microbatch no window ran at: this fraction of its activations (the plan's
  // headroom, 2% with --headroom auto), so a model a few percent off still fits its confirmation.
  double margin_fraction = 0;

  // peak(S, b) of the file comment as a line, at least optimizer_step_peak_bytes. InputError for a
  // block index out of range.
  PeakLine peak_line(const CheckpointSet& set) const;
  // The formulas of the file comment (the peak at least optimizer_step_peak_bytes). InputError for a block index out of range.
  int64_t predicted_peak_bytes(const CheckpointSet& set, int64_t micro_batch) const;
  // A window of these microbatch sizes: the first runs without gradients resident, the others
  // with them (the peak is the larger, and at least the optimizer step's). A balanced split of 64
  // under 29 is 22,21,21: its peak is the second microbatch's, not the line at 22 (3% higher).
  int64_t predicted_window_peak_bytes(const CheckpointSet& set, const std::vector<int64_t>& sizes) const;
  // The peak's slope with `set` checkpointed: slope − Σ saved + held(set).
  double bytes_per_sample(const CheckpointSet& set) const;
  double predicted_step_seconds(const CheckpointSet& set, int64_t micro_batch) const;
  // A window of these microbatch sizes with `set` checkpointed: Σ step_time(b) + Σ b·Σ forward +
  // the window's overhead.
  double predicted_window_seconds(const CheckpointSet& set, const std::vector<int64_t>& sizes) const;
  // The largest b in [1, limit] whose predicted peak plus the margin fits usable_bytes (0: not even one).
  int64_t largest_micro_batch(const CheckpointSet& set, int64_t usable_bytes, int64_t limit) const;
};

struct CheckpointChoice {
  CheckpointSet set;
  int64_t micro_batch = 0;               // the largest that fits, at most the per-rank batch
  int64_t accumulation_steps = 0;        // ceil(per_rank_batch / micro_batch)
  int64_t predicted_peak_bytes = 0;      // at micro_batch
  double predicted_window_seconds = 0;   // the window of per_rank_batch samples
};

// Every set's figures, in checkpoint_sets' order; a set whose microbatch 1 does not fit has
// micro_batch 0 and is never chosen.
std::vector<CheckpointChoice> checkpoint_options(const CheckpointModel& model, int64_t per_rank_batch,
                                                 int64_t usable_bytes);
// The least predicted window time when at least 10% below the fewest-blocks set that fits, else
// that set (equal times: fewer blocks); nullopt when no set fits one sample.
std::optional<CheckpointChoice> choose_checkpointing(const CheckpointModel& model, int64_t per_rank_batch,
                                                     int64_t usable_bytes);
// The same choice among options checkpoint_options already computed.
std::optional<CheckpointChoice> choose_checkpointing(const std::vector<CheckpointChoice>& options);

// What the choice weighed, for the plan's checkpoint_choice: every option of checkpoint_options
// (micro_batch 0 where not one sample fits), the chosen set's rule ("none" for none) and the rule.
CheckpointChoiceRecord choice_record(const CheckpointModel& model, const std::vector<CheckpointChoice>& options,
                                     const CheckpointSet& chosen);
// The chosen option and the best other one that fits, with the rule, in two lines (no newline at
// the end): what the summary, the report and Python's print(plan) show.
std::string describe_choice(const CheckpointChoiceRecord& record);

// The model of a solved plan: its fit's line (the steady peak), its profile's TimeModel (absent
// without two timed sizes) and its largest measured optimizer-step peak, with the measured
// candidate blocks. `applied`: the set the plan's windows ran with (none, or all when nothing
// fitted without), taken back out (its Σ saved − held added to the slope, its Σ forward per sample
// taken from the time model), so the model is always the one without checkpointing.
CheckpointModel checkpoint_model_of(const Plan& plan, std::vector<BlockCost> blocks, const CheckpointSet& applied = {},
                                    double head_bytes_per_sample = 0);

// `plan` (solved without checkpointing) with `choice`'s set: its sizes a balanced split of the
// per-rank batch under choice.micro_batch (set_window), its predicted peak the model's,
// `checkpoint` (the set, every candidate, and the plan without it) and a reason; unconfirmed until
// a real window with the set applied runs. A choice of none leaves the plan as it was.
Plan plan_with_checkpointing(const Plan& plan, const CheckpointModel& model, const CheckpointChoice& choice);

// `plan`, whose own windows (profile, confirmation) ran with `applied` checkpointed, stating it:
// its sizes, prediction and confirmation kept, `checkpoint` from the model (the alternative
// without it predicted). An empty set leaves the plan as it was.
Plan plan_stating_checkpointing(const Plan& plan, const CheckpointModel& model, const CheckpointSet& applied);

}  // namespace accumplan
