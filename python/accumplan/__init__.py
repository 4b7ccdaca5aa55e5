"""accumplan — plan gradient accumulation for an nn.Module, and follow a plan from a PyTorch loop.

    import accumplan
    plan = accumplan.plan(model, (x,), y, target_batch=256, optimizer=opt, memory_budget="12GiB")
    plan.save("plan.json")                           # measured here, by real windows of train_window's step
    plan = accumplan.load_plan("plan.json")          # validates (schema 1.x); plan.microbatch_sizes, ...
    for x, y in windows:                             # a window = the per-rank batch (or a shorter last one)
        stats = plan.train_window(model, optimizer, (x,), y, loss="cross_entropy")   # OOM recovery inside

or, in your own loop:

    for (inputs, target), scale in plan.split((x,), y):
        (scale * accumplan.loss_sum(model(*inputs), target)).backward()
    optimizer.step(); optimizer.zero_grad()

Install: `python3 -m pip install --no-build-isolation .` from the repository root (builds the
compiled core, accumplan._core: the C++ planner's plan reader and rules). Reading, splitting and
re-planning plans need no torch; training needs it. docs/python.md has the rest.
"""

from .plans import (OutOfMemoryAtOne, PeerError, Plan, PlanError, balanced_split, file_sha256, largest_divisor_at_most,
                   load_plan, pack_by_token_budget, plan_ranks, split_samples, token_windows)

__version__ = "0.1.0"


def plan(model, inputs, target=None, **kwargs):
    """The plan for training ``model`` at an effective batch of ``target_batch``, measured in this
    process by real training windows (accumplan.measure.plan has the arguments):

        plan = accumplan.plan(model, (x,), y, target_batch=256, optimizer=opt, memory_budget="12GiB")
        plan.save("plan.json")   # the file `accumplan run`, export and report read
    """
    from .measure import plan as measured_plan  # needs torch; reading plans does not
    return measured_plan(model, inputs, target, **kwargs)



def __getattr__(name):
    # The torch-side API is imported on first use, so `load_plan` works without torch installed.
    if name.startswith("__"):
        raise AttributeError(name)
    import importlib
    train = importlib.import_module(__name__ + ".train")
    if name in train.__all__:
        return getattr(train, name)
    raise AttributeError("module 'accumplan' has no attribute %r" % name)


__all__ = ["plan", "load_plan", "plan_ranks", "Plan", "PlanError", "PeerError", "OutOfMemoryAtOne", "balanced_split", "split_samples",
           "largest_divisor_at_most", "file_sha256", "pack_by_token_budget", "token_windows", "pad_sequences",
           "padding_mask", "valid_token_counts", "is_oom", "loss_sum", "count_units", "model_output",
           "resolve_normalization", "split", "train_window", "evaluate", "all_reduce_gradients", "WindowStats",
           "EvalStats", "batch_dependent_layers"]
