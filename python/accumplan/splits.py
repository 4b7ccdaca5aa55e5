"""accumplan.splits — the planner's arithmetic on windows, for a Python caller: balanced and
uniform splits, the pack of ragged sequences under a token budget, token windows.

What it is: argument checks (types and ranges, messages that name the argument) in front of the
C++ rules in accumplan._core; no rule is computed here. What it is not: the plan (accumplan.plans).
"""

import operator

from . import _core
from ._args import MAX_COUNT, choice_arg, int_arg, lengths_arg, shown_value
from .errors import plan_error

SPLITS = _core.SPLITS
MAX_ACCUMULATION_STEPS = _core.MAX_ACCUMULATION_STEPS  # the most microbatches of a window
STEP_COST_TERMS = _core.STEP_COST_TERMS  # their ranges are the C++ reader's (_core.check_step_cost)
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def balanced_split(total, parts, unit=1):
    """``total`` samples in ``parts`` microbatches, multiples of ``unit``, sizes differing by at
    most one unit, larger first: balanced_split(256, 5) == [52, 51, 51, 51, 51]."""
    total = int_arg(total, "total", 1, MAX_COUNT)
    parts = int_arg(parts, "parts", 1, MAX_ACCUMULATION_STEPS)
    unit = int_arg(unit, "unit", 1, MAX_COUNT)
    if total % unit != 0 or total // unit < parts:
        raise ValueError("balanced_split(%d, %d, %d) has no solution: total must be a multiple of unit and hold "
                         "at least parts units" % (total, parts, unit))
    return _core.balanced_split(total, parts, unit)


def largest_divisor_at_most(total, limit, unit=1):
    """The largest d <= limit that divides total and is a multiple of unit; 0 if none (at most
    2**20 steps: divisors come in pairs)."""
    return _core.largest_divisor_at_most(int_arg(total, "total", 1, MAX_COUNT), int_arg(limit, "limit", 1, MAX_COUNT),
                                         int_arg(unit, "unit", 1, MAX_COUNT))


def split_samples(total, max_micro_batch, split="balanced", unit=1):
    """Fewest microbatches of at most ``max_micro_batch`` covering ``total`` samples: balanced
    (k = ceil(total / m), sizes differing by at most one unit) or uniform (equal sizes dividing
    total). A total that is not a multiple of ``unit`` (a short last window) ignores the unit.
    Raises ValueError when that takes more than 2**20 microbatches (the C++ planner's limit)."""
    return _core.split_samples(int_arg(total, "total", 1, MAX_COUNT),
                               int_arg(max_micro_batch, "max_micro_batch", 1, MAX_COUNT),
                               choice_arg(split, "split", SPLITS), int_arg(unit, "unit", 1, MAX_COUNT))


def pack_by_token_budget(lengths, token_budget, step_cost=None):
    """Packs sequences of ``lengths`` (tokens, each >= 1) into microbatches under a token budget,
    the rule of the C++ executor (accumplan/token_model.h): indices sorted by length, longest
    first (ties in index order), cut into consecutive runs, each padded to its first (longest)
    member L and holding at most ``token_budget // L`` sequences; of all such cuts the one of least
    total ``step_cost`` (the plan's ``tokens.step_cost``: ``per_microbatch + per_token*b*L +
    per_token_squared*b*L*L`` per microbatch, exact integers, ties to the larger first microbatch).
    Without a step cost: the fewest microbatches, each as full as the budget allows. Returns lists
    of indices; every index once. Raises PlanError for a sequence longer than the budget."""
    token_budget = int_arg(token_budget, "token_budget", 1, MAX_COUNT)
    lengths = lengths_arg(lengths, "lengths", minimum=1)
    try:
        return _core.pack_by_token_budget(lengths, token_budget, _step_cost_arg(step_cost))
    except _core.InputError as e:
        raise plan_error(e) from None


def _step_cost_arg(step_cost):
    """(per_microbatch, per_token, per_token_squared) of a step cost (a dict like the plan's
    ``tokens.step_cost``), or None: the fewest microbatches. Types are checked here; each term's
    range is the C++ plan reader's (``_core.check_step_cost``), refused with its message."""
    if step_cost is None:
        return None
    if not isinstance(step_cost, dict):
        raise TypeError("step_cost must be None or a dict with %s, not %s (%s)"
                        % (", ".join(STEP_COST_TERMS), type(step_cost).__name__, shown_value(step_cost)))
    missing = [k for k in STEP_COST_TERMS if k not in step_cost]
    if missing:
        raise ValueError("step_cost has no %s" % ", ".join(missing))
    terms = tuple(int_arg(step_cost[k], "step_cost[%r]" % k, INT64_MIN, INT64_MAX) for k in STEP_COST_TERMS)
    try:
        _core.check_step_cost(*terms)
    except _core.InputError as e:
        raise ValueError(str(e)) from None
    return terms


def _as_count(value):
    """``value`` as a Python int when it is an integer (int, numpy or 0-d torch integer), else None;
    bool is not a count."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def token_windows(valid_tokens, target_tokens):
    """The optimizer windows of a packed plan with ``tokens.target_tokens`` (schema 1.4), the rule of
    the C++ executor: ``valid_tokens`` holds each sequence's valid tokens, in data order; returns
    ``(start, count)`` pairs of consecutive windows covering every sequence once, in order. A window
    closes at the first sequence that brings its running sum to >= ``target_tokens``; the last
    window holds what remains (it may be short). Every window holds at least one sequence.

    token_windows([5, 5, 5, 5, 5], 10) == [(0, 2), (2, 2), (4, 1)]; [] gives []."""
    target = _as_count(target_tokens)
    if target is None or target < 1:
        raise ValueError("target_tokens must be an integer >= 1, got %r" % (target_tokens,))
    if target >= 1 << 63:
        raise ValueError("target_tokens is %d, beyond 64 bits" % target)
    counts = []
    for i, v in enumerate(valid_tokens):
        c = _as_count(v)
        if c is None or c < 0 or c >= 1 << 63:
            raise ValueError("valid_tokens[%d] must be an integer >= 0 (the sequence's valid tokens), got %r" % (i, v))
        counts.append(c)
    return _core.token_windows(counts, target)
