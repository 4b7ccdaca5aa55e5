"""accumplan.snapshot — the user's training state, copied to the host before planning and put back
exactly after it, also when planning fails or is interrupted.

What it is: ``TrainingState(model, optimizer, device)`` records what a planning window can
change — every module's parameters, buffers and children (the objects, so a forward that
reassigns a buffer or registers a module is undone), their values, each module's ``training``
flag, the gradients of the model's and the optimizer's parameters, the optimizer's state (each
tensor with its own dtype and device: ``load_state_dict`` would cast a float64 moment or an int64
step to the parameter's dtype) and hyperparameters, the RNGs (torch CPU and CUDA, Python's
``random``, NumPy's when imported), grad mode and the default dtype. ``restore()`` puts them back.
``interrupts_held()`` holds Ctrl-C while that happens and raises it after, so an interrupt cannot
leave half of the state trained.

What it is not: a checkpoint (it lives in this process only), nor a copy of the data.
"""

import contextlib
import copy
import random
import signal
import sys
import threading

import torch


def to_host(obj):
    """A deep copy with every tensor on the host (dtype kept): a snapshot that takes no device memory."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: to_host(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_host(v) for v in obj)
    return copy.deepcopy(obj)


def _back(saved, like):
    """A saved host copy put back where the original lived (its device; dtype as saved)."""
    return saved.to(like.device) if isinstance(saved, torch.Tensor) else saved


def _unique(tensors):
    seen, out = set(), []
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


class TrainingState:
    """What planning may touch, copied to the host before it starts and put back after."""

    def __init__(self, model, optimizer, device):
        self.modules = [(m, dict(m._parameters), dict(m._buffers), dict(m._modules), m.training)
                        for m in model.modules()]
        self.tensors = [(t, to_host(t)) for t in _unique(list(model.parameters()) + list(model.buffers()))]
        params = _unique(list(model.parameters()) + [p for g in optimizer.param_groups for p in g["params"]])
        self.grads = [(p, None if p.grad is None else to_host(p.grad)) for p in params]
        self.optimizer = optimizer
        self.groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
        self.state = {p: ({k: (v, to_host(v)) for k, v in s.items()}) for p, s in optimizer.state.items()}
        self.cpu_rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if device.type == "cuda" else None
        self.python_rng = random.getstate()
        numpy = sys.modules.get("numpy")
        self.numpy_rng = (numpy, numpy.random.get_state()) if numpy is not None else None
        self.grad_enabled = torch.is_grad_enabled()
        self.default_dtype = torch.get_default_dtype()

    def restore(self):
        for m, params, buffers, children, training in self.modules:
            for mine, saved in ((m._parameters, params), (m._buffers, buffers), (m._modules, children)):
                mine.clear()
                mine.update(saved)
            m.training = training
        with torch.no_grad():
            for t, saved in self.tensors:
                t.copy_(saved)
        for p, g in self.grads:
            p.grad = None if g is None else g.to(p.device)
        for group, saved in zip(self.optimizer.param_groups, self.groups):
            for k in [k for k in group if k != "params" and k not in saved]:
                del group[k]
            group.update(copy.deepcopy(saved))
        self.optimizer.state.clear()
        for p, s in self.state.items():
            self.optimizer.state[p] = {k: _back(saved, original) for k, (original, saved) in s.items()}
        self._restore_rngs()
        torch.set_grad_enabled(self.grad_enabled)
        torch.set_default_dtype(self.default_dtype)

    def _restore_rngs(self):
        torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        random.setstate(self.python_rng)
        if self.numpy_rng is not None:
            numpy, state = self.numpy_rng
            numpy.random.set_state(state)


@contextlib.contextmanager
def interrupts_held():
    """Holds SIGINT (Ctrl-C) inside the block and delivers it after: KeyboardInterrupt, or the
    handler that was installed. Outside the main thread (where Python takes no signals) a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
        if caught:
            if callable(previous) and previous is not signal.default_int_handler:
                previous(signal.SIGINT, caught[0])
            elif previous != signal.SIG_IGN:
                raise KeyboardInterrupt


__all__ = ["TrainingState", "interrupts_held", "to_host"]
