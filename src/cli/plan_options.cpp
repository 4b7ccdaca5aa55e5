// cli/plan_options.cpp — the planning options, declared once. See plan_options.h.
#include "cli/plan_options.h"

#include <CLI/CLI.hpp>

#include "accumplan/errors.h"
#include "cli/choice.h"

namespace accumplan::cli {

void add_plan_options(CLI::App* app, PlanOptionArgs& a, const std::string& group) {
  CLI::Option* target = a.target_batch_option =
      app->add_option("--target-batch", a.target_batch, "effective batch B per optimizer step, over all ranks")
          ->group(group);
  a.target_tokens_option =
      app->add_option("--target-tokens", a.target_tokens,
                      "variable-length data, instead of --target-batch: valid tokens per optimizer step, over all "
                      "ranks; each window is the consecutive sequences that first reach this many")
          ->excludes(target)
          ->group(group);
  app->add_option("--headroom", a.headroom,
                  "memory kept free below the budget: auto (from what was measured: the fit's largest residual, "
                  "2% of the batch-dependent activations, and on CUDA the allocator's fragmentation; the first "
                  "two are dropped for a size a real window ran at), a fraction of the batch-dependent "
                  "activations (0.05), or a size (256MiB); 0 keeps nothing free")
      ->capture_default_str()
      ->group(group);
  app->add_option("--world-size", a.world_size, "data-parallel ranks W; B must be divisible by W")
      ->capture_default_str()
      ->group(group);
  a.multiple_of_option =
      app->add_option("--multiple-of", a.multiple_of, "make every microbatch a multiple of K")->group(group);
  a.max_micro_batch_option =
      app->add_option("--max-micro-batch", a.max_micro_batch, "never plan a microbatch above M")->group(group);
  choice(app->add_option("--split", a.split, "balanced: k sizes differing by at most one; uniform: equal sizes"))
      ->capture_default_str()
      ->group(group);
  app->add_flag("--use-timing", a.use_timing,
                "off by default: also weigh the measured step times, taking more, smaller microbatches when a "
                "balanced split is predicted at least 10% faster per window")
      ->group(group);
}

PlanRequest plan_request_from(const PlanOptionArgs& a) {
  PlanRequest req;
  const bool tokens = a.target_tokens_option && a.target_tokens_option->count() > 0;
  const bool batch = a.target_batch_option && a.target_batch_option->count() > 0;
  if (!tokens && !batch) {
    throw InputError("give --target-batch N (samples per optimizer step) or, for variable-length data, "
                     "--target-tokens N (valid tokens per optimizer step)");
  }
  req.target_batch = a.target_batch;
  if (tokens) req.target_tokens = a.target_tokens;  // the solver checks the range
  req.world_size = a.world_size;
  req.headroom = parse_headroom(a.headroom, "--headroom");
  // Given means given: the solver refuses K < 1 and M < 1 with their own messages.
  if (a.multiple_of_option && a.multiple_of_option->count() > 0) req.multiple_of = a.multiple_of;
  if (a.max_micro_batch_option && a.max_micro_batch_option->count() > 0) req.max_micro_batch = a.max_micro_batch;
  req.split = a.split;
  req.use_timing = a.use_timing;
  return req;
}

CLI::Option* add_memory_budget_option(CLI::App* app, std::string& text, const std::string& use,
                                      const std::string& note, const std::string& group) {
  CLI::Option* option = app->add_option("--memory-budget", text,
                                        use + ": 512MiB, 12GiB, 1.5GB, a byte count, or 90% of the device" +
                                            (note.empty() ? std::string() : "; " + note));
  return group.empty() ? option : option->group(group);  // CLI11 hides an option of group ""
}

BudgetSpec memory_budget_from(const std::string& text) {
  return text.empty() ? BudgetSpec{} : parse_budget(text, "--memory-budget");
}

}  // namespace accumplan::cli
