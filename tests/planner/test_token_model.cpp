// The (b, T) memory model and token packing (accumplan/token_model.h): the fit recovers known
// coefficients and keeps the T² term only when it explains the points; capacities agree with a
// brute-force search over the integer predictor; packing covers every sequence once, never
// predicts above the budget, and uses no more microbatches than any split of the same order could.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "accumplan/errors.h"
#include "accumplan/json_io.h"
#include "accumplan/step_time.h"
#include "accumplan/token_model.h"
#include "test_helpers.h"

using namespace accumplan;
using accumplan::test::MiB;

namespace {


// Points of peak = c0 + a1·b·T + a2·b·T² (+ noise) on a (b, T) grid.
std::vector<TokenPoint> grid(double c0, double a1, double a2, int64_t noise_bytes = 0) {
  std::vector<TokenPoint> pts;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> jitter(-noise_bytes, noise_bytes);
  for (int64_t b : {1, 2, 4, 8}) {
    for (int64_t t : {16, 64, 256, 1024}) {
      const double peak = c0 + a1 * static_cast<double>(b * t) + a2 * static_cast<double>(b * t * t);
      pts.push_back({b, t, static_cast<int64_t>(peak) + (noise_bytes ? jitter(rng) : 0)});
    }
  }
  return pts;
}

}  // namespace

TEST_CASE("Token model: a quadratic cost is recovered and kept", "[token][fit]") {
  const TokenMemoryModel m = TokenMemoryModel::fit(grid(100.0 * MiB, 4096, 48));
  const TokenFit& f = m.summary();
  CHECK(f.quadratic);
  CHECK(f.intercept_bytes == Approx(100.0 * MiB).epsilon(1e-6));
  CHECK(f.bytes_per_token == Approx(4096).epsilon(1e-6));
  CHECK(f.bytes_per_token_squared == Approx(48).epsilon(1e-6));
  CHECK(f.max_abs_residual_bytes < 2.0);  // integer peaks: truncation only
  CHECK(f.line_max_abs_residual_bytes > 1000 * f.max_abs_residual_bytes + 1);
  CHECK(f.residuals_bytes.size() == 16);
}

TEST_CASE("Token model: a linear cost drops the T^2 term", "[token][fit]") {
  // A fused attention kernel: memory linear in tokens, 2 KiB of noise per window.
  const TokenMemoryModel m = TokenMemoryModel::fit(grid(50.0 * MiB, 8192, 0, 2048));
  CHECK_FALSE(m.summary().quadratic);
  CHECK(m.summary().bytes_per_token_squared == 0);
  CHECK(m.summary().bytes_per_token == Approx(8192).epsilon(1e-3));
  CHECK(m.summary().max_abs_residual_bytes <= 2 * 2048 + 1);
}

TEST_CASE("Token model: one sequence length cannot tell T^2 from T", "[token][fit]") {
  std::vector<TokenPoint> pts = {{1, 128, 10 * MiB}, {2, 128, 11 * MiB}, {4, 128, 13 * MiB}, {8, 128, 17 * MiB}};
  const TokenMemoryModel m = TokenMemoryModel::fit(pts);
  CHECK_FALSE(m.summary().quadratic);
  CHECK(m.summary().bytes_per_token == Approx(static_cast<double>(MiB) / 128).epsilon(1e-9));
}

namespace {

// A decoder's peak as measured: the higher of two moments, each c + b·T·(α + β·T) — the end of
// forward (one T² copy per token) and a backward moment holding more T² copies — with the knee at
// T = 448.5, and a moment with no activations at 6.5 MiB below them both.
double two_moments(int64_t b, int64_t t) {
  const double bt = static_cast<double>(b * t), td = static_cast<double>(t);
  const double forward = 5.0 * MiB + bt * (25176.0 + 64.0 * td);
  const double backward = 5.4 * MiB + bt * (10824.0 + 96.0 * td);
  return std::max({forward, backward, 6.5 * MiB});
}

std::vector<TokenPoint> measured_at(const std::vector<std::pair<int64_t, int64_t>>& windows) {
  std::vector<TokenPoint> pts;
  for (const auto& [b, t] : windows) pts.push_back({b, t, static_cast<int64_t>(std::ceil(two_moments(b, t)))});
  return pts;
}

}  // namespace

