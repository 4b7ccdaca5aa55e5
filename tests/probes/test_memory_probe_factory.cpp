// test_memory_probe_factory.cpp — make_memory_probe: the CPU probe with a budget, and the errors
// for backends this build lacks and names that do not exist.
// Not tested here: CUDA or CUPTI probes themselves (they need a GPU build and a GPU).
#include <memory>
#include <string>

#include "accumplan/build_config.h"
#include "accumplan/errors.h"
#include "accumplan/memory_probe.h"
#include "torch_and_catch.h"  // last: see why there

using accumplan::make_memory_probe;
using accumplan::ProbeRequest;
using Catch::Matchers::Contains;

namespace {

ProbeRequest request(std::string device, std::string backend = "auto",
                     std::optional<int64_t> budget_bytes = std::nullopt) {
  ProbeRequest r;
  r.device = std::move(device);
  r.backend = std::move(backend);
  r.budget_bytes = budget_bytes;
  return r;
}

// The message of the error `make_memory_probe(r)` throws, checked to be of type E.
template <typename E>
std::string error_of(const ProbeRequest& r) {
  try {
    make_memory_probe(r);
  } catch (const E& e) {
    return e.what();
  }
  FAIL("make_memory_probe(device=" << r.device << ", backend=" << r.backend
                                   << ") did not throw the expected error");
  return "";
}

}  // namespace

TEST_CASE("Probe factory: cpu gives the counting probe with the budget applied",
          "[probe][factory][cpu]") {
  for (const char* backend : {"auto", "cpu-counting"}) {
    auto probe = make_memory_probe(request("cpu", backend, int64_t{512} << 20));
    REQUIRE(probe);
    CHECK(probe->name() == "cpu-counting");
    CHECK(probe->budget_bytes() == (int64_t{512} << 20));
    CHECK(probe->device_total_bytes() == (int64_t{512} << 20));
    const int64_t before = probe->current_bytes();
    at::Tensor t = at::empty({256}, at::kFloat);
    CHECK(probe->current_bytes() == before + 1024);
  }
  auto unbudgeted = make_memory_probe(ProbeRequest{});  // defaults: cpu, auto, no budget
  CHECK(unbudgeted->name() == "cpu-counting");
  CHECK_FALSE(unbudgeted->budget_bytes().has_value());
}

TEST_CASE("Probe factory: cuda on a build without CUDA says how to rebuild",
          "[probe][factory][cuda]") {
  if (accumplan::is_cuda_supported()) {
    // A CUDA build must instead refuse devices that do not exist.
    CHECK_THAT(error_of<accumplan::InputError>(request("cuda:999")), Contains("cuda:999"));
    return;
  }
  for (const char* device : {"cuda", "cuda:0", "cuda:3"}) {
    const std::string message = error_of<accumplan::BackendNotBuiltError>(request(device));
    CHECK_THAT(message, Contains(device));
    CHECK_THAT(message, Contains("ACCUMPLAN_WITH_CUDA=ON"));  // the reconfigure command
    CHECK_THAT(message, Contains("without CUDA"));
  }
  CHECK_THAT(error_of<accumplan::BackendNotBuiltError>(
                 request("cuda", "cuda-caching-allocator")),
             Contains("ACCUMPLAN_WITH_CUDA=ON"));
  // A backend that was not built is a user-fixable error: exit code 2.
  try {
    make_memory_probe(request("cuda"));
  } catch (const accumplan::Error& e) {
    CHECK(e.exit_code() == accumplan::kExitInput);
  }
}

TEST_CASE("Probe factory: cupti on a build without it says how to rebuild",
          "[probe][factory][cupti]") {
  if (accumplan::is_cupti_supported()) {
    SUCCEED("this build has CUPTI; the probe itself needs a GPU to test");
    return;
  }
  const std::string message = error_of<accumplan::BackendNotBuiltError>(request("cuda", "cupti"));
  CHECK_THAT(message, Contains("cupti"));
  CHECK_THAT(message, Contains("ACCUMPLAN_WITH_CUPTI=ON"));
}

TEST_CASE("Probe factory: unknown names are input errors that list the known ones",
          "[probe][factory]") {
  const std::string backend = error_of<accumplan::InputError>(request("cpu", "nvml"));
  CHECK_THAT(backend, Contains("'nvml'"));
  CHECK_THAT(backend, Contains("cpu-counting"));
  CHECK_THAT(backend, Contains("cuda-caching-allocator"));
  CHECK_THAT(backend, Contains("cupti"));

  for (const char* device : {"tpu", "cuda:", "cuda:x", "cuda:-1", "CPU", "cuda:12345"}) {
    const std::string message = error_of<accumplan::InputError>(request(device));
    CHECK_THAT(message, Contains(std::string("'") + device + "'"));
    CHECK_THAT(message, Contains("cuda:N"));
  }
}

TEST_CASE("Probe factory: mismatched device and backend, and bad budgets, are input errors",
          "[probe][factory]") {
  CHECK_THAT(error_of<accumplan::InputError>(request("cpu", "cupti")), Contains("cpu-counting"));
  CHECK_THAT(error_of<accumplan::InputError>(request("cpu", "cuda-caching-allocator")),
             Contains("cpu-counting"));
  CHECK_THAT(error_of<accumplan::InputError>(request("cuda", "cpu-counting")),
             Contains("CPU memory"));
  CHECK_THAT(error_of<accumplan::InputError>(request("cpu", "auto", 0)), Contains("positive"));
  CHECK_THAT(error_of<accumplan::InputError>(request("cpu", "auto", -1)), Contains("positive"));
}
