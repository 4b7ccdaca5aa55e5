// The normalization rule (accumplan/setup_rules.h), which `accumplan run`, the exporters and the
// Python package (accumplan.resolve_normalization, through _core) all ask: per token or per sample,
// read from the loss and the target's dimensions AND dtype.
#include <catch2/catch.hpp>

#include <string>

#include "accumplan/errors.h"
#include "accumplan/schema.h"
#include "accumplan/setup_rules.h"

using namespace accumplan;

TEST_CASE("Normalization rule: auto is tokens for [B,T] class indices only; probability targets are samples",
          "[setup][normalization]") {
  // Class indices: [B] samples, [B,T] tokens.
  CHECK_FALSE(normalizes_by_tokens("auto", "cross_entropy", 1, false));
  CHECK(normalizes_by_tokens("auto", "cross_entropy", 2, false));
  // A floating [B,C] target of cross-entropy holds class probabilities: one loss per sample.
  CHECK_FALSE(normalizes_by_tokens("auto", "cross_entropy", 2, true));
  CHECK_FALSE(normalizes_by_tokens("auto", "cross_entropy", 3, true));
  // mse has no tokens whatever its target; no target (a model's own loss) is samples.
  CHECK_FALSE(normalizes_by_tokens("auto", "mse", 2, true));
  CHECK_FALSE(normalizes_by_tokens("auto", "model", 0, false));
  // A model's own loss over integer labels [B,T] is a mean over valid tokens: per token too.
  CHECK(normalizes_by_tokens("auto", "model", 2, false));
  CHECK_FALSE(normalizes_by_tokens("auto", "model", 1, false));
  CHECK_FALSE(normalizes_by_tokens("auto", "model", 2, true));
  CHECK(normalizes_by_tokens("tokens", "model", 0, false));  // a dict batch's labels: the plan says so
  CHECK_FALSE(normalizes_by_tokens("samples", "cross_entropy", 2, false));
  CHECK(normalizes_by_tokens("tokens", "cross_entropy", 2, false));
}

TEST_CASE("Normalization rule: tokens with a probability target or a loss without tokens is refused in one line",
          "[setup][normalization][errors]") {
  CHECK_THROWS_WITH(normalizes_by_tokens("tokens", "cross_entropy", 2, true),
                    "normalization 'tokens' needs a target of class indices; a floating target holds class "
                    "probabilities per sample and is normalized by samples. Use samples or auto");
  CHECK_THROWS_WITH(normalizes_by_tokens("tokens", "mse", 2, true),
                    "normalization 'tokens' needs a per-token loss (cross_entropy, or a model's own loss); 'mse' has no "
                    "tokens. Use samples");
  CHECK_THROWS_WITH(normalizes_by_tokens("per-token", "cross_entropy", 2, false),
                    "normalization 'per-token' is unknown; use samples, tokens or auto");
}

TEST_CASE("Normalization rule: a setup's target spec gives the dimensions and the dtype", "[setup][normalization]") {
  Setup s;
  s.loss = "cross_entropy";
  s.normalization = "auto";
  s.target = "float32[B,10]";
  CHECK_FALSE(normalizes_by_tokens(s));  // what the exporters write for a probability target
  s.target = "bfloat16[B,10]";
  CHECK_FALSE(normalizes_by_tokens(s));
  s.target = "int64[B,10]:50";
  CHECK(normalizes_by_tokens(s));
  s.target = "int64[B]:50";
  CHECK_FALSE(normalizes_by_tokens(s));
  s.target = "float32[B,10]";
  s.normalization = "tokens";
  CHECK_THROWS_AS(normalizes_by_tokens(s), InputError);
}

TEST_CASE("Normalization rule: rows of class probabilities may sum to 1 within 1e-3, bfloat16 within its epsilon",
          "[setup][probabilities]") {
  CHECK(probability_row_tolerance("float32") == 1e-3);
  CHECK(probability_row_tolerance("float16") == 1e-3);
  CHECK(probability_row_tolerance("float64") == 1e-3);
  CHECK(probability_row_tolerance("bfloat16") == 1.0 / 128);  // its rounding alone moves a sum by 2^-8
}
