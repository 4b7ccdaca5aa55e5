// accumplan/token_model.h — the memory of a microbatch of b sequences padded to T tokens, and the
// packing of a window's sequences under it (variable-length sequences: the planner side).
//
// What it is: `TokenMemoryModel`. A window's peak is the highest of the live bytes over its
// moments, each c + b·T·(α + β·T) (saved activations per token, attention scores per token per T):
// linear in b at one length, and at one token count b·T convex in T, with a knee where another
// moment becomes the highest (a decoder's end of forward below T ≈ 450, a backward moment that
// holds more T² copies above it). So the peak is predicted from the measured lengths
// ("columns"): at each, the line c_T + b·s_T through its windows around b; between two neighbours, the
// per-token cost s_T / T interpolated linearly in T (exact within one moment's range, above the
// peak across a knee: a chord of a convex function); the prediction is the highest of those
// segments, each extended over every length, so a segment of one moment is exact across the
// other's columns. Where fewer than two lengths hold two window sizes, the weighted least-squares
// fit of peak(b, T) = c0 + a1·b·T + a2·b·T² (always computed: its residuals size the plan's
// margin; a2 kept only when positive and it halves the line's largest residual). From the
// model: the largest number of sequences of length T that fit a usable budget, the longest
// sequence that fits alone, the token budget (padded tokens per microbatch) that fits at the
// longest allowed length, the length between two columns where the prediction is least certain
// (where the search measures next), and `pack_by_token_budget`, which packs a window's sequences
// (longest first, each microbatch padded to its own longest) under that budget at the least
// measured cost (`TokenStepCost`: microbatches against padded tokens, fitted in
// accumplan/step_time.h), and `token_windows`, which cuts data into windows of a number of valid
// tokens (--target-tokens).
// What it is not: a guarantee: like the sample model it is a prediction that a real window
// confirms (the profiler, src/profiling/probe_runner.h). Nor torch-aware: the executor and the
// Python reader call these with nothing but lengths, a budget and the plan's step cost.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "accumplan/schema.h"

namespace accumplan {

// One measured window: `micro_batch` sequences, each padded to `seq_len` tokens.
struct TokenPoint {
  int64_t micro_batch = 0;
  int64_t seq_len = 0;
  int64_t peak_bytes = 0;
};

// A line in b at one length: peak = intercept + b·bytes_per_sequence.
struct TokenLine {
  double intercept_bytes = 0;
  double bytes_per_sequence = 0;
};

// One measured length: its windows' peaks by the number of sequences, joined by lines (the peak
// is convex in b too: a moment with a higher constant sets it for a few sequences, another for
// many). A length measured at one size only borrows the intercept of the nearest other.
struct TokenColumn {
  int64_t seq_len = 0;
  std::vector<std::pair<double, double>> peaks;  // (b, bytes), b ascending; one entry when borrowed
  double borrowed_intercept_bytes = 0;           // with one entry only
  // The line through the two measured sizes around b (the first or last two beyond them).
  TokenLine line_at(double micro_batch) const;
};

struct TokenFit {
  double intercept_bytes = 0;           // c0: persistent + the batch-independent activations
  double bytes_per_token = 0;           // a1
  double bytes_per_token_squared = 0;   // a2 (per sequence, per T²); 0 when the line suffices
  bool quadratic = false;               // whether a2 was kept
  std::vector<double> residuals_bytes;  // measured − predicted, per point, in input order
  double max_abs_residual_bytes = 0;
  double rms_residual_bytes = 0;
  double line_max_abs_residual_bytes = 0;  // the line's (a2 = 0) largest residual, for comparison
};

class TokenMemoryModel {
 public:
  // Throws InputError for fewer than two distinct b·T token counts, a point with b < 1 or T < 1,
  // or a per-token cost that is not positive (peaks that do not grow with the tokens).
  static TokenMemoryModel fit(const std::vector<TokenPoint>& points);
  // The fit over a profile's (b, T) points (those with a seq_len; peak_bytes), as the planner,
  // the profiler and a re-pack after an OOM all take it.
  static TokenMemoryModel fit(const Profile& profile);