TEST_CASE("Token model: a peak that is the higher of two moments is exact at every measured length, and above it between",
          "[token][fit]") {
  // Between the knee and 512, one sequence peaks in the backward moment and five in the forward one.
  REQUIRE(two_moments(1, 430) > 5.4 * MiB + 430.0 * (10824.0 + 96.0 * 430) - 1);
  REQUIRE(two_moments(5, 430) == Approx(5.0 * MiB + 5 * 430.0 * (25176.0 + 64.0 * 430)));
  const std::vector<TokenPoint> pts =
      measured_at({{40, 16}, {80, 16}, {4, 128}, {8, 128}, {2, 256}, {4, 256}, {1, 430}, {2, 430}, {5, 430},
                   {1, 449}, {2, 449}, {5, 449}, {1, 512}, {2, 512}});
  const TokenMemoryModel m = TokenMemoryModel::fit(pts);
  REQUIRE(m.columns().size() == 6);
  double fit_worst = 0;
  for (int64_t t : {16, 100, 128, 200, 256, 300, 430, 440, 449, 480, 512}) {
    // The token budget's worth, and one sequence where the lengths around were measured at one.
    for (int64_t b : {std::max<int64_t>(1, 3300 / t), t >= 256 ? int64_t{1} : std::max<int64_t>(1, 3300 / t)}) {
    const double truth = two_moments(b, t), predicted = static_cast<double>(m.predict_peak_bytes(b, t));
    INFO("b=" << b << " T=" << t << ": predicted " << predicted << ", measured " << truth);
    CHECK(predicted >= truth - 1.0);
    CHECK(predicted <= 1.01 * truth);
    const TokenFit& f = m.summary();
    const double fitted = f.intercept_bytes + b * t * (f.bytes_per_token + f.bytes_per_token_squared * t);
    fit_worst = std::max(fit_worst, std::fabs(fitted - truth) / truth);
    }
  }
  for (const TokenPoint& p : pts) CHECK(std::fabs(m.predict_bytes(p.micro_batch, p.seq_len) - p.peak_bytes) <= 2.0);
  // One c0 + a1·b·T + a2·b·T² through both moments misses by percents.
  CHECK(fit_worst > 0.02);
}

TEST_CASE("Token model: the least certain length lies in the interval holding the knee, until it is narrow",
          "[token][fit]") {
  const TokenMemoryModel coarse = TokenMemoryModel::fit(measured_at({{4, 128}, {8, 128}, {2, 256}, {4, 256}, {1, 512}, {2, 512}}));
  const std::optional<int64_t> t = coarse.least_certain_length(3300, 0.005);
  REQUIRE(t);
  CHECK(*t == 362);  // sqrt(256 · 512): the interval across T = 448.5
  const TokenMemoryModel fine = TokenMemoryModel::fit(measured_at(
      {{4, 128}, {8, 128}, {2, 256}, {4, 256}, {3, 362}, {6, 362}, {2, 430}, {5, 430}, {2, 449}, {5, 449}, {2, 479}, {4, 479}, {1, 512}, {2, 512}}));
  const std::optional<int64_t> next = fine.least_certain_length(3300, 0.005);
  INFO("next " << next.value_or(-1));
  CHECK_FALSE(next);
  // Too narrow to split: neighbouring lengths.
  const TokenMemoryModel adjacent = TokenMemoryModel::fit(measured_at({{4, 448}, {8, 448}, {4, 449}, {8, 449}, {1, 450}, {2, 450}}));
  CHECK_FALSE(adjacent.least_certain_length(3300, 0.0));
}

TEST_CASE("Token model: windows that peaked with no activations teach no length and bound every prediction from below",
          "[token][fit]") {
  // At 20 tokens, one sequence and two peak alike: the 6.5 MiB moment, not the activations; 165 of
  // them (the token budget's worth, as the search's short column) are activations.
  const TokenMemoryModel m =
      TokenMemoryModel::fit(measured_at({{1, 20}, {2, 20}, {165, 20}, {4, 128}, {8, 128}, {1, 512}, {2, 512}}));
  REQUIRE(two_moments(1, 20) == two_moments(2, 20));
  REQUIRE(m.columns().front().seq_len == 20);  // from the window of 165 alone, the intercept borrowed
  CHECK(m.columns().front().peaks.size() == 1);
  CHECK(m.columns().front().line_at(165).intercept_bytes == m.columns()[1].line_at(165).intercept_bytes);
  CHECK(m.predict_peak_bytes(1, 20) == static_cast<int64_t>(std::ceil(two_moments(1, 20))));
  CHECK(m.predict_peak_bytes(100, 20) >= two_moments(100, 20) - 1.0);
}

TEST_CASE("Token model: too few token counts, or peaks that shrink, are refused", "[token][fit][errors]") {
  CHECK_THROWS_WITH(TokenMemoryModel::fit({{2, 64, MiB}, {4, 32, MiB}}), Catch::Contains("at least two different token counts"));
  CHECK_THROWS_WITH(TokenMemoryModel::fit({{1, 64, 2 * MiB}, {4, 64, MiB}}), Catch::Contains("do not grow with the tokens"));
  CHECK_THROWS_WITH(TokenMemoryModel::fit({{0, 64, MiB}, {4, 64, 2 * MiB}}), Catch::Contains("micro_batch: 0 is out of range"));
}

