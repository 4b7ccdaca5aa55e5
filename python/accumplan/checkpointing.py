"""accumplan.checkpointing — which blocks of a model activation checkpointing can wrap, and the wrap.

What it is: ``checkpoint_candidates`` (the blocks a plan may checkpoint: transformer layers,
ResNet stages), ``apply_checkpointing`` (each named module recomputes its forward during backward
instead of keeping its activations, with the same update and buffers; the handle's ``remove()``
puts every forward back) and ``block_costs`` (from one instrumented window, what checkpointing
each block frees and what recomputing it costs); their docstrings say how.
What it is not: the choice of which blocks to checkpoint for a microbatch (the C++ planner's,
accumplan/checkpoint.h, from these costs); and not for TorchScript modules, whose structure is fixed.
"""
import difflib
import functools
import time

import torch
import torch.nn as nn
import torch.utils.checkpoint as torch_checkpoint

from ._args import module_arg, shown_value


def _refuse_scripted(model, name="model"):
    if isinstance(model, torch.jit.ScriptModule):
        raise TypeError("%s is a TorchScript module: activation checkpointing wraps a Python nn.Module's blocks; "
                        "pass the module before torch.jit.script/trace" % name)
    module_arg(model, name)


def _longest_run(children):
    """(start, length) of the longest run of consecutive children of one class (the first of equals)."""
    best, start = (0, 0), 0
    for i in range(1, len(children) + 1):
        if i == len(children) or type(children[i]) is not type(children[start]):
            if i - start > best[1]:
                best = (start, i - start)
            start = i
    return best


def checkpoint_candidates(model, names=None, arg="checkpoint_candidates"):
    """The qualified names of the blocks a plan may checkpoint, in forward order. ``names``: the
    user's list (each must name a submodule, not the model itself, once); None: the longest run of
    at least two consecutive same-class children of an ``nn.ModuleList`` or ``nn.Sequential``
    (the outermost of equally long runs). ValueError when there is none, naming the fix; ``arg``
    names the list in messages (accumplan.plan's checkpointing= passes its own)."""
    _refuse_scripted(model)
    modules = dict(model.named_modules())
    if names is not None:
        if isinstance(names, str) or not isinstance(names, (list, tuple)):
            raise TypeError("%s must be a list of module names, not %s" % (arg, shown_value(names)))
        seen = set()
        for i, n in enumerate(names):
            if not isinstance(n, str) or n == "" or n not in modules:
                near = difflib.get_close_matches(n, [m for m in modules if m], n=3) if isinstance(n, str) else []
                raise ValueError("%s[%d] is %s, not a submodule of the model%s" % (
                    arg, i, shown_value(n), "; did you mean %s?" % ", ".join(near) if near else
                    " (model.named_modules() lists them)"))
            if n in seen:
                raise ValueError("%s[%d] names %r twice" % (arg, i, n))
            seen.add(n)
        return list(names)
    best_name, best = None, (0, 0)
    for prefix, m in model.named_modules():
        if isinstance(m, (nn.ModuleList, nn.Sequential)):
            start, length = _longest_run(list(m.children()))
            if length >= 2 and length > best[1]:
                best_name, best = prefix, (start, length)
    if best_name is None:
        raise ValueError("%s has no repeated blocks to checkpoint (a run of two or more same-class children of an "
                         "nn.ModuleList or nn.Sequential); name them with checkpoint_candidates=[...]"
                         % type(model).__name__)
    keys = [k for k, _ in modules[best_name].named_children()]
    return ["%s.%s" % (best_name, k) if best_name else k for k in keys[best[0]:best[0] + best[1]]]


class Checkpointed:
    """The handle ``apply_checkpointing`` returns: ``names``, and ``remove()`` (also on leaving a
    ``with`` block), which puts every wrapped forward back."""

    def __init__(self, wrapped):
        self._wrapped = wrapped  # [(module, the instance forward it had or None)]
        self.names = []

    def remove(self):
        self.names = []
        while self._wrapped:
            module, had = self._wrapped.pop()
            if had is None:
                del module.forward
            else:
                module.forward = had

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


_INTERRUPTED = []  # a KeyboardInterrupt raised in a recompute: torch 1.13's autograd hands it on as a RuntimeError


