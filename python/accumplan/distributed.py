"""accumplan.distributed — torch.distributed for one window: the world, the agreement
all-reduces, and the one gradient exchange.

Public: ``all_reduce_gradients`` (re-exported by accumplan). Internal to the package:
``REHEARSAL`` (the exchange made alone, for planning windows), ``group_world_size``, ``is_ddp``,
``ddp_bucket_bytes``,
``all_reduce_ints``, ``collective_device``, ``on_rank``. No rule is
decided here (the core's window loop decides): every rank reports, every rank reads the same sums
and raises the same error.
"""

import torch
import torch.distributed as dist

from . import _core


def group_world_size(group=None):
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(group)
    return 1


def is_ddp(model):
    return isinstance(model, torch.nn.parallel.DistributedDataParallel)


def ddp_bucket_bytes(model):
    """What a DistributedDataParallel module's reducer holds from the moment it wraps the module: a
    gradient bucket for every parameter it reduces (those that take a gradient, less the ones it
    ignores), allocated whole; 0 for any other module."""
    if not is_ddp(model):
        return 0
    ignored = getattr(model, "parameters_to_ignore", ())
    return sum(p.numel() * p.element_size() for name, p in model.module.named_parameters()
               if p.requires_grad and name not in ignored)


class _Rehearsal:
    """The group of ``all_reduce_gradients`` in one process that makes a rank's exchange with no
    peer: the same buckets and flat buffers on the parameters' device, no collective (accumplan.plan's
    windows for W ranks hold what every rank's window holds)."""


REHEARSAL = _Rehearsal()


# The last collective's tensors, held until the next: a Python tensor whose last reference is
# gloo's worker thread would be freed there under the GIL, deadlocking a process group's destructor.
_IN_FLIGHT = []


def all_reduce_ints(values, group, device):
    t = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    _IN_FLIGHT[:] = [t]
    return [int(v) for v in t.tolist()]


def on_rank(error, rank):
    """A ValueError that names ``rank`` ("rank 1: ..."), its cause the original; other errors as they are."""
    if not isinstance(error, ValueError):
        return error
    try:
        named = type(error)("rank %d: %s" % (rank, error))
    except Exception:  # noqa: BLE001 - a subclass with another constructor
        named = ValueError("rank %d: %s" % (rank, error))
    named.__cause__ = error
    return named


def collective_device(group, params):
    try:
        backend = dist.get_backend(group)
    except Exception:  # noqa: BLE001 - older releases raise different types here
        backend = "gloo"
    if backend == "nccl":
        return params[0].device if params else torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_gradients(params, group=None, extra=None):
    """ONE gradient exchange (flat buckets of at most 25 MiB, _core.gradient_buckets, summed) over the
    process group. Parameters without a gradient send zeros, so every rank sends the same list. ``extra`` (a
    float) rides along in the last bucket of the widest dtype (a loss sum keeps a float32's digits
    beside half-precision gradients); the summed value is returned."""
    rehearse = group is REHEARSAL
    device = (params[0].device if params else torch.device("cpu")) if rehearse else collective_device(group, params)
    grads = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    tail = torch.tensor([0.0 if extra is None else float(extra)], dtype=torch.float64)
    buckets = [[grads[i] for i in bucket]
               for bucket in _core.gradient_buckets([(str(g.dtype), g.numel() * g.element_size()) for g in grads])]
    carrier = max(range(len(buckets)), key=lambda i: (buckets[i][0].element_size(), i), default=-1)
    for i, bucket in enumerate(buckets):
        # One flat buffer per bucket, the carrier's with the tail's slot: the bucket's bytes once,
        # never a second copy to append the tail (the exchange is a window's highest moment when
        # the gradients outweigh a microbatch's activations).
        last = i == carrier
        flat = torch.empty(sum(g.numel() for g in bucket) + (1 if last else 0), dtype=bucket[0].dtype, device=device)
        offset = 0
        for g in bucket:
            flat[offset:offset + g.numel()].copy_(g.reshape(-1))
            offset += g.numel()
        if last:
            flat[-1:].copy_(tail)
        if not rehearse:
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
            _IN_FLIGHT[:] = [flat]  # the previous bucket's collective has finished: it may go
        if last:
            tail = flat[-1:].to(torch.float64, copy=True).cpu()
        offset = 0
        for g in bucket:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        # The buffer's memory goes now, though the collective's work may still hold the tensor on
        # the backend's thread (and _IN_FLIGHT holds it): otherwise it stays into the optimizer step.
        flat.untyped_storage().resize_(0)
    if not buckets and extra is not None and not rehearse:
        tail = tail.to(device)
        dist.all_reduce(tail, op=dist.ReduceOp.SUM, group=group)
        _IN_FLIGHT[:] = [tail]
    return float(tail.item())