TEST_CASE("Token model: capacities match a brute-force search of the predictor", "[token][capacity]") {
  const TokenMemoryModel m = TokenMemoryModel::fit(grid(100.0 * MiB, 4096, 48));
  const int64_t usable = 1024 * MiB;
  for (int64_t t : {1, 17, 128, 1000, 2048, 4000}) {
    const int64_t b = m.largest_micro_batch(t, usable);
    INFO("T=" << t << " b=" << b);
    if (b > 0) CHECK(m.predict_peak_bytes(b, t) <= usable);
    CHECK(m.predict_peak_bytes(b + 1, t) > usable);
  }
  const int64_t longest = m.longest_sequence(usable);
  CHECK(longest > 0);
  CHECK(m.predict_peak_bytes(1, longest) <= usable);
  CHECK(m.predict_peak_bytes(1, longest + 1) > usable);
  CHECK(m.largest_micro_batch(longest + 1, usable) == 0);
  CHECK(m.largest_micro_batch(16, 50 * MiB) == 0);  // below the intercept: nothing fits
  // A slope of about one byte per token and a petabyte: bounded, capped, no hang.
  const TokenMemoryModel tiny = TokenMemoryModel::fit({{1, 1, 100}, {1, 1000, 1099}});
  CHECK(tiny.largest_micro_batch(1, int64_t{1} << 50) == TokenMemoryModel::kMaxSequences);
  CHECK(tiny.longest_sequence(int64_t{1} << 50) == TokenMemoryModel::kMaxSeqLen);
}

TEST_CASE("Token model: the token budget fits every length up to the longest allowed", "[token][capacity]") {
  const TokenMemoryModel m = TokenMemoryModel::fit(grid(100.0 * MiB, 4096, 48));
  REQUIRE(m.summary().quadratic);
  const int64_t usable = 512 * MiB;
  for (int64_t t_max : {16, 100, 1024, 2000}) {
    const int64_t budget = m.token_budget(usable, t_max);
    INFO("T_max " << t_max << ", budget " << budget);
    REQUIRE(budget >= t_max);
    // Every microbatch the budget allows (b = floor(budget / T) sequences of T <= T_max) is
    // predicted to fit, and the budget is no more than a whole sequence short of the longest
    // length's capacity.
    for (int64_t t = 1; t <= t_max; t += std::max<int64_t>(1, t_max / 97)) {
      CHECK(m.predict_peak_bytes(budget / t, t) <= usable);
    }
    CHECK(m.predict_peak_bytes(budget / t_max, t_max) <= usable);
    CHECK(budget / t_max == m.largest_micro_batch(t_max, usable));
  }
  // The longest that fits alone is the last length with a non-zero budget.
  const int64_t longest = m.longest_sequence(usable);
  CHECK(m.token_budget(usable, longest) >= longest);
  CHECK(m.token_budget(usable, longest + 1) == 0);
  CHECK_THROWS_AS(m.token_budget(usable, 0), InputError);
}

TEST_CASE("Token model: the worst packed microbatch matches a brute force over every length", "[token][capacity]") {
  const TokenMemoryModel m = TokenMemoryModel::fit(grid(100.0 * MiB, 4096, 48));
  for (int64_t budget : {1000, 4404, 65536}) {
    for (int64_t t_max : {1, 17, 1024}) {
      if (t_max > budget) continue;
      int64_t brute = 0;
      for (int64_t l = 1; l <= t_max; ++l) brute = std::max(brute, m.predict_peak_bytes(budget / l, l));
      INFO("budget " << budget << ", T_max " << t_max);
      CHECK(m.worst_packed_peak_bytes(budget, t_max) == brute);
    }
  }
  // 4404 tokens at 1024 are 4 whole sequences: below the fractional bound.
  const TokenFit& f = m.summary();
  const double fractional = f.intercept_bytes + 4404.0 * (f.bytes_per_token + f.bytes_per_token_squared * 1024.0);
  CHECK(m.worst_packed_peak_bytes(4404, 1024) == m.predict_peak_bytes(4, 1024));
  CHECK(static_cast<double>(m.worst_packed_peak_bytes(4404, 1024)) < fractional);
}

