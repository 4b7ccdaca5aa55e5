// cli/plan_options.h — the planning options, declared once for every command that plans.
//
// What it is: `--target-batch` (or `--target-tokens`), `--headroom`, `--world-size`, `--multiple-of`,
// `--max-micro-batch`, `--split` and `--use-timing`, with their help text, for `accumplan plan`
// and the main job (`accumplan --model ... --target-batch ...`), and their conversion into a
// PlanRequest (solver.h), so the two commands cannot drift apart.
// Also `--memory-budget`, declared once for `plan`, the main job and `run`: one parser and one list
// of forms; each command says in `use` what it does with the budget (plans for it, enforces it).
// What it is not: any checking beyond parsing: the solver's check_request owns the ranges.
#pragma once

#include <cstdint>
#include <string>

#include "accumplan/solver.h"
#include "accumplan/units.h"

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

// Adds --memory-budget to `app` in `group` ("": the command's default group); its help is `use`, the forms it takes, then `note`.
CLI::Option* add_memory_budget_option(CLI::App* app, std::string& text, const std::string& use,
                                      const std::string& note, const std::string& group);

// The budget --memory-budget gave (unset when `text` is empty); InputError naming the option.
BudgetSpec memory_budget_from(const std::string& text);

}  // namespace accumplan::cli
