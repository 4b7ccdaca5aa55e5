// dist/communicator.h — what the executor needs from data parallelism, and nothing more.
//
// What it is: a rank in a group of W that can (1) sum a few integer counters across ranks in one
// collective — the window's samples and valid tokens before the first backward, and an OOM flag
// at a fixed point per microbatch so every rank learns of any rank's OOM in the same place — and
// (2) sum the gradients across ranks once per window, flattened into a few buckets rather than
// one collective per parameter. Implementations: `local` (W = 1, no communication), `rehearsal`
// (W = 1 holding a rank's exchange buffers, for planning windows) and `gloo`
// (PyTorch's c10d ProcessGroupGloo over a TCPStore rendezvous, configured by the variables
// `torchrun --no_python` sets: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).
// Every collective is counted so tests can assert one gradient exchange per window.
// What it is not: a data loader or DDP. Sharding is the caller's (`accumplan run`): rank r takes
// samples r, r+W, r+2W, ... of every global window (strided, so a short last window stays
// balanced to within one sample); the executor only needs every rank to call it once per window.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "accumplan/window_loop.h"  // kGradientBucketBytes

namespace accumplan {

struct CollectiveCounts {
  int64_t counter_all_reduces = 0;   // integer counters (counts, OOM flags)
  int64_t gradient_exchanges = 0;    // calls of all_reduce_gradients (expected: one per window)
  int64_t tensor_all_reduces = 0;    // bucket collectives issued by those exchanges
  int64_t parameter_broadcasts = 0;  // calls of broadcast_from_owners (sharded optimizer state: one per step)
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string backend() const = 0;  // "local" | "gloo" | "nccl"
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Whether the executor sends its gradients through all_reduce_gradients: two or more ranks, or
  // a rehearsal (make_rehearsal_communicator).
  virtual bool exchanges() const { return world_size() > 1; }

  // Element-wise sum of `values` over all ranks, in one collective.
  virtual std::vector<int64_t> all_reduce_counters(const std::vector<int64_t>& values) = 0;
  // Sums every tensor in place over all ranks; tensors are flattened into buckets of at most
  // `bucket_bytes` so a model with 200 parameters costs a few collectives, not 200.
  virtual void all_reduce_gradients(std::vector<at::Tensor>& tensors) = 0;
  // Optimizer state sharded over the ranks (ZeRO-1): tensors[i] takes rank owners[i]'s values on
  // every rank, each owner's tensors flattened into one broadcast (of one dtype).
  virtual void broadcast_from_owners(std::vector<at::Tensor>& tensors, const std::vector<int64_t>& owners) = 0;

  const CollectiveCounts& counts() const { return counts_; }

 protected:
  CollectiveCounts counts_;
};

// The standard variables of `torchrun --no_python`. nullopt when WORLD_SIZE is unset; InputError
// naming the variable when one is set but another is missing or malformed.
struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};
std::optional<DistEnv> dist_env_from_environment();

std::unique_ptr<Communicator> make_local_communicator();

// One process that makes a rank's gradient exchange and parameter broadcast with no peer (world
// size 1, exchanges() true): the same buckets and flat buffers, no collective. Planning windows
// for W >= 2 ranks run with it, so what they measure holds what every rank's window holds.
std::unique_ptr<Communicator> make_rehearsal_communicator(int64_t bucket_bytes = kGradientBucketBytes);

// Joins the c10d group: TCPStore rendezvous (rank 0 serves on MASTER_ADDR:MASTER_PORT),
// ProcessGroupGloo bound on THIS host's interface: GLOO_SOCKET_IFNAME if set, loopback when
// MASTER_ADDR is loopback, else Gloo's default device (this host's name). `timeout` bounds every
// collective and the rendezvous, so a peer that died turns into an error instead of a hang.
// InputError when the rendezvous fails (naming MASTER_ADDR:MASTER_PORT). world_size 1: local.
std::unique_ptr<Communicator> make_gloo_communicator(const DistEnv& env, std::chrono::milliseconds timeout,
                                                     int64_t bucket_bytes = kGradientBucketBytes);

// The same on CUDA with ProcessGroupNCCL (counters and buckets on cuda:LOCAL_RANK). Compiled only
// when this LibTorch has CUDA and NCCL (USE_C10D_NCCL); otherwise BackendNotBuiltError.
std::unique_ptr<Communicator> make_nccl_communicator(const DistEnv& env, std::chrono::milliseconds timeout,
                                                     int64_t bucket_bytes = kGradientBucketBytes);

}  // namespace accumplan
