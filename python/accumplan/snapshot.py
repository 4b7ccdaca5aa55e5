"""accumplan.snapshot — the user's training state, copied to the host before planning and put back
exactly after it, also when planning fails or is interrupted.

What it is: ``TrainingState(model, optimizer, device)`` records what a planning window can
change — every module's parameters, buffers and children (the objects, so a forward that
reassigns a buffer or registers a module is undone), their values, each module's ``training``
flag, the gradients of the model's and the optimizer's parameters, the optimizer's state (each
tensor with its own dtype and device: ``load_state_dict`` would cast a float64 moment or an int64
step to the parameter's dtype) and hyperparameters, the RNGs (torch CPU and CUDA, Python's
``random``, NumPy's when imported), grad mode and the default dtype. ``restore()`` puts them back,
``RestoreGuard`` holding Ctrl-C meanwhile.

What it is not: a checkpoint (it lives in this process only), nor a copy of the data.
"""

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
        # A TorchScript module's structure is fixed (its _parameters and friends are read-only
        # wrappers, and no forward can reassign them): only its values and training flag come back.
        self.modules = [(m, None if isinstance(m, torch.jit.ScriptModule) else
                         (dict(m._parameters), dict(m._buffers), dict(m._modules)), m.training)
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
        for m, structure, training in self.modules:
            if structure is not None:
                for mine, saved in zip((m._parameters, m._buffers, m._modules), structure):
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


class RestoreGuard:
    """Ctrl-C around planning: delivered at once while planning runs, held while what planning
    installed and changed is put back, then delivered. Which one is decided by where the interrupt
    lands — the guard's own code on the stack (``protected``, ``put_back``, the constructor), or
    the owner's line that calls ``put_back`` — so an interrupt at any line of the restore path,
    its first included, cannot leave the weights trained or the counting allocator installed
    (a flag set by the restore's first line would itself be a line an interrupt can land before).

    Usage (accumplan.plan)::

        guard = RestoreGuard()                 # installs the SIGINT handler
        try:
            guard.protected(lambda: guard.hold(TrainingState(...), meter_for(...)))
            ...                                # planning: Ctrl-C raises KeyboardInterrupt here
        finally:
            guard.put_back()                   # meter closed, state restored, handler removed

    Outside the main thread (where Python takes no signals) the guard only puts back."""

    def __init__(self):
        self.snapshot, self.meter, self.caught, self.undo = None, None, [], []
        self.owner = sys._getframe(1).f_code
        self.active = threading.current_thread() is threading.main_thread()
        self.previous = signal.signal(signal.SIGINT, self._on_sigint) if self.active else None

    def hold(self, snapshot, meter):
        """What put_back undoes: the snapshot to restore, the meter to close."""
        self.snapshot, self.meter = snapshot, meter

    def also_undo(self, fn):
        """fn() runs first in put_back, with Ctrl-C held (plan()'s checkpointing wrap removed)."""
        self.undo.append(fn)

    def protected(self, fn):
        """fn() with Ctrl-C held; a held one is delivered after it returns."""
        result = fn()
        self._deliver()
        return result

    def put_back(self):
        """Closes the meter, restores the snapshot and removes the handler, with Ctrl-C held; a
        held one is delivered after (KeyboardInterrupt, or the handler that was installed)."""
        try:
            while self.undo:
                self.undo.pop()()
            if self.meter is not None:
                self.meter.close()
        finally:
            try:
                if self.snapshot is not None:
                    self.snapshot.restore()
            finally:
                if self.active:
                    signal.signal(signal.SIGINT, self.previous if self.previous is not None else signal.default_int_handler)
                    self.active = False
        self._deliver()

    def _on_sigint(self, signum, frame):
        if self._in_restore_path(frame):
            self.caught.append(frame)
        else:
            self._pass_on(signum, frame)

    def _in_restore_path(self, frame):
        mine = (RestoreGuard.__init__.__code__, RestoreGuard.protected.__code__, RestoreGuard.put_back.__code__)
        f = frame
        while f is not None:
            if f.f_code in mine or (f.f_code is self.owner and f.f_lineno in _put_back_lines(self.owner)):
                return True
            f = f.f_back
        return False

    def _pass_on(self, signum, frame):
        previous = self.previous
        if callable(previous) and previous is not signal.default_int_handler:
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt

    def _deliver(self):
        if self.caught:
            frame, self.caught = self.caught[0], []
            self._pass_on(signal.SIGINT, frame)


_PUT_BACK_LINES = {}


def _put_back_lines(code):
    """The lines of ``code`` that call ``put_back`` (found in its bytecode, once per code object)."""
    if code not in _PUT_BACK_LINES:
        import dis
        lines, line = set(), None
        for ins in dis.get_instructions(code):
            start = getattr(ins, "line_number", None) or (ins.starts_line if isinstance(ins.starts_line, int)
                                                          and not isinstance(ins.starts_line, bool) else None)
            line = start or line
            if ins.argval == "put_back" and line is not None:
                lines.add(line)
        _PUT_BACK_LINES[code] = lines
    return _PUT_BACK_LINES[code]


__all__ = ["RestoreGuard", "TrainingState", "to_host"]
