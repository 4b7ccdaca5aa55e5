// dist/communicator.cpp — local and Gloo communicators. See communicator.h.
#include "dist/communicator.h"

#include <cstdlib>
#include <map>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

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
};

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(const DistEnv& env, std::chrono::milliseconds timeout, int64_t bucket_bytes)
      : env_(env), bucket_bytes_(bucket_bytes) {
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(env.master_port);
    so.isServer = env.rank == 0;
    so.numWorkers = static_cast<std::size_t>(env.world_size);
    so.waitWorkers = true;
    so.timeout = timeout;
    try {
      store_ = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
      auto options = c10d::ProcessGroupGloo::Options::create(timeout);
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(env.master_addr));
      group_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store_, env.rank, env.world_size, options);
    } catch (const std::exception& e) {
      throw InputError("rank " + std::to_string(env.rank) + " could not join the process group at " +
                       env.master_addr + ":" + std::to_string(env.master_port) + " (WORLD_SIZE " +
                       std::to_string(env.world_size) + "): " + e.what());
    }
  }

  std::string backend() const override { return "gloo"; }
  int rank() const override { return env_.rank; }
  int world_size() const override { return env_.world_size; }

  std::vector<int64_t> all_reduce_counters(const std::vector<int64_t>& values) override {
    std::vector<at::Tensor> t = {at::tensor(values, at::kLong)};
    group_->allreduce(t)->wait();
    ++counts_.counter_all_reduces;
    const at::Tensor r = t[0].contiguous();
    return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
  }

  void all_reduce_gradients(std::vector<at::Tensor>& tensors) override {
    ++counts_.gradient_exchanges;
    // Bucket by dtype, in order, up to bucket_bytes_ each: one flat buffer per bucket.
    size_t i = 0;
    while (i < tensors.size()) {
      std::vector<size_t> bucket;
      int64_t bytes = 0;
      const auto dtype = tensors[i].scalar_type();
      while (i < tensors.size() && tensors[i].scalar_type() == dtype &&
             (bucket.empty() || bytes + tensors[i].nbytes() <= static_cast<size_t>(bucket_bytes_))) {
        bytes += static_cast<int64_t>(tensors[i].nbytes());
        bucket.push_back(i++);
      }
      std::vector<at::Tensor> flat_parts;
      for (size_t k : bucket) flat_parts.push_back(tensors[k].reshape({-1}));
      std::vector<at::Tensor> flat = {at::cat(flat_parts)};
      group_->allreduce(flat)->wait();
      ++counts_.tensor_all_reduces;
      int64_t offset = 0;
      for (size_t k : bucket) {
        const int64_t n = tensors[k].numel();
        tensors[k].copy_(flat[0].narrow(0, offset, n).view_as(tensors[k]));
        offset += n;
      }
    }
  }

 private:
  DistEnv env_;
  int64_t bucket_bytes_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
};

int env_int(const char* name, bool required, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) {
    if (required) {
      throw InputError(std::string("WORLD_SIZE is set but ") + name +
                       " is not; launch with torchrun --no-python, or set RANK, WORLD_SIZE, MASTER_ADDR "
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

std::unique_ptr<Communicator> make_gloo_communicator(const DistEnv& env, std::chrono::milliseconds timeout,
                                                     int64_t bucket_bytes) {
  if (env.world_size == 1) return make_local_communicator();
  return std::make_unique<GlooCommunicator>(env, timeout, bucket_bytes);
}

}  // namespace accumplan