def interrupted_in_recompute():
    """Whether a Ctrl-C landed in a recompute since the last call (which clears it)."""
    return bool(_INTERRUPTED and not _INTERRUPTED.clear())


def _recomputing(module, forward):
    @functools.wraps(forward)
    def call(*args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)  # nothing to save for a backward: no need to recompute
        calls = []

        def run(*a):
            if not calls:
                calls.append(1)
                return forward(*a, **kwargs)
            kept = [(b, b.detach().clone()) for b in module.buffers()]  # BatchNorm's statistics move once
            try:
                return forward(*a, **kwargs)
            except KeyboardInterrupt:
                _INTERRUPTED.append(True)
                raise
            finally:
                with torch.no_grad():
                    for b, k in kept:
                        b.copy_(k)
        return torch_checkpoint.checkpoint(run, *args, use_reentrant=False, preserve_rng_state=True)
    call.accumplan_recomputes = True  # a second wrap of it is refused: removing in any order must unwrap
    return call


def apply_checkpointing(model, names, arg="names"):
    """Wraps each module in ``names`` (``checkpoint_candidates``'s) so its forward is recomputed in
    backward: non-reentrant ``torch.utils.checkpoint`` with the RNG state preserved and the
    buffers the forward wrote put back after the recompute, so a window trained with it gives the
    same update and buffers as without. Returns a ``Checkpointed`` handle; its
    ``remove()`` restores the forwards. Under ``torch.no_grad`` the wrapped modules run as before."""
    handle = Checkpointed([])
    wrap_into(handle, model, names, arg)
    return handle


def wrap_into(handle, model, names, arg="checkpoint_candidates"):
    """Wraps ``names`` as ``apply_checkpointing`` does, into an existing ``Checkpointed`` handle
    (one a caller already holds, so an interrupt between wrapping and keeping the handle cannot
    leave a wrapped forward nobody removes)."""
    names = checkpoint_candidates(model, names, arg)
    modules = dict(model.named_modules())
    try:
        for n in names:
            module = modules[n]
            had = module.__dict__.get("forward")
            if getattr(had, "accumplan_recomputes", False):
                raise ValueError("%s is checkpointed already (an apply_checkpointing handle holds it); remove that "
                                 "handle first" % n)
            module.forward = _recomputing(module, module.forward)
            handle._wrapped.append((module, had))
            handle.names.append(n)
    except BaseException:
        handle.remove()
        raise


def _storage(t):
    """(data pointer, bytes) of the storage behind ``t``: what holding it keeps alive (a view holds
    its whole base). untyped_storage in torch 2.x, storage() in 1.13."""
    s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    return s.data_ptr(), s.nbytes()


def _tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


# Each block's forward in the costs window runs twice more at once, timed, and the fastest of the
# three counts: one timing of an instrumented step wanders by several times on a busy CPU, and the
# fastest is the forward a recompute repeats (tests/bench/CHECKPOINT.md measures the result).
_REPLAYS = 2


def _discard(t):
    return None  # a replay's saved tensors: nothing keeps them, as under no_grad


def _replayed_seconds(module, forward, args, kwargs, sync, memory, carried):
    """The seconds of _REPLAYS more calls of ``forward`` on the same arguments, with autograd
    recording as a recompute does but nothing saved, the block's buffers (BatchNorm's running
    statistics) and every RNG (dropout) as they were before, so the step goes on as if they had
    not run; their transient memory is taken out of ``memory``'s peak (the peak before them is
    carried in ``carried[0]``)."""
    if memory is not None:
        memory.sync()
        carried[0] = max(carried[0], memory.peak())
    kept = [b.detach().clone() for b in module.buffers()]
    cuda = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    times = []
    with torch.random.fork_rng(devices=cuda), torch.autograd.graph.saved_tensors_hooks(_discard, _discard):
        for _ in range(_REPLAYS):
            sync()
            t0 = time.perf_counter()
            forward(*args, **kwargs)
            sync()
            times.append(time.perf_counter() - t0)
    with torch.no_grad():
        for b, k in zip(module.buffers(), kept):
            b.copy_(k)
    if memory is not None:
        memory.sync()
        memory.reset_peak()
    return times


