// dist/communicator.cpp — local, Gloo and (CUDA builds with NCCL) NCCL communicators. See
// communicator.h. Not the executor's use of them (executor.cpp).
#include "dist/communicator.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <type_traits>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
// The Gloo shim: ProcessGroupGloo.hpp includes gloo's own headers, which Debian ships
// (libgloo-dev) but PyTorch's pip wheels do not (2.11+cu130 has no torch/include/gloo; its
// build stopped here on the H200). Without them the Gloo communicator is not built and a
// multi-process CPU run is refused with how to get it; NCCL, the GPU backend, is unaffected.
#if __has_include(<gloo/algorithm.h>)
#define ACCUMPLAN_HAS_GLOO 1
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#else
#define ACCUMPLAN_HAS_GLOO 0
#endif
#if defined(USE_C10D_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <torch/version.h>
// ProcessGroupNCCL::shutdown() is public from LibTorch 2.4 on (the version shim for NCCL groups).
#define ACCUMPLAN_NCCL_HAS_SHUTDOWN (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4))
#endif

#include "accumplan/errors.h"

namespace accumplan {
namespace {

class LocalCommunicator final : public Communicator {
 public:
  std::string backend() const override { return "local"; }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::vector<int64_t> all_reduce_counters(const std::vector<int64_t>& values) override {
    ++counts_.counter_all_reduces;
    return values;
  }
  void all_reduce_gradients(std::vector<at::Tensor>&) override { ++counts_.gradient_exchanges; }
  void broadcast_from_owners(std::vector<at::Tensor>&, const std::vector<int64_t>&) override {
    ++counts_.parameter_broadcasts;
  }
};

// A flat buffer's memory back to the allocator now, whoever still holds the tensor: a collective's
// work object outlives wait() on the backend's worker thread, so the buffer would otherwise stay
// into the optimizer step for as long as that thread takes to drop it.
void release(at::Tensor& flat) { flat.storage().unsafeGetStorageImpl()->reset(); }

// The exchange's buckets: tensors of one dtype, in order, up to bucket_bytes each, one flat buffer
// and one collective per bucket (25 MiB buckets, DDP's default, make resnet18's 62 parameters, 45
// MiB in float32, two collectives instead of 62), summed back into the tensors in place.
void sum_in_buckets(std::vector<at::Tensor>& tensors, int64_t bucket_bytes,
                    const std::function<void(std::vector<at::Tensor>&)>& all_reduce) {
  std::vector<std::pair<std::string, int64_t>> sizes;
  for (const at::Tensor& t : tensors) sizes.emplace_back(c10::toString(t.scalar_type()), static_cast<int64_t>(t.nbytes()));
  for (const std::vector<size_t>& bucket : gradient_buckets(sizes, bucket_bytes)) {
    std::vector<at::Tensor> flat_parts;
    for (size_t k : bucket) flat_parts.push_back(tensors[k].reshape({-1}));
    std::vector<at::Tensor> flat = {at::cat(flat_parts)};
    flat_parts.clear();
    all_reduce(flat);
    int64_t offset = 0;
    for (size_t k : bucket) {
      const int64_t n = tensors[k].numel();
      tensors[k].copy_(flat[0].narrow(0, offset, n).view_as(tensors[k]));
      offset += n;
    }
    release(flat[0]);
  }
}

// Each owner's tensors, by dtype, flattened into one buffer that `broadcast` sends from the owner;
// every rank walks the same order and takes the values back.
void broadcast_by_owner(std::vector<at::Tensor>& tensors, const std::vector<int64_t>& owners,
                        const std::function<void(std::vector<at::Tensor>&, int64_t owner)>& broadcast) {
  const int64_t last_owner = owners.empty() ? -1 : *std::max_element(owners.begin(), owners.end());
  for (int64_t owner = 0; owner <= last_owner; ++owner) {
    std::map<at::ScalarType, std::vector<size_t>> by_dtype;
    for (size_t k = 0; k < tensors.size(); ++k) {
      if (owners.at(k) == owner) by_dtype[tensors[k].scalar_type()].push_back(k);
    }
    for (const auto& [dtype, ks] : by_dtype) {
      std::vector<at::Tensor> parts;
      for (size_t k : ks) parts.push_back(tensors[k].detach().reshape({-1}));
      std::vector<at::Tensor> flat = {at::cat(parts)};
      parts.clear();
      broadcast(flat, owner);
      int64_t offset = 0;
      for (size_t k : ks) {
        const int64_t n = tensors[k].numel();
        tensors[k].detach().copy_(flat[0].narrow(0, offset, n).view_as(tensors[k]));
        offset += n;
      }
      release(flat[0]);
    }
  }
}

// One process that makes a rank's exchange and broadcast with no peer: the same buckets and flat
// buffers, no collective, so planning windows for W ranks hold what each rank will hold.
class RehearsalCommunicator final : public Communicator {
 public:
  explicit RehearsalCommunicator(int64_t bucket_bytes) : bucket_bytes_(bucket_bytes) {}
  std::string backend() const override { return "rehearsal"; }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  bool exchanges() const override { return true; }
  std::vector<int64_t> all_reduce_counters(const std::vector<int64_t>& values) override {
    ++counts_.counter_all_reduces;
    return values;
  }
  void all_reduce_gradients(std::vector<at::Tensor>& tensors) override {
    ++counts_.gradient_exchanges;
    sum_in_buckets(tensors, bucket_bytes_, [&](std::vector<at::Tensor>&) { ++counts_.tensor_all_reduces; });
  }
  void broadcast_from_owners(std::vector<at::Tensor>& tensors, const std::vector<int64_t>& owners) override {
    ++counts_.parameter_broadcasts;
    broadcast_by_owner(tensors, owners, [](std::vector<at::Tensor>&, int64_t) {});
  }

