// Cross-entropy with a floating [B,C] target of class probabilities: the data check of its rows,
// the synthetic rows the profiler and `run` make, the loss per sample, and the loss config's
// normalization read from the spec's dtype.
#include <torch/torch.h>

#include <limits>
#include <optional>

#include "accumplan/errors.h"
#include "accumplan/schema.h"
#include "accumplan/tensor_spec.h"
#include "runtime/batch.h"
#include "runtime/loss.h"
#include "runtime/loss_setup.h"

#include "catch_after_torch.h"  // last: after glog's CHECK from LibTorch

using namespace accumplan;

namespace {

Batch with_target(const at::Tensor& target) {
  Batch b;
  b.inputs.push_back(torch::randn({target.size(0), 5}));
  b.target = target;
  return b;
}

const std::string kWhat = "--data 'p.pt': the target (class probabilities)";

}  // namespace

TEST_CASE("Probability rows: non-negative rows summing to 1 pass; the first bad row is named with its value or sum",
          "[loss][probabilities][data-check]") {
  const at::Tensor good = torch::softmax(torch::randn({6, 4}), 1);
  CHECK_NOTHROW(check_probability_rows(good, kWhat));
  CHECK_NOTHROW(check_probability_rows(torch::eye(4), kWhat));  // one-hot rows
  at::Tensor near = good.clone();
  near[3] *= 1.0005;  // within the 1e-3 tolerance
  CHECK_NOTHROW(check_probability_rows(near, kWhat));

  at::Tensor negative = good.clone();
  negative[4][2] = -0.25;
  negative[4][0] = negative[4][0] + 0.25 + good[4][2];  // the row still sums to 1
  negative[5][1] = -0.5;                                // a later bad row is not the one named
  CHECK_THROWS_WITH(check_probability_rows(negative, kWhat),
                    Catch::StartsWith(kWhat + ": row 4 holds -0.25 for class 2; class probabilities are non-negative"));
  at::Tensor short_row = good.clone();
  short_row[1] *= 0.7;
  CHECK_THROWS_WITH(check_probability_rows(short_row, kWhat),
                    Catch::StartsWith(kWhat + ": row 1 sums to 0.7, not 1 (tolerance 0.001)"));
  at::Tensor nan_row = good.clone();
  nan_row[2][0] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH(check_probability_rows(nan_row, kWhat), Catch::Contains("row 2 sums to nan"));
  // bfloat16 rounds each entry: its own tolerance, 2^-7, and still a bound.
  CHECK_NOTHROW(check_probability_rows(torch::softmax(torch::randn({64, 1000}), 1).to(torch::kBFloat16), kWhat));
  CHECK_THROWS_WITH(check_probability_rows((good * 0.97).to(torch::kBFloat16), kWhat),
                    Catch::Contains("not 1 (tolerance 0.0078125)"));
  try {
    check_probability_rows(short_row, kWhat);
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find('\n') == std::string::npos);  // one line
  }
}

TEST_CASE("Probability rows: the data check applies them to a cross_entropy float target only",
          "[loss][probabilities][data-check]") {
  const std::vector<TensorSpec> inputs = {parse_tensor_spec("float32[B,5]", "--input")};
  const TensorSpec target = parse_tensor_spec("float32[B,4]", "--target");
  at::Tensor bad = torch::softmax(torch::randn({3, 4}), 1);
  bad[2] *= 0.5;
  const DataRules ce = data_rules(inputs, target, -100, "cross_entropy");
  CHECK(ce.probability_target);
  CHECK_THROWS_WITH(check_batch_values(with_target(bad), ce, "--data 'p.pt'", "fix"),
                    Catch::StartsWith("--data 'p.pt': the target (class probabilities): row 2 sums to 0.5, not 1"));
  // mse targets are values: any row is fine.
  const DataRules mse = data_rules(inputs, target, -100, "mse");
  CHECK_FALSE(mse.probability_target);
  CHECK_NOTHROW(check_batch_values(with_target(bad), mse, "--data 'p.pt'", "fix"));
  CHECK_FALSE(data_rules(inputs, parse_tensor_spec("int64[B]:4", "--target"), -100, "cross_entropy").probability_target);
}

