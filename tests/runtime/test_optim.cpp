// The LibTorch optimizer a plan's setup builds (runtime/optim.h): the flags LibTorch has are
// honoured, what it lacks is refused in one line naming the value, never dropped.
#include <torch/torch.h>

#include "catch_after_torch.h"

#include "accumplan/errors.h"
#include "runtime/optim.h"

using namespace accumplan;

namespace {

std::vector<at::Tensor> one_parameter() { return {torch::zeros({2}, torch::requires_grad())}; }

std::string refusal(const Setup& setup) {
  try {
    make_optimizer(setup, one_parameter());
  } catch (const InputError& e) {
    return e.what();
  }
  return "(built)";
}

}  // namespace

TEST_CASE("Optimizer: nesterov, amsgrad and centered reach LibTorch's options", "[optim][runtime]") {
  Setup sgd;
  sgd.optimizer = "momentum";
  sgd.flags = {{"nesterov", true}};
  auto built = make_optimizer(sgd, one_parameter());
  const auto& o = static_cast<const torch::optim::SGDOptions&>(built->param_groups().at(0).options());
  CHECK(o.nesterov());
  CHECK(o.momentum() == 0.9);
  Setup adamw;
  adamw.optimizer = "adamw";
  adamw.lr = 1e-3;
  adamw.flags = {{"amsgrad", true}};
  built = make_optimizer(adamw, one_parameter());
  CHECK(static_cast<const torch::optim::AdamWOptions&>(built->param_groups().at(0).options()).amsgrad());
  Setup rms;
  rms.optimizer = "rmsprop";
  rms.flags = {{"centered", true}};
  built = make_optimizer(rms, one_parameter());
  CHECK(static_cast<const torch::optim::RMSpropOptions&>(built->param_groups().at(0).options()).centered());
  // Without flags, the options are LibTorch's defaults as before.
  Setup plain;
  plain.optimizer = "adam";
  built = make_optimizer(plain, one_parameter());
  CHECK_FALSE(static_cast<const torch::optim::AdamOptions&>(built->param_groups().at(0).options()).amsgrad());
}

TEST_CASE("Optimizer: adam with decoupled_weight_decay makes AdamW's update", "[optim][runtime]") {
  auto update = [](const Setup& setup) {
    torch::manual_seed(0);
    at::Tensor w = torch::randn({4}, torch::requires_grad());
    auto built = make_optimizer(setup, {w});
    for (int step = 0; step < 3; ++step) {
      w.mutable_grad() = torch::full({4}, 0.5 + step);
      built->step();
    }
    return w.detach().clone();
  };
  Setup adam;
  adam.optimizer = "adam";
  adam.lr = 1e-2;
  adam.hyperparameters = {{"weight_decay", 0.1}};
  Setup decoupled = adam;
  decoupled.flags = {{"decoupled_weight_decay", true}};
  Setup adamw = adam;
  adamw.optimizer = "adamw";
  CHECK(torch::equal(update(decoupled), update(adamw)));
  CHECK_FALSE(torch::equal(update(adam), update(adamw)));  // coupled (L2) weight decay: another update
  Setup wrong = adamw;
  wrong.flags = {{"decoupled_weight_decay", true}};  // AdamW takes no such option
  CHECK_THAT(refusal(wrong), Catch::Contains("decoupled_weight_decay"));
}

TEST_CASE("Optimizer: groups with different values and maximize are refused naming the value", "[optim][runtime]") {
  Setup groups;
  groups.optimizer = "sgd";
  groups.param_groups = {OptimizerGroup{0.01, {}, {}, 100}, OptimizerGroup{0.1, {}, {}, 10}};
  CHECK(refusal(groups) ==
        "accumplan run cannot run the plan's 2 parameter groups (lr 0.01, 0.1): LibTorch's optimizers here take one "
        "set of values for every parameter; train with the Python package (Plan.train_window with your optimizer)");
  Setup maximize;
  maximize.optimizer = "adam";
  maximize.flags = {{"maximize", true}};
  CHECK_THAT(refusal(maximize), Catch::StartsWith("accumplan run cannot run the plan's maximize=true: LibTorch's "
                                                  "optimizers lack it"));
  Setup nesterov_without_momentum;
  nesterov_without_momentum.flags = {{"nesterov", true}};
  CHECK_THAT(refusal(nesterov_without_momentum), Catch::Contains("nesterov=true needs momentum > 0"));
}

TEST_CASE("Optimizer: groups with the same values build one group; --lr replaces the first group's lr",
          "[optim][runtime]") {
  Setup same;
  same.optimizer = "sgd";
  same.param_groups = {OptimizerGroup{0.01, {}, {}, 100}, OptimizerGroup{0.01, {}, {}, 10}};
  same.lr = 0.5;  // what run_setup does for `accumplan run --lr 0.5`
  auto built = make_optimizer(same, one_parameter());
  CHECK(built->param_groups().at(0).options().get_lr() == 0.5);
}
