// test_prediction.cpp — the plan's predicted peak against the peak that training reaches: for each
// model, `accumplan --model ... --headroom 0` under a CPU budget, then `accumplan run --steps 3`
// of that plan under the same budget, both through the real binary. The truth here is the run's
// measured peak (what a user's training reaches), never another measurement of the profiler.
//
// Models: the three built-ins, a TorchScript model whose forward returns a tuple (logits, hidden),
// and builtin:convnet measured and run under bf16 autocast.
// What it is not: a test of the fit's arithmetic (tests/planner) or of OOM recovery (test_oom).
#include <torch/script.h>
#include <torch/torch.h>

#include <cmath>
#include <stdexcept>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cli_runner.h"

// Last: torch/torch.h brings glog's CHECK macro, which would shadow Catch's.
#include "catch_after_torch.h"

using namespace accumplan::test;
using nlohmann::json;

namespace {

// An MLP 64 → 512 → 10 that returns (logits, hidden): the output rule trains on the first element.
std::string save_tuple_model(const std::string& dir) {
  torch::manual_seed(5);
  torch::jit::Module m("TupleNet");
  m.register_parameter("w1", (torch::randn({512, 64}) * 0.1).requires_grad_(), false);
  m.register_parameter("b1", torch::zeros({512}).requires_grad_(), false);
  m.register_parameter("w2", (torch::randn({10, 512}) * 0.05).requires_grad_(), false);
  m.register_parameter("b2", torch::zeros({10}).requires_grad_(), false);
  m.define(R"(
def forward(self, x):
    h = torch.relu(torch.matmul(x, self.w1.t()) + self.b1)
    return torch.matmul(h, self.w2.t()) + self.b2, h
)");
  const std::string path = dir + "/tuple-net.pt";
  m.save(path);
  return path;
}

struct Case {
  std::string name;
  std::string model;
  std::vector<std::string> extra;  // specs, optimizer, amp
  std::string budget;
  std::string target_batch;
};

struct PredictionOutcome {
  json plan;
  json stats;
};

PredictionOutcome plan_and_run(const Case& c, const std::string& dir) {
  const std::string plan = dir + "/" + c.name + ".plan.json", stats = dir + "/" + c.name + ".stats.json";
  std::vector<std::string> args{"--model", c.model, "--target-batch", c.target_batch, "--device", "cpu",
                                "--memory-budget", c.budget, "--headroom", "0", "--threads", "2", "--out", plan};
  args.insert(args.end(), c.extra.begin(), c.extra.end());
  const CliResult p = run_cli(args);
  INFO(p.err);
  REQUIRE(p.exit_code == 0);
  const CliResult r = run_cli({"run", "--plan", plan, "--model", c.model, "--memory-budget", c.budget, "--steps", "3",
                               "--threads", "2", "--stats", stats});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  return {json::parse(slurp(plan)), json::parse(slurp(stats))};
}

}  // namespace

TEST_CASE("Prediction: the plan's predicted peak is within 2% of the peak `accumplan run` reaches",
          "[cli][run][prediction]") {
  const std::string dir = scratch_dir("prediction-" + std::to_string(::getpid()));
  const std::string tuple_model = save_tuple_model(dir);
  const std::vector<Case> cases = {
      {"mlp", "builtin:mlp", {}, "1200KiB", "256"},
      {"mlp-one-microbatch", "builtin:mlp", {}, "1200KiB", "64"},
      {"convnet", "builtin:convnet", {"--optimizer", "adam"}, "64MiB", "256"},
      {"tinylm", "builtin:tinylm", {"--optimizer", "adamw"}, "8MiB", "64"},
      {"tuple", tuple_model, {"--input", "float32[B,64]", "--target", "int64[B]:10"}, "1MiB", "256"},
  };
  for (const Case& c : cases) {
    SECTION(c.name) {
      const PredictionOutcome o = plan_and_run(c, dir);
      const int64_t predicted = o.plan["memory"]["predicted_peak_bytes"];
      const int64_t measured = o.stats["measured_peak_bytes"];
      const double error = static_cast<double>(predicted - measured) / static_cast<double>(measured);
      const auto sizes = o.plan["microbatch_sizes"].get<std::vector<int64_t>>();
      std::printf("prediction %-8s sizes %zu x %lld: predicted %lld, run peak %lld bytes, error %+.2f%%\n",
                  c.name.c_str(), sizes.size(), static_cast<long long>(sizes.front()), static_cast<long long>(predicted),
                  static_cast<long long>(measured), 100.0 * error);
      CHECK(o.plan["confirmed"] == true);
      // The budget forces accumulation (or, for the one-microbatch case, just allows none).
      CHECK((sizes.size() >= 2) == (c.name != "mlp-one-microbatch"));
      CHECK(o.stats["oom_recoveries"] == 0);
      CHECK(std::abs(error) <= 0.02);
    }
  }
}

