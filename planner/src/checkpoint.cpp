// planner/src/checkpoint.cpp — activation checkpointing's model and choice. See checkpoint.h.
#include "accumplan/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "accumplan/errors.h"
#include "accumplan/solver.h"
#include "accumplan/units.h"

namespace accumplan {
namespace {

std::string ordinal(size_t k) {
  const size_t tens = k % 100;
  const char* suffix = (tens >= 11 && tens <= 13) ? "th" : k % 10 == 1 ? "st" : k % 10 == 2 ? "nd" : k % 10 == 3 ? "rd" : "th";
  return std::to_string(k) + suffix;
}

// Over the set: Σ forward_i, and what checkpointing it frees per sample at its peak.
struct SetSums {
  double freed = 0, forward = 0;
};

// Backward runs the blocks in reverse, so when block i ∈ S is recomputed (during its own backward)
// the head's saved tensors and every later block's activations are gone: the peak is the larger of
// the end of the forward (all but S held) and each recompute (the earlier unchecked blocks and
// block i). Without the order (Σ_{j∉S} + max_{i∈S}), checkpointing one middle block of eight equal
// ones was predicted to free nothing; it frees one block (measured: the peak 8.6% lower, the mlp
// stack of tests/bench/checkpoint_bench.py). Without the head's share, checkpointing a decoder's
// last block was predicted to free nothing; it frees it (13% lower: its LM head's logits and their
// gradient go first). Modelled from saved tensors instead of measured, the head's share left the
// decoder 3.2% over and the mlp stack 2.3% under with every block checkpointed; measured, both are
// within 0.2% (CHECKPOINT.md).
SetSums sums_of(const CheckpointModel& m, const CheckpointSet& set) {
  SetSums s;
  std::vector<bool> in(m.blocks.size(), false);
  for (size_t i : set.blocks) {
    if (i >= m.blocks.size()) {
      throw InputError("checkpoint set '" + set.rule + "' names block " + std::to_string(i) + " of " +
                       std::to_string(m.blocks.size()) + " candidates");
    }
    in[i] = true;
    s.forward += m.blocks[i].forward_seconds_per_sample;
  }
  double all = 0, in_set = 0;
  for (size_t i = 0; i < m.blocks.size(); ++i) {
    all += m.blocks[i].saved_bytes_per_sample;
    if (in[i]) in_set += m.blocks[i].saved_bytes_per_sample;
  }
  // What is held per sample at each phase, relative to the slope without checkpointing: the
  // forward's end −in_set; the recompute of block i −all − head + Σ_{j<i, j∉S} saved_j + saved_i.
  double held = -in_set, kept_before = 0;
  for (size_t i = 0; i < m.blocks.size(); ++i) {
    const double saved = m.blocks[i].saved_bytes_per_sample;
    if (in[i]) held = std::max(held, -all - m.head_bytes_per_sample + kept_before + saved);
    else kept_before += saved;
  }
  s.freed = -held;
  return s;
}

double per_sample_bytes(const CheckpointModel& m, const SetSums& s) {
  return m.slope_bytes_per_sample - s.freed;
}

}  // namespace

std::vector<CheckpointSet> checkpoint_sets(size_t n) {
  std::vector<CheckpointSet> sets{{{}, "none"}};
  for (size_t k = n; k >= 2; --k) {
    CheckpointSet s;
    for (size_t i = k - 1; i < n; i += k) s.blocks.push_back(i);
    s.rule = "every " + ordinal(k) + " block";
    sets.push_back(s);
  }
  if (n >= 1) {
    CheckpointSet all;
    all.blocks.resize(n);
    std::iota(all.blocks.begin(), all.blocks.end(), size_t{0});
    all.rule = "all";
    sets.push_back(all);
  }
  return sets;
}

double CheckpointModel::bytes_per_sample(const CheckpointSet& set) const {
  return per_sample_bytes(*this, sums_of(*this, set));
}

PeakLine CheckpointModel::peak_line(const CheckpointSet& set) const {
  return {intercept_bytes, per_sample_bytes(*this, sums_of(*this, set)), optimizer_step_peak_bytes};
}

int64_t CheckpointModel::predicted_peak_bytes(const CheckpointSet& set, int64_t b) const {
  return peak_line(set).peak_bytes(b);
}

int64_t CheckpointModel::predicted_window_peak_bytes(const CheckpointSet& set, const std::vector<int64_t>& sizes) const {
  if (sizes.empty()) return static_cast<int64_t>(std::ceil(optimizer_step_peak_bytes));
  const double first = static_cast<double>(predicted_peak_bytes(set, sizes.front())) - gradients_bytes;
  int64_t peak = static_cast<int64_t>(std::ceil(std::max(first, optimizer_step_peak_bytes)));
  for (size_t i = 1; i < sizes.size(); ++i) peak = std::max(peak, predicted_peak_bytes(set, sizes[i]));
  return peak;
}

double CheckpointModel::predicted_step_seconds(const CheckpointSet& set, int64_t b) const {
  return (step_time ? step_time->predict_seconds(b) : 0.0) + static_cast<double>(b) * sums_of(*this, set).forward;
}

double CheckpointModel::predicted_window_seconds(const CheckpointSet& set, const std::vector<int64_t>& sizes) const {
  double seconds = window_overhead_seconds;
  for (int64_t b : sizes) seconds += predicted_step_seconds(set, b);
  return seconds;
}

int64_t CheckpointModel::largest_micro_batch(const CheckpointSet& set, int64_t usable_bytes, int64_t limit) const {
  return peak_line(set).largest_fitting(usable_bytes, limit, 0, margin_fraction);
}

std::vector<CheckpointChoice> checkpoint_options(const CheckpointModel& model, int64_t per_rank_batch,
                                                 int64_t usable_bytes) {
  if (per_rank_batch < 1) throw InputError("a window holds at least one sample, got " + std::to_string(per_rank_batch));
  std::vector<CheckpointChoice> out;
  for (const CheckpointSet& set : checkpoint_sets(model.blocks.size())) {
    CheckpointChoice c;
    c.set = set;
    c.micro_batch = model.largest_micro_batch(set, usable_bytes, per_rank_batch);
    if (c.micro_batch > 0) {
      c.accumulation_steps = (per_rank_batch + c.micro_batch - 1) / c.micro_batch;
      c.predicted_peak_bytes = model.predicted_peak_bytes(set, c.micro_batch);
      c.predicted_window_seconds =
          model.predicted_window_seconds(set, split_samples(per_rank_batch, c.micro_batch, "balanced"));
    }
    out.push_back(c);
  }
  return out;
}

std::optional<CheckpointChoice> choose_checkpointing(const CheckpointModel& model, int64_t per_rank_batch,
                                                     int64_t usable_bytes) {
  return choose_checkpointing(checkpoint_options(model, per_rank_batch, usable_bytes));
}

std::optional<CheckpointChoice> choose_checkpointing(const std::vector<CheckpointChoice>& options) {
  std::optional<CheckpointChoice> fewest, fastest;
  for (const CheckpointChoice& c : options) {
    if (c.micro_batch == 0) continue;
    if (!fewest || c.set.blocks.size() < fewest->set.blocks.size()) fewest = c;
    const bool faster = !fastest || c.predicted_window_seconds < fastest->predicted_window_seconds;
    const bool tie_fewer = fastest && c.predicted_window_seconds == fastest->predicted_window_seconds &&
                           c.set.blocks.size() < fastest->set.blocks.size();
    if (faster || tie_fewer) fastest = c;
  }
  if (!fewest) return std::nullopt;
  const bool clearly = fastest->predicted_window_seconds <= fewest->predicted_window_seconds * (1.0 - kTimingGainFraction);
  return clearly ? fastest : fewest;
}

namespace {

// The median over the profile's windows that fit of their seconds less their microbatches' steps
// by `time` (their own checkpointing included, as in the profile's step times); 0 when none is timed.
double window_overhead_seconds(const Profile& profile, const TimeModel& time) {
  std::vector<double> over;
  for (const Trial& t : profile.trials) {
    if (!t.fit || t.seq_len || t.window.empty() || !(t.seconds > 0)) continue;
    over.push_back(std::max(0.0, t.seconds - time.window_seconds(t.window)));
  }
  if (over.empty()) return 0;
  std::sort(over.begin(), over.end());
  const size_t mid = over.size() / 2;
  return over.size() % 2 ? over[mid] : (over[mid - 1] + over[mid]) / 2;
}

}  // namespace

CheckpointModel checkpoint_model_of(const Plan& plan, std::vector<BlockCost> blocks, const CheckpointSet& applied,
                                    double head_bytes_per_sample) {
  CheckpointModel m;
  m.head_bytes_per_sample = head_bytes_per_sample;
  m.intercept_bytes = plan.fit.intercept_bytes;
  m.slope_bytes_per_sample = plan.fit.slope_bytes_per_sample;
  m.blocks = std::move(blocks);
  m.margin_fraction = plan.memory.margin.activation_fraction;
  m.gradients_bytes = static_cast<double>(plan.profile.persistent.gradients_bytes);
  for (const ProfilePoint& p : plan.profile.points) {
    m.optimizer_step_peak_bytes = std::max(m.optimizer_step_peak_bytes, static_cast<double>(p.optimizer_step_peak_bytes.value_or(0)));
  }
  // The plan's own time model (its `timing`), through the profile's step times as measured.
  if (TimeModel::available(plan.profile)) {
    m.step_time = TimeModel::fit(plan.profile);
    m.window_overhead_seconds = window_overhead_seconds(plan.profile, *m.step_time);
  }
  // The applied set taken back out: its windows kept what it frees less per sample and spent
  // Σ forward more per sample than the same windows without checkpointing.
  const SetSums a = sums_of(m, applied);
  m.slope_bytes_per_sample += a.freed;
  if (m.step_time) m.step_time = m.step_time->plus_per_sample(-a.forward);
  return m;
}

namespace {

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// The plan's `checkpoint` for `set` (non-empty), its window predicted at `window_seconds`.
PlanCheckpoint checkpoint_field(const Plan& plan, const CheckpointModel& model, const CheckpointSet& set,
                                double window_seconds, const CheckpointChoice& none) {
  PlanCheckpoint c;
  for (size_t i : set.blocks) c.modules.push_back(model.blocks.at(i).name);
  c.rule = set.rule;
  c.candidates = model.blocks;
  const SetSums s = sums_of(model, set);
  c.saved_bytes_per_sample = s.freed;
  c.head_bytes_per_sample = model.head_bytes_per_sample;
  c.recompute_seconds = s.forward * static_cast<double>(plan.per_rank_batch);
  c.predicted_seconds_per_window = window_seconds;
  if (none.micro_batch > 0) {
    c.without = {none.micro_batch, none.accumulation_steps, none.predicted_peak_bytes, none.predicted_window_seconds};
  }
  return c;
}

// "...; predicted 1.2 s per window against 1.0 s without".
std::string trade_sentence(const PlanCheckpoint& c, int64_t micro_batch) {
  const CheckpointAlternative& w = c.without;
  return "Checkpointing " + c.rule + " (" + joined(c.modules) + ") frees " +
         format_bytes(static_cast<int64_t>(c.saved_bytes_per_sample)) + " per sample, so microbatches of up to " +
         std::to_string(micro_batch) + " fit (" +
         (w.micro_batch > 0 ? std::to_string(w.micro_batch) + " without" : std::string("none without")) +
         "); predicted " + format_seconds(c.predicted_seconds_per_window) + " per window" +
         (w.micro_batch > 0 ? " against " + format_seconds(w.predicted_seconds_per_window) + " without" : std::string());
}

}  // namespace

CheckpointChoiceRecord choice_record(const CheckpointModel& model, const std::vector<CheckpointChoice>& options,
                                     const CheckpointSet& chosen) {
  CheckpointChoiceRecord r;
  for (const CheckpointChoice& c : options) {
    CheckpointOption o{c.set.blocks.empty() ? "none" : c.set.rule, {}, c.micro_batch, c.accumulation_steps,
                       c.predicted_peak_bytes, c.predicted_window_seconds};
    for (size_t i : c.set.blocks) o.modules.push_back(model.blocks.at(i).name);
    if (c.set.blocks == chosen.blocks) r.chosen = o.rule;
    r.options.push_back(std::move(o));
  }
  r.decided_by = "the least predicted seconds per window when at least " +
                 std::to_string(std::lround(100 * kTimingGainFraction)) +
                 "% under the fitting set with the fewest checkpointed blocks; else that set";
  return r;
}

std::string describe_choice(const CheckpointChoiceRecord& record) {
  auto figures = [](const CheckpointOption& o) {
    return o.rule + " (microbatch " + std::to_string(o.micro_batch) + " x " + std::to_string(o.accumulation_steps) +
           ", peak " + format_bytes(o.predicted_peak_bytes) + ", " + format_seconds(o.predicted_seconds_per_window) +
           " per window)";
  };
  const CheckpointOption* chosen = nullptr;
  const CheckpointOption* next = nullptr;
  for (const CheckpointOption& o : record.options) {
    if (o.rule == record.chosen) chosen = &o;
    else if (o.micro_batch > 0 && (!next || o.predicted_seconds_per_window < next->predicted_seconds_per_window)) next = &o;
  }
  std::string text = "checkpointing: " + (chosen ? figures(*chosen) : record.chosen) + ", of " +
                     std::to_string(record.options.size()) + " sets";
  text += "\n  next best: " + (next ? figures(*next) : std::string("no other set fits one sample"));
  return text + "; the rule: " + record.decided_by;
}

Plan plan_with_checkpointing(const Plan& plan, const CheckpointModel& model, const CheckpointChoice& choice) {
  if (choice.set.blocks.empty()) return plan;
  if (choice.micro_batch < 1) throw InputError("a checkpoint choice holds at least one sample per microbatch");
  Plan p = plan;
  const std::vector<CheckpointChoice> options = checkpoint_options(model, plan.per_rank_batch, plan.memory.usable_bytes);
  p.checkpoint = checkpoint_field(plan, model, choice.set, choice.predicted_window_seconds, options.front());
  set_window(p, split_samples(plan.per_rank_batch, choice.micro_batch, "balanced"), choice.micro_batch);
  p.memory.predicted_peak_bytes = model.predicted_window_peak_bytes(choice.set, p.microbatch_sizes);
  p.confirmed = false;
  p.confirmed_peak_bytes.reset();
  p.timing.reset();  // the plan's timing is the no-checkpoint one; predicted_seconds_per_window says this one's
  p.reason = trade_sentence(*p.checkpoint, choice.micro_batch) + ", the least of " + std::to_string(options.size()) +
             " checkpoint sets.";
  return p;
}

Plan plan_stating_checkpointing(const Plan& plan, const CheckpointModel& model, const CheckpointSet& applied) {
  if (applied.blocks.empty()) return plan;
  Plan p = plan;
  const std::vector<CheckpointChoice> options = checkpoint_options(model, plan.per_rank_batch, plan.memory.usable_bytes);
  // The plan's windows ran with `applied`: their timing, where fitted, is this window's one figure.
  const double window_seconds =
      plan.timing ? plan.timing->window_seconds : model.predicted_window_seconds(applied, plan.microbatch_sizes);
  p.checkpoint = checkpoint_field(plan, model, applied, window_seconds, options.front());
  p.reason = trade_sentence(*p.checkpoint, plan.max_micro_batch) + ". " + plan.reason;
  return p;
}

}  // namespace accumplan