TEST_CASE("Token packing: every sequence once, within the budget, in the fewest microbatches", "[token][pack]") {
  const int64_t budget = 4096;
  // A long-tailed length distribution (log-normal, 16..1024 tokens), as in language modelling.
  std::mt19937 rng(3);
  std::lognormal_distribution<double> dist(4.5, 1.0);
  std::vector<int64_t> lengths;
  for (int i = 0; i < 300; ++i) lengths.push_back(std::clamp<int64_t>(static_cast<int64_t>(dist(rng)), 16, 1024));
  const auto packed = pack_by_token_budget(lengths, budget);

  std::vector<int> seen(lengths.size(), 0);
  int64_t previous_longest = INT64_MAX;
  for (const auto& mb : packed) {
    REQUIRE_FALSE(mb.empty());
    const int64_t longest = lengths[static_cast<size_t>(mb.front())];
    CHECK(longest <= previous_longest);  // longest first
    previous_longest = longest;
    for (int64_t i : mb) {
      ++seen[static_cast<size_t>(i)];
      CHECK(lengths[static_cast<size_t>(i)] <= longest);  // padded to its first member
    }
    CHECK(static_cast<int64_t>(mb.size()) * longest <= budget);
  }
  CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  // Fewest: an exhaustive dynamic programme over the sorted order (any packing can be rearranged
  // into runs of the sorted order without more microbatches, so the best run partition is the
  // optimum): best[i] = fewest microbatches for the i longest sequences.
  std::vector<int64_t> sorted = lengths;
  std::sort(sorted.rbegin(), sorted.rend());
  const size_t n = sorted.size();
  std::vector<size_t> best(n + 1, SIZE_MAX);
  best[0] = 0;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 0; j < i; ++j) {  // the run sorted[j..i-1], padded to sorted[j]
      if (best[j] == SIZE_MAX) continue;
      if (static_cast<int64_t>(i - j) * sorted[j] <= budget) best[i] = std::min(best[i], best[j] + 1);
    }
  }
  CHECK(packed.size() == best[n]);
  // Against padding everything to the longest sequence: the sample plan's microbatch count.
  const int64_t at_max = budget / *std::max_element(lengths.begin(), lengths.end());
  const int64_t padded_count = (static_cast<int64_t>(lengths.size()) + at_max - 1) / at_max;
  CHECK(static_cast<int64_t>(packed.size()) * 2 < padded_count);
}

TEST_CASE("Token packing: ties keep their order and equal inputs pack equally", "[token][pack]") {
  const auto packed = pack_by_token_budget({5, 7, 5, 7, 3}, 14);
  REQUIRE(packed.size() == 3);
  CHECK(packed[0] == std::vector<int64_t>{1, 3});
  CHECK(packed[1] == std::vector<int64_t>{0, 2});
  CHECK(packed[2] == std::vector<int64_t>{4});
}

TEST_CASE("Token packing: a sequence longer than the budget is named", "[token][pack][errors]") {
  CHECK(pack_by_token_budget({16, 100}, 100).size() == 2);
  CHECK_THROWS_AS(pack_by_token_budget({16, 101, 20}, 100), InfeasibleError);
  CHECK_THROWS_WITH(pack_by_token_budget({16, 101, 20}, 100),
                    Catch::Contains("sequence 1 has 101 tokens, more than the token budget of 100") &&
                        Catch::Contains("truncate the sequences to at most 100 tokens"));
  CHECK_THROWS_WITH(pack_by_token_budget({16, 0}, 100), Catch::Contains("sequence 1's length: 0 is out of range"));
  CHECK_THROWS_AS(pack_by_token_budget({16}, 0), InputError);
  CHECK(pack_by_token_budget({}, 100).empty());
}

namespace {

// The greedy fill packing made before step costs (1.3): each microbatch as full as the budget allows.
std::vector<std::vector<int64_t>> greedy_fill(const std::vector<int64_t>& lengths, int64_t budget) {
  std::vector<int64_t> order(lengths.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return lengths[size_t(x)] > lengths[size_t(y)]; });
  std::vector<std::vector<int64_t>> out;
  for (size_t next = 0; next < order.size();) {
    const size_t take = std::min(order.size() - next, size_t(budget / lengths[size_t(order[next])]));
    out.emplace_back(order.begin() + std::ptrdiff_t(next), order.begin() + std::ptrdiff_t(next + take));
    next += take;
  }
  return out;
}

double packing_cost(const std::vector<std::vector<int64_t>>& groups, const std::vector<int64_t>& lengths,
                    const TokenStepCost& c) {
  double total = 0;
  for (const auto& g : groups) {
    const double b = double(g.size()), l = double(lengths[size_t(g.front())]);
    total += double(c.per_microbatch) + double(c.per_token) * b * l + double(c.per_token_squared) * b * l * l;
  }
  return total;
}

}  // namespace

