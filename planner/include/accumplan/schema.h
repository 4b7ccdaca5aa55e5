// accumplan/schema.h — profile.json and plan.json: the structs, their JSON, their versions.
//
// What it is: the single definition of both documents accumplan exchanges. Every field that holds
// bytes ends in `_bytes`, every field that holds time ends in `_seconds`. Writers always emit
// `"schema"` and `"schema_version": "1.0"`; readers accept any 1.x (unknown fields are ignored)
// and refuse another major version. A missing or ill-typed field raises SchemaError naming its
// JSON path, e.g. `$.points[2].peak_bytes`. JSON Schema files for both documents live in
// planner/schemas/ and a test keeps them in step with this file.
// What it is not: the logic that fills them (profiler/, planner/solver.h).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "accumplan/checked.h"
#include "accumplan/tensor_spec.h"

namespace accumplan {

inline constexpr const char* kProfileSchema = "accumplan.profile";
inline constexpr const char* kPlanSchema = "accumplan.plan";
inline constexpr const char* kRunStatsSchema = "accumplan.run_stats";
inline constexpr int kSchemaMajor = 1;
// 1.1: a plan nests its whole profile ("profile"); 1.0 plans flattened it (profile_points,
// trials) and are still read. Setup gains max_grad_norm, points first_microbatch_peak_bytes.
// 1.2: the plan's memory states its margin in bytes and its parts (`memory.margin`) instead of a
// fraction of the budget (a 1.0/1.1 `headroom` fraction reads as that many bytes kept free);
// trials record their window's microbatch sizes (`window`).
// 1.3: ragged data (sequences of different lengths): a plan may carry `tokens`, the token budget
// its microbatches are packed under, and setup `padding_mask`. Both are absent from sample plans,
// which read and mean what they did in 1.2.
// 1.4: a packed plan may carry `tokens.target_tokens`: each update is a window of consecutive
// sequences holding at least that many valid tokens (token_windows in token_model.h) instead of
// target_batch samples; and `tokens.step_cost`, the measured cost packing minimises (padded
// tokens against microbatches) instead of filling each microbatch. Plans without them read and
// mean what they did in 1.3.
// 1.5: `tokens.step_cost.token_seconds`, so the step cost predicts seconds (the plan's predicted
// window time); run stats gain the time model's record (`time_model`, each window's
// `predicted_seconds` and `microbatch_seconds`). Absent, everything means what it did in 1.4.
// 1.6: the whole optimizer: setup `flags` (its on/off options: nesterov, amsgrad, maximize,
// foreach, ...) and, for an optimizer of more than one parameter group, `param_groups` (each
// group's lr, hyperparameters, flags and parameter count; the first is lr/hyperparameters/flags).
// Absent, a setup means what it did in 1.5: one group, every option at torch's default.
// 1.7: a plan may carry `eval`, the evaluation microbatch planned beside the training one (the
// largest that fits with the weights and optimizer state resident, confirmed by a real eval window),
// with its line, what stays resident and its eval windows (trials of kind "eval"). Absent: no
// evaluation batch was planned (--no-eval, or a plan written before 1.7). A plan may also carry
// `checkpoint`: the blocks it trains with activation checkpointing, which only the
// Python module can apply (`accumplan run` refuses such a plan).
// 1.9: `sharding`, on a profile and a plan whose windows held one rank's share of the optimizer
// state sharded over world_size ranks (ZeRO-1, accumplan/sharding.h). Absent: unsharded, as in 1.8.
// 1.10: `profile.gradient_exchange`, true when the windows made a rank's gradient exchange; a plan
// for two or more ranks is made only from such a profile.
// 1.11: `sharding.other_ranks`, the optimizer step of each other share measured; a plan's
// `sharding.per_rank_peak_bytes`, each rank's predicted peak.
// 1.12: run statistics name the data's split over the ranks `striding` (1.11 and before:
// `sharding`, which now means only the optimizer state); the reader takes either.
// 1.13: a plan's `ranks`, one window per rank where the ranks' budgets or speeds differ
// (accumplan/ranks.h); absent, every rank runs the plan's one window.
inline constexpr int kSchemaMinor = 13;
const std::string& schema_version_string();  // "1.13"

struct DeviceInfo {
  std::string type = "cpu";  // "cpu" or "cuda"
  int index = 0;
  std::string name;          // e.g. "cpu (counting allocator)", "NVIDIA H200"
  int64_t total_bytes = 0;   // device memory (CPU: the enforced budget, else machine memory)
};

// A model.path that names no file: the plan was measured in Python on the module of this class
// ("python:TinyLM"), and carries no SHA-256.
inline constexpr const char* kPythonModelPrefix = "python:";

struct ModelInfo {
  std::string path;          // the TorchScript file, or kPythonModelPrefix + the module's class name
  std::string sha256;        // of the model file's bytes; the executor checks it
  int64_t parameter_count = 0;
  std::vector<std::string> batch_dependent_layers;  // e.g. "layer1.0.bn1 (BatchNorm2d)"
  // 1.8, from accumplan.plan: whether the model is a transformers model (gradient_checkpointing_enable);
  // nullopt: not recorded (the CLI's TorchScript models, older plans).
  std::optional<bool> hf_gradient_checkpointing;
  // The module's class name when the plan was measured in Python; "" for a file.
  std::string python_class() const {
    const std::string prefix = kPythonModelPrefix;
    return path.compare(0, prefix.size(), prefix) == 0 ? path.substr(prefix.size()) : std::string();
  }
};

// 1.6: one parameter group of the optimizer: its values as Setup's lr, hyperparameters and flags
// state them for the first group.
struct OptimizerGroup {
  double lr = 0.01;
  std::map<std::string, double> hyperparameters;
  std::map<std::string, bool> flags;
  std::optional<int64_t> parameter_count;  // elements of the group's parameters, where recorded
};

struct Setup {
  std::string optimizer = "sgd";    // sgd momentum adam adamw adagrad rmsprop
  double lr = 0.01;
  // Optimizer hyperparameters beyond lr, by LibTorch's names: momentum, dampening, weight_decay,
  // beta1, beta2, eps, alpha (rmsprop), lr_decay and initial_accumulator_value (adagrad). Absent
  // means LibTorch's default (accumplan/setup_rules.h).
  std::map<std::string, double> hyperparameters;
  // 1.6: the optimizer's on/off options by torch.optim's names (nesterov, amsgrad, centered,
  // maximize, foreach, fused, capturable, differentiable; setup_rules.h lists each optimizer's).
  // Absent means torch's default: off (foreach and fused: None, torch chooses). Written when set.
  std::map<std::string, bool> flags;
  // 1.6: every parameter group, in order, when the optimizer has more than one; empty for one.
  // param_groups[0] states the same lr, hyperparameters and flags as the fields above (the
  // reader refuses a plan where they differ), so a reader of 1.5 sees the first group.
  std::vector<OptimizerGroup> param_groups;
  std::string amp = "none";         // none bf16 fp16: the autocast mode the profile measured
  std::optional<double> max_grad_norm;  // clipping of the combined gradient the profile measured
  std::string loss = "cross_entropy";  // cross_entropy mse model
  std::string normalization = "auto";  // samples | tokens | auto (tokens for [B,T,C] cross-entropy)
  std::vector<std::string> inputs;  // tensor specs, one per forward argument
  std::string target;               // tensor spec; empty when loss == "model" takes none
  int64_t ignore_index = -100;
  // 1.3: the padding mask (bool [b, T], true at padding) goes to the model as one more forward
  // argument after the inputs (`--padding-mask`). Written only when true.
  bool padding_mask = false;
  // 1.3: variable-length data: the sequence lengths the profile measured for (`--seq-len`,
  // written "16..1024"); inputs then have a sequence dimension T. nullopt for fixed shapes.
  std::optional<SeqLenRange> seq_len;
};

struct Persistent {
  int64_t weights_bytes = 0;
  int64_t gradients_bytes = 0;
  int64_t optimizer_state_bytes = 0;
  // Checked: InputError instead of a wrapped sum (each part is at most 1 PiB when read).
  int64_t total() const {
    return checked_add(checked_add(weights_bytes, gradients_bytes, "persistent bytes"), optimizer_state_bytes,
                       "persistent bytes");
  }
};

// Peaks of one executor window of two microbatches of micro_batch samples, all bytes on the
// device, persistent included, the window's data excluded.
struct ProfilePoint {
  int64_t micro_batch = 0;
  int64_t peak_bytes = 0;                            // the microbatches' peak (steady state)
  std::optional<int64_t> first_microbatch_peak_bytes;  // the first one's: no gradient resident yet
  std::optional<int64_t> reserved_peak_bytes;        // caching allocators (CUDA) only
  std::optional<int64_t> optimizer_step_peak_bytes;  // peak after the microbatches: the exchange (1.10) and optimizer.step()
  std::optional<double> step_seconds;                // one microbatch forward+backward
  // 1.3, variable-length data: each of the micro_batch sequences is padded to seq_len tokens (a
  // point of the (b, T) grid, accumplan/token_model.h). Absent for fixed shapes.
  std::optional<int64_t> seq_len;
};

// Every real training step the profiler took, and what it cost.
struct Trial {
  std::string kind;          // "probe" | "confirm" | "climb" | "eval" (1.7, only in Plan::eval)
  int64_t micro_batch = 0;
  bool fit = false;          // ran without OOM and within the budget
  int64_t peak_bytes = 0;    // the window's highest peak; 0 when it ran out of memory
  double seconds = 0;
  // The window's microbatch sizes, in order (1.2; empty in older files): a window [b, b] that
  // fits shows that every window of sizes <= b fits (the first microbatch and the later ones
  // measured separately, see MemoryModel), so the planner can count it as a confirmation.
  std::vector<int64_t> window;
  std::optional<int64_t> seq_len;  // 1.3: the window's sequences were padded to this many tokens
};

// 1.7: `accumplan profile`'s evaluation window (Search::profile_eval): each eval microbatch's
// peak with the weights and optimizer state resident, from which `accumplan plan` states an
// (unconfirmed) evaluation batch by its line.
struct EvalPoint {
  int64_t micro_batch = 0;
  int64_t peak_bytes = 0;
};
struct EvalProfile {
  bool keep_outputs = false;
  std::vector<EvalPoint> points;
  std::vector<Trial> trials;  // kind "eval"
};

// 1.11: a window whose optimizer held another rank's share of the sharded state: the peak after
// its microbatches (the exchange and optimizer.step()), that share's state resident.
struct RankStepPeak {
  int64_t rank = 0;
  int64_t optimizer_step_peak_bytes = 0;
  double seconds = 0;  // its windows' (one to allocate the share's state, one measured)
};

// 1.9: the optimizer state sharded over world_size ranks as ZeroRedundancyOptimizer partitions it
// (accumplan/sharding.h). The windows held measured_rank's share, the largest.
struct Sharding {
  bool optimizer = true;                      // the optimizer state is sharded (the only kind planned)
  int64_t world_size = 2;
  std::vector<int64_t> per_rank_state_bytes;  // each rank's share of the state, rank order
  int64_t measured_rank = 0;                  // whose share the windows held: the largest
  // Plans only: the microbatch the plan's line gives with the whole state on every rank; 0: not
  // one sample fits unsharded (JSON null).
  std::optional<int64_t> unsharded_micro_batch;
  // 1.11: the lowest rank of each other share the profile measured (sharding.h ranks_to_measure), rank order.
  std::vector<RankStepPeak> other_ranks;
  // 1.11, plans only: each rank's predicted peak, rank order (sharding.h per_rank_peaks); empty in older plans.
  std::vector<int64_t> per_rank_peak_bytes;
};

struct Profile {
  DeviceInfo device;
  ModelInfo model;
  Setup setup;
  std::string libtorch_version;
  std::string probe;                        // which MemoryProbe measured, e.g. "cpu-counting"
  std::optional<int64_t> budget_bytes;      // budget enforced while profiling, if any
  Persistent persistent;
  std::vector<ProfilePoint> points;
  std::vector<Trial> trials;
  std::optional<EvalProfile> eval;          // 1.7, `accumplan profile` unless --no-eval
  std::optional<Sharding> sharding;         // 1.9: the windows held one rank's share of the state
  // 1.10: every window made a rank's gradient exchange (its flat buffers, as each of two or more
  // ranks holds them); a plan for two or more ranks needs it.
  bool gradient_exchange = false;
};

// What the plan keeps free below the budget (`--headroom`), in bytes, part by part.
// The default ("auto") is built from what was measured: the fit's largest residual and a small
// fraction of the batch-dependent activations cover the line's error (they are dropped for a
// size a real window ran at). `--headroom 0.05` keeps 5% of the batch-dependent activations free,
// `--headroom 256MiB` that many bytes, `--headroom 0` nothing. A caching allocator's reserved bytes
// above the allocated ones are not kept free: it releases that cache and retries before it runs
// out, so they were cache the cap left room for (on an H200, up to 96% of an 8 GiB cap at half of
// what fit); the confirming window under the real cap is what shows the plan fits.
struct Margin {
  std::string headroom = "auto";             // the --headroom it came from: auto, 0.05, 256 MiB
  int64_t fit_residual_bytes = 0;            // auto: the fit's largest |residual| (prediction)
  double activation_fraction = 0;            // of the batch-dependent activations a1·b
  int64_t activation_bytes = 0;              // activation_fraction · a1 · micro_batch
  int64_t allocator_fragmentation_bytes = 0; // 0; kept when a plan made before it was dropped has it
  int64_t fixed_bytes = 0;                   // --headroom SIZE (or a 1.0/1.1 fraction of the budget)
  // True when a real window at the planned sizes (or larger) ran within the budget: the
  // prediction parts (fit residual; with auto, the activation fraction) no longer apply.
  bool measured = false;
};

struct MemoryBreakdown {
  int64_t budget_bytes = 0;
  Margin margin;
  int64_t margin_bytes = 0;                 // kept free at micro_batch: the parts that apply
  int64_t usable_bytes = 0;                 // budget_bytes − margin_bytes
  int64_t predicted_peak_bytes = 0;         // at plan.micro_batch
  int64_t weights_bytes = 0;
  int64_t gradients_bytes = 0;
  int64_t optimizer_state_bytes = 0;
  int64_t activation_fixed_bytes = 0;       // a0 of peak(b) = persistent + a0 + a1*b
  double activation_bytes_per_sample = 0;   // a1
};

struct FitSummary {
  std::string target;                       // "peak_bytes" ("reserved_peak_bytes" in older plans)
  double intercept_bytes = 0;               // persistent + a0
  double slope_bytes_per_sample = 0;        // a1
  double max_abs_residual_bytes = 0;
  double rms_residual_bytes = 0;
  std::vector<double> residuals_bytes;      // measured - fitted, one per profile point
  int64_t fitted_from_micro_batch = 0;      // points below this size are shown, not fitted (1.1)
};

struct Timing {
  double window_seconds = 0;                // predicted seconds for one accumulation window
  double microbatch_seconds_at_plan = 0;    // predicted seconds of the largest microbatch
};

// Ragged data (1.3): each window's sequences are packed, longest first, into microbatches of at
// most token_budget padded tokens (b sequences padded to the microbatch's longest L: b·L <=
// token_budget; accumplan/token_model.h, pack_by_token_budget). The sample fields still hold
// the window (per_rank_batch samples); microbatch_sizes is then the plan's split at max_seq_len.
// 1.4: what packing minimises, the relative time of one microbatch of b sequences padded to L
// tokens, in integer units: per_microbatch + per_token·b·L + per_token_squared·b·L², with
// per_token = kStepCostPerToken (accumplan/token_model.h). Fitted from the profile's step times;
// absent, packing makes the fewest microbatches (as 1.3 did).
// 1.5: token_seconds, the seconds of per_token units (one padded token's time), so the cost
// predicts seconds (accumplan/step_time.h); 0 where unknown (1.4 plans, a cost given by hand).
struct TokenStepCost {
  int64_t per_microbatch = 0;
  int64_t per_token = 0;
  int64_t per_token_squared = 0;
  double token_seconds = 0;
};

// The range of each integer term of a step cost (docs/plan-format.md), checked in one place,
// check_step_cost: the plan reader's $.tokens.step_cost, the run statistics' time_model.final_cost
// and the Python package's pack_by_token_budget (python/core/plan_rules.cpp) all call it.
struct StepCostTermRange {
  const char* name;
  int64_t lo;
  int64_t hi;
};
inline constexpr StepCostTermRange kStepCostTermRanges[] = {
    {"per_microbatch", 0, int64_t{1} << 50}, {"per_token", 1, int64_t{1} << 16}, {"per_token_squared", 0, int64_t{1} << 30}};
// SchemaError for the first term outside its range, naming it as `prefix` + term + `suffix`
// ("$.tokens.step_cost." + "per_token"; Python: "step_cost['" + "per_token" + "']"), its value and
// its range.
void check_step_cost(const TokenStepCost& cost, const std::string& prefix, const std::string& suffix = "");

// The losses a setup names (setup.loss, --loss, accumplan.plan's loss=).
inline const std::vector<std::string> kLosses = {"cross_entropy", "mse", "model"};

struct TokenBudget {
  int64_t token_budget = 0;            // padded tokens per microbatch
  int64_t max_seq_len = 0;             // the longest sequence the budget was planned (and confirmed) for
  int64_t longest_sequence_alone = 0;  // the longest one sequence the memory model says fits alone
  // 1.4, --target-tokens: valid tokens per update (over all ranks). Windows are then cut by
  // token_windows, not by target_batch, and may hold any number of samples; target_batch is the
  // window at max_seq_len (ceil(target_tokens / max_seq_len) sequences, rounded up to a multiple
  // of the world size), what the sample fields describe.
  std::optional<int64_t> target_tokens;
  std::optional<TokenStepCost> step_cost;  // 1.4: packing minimises this; absent: fewest microbatches
};

struct UniformSplit {
  int64_t micro_batch = 0;
  int64_t accumulation_steps = 0;
};

// 1.7: the evaluation batch the search plans beside the training plan (Search::plan_eval): the
// largest eval microbatch whose measured peak fits the training plan's usable bytes, with the
// training state resident (weights and optimizer state; gradients freed as
// zero_grad(set_to_none=True) leaves them). An eval step is the forward under no_grad in the
// model's eval mode, the loss summed.
struct EvalPlan {
  int64_t micro_batch = 0;              // 0: not even the training microbatch fits beside the state
  int64_t predicted_peak_bytes = 0;     // at micro_batch, by the eval line refitted with every eval point
  double intercept_bytes = 0;           // the eval line: peak(b) = intercept + slope·b
  double slope_bytes_per_sample = 0;
  bool keep_outputs = false;            // a microbatch's outputs stay on the device through the next one's forward
  int64_t weights_bytes = 0;            // resident: the profile's persistent weights
  int64_t optimizer_state_bytes = 0;    // and optimizer state (no gradients)
  bool confirmed = false;               // an eval window at micro_batch ran within the usable bytes
  std::vector<Trial> trials;            // the eval windows, kind "eval"
};

// 1.7: activation checkpointing the plan chose (accumplan/checkpoint.h): which candidate
// blocks recompute their forward in backward, what each candidate was measured to free and cost,
// and the no-checkpoint alternative's figures, so a reader sees what was traded.
struct BlockCost {
  std::string name;                       // the module's name in the model, e.g. "blocks.3"
  double saved_bytes_per_sample = 0;      // freed per sample when checkpointed (>= 0)
  double forward_seconds_per_sample = 0;  // recomputed per sample when checkpointed (>= 0)
};
struct CheckpointAlternative {
  int64_t micro_batch = 0;                // 0: not one sample fits without checkpointing
  int64_t accumulation_steps = 0;
  int64_t predicted_peak_bytes = 0;
  double predicted_seconds_per_window = 0;
};
struct PlanCheckpoint {
  std::vector<std::string> modules;        // checkpointed, in model order (a subset of candidates)
  std::string rule;                        // "every 2nd block", "all"
  std::vector<BlockCost> candidates;       // every candidate block, measured
  double saved_bytes_per_sample = 0;       // what the set frees per sample at the peak (accumplan/checkpoint.h)
  double head_bytes_per_sample = 0;        // measured: what the peak holds beyond the blocks' backward (checkpoint.h)
  double recompute_seconds = 0;            // the forward recomputed per window
  double predicted_seconds_per_window = 0;
  CheckpointAlternative without;           // the plan without checkpointing
  // The windows beyond the search's own: the one that measured the candidates (kind "costs",
  // without checkpointing), then the one that confirmed this set when the search's windows ran
  // without it (kind "confirm"; without one, the profile's windows ran with this set applied).
  std::vector<Trial> trials;
};

// 1.8: what checkpointing="auto" weighed: every set considered with its figures, the one chosen
// ("none" when the plan keeps none) and the rule that decided, so a reader can judge the trade.
struct CheckpointOption {
  std::string rule;                        // "none", "every 2nd block", "all"
  std::vector<std::string> modules;        // checkpointed by this set (none: empty)
  int64_t micro_batch = 0;                 // the largest that fits; 0: not one sample fits
  int64_t accumulation_steps = 0;
  int64_t predicted_peak_bytes = 0;
  double predicted_seconds_per_window = 0;
};
struct CheckpointChoiceRecord {
  std::vector<CheckpointOption> options;   // in the order considered; the first is "none"
  std::string chosen;                      // the rule of the option the plan trains with
  std::string decided_by;                  // the rule that chose it, in words
};

// 1.13: one rank's window in a plan whose ranks differ (accumplan/ranks.h): its share of each
// global window, split into its own microbatches under its own budget.
struct RankWindow {
  int64_t budget_bytes = 0;               // this rank's memory budget
  int64_t per_rank_batch = 0;             // its share of the target batch
  int64_t max_micro_batch = 0;            // the largest microbatch that fits its budget
  std::vector<int64_t> microbatch_sizes;  // its split of the share
  int64_t predicted_peak_bytes = 0;
  std::optional<double> window_seconds;   // its microbatches' predicted seconds, by its own step times
};

struct Plan {
  int64_t target_batch = 0;
  int64_t world_size = 1;
  int64_t per_rank_batch = 0;
  int64_t micro_batch = 0;                  // largest entry of microbatch_sizes
  int64_t accumulation_steps = 0;           // == microbatch_sizes.size()
  std::vector<int64_t> microbatch_sizes;    // one window, per rank
  std::vector<double> weights;              // n_i / per_rank_batch
  int64_t max_micro_batch = 0;              // largest microbatch allowed (memory and bounds)
  std::string split = "balanced";           // balanced | uniform
  std::optional<TokenBudget> tokens;        // 1.3: ragged data packed by tokens; absent for samples
  std::optional<int64_t> multiple_of;
  UniformSplit uniform;
  MemoryBreakdown memory;
  FitSummary fit;
  std::optional<Timing> timing;
  bool confirmed = false;                   // a real step at micro_batch ran within budget
  std::optional<int64_t> confirmed_peak_bytes;
  std::string reason;                       // one sentence: why this plan
  DeviceInfo device;
  ModelInfo model;
  Setup setup;
  std::string libtorch_version;
  Profile profile;                          // what the plan was solved from, confirmations included
  std::optional<EvalPlan> eval;             // 1.7: the evaluation batch (absent: not planned)
  std::optional<PlanCheckpoint> checkpoint; // 1.7: activation checkpointing (absent: none)
  std::optional<CheckpointChoiceRecord> checkpoint_choice;  // 1.8: what "auto" weighed (absent: not asked)
  std::optional<Sharding> sharding;         // 1.9: optimizer state sharded over the ranks (absent: not)
  // 1.13: each rank's window, rank 0 first, where the ranks differ; the window fields above are
  // then rank 0's. Empty: every rank runs the window above.
  std::vector<RankWindow> ranks;
};

// `accumplan run --stats` (planner/schemas/run_stats.schema.json): what a run did, one record per
// window. Written by the run driver through to_json, read by the report through
// run_record_from_json; no other code reads or writes the format. Fields absent from a file
// written by an older accumplan are nullopt (or 0) when read.
struct RunWindowRecord {
  int64_t window = 0;                          // 0-based
  int64_t samples = 0;
  int64_t valid_tokens = 0;
  std::optional<double> loss;                  // null when it was not finite
  std::optional<int64_t> peak_bytes;           // allocated, host data excluded; null without a probe peak
  std::optional<int64_t> reserved_peak_bytes;  // a caching allocator's reserved peak, where the probe has one
  int64_t oom_recoveries = 0;
  std::optional<int64_t> replans;              // the executor's re-plans in this window
  std::vector<int64_t> microbatch_sizes;
  bool stepped = true;
  std::optional<double> seconds;
  // 1.5, packed runs: the microbatches' forward + backward seconds as measured, and as the time
  // model in force when the window was cut predicted them (null: no model with seconds yet).
  std::optional<double> microbatch_seconds;
  std::optional<double> predicted_seconds;
  // 1.5, packed runs: the largest peak the plan's token memory model predicts for the
  // microbatches the window ran (null: the plan carries no token profile).
  std::optional<int64_t> predicted_peak_bytes;
};

// 1.5, packed runs: how well the time model packing follows (accumplan/step_time.h) predicted
// each microbatch it could predict: |predicted − measured| / measured.
struct RunTimeModel {
  std::string packing;             // "time" (cut where the model predicts least) or "fill"
  int64_t microbatches = 0;        // microbatches with a prediction
  double median_abs_error = 0;
  double p90_abs_error = 0;
  int64_t refits = 0;              // fits made from the run's own microbatches
  // The cost the next window would be cut by: the run's last fit (CPU), else the plan's.
  std::optional<TokenStepCost> final_cost;
};

struct RunCollectives {
  int64_t counter_all_reduces = 0;
  int64_t gradient_exchanges = 0;
  int64_t tensor_all_reduces = 0;
  int64_t parameter_broadcasts = 0;  // 1.9: a sharded plan's steps (one broadcast from the owners each)
};

// What a run counted: the executor keeps these (ExecutorTotals), a run's stats record them.
struct RunCounts {
  int64_t windows = 0;
  int64_t optimizer_steps = 0;
  int64_t skipped_steps = 0;
  int64_t samples_seen = 0;
  int64_t tokens_seen = 0;
  int64_t oom_recoveries = 0;
};

// 1.7: one evaluation of `accumplan run --eval-data` (after every --eval-every windows, else after
// the last): the eval set in the plan's eval microbatches, forward only.
struct RunEvalRecord {
  int64_t after_window = 0;                    // 0-based: it ran after this window
  int64_t samples = 0;
  int64_t units = 0;                           // samples, or valid tokens in tokens mode
  std::optional<double> loss;                  // the mean over the units; null when not finite
  std::vector<int64_t> microbatch_sizes;       // as run, a re-split after an OOM included
  int64_t oom_recoveries = 0;
  std::optional<int64_t> peak_bytes;           // with the training state resident, host data excluded
  double seconds = 0;
};

struct RunRecord : RunCounts {
  std::vector<int64_t> microbatch_sizes;               // the plan the run ended on
  std::optional<int64_t> micro_batch;                  // the largest of them
  int64_t accumulation_steps = 0;
  int64_t per_rank_batch = 0;
  int64_t world_size = 1;
  int64_t rank = 0;
  std::string backend = "none";
  std::string striding = "none";  // how each window's samples were split over the ranks
  RunCollectives collectives;
  bool replicas_identical = true;
  std::string normalization;
  std::string amp;
  std::optional<int64_t> measured_peak_bytes;          // allocated, host data excluded
  std::optional<int64_t> measured_reserved_peak_bytes; // CUDA: the caching allocator's, reported; absent elsewhere
  int64_t predicted_peak_bytes = 0;                    // the plan the run started from
  std::optional<int64_t> final_predicted_peak_bytes;   // the plan it ended on
  std::optional<int64_t> budget_bytes;                 // enforced during the run, if any
  int64_t host_data_bytes = 0;
  std::string probe;
  std::optional<double> mean_window_seconds;
  std::optional<double> final_loss;                    // null when not finite
  double loss_scale = 1;
  std::string model_sha256;
  bool model_hash_matches_plan = true;
  std::optional<RunTimeModel> time_model;              // 1.5, packed runs
  // 1.5, packed runs: the largest of the windows' predicted_peak_bytes: the plan's prediction of
  // what this run packed, to hold measured_peak_bytes against.
  std::optional<int64_t> packed_predicted_peak_bytes;
  std::vector<RunWindowRecord> window_series;
  std::vector<RunEvalRecord> evaluations;              // 1.7, --eval-data
};

// JSON conversion. Readers take the document's root and report paths from `$`.
// Writers return ordered JSON: keys appear in the order users read them (the answer first).
nlohmann::ordered_json to_json(const Profile& p);
nlohmann::ordered_json to_json(const Plan& p);
Profile profile_from_json(const nlohmann::json& j);
Plan plan_from_json(const nlohmann::json& j);
nlohmann::ordered_json to_json(const RunRecord& r);
// SchemaError naming the field; a file with no schema_version (written before 1.4) is read too.
RunRecord run_record_from_json(const nlohmann::json& j);

// A plan's cross-field rules (sizes >= 1 summing to per_rank_batch, one weight n_i / per_rank_batch
// per microbatch, accumulation_steps, per_rank_batch · world_size = target_batch, the uniform
// split): SchemaError naming the `$.` field. plan_from_json checks every plan it reads with it,
// and the executor every plan it is given, so a plan made in code obeys the same rules.
void check_plan_window(const Plan& p);

// Read and parse a file; InputError if it is missing or not JSON, SchemaError if it does not
// match. `what` names the file's role in messages ("--profile"). A plan file gives its profile
// (what the plan's device measured, its confirming windows included).
Profile read_profile_file(const std::string& path, const std::string& what = "profile");
Plan read_plan_file(const std::string& path, const std::string& what = "plan");
// The plan in JSON `text` as read_plan_file reads a file's: `where` prefixes every message
// ("--plan 'p.json'"); `stated_version`, when given, gets the schema_version the text states
// ("" when none). The Python package's reader (python/core) is this function.
Plan plan_from_text(const std::string& text, const std::string& where, std::string* stated_version = nullptr);

}  // namespace accumplan
