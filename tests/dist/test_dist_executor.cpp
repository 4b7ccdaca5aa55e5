// test_dist_executor.cpp — the executor on 2 ranks (separate processes, Gloo over 127.0.0.1)
// against the single-process full-batch update (docs/weighting.md "Several ranks").
//
// What it is: each case launches this binary twice (the hidden case "dist worker", one process per
// rank, RANK/WORLD_SIZE/MASTER_* set as torchrun sets them) under a 60 s watchdog; each rank runs
// the Executor with a Gloo communicator on its strided share of every global window and writes
// its parameters after every window and its statistics. The parent computes the reference with
// ATen's own mean-reduced losses over the WHOLE global window in one process (executor_fixtures.h,
// not through loss.cpp or the executor) and one plain SGD step, and compares (rel <= 1e-5):
//   samples mode: a full window (5+5), a short one (4+3) and one of 1 sample (1+0, rank 1 runs an
//                 empty round) — each weighted by its global count;
//   tokens mode:  32 valid tokens on rank 0, 4 on rank 1 — the global count, not per-rank means
//                 (which the test shows would differ by far more than the tolerance);
//   OOM on rank 1 only: both ranks recover, replay, and match the no-OOM update;
//   collective counts: 1 counter reduce + 1 agreement after the microbatches, ONE gradient exchange a window.
// What it is not: a CUDA/NCCL test, nor a test of `accumplan run` (test_dist_cli.cpp).
#include <torch/script.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "accumplan/memory_probe.h"
#include "cli_runner.h"
#include "dist/communicator.h"
#include "dist_harness.h"
#include "executor/executor.h"
#include "executor/verify.h"

// Last: torch/torch.h brings glog's CHECK macro, which would shadow Catch's.
#include "catch_after_torch.h"

using namespace accumplan;
using namespace accumplan::test;
using json = nlohmann::json;

