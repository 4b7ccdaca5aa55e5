// setup_rules.cpp — optimizer defaults and the normalization rule. See setup_rules.h.
#include "accumplan/setup_rules.h"

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
      {"adagrad", {{"lr_decay", 0.0}, {"eps", 1e-10}, {"weight_decay", 0.0}}},
      {"rmsprop", {{"alpha", 0.99}, {"eps", 1e-8}, {"weight_decay", 0.0}, {"momentum", 0.0}}},
  };
  return table;
}

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

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

bool normalizes_by_tokens(const std::string& normalization, const std::string& loss, int64_t target_dims,
                          bool target_is_floating) {
  // A floating target of cross_entropy is a probability per class ([B,C]): one loss per sample.
  const bool class_indices = !target_is_floating;
  if (normalization == "samples") return false;
  if (normalization == "tokens") {
    if (loss != "cross_entropy") {
      throw InputError("normalization 'tokens' needs a per-token loss (cross_entropy); '" + cut_for_message(loss) +
                       "' has no tokens. Use samples");
    }
    if (!class_indices) {
      throw InputError("normalization 'tokens' needs a target of class indices; a floating target holds class "
                       "probabilities per sample and is normalized by samples. Use samples or auto");
    }
    return true;
  }
  if (normalization == "auto") return loss == "cross_entropy" && class_indices && target_dims > 1;
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
