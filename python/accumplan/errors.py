"""accumplan.errors — the errors a Python caller sees.

No torch needed: accumplan.plans (reading plans) and accumplan.train (training) both raise these.
The C++ core words its messages for Python at their source (it names accumplan.plan's arguments,
not the CLI's options, once accumplan._core is loaded), so a core error is wrapped, not rewritten.
"""


class PlanError(ValueError):
    """A plan that cannot be used: wrong schema, wrong major version, a missing or bad field
    (the message names its JSON path, e.g. ``$.microbatch_sizes[2]``), or a model whose hash
    differs from the plan's."""


class OutOfMemoryAtOne(RuntimeError):
    """Out of memory with a single-sample microbatch: nothing smaller exists to re-plan to (or an
    out-of-memory with recovery off, or during the optimizer step, which cannot be replayed)."""


class PeerError(PlanError):
    """Another rank of the plan's process group failed (its own error says why), or a collective
    with the other ranks did: this rank stops with it, its model and optimizer as they were before
    the window's update."""


def plan_error(e):
    """The core's refusal as PlanError."""
    return PlanError(str(e))


def oom_error(e):
    """The core's infeasible plan (or an out-of-memory its window loop could not recover from) as
    OutOfMemoryAtOne."""
    return OutOfMemoryAtOne(str(e))