namespace {

std::vector<at::Tensor> trainable(const torch::jit::Module& m) {
  std::vector<at::Tensor> v;
  for (const auto& p : m.parameters()) {
    if (p.requires_grad()) v.push_back(p);
  }
  return v;
}

std::vector<at::Tensor> snapshot(const std::vector<at::Tensor>& ps) {
  std::vector<at::Tensor> v;
  for (const auto& p : ps) v.push_back(p.detach().clone());
  return v;
}

std::string params_file(const std::string& dir, int rank, size_t window, const std::string& what = "params") {
  return dir + "/" + what + "-r" + std::to_string(rank) + "-w" + std::to_string(window) + ".pt";
}

// One rank of a scenario, in its own process.
void run_worker(const std::string& name, const std::string& dir) {
  const std::optional<DistEnv> env = dist_env_from_environment();
  if (!env) throw std::runtime_error("the worker needs WORLD_SIZE, RANK, MASTER_ADDR and MASTER_PORT");
  // 20 s: far above the ~1 s a scenario takes, far below the parent's 60 s watchdog.
  auto comm = make_gloo_communicator(*env, std::chrono::seconds(20));
  std::unique_ptr<MemoryProbe> probe;
  if (name == "oom" || name == "packed") probe = make_memory_probe(ProbeRequest{});  // the CPU counting allocator
  Scenario s = make_scenario(name);
  auto params = trainable(s.model);
  torch::optim::SGD opt(params, torch::optim::SGDOptions(s.lr));
  json out;
  out["rank"] = env->rank;
  out["log"] = json::array();
  ExecutorOptions o;
  o.loss = s.loss;
  o.communicator = comm.get();
  o.probe = probe.get();
  o.log = [&](const std::string& line) {
    out["log"].push_back(line);
    std::cerr << line << "\n";
  };
  std::vector<at::Tensor> stepped_with;  // the (global) gradient the optimizer stepped with
  o.on_step = [&](const StepEvent&) { stepped_with = gradients_of(s.model); };
  if (name == "oom" && env->rank == 1) {
    // The 4th allocation of rank 1's first microbatch (size 3) fails: inside its forward.
    o.before_microbatch = [&](const MicrobatchEvent& e) {
      if (e.window == 0 && e.index == 0 && e.attempt == 0) probe->fail_allocation_after(4);
    };
  }
  if (name == "packed" && env->rank == 1) {
    // Rank 1's second microbatch of window 0 ([11, 8]: 22 padded tokens) fails in its forward.
    o.before_microbatch = [&](const MicrobatchEvent& e) {
      if (e.window == 0 && e.index == 1 && e.attempt == 0) probe->fail_allocation_after(1);
    };
  }
  Executor ex(s.model, opt, s.plan, o);
  out["windows"] = json::array();
  for (size_t w = 0; w < s.windows.size(); ++w) {
    const auto [start, count] = s.windows[w];
    const CollectiveCounts before = comm->counts();
    const WindowStats st = ex.step(rank_window(s.data.slice(start, count), s.plan, env->rank, env->world_size));
    const CollectiveCounts after = comm->counts();
    out["windows"].push_back({{"samples", st.samples},
                              {"units", st.units},
                              {"valid_tokens", st.valid_tokens},
                              {"local_samples", st.local_samples},
                              {"microbatch_sizes", st.microbatch_sizes},
                              {"rounds", st.microbatch_rounds},
                              {"loss", st.loss},
                              {"stepped", st.stepped},
                              {"oom_recoveries", st.oom_recoveries},
                              {"counter_all_reduces", after.counter_all_reduces - before.counter_all_reduces},
                              {"gradient_exchanges", after.gradient_exchanges - before.gradient_exchanges},
                              {"tensor_all_reduces", after.tensor_all_reduces - before.tensor_all_reduces}});
    torch::save(snapshot(params), params_file(dir, env->rank, w));
    torch::save(stepped_with, params_file(dir, env->rank, w, "grads"));
  }
  out["final_sizes"] = ex.plan().microbatch_sizes;
  if (ex.plan().tokens) out["final_token_budget"] = ex.plan().tokens->token_budget;
  out["samples_seen"] = ex.totals().samples_seen;
  std::ofstream(dir + "/stats-r" + std::to_string(env->rank) + ".json") << out.dump(2);
}

std::string self_exe() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

struct RankRun {
  json stats;
  std::vector<std::vector<at::Tensor>> params;  // after each window
  std::vector<std::vector<at::Tensor>> grads;   // stepped with, each window
};

// Launches both ranks of `name` once per process (cases share a scenario's run).
const std::vector<RankRun>& run_scenario(const std::string& name) {
  static std::map<std::string, std::vector<RankRun>> cache;
  if (auto it = cache.find(name); it != cache.end()) return it->second;
  const std::string dir = scratch_dir("dist-" + name + "-" + std::to_string(::getpid()));
  const LaunchResult res = launch_ranks({self_exe(), "dist worker"}, kWorld, dir,
                                        {"ACCUMPLAN_DIST_SCENARIO=" + name, "ACCUMPLAN_DIST_OUT=" + dir}, 60);
  INFO("rank 0 log:\n" << slurp(res.ranks[0].log) << "\nrank 1 log:\n" << slurp(res.ranks[1].log));
  REQUIRE_FALSE(res.timed_out);  // a hang is a failure, not a blocked CI job
  REQUIRE(res.ranks[0].exit_code == 0);
  REQUIRE(res.ranks[1].exit_code == 0);
  std::vector<RankRun> runs(kWorld);
  const Scenario s = make_scenario(name);
  for (int r = 0; r < kWorld; ++r) {
    runs[static_cast<size_t>(r)].stats = json::parse(slurp(dir + "/stats-r" + std::to_string(r) + ".json"));
    for (size_t w = 0; w < s.windows.size(); ++w) {
      std::vector<at::Tensor> v, g;
      torch::load(v, params_file(dir, r, w));
      torch::load(g, params_file(dir, r, w, "grads"));
      runs[static_cast<size_t>(r)].params.push_back(v);
      runs[static_cast<size_t>(r)].grads.push_back(g);
    }
  }
  return cache.emplace(name, std::move(runs)).first->second;
}

struct Reference {
  std::vector<std::vector<at::Tensor>> params;  // after each window
  std::vector<std::vector<at::Tensor>> grads;   // each window's full-batch gradient
  std::vector<double> losses;
};

// The single-process full-batch updates: one SGD step per global window on ATen's mean loss over
// the whole window. `grads_of` (optional) replaces the gradient, for the deliberately wrong one.
Reference reference_updates(const Scenario& s,
                            std::function<std::vector<at::Tensor>(torch::jit::Module&, const Batch&)> grads_of = {}) {
  auto m = clone_module(s.model);
  auto params = trainable(m);
  Reference out;
  for (const auto& [start, count] : s.windows) {
    const Batch window = s.data.slice(start, count);
    double loss = 0;
    const auto g = grads_of ? grads_of(m, window) : reference_gradients(m, window, s.reference_kind, s.loss.ignore_index, &loss);
    out.losses.push_back(loss);
    out.grads.push_back(g);
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) params[i].sub_(g[i] * s.lr);
    out.params.push_back(snapshot(params));
  }
  return out;
}

