// terms.cpp — the front end's names for options. See terms.h.
#include "accumplan/terms.h"

#include <atomic>
#include <map>

namespace accumplan {
namespace {

std::atomic<FrontEnd> g_front_end{FrontEnd::Cli};

// Each command-line option a Python caller can meet in a message, by its Python argument of
// accumplan.plan (or of the Plan method that takes it), or the words that stand for it.
const std::map<std::string, std::string>& python_names() {
  static const std::map<std::string, std::string> names = {
      {"--target-batch", "target_batch"},   {"--target-tokens", "target_tokens"},
      {"--world-size", "world_size"},       {"--shard", "shard"},       {"--memory-budget", "memory_budget"},
      {"--headroom", "headroom"},           {"--optimizer", "optimizer"},
      {"--normalization", "normalization"}, {"--loss", "loss"},
      {"--amp", "amp"},                     {"--max-grad-norm", "max_grad_norm"},
      {"--ignore-index", "ignore_index"},   {"--device", "device"},
      {"--lr", "the optimizer's lr"},       {"--multiple-of", "multiple_of"},
      {"--plan", "the plan"},               {"--seq-len", "max_seq_len"},
      {"--max-micro-batch", "max_micro_batch"},
  };
  return names;
}

}  // namespace

void set_front_end(FrontEnd front_end) { g_front_end.store(front_end); }

FrontEnd front_end() { return g_front_end.load(); }

std::string option_name(const std::string& cli_option) {
  if (front_end() == FrontEnd::Cli) return cli_option;
  const auto it = python_names().find(cli_option);
  return it == python_names().end() ? cli_option : it->second;
}

std::string plan_command(const std::vector<std::string>& cli_options) {
  std::string text;
  if (front_end() == FrontEnd::Cli) {
    for (const std::string& o : cli_options) text += " " + o;
    return "`accumplan plan" + text + "`";
  }
  for (const std::string& o : cli_options) text += ", " + option_name(o) + "=...";
  return "accumplan.plan(..." + text + ")";
}

}  // namespace accumplan