  const TokenFit& summary() const { return fit_; }
  // The measured lengths the prediction interpolates, shortest first; empty when fewer than two
  // (then the prediction is the least-squares fit). A length measured at one window size only
  // (the short column) takes the intercept of the nearest length measured at two.
  const std::vector<TokenColumn>& columns() const { return columns_; }
  double predict_bytes(int64_t micro_batch, int64_t seq_len) const;
  int64_t predict_peak_bytes(int64_t micro_batch, int64_t seq_len) const;  // rounded up

  // The largest b in [0, limit] with predict_peak_bytes(b, seq_len) <= usable_bytes (0: not even
  // one sequence). Closed form, settled against the integer predictor in a bounded number of steps.
  int64_t largest_micro_batch(int64_t seq_len, int64_t usable_bytes, int64_t limit = kMaxSequences) const;
  // The longest T in [0, limit] with predict_peak_bytes(1, T) <= usable_bytes.
  int64_t longest_sequence(int64_t usable_bytes, int64_t limit = kMaxSeqLen) const;
  // The largest token budget B (padded tokens per microbatch) such that every microbatch of b
  // sequences padded to T <= max_seq_len with b·T <= B is predicted to fit usable_bytes: the
  // bound at max_seq_len (b need not be whole there), lowered while a shorter length's whole
  // sequences peak higher (worst_packed_peak_bytes: a per-sequence cost makes short sequences
  // cost more per token). 0 when not even one max_seq_len sequence fits.
  int64_t token_budget(int64_t usable_bytes, int64_t max_seq_len) const;
  // The highest peak any microbatch packed under `token_budget` can reach with sequences of at most
  // max_seq_len tokens: b = floor(budget / L) sequences padded to L, over every L <= max_seq_len
  // (whole sequences: 4404 tokens at L = 1024 hold 4, i.e. 4096 tokens, not 4404). Enumerates the
  // O(sqrt(budget)) distinct values of floor(budget / L), at the largest L of each.
  int64_t worst_packed_peak_bytes(int64_t token_budget, int64_t max_seq_len) const;
  // The peak of one packed microbatch of b sequences padded to T as a run meets it. The fit is of
  // steady microbatches (the gradient resident, the optimizer's state allocated): a window's first
  // microbatch runs with no gradient (it is set to none), and before the run's first optimizer
  // step the optimizer's state does not exist yet (LibTorch makes it in step()). On the token
  // benchmark's decoder those are 1.2 MB and 2.4 MB of a 78 MB peak. The first microbatch's peak
  // is predicted from the profile's first microbatches where every window recorded one (its
  // gradients appear during its backward: how many are resident at the peak depends on the
  // moment), else as the steady peak less the gradients; the state's bytes are the profile's
  // persistent ones (fit(Profile)); a fit from bare points knows neither and leaves them in.
  int64_t predict_microbatch_peak_bytes(int64_t micro_batch, int64_t seq_len, bool first_in_window,
                                        bool optimizer_state_exists) const;

  // The length midway (geometrically) between two neighbouring columns where the prediction for `tokens` padded
  // tokens of it is least certain, when the gap there between the chord and the longest-reaching
  // neighbouring segments (a lower bound, the peak being convex in T) exceeds `fraction` of the
  // prediction; nullopt when every interval is that certain or too narrow to split.
  std::optional<int64_t> least_certain_length(int64_t tokens, double fraction) const;

  static constexpr int64_t kMaxSequences = int64_t{1} << 40;  // as MemoryModel::kMaxMicroBatch
  static constexpr int64_t kMaxSeqLen = int64_t{1} << 31;     // a tensor spec's dimension bound

 private:
  // Segment i's prediction (columns i, i + 1) at (b, T), extended past its two lengths.
  double segment_bytes(size_t i, double b, double t) const;
  void fit_columns(const std::vector<TokenPoint>& points);

