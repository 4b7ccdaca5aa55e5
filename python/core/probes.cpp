// python/core/probes.cpp — accumplan._probes: the cpu-counting memory probe, for Python.
//
// What it is: the counting CPU allocator of profiler/src/cpu_counting_probe.cpp (the one
// `accumplan profile` and `accumplan run` install on the CPU device), compiled against the
// LibTorch that Python's `torch` loads (setup.py passes its include folder, its libc10 and its
// C++ ABI), so that installing it counts every CPU tensor the process's training allocates and
// enforces the budget with c10's OutOfMemoryError, which torch raises in Python as an
// out-of-memory error. accumplan.plan installs it for the duration of planning on the CPU
// device and removes it after (CpuCountingProbe.close(), also on error).
// What it is not: the CUDA probe: on a GPU, Python reads the caching allocator's own statistics
// through torch.cuda (accumplan/measure.py), which are the same numbers the C++
// cuda-caching-allocator probe reads. No tensor crosses this module: only byte counts.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>

#include "accumplan/errors.h"
#include "cpu_counting_probe.h"

namespace py = pybind11;

namespace accumplan {
namespace {

// Holds the probe so that close() removes the allocator at a point Python chooses (a `with`
// block's end), not when the garbage collector gets to it.
class ProbeHandle {
 public:
  explicit ProbeHandle(std::optional<int64_t> budget_bytes) : probe_(std::make_unique<CpuCountingProbe>(budget_bytes)) {}
  void close() { probe_.reset(); }
  bool installed() const { return probe_ != nullptr; }
  CpuCountingProbe& get() const {
    if (!probe_) throw InputError("the cpu-counting probe was closed; make a new one");
    return *probe_;
  }

 private:
  std::unique_ptr<CpuCountingProbe> probe_;
};

}  // namespace
}  // namespace accumplan

PYBIND11_MODULE(_probes, m) {
  using namespace accumplan;
  m.doc() = "accumplan's cpu-counting memory probe, over the LibTorch that Python's torch uses";
  // Errors (a closed probe, a second probe installed) reach Python as RuntimeError with their message.
  py::class_<ProbeHandle>(m, "CpuCountingProbe")
      .def(py::init<std::optional<int64_t>>(), py::arg("budget_bytes") = py::none(),
           "installs the counting CPU allocator (one at a time in a process)")
      .def("close", &ProbeHandle::close, "puts the previous CPU allocator back")
      .def_property_readonly("installed", &ProbeHandle::installed)
      .def_property_readonly("name", [](const ProbeHandle& h) { return h.get().name(); })
      .def_property_readonly("device_name", [](const ProbeHandle& h) { return h.get().device_name(); })
      .def("current_bytes", [](const ProbeHandle& h) { return h.get().current_bytes(); })
      .def("peak_bytes", [](const ProbeHandle& h) { return h.get().peak_bytes(); })
      .def("reset_peak", [](const ProbeHandle& h) { h.get().reset_peak(); })
      .def("device_total_bytes", [](const ProbeHandle& h) { return h.get().device_total_bytes(); })
      .def("set_budget_bytes", [](const ProbeHandle& h, std::optional<int64_t> b) { h.get().set_budget_bytes(b); },
           py::arg("budget_bytes"))
      .def("budget_bytes", [](const ProbeHandle& h) { return h.get().budget_bytes(); })
      .def("oom_happened", [](const ProbeHandle& h) { return h.get().oom_happened(); })
      .def("clear_oom", [](const ProbeHandle& h) { h.get().clear_oom(); });
  m.def("machine_memory_bytes", &machine_memory_bytes, "physical memory of this machine in bytes");
}