// Window w's gradient (from one rank) and updated parameters (from one rank) against the
// single-process reference: both within 1e-5 relative, each reported as a figure.
void check_matches_reference(const RankRun& grads_from, const RankRun& params_from, const Reference& ref, size_t w,
                             const std::string& what, const std::string& reference_name = "full batch") {
  const auto grad_vs_ref = compare_tensors(grads_from.grads[w], ref.grads[w]);
  report(what + ": gradient rel vs " + reference_name, grad_vs_ref.max_rel);
  CHECK(grad_vs_ref.max_rel <= 1e-5);
  const auto vs_ref = compare_tensors(params_from.params[w], ref.params[w]);
  report(what + ": update rel vs " + reference_name, vs_ref.max_rel);
  CHECK(vs_ref.max_rel <= 1e-5);
}

}  // namespace

TEST_CASE("dist worker", "[.]") {
  // Runs only inside a rank launched by the cases below (hidden: ctest never runs it directly).
  const char* name = std::getenv("ACCUMPLAN_DIST_SCENARIO");
  const char* dir = std::getenv("ACCUMPLAN_DIST_OUT");
  if (!name || !dir) return;
  run_worker(name, dir);
}

TEST_CASE("2 ranks, samples: each window's update equals the single-process full-batch update — full, short (4+3) "
          "and one-sample (1+0) windows weighted by their global count",
          "[dist][samples]") {
  const Scenario s = make_scenario("samples");
  const auto& runs = run_scenario("samples");
  const Reference ref = reference_updates(s);
  const std::vector<int64_t> global = {10, 7, 1};
  const std::vector<std::vector<int64_t>> local = {{5, 5}, {4, 3}, {1, 0}};
  for (size_t w = 0; w < s.windows.size(); ++w) {
    INFO("window " << w);
    for (int r = 0; r < kWorld; ++r) {
      const json& st = runs[static_cast<size_t>(r)].stats["windows"][w];
      CHECK(st["samples"] == global[w]);
      CHECK(st["units"] == global[w]);
      CHECK(st["local_samples"] == local[w][static_cast<size_t>(r)]);
      CHECK(st["stepped"] == true);
      CHECK(std::abs(st["loss"].get<double>() - ref.losses[w]) <= 1e-5 * std::abs(ref.losses[w]));
    }
    const std::string what = "dist samples window " + std::to_string(w) + " (" + std::to_string(global[w]) + " samples)";
    check_matches_reference(runs[0], runs[0], ref, w, what);
    // Same all-reduced gradient, same SGD: the replicas are bitwise equal, not merely close.
    CHECK(compare_tensors(runs[0].params[w], runs[1].params[w]).max_abs == 0.0);
  }
  CHECK(runs[0].stats["samples_seen"] == 18);
  CHECK(runs[1].stats["samples_seen"] == 18);
}

TEST_CASE("2 ranks, tokens: weighted by the global valid-token count (32 on rank 0, 4 on rank 1), not per-rank means",
          "[dist][tokens]") {
  const Scenario s = make_scenario("tokens");
  const auto& runs = run_scenario("tokens");
  const Reference ref = reference_updates(s);
  CHECK(runs[0].stats["windows"][0]["units"] == 36);
  CHECK(runs[1].stats["windows"][0]["units"] == 36);
  check_matches_reference(runs[1], runs[0], ref, 0, "dist tokens (32 + 4 valid tokens)");
  CHECK(compare_tensors(runs[0].params[0], runs[1].params[0]).max_abs == 0.0);
  CHECK(std::abs(runs[1].stats["windows"][0]["loss"].get<double>() - ref.losses[0]) <= 1e-5 * std::abs(ref.losses[0]));

  // What each rank normalising by its own tokens and averaging the ranks (DDP's mean) would give:
  // far outside the tolerance, so the comparison above can tell the two apart.
  const Reference wrong = reference_updates(s, [&](torch::jit::Module& m, const Batch& window) {
    std::vector<at::Tensor> sum;
    for (int r = 0; r < kWorld; ++r) {
      const auto g = reference_gradients(m, stride_window(window, r, kWorld), "ce_tokens", s.loss.ignore_index);
      for (size_t i = 0; i < g.size(); ++i) {
        if (sum.size() <= i) sum.push_back(g[i] / kWorld); else sum[i] = sum[i] + g[i] / kWorld;
      }
    }
    return sum;
  });
  const double wrong_rel = compare_tensors(wrong.grads[0], ref.grads[0]).max_rel;
  report("dist tokens: per-rank token means averaged over ranks: gradient rel vs full batch", wrong_rel);
  CHECK(wrong_rel > 1e-2);
}