TEST_CASE("Token packing: without a step cost it is the greedy fill, with one the cheapest cut of all",
          "[token][pack][step-cost]") {
  std::mt19937 rng(11);
  std::lognormal_distribution<double> dist(4.0, 1.0);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t n = 1 + rng() % 12;
    std::vector<int64_t> lengths;
    for (size_t i = 0; i < n; ++i) lengths.push_back(std::clamp<int64_t>(int64_t(dist(rng)), 1, 300));
    const int64_t budget = *std::max_element(lengths.begin(), lengths.end()) * int64_t(1 + rng() % 6);
    INFO("trial " << trial);
    CHECK(pack_by_token_budget(lengths, budget) == greedy_fill(lengths, budget));
    const TokenStepCost cost{int64_t(rng() % 4) * 4000, 1 + int64_t(rng() % 3), int64_t(rng() % 3)};
    const auto packed = pack_by_token_budget(lengths, budget, cost);
    // Brute force: every cut of the sorted order into runs (2^(n-1) of them) that fits the budget.
    const auto order = greedy_fill(lengths, int64_t{1} << 40).front();  // the sorted order, longest first
    double cheapest = 1e300;
    for (uint32_t cuts = 0; cuts < (1u << (n - 1)); ++cuts) {
      std::vector<std::vector<int64_t>> groups{{order[0]}};
      for (size_t i = 1; i < n; ++i) {
        if (cuts & (1u << (i - 1))) groups.emplace_back();
        groups.back().push_back(order[i]);
      }
      bool fits = true;
      for (const auto& g : groups) fits = fits && int64_t(g.size()) * lengths[size_t(g.front())] <= budget;
      if (fits) cheapest = std::min(cheapest, packing_cost(groups, lengths, cost));
    }
    CHECK(packing_cost(packed, lengths, cost) == cheapest);
    for (const auto& g : packed) CHECK(int64_t(g.size()) * lengths[size_t(g.front())] <= budget);
  }
}

TEST_CASE("Token packing: the C++ rule and the Python reader agree on the shared cases", "[token][pack][python]") {
  const std::string path = std::string(ACCUMPLAN_SOURCE_DIR) + "/tests/python/packing_cases.json";
  const nlohmann::json cases = nlohmann::json::parse(read_text_file(path, "the shared packing cases")).at("cases");
  REQUIRE(cases.size() >= 8);
  for (const auto& c : cases) {
    INFO(c.at("note").get<std::string>());
    std::optional<TokenStepCost> cost;
    if (!c.at("step_cost").is_null()) {
      const auto& s = c.at("step_cost");
      cost = TokenStepCost{s.at("per_microbatch").get<int64_t>(), s.at("per_token").get<int64_t>(),
                           s.at("per_token_squared").get<int64_t>()};
    }
    CHECK(pack_by_token_budget(c.at("lengths").get<std::vector<int64_t>>(), c.at("token_budget").get<int64_t>(), cost) ==
          c.at("groups").get<std::vector<std::vector<int64_t>>>());
  }
}

TEST_CASE("Step time: fitted from timed microbatches, in per-token units; predicts seconds", "[token][step-time]") {
  // seconds(b, L) = 2 ms + 1 µs·b·L + 1 ns·b·L².
  std::vector<TimedMicrobatch> ms;
  for (int64_t b : {1, 2, 4}) {
    for (int64_t t : {64, 256, 1024}) ms.push_back({b, t, 2e-3 + 1e-6 * double(b * t) + 1e-9 * double(b * t * t)});
  }
  const std::optional<StepTimeFit> f = fit_step_time(ms);
  REQUIRE(f.has_value());
  CHECK(f->per_microbatch_seconds == Approx(2e-3).epsilon(1e-6));
  CHECK(f->per_token_seconds == Approx(1e-6).epsilon(1e-6));
  CHECK(f->per_token_squared_seconds == Approx(1e-9).epsilon(1e-6));
  CHECK(f->used == 9);
  CHECK(f->set_aside == 0);
  const TokenStepCost c = f->cost();
  CHECK(c.per_token == kStepCostPerToken);
  CHECK(c.per_microbatch == Approx(2000.0 * kStepCostPerToken).epsilon(1e-6));  // 2 ms = 2000 tokens' time
  CHECK(c.per_token_squared == Approx(kStepCostPerToken / 1000.0).epsilon(1e-2));
  CHECK(c.token_seconds == Approx(1e-6));
  // The plan's integer cost predicts the same seconds; a cost without seconds predicts none.
  REQUIRE(predicted_seconds(c, 3, 500).has_value());
  // per_token_squared is an integer (65.536 units rounds to 66): within 0.2% here.
  CHECK(*predicted_seconds(c, 3, 500) == Approx(f->predict_seconds(3, 500)).epsilon(2e-3));
  CHECK(f->predict_seconds(3, 500) == Approx(2e-3 + 1.5e-3 + 0.75e-3));
  CHECK_FALSE(predicted_seconds(TokenStepCost{5, kStepCostPerToken, 0}, 3, 500).has_value());
}