  TokenFit fit_;
  std::vector<TokenColumn> columns_;
  double floor_bytes_ = 0;  // a window that peaked with no activations: no prediction is lower
  std::shared_ptr<const TokenMemoryModel> first_microbatch_;  // the windows' first microbatches, measured
  int64_t gradients_bytes_ = 0;        // the profile's persistent gradients
  int64_t optimizer_state_bytes_ = 0;  // and optimizer state
};

// What a packed window is predicted to peak at, as `accumplan run` and Python's train_window report
// it beside the measured peak: the highest of its microbatches' (predict_microbatch_peak_bytes) and
// of the optimizer step the profile measured at any (b, T) (a window of a few short sequences peaks
// in the step: AdamW's update temporaries). Built once per plan from its profile; a plan made in
// code may carry no token profile, and then nothing is predicted.
class PackedPeakPredictor {
 public:
  explicit PackedPeakPredictor(const Profile& profile);
  bool predicts() const { return model_.has_value(); }
  // One microbatch of b sequences padded to T (nullopt: no model).
  std::optional<int64_t> microbatch_peak_bytes(int64_t micro_batch, int64_t seq_len, bool first_in_window,
                                               bool optimizer_state_exists) const;
  // The window's: the highest of its microbatches' (as microbatch_peak_bytes gave them) and the
  // optimizer step's; nullopt when its microbatches had none.
  std::optional<int64_t> window_peak_bytes(std::optional<int64_t> microbatches_peak_bytes) const;
  // The same for a whole window of (b, T) microbatches in order (the first has no gradient).
  std::optional<int64_t> window_peak_bytes(const std::vector<std::pair<int64_t, int64_t>>& microbatches,
                                           bool optimizer_state_exists) const;

 private:
  std::optional<TokenMemoryModel> model_;
  std::optional<int64_t> optimizer_step_peak_bytes_;  // the profile's (token points), the highest
};

// The integer unit of TokenStepCost: one padded token costs this much (2^16, so a per-token cost
// 1/2^16 of a token's is still told from zero).
inline constexpr int64_t kStepCostPerToken = int64_t{1} << 16;

// Packs sequences of `lengths` (tokens, each >= 1) into microbatches under a token budget: indices
// sorted by length, longest first (ties in index order), cut into consecutive runs of that order,
// each padded to its first (longest) member L and holding at most floor(token_budget / L)
// sequences, so no microbatch holds more than token_budget padded tokens. Of all such cuts, the
// one of least total `cost` (a dynamic programme over the sorted order, from its end; exact
// integer arithmetic, ties to the larger first microbatch). Without a cost: the fewest
// microbatches, which the ties make exactly the greedy fill (each microbatch as full as the budget
// allows). Runs of the sorted order lose nothing: moving a longer sequence into the microbatch
// padded longer keeps that one's length and never lengthens the other's. O(n · budget /
// shortest length) steps: 32
// sequences take about a thousand. Model-free on purpose: the executor, its out-of-memory re-pack
// and the Python reader all follow this one rule with nothing but the budget and the plan's cost.
// Returns indices into `lengths`; every index appears once. Throws InfeasibleError naming the
// longest sequence when it is longer than the budget.
std::vector<std::vector<int64_t>> pack_by_token_budget(const std::vector<int64_t>& lengths, int64_t token_budget,
                                                       const std::optional<TokenStepCost>& cost = std::nullopt);

// The windows of a --target-tokens plan (plan.tokens.target_tokens): [start, count) pairs that
// cut the sequences, in order, into consecutive windows; a window closes at the first sequence
// that brings its valid tokens to at least `target_tokens`, and the last window holds what is left
// (it may be short). `valid_tokens` holds each sequence's valid tokens (targets that are not
// ignore_index), each >= 0. So every full window holds N <= tokens < N + one sequence's, and no
// sequence is lost or repeated. [5,5,5,5,5] at 10: (0,2) (2,2) (4,1). Empty input: no windows.
// The Python package's token_windows is this function (python/core); tests/python/
// token_windows_cases.json holds cases both sides check. Throws InputError for target_tokens < 1 or a negative count.
std::vector<std::pair<int64_t, int64_t>> token_windows(const std::vector<int64_t>& valid_tokens, int64_t target_tokens);

}  // namespace accumplan