TEST_CASE("2 ranks, OOM injected on rank 1 only: both ranks recover, re-plan alike, replay, and match the no-OOM update",
          "[dist][oom]") {
  const Scenario s = make_scenario("oom");
  const auto& runs = run_scenario("oom");
  const Reference ref = reference_updates(s);
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r);
    const json& st = runs[static_cast<size_t>(r)].stats;
    CHECK(st["windows"][0]["oom_recoveries"] == 1);
    CHECK(st["windows"][0]["samples"] == 10);
    // Failing size 3 (rank 1's first microbatch): every rank re-plans below it, to 2,2,1.
    CHECK(st["final_sizes"] == json::array({2, 2, 1}));
    CHECK(st["windows"][0]["microbatch_sizes"] == json::array({2, 2, 1}));
    bool logged = false;
    for (const auto& l : st["log"]) logged = logged || l.get<std::string>().find("out of memory") != std::string::npos;
    CHECK(logged);
    // 1 count reduce + 1 agreement (the first attempt, which failed) + 1 (the replay).
    CHECK(st["windows"][0]["counter_all_reduces"] == 3);
    CHECK(st["windows"][0]["gradient_exchanges"] == 1);
  }
  CHECK(compare_tensors(runs[0].params[0], runs[1].params[0]).max_abs == 0.0);
  check_matches_reference(runs[1], runs[1], ref, 0, "dist OOM on rank 1, recovered", "no-OOM full batch");
}

TEST_CASE("2 ranks, packed ragged windows with an OOM on rank 1: both re-pack under the same budget and match the "
          "full-window per-token update", "[dist][packing][oom]") {
  const Scenario s = make_scenario("packed");
  const auto& runs = run_scenario("packed");
  const Reference ref = reference_updates(s);
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r);
    const json& st = runs[static_cast<size_t>(r)].stats;
    CHECK(st["windows"][0]["oom_recoveries"] == 1);
    CHECK(st["windows"][1]["oom_recoveries"] == 0);
    CHECK(st["final_token_budget"] == 21);  // below the 22 padded tokens that failed, on both ranks
    CHECK(st["samples_seen"] == 14);
    // Re-packed under 21: rank 0 [16] [12] [9,5] [2], rank 1 [15] [11] [8,7] [3].
    CHECK(st["windows"][0]["microbatch_sizes"] == json::array({1, 1, 2, 1}));
    CHECK(st["windows"][0]["rounds"] == 4);
    // N is the window's valid tokens over both ranks: 44 + 44 in window 0.
    CHECK(st["windows"][0]["units"] == 88);
    // 1 count reduce; attempt 0: 1 round-count reduce + 1 agreement (its second microbatch
    // failed on rank 1); the replay: 1 round-count reduce + 1 agreement.
    CHECK(st["windows"][0]["counter_all_reduces"] == 5);
    CHECK(st["windows"][0]["gradient_exchanges"] == 1);
  }
  CHECK(compare_tensors(runs[0].params[0], runs[1].params[0]).max_abs == 0.0);
  check_matches_reference(runs[0], runs[1], ref, 0, "dist packed, OOM on rank 1, recovered");
  check_matches_reference(runs[0], runs[0], ref, 1, "dist packed, second window");
}

