// tests/executor/mlp_plan_fixture.h — the plan of builtin:mlp for 256 samples under 1200KiB,
// made once per test process through the real binary, shared by the `run` cases of
// test_cli_executor.cpp and test_cli_trace.cpp (profiling costs about a second).
#pragma once

#include <unistd.h>

#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_runner.h"

namespace accumplan::test {

inline constexpr const char* kMlpBudget = "1200KiB";  // builtin:mlp: ~1 MiB persistent + 3.3 KiB/sample
// 256, not 64: a window of ONE microbatch holds no resident gradient, and builtin:mlp's 64 fit
// whole under kMlpBudget that way (956,584 bytes); 256 needs accumulation.
inline constexpr int64_t kMlpTarget = 256;

struct MlpPlan {
  std::string dir;
  std::string plan;  // plan.json for builtin:mlp, target kMlpTarget, under kMlpBudget
  nlohmann::json plan_json;
};

// Made on first use.
inline const MlpPlan& mlp_plan() {
  static const MlpPlan f = [] {
    MlpPlan x;
    // Memory alone (the default, no --use-timing): these cases need the largest microbatch that
    // fits, not one that 1 ms step times on a busy machine happened to predict faster (a CI run
    // planned 12 microbatches of up to 6, leaving the OOM case below no smaller size to recover to).
    // One directory per process: ctest -j2 runs these cases as concurrent processes, and a shared
    // name let one case empty the directory while another read its plan.json.
    x.dir = scratch_dir("executor-cli-" + std::to_string(::getpid()));
    x.plan = x.dir + "/plan.json";
    const CliResult r = run_cli({"--model", "builtin:mlp", "--target-batch", std::to_string(kMlpTarget), "--device", "cpu",
                                 "--memory-budget", kMlpBudget, "--threads", "2", "--out", x.plan});
    if (r.exit_code != 0) throw std::runtime_error("accumplan --model builtin:mlp failed: " + r.err);
    x.plan_json = nlohmann::json::parse(slurp(x.plan));
    return x;
  }();
  return f;
}

}  // namespace accumplan::test
