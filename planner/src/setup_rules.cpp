// setup_rules.cpp — optimizer defaults and the normalization rule. See setup_rules.h.
#include "accumplan/setup_rules.h"

#include <algorithm>
#include <cstdio>

#include "accumplan/errors.h"
#include "accumplan/tensor_spec.h"

namespace accumplan {
namespace {

using Defaults = std::map<std::string, double>;

const std::map<std::string, Defaults>& defaults_by_optimizer() {
  // LibTorch's option defaults (torch/optim/*.h), except momentum's 0.9: "momentum" is SGD with
  // momentum, and 0 would make it sgd.
  static const std::map<std::string, Defaults> table = {
      {"sgd", {{"weight_decay", 0.0}, {"dampening", 0.0}}},
      {"momentum", {{"momentum", 0.9}, {"dampening", 0.0}, {"weight_decay", 0.0}}},
      {"adam", {{"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8}, {"weight_decay", 0.0}}},
      {"adamw", {{"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8}, {"weight_decay", 1e-2}}},
      {"adagrad", {{"lr_decay", 0.0}, {"eps", 1e-10}, {"weight_decay", 0.0}, {"initial_accumulator_value", 0.0}}},
      {"rmsprop", {{"alpha", 0.99}, {"eps", 1e-8}, {"weight_decay", 0.0}, {"momentum", 0.0}}},
  };
  return table;
}

// torch.optim's on/off options (the union over torch 1.13 and 2.x), in the order messages list them.
const std::map<std::string, std::vector<std::string>>& flags_by_optimizer() {
  static const std::vector<std::string> sgd = {"nesterov", "maximize", "foreach", "fused", "differentiable"};
  static const std::vector<std::string> adam = {"amsgrad", "maximize", "foreach", "fused", "capturable", "differentiable"};
  static const std::map<std::string, std::vector<std::string>> table = {
      {"sgd", sgd},
      {"momentum", sgd},
      {"adam", adam},
      {"adamw", adam},
      {"adagrad", {"maximize", "foreach", "fused", "differentiable"}},
      {"rmsprop", {"centered", "maximize", "foreach", "capturable", "differentiable"}},
  };
  return table;
}

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// The group's flags, each checked against those the optimizer takes.
void check_flags(const std::string& optimizer, const std::map<std::string, bool>& flags) {
  const std::vector<std::string>& takes = optimizer_flags(optimizer);
  for (const auto& [flag, on] : flags) {
    (void)on;
    if (std::find(takes.begin(), takes.end(), flag) == takes.end()) {
      throw InputError("optimizer " + optimizer + " has no flag '" + cut_for_message(flag) + "'; it takes: " +
                       joined(takes));
    }
  }
}

std::string flag_text(const std::string& flag, bool on) { return flag + (on ? "=true" : "=false"); }

}  // namespace

const std::vector<std::string>& optimizer_names() {
  static const std::vector<std::string> names = {"sgd", "momentum", "adam", "adamw", "adagrad", "rmsprop"};
  return names;
}

const std::map<std::string, double>& optimizer_defaults(const std::string& optimizer) {
  const auto it = defaults_by_optimizer().find(optimizer);
  if (it == defaults_by_optimizer().end()) {
    throw InputError("--optimizer '" + cut_for_message(optimizer) + "' is unknown; choose one of: " +
                     joined(optimizer_names()));
  }
  return it->second;
}

std::map<std::string, double> optimizer_hyperparameters(const Setup& setup) {
  std::map<std::string, double> values = optimizer_defaults(setup.optimizer);
  for (const auto& [key, value] : setup.hyperparameters) {
    const auto it = values.find(key);
    if (it == values.end()) {
      std::vector<std::string> takes;
      for (const auto& [name, fallback] : optimizer_defaults(setup.optimizer)) takes.push_back(name);
      throw InputError("optimizer " + setup.optimizer + " has no hyperparameter '" + cut_for_message(key) +
                       "'; it takes: " + joined(takes));
    }
    it->second = value;
  }
  return values;
}

const std::vector<std::string>& optimizer_flags(const std::string& optimizer) {
  optimizer_defaults(optimizer);  // InputError naming the known optimizers
  return flags_by_optimizer().at(optimizer);
}

bool is_implementation_flag(const std::string& flag) {
  return flag == "foreach" || flag == "fused" || flag == "capturable" || flag == "differentiable";
}

std::vector<OptimizerGroup> optimizer_groups(const Setup& setup) {
  std::vector<OptimizerGroup> groups = setup.param_groups;
  if (groups.empty()) groups.push_back(OptimizerGroup{setup.lr, setup.hyperparameters, setup.flags, std::nullopt});
  for (OptimizerGroup& g : groups) {
    Setup one = setup;
    one.hyperparameters = g.hyperparameters;
    g.hyperparameters = optimizer_hyperparameters(one);
    check_flags(setup.optimizer, g.flags);
  }
  return groups;
}

std::string number_text(double value) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", value);
  return buf;
}

std::string group_difference(const std::vector<OptimizerGroup>& groups) {
  if (groups.size() < 2) return "";
  std::string what;
  auto list = [&](const std::string& name, auto value_of) {
    std::string values;
    bool differs = false;
    for (const OptimizerGroup& g : groups) {
      const std::string v = value_of(g);
      differs = differs || v != value_of(groups.front());
      values += (values.empty() ? "" : ", ") + v;
    }
    if (differs) what += (what.empty() ? "" : "; ") + name + " " + values;
  };
  list("lr", [](const OptimizerGroup& g) { return number_text(g.lr); });
  for (const auto& entry : groups.front().hyperparameters) {
    const std::string& key = entry.first;  // a structured binding cannot be captured in C++17 (clang)
    list(key, [&key](const OptimizerGroup& g) {
      const auto it = g.hyperparameters.find(key);
      return it == g.hyperparameters.end() ? std::string("default") : number_text(it->second);
    });
  }
  std::vector<std::string> flags;
  for (const OptimizerGroup& g : groups) {
    for (const auto& [flag, on] : g.flags) {
      (void)on;
      if (std::find(flags.begin(), flags.end(), flag) == flags.end()) flags.push_back(flag);
    }
  }
  for (const std::string& flag : flags) {
    list(flag, [&flag](const OptimizerGroup& g) {
      const auto it = g.flags.find(flag);
      return it == g.flags.end() ? std::string("default") : std::string(it->second ? "true" : "false");
    });
  }
  if (what.empty()) return "";
  return std::to_string(groups.size()) + " parameter groups (" + what + ")";
}

std::string libtorch_cannot_run(const Setup& setup) {
  const std::vector<OptimizerGroup> groups = optimizer_groups(setup);
  const std::string differ = group_difference(groups);
  if (!differ.empty()) return differ;
  // LibTorch's options: SGD nesterov, Adam/AdamW amsgrad, RMSprop centered; no maximize.
  for (const auto& [flag, on] : groups.front().flags) {
    if (on && flag == "maximize") return flag_text(flag, on);
  }
  return "";
}

std::string implementation_flags_set(const Setup& setup) {
  std::string set;
  const std::vector<OptimizerGroup> groups = optimizer_groups(setup);  // named: the loop reads into it
  for (const auto& [flag, on] : groups.front().flags) {
    if (is_implementation_flag(flag)) set += (set.empty() ? "" : ", ") + flag_text(flag, on);
  }
  return set;
}

bool normalizes_by_tokens(const std::string& normalization, const std::string& loss, int64_t target_dims,
                          bool target_is_floating) {
  // A floating target of cross_entropy is a probability per class ([B,C]): one loss per sample.
  const bool class_indices = !target_is_floating;
  // Per-token losses: cross-entropy over class indices, and a model's own loss over integer labels
  // (a Hugging Face model's mean is over its valid tokens, so weighting it by samples changes the
  // objective; the Python executor weights it per token).
  const bool per_token_loss = loss == "cross_entropy" || loss == "model";
  if (normalization == "samples") return false;
  if (normalization == "tokens") {
    if (!per_token_loss) {
      throw InputError("normalization 'tokens' needs a per-token loss (cross_entropy, or a model's own loss); '" +
                       cut_for_message(loss) + "' has no tokens. Use samples");
    }
    if (!class_indices) {
      throw InputError("normalization 'tokens' needs a target of class indices; a floating target holds class "
                       "probabilities per sample and is normalized by samples. Use samples or auto");
    }
    return true;
  }
  if (normalization == "auto") return per_token_loss && class_indices && target_dims > 1;
  throw InputError("normalization '" + cut_for_message(normalization) + "' is unknown; use samples, tokens or auto");
}

bool normalizes_by_tokens(const Setup& setup) {
  if (setup.target.empty()) return normalizes_by_tokens(setup.normalization, setup.loss, 0, false);
  const TensorSpec target = parse_tensor_spec(setup.target, "setup.target");
  return normalizes_by_tokens(setup.normalization, setup.loss, static_cast<int64_t>(target.dims.size()),
                              !target.is_integer());
}

double probability_row_tolerance(const std::string& dtype) {
  // bfloat16 rounds each probability by up to 2^-8 of itself, and so a row's sum: its epsilon 2^-7.
  return dtype == "bfloat16" ? 1.0 / 128 : 1e-3;
}

bool is_batch_dependent_type(const std::string& type, bool tracks_running_stats) {
  if (type.find("BatchNorm") != std::string::npos) return true;
  return type.find("InstanceNorm") != std::string::npos && tracks_running_stats;
}

}  // namespace accumplan
