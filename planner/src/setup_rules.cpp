// setup_rules.cpp — the optimizer table, its value ranges and the normalization rule. See setup_rules.h.
#include "accumplan/setup_rules.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "accumplan/errors.h"
#include "accumplan/tensor_spec.h"
#include "accumplan/terms.h"

namespace accumplan {
namespace {

// The one optimizer table. Hyperparameters in torch.optim's keyword order, each with the default
// an absent one means (LibTorch's, torch/optim/*.h; momentum's momentum is 0.9 because 0 would
// make it sgd) and torch.optim's class default (they differ only there). Flags: torch.optim's
// on/off options, the union over torch 1.13 and 2.x, in the order messages list them. The learning
// rate: 0.001 for the adaptive optimizers, which diverge at SGD's 0.01 on many models.
const std::vector<OptimizerInfo>& table() {
  const std::vector<std::string> sgd_flags = {"nesterov", "maximize", "foreach", "fused", "differentiable"};
  const std::vector<std::string> adam_flags = {"amsgrad", "maximize", "foreach", "fused", "capturable", "differentiable"};
  // torch 2.x's Adam(decoupled_weight_decay=True) is AdamW's update; AdamW itself takes no such option.
  std::vector<std::string> adam_only_flags = adam_flags;
  adam_only_flags.push_back("decoupled_weight_decay");
  const std::vector<OptimizerHyperparameter> adam = {
      {"beta1", 0.9, 0.9}, {"beta2", 0.999, 0.999}, {"eps", 1e-8, 1e-8}, {"weight_decay", 0.0, 0.0}};
  std::vector<OptimizerHyperparameter> adamw = adam;
  adamw.back() = {"weight_decay", 1e-2, 1e-2};
  const std::vector<std::pair<std::string, std::string>> hf_adam = {
      {"beta1", "adam_beta1"}, {"beta2", "adam_beta2"}, {"eps", "adam_epsilon"}};
  static const std::vector<OptimizerInfo> rows = {
      {"sgd", "SGD", 1e-2, {{"dampening", 0.0, 0.0}, {"weight_decay", 0.0, 0.0}}, {{"momentum", 0.0}}, sgd_flags,
       "sgd", "", {}, ""},
      {"momentum", "SGD", 1e-2, {{"momentum", 0.9, 0.0}, {"dampening", 0.0, 0.0}, {"weight_decay", 0.0, 0.0}}, {},
       sgd_flags, "sgd", "", {}, ""},
      // Trainer's AdamW without weight decay is Adam; it has no other Adam.
      {"adam", "Adam", 1e-3, adam, {}, adam_only_flags, "adamw_torch", "adamw_torch_fused", hf_adam,
       "Trainer has no Adam with coupled (L2) weight decay"},
      {"adamw", "AdamW", 1e-3, adamw, {}, adam_flags, "adamw_torch", "adamw_torch_fused", hf_adam, ""},
      {"adagrad", "Adagrad", 1e-2,
       {{"lr_decay", 0.0, 0.0}, {"eps", 1e-10, 1e-10}, {"weight_decay", 0.0, 0.0},
        {"initial_accumulator_value", 0.0, 0.0}},
       {}, {"maximize", "foreach", "fused", "differentiable"}, "adagrad", "", {}, ""},
      {"rmsprop", "RMSprop", 1e-3,
       {{"alpha", 0.99, 0.99}, {"eps", 1e-8, 1e-8}, {"weight_decay", 0.0, 0.0}, {"momentum", 0.0, 0.0}}, {},
       {"centered", "maximize", "foreach", "capturable", "differentiable"}, "rmsprop", "", {}, ""},
  };
  return rows;
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

const std::vector<OptimizerInfo>& optimizer_table() { return table(); }

const std::vector<TorchKeyword>& torch_grouped_keywords() {
  static const std::vector<TorchKeyword> grouped = {{"betas", {"beta1", "beta2"}}};
  return grouped;
}

const std::vector<std::string>& torch_grouped_members(const std::string& keyword) {
  for (const TorchKeyword& g : torch_grouped_keywords()) {
    if (g.keyword == keyword) return g.members;
  }
  throw InternalError("torch groups no hyperparameters as '" + keyword + "'");
}

std::vector<TorchKeyword> torch_keywords(const OptimizerInfo& row) {
  std::vector<TorchKeyword> out;
  for (const OptimizerHyperparameter& h : row.hyperparameters) {
    const auto group = std::find_if(torch_grouped_keywords().begin(), torch_grouped_keywords().end(),
                                    [&h](const TorchKeyword& g) {
                                      return std::find(g.members.begin(), g.members.end(), h.name) != g.members.end();
                                    });
    if (group == torch_grouped_keywords().end()) {
      out.push_back({h.name, {h.name}});
    } else if (group->members.front() == h.name) {
      out.push_back(*group);  // written once, where its first member stands
    }
  }
  return out;
}

const std::vector<std::string>& optimizer_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const OptimizerInfo& row : table()) n.push_back(row.name);
    return n;
  }();
  return names;
}

const OptimizerInfo& optimizer_info(const std::string& optimizer) {
  for (const OptimizerInfo& row : table()) {
    if (row.name == optimizer) return row;
  }
  throw InputError(option_name("--optimizer") + " '" + cut_for_message(optimizer) + "' is unknown; choose one of: " +
                   joined(optimizer_names()));
}

const std::map<std::string, double>& optimizer_defaults(const std::string& optimizer) {
  static const std::map<std::string, std::map<std::string, double>> by_name = [] {
    std::map<std::string, std::map<std::string, double>> m;
    for (const OptimizerInfo& row : table()) {
      for (const OptimizerHyperparameter& h : row.hyperparameters) m[row.name][h.name] = h.plan_default;
    }
    return m;
  }();
  optimizer_info(optimizer);  // InputError naming the known optimizers
  return by_name.at(optimizer);
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
  return optimizer_info(optimizer).flags;
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

bool ValueRange::contains(double value) const {
  return std::isfinite(value) && (lo_open ? value > lo : value >= lo) && (hi_open ? value < hi : value <= hi);
}

const std::map<std::string, ValueRange>& optimizer_value_ranges() {
  static const std::map<std::string, ValueRange> ranges = {
      {"lr", {0, 1e6, false, false}},          {"momentum", {0, 1, false, true}},
      {"dampening", {0, 1, false, false}},     {"weight_decay", {0, 1e6, false, false}},
      {"beta1", {0, 1, false, true}},          {"beta2", {0, 1, false, true}},
      {"eps", {0, 1, true, false}},            {"alpha", {0, 1, false, false}},
      {"lr_decay", {0, 1e6, false, false}},    {"initial_accumulator_value", {0, 1e6, false, false}},
  };
  return ranges;
}

const ValueRange* optimizer_value_range(const std::string& name) {
  const auto it = optimizer_value_ranges().find(name);
  return it == optimizer_value_ranges().end() ? nullptr : &it->second;
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
