// bench/peer_strategies.cpp — see peer_strategies.h for what each search does and where from.
#include "peer_strategies.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace accumplan::bench {
namespace {

// Wraps the oracle to count trials, steps and OOMs the same way for every strategy.
class Counter {
 public:
  Counter(const Oracle& oracle, std::string name) : oracle_(oracle), start_(std::chrono::steady_clock::now()) {
    result_.strategy = std::move(name);
  }
  StepOutcome operator()(int64_t b, int steps) {
    ++result_.trials;
    result_.steps += steps;
    result_.tried.push_back(b);
    const StepOutcome o = oracle_(b, steps);
    if (!o.fit) ++result_.ooms;
    return o;
  }
  SearchResult finish(int64_t found) {
    result_.micro_batch = found;
    result_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    return result_;
  }

 private:
  const Oracle& oracle_;
  std::chrono::steady_clock::time_point start_;
  SearchResult result_;
};

}  // namespace

SearchResult lightning_power(const Oracle& oracle, int64_t max_size, int64_t init, int steps_per_trial,
                             int max_trials) {
  Counter run(oracle, "lightning-power");
  int64_t size = std::min(init, max_size);
  for (int trial = 0; trial < max_trials; ++trial) {
    if (run(size, steps_per_trial).fit) {
      const int64_t next = std::min(size * 2, max_size);  // Lightning caps at the dataset length
      if (next == size) break;
      size = next;
    } else {
      size = size / 2;  // "failed": factor 0.5, then stop
      break;
    }
  }
  // Like Lightning, the answer is the last new_size: after max_trials successes that is a doubled
  // size that never ran (a quirk the harness reports as it is).
  return run.finish(size);
}

SearchResult lightning_binsearch(const Oracle& oracle, int64_t max_size, int64_t init, int steps_per_trial,
                                 int max_trials) {
  Counter run(oracle, "lightning-binsearch");
  int64_t low = 1, high = 0, size = std::min(init, max_size), last_fit = 0;
  int count = 0;
  while (true) {
    if (run(size, steps_per_trial).fit) {
      last_fit = size;
      if (++count > max_trials) break;
      low = size;
      if (high) {
        if (high - low <= 1) break;
        size = (high + low) / 2;
      } else {
        const int64_t next = std::min(size * 2, max_size);
        if (next == size) break;
        size = next;
      }
    } else {
      high = size;
      size = (high + low) / 2;
      if (high - low <= 1) break;
    }
  }
  // Lightning returns new_size; after a final failure that is the midpoint, which already ran
  // (it equals low) — report the largest size that ran without OOM.
  return run.finish(last_fit);
}

SearchResult accelerate_find_executable(const Oracle& oracle, int64_t start, bool legacy_halving) {
  Counter run(oracle, legacy_halving ? "accelerate-halving" : "accelerate-0.9");
  int64_t size = start;
  while (size > 0) {
    if (run(size, 1).fit) return run.finish(size);
    size = legacy_halving ? size / 2 : static_cast<int64_t>(static_cast<double>(size) * 0.9);
  }
  return run.finish(0);
}

SearchResult composer_auto_microbatch(const Oracle& oracle, int64_t per_rank_batch) {
  Counter run(oracle, "composer-halving");
  int64_t size = per_rank_batch;
  while (size > 0) {
    if (run(size, 1).fit) return run.finish(size);
    size /= 2;
  }
  return run.finish(0);
}

SearchResult deepspeed_autotune(const Oracle& oracle, int64_t budget_bytes, int64_t model_state_bytes,
                                int64_t max_size) {
  Counter run(oracle, "deepspeed-autotune");
  const StepOutcome one = run(1, 1);
  if (!one.fit) return run.finish(0);
  // Activation memory per sample as DeepSpeed estimates it: the mbs=1 peak less model states.
  const double act = std::max<double>(1.0, static_cast<double>(one.peak_bytes - model_state_bytes));
  const int64_t predicted = std::max<int64_t>(
      1, std::min<int64_t>(max_size, static_cast<int64_t>((budget_bytes - model_state_bytes) / act)));
  int64_t best = 1, smallest_fail = 0;
  for (double f : {1.05, 1.0, 0.95}) {
    const int64_t b = std::min<int64_t>(max_size, std::max<int64_t>(1, static_cast<int64_t>(predicted * f)));
    if (b <= best || (smallest_fail && b >= smallest_fail)) continue;
    if (run(b, 1).fit) {
      best = b;
      break;
    }
    smallest_fail = b;
  }
  if (smallest_fail && best < smallest_fail - 1 && best == 1) {
    int64_t lo = best, hi = smallest_fail;  // lo fits, hi fails
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (run(mid, 1).fit) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    best = lo;
  }
  return run.finish(best);
}

}  // namespace accumplan::bench