class BlockCosts(list):
    """block_costs' list of (name, saved_bytes_per_sample, forward_seconds_per_sample), with
    ``head_bytes_per_sample``: what the step's peak held per sample beyond the blocks' backward (the
    head's saved tensors and its backward's gradients, an LM head's logits: gone before any block is
    recomputed), measured when block_costs was given a ``memory`` meter, else 0."""
    head_bytes_per_sample = 0.0
    step_peak_bytes = None  # with a meter: the whole step's peak (block_costs resets the meter's halfway)


def block_costs(model, names, step, samples, memory=None):
    """[(name, saved_bytes_per_sample, forward_seconds_per_sample)] for each block in ``names``, from
    one call of ``step()`` (forward, loss and backward of ``samples`` samples), as a ``BlockCosts``.
    A tensor counts for the innermost block running when autograd saves it, once per storage,
    unless checkpointing the block would not free it: the model's parameters and buffers, the
    block's own inputs (a checkpoint keeps them), and what anything else keeps too — another
    block's input (this block's output, which the next block saves) or a tensor saved outside every
    block (the head's input). A block's seconds are the fastest of its forward in the step and two
    more calls right after it on the same arguments (recording for autograd, saving nothing; its
    buffers and the RNGs put back, so the step is unchanged). ``memory``: the meter the step runs
    under (``peak()``, ``reset_peak()``, ``sync()``, its peak reset by the caller); the peak up to
    the moment the last block's output gets its gradient (the forward and the head's backward)
    against the peak after it (the blocks' backward) gives ``head_bytes_per_sample``; the extra
    calls' transient memory is in neither."""
    names = checkpoint_candidates(model, names)
    modules = dict(model.named_modules())
    held = {_storage(p)[0] for p in model.parameters()} | {_storage(b)[0] for b in model.buffers()}
    running, inputs, outside = [], [set() for _ in names], set()
    saved = [dict() for _ in names]
    seconds, head_peak, carried = [0.0] * len(names), [], [0]
    sync = torch.cuda.synchronize if any(p.is_cuda for p in model.parameters()) else (lambda: None)

    def at_blocks_backward(grad):
        if memory is not None and not head_peak:  # the head's backward is done; the blocks' begins
            memory.sync()
            head_peak.append(max(carried[0], memory.peak()))
            memory.reset_peak()

    def timed(i, module, forward):
        @functools.wraps(forward)
        def call(*args, **kwargs):
            sync()
            inputs[i].update(_storage(t)[0] for t in _tensors(args))
            running.append(i)
            given = _tensors([args, kwargs])
            versions = [t._version for t in given]
            t0 = time.perf_counter()
            try:
                output = forward(*args, **kwargs)
                sync()
                took = time.perf_counter() - t0
            finally:
                running.pop()
            if i == len(names) - 1:
                for t in _tensors(output):
                    if t.requires_grad:
                        t.register_hook(at_blocks_backward)
            # A forward that wrote into its own arguments cannot run again on them (nor be recomputed).
            replays = [] if [t._version for t in given] != versions else \
                _replayed_seconds(module, forward, args, kwargs, sync, memory, carried)
            seconds[i] += min([took] + replays)
            return output
        return call

    def pack(t):
        ptr, nbytes = _storage(t)
        if running:
            saved[running[-1]][ptr] = nbytes
        else:
            outside.add(ptr)
        return t

    timing = Checkpointed([])  # its remove() puts the timed forwards back
    try:
        for i, n in enumerate(names):
            module = modules[n]
            timing._wrapped.append((module, module.__dict__.get("forward")))
            module.forward = timed(i, module, module.forward)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            step()
    finally:
        timing.remove()
    elsewhere = held.union(outside, *inputs)  # a block's own inputs too: its checkpoint keeps them
    costs = BlockCosts((n, sum(nb for ptr, nb in saved[i].items() if ptr not in elsewhere) / samples,
                        seconds[i] / samples) for i, n in enumerate(names))
    if head_peak:
        memory.sync()
        blocks_peak = memory.peak()
        costs.head_bytes_per_sample = max(0, head_peak[0] - blocks_peak) / samples
        costs.step_peak_bytes = max(head_peak[0], blocks_peak)  # the meter's own was reset halfway
    return costs


__all__ = ["checkpoint_candidates", "apply_checkpointing", "Checkpointed", "block_costs", "BlockCosts"]
