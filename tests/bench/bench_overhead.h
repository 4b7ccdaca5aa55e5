// bench/bench_overhead.h — the executor's cost over a hand-written accumulation loop.
//
// What it is: two identical copies of a model (loaded twice from the same file), each with its own
// SGD optimizer, fed the same windows: A runs Executor::step, B a plain LibTorch loop doing the
// same work (zero grads, forward, cross-entropy mean × n_i/N, backward per microbatch, one step).
// Windows alternate A, B, B, A, ... so drift of the machine (thermal, other load) hits both
// equally; the result is the median of per-pair ratios with its min and max.
// What it is not: a microbenchmark of LibTorch; both sides spend nearly all their time in it.
#pragma once

#include <nlohmann/json.hpp>

namespace accumplan::bench {

// `model` is one entry of examples/models/manifest.json. Returns JSON with the per-window seconds
// of both sides and the ratio executor / hand loop (median, min, max).
nlohmann::ordered_json executor_overhead(const nlohmann::json& model, int rounds);

}  // namespace accumplan::bench