TEST_CASE("Step time: coefficients never below zero; too little or bad data gives no fit", "[token][step-time]") {
  std::vector<TimedMicrobatch> ms;
  for (int64_t b : {1, 2, 4}) {
    for (int64_t t : {64, 256, 1024}) ms.push_back({b, t, 1e-6 * double(b * t)});
  }
  // No per-microbatch time: t0 is 0, and packing then trades padding alone.
  const std::optional<StepTimeFit> free = fit_step_time(ms);
  REQUIRE(free.has_value());
  CHECK(free->per_microbatch_seconds == 0);
  CHECK(free->cost().per_microbatch == 0);
  CHECK_FALSE(fit_step_time({ms[0], ms[1], ms[2]}).has_value());      // fewer than 4
  CHECK_FALSE(fit_step_time({ms[0], ms[0], ms[0], ms[1]}).has_value());  // 2 shapes
  std::vector<TimedMicrobatch> bad = ms;
  bad[3].seconds = 0;
  CHECK_FALSE(fit_step_time(bad).has_value());
  bad[3].seconds = std::nan("");
  CHECK_FALSE(fit_step_time(bad).has_value());
  // Step times as the token benchmark's profile measured them on 2 CPU cores: the unconstrained
  // line's intercept is -0.1 s (which had dropped the cost whole); the fit keeps t0 >= 0.
  const std::vector<TimedMicrobatch> measured{{1, 256, 0.249735848}, {1, 512, 0.412569692}, {1, 1024, 1.410061492},
                                              {2, 256, 0.351998805}, {2, 512, 0.816758761}, {2, 1024, 1.896460744},
                                              {4, 1024, 4.559658383}};
  const std::optional<StepTimeFit> m = fit_step_time(measured);
  REQUIRE(m.has_value());
  CHECK(m->per_microbatch_seconds >= 0);
  CHECK(m->per_token_seconds > 0);
  CHECK(m->per_token_squared_seconds >= 0);
  // What it keeps, it predicts: every kept step within 30%, half of them within the median miss.
  int64_t within = 0;
  for (const auto& s : measured) {
    if (std::fabs(m->predict_seconds(s.micro_batch, s.seq_len) - s.seconds) / s.seconds <= 0.3) ++within;
  }
  CHECK(within >= m->used);
  CHECK(m->median_abs_error < 0.15);
}

TEST_CASE("Step time: the cost keeps the ratios when a token's time is tiny next to the others", "[token][step-time]") {
  StepTimeFit f;
  f.per_microbatch_seconds = 1.0;       // 2^40 tokens' time: past per_microbatch's 2^50 at 65536 units a token
  f.per_token_seconds = 1.0 / double(int64_t{1} << 40);
  f.per_token_squared_seconds = 0;
  const TokenStepCost c = f.cost();
  CHECK(c.per_microbatch <= (int64_t{1} << 50));
  CHECK(c.per_token >= 1);
  // The ratio a microbatch : a token survives (within the rounding of per_token), and so do seconds.
  CHECK(double(c.per_microbatch) / double(c.per_token) == Approx(double(int64_t{1} << 40)).epsilon(1e-4));
  REQUIRE(predicted_seconds(c, 1, 1).has_value());
  CHECK(*predicted_seconds(c, 1, 1) == Approx(f.predict_seconds(1, 1)).epsilon(1e-4));
  f.per_token_squared_seconds = 1e-3;  // t2/t1 = 2^40·1e-3: past per_token_squared's 2^30
  const TokenStepCost d = f.cost();
  CHECK(d.per_token_squared <= (int64_t{1} << 30));
  CHECK(*predicted_seconds(d, 2, 1000) == Approx(f.predict_seconds(2, 1000)).epsilon(1e-3));
}

TEST_CASE("Step time: a preempted step is set aside, not fitted", "[token][step-time]") {
  std::vector<TimedMicrobatch> ms;
  for (int64_t b : {1, 2, 4, 8}) {
    for (int64_t t : {32, 128, 512}) ms.push_back({b, t, 5e-3 + 2e-6 * double(b * t)});
  }
  ms[4].seconds *= 3;  // one step in twelve ran three times as long (another process took the cores)
  const std::optional<StepTimeFit> f = fit_step_time(ms);
  REQUIRE(f.has_value());
  CHECK(f->set_aside == 1);
  CHECK(f->used == 11);
  CHECK(f->per_microbatch_seconds == Approx(5e-3).epsilon(1e-6));
  CHECK(f->per_token_seconds == Approx(2e-6).epsilon(1e-6));
  CHECK(f->median_abs_error == Approx(0).margin(1e-9));
}

