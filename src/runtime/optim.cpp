// runtime/optim.cpp — optimizer construction and state accounting. See optim.h.
#include "runtime/optim.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>
#include <unordered_set>

#include <torch/optim.h>

#include "accumplan/errors.h"

namespace accumplan {
namespace {

// Each hyperparameter's range. The optimizers compute in float32 on float32 parameters, so a
// value like --lr 1e308 is not only meaningless but fails deep in LibTorch ("cannot be converted
// to type float without overflow"); refuse it here with the option's name and the range.
struct Range {
  double lo, hi;
  bool lo_open, hi_open;
};
const std::map<std::string, Range>& hyperparameter_ranges() {
  static const std::map<std::string, Range> ranges = {
      {"lr", {0, 1e6, true, false}},           {"momentum", {0, 1, false, true}},
      {"dampening", {0, 1, false, false}},     {"weight_decay", {0, 1e6, false, false}},
      {"beta1", {0, 1, false, true}},          {"beta2", {0, 1, false, true}},
      {"eps", {0, 1, true, false}},            {"alpha", {0, 1, false, false}},
      {"lr_decay", {0, 1e6, false, false}},
  };
  return ranges;
}

void check_hyperparameter(const std::string& key, double value) {
  const Range& r = hyperparameter_ranges().at(key);
  const bool ok = std::isfinite(value) && (r.lo_open ? value > r.lo : value >= r.lo) &&
                  (r.hi_open ? value < r.hi : value <= r.hi);
  if (ok) return;
  std::string option = "--" + key;
  for (char& c : option) c = c == '_' ? '-' : c;
  char text[160];
  std::snprintf(text, sizeof text, "%s: %.6g is out of range %c%g, %g%c", option.c_str(), value, r.lo_open ? '(' : '[',
                r.lo, r.hi, r.hi_open ? ')' : ']');
  throw InputError(text);
}

}  // namespace

void check_optimizer_values(const Setup& setup) {
  check_hyperparameter("lr", setup.lr);
  for (const auto& [key, value] : setup.hyperparameters) {
    if (hyperparameter_ranges().count(key)) check_hyperparameter(key, value);
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
  const std::map<std::string, double> hp = optimizer_hyperparameters(setup);
  check_optimizer_values(setup);
  const std::string& name = setup.optimizer;
  using namespace torch::optim;
  if (name == "sgd" || name == "momentum") {
    SGDOptions o(setup.lr);
    o.momentum(name == "momentum" ? hp.at("momentum") : 0.0);
    o.dampening(hp.at("dampening"));
    o.weight_decay(hp.at("weight_decay"));
    return std::make_unique<SGD>(std::move(params), o);
  }
  if (name == "adam" || name == "adamw") {
    const std::tuple<double, double> betas{hp.at("beta1"), hp.at("beta2")};
    if (name == "adam") {
      AdamOptions o(setup.lr);
      o.betas(betas).eps(hp.at("eps")).weight_decay(hp.at("weight_decay"));
      return std::make_unique<Adam>(std::move(params), o);
    }
    AdamWOptions o(setup.lr);
    o.betas(betas).eps(hp.at("eps")).weight_decay(hp.at("weight_decay"));
    return std::make_unique<AdamW>(std::move(params), o);
  }
  if (name == "adagrad") {
    AdagradOptions o(setup.lr);
    o.lr_decay(hp.at("lr_decay")).eps(hp.at("eps")).weight_decay(hp.at("weight_decay"));
    return std::make_unique<Adagrad>(std::move(params), o);
  }
  RMSpropOptions o(setup.lr);
  o.alpha(hp.at("alpha")).eps(hp.at("eps")).weight_decay(hp.at("weight_decay")).momentum(hp.at("momentum"));
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