TEST_CASE("Probability rows: synthetic targets of cross_entropy are valid rows, of mse N(0,1) values",
          "[loss][probabilities][synthetic]") {
  const std::vector<TensorSpec> inputs = {parse_tensor_spec("float32[B,5]", "--input")};
  for (const char* dtype : {"float32", "float16", "bfloat16", "float64"}) {
    INFO(dtype);
    const TensorSpec target = parse_tensor_spec(std::string(dtype) + "[B,7]", "--target");
    const Batch ce = synthetic_batch(inputs, target, 32, 5, torch::kCPU, "cross_entropy");
    CHECK(ce.target.sizes() == at::IntArrayRef({32, 7}));
    CHECK(ce.target.scalar_type() == scalar_type_of(dtype));
    CHECK_NOTHROW(check_probability_rows(ce.target, "synthetic"));
    const Batch mse = synthetic_batch(inputs, target, 32, 5, torch::kCPU, "mse");
    CHECK(mse.target.lt(0).any().item<bool>());  // N(0,1) values: these would be refused as rows
    CHECK_THROWS_AS(check_probability_rows(mse.target, "synthetic"), InputError);
  }
}

TEST_CASE("Probability targets: the loss is -sum target * log_softmax per sample, summed over samples",
          "[loss][probabilities]") {
  const at::Tensor logits = torch::randn({5, 4}, torch::requires_grad());
  const at::Tensor probs = torch::softmax(torch::randn({5, 4}), 1);
  Setup setup;
  setup.loss = "cross_entropy";
  setup.normalization = "auto";
  const LossConfig config = loss_config(setup, parse_tensor_spec("float32[B,4]", "--target"), "--target float32[B,4]");
  CHECK(config.normalization == Normalization::Samples);  // [B,C] has two dims, but is no token target
  const LossSum s = loss_sum(logits, probs, 5, config);
  CHECK(s.units == 5);
  // The reference: ATen's own soft-target cross-entropy (PyTorch >= 1.10), mean over samples.
  const at::Tensor want = at::cross_entropy_loss(logits, probs, {}, at::Reduction::Mean);
  CHECK((s.sum / 5).item<double>() == Approx(want.item<double>()).epsilon(1e-6));
  // Shapes other than logits [B,C] with target [B,C] are refused in one line.
  CHECK_THROWS_WITH(loss_sum(logits, probs.narrow(1, 0, 3), 5, config),
                    Catch::Contains("needs logits [B,C] and a target of the same shape; got output [5,4] and target [5,3]"));
  LossConfig tokens = config;
  tokens.normalization = Normalization::Tokens;
  CHECK_THROWS_WITH(loss_sum(logits, probs, 5, tokens), Catch::StartsWith("tokens normalization needs a target of class indices"));
  // The int64 rule is unchanged: [B,T] class indices are still tokens under auto.
  CHECK(loss_config(setup, parse_tensor_spec("int64[B,8]:4", "--target"), "t").normalization == Normalization::Tokens);
  setup.normalization = "tokens";
  CHECK_THROWS_WITH(loss_config(setup, parse_tensor_spec("float32[B,4]", "--target"), "t"),
                    Catch::StartsWith("normalization 'tokens' needs a target of class indices"));
}

TEST_CASE("Loss config: a model's own loss over per-token labels is refused by run, not weighted by samples",
          "[loss][normalization][errors]") {
  // The model's mean is over its valid tokens; which ones (a causal LM shifts its labels) only the
  // module knows, so `accumplan run` refuses instead of weighting by samples, which changed the update.
  Setup setup;
  setup.loss = "model";
  setup.normalization = "auto";
  CHECK_THROWS_WITH(loss_config(setup, parse_tensor_spec("int64[B,8]:50", "--target"), "t"),
                    Catch::Contains("give --normalization samples"));
  setup.normalization = "tokens";  // a Python plan of a dict batch records it so
  CHECK_THROWS_WITH(loss_config(setup, std::nullopt, "t"), Catch::Contains("accumplan.train_window"));
  setup.normalization = "samples";
  CHECK(loss_config(setup, parse_tensor_spec("int64[B,8]:50", "--target"), "t").normalization ==
        Normalization::Samples);
  setup.normalization = "auto";  // a float target (a regression model's own loss): samples, as before
  CHECK(loss_config(setup, parse_tensor_spec("float32[B,2]", "--target"), "t").normalization ==
        Normalization::Samples);
}
