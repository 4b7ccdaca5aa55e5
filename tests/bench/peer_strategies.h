// bench/peer_strategies.h — the batch-size searches people use today, re-implemented from their
// documented behaviour so they can run against the same model, budget and OOM oracle as accumplan.
//
// What it is: torch-free search logic over an oracle that runs real training steps at a
// microbatch size and says whether they fit. Each search counts its trials, steps, OOMs and
// wall seconds. Sources of the behaviour (their public code and docs):
//   lightning_power      Tuner.scale_batch_size(mode="power"): init 2, double after each success,
//                        3 steps per trial, at most 25 trials; on OOM halve and stop.
//   lightning_binsearch  mode="binsearch": double until OOM, then binary search between the last
//                        success and the failure (stop when high - low <= 1).
//   accelerate           accelerate.utils.find_executable_batch_size: start 128 (the harness
//                        starts at the per-rank batch when that is smaller), on OOM
//                        batch = int(batch * 0.9) (since 0.20; `legacy_halving` is the old //= 2).
//   composer             auto microbatching: start at the per-rank batch, halve on OOM.
//   deepspeed            autotuning's micro-batch search: profile at 1, predict the maximum
//                        linearly from model-state and activation memory, try 1.05x, 1x, 0.95x the
//                        prediction (largest first), then bisect below the smallest failure.
// What it is not: those libraries. No Python runs here; the point is equal conditions.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace accumplan::bench {

struct StepOutcome {
  bool fit = false;          // all steps ran without OOM
  int64_t peak_bytes = 0;    // measured peak (0 if it ran out of memory)
};

// Runs `steps` real training steps at `micro_batch`.
using Oracle = std::function<StepOutcome(int64_t micro_batch, int steps)>;

struct SearchResult {
  std::string strategy;
  int64_t micro_batch = 0;          // what the search settled on (0: nothing fits)
  int64_t trials = 0;               // sizes tried
  int64_t steps = 0;                // real training steps taken
  int64_t ooms = 0;                 // trials that ran out of memory
  double seconds = 0;               // wall time of the whole search
  std::vector<int64_t> tried;       // sizes in the order tried
};

SearchResult lightning_power(const Oracle& oracle, int64_t max_size, int64_t init = 2, int steps_per_trial = 3,
                             int max_trials = 25);
SearchResult lightning_binsearch(const Oracle& oracle, int64_t max_size, int64_t init = 2,
                                 int steps_per_trial = 3, int max_trials = 25);
SearchResult accelerate_find_executable(const Oracle& oracle, int64_t start = 128, bool legacy_halving = false);
SearchResult composer_auto_microbatch(const Oracle& oracle, int64_t per_rank_batch);
// `budget_bytes` and `model_state_bytes` (weights + gradients + optimizer state) are what
// DeepSpeed's autotuner computes from the model and the ZeRO stage before it runs anything.
SearchResult deepspeed_autotune(const Oracle& oracle, int64_t budget_bytes, int64_t model_state_bytes,
                                int64_t max_size);

}  // namespace accumplan::bench
