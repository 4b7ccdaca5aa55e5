"""accumplan.sharding — optimizer state sharded over ranks (ZeRO-1) for accumplan.plan and train_window.

What it is: a ``torch.distributed.optim.ZeroRedundancyOptimizer`` recognised (the state this
process holds, the optimizer class and groups it shards); ``plan(shard=)`` checked; the state one
real step of the user's optimizer leaves on each parameter (its group's layout, none where no
gradient comes); and the measuring optimizer: the same class and groups over the parameters of the rank with the
largest share only, so each planning window holds exactly what that rank holds (every weight and
gradient, its share of the state). What it is not: the shard modes, the partition, the shares or the
choice of shard="auto" — the core's (``_core.SHARD_MODES``, ``_core.shard_optimizer_state``,
``_core.plan_auto_sharding``).
"""
import torch

from . import _core
from ._args import choice_arg

def zero_class():
    """torch's ZeroRedundancyOptimizer, or None where torch.distributed has none."""
    try:
        from torch.distributed.optim import ZeroRedundancyOptimizer
    except ImportError:
        return None
    return ZeroRedundancyOptimizer


def is_zero(optimizer):
    cls = zero_class()
    return cls is not None and isinstance(optimizer, cls)


def local_state(optimizer):
    """The optimizer state this process holds: a ZeroRedundancyOptimizer's local optimizer's."""
    return optimizer.optim.state if is_zero(optimizer) else optimizer.state


def unsharded_view(optimizer):
    """The optimizer a plan's setup describes: a ZeroRedundancyOptimizer's class over all its
    parameter groups (built without state: torch optimizers allocate it at their first step);
    any other optimizer itself."""
    if not is_zero(optimizer):
        return optimizer
    return optimizer.optim.__class__([dict(g) for g in optimizer.param_groups])


def shard_arg(shard, optimizer, world_size):
    """(shard mode, world size) of plan's shard= and world_size= for this optimizer: a
    ZeroRedundancyOptimizer plans sharded over its own group; ValueError naming the argument."""
    if shard is None:
        shard = "optimizer" if is_zero(optimizer) else "off"
    shard = choice_arg(shard, "shard", _core.SHARD_MODES)
    if is_zero(optimizer):
        if shard != "optimizer":
            raise ValueError("shard=%r: the optimizer is a ZeroRedundancyOptimizer, whose state is always sharded; "
                             "pass shard='optimizer' (or leave shard out)" % shard)
        if world_size not in (1, optimizer.world_size):
            raise ValueError("world_size=%d: the ZeroRedundancyOptimizer shards over %d ranks; pass world_size=%d "
                             "(or leave it out)" % (world_size, optimizer.world_size, optimizer.world_size))
        world_size = optimizer.world_size
        if world_size < 2:
            raise ValueError("optimizer: the ZeroRedundancyOptimizer shards over 1 rank, so it holds the whole state; "
                             "plan in a process group of at least 2 ranks, or pass the optimizer it wraps (%s) with "
                             "shard='off'" % optimizer.optim.__class__.__name__)
    try:
        _core.check_shard_mode(shard, world_size)
    except _core.InputError as e:
        raise ValueError(str(e)) from None
    return shard, world_size


def state_layout(view, group, device):
    """(bytes per element, bytes per parameter) of the state one step of the view's class with this
    group's settings leaves, read on throwaway parameters of one and two elements of the group's
    dtype, gradient one."""
    dtype = group["params"][0].dtype
    settings = {k: v for k, v in group.items() if k not in ("params", "initial_lr")}
    found = []
    for n in (1, 2):
        p = torch.zeros(n, dtype=dtype, device=device, requires_grad=True)
        p.grad = torch.ones_like(p)
        probe = view.__class__([dict(settings, params=[p])])
        probe.step()
        found.append(sum(v.numel() * v.element_size() for v in probe.state[p].values() if isinstance(v, torch.Tensor)))
    try:
        return _core.state_layout(*found)
    except _core.InputError as e:
        raise ValueError(str(e)) from None


def state_bytes_per_parameter(view, model, device):
    """The state one step of the view leaves on each of its parameters, group order: its group's
    layout on a trainable parameter of the model, none on one that gets no gradient (frozen, or
    not the model's)."""
    trained = {id(p) for p in model.parameters() if p.requires_grad}
    found = []
    for group in view.param_groups:
        if not group["params"]:
            continue
        per_element, per_parameter = state_layout(view, group, device)
        found += [per_element * p.numel() + per_parameter if id(p) in trained else 0 for p in group["params"]]
    return found


def sharding_of(view, model, world_size, device):
    """The core's sharding of the view's groups over world_size ranks (partition, shares, the
    largest share's rank, freed bytes), each parameter's share from the state one step leaves on
    it. ValueError when its parameters differ in dtype."""
    params = [p for g in view.param_groups for p in g["params"]]
    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in params})
    if len(dtypes) > 1:
        raise ValueError("shard: the optimizer's parameters are of %s; sharding is planned for one dtype"
                         % " and ".join(dtypes))
    state = state_bytes_per_parameter(view, model, device)
    try:
        return _core.shard_optimizer_state([[p.numel() for p in g["params"]] for g in view.param_groups],
                                           world_size, state)
    except _core.InputError as e:
        raise ValueError(str(e)) from None


def measuring_optimizer(view, sharding):
    """The view's class and groups over the parameters of the largest share only."""
    rank, ranks = sharding["measured_rank"], iter(sharding["partition"])
    groups = []
    for g in view.param_groups:
        mine = [p for p in g["params"] if next(ranks) == rank]
        if mine:
            groups.append(dict(g, params=mine))
    return view.__class__(groups)


def check_plan_and_optimizer(plan, optimizer):
    """ValueError when a plan that shards the optimizer state meets an optimizer that does not:
    the whole state on every rank would not fit beside the planned microbatch."""
    if plan.sharding and not is_zero(optimizer):
        raise ValueError("the plan shards the optimizer state over %d ranks ($.sharding), but optimizer is a %s: "
                         "wrap it, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.%s, ...), "
                         "or re-plan with shard='off'" % (plan.sharding["world_size"], type(optimizer).__name__,
                                                          type(optimizer).__name__))
    if plan.sharding and optimizer.world_size != plan.sharding["world_size"]:
        raise ValueError("the plan shards the optimizer state over %d ranks but the ZeroRedundancyOptimizer over %d; "
                         "re-plan with world_size=%d" % (plan.sharding["world_size"], optimizer.world_size,
                                                         optimizer.world_size))


__all__ = []