TEST_CASE("Prediction: bf16 is measured under autocast, with fewer activation bytes, and predicts its run",
          "[cli][run][prediction][amp]") {
  const std::string dir = scratch_dir("prediction-bf16-" + std::to_string(::getpid()));
  const Case f32{"convnet-f32", "builtin:convnet", {"--optimizer", "sgd"}, "48MiB", "256"};
  Case bf16 = f32;
  bf16.name = "convnet-bf16";
  bf16.extra.insert(bf16.extra.end(), {"--amp", "bf16"});
  const PredictionOutcome a = plan_and_run(f32, dir);
  const PredictionOutcome b = plan_and_run(bf16, dir);
  CHECK(b.plan["setup"]["amp"] == "bf16");
  CHECK(b.stats["amp"] == "bf16");
  const double per_sample_f32 = a.plan["memory"]["activation_bytes_per_sample"];
  const double per_sample_bf16 = b.plan["memory"]["activation_bytes_per_sample"];
  std::printf("prediction convnet activation bytes/sample: float32 %.0f, bf16 %.0f (ratio %.2f)\n", per_sample_f32,
              per_sample_bf16, per_sample_bf16 / per_sample_f32);
  CHECK(per_sample_bf16 < 0.9 * per_sample_f32);
  CHECK(b.plan["micro_batch"].get<int64_t>() > a.plan["micro_batch"].get<int64_t>());
  const int64_t predicted = b.plan["memory"]["predicted_peak_bytes"];
  const int64_t measured = b.stats["measured_peak_bytes"];
  const double error = static_cast<double>(predicted - measured) / static_cast<double>(measured);
  std::printf("prediction convnet-bf16: predicted %lld, run peak %lld bytes, error %+.2f%%\n",
              static_cast<long long>(predicted), static_cast<long long>(measured), 100.0 * error);
  CHECK(b.stats["oom_recoveries"] == 0);
  CHECK(std::abs(error) <= 0.02);
}

TEST_CASE("Prediction: run refuses an --amp the plan was not measured with, unless --force", "[cli][run][amp]") {
  const std::string dir = scratch_dir("prediction-amp-" + std::to_string(::getpid()));
  const std::string plan = dir + "/plan.json";
  const CliResult p = run_cli({"--model", "builtin:mlp", "--target-batch", "16", "--device", "cpu", "--memory-budget",
                               "4MiB", "--out", plan});
  REQUIRE(p.exit_code == 0);
  const CliResult r = run_cli({"run", "--plan", plan, "--model", "builtin:mlp", "--steps", "1", "--amp", "bf16"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("--amp bf16 but the plan was measured with amp none") != std::string::npos);
  CHECK(r.err.find("Re-profile with --amp bf16") != std::string::npos);
  const CliResult forced =
      run_cli({"run", "--plan", plan, "--model", "builtin:mlp", "--steps", "1", "--amp", "bf16", "--force"});
  INFO(forced.err);
  CHECK(forced.exit_code == 0);
}