 private:
  int64_t bucket_bytes_;
};

// Joins the TCPStore rendezvous; rank 0 serves it. `timeout` bounds waiting for the other ranks
// (the store is built with waitWorkers, so rank 0 returns only once all W have connected).
// Under torchrun (TORCHELASTIC_USE_AGENT_STORE=True) the launcher's agent already serves the store
// on MASTER_PORT: every rank is a client, under the agent's "/worker/attempt_N" prefix, as
// torch.distributed's env:// rendezvous does; serving it again fails with "Address already in use".
[[maybe_unused]] c10::intrusive_ptr<c10d::Store> join_store(const DistEnv& env, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<std::uint16_t>(env.master_port);
  so.numWorkers = static_cast<std::size_t>(env.world_size);
  so.timeout = timeout;
  const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  if (agent && std::string(agent) == "True") {
    so.isServer = false;
    so.waitWorkers = false;
    const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
    return c10::make_intrusive<c10d::PrefixStore>(
        "/worker/attempt_" + std::string(attempt && *attempt ? attempt : "0"),
        c10::make_intrusive<c10d::TCPStore>(env.master_addr, so));
  }
  so.isServer = env.rank == 0;
  so.waitWorkers = true;
  return c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
}

#if ACCUMPLAN_HAS_GLOO
bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

// The network interface Gloo binds on THIS host. Not MASTER_ADDR's: on a second node MASTER_ADDR
// resolves to the first node, an address this host cannot bind. Order, as torch.distributed:
// GLOO_SOCKET_IFNAME names the interface; a loopback MASTER_ADDR means one machine, so loopback;
// otherwise Gloo's default device (this host's hostname, falling back to loopback).
std::shared_ptr<::gloo::transport::Device> gloo_device(const DistEnv& env) {
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname && *ifname) return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  if (is_loopback(env.master_addr)) return c10d::ProcessGroupGloo::createDeviceForHostname(env.master_addr);
  return c10d::ProcessGroupGloo::createDefaultDevice();
}
#endif

// One c10d group of either backend (ProcessGroupGloo, ProcessGroupNCCL): the same allreduce(vector)
// call in LibTorch 1.13 and 2.x. `device` is where the counters' tensor lives (NCCL: the GPU).
template <typename Group>
class C10dCommunicator final : public Communicator {
 public:
  C10dCommunicator(std::string backend, const DistEnv& env, c10::intrusive_ptr<c10d::Store> store,
                   c10::intrusive_ptr<Group> group, at::Device device, int64_t bucket_bytes)
      : backend_(std::move(backend)), env_(env), bucket_bytes_(bucket_bytes), device_(device),
        store_(std::move(store)), group_(std::move(group)) {}

