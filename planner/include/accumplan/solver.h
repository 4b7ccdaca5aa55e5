// accumplan/solver.h — from a profile and a target batch to a plan.
//
// What it is: the arithmetic of docs/architecture.md "What the planner solves". T = B / W samples per rank
// per update; m_max = the largest microbatch whose predicted peak plus the margin (`--headroom`,
// see Margin in schema.h) fits the budget — or, when larger, the largest size a real window of
// the profile ran within the budget less the margin's run-to-run part — bounded by T,
// --max-micro-batch, --multiple-of and any size that ran out of memory; k = ceil(T / m_max); T
// split into k sizes that differ by at most one unit (`balanced`, 256 with m_max 60 →
// 52,51,51,51,51) or into equal sizes that divide T (`uniform`); weights n_i / T. With use_timing
// and measured step times, a larger k may be chosen if it is predicted at least 10% faster, and
// `reason` says so (off by default: timings of a few probe steps are noisy, and the plan should be
// the same from run to run).
// What it is not: a measurement. A plan is `confirmed` only when a real window of the profile
// covers its window (see Trial::window); the profiler runs those windows.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "accumplan/schema.h"
#include "accumplan/terms.h"
#include "accumplan/units.h"

namespace accumplan {

// Timing alone moves a plan off its default (memory's fewest microbatches, the fewest checkpointed
// blocks) only when predicted at least this much faster per window: --use-timing's larger
// accumulation count, and activation checkpointing's choice (accumplan/checkpoint.h).
// Step times come from a handful of probe steps and are noisy: with 5% and one timed step per
// size, the same command on builtin:mlp (1 ms steps, 2 busy cores) planned 3 x 22 in one run and
// 8 x 8 in the next, and even the faster of two timed steps put tinylm's b=8 at 72 ms against
// 23 ms at b=4 with another process on the machine (a "36% faster" 10 x 4 where 5 x 8 fit). On
// resnet18 (CPU), 4 of 12 plannings in a row predicted checkpointing every stage 1-2% faster than
// none; measured beside it, it was 12-14% slower. That is why timing is opt-in for the split and
// memory alone decides by default.
constexpr double kTimingGainFraction = 0.10;

// `--headroom`: auto (the default, from measurement), a fraction of the batch-dependent
// activations ("0.05"), or a size ("256MiB"); "0" keeps nothing free.
struct HeadroomSpec {
  enum class Kind { Auto, Fraction, Bytes };
  Kind kind = Kind::Auto;
  double fraction = 0;  // Kind::Fraction, in [0, 1]
  int64_t bytes = 0;    // Kind::Bytes, >= 0
  std::string text() const;  // "auto", "0.05", "256 MiB"
};
// The one parser of --headroom. Throws InputError naming `option`, the value and the forms.
HeadroomSpec parse_headroom(const std::string& text, const std::string& option = option_name("--headroom"));

// The headroom a plan's margin was made with, to solve again as the plan did (a re-plan after an
// OOM): auto, the fraction, or the fixed bytes (what a 1.0/1.1 plan's fraction of its budget was).
HeadroomSpec headroom_of(const Margin& margin);

// How a window's samples are split into microbatches (--split, a plan's $.split).
inline const std::vector<std::string> kSplitKinds = {"balanced", "uniform"};

// No window holds more microbatches than this (2^20); make_plan refuses a request that needs more.
inline constexpr int64_t kMaxAccumulationSteps = int64_t{1} << 20;
// --target-tokens at most 2^50 valid tokens per update (2^40 samples of up to 2^10 tokens).
inline constexpr int64_t kMaxTargetTokens = int64_t{1} << 50;

// The default margin's activation part: this fraction of the batch-dependent activations (a1·b).
// 2%: about one sample in fifty, so a planned microbatch of 48 keeps one sample's bytes for what
// a straight line does not see (growth that bends beyond the probes); dropped once a real
// window at the size has run.
inline constexpr double kAutoActivationFraction = 0.02;

struct PlanRequest {
  int64_t target_batch = 0;
  int64_t world_size = 1;
  BudgetSpec budget;                      // unset: the profile device's total bytes
  HeadroomSpec headroom;                  // the margin kept free below the budget
  std::optional<int64_t> multiple_of;     // every microbatch a multiple of this
  std::optional<int64_t> max_micro_batch; // the largest microbatch allowed
  // What set max_micro_batch, as the plan's reason says it ("a window of 709 that did not fit the
  // budget"); empty: the user (--max-micro-batch).
  std::string max_micro_batch_set_by;
  std::string split = "balanced";         // balanced | uniform
  bool use_timing = false;                // opt-in: may pick a larger k when predicted >= 10% faster
  // Variable-length data, --target-tokens: valid tokens per update over all ranks, instead of
  // target_batch (which must then be 0). make_token_plan sets the plan's target_batch to the
  // window at the longest length (TokenBudget::target_tokens).
  std::optional<int64_t> target_tokens;
};

// Splits `total` samples into `parts` sizes that differ by at most `unit`, larger ones first, all
// multiples of `unit` (which must divide `total`). balanced_split(256, 5) = 52,51,51,51,51.
std::vector<int64_t> balanced_split(int64_t total, int64_t parts, int64_t unit = 1);

// Largest d <= limit with d % unit == 0 and total % d == 0; 0 if none.
int64_t largest_divisor_at_most(int64_t total, int64_t limit, int64_t unit = 1);

// Microbatch sizes for `total` samples with microbatches of at most `max_micro_batch`: the fewest
// microbatches, balanced or uniform. Used for the plan's window and for a short last window.
std::vector<int64_t> split_samples(int64_t total, int64_t max_micro_batch, const std::string& split,
                                   int64_t unit = 1);

// The one rule that sets a plan's window from its sizes: microbatch_sizes, micro_batch (the
// largest), accumulation_steps, weights n_i / per_rank_batch, max_micro_batch and the uniform
// alternative (the largest divisor of per_rank_batch up to max_micro_batch, a multiple of `unit`
// when one divides). plan.per_rank_batch must be set and the sizes must sum to it. make_plan, a
// re-plan after an OOM and the profiler's measurement windows all use it.
void set_window(Plan& plan, std::vector<int64_t> sizes, int64_t max_micro_batch, int64_t unit = 1);

// The plan of one measurement window of these microbatch sizes (a per-rank batch of their sum):
// what the profilers (C++ and Python) run a window of the one window loop under.
Plan plan_for_window(const std::vector<int64_t>& sizes);

// A window's first two microbatches (its one, when it has one): later ones are no larger, so a
// real window of these sizes covers the whole window's microbatches.
std::vector<int64_t> window_head(const std::vector<int64_t>& sizes);

// The parts of a margin a size a real window ran at still keeps free: the run-to-run parts (the
// allocator's fragmentation, a --headroom size, a --headroom fraction of the activations slope·b).
// The fit's residual and auto's activation fraction are prediction and drop. The one rule for
// make_plan's evidence, its climb, and the profiler's confirmation windows.
struct KeptMargin {
  int64_t constant_bytes = 0;      // fragmentation + a --headroom size
  double activation_fraction = 0;  // a --headroom fraction; 0 with auto
  int64_t bytes_at(double slope_bytes_per_sample, int64_t micro_batch) const;  // rounded up
};
KeptMargin kept_margin(const Margin& margin);

// A plan for two or more ranks predicts what each rank holds, the gradient exchange's buffers
// included: InputError unless the profile's windows made the exchange (or request.world_size < 2).
void check_exchange(const Profile& profile, const PlanRequest& request);

// The request's own checks (ranges, B divisible by W and by W·multiple_of), without a profile:
// callers that measure first run it before spending the measurement. Throws like make_plan.
void check_request(const PlanRequest& request);

// Throws InputError/InfeasibleError with a message that names the bad value and the fix.
// A profile of variable-length data (points with seq_len) is planned by make_token_plan.
Plan make_plan(const Profile& profile, const PlanRequest& request);

// Variable-length data (schema 1.3): the largest token budget B (padded tokens per microbatch)
// whose worst microbatch — B tokens in sequences of the longest planned length T_max, the peak
// c0 + B·(a1 + a2·T_max) of the (b, T) fit (accumplan/token_model.h) — plus the margin fits the
// budget; bounded by the per-rank window padded to T_max and below any window at T_max that
// failed. The plan carries `tokens` (B, T_max, the longest sequence that fits alone); its sample
// fields are the padded plan's (microbatches of B / T_max sequences), what a trainer that does
// not pack would run. The margin's parts are those of a sample plan, on activations B·(a1 +
// a2·T_max). Confirmed when a window at T_max of at least B / T_max sequences ran within budget.
Plan make_token_plan(const Profile& profile, const PlanRequest& request);
bool is_token_profile(const Profile& profile);  // any point has a seq_len

// The next size worth a real window when climbing from `plan` (made by make_plan from the same
// profile and request): the largest microbatch the fit predicts within the budget less only the
// margin's run-to-run part, below any size that failed and within T and the request's bounds;
// 0 when that is no larger than the plan's largest measured size (nothing to climb to).
int64_t climb_candidate(const Profile& profile, const PlanRequest& request, const Plan& plan);

// The whole per-rank batch as one microbatch, worth one real window when the plan accumulates:
// returns per_rank_batch when the plan has k > 1, no window of the profile ran or failed at [T]
// (or at T or more), the request's bounds allow T, and the first-microbatch line predicts [T]
// within the budget less the margin — at ANY distance from the probes (make_plan trusts that line
// only up to twice the largest probe; one real window settles it). 0 otherwise. vgg11 at 1383 MiB
// (986 MiB persistent, target 24): windows [4, 4] peaked at 1382 MiB, a window [24] at 1009 MiB,
// because no gradient is resident while the only microbatch runs.
int64_t whole_batch_candidate(const Profile& profile, const PlanRequest& request, const Plan& plan);

// The margin's parts in one line, e.g. "fit residual 12.0 KiB + 2% of activations 96.0 KiB".
std::string describe_margin(const Margin& margin);

// Human summary for stderr: breakdown, chosen split, predicted peak against budget.
std::string describe_plan(const Plan& plan);

}  // namespace accumplan
