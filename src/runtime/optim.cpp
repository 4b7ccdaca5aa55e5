// runtime/optim.cpp — optimizer construction and state accounting. See optim.h.
#include "runtime/optim.h"

#include "accumplan/sharding.h"

#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <set>
#include <tuple>
#include <unordered_set>

#include <torch/optim.h>

#include "accumplan/errors.h"

namespace accumplan {
namespace {

// A value outside its range (setup_rules.h's one table) is refused here with the option's name
// and the range, not deep in LibTorch ("cannot be converted to type float without overflow").
void check_hyperparameter(const std::string& key, double value) {
  const ValueRange& r = optimizer_value_ranges().at(key);
  if (r.contains(value)) return;
  std::string option = "--" + key;
  for (char& c : option) c = c == '_' ? '-' : c;
  char text[160];
  std::snprintf(text, sizeof text, "%s: %.6g is out of range %c%g, %g%c", option.c_str(), value, r.lo_open ? '(' : '[',
                r.lo, r.hi, r.hi_open ? ')' : ']');
  throw InputError(text);
}

}  // namespace

void check_optimizer_values(const Setup& setup) {
  // Every group's values (one group: setup's own), unknown hyperparameters and flags refused.
  const std::vector<OptimizerGroup> groups = optimizer_groups(setup);
  check_hyperparameter("lr", setup.lr);
  for (const OptimizerGroup& g : groups) {
    check_hyperparameter("lr", g.lr);
    for (const auto& [key, value] : g.hyperparameters) {
      if (optimizer_value_range(key)) check_hyperparameter(key, value);
    }
  }
  // What LibTorch's optimizers cannot run is refused, never dropped (the torchrun export asks the
  // same rule).
  const std::string cannot = libtorch_cannot_run(setup);
  if (!cannot.empty()) {
    throw InputError("accumplan run cannot run the plan's " + cannot + ": LibTorch's optimizers " +
                     (setup.param_groups.size() > 1 ? "here take one set of values for every parameter"
                                                    : "lack it") +
                     "; train with the Python package (Plan.train_window with your optimizer)");
  }
  const auto& g = groups.front();
  const auto nesterov = g.flags.find("nesterov");
  if (nesterov != g.flags.end() && nesterov->second &&
      !(g.hyperparameters.count("momentum") && g.hyperparameters.at("momentum") > 0 && g.hyperparameters.at("dampening") == 0)) {
    throw InputError("nesterov=true needs momentum > 0 and dampening 0 (torch.optim.SGD's rule); set them or drop nesterov");
  }
}

void check_grad_norm(double value, const std::string& option) {
  if (std::isfinite(value) && value > 0 && value <= 1e12) return;
  char text[160];
  std::snprintf(text, sizeof text, "%s: %.6g is out of range (0, 1e+12]; a gradient norm such as 1.0", option.c_str(),
                value);
  throw InputError(text);
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Setup& setup, std::vector<at::Tensor> params) {
  // Every hyperparameter, absent ones at their defaults; unknown names refused (setup_rules.h).
  check_optimizer_values(setup);  // and what LibTorch cannot run: groups that differ, maximize
  // One group's values say all (groups that differ were refused above): setup's own lr,
  // hyperparameters and flags, the first group's, which `accumplan run --lr` may have replaced.
  Setup first = setup;
  first.param_groups.clear();
  const OptimizerGroup group = optimizer_groups(first).front();
  const std::map<std::string, double>& hp = group.hyperparameters;
  const auto flag = [&group](const char* name) {
    const auto it = group.flags.find(name);
    return it != group.flags.end() && it->second;
  };
  const std::string implementation = implementation_flags_set(setup);
  if (!implementation.empty() && !params.empty()) {
    std::cerr << "accumplan: note: the plan's optimizer " << implementation
              << " runs as LibTorch's one implementation of the same update\n";
  }
  const std::string& name = setup.optimizer;
  using namespace torch::optim;
  if (name == "sgd" || name == "momentum") {
    SGDOptions o(group.lr);
    o.momentum(name == "momentum" ? hp.at("momentum") : 0.0);
    o.dampening(hp.at("dampening"));
    o.weight_decay(hp.at("weight_decay"));
    o.nesterov(flag("nesterov"));
    return std::make_unique<SGD>(std::move(params), o);
  }
  if (name == "adam" || name == "adamw") {
    const std::vector<std::string>& beta = torch_grouped_members("betas");  // (beta1, beta2)
    const std::tuple<double, double> betas{hp.at(beta.at(0)), hp.at(beta.at(1))};
    if (name == "adam" && !flag("decoupled_weight_decay")) {  // decoupled: AdamW's update, run as AdamW
      AdamOptions o(group.lr);
      o.betas(betas).eps(hp.at("eps")).weight_decay(hp.at("weight_decay")).amsgrad(flag("amsgrad"));
      return std::make_unique<Adam>(std::move(params), o);
    }
    AdamWOptions o(group.lr);
    o.betas(betas).eps(hp.at("eps")).weight_decay(hp.at("weight_decay")).amsgrad(flag("amsgrad"));
    return std::make_unique<AdamW>(std::move(params), o);
  }
  if (name == "adagrad") {
    AdagradOptions o(group.lr);
    o.lr_decay(hp.at("lr_decay")).eps(hp.at("eps")).weight_decay(hp.at("weight_decay"));
    o.initial_accumulator_value(hp.at("initial_accumulator_value"));
    return std::make_unique<Adagrad>(std::move(params), o);
  }
  RMSpropOptions o(group.lr);
  o.alpha(hp.at("alpha")).eps(hp.at("eps")).weight_decay(hp.at("weight_decay")).momentum(hp.at("momentum"));
  o.centered(flag("centered"));
  return std::make_unique<RMSprop>(std::move(params), o);
}

namespace {
void add_tensor(const at::Tensor& t, std::unordered_set<const void*>& seen, int64_t& bytes) {
  if (!t.defined()) return;
  const auto& storage = t.storage();
  if (seen.insert(storage.unsafeGetStorageImpl()).second) bytes += static_cast<int64_t>(storage.nbytes());
}
}  // namespace

std::vector<int64_t> parameter_owners(const std::vector<at::Tensor>& params, int64_t world_size) {
  std::vector<int64_t> numels;
  for (const at::Tensor& t : params) numels.push_back(t.numel());
  return zero_partition({numels}, world_size);
}

std::vector<at::Tensor> owned_parameters(const std::vector<at::Tensor>& params, const std::vector<int64_t>& owners,
                                         int64_t rank) {
  std::vector<at::Tensor> mine;
  for (size_t i = 0; i < params.size(); ++i) {
    if (owners.at(i) == rank) mine.push_back(params[i]);
  }
  return mine;
}

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  using namespace torch::optim;
  std::unordered_set<const void*> seen;
  int64_t bytes = 0;
  for (const auto& [key, state] : optimizer.state()) {
    (void)key;
    const OptimizerParamState* s = state.get();
    if (auto* a = dynamic_cast<const AdamParamState*>(s)) {
      add_tensor(a->exp_avg(), seen, bytes);
      add_tensor(a->exp_avg_sq(), seen, bytes);
      add_tensor(a->max_exp_avg_sq(), seen, bytes);
    } else if (auto* w = dynamic_cast<const AdamWParamState*>(s)) {
      add_tensor(w->exp_avg(), seen, bytes);
      add_tensor(w->exp_avg_sq(), seen, bytes);
      add_tensor(w->max_exp_avg_sq(), seen, bytes);
    } else if (auto* g = dynamic_cast<const SGDParamState*>(s)) {
      add_tensor(g->momentum_buffer(), seen, bytes);
    } else if (auto* ad = dynamic_cast<const AdagradParamState*>(s)) {
      add_tensor(ad->sum(), seen, bytes);
    } else if (auto* r = dynamic_cast<const RMSpropParamState*>(s)) {
      add_tensor(r->square_avg(), seen, bytes);
      add_tensor(r->momentum_buffer(), seen, bytes);
      add_tensor(r->grad_avg(), seen, bytes);
    } else {
      throw InternalError("optimizer_state_bytes: unknown optimizer state type");
    }
  }
  return bytes;
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace accumplan