  // An NCCL group must be shut down before it is destroyed: LibTorch 2.4 and later warn "process
  // group has NOT been destroyed" otherwise, and a peer can block at exit. Gloo needs nothing.
  ~C10dCommunicator() override {
#if defined(USE_C10D_NCCL) && ACCUMPLAN_NCCL_HAS_SHUTDOWN
    if constexpr (std::is_same_v<Group, c10d::ProcessGroupNCCL>) {
      try {
        group_->shutdown();
      } catch (...) {
        // Destructors must not throw; the process is ending its use of the group either way.
      }
    }
#endif
  }
  C10dCommunicator(const C10dCommunicator&) = delete;
  C10dCommunicator& operator=(const C10dCommunicator&) = delete;

  std::string backend() const override { return backend_; }
  int rank() const override { return env_.rank; }
  int world_size() const override { return env_.world_size; }

  std::vector<int64_t> all_reduce_counters(const std::vector<int64_t>& values) override {
    std::vector<at::Tensor> t = {at::tensor(values, at::kLong).to(device_)};
    with_peers("agreement", [&] { group_->allreduce(t)->wait(); });
    ++counts_.counter_all_reduces;
    const at::Tensor r = t[0].to(at::kCPU).contiguous();
    return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
  }

  void all_reduce_gradients(std::vector<at::Tensor>& tensors) override {
    ++counts_.gradient_exchanges;
    sum_in_buckets(tensors, bucket_bytes_, [&](std::vector<at::Tensor>& flat) {
      with_peers("gradient exchange", [&] { group_->allreduce(flat)->wait(); });
      ++counts_.tensor_all_reduces;
    });
  }

  void broadcast_from_owners(std::vector<at::Tensor>& tensors, const std::vector<int64_t>& owners) override {
    ++counts_.parameter_broadcasts;
    broadcast_by_owner(tensors, owners, [&](std::vector<at::Tensor>& flat, int64_t owner) {
      c10d::BroadcastOptions options;
      options.rootRank = owner;
      with_peers("parameter broadcast", [&] { group_->broadcast(flat, options)->wait(); });
    });
  }

 private:
  // A collective that failed with the group is a peer's failure, said in one line naming this rank.
  template <typename F>
  void with_peers(const char* what, F&& collective) {
    try {
      collective();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw PeerError("rank " + std::to_string(env_.rank) + ": the " + what + " with the other ranks failed, so a peer " +
                      "exited or its connection dropped (its own log says why): " + first_line(e.what()));
    }
  }

  std::string backend_;
  DistEnv env_;
  int64_t bucket_bytes_;
  at::Device device_;
  // Declared before the group so it is destroyed after it: the group talks through the store.
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<Group> group_;
};

[[maybe_unused]] std::string join_failure(const DistEnv& env, const std::exception& e) {
  return "rank " + std::to_string(env.rank) + " could not join the process group at " + env.master_addr + ":" +
         std::to_string(env.master_port) + " (WORLD_SIZE " + std::to_string(env.world_size) + "): " + e.what();
}

int env_int(const char* name, bool required, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) {
    if (required) {
      throw InputError(std::string("WORLD_SIZE is set but ") + name +
                       " is not; launch with torchrun --no_python, or set RANK, WORLD_SIZE, MASTER_ADDR "
                       "and MASTER_PORT yourself");
    }
    return fallback;
  }
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > 1 << 20) {
    throw InputError(std::string(name) + "='" + v + "' is not a non-negative integer");
  }
  return static_cast<int>(x);
}

}  // namespace