TEST_CASE("2 ranks, windows by tokens (--target-tokens): shares above the per-rank batch, weighted by the global "
          "valid tokens, match the full-window update", "[dist][packing][target-tokens]") {
  const Scenario s = make_scenario("token-windows");
  // The windows the scenario hands out are the plan's own (token_windows over each sequence's valid tokens).
  CHECK(plan_windows(s.data, s.plan, -100) == s.windows);
  const auto& runs = run_scenario("token-windows");
  const Reference ref = reference_updates(s);
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r);
    const json& st = runs[static_cast<size_t>(r)].stats;
    CHECK(st["windows"][0]["local_samples"] == 3);
    CHECK(st["windows"][1]["local_samples"] == 4);
    CHECK(st["windows"][0]["units"] == 62);
    CHECK(st["windows"][1]["units"] == 59);
    CHECK(st["samples_seen"] == 14);
  }
  for (size_t w = 0; w < 2; ++w) check_matches_reference(runs[0], runs[1], ref, w, "dist token windows");
}

TEST_CASE("2 ranks: one gradient exchange per window, one counter reduce for the counts and one agreement after "
          "the microbatches, whatever their number", "[dist][counts]") {
  const auto& runs = run_scenario("samples");
  // Windows of 5+5 (microbatches 2,2,1: 3 rounds), 4+3 (2,2 and 2,1: 2 rounds), 1+0 (1 round;
  // rank 1 joins it empty).
  const std::vector<int64_t> rounds = {3, 2, 1};
  for (int r = 0; r < kWorld; ++r) {
    for (size_t w = 0; w < rounds.size(); ++w) {
      INFO("rank " << r << " window " << w);
      const json& st = runs[static_cast<size_t>(r)].stats["windows"][w];
      CHECK(st["rounds"] == rounds[w]);
      CHECK(st["counter_all_reduces"] == 2);
      CHECK(st["gradient_exchanges"] == 1);  // not one per microbatch (that would be 3, 2, 1)
      CHECK(st["tensor_all_reduces"] == 1);  // 4 float tensors + the loss sum: one flat bucket
    }
  }
  CHECK(runs[1].stats["windows"][2]["microbatch_sizes"] == json::array());
}

TEST_CASE("2 ranks that differ (shares 3 and 9, their own microbatches): each window's update equals one process "
          "training the whole window, float64, per-sample and per-token losses", "[dist][ranks]") {
  for (const std::string name : {"ranks-samples", "ranks-tokens"}) {
    INFO(name);
    const Scenario s = make_scenario(name);
    const auto& runs = run_scenario(name);
    const Reference ref = reference_updates(s);
    for (size_t w = 0; w < s.windows.size(); ++w) {
      INFO("window " << w);
      const auto grads = compare_tensors(runs[1].grads[w], ref.grads[w]);
      const auto params = compare_tensors(runs[0].params[w], ref.params[w]);
      report("dist " + name + " window " + std::to_string(w) + ": update rel vs one process", params.max_rel);
      CHECK(grads.max_rel <= 1e-9);
      CHECK(params.max_rel <= 1e-9);
      CHECK(compare_tensors(runs[0].params[w], runs[1].params[w]).max_abs == 0.0);
      for (int r = 0; r < kWorld; ++r) {
        const json& st = runs[static_cast<size_t>(r)].stats["windows"][w];
        CHECK(st["samples"] == s.windows[w].second);
        CHECK(std::abs(st["loss"].get<double>() - ref.losses[w]) <= 1e-9 * std::abs(ref.losses[w]));
      }
    }
  }
  // Each rank ran its own share and split: rank 0 three samples as 2,1, rank 1 nine as 4,4,1.
  const auto& samples = run_scenario("ranks-samples");
  CHECK(samples[0].stats["windows"][0]["local_samples"] == 3);
  CHECK(samples[0].stats["windows"][0]["microbatch_sizes"] == json::array({2, 1}));
  CHECK(samples[1].stats["windows"][0]["local_samples"] == 9);
  CHECK(samples[1].stats["windows"][0]["microbatch_sizes"] == json::array({4, 4, 1}));
  CHECK(samples[0].stats["windows"][0]["rounds"] == 3);
  CHECK(samples[0].stats["windows"][1]["local_samples"] == 1);  // floor(5·3/12) of the short window
  CHECK(samples[1].stats["windows"][1]["local_samples"] == 4);
  CHECK(samples[1].stats["windows"][0]["gradient_exchanges"] == 1);
}
