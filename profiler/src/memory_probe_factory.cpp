// memory_probe_factory.cpp — make_memory_probe, the one place that picks a MemoryProbe.
//
// What it is: validation of the device and backend names, then construction of the probe this
// build has, with the request's budget applied. Names are checked before build features, so a
// typo gets "unknown backend" on every build, and a real backend this build lacks gets
// BackendNotBuiltError with the reconfigure hint from build_config.h.
// What it is not: device detection for `--device` defaults (the CLI decides "auto").
#include <cctype>
#include <memory>
#include <string>

#include "accumplan/build_config.h"
#include "accumplan/errors.h"
#include "accumplan/memory_probe.h"
#include "cpu_counting_probe.h"

#if ACCUMPLAN_HAS_CUDA
#include "cuda_caching_probe.h"
#endif
#if ACCUMPLAN_HAS_CUPTI
#include "cupti_probe.h"
#endif

namespace accumplan {
namespace {

const char* kKnownBackends = "auto, cpu-counting, cuda-caching-allocator, cupti";
const char* kKnownDevices = "cpu, cuda, cuda:N (N = 0, 1, ...)";

}  // namespace

ParsedDevice parse_device(const std::string& device) {
  if (device == "cpu") return {"cpu", 0};
  if (device == "cuda") return {"cuda", 0};
  const std::string prefix = "cuda:";
  if (device.rfind(prefix, 0) == 0) {
    const std::string digits = device.substr(prefix.size());
    // At most 4 digits: no machine has 10,000 GPUs, and it keeps stoi far from overflow.
    bool ok = !digits.empty() && digits.size() <= 4;
    for (char c : digits) ok = ok && std::isdigit(static_cast<unsigned char>(c)) != 0;
    if (ok) return {"cuda", std::stoi(digits)};
  }
  throw InputError("--device '" + device + "' is not a device; known devices: " + kKnownDevices);
}

std::unique_ptr<MemoryProbe> make_memory_probe(const ProbeRequest& request) {
  const std::string& backend = request.backend;
  if (backend != "auto" && backend != "cpu-counting" && backend != "cuda-caching-allocator" &&
      backend != "cupti") {
    throw InputError("unknown memory probe backend '" + backend + "'; known backends: " +
                     kKnownBackends);
  }
  const ParsedDevice device = parse_device(request.device);
  if (request.budget_bytes && *request.budget_bytes <= 0) {
    throw InputError("a memory budget must be positive, got " +
                     std::to_string(*request.budget_bytes) + " bytes");
  }

  if (!device.is_cuda()) {
    if (backend != "auto" && backend != "cpu-counting") {
      throw InputError("the " + backend + " backend measures CUDA memory; with --device cpu use "
                       "the cpu-counting backend (or auto)");
    }
    return std::make_unique<CpuCountingProbe>(request.budget_bytes);
  }

  if (backend == "cpu-counting") {
    throw InputError("the cpu-counting backend measures CPU memory; it cannot be used with device '" +
                     request.device + "'");
  }
  if (backend == "cupti") {
    if (!is_cupti_supported()) {
      throw BackendNotBuiltError("the cupti memory probe is not available: " +
                                 reconfigure_hint("cupti"));
    }
#if ACCUMPLAN_HAS_CUPTI
    return std::make_unique<CuptiProbe>(device.index, request.budget_bytes);
#endif
  }
  if (!is_cuda_supported()) {
    throw BackendNotBuiltError("device '" + request.device + "' is not available: " +
                               reconfigure_hint("cuda"));
  }
#if ACCUMPLAN_HAS_CUDA
  return std::make_unique<CudaCachingProbe>(device.index, request.budget_bytes);
#else
  throw InternalError("unreachable: CUDA probe requested in a build without CUDA");
#endif
}

}  // namespace accumplan