TEST_CASE("Step time model: fits the run's most recent microbatches, and follows a change", "[token][step-time]") {
  StepTimeModel model;
  CHECK_FALSE(model.refit());
  auto feed = [&](double per_token, int rounds) {
    for (int r = 0; r < rounds; ++r) {
      for (int64_t b : {1, 3}) {
        for (int64_t t : {40, 200}) model.observe({b, t, 1e-3 + per_token * double(b * t)});
      }
    }
  };
  feed(1e-6, 2);
  REQUIRE(model.refit());
  CHECK(model.fit()->per_token_seconds == Approx(1e-6).epsilon(1e-6));
  feed(4e-6, 200);  // 800 microbatches on a slower machine: the first 8 have dropped out
  CHECK(model.held() == StepTimeModel::kRecentMicrobatches);
  REQUIRE(model.refit());
  CHECK(model.fit()->per_token_seconds == Approx(4e-6).epsilon(1e-6));
  CHECK(model.refits() == 2);
}
TEST_CASE("Token model: a packed microbatch's peak leaves out the gradient first in a window and the state before the first step", "[token][predict]") {
  Profile profile;
  for (const TokenPoint& p : grid(100.0 * MiB, 4096, 48)) {
    ProfilePoint point;
    point.micro_batch = p.micro_batch;
    point.peak_bytes = p.peak_bytes;
    point.seq_len = p.seq_len;
    profile.points.push_back(point);
  }
  profile.persistent.gradients_bytes = 3 * MiB;
  profile.persistent.optimizer_state_bytes = 5 * MiB;
  const TokenMemoryModel m = TokenMemoryModel::fit(profile);
  const int64_t steady = m.predict_peak_bytes(4, 128);
  CHECK(m.predict_microbatch_peak_bytes(4, 128, false, true) == steady);
  CHECK(m.predict_microbatch_peak_bytes(4, 128, true, true) == steady - 3 * MiB);
  CHECK(m.predict_microbatch_peak_bytes(4, 128, false, false) == steady - 5 * MiB);
  CHECK(m.predict_microbatch_peak_bytes(4, 128, true, false) == steady - 8 * MiB);
  // A fit from bare points knows no persistent parts.
  CHECK(TokenMemoryModel::fit(grid(100.0 * MiB, 4096, 48)).predict_microbatch_peak_bytes(4, 128, true, false) == steady);
}

TEST_CASE("Token model: a window's first microbatch is predicted from the profile's first microbatches, whose "
          "resident gradients depend on the moment of the peak", "[token][predict]") {
  // Steady windows peak as two_moments; their first microbatches lack all 1.4 MB of gradients in
  // the forward moment and 0.4 MB of them in the backward one (the rest exist by then).
  Profile profile;
  profile.persistent.gradients_bytes = 1400000;
  auto first_of = [](int64_t b, int64_t t) {
    const double bt = static_cast<double>(b * t), td = static_cast<double>(t);
    const double forward = 5.0 * MiB + bt * (25176.0 + 64.0 * td) - 1400000;
    const double backward = 5.4 * MiB + bt * (10824.0 + 96.0 * td) - 400000;
    return static_cast<int64_t>(std::ceil(std::max(forward, backward)));
  };
  for (const auto& [b, t] : std::vector<std::pair<int64_t, int64_t>>{{4, 128}, {8, 128}, {2, 256}, {4, 256},
                                                                    {1, 449}, {2, 449}, {5, 449}, {1, 512}, {2, 512}}) {
    ProfilePoint pt;
    pt.micro_batch = b;
    pt.seq_len = t;
    pt.peak_bytes = static_cast<int64_t>(std::ceil(two_moments(b, t)));
    pt.first_microbatch_peak_bytes = first_of(b, t);
    profile.points.push_back(pt);
  }
  const TokenMemoryModel m = TokenMemoryModel::fit(profile);
  for (const auto& [b, t] : std::vector<std::pair<int64_t, int64_t>>{{1, 512}, {1, 480}, {6, 512}, {8, 200}}) {
    INFO("b=" << b << " T=" << t);
    CHECK(m.predict_microbatch_peak_bytes(b, t, true, true) == Approx(first_of(b, t)).margin(2));
    CHECK(m.predict_microbatch_peak_bytes(b, t, false, true) == Approx(two_moments(b, t)).margin(2));
  }
  // Without every first microbatch recorded: the steady peak less all the gradients.
  profile.points.front().first_microbatch_peak_bytes.reset();
  const TokenMemoryModel without = TokenMemoryModel::fit(profile);
  CHECK(without.predict_microbatch_peak_bytes(1, 512, true, true) == without.predict_peak_bytes(1, 512) - 1400000);
}

