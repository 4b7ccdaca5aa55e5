// cli/plan_options.h — the planning options, declared once for every command that plans.
//
// What it is: `--target-batch` (or `--target-tokens`), `--headroom`, `--world-size`, `--multiple-of`,
// `--max-micro-batch`, `--split` and `--use-timing`, with their help text, for `accumplan plan`
// and the main job (`accumplan --model ... --target-batch ...`), and their conversion into a
// PlanRequest (solver.h), so the two commands cannot drift apart.
// What it is not: the budget (`--memory-budget` is a measuring option on the device commands and
// a planning one on `plan`; each command declares it with its own meaning) or any checking beyond
// parsing: the solver's check_request owns the ranges.
#pragma once

#include <cstdint>
#include <string>

#include "accumplan/solver.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace accumplan::cli {

struct PlanOptionArgs {
  int64_t target_batch = 0;
  CLI::Option* target_batch_option = nullptr;
  int64_t target_tokens = 0;
  CLI::Option* target_tokens_option = nullptr;
  std::string headroom = "auto";
  int64_t world_size = 1;
  int64_t multiple_of = 0;
  CLI::Option* multiple_of_option = nullptr;
  int64_t max_micro_batch = 0;
  CLI::Option* max_micro_batch_option = nullptr;
  std::string split = "balanced";
  bool use_timing = false;
};

// Adds the options to `app` in `group`.
void add_plan_options(CLI::App* app, PlanOptionArgs& args, const std::string& group);

// The request the options describe (budget left unset: the caller's). Throws InputError for a bad
// --headroom, or when neither --target-batch nor --target-tokens was given.
PlanRequest plan_request_from(const PlanOptionArgs& args);

}  // namespace accumplan::cli
