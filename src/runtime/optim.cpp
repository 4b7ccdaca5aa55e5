// runtime/optim.cpp — optimizer construction and state accounting. See optim.h.
#include "runtime/optim.h"

#include <set>
#include <unordered_set>

#include <torch/optim.h>

#include "accumplan/errors.h"

namespace accumplan {
namespace {

// Which hyperparameters each optimizer takes, so a typo is an error rather than ignored.
const std::map<std::string, std::set<std::string>>& known_hyperparameters() {
  static const std::map<std::string, std::set<std::string>> known = {
      {"sgd", {"weight_decay"}},
      {"momentum", {"momentum", "weight_decay", "dampening"}},
      {"adam", {"beta1", "beta2", "eps", "weight_decay"}},
      {"adamw", {"beta1", "beta2", "eps", "weight_decay"}},
      {"adagrad", {"lr_decay", "eps", "weight_decay"}},
      {"rmsprop", {"alpha", "eps", "weight_decay", "momentum"}},
  };
  return known;
}

}  // namespace

const std::vector<std::string>& optimizer_names() {
  static const std::vector<std::string> names = {"sgd", "momentum", "adam", "adamw", "adagrad", "rmsprop"};
  return names;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Setup& setup, std::vector<at::Tensor> params) {
  const auto& known = known_hyperparameters();
  const auto it = known.find(setup.optimizer);
  if (it == known.end()) {
    std::string names;
    for (const auto& n : optimizer_names()) names += (names.empty() ? "" : ", ") + n;
    throw InputError("--optimizer '" + setup.optimizer + "' is unknown; choose one of: " + names);
  }
  for (const auto& [key, value] : setup.hyperparameters) {
    if (!it->second.count(key)) {
      std::string names;
      for (const auto& n : it->second) names += (names.empty() ? "" : ", ") + n;
      throw InputError("optimizer " + setup.optimizer + " has no hyperparameter '" + key + "'; it takes: " + names);
    }
  }
  if (!(setup.lr > 0)) throw InputError("--lr must be positive, got " + std::to_string(setup.lr));
  auto hp = [&](const char* key, double fallback) {
    auto f = setup.hyperparameters.find(key);
    return f == setup.hyperparameters.end() ? fallback : f->second;
  };
  const std::string& name = setup.optimizer;
  using namespace torch::optim;
  if (name == "sgd" || name == "momentum") {
    SGDOptions o(setup.lr);
    o.momentum(name == "momentum" ? hp("momentum", 0.9) : 0.0);
    o.dampening(hp("dampening", 0.0));
    o.weight_decay(hp("weight_decay", 0.0));
    return std::make_unique<SGD>(std::move(params), o);
  }
  if (name == "adam") {
    AdamOptions o(setup.lr);
    o.betas({hp("beta1", 0.9), hp("beta2", 0.999)}).eps(hp("eps", 1e-8)).weight_decay(hp("weight_decay", 0.0));
    return std::make_unique<Adam>(std::move(params), o);
  }
  if (name == "adamw") {
    AdamWOptions o(setup.lr);
    o.betas({hp("beta1", 0.9), hp("beta2", 0.999)}).eps(hp("eps", 1e-8)).weight_decay(hp("weight_decay", 1e-2));
    return std::make_unique<AdamW>(std::move(params), o);
  }
  if (name == "adagrad") {
    AdagradOptions o(setup.lr);
    o.lr_decay(hp("lr_decay", 0.0)).eps(hp("eps", 1e-10)).weight_decay(hp("weight_decay", 0.0));
    return std::make_unique<Adagrad>(std::move(params), o);
  }
  RMSpropOptions o(setup.lr);
  o.alpha(hp("alpha", 0.99)).eps(hp("eps", 1e-8)).weight_decay(hp("weight_decay", 0.0)).momentum(hp("momentum", 0.0));
  return std::make_unique<RMSprop>(std::move(params), o);
}

namespace {
void add_tensor(const at::Tensor& t, std::unordered_set<const void*>& seen, int64_t& bytes) {
  if (!t.defined()) return;
  const auto& storage = t.storage();
  if (seen.insert(storage.unsafeGetStorageImpl()).second) bytes += static_cast<int64_t>(storage.nbytes());
}
}  // namespace

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