TEST_CASE("Packed peak: a window's is its highest microbatch's or the profile's optimizer step, whichever is higher",
          "[token][predict]") {
  constexpr int64_t kStep = 100 * MiB + MiB / 2;  // above a lone short sequence's, below two of 64 tokens
  Profile profile;
  CHECK_FALSE(PackedPeakPredictor(profile).predicts());  // no (b, T) points: nothing to predict from
  CHECK_FALSE(PackedPeakPredictor(profile).window_peak_bytes({{4, 128}}, true).has_value());
  for (const TokenPoint& p : grid(100.0 * MiB, 4096, 48)) {
    ProfilePoint point;
    point.micro_batch = p.micro_batch;
    point.peak_bytes = p.peak_bytes;
    point.seq_len = p.seq_len;
    point.optimizer_step_peak_bytes = kStep;
    profile.points.push_back(point);
  }
  profile.persistent.gradients_bytes = 3 * MiB;
  const TokenMemoryModel m = TokenMemoryModel::fit(profile);
  const PackedPeakPredictor predictor(profile);
  REQUIRE(predictor.predicts());
  // The first microbatch has no gradient resident: the window's peak is the larger second one.
  const int64_t second = m.predict_microbatch_peak_bytes(2, 64, false, true);
  REQUIRE(second > kStep);
  CHECK(predictor.window_peak_bytes({{8, 512}, {2, 64}}, true) ==
        std::max(m.predict_microbatch_peak_bytes(8, 512, true, true), second));
  // A window of a few short sequences peaks in the optimizer step.
  REQUIRE(m.predict_microbatch_peak_bytes(1, 16, true, true) < kStep);
  CHECK(predictor.window_peak_bytes({{1, 16}}, true) == kStep);
  CHECK(predictor.window_peak_bytes(std::optional<int64_t>(200 * MiB)) == 200 * MiB);
}

TEST_CASE("Packing cost: the plan's until the run's own microbatches fit one, then the run's", "[token][step-time]") {
  const TokenStepCost plan_cost{7 * kStepCostPerToken, kStepCostPerToken, 0, 1e-6};
  PackingCost cost(plan_cost);
  CHECK(cost.cost()->per_microbatch == plan_cost.per_microbatch);
  cost.observe_window({{1, 40, 1e-3}, {3, 40, 1.2e-3}});  // 2 microbatches at 2 shapes: no fit yet
  CHECK(cost.cost()->per_microbatch == plan_cost.per_microbatch);
  std::vector<TimedMicrobatch> window;
  for (int64_t b : {1, 3}) {
    for (int64_t t : {40, 200}) window.push_back({b, t, 1e-3 + 1e-6 * double(b * t)});
  }
  cost.observe_window(window);
  REQUIRE(cost.model().fit());
  CHECK(cost.cost()->per_token == kStepCostPerToken);
  CHECK(cost.cost()->per_microbatch != plan_cost.per_microbatch);
  CHECK_FALSE(PackingCost(std::nullopt).cost().has_value());  // no plan cost, no fit: packing fills
}

TEST_CASE("Packing cost: a run's fit with no per-microbatch time is floored by its windows' time between steps",
          "[token][step-time]") {
  const TokenStepCost plan_cost{3 * kStepCostPerToken, kStepCostPerToken, 0, 1e-6};
  std::vector<TimedMicrobatch> window;
  for (int64_t b : {1, 3}) {
    for (int64_t t : {40, 200}) window.push_back({b, t, 1e-6 * double(b * t)});  // t0 = 0
  }
  double steps = 0;
  for (const auto& m : window) steps += m.seconds;
  PackingCost without_rounds(plan_cost);
  without_rounds.observe_window(window);
  REQUIRE(without_rounds.model().fit()->per_microbatch_seconds == Approx(0).margin(1e-12));
  // No window timed whole: the plan's t0 (3 tokens' time) is the floor.
  CHECK(without_rounds.cost()->per_microbatch == Approx(3.0 * kStepCostPerToken).epsilon(1e-3));
  PackingCost run(plan_cost);
  run.observe_window(window, steps + 4 * 20e-6);  // 20 µs beyond each step: 20 tokens' time
  CHECK(run.microbatch_floor_seconds() == Approx(20e-6));
  CHECK(run.cost()->per_microbatch == Approx(20.0 * kStepCostPerToken).epsilon(1e-3));
  // One long and three short sequences: the short ones share a microbatch (320 padded tokens + 2
  // microbatches of 20) rather than go alone (320 + 4 x 20) or join the long one (800 + 20).
  CHECK(pack_by_token_budget({200, 40, 40, 40}, 1000, run.cost()).size() == 2);
  CHECK(PackingCost(std::nullopt).microbatch_floor_seconds() == 0);
}

TEST_CASE("Packing: the names --packing and Python's packing= take", "[token][pack]") {
  CHECK(packing_names() == std::vector<std::string>{"time", "fill"});
  CHECK(packing_named("fill") == Packing::Fill);
  CHECK(packing_name(Packing::Time) == "time");
  CHECK_FALSE(packing_named("Fill").has_value());
}
