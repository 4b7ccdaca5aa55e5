// dist_harness.h — launches the ranks of a data-parallel test as separate processes on 127.0.0.1,
// each under a watchdog, and the scenarios those ranks and the single-process references share.
//
// What it is: `free_port()` (bind port 0, read the port the kernel picked), `launch_ranks()` (fork
// + exec of a program once per rank with RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT set,
// as `torchrun --no_python` sets them; stdout and stderr to a log file per rank; the parent waits
// at most a deadline, then SIGKILLs every rank still running and reports `timed_out`, so a hang
// FAILS a test instead of blocking CI), and `make_scenario()` (model, data, global windows, plan):
// built deterministically from seeds, so the worker processes and the parent's reference see the
// same numbers without passing tensors around.
// Processes are exec'd fresh rather than forked from the test: a fork of a process that already
// ran LibTorch inherits OpenMP and allocator state in an undefined condition; exec starts clean.
// What it is not: torchrun (no restarts, no elastic membership), nor a test.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <torch/script.h>
#include <torch/torch.h>

#include "accumplan/schema.h"
#include "../executor/executor_fixtures.h"
#include "runtime/batch.h"
#include "runtime/loss.h"

namespace accumplan::test {

inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("could not bind a port on 127.0.0.1");
  }
  const int port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

struct RankResult {
  int exit_code = -1;  // -1: killed (by the watchdog or a signal)
  std::string log;     // path of its stdout+stderr
};

struct LaunchResult {
  std::vector<RankResult> ranks;
  bool timed_out = false;
  bool all_ok() const {
    for (const auto& r : ranks) {
      if (r.exit_code != 0) return false;
    }
    return !timed_out;
  }
};