std::optional<DistEnv> dist_env_from_environment() {
  const char* ws = std::getenv("WORLD_SIZE");
  if (!ws || !*ws) return std::nullopt;
  DistEnv env;
  env.world_size = env_int("WORLD_SIZE", true, 1);
  if (env.world_size < 1) throw InputError("WORLD_SIZE must be at least 1");
  env.rank = env_int("RANK", true, 0);
  if (env.rank >= env.world_size) {
    throw InputError("RANK " + std::to_string(env.rank) + " is not below WORLD_SIZE " + std::to_string(env.world_size));
  }
  env.local_rank = env_int("LOCAL_RANK", false, env.rank);
  if (env.world_size > 1) {
    const char* addr = std::getenv("MASTER_ADDR");
    if (!addr || !*addr) throw InputError("WORLD_SIZE > 1 needs MASTER_ADDR (the rank-0 host)");
    env.master_addr = addr;
    env.master_port = env_int("MASTER_PORT", true, 29500);
  }
  return env;
}

std::unique_ptr<Communicator> make_local_communicator() { return std::make_unique<LocalCommunicator>(); }

std::unique_ptr<Communicator> make_rehearsal_communicator(int64_t bucket_bytes) {
  return std::make_unique<RehearsalCommunicator>(bucket_bytes);
}

namespace {

// One rank of a c10d group of `Group` ("gloo", "nccl") with make_options()'s options, joined
// through the rendezvous store, its collectives on `device`; a failure is InputError naming the
// rendezvous.
template <class Group, class MakeOptions>
[[maybe_unused]] std::unique_ptr<Communicator> join_group(const std::string& backend, const DistEnv& env,
                                                          std::chrono::milliseconds timeout,
                                                          const MakeOptions& make_options, at::Device device,
                                                          int64_t bucket_bytes) {
  try {
    auto store = join_store(env, timeout);
    auto group = c10::make_intrusive<Group>(store, env.rank, env.world_size, make_options());
    return std::make_unique<C10dCommunicator<Group>>(backend, env, store, group, device, bucket_bytes);
  } catch (const std::exception& e) {
    throw InputError(join_failure(env, e));
  }
}

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(const DistEnv& env, std::chrono::milliseconds timeout,
                                                     int64_t bucket_bytes) {
  if (env.world_size == 1) return make_local_communicator();
#if ACCUMPLAN_HAS_GLOO
  auto options = [&] {
    auto o = c10d::ProcessGroupGloo::Options::create(timeout);
    o->devices.push_back(gloo_device(env));
    return o;
  };
  return join_group<c10d::ProcessGroupGloo>("gloo", env, timeout, options, at::Device(at::kCPU), bucket_bytes);
#else
  (void)timeout;
  (void)bucket_bytes;
  throw BackendNotBuiltError(
      "WORLD_SIZE " + std::to_string(env.world_size) + " on the CPU needs c10d's Gloo backend, which this accumplan "
      "was built without (its LibTorch ships no gloo headers, as PyTorch's pip wheels do not); build against "
      "Debian's LibTorch (apt-get install libtorch-dev libgloo-dev), or run on CUDA devices (NCCL)");
#endif
}

std::unique_ptr<Communicator> make_nccl_communicator(const DistEnv& env, std::chrono::milliseconds timeout,
                                                     int64_t bucket_bytes) {
  if (env.world_size == 1) return make_local_communicator();
#if defined(USE_C10D_NCCL)
  auto options = [&] {
    auto o = c10d::ProcessGroupNCCL::Options::create();
    o->timeout = timeout;
    return o;
  };
  const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
  return join_group<c10d::ProcessGroupNCCL>("nccl", env, timeout, options, device, bucket_bytes);
#else
  (void)timeout;
  (void)bucket_bytes;
  throw BackendNotBuiltError(
      "WORLD_SIZE " + std::to_string(env.world_size) + " on a CUDA device needs c10d's NCCL backend, which this "
      "accumplan was not built with (it needs a LibTorch with CUDA; reconfigure with CMAKE_PREFIX_PATH pointing at "
      "one). Run on the CPU with --device cpu (Gloo) instead");
#endif
}

}  // namespace accumplan
