"""accumplan.errors — the errors a Python caller sees, and the core's messages in Python's words.

No torch and no compiled core needed: accumplan.plans (reading plans) and accumplan.train
(training) both raise these, and neither imports the other for them. ``in_python_terms`` maps
the C++ core's CLI option names (``--target-batch``) to the Python argument names
(``target_batch``); ``plan_error`` / ``oom_error`` wrap a core exception in it.
"""

import re


class PlanError(ValueError):
    """A plan that cannot be used: wrong schema, wrong major version, a missing or bad field
    (the message names its JSON path, e.g. ``$.microbatch_sizes[2]``), or a model whose hash
    differs from the plan's."""


class OutOfMemoryAtOne(RuntimeError):
    """Out of memory with a single-sample microbatch: nothing smaller exists to re-plan to."""


# The C++ core words its messages for the CLI; a Python user reads them with the names of
# accumplan.plan's arguments instead (its keyword for each option, or what stands for it).
_PYTHON_NAMES = {
    "target-batch": "target_batch", "target-tokens": "target_tokens", "world-size": "world_size", "memory-budget": "memory_budget",
    "headroom": "headroom", "optimizer": "optimizer", "normalization": "normalization", "loss": "loss",
    "amp": "amp", "max-grad-norm": "max_grad_norm", "ignore-index": "ignore_index", "device": "device",
    "lr": "the optimizer's lr", "multiple-of": "multiple_of", "plan": "the plan", "seq-len": "the sequence length",
}
_CLI_OPTION = re.compile(r"(?<![\w-])--([a-z][a-z0-9-]*)")


def in_python_terms(message):
    """A core message in Python's words: `accumplan plan ...` advice becomes accumplan.plan(...),
    --target-batch becomes target_batch (options Python has no argument for are left as they are)."""
    message = re.sub(r"`accumplan (?:plan|profile)((?: --[a-z-]+)*)`",
                     lambda m: "accumplan.plan(...%s)" % "".join(", %s=..." % _PYTHON_NAMES.get(o, o)
                                                                for o in re.findall(r"--([a-z-]+)", m.group(1))),
                     message)
    return _CLI_OPTION.sub(lambda m: _PYTHON_NAMES.get(m.group(1), m.group(0)), message)


def plan_error(e):
    """The core's refusal as PlanError, in Python's words."""
    return PlanError(in_python_terms(str(e)))


def oom_error(e):
    """The core's infeasible plan as OutOfMemoryAtOne, in Python's words."""
    return OutOfMemoryAtOne(in_python_terms(str(e)))
