"""accumplan.meters — a device's memory as this process's training uses it, read one way for
planning (accumplan.plan) and for training (train_window(..., measure_memory=True)).

What it is: two small readers with one interface. ``CpuMeter`` installs the C++ cpu-counting
probe (accumplan._probes, the counting allocator the CLI profiles with) and adds the bytes that
existed before it was installed (weights, an optimizer state already built), so a peak is the
simulated device's; given a budget it throws out-of-memory as a GPU does at its capacity.
``CudaMeter`` reads the caching allocator's allocated and reserved peaks; its budget is the
process's memory fraction. ``meter_for(device, uncounted_bytes)`` picks one.

What it is not: a probe (those are C++, profiler/), nor a judge of what fits (the C++ search).
"""

import torch

from . import _core
from .sharding import local_state


class CpuMeter:
    """The cpu-counting probe (C++), the uncounted bytes added to every figure (see the module)."""
    probe_name = "cpu-counting"
    simulated = True

    def __init__(self, uncounted_bytes):
        try:
            from . import _probes
        except ImportError:
            raise RuntimeError("measuring CPU memory needs accumplan._probes, built when torch is importable at install time: "
                               "reinstall with `python3 -m pip install --no-build-isolation .` in this environment") \
                from None
        self.total_bytes = _probes.machine_memory_bytes()
        self.probe = _probes.CpuCountingProbe()
        self.device_name = self.probe.device_name
        self.uncounted = uncounted_bytes

    def limit(self, budget_bytes, data_bytes=0):
        self.probe.set_budget_bytes(None if budget_bytes is None else
                                    max(0, budget_bytes - self.uncounted) + data_bytes)

    def current(self):
        return self.probe.current_bytes() + self.uncounted

    def peak(self):
        return self.probe.peak_bytes() + self.uncounted

    def reserved_peak(self):
        return None

    def reset_peak(self):
        self.probe.reset_peak()

    def oom(self):
        return self.probe.oom_happened()

    def clear(self):
        self.probe.clear_oom()

    def sync(self):
        pass

    def close(self):
        self.probe.close()


class CudaMeter:
    """The CUDA caching allocator's statistics for one device (what the C++ probe reads)."""
    probe_name = "cuda-caching-allocator"
    simulated = False

    def __init__(self, device):
        self.device = device
        self.total_bytes = int(torch.cuda.mem_get_info(device)[1])  # cudaMemGetInfo, as the C++ probe
        self.device_name = torch.cuda.get_device_properties(device).name
        self._oom = False

    def limit(self, budget_bytes, data_bytes=0):
        """The caching allocator capped to hold ``budget_bytes`` (None: the whole device), by the
        core's one rule of an enforced budget: a budget above the device's memory is refused."""
        fraction = 1.0 if budget_bytes is None else _core.memory_fraction(budget_bytes, self.total_bytes, str(self.device))
        torch.cuda.set_per_process_memory_fraction(fraction, self.device)

    def current(self):
        return int(torch.cuda.memory_allocated(self.device))

    def peak(self):
        return int(torch.cuda.max_memory_allocated(self.device))

    def reserved_peak(self):
        return int(torch.cuda.max_memory_reserved(self.device))

    def reset_peak(self):
        torch.cuda.reset_peak_memory_stats(self.device)

    def oom(self):
        return False

    def clear(self):
        torch.cuda.empty_cache()

    def sync(self):
        torch.cuda.synchronize(self.device)

    def close(self):
        self.limit(None)


def _weights(model, optimizer):
    """The model's parameters and buffers, and the parameters its optimizer holds beside them."""
    tensors = list(model.parameters()) + list(model.buffers())
    if optimizer is not None:
        tensors += [p for g in optimizer.param_groups for p in g["params"]]
    return tensors


def _bytes_once(tensors):
    unique = {id(t): t for t in tensors}.values()  # tied weights count once
    return sum(t.numel() * t.element_size() for t in unique)


def weight_bytes(model, optimizer=None):
    """What every rank holds of weights: the model's parameters and buffers and any parameter its
    optimizer holds that the model does not, each once."""
    return _bytes_once(_weights(model, optimizer))


def held_bytes(model, optimizer=None):
    """The bytes a window starts with that a meter installed now does not count: weight_bytes,
    gradients and the optimizer's state tensors."""
    tensors = _weights(model, optimizer) + [p.grad for p in model.parameters() if p.grad is not None]
    if optimizer is not None:
        tensors += [v for s in local_state(optimizer).values() for v in s.values() if isinstance(v, torch.Tensor)]
    return _bytes_once(tensors)


def meter_for(device, uncounted_bytes):
    """A CpuMeter (counting from now on, ``uncounted_bytes`` added) or a CudaMeter for ``device``
    (which reads every allocation, so it needs no uncounted bytes)."""
    return CpuMeter(uncounted_bytes) if device.type == "cpu" else CudaMeter(device)


__all__ = ["CpuMeter", "CudaMeter", "held_bytes", "meter_for", "weight_bytes"]