// Runs `argv` (argv[0] = the program) once per rank, `extra_env` added ("NAME=value"), logs to
// `dir`/rank-R.log. Waits at most `deadline_s` for all; once one rank fails, the others get 10 s
// to fail on their own (their group timeout) before they are killed too.
inline LaunchResult launch_ranks(const std::vector<std::string>& argv, int world_size, const std::string& dir,
                                 const std::vector<std::string>& extra_env, int deadline_s = 60,
                                 const std::vector<int>& only_ranks = {}) {
  const int port = free_port();
  LaunchResult out;
  out.ranks.resize(static_cast<size_t>(world_size));
  std::vector<pid_t> pids(static_cast<size_t>(world_size), -1);
  for (int r = 0; r < world_size; ++r) {
    const std::string log = dir + "/rank-" + std::to_string(r) + ".log";
    out.ranks[static_cast<size_t>(r)].log = log;
    if (!only_ranks.empty() && std::find(only_ranks.begin(), only_ranks.end(), r) == only_ranks.end()) {
      out.ranks[static_cast<size_t>(r)].exit_code = 0;  // not launched: a missing peer on purpose
      continue;
    }
    std::vector<std::string> env = {"RANK=" + std::to_string(r), "LOCAL_RANK=" + std::to_string(r),
                                    "WORLD_SIZE=" + std::to_string(world_size), "MASTER_ADDR=127.0.0.1",
                                    "MASTER_PORT=" + std::to_string(port), "OMP_NUM_THREADS=1"};
    env.insert(env.end(), extra_env.begin(), extra_env.end());
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        ::close(fd);
      }
      for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    pids[static_cast<size_t>(r)] = pid;
  }
  using clock = std::chrono::steady_clock;
  auto deadline = clock::now() + std::chrono::seconds(deadline_s);
  bool failure_seen = false;
  for (;;) {
    bool running = false;
    for (int r = 0; r < world_size; ++r) {
      pid_t& pid = pids[static_cast<size_t>(r)];
      if (pid < 0) continue;
      int status = 0;
      const pid_t got = ::waitpid(pid, &status, WNOHANG);
      if (got == 0) {
        running = true;
        continue;
      }
      out.ranks[static_cast<size_t>(r)].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      pid = -1;
      if (out.ranks[static_cast<size_t>(r)].exit_code != 0 && !failure_seen) {
        failure_seen = true;
        deadline = std::min(deadline, clock::now() + std::chrono::seconds(10));
      }
    }
    if (!running) break;
    if (clock::now() > deadline) {
      out.timed_out = !failure_seen;
      for (pid_t& pid : pids) {
        if (pid < 0) continue;
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
        pid = -1;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Scenarios: the same model, data, windows and plan in every rank and in the reference.

struct Scenario {
  std::string name;
  torch::jit::Module model;
  Batch data;                                          // every sample, in order
  std::vector<std::pair<int64_t, int64_t>> windows;    // global windows [start, count)
  Plan plan;                                           // per-rank plan for world_size ranks
  LossConfig loss;
  std::string reference_kind;                          // reference_gradients' kind
  double lr = 0.1;                                     // SGD, no momentum
};

constexpr int kWorld = 2;

inline Plan per_rank_plan(std::vector<int64_t> sizes, int world, const std::string& loss) {
  Plan p = make_plan_with(std::move(sizes), loss);
  p.world_size = world;
  p.target_batch = p.per_rank_batch * world;
  return p;
}

// A plan whose ranks differ: rank r takes shares[r] of each window, split as its sizes[r].
inline Plan ranks_plan(const std::vector<std::vector<int64_t>>& sizes, const std::string& loss) {
  Plan p = per_rank_plan(sizes[0], static_cast<int>(sizes.size()), loss);
  p.target_batch = 0;
  for (const auto& s : sizes) {
    RankWindow w;
    w.microbatch_sizes = s;
    for (int64_t n : s) w.per_rank_batch += n;
    w.max_micro_batch = *std::max_element(s.begin(), s.end());
    p.target_batch += w.per_rank_batch;
    p.ranks.push_back(w);
  }
  return p;
}

// The scenario in float64: parameters and floating inputs, so an update matches to 1e-9.
inline void in_float64(Scenario& s) {
  s.model.to(at::kDouble);
  for (auto& t : s.data.inputs) {
    if (t.is_floating_point()) t = t.to(at::kDouble);
  }
}

inline Scenario make_scenario(const std::string& name) {
  Scenario s;
  s.name = name;
  if (name == "samples") {
    // B = 10 on 2 ranks (5 each, microbatches 2,2,1), then a short window of 7 (4 and 3) and one
    // of 1 (rank 1 gets nothing and runs an empty round): 18 samples, 3 windows.
    s.model = make_mlp(1);
    s.data = classification_batch(18, 11);
    s.windows = {{0, 10}, {10, 7}, {17, 1}};
    s.plan = per_rank_plan({2, 2, 1}, kWorld, "cross_entropy");
    s.loss.kind = "cross_entropy";
    s.reference_kind = "ce";
  } else if (name == "tokens") {
    // 8 sequences of 8 tokens; the odd ones (rank 1's share) keep 1 valid token each, the even
    // ones (rank 0's) all 8: 32 valid tokens on rank 0, 4 on rank 1. Per-rank means would weight
    // rank 1's 4 tokens like rank 0's 32.
    s.model = make_tiny_lm(2);
    s.data = token_batch(8, 8, 13);
    for (int64_t i = 1; i < 8; i += 2) s.data.target[i].slice(0, 1).fill_(-100);
    s.windows = {{0, 8}};
    s.plan = per_rank_plan({3, 1}, kWorld, "cross_entropy");
    s.loss.kind = "cross_entropy";
    s.loss.normalization = Normalization::Tokens;
    s.loss.ignore_index = -100;
    s.reference_kind = "ce_tokens";
  } else if (name == "oom") {
    // B = 10 on 2 ranks, microbatches 3,2; rank 1 runs out of memory in its first microbatch.
    s.model = make_mlp(1);
    s.data = classification_batch(10, 21);
    s.windows = {{0, 10}};
    s.plan = per_rank_plan({3, 2}, kWorld, "cross_entropy");
    s.loss.kind = "cross_entropy";
    s.reference_kind = "ce";
  } else if (name == "packed") {
    // Ragged data under a packed plan (token budget 24): 14 sequences of known lengths, windows of
    // 10 (5 per rank) and 4 (2 each). Window 0 strided: rank 0 holds lengths 16,12,9,2,5 and
    // rank 1 3,7,15,11,8 — packed to [16] [12,9] [5,2] and [15] [11,8] [7,3]. Rank 1 runs out of
    // memory in its second microbatch (22 padded tokens): both ranks re-pack under 21.
    const std::vector<int64_t> lengths{16, 3, 12, 7, 9, 15, 2, 11, 5, 8, 13, 4, 6, 10};
    torch::manual_seed(17);
    std::vector<at::Tensor> sequences, targets;
    for (int64_t l : lengths) {
      sequences.push_back(torch::randint(0, 7, {l}, torch::kLong));
      targets.push_back(torch::randint(0, 7, {l}, torch::kLong));
    }
    s.model = make_tiny_lm(2);
    s.data = ragged_batch(sequences, targets);
    s.windows = {{0, 10}, {10, 4}};
    s.plan = per_rank_plan({5}, kWorld, "cross_entropy");
    s.plan.tokens = TokenBudget{24, 16, 16};
    s.loss.kind = "cross_entropy";
    s.loss.normalization = Normalization::Tokens;
    s.reference_kind = "ce_tokens";  // ATen's mean over the valid tokens of the padded window
  } else if (name == "token-windows") {
    // The same 14 sequences under a --target-tokens plan of 60 valid tokens per update (every
    // target valid: a sequence's valid tokens are its length): windows of 16+3+12+7+9+15 = 62
    // tokens (6 sequences, 3 per rank) and the 8 that remain (59, 4 per rank), each share larger
    // than the sample fields' per-rank batch of 2.
    s = make_scenario("packed");
    s.plan = per_rank_plan({2}, kWorld, "cross_entropy");
    s.plan.tokens = TokenBudget{24, 16, 16, 60};
    s.windows = {{0, 6}, {6, 8}};
  } else if (name == "ranks-samples") {
    // Ranks that differ, float64: of each window of 12, rank 0 takes the first 3 as 2,1 and rank 1
    // the last 9 as 4,4,1 (three rounds: rank 0 runs an empty one); then a short window of 5
    // (1 and 4, in proportion).
    s.model = make_mlp(3);
    s.data = classification_batch(17, 29);
    in_float64(s);
    s.windows = {{0, 12}, {12, 5}};
    s.plan = ranks_plan({{2, 1}, {4, 4, 1}}, "cross_entropy");
    s.loss.kind = "cross_entropy";
    s.reference_kind = "ce";
  } else if (name == "ranks-tokens") {
    // Ranks that differ, per-token loss, float64: 10 sequences of 6 tokens, rank 0 takes 2 (one
    // microbatch), rank 1 takes 8 as 3,3,2; rank 1's sequences keep 2 valid tokens each.
    s.model = make_tiny_lm(5);
    s.model.to(at::kDouble);
    s.data = token_batch(10, 6, 31);
    for (int64_t i = 2; i < 10; ++i) s.data.target[i].slice(0, 2).fill_(-100);
    s.windows = {{0, 10}};
    s.plan = ranks_plan({{2}, {3, 3, 2}}, "cross_entropy");
    s.loss.kind = "cross_entropy";
    s.loss.normalization = Normalization::Tokens;
    s.loss.ignore_index = -100;
    s.reference_kind = "ce_tokens";
  } else {
    throw std::runtime_error("unknown scenario " + name);
  }
  return s;
}

}  // namespace accumplan::test
