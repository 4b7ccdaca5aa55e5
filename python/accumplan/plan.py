"""accumplan.plan — read, validate and re-split a plan.json; no torch needed here.

The arithmetic mirrors the C++ planner and executor (planner/src/solver.cpp ``balanced_split``,
``split_samples``; planner/src/token_model.cpp ``pack_by_token_budget``, ``token_windows``;
planner/src/replan.cpp ``window_sizes``, ``replan_below``) so that a Python
trainer splits, weights and re-plans exactly as ``accumplan run`` does. docs/plan-format.md
describes every field; docs/oom-contract.md the re-planning rule.
"""

import copy
import hashlib
import json
import math
import operator
import os
import re
import stat

from ._args import INT32_MAX, INT32_MIN, MAX_COUNT, _shown, bound_text, choice_arg, int_arg, lengths_arg, path_arg

SCHEMA = "accumplan.plan"
SUPPORTED_MAJOR = 1
SPLITS = ("balanced", "uniform")
# The C++ reader's limit (json_io.h kMaxInputFileBytes): a plan is a few KiB; 256 MiB is a wrong file.
MAX_PLAN_BYTES = 256 << 20
MAX_JSON_DEPTH = 64  # json_io.h kMaxJsonDepth: a plan nests 4 levels
MAX_JSON_VALUES = 1 << 20  # a plan holds hundreds; a dict sharing one list 2**60 times is refused, not expanded
MAX_ACCUMULATION_STEPS = 1 << 20  # solver.h kMaxAccumulationSteps: the most microbatches of a window
# The step cost's documented ranges (docs/plan-format.md), for the reader and pack_by_token_budget.
STEP_COST_LIMITS = {"per_microbatch": (0, 1 << 50), "per_token": (1, 1 << 16), "per_token_squared": (0, 1 << 30)}


class PlanError(ValueError):
    """A plan that cannot be used: wrong schema, wrong major version, a missing or bad field
    (the message names its JSON path, e.g. ``$.microbatch_sizes[2]``), or a model whose hash
    differs from the plan's."""


class OutOfMemoryAtOne(RuntimeError):
    """Out of memory with a single-sample microbatch: nothing smaller exists to re-plan to."""


# --- the planner's arithmetic ----------------------------------------------------------------

def balanced_split(total, parts, unit=1):
    """``total`` samples in ``parts`` microbatches, multiples of ``unit``, sizes differing by at
    most one unit, larger first: balanced_split(256, 5) == [52, 51, 51, 51, 51]."""
    total = int_arg(total, "total", 1, MAX_COUNT)
    parts = int_arg(parts, "parts", 1, MAX_ACCUMULATION_STEPS)
    unit = int_arg(unit, "unit", 1, MAX_COUNT)
    if total % unit != 0 or total // unit < parts:
        raise ValueError("balanced_split(%d, %d, %d) has no solution: total must be a multiple of unit and hold "
                         "at least parts units" % (total, parts, unit))
    units = total // unit
    q, r = divmod(units, parts)
    return [(q + 1) * unit if i < r else q * unit for i in range(parts)]


def largest_divisor_at_most(total, limit, unit=1):
    """The largest d <= limit that divides total and is a multiple of unit; 0 if none. Divisors
    come in pairs (i, total // i), i <= sqrt(total): at most 2**20 steps, as the C++ planner."""
    total = int_arg(total, "total", 1, MAX_COUNT)
    limit = int_arg(limit, "limit", 1, MAX_COUNT)
    unit = int_arg(unit, "unit", 1, MAX_COUNT)
    best = 0
    for i in range(1, math.isqrt(total) + 1):
        if total % i == 0:
            for d in (i, total // i):
                if best < d <= limit and d % unit == 0:
                    best = d
    return best


def split_samples(total, max_micro_batch, split="balanced", unit=1):
    """Fewest microbatches of at most ``max_micro_batch`` covering ``total`` samples: balanced
    (k = ceil(total / m), sizes differing by at most one unit) or uniform (equal sizes dividing
    total). A total that is not a multiple of ``unit`` (a short last window) ignores the unit.
    Raises ValueError when that takes more than 2**20 microbatches (the C++ planner's limit)."""
    total = int_arg(total, "total", 1, MAX_COUNT)
    max_micro_batch = int_arg(max_micro_batch, "max_micro_batch", 1, MAX_COUNT)
    split = choice_arg(split, "split", SPLITS)
    unit = int_arg(unit, "unit", 1, MAX_COUNT)
    if total % unit != 0:
        unit = 1
    cap = max(unit, (max_micro_batch // unit) * unit)
    d = largest_divisor_at_most(total, cap, unit) if split == "uniform" else 0
    parts = total // d if d else -(-(total // unit) // (cap // unit))
    if parts > MAX_ACCUMULATION_STEPS:
        raise ValueError("split_samples: %d samples in microbatches of at most %d need %d microbatches; accumplan "
                         "splits a window into at most %d" % (total, cap, parts, MAX_ACCUMULATION_STEPS))
    return [d] * parts if d else balanced_split(total, parts, unit)


# --- validation helpers ----------------------------------------------------------------------

def pack_by_token_budget(lengths, token_budget, step_cost=None):
    """Packs sequences of ``lengths`` (tokens, each >= 1) into microbatches under a token budget,
    the rule of the C++ executor (accumplan/token_model.h): indices sorted by length, longest
    first (ties in index order), cut into consecutive runs, each padded to its first (longest)
    member L and holding at most ``token_budget // L`` sequences; of all such cuts the one of least
    total ``step_cost`` (the plan's ``tokens.step_cost``: ``per_microbatch + per_token*b*L +
    per_token_squared*b*L*L`` per microbatch, exact integers, ties to the larger first microbatch).
    Without a step cost: the fewest microbatches, each as full as the budget allows. Returns lists
    of indices; every index once. Raises PlanError for a sequence longer than the budget.
    O(n * token_budget / shortest length) steps."""
    token_budget = int_arg(token_budget, "token_budget", 1, MAX_COUNT)
    lengths = lengths_arg(lengths, "lengths", minimum=1)
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable: ties keep index order
    if order and lengths[order[0]] > token_budget:
        raise PlanError("sequence %d has %d tokens, more than the token budget of %d padded tokens per "
                        "microbatch; truncate the sequences to at most %d tokens or raise the budget"
                        % (order[0], lengths[order[0]], token_budget, token_budget))
    per_mb, per_tok, per_sq = _step_cost_arg(step_cost)
    n = len(order)
    best = [0] * (n + 1)  # best[i]: least cost of packing order[i:]; end[i]: its first microbatch's end
    end = [n] * (n + 1)
    for i in range(n - 1, -1, -1):
        length = lengths[order[i]]
        per_sequence = per_tok * length + per_sq * length * length
        last = min(n, i + token_budget // length)
        best_i, end_i = None, None
        for j in range(i + 1, last + 1):
            total = per_mb + per_sequence * (j - i) + best[j]
            if best_i is None or total <= best_i:  # <=: ties go to the larger first microbatch
                best_i, end_i = total, j
        best[i], end[i] = best_i, end_i
    out, i = [], 0
    while i < n:
        out.append(order[i:end[i]])
        i = end[i]
    return out


def _step_cost_arg(step_cost):
    """(per_microbatch, per_token, per_token_squared) of a step cost (a dict like the plan's
    ``tokens.step_cost``, each in its documented range), or (1, 0, 0) for None: the fewest microbatches."""
    if step_cost is None:
        return 1, 0, 0  # every microbatch costs the same: the fewest
    if not isinstance(step_cost, dict):
        raise TypeError("step_cost must be None or a dict with %s, not %s (%s)"
                        % (", ".join(STEP_COST_LIMITS), type(step_cost).__name__, _shown(step_cost)))
    missing = [k for k in STEP_COST_LIMITS if k not in step_cost]
    if missing:
        raise ValueError("step_cost has no %s" % ", ".join(missing))
    return tuple(int_arg(step_cost[k], "step_cost[%r]" % k, lo, hi) for k, (lo, hi) in STEP_COST_LIMITS.items())


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
    counts = []
    for i, v in enumerate(valid_tokens):
        c = _as_count(v)
        if c is None or c < 0:
            raise ValueError("valid_tokens[%d] must be an integer >= 0 (the sequence's valid tokens), got %r" % (i, v))
        counts.append(c)
    out, start, running = [], 0, 0
    for i, c in enumerate(counts):
        running += c
        if running >= target:
            out.append((start, i + 1 - start))
            start, running = i + 1, 0
    if start < len(counts):
        out.append((start, len(counts) - start))
    return out


def _field(obj, key, path, kinds, required=True, default=None):
    if not isinstance(obj, dict):
        raise PlanError("%s must be an object" % path)
    if key not in obj or obj[key] is None:
        if required:
            raise PlanError("%s.%s is missing" % (path, key))
        return default
    value = obj[key]
    # bool is an int in Python; JSON true is never a size.
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        raise PlanError("%s.%s must be %s, got %s" % (path, key, _kind_name(kinds), _shown(value)))
    return value


def _kind_name(kinds):
    names = {int: "an integer", float: "a number", str: "a string", list: "an array",
             dict: "an object", bool: "true or false"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _positive_int(obj, key, path, required=True, default=None):
    v = _field(obj, key, path, (int,), required, default)
    if v is not None and v < 1:
        raise PlanError("%s.%s must be at least 1, got %d" % (path, key, v))
    return v


def file_sha256(path):
    """The SHA-256 of the regular file at ``path``, in hex. Refuses, with PlanError naming the
    path and before opening it, a directory, a FIFO (never waited on), a device or a socket."""
    return _file_sha256(path, "path")


def _file_sha256(path, what):
    h = hashlib.sha256()
    with _open_regular(path, what)[0] as f:
        try:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        except OSError as e:
            raise PlanError("cannot read %s %s: %s" % (what, _shown(os.fsdecode(path)), e.strerror)) from None
    return h.hexdigest()


def _open_regular(path, what):
    """(binary file object, os.stat_result) of the regular file at ``path`` (``what`` names it in
    messages: "plan", "model"). TypeError for a path that is not str, bytes or os.PathLike (an int
    would be a file descriptor); PlanError, before opening anything, for a missing path, a
    directory, a FIFO (which would block for ever), a device or a socket. Opened non-blocking and
    checked again, so a FIFO put in its place meanwhile is refused too."""
    try:
        path = path_arg(path, what)
    except ValueError as e:
        raise PlanError(str(e)) from None
    name = _shown(os.fsdecode(path))
    try:
        st = os.stat(path)
        if stat.S_ISREG(st.st_mode):
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                os.close(fd)
    except OSError as e:
        raise PlanError("cannot read %s %s: %s" % (what, name, e.strerror)) from None
    if stat.S_ISDIR(st.st_mode):
        raise PlanError("%s %s is a directory; give the path of the %s file" % (what, name, what))
    if not stat.S_ISREG(st.st_mode):
        raise PlanError("%s %s is not a regular file (a FIFO, device or socket); give the path of the %s file"
                        % (what, name, what))
    return os.fdopen(fd, "rb"), st


# --- the document's JSON: what the C++ reader (json_io.cpp, schema.cpp check_ranges) refuses ----------

_TOO_DEEP = "nested too deep (more than %d levels); a plan nests 4" % MAX_JSON_DEPTH
_BYTES, _SAMPLES = float(1 << 50), float(1 << 40)
# (lo, hi, lo_open, hi_open) of a number by the key that holds it, wherever it sits; an array's
# numbers take its key's range. schema.cpp range_of; docs/plan-format.md "Ranges".
_RANGES = dict(
    [(k, (-_BYTES, _BYTES, False, False)) for k in ("intercept_bytes", "residuals_bytes", "slope_bytes_per_sample",
                                                    "activation_fixed_bytes", "activation_bytes_per_sample")] +
    [(k, (1, _SAMPLES, False, False)) for k in ("micro_batch", "target_batch", "per_rank_batch", "max_micro_batch",
                                                "multiple_of", "microbatch_sizes", "window", "accumulation_steps")] +
    [(k, (lo, hi, False, False)) for k, (lo, hi) in STEP_COST_LIMITS.items()],
    fitted_from_micro_batch=(0, _SAMPLES, False, False), world_size=(1, 1 << 20, False, False),
    index=(0, 65535, False, False), parameter_count=(0, _BYTES, False, False), weights=(0, 1, True, False),
    headroom=(0, 1, False, True), lr=(0, 1e6, True, False), max_grad_norm=(0, 1e12, True, False),
    ignore_index=(INT32_MIN, INT32_MAX, False, False), token_budget=(1, _SAMPLES, False, False),
    max_seq_len=(1, 1 << 31, False, False), seq_len=(1, 1 << 31, False, False),
    longest_sequence_alone=(0, 1 << 31, False, False), target_tokens=(1, _BYTES, False, False),
    seconds=(0, 1e9, False, False))
_SUFFIX_RANGES = (("_bytes", (0, _BYTES, False, False)), ("_seconds", (0, 1e9, False, False)),
                  ("_fraction", (0, 1, False, False)))


class _LongInteger:
    """An integer of more than 40 digits in a plan file: never a plan's number (int() of 10**5
    digits is slow, and refused past 4300 digits); Plan refuses it with its JSON path."""

    def __init__(self, text):
        self.digits = len(text.lstrip("-"))


def _parse_int(text):
    return int(text) if len(text) <= 41 else _LongInteger(text)


def _range_of(key, in_hyperparameters):
    if in_hyperparameters:
        return (-1e6, 1e6, False, False)
    if key in _RANGES:
        return _RANGES[key]
    return next((r for suffix, r in _SUFFIX_RANGES if key.endswith(suffix)), None)


def _number_problem(v, number_range):
    """(why ``v`` cannot be in a plan, whether a field's own check may say it first) or None.
    Refused at once: a value that is no JSON value, a non-finite float, an integer beyond 64 bits;
    deferred (the field's own message goes first): a number outside its key's range."""
    if v is None or isinstance(v, (str, bool)):
        return None
    if isinstance(v, _LongInteger):
        return "an integer of %d digits is out of range" % v.digits, False
    if not isinstance(v, (int, float)):
        return "a value of type %s is not JSON" % type(v).__name__, False
    if isinstance(v, float) and not math.isfinite(v):
        return "%s is not a finite number" % v, False
    wide = isinstance(v, int) and not -(1 << 63) <= v < (1 << 64)
    if number_range is not None:
        lo, hi, lo_open, hi_open = number_range
        if not ((lo < v if lo_open else lo <= v) and (v < hi if hi_open else v <= hi)):
            shown = "an integer of %d bits" % v.bit_length() if wide and v.bit_length() > 256 else json.dumps(v)
            return ("%s is out of range; expected a number in %s%s, %s%s" % (
                shown, "(" if lo_open else "[", bound_text(lo), bound_text(hi), ")" if hi_open else "]"), not wide)
    return ("an integer of %d bits is out of the 64-bit range" % v.bit_length(), False) if wide else None


def _key_text(key):
    """A key in a JSON path, cut to 40 characters as the C++ messages cut it; escapes kept to one line."""
    text = repr(key)[1:-1]
    return text if len(text) <= 40 else text[:37] + "..."


def _json_copy(doc, source):
    """A copy of the plan object ``doc`` checked as the C++ reader checks a plan file: nested at
    most MAX_JSON_DEPTH levels, string keys, JSON values only, finite numbers, integers within 64
    bits, at most MAX_JSON_VALUES values (a container shared or cyclic is copied per occurrence,
    so refused there, never expanded without end). Iterative: no RecursionError. Returns (copy,
    the first number outside its key's range as a PlanError message, or None)."""
    root, count, deferred = {}, 0, None
    stack = [(doc, root, "$", "", False, 1)]  # (container, its copy, path, key, in hyperparameters, depth)
    while stack:
        src, dst, path, key, in_hyper, depth = stack.pop()
        count += len(src)
        if count > MAX_JSON_VALUES:
            raise PlanError("%s: more than %d JSON values; a plan holds hundreds" % (source, MAX_JSON_VALUES))
        is_dict = isinstance(src, dict)
        array_range = None if is_dict else _range_of(key, in_hyper)
        for k, v in (src.items() if is_dict else enumerate(src)):
            if is_dict and not isinstance(k, str):
                raise PlanError("%s: %s has the key %s; JSON keys are strings" % (source, path, _shown(k)))
            if v is None or type(v) in (str, bool):
                new = v
            elif isinstance(v, (dict, list, tuple)):
                where = path + "." + _key_text(k) if is_dict else "%s[%d]" % (path, k)
                if depth >= MAX_JSON_DEPTH:
                    raise PlanError("%s: %s: %s" % (source, where, _TOO_DEEP))
                new = {} if isinstance(v, dict) else []
                stack.append((v, new, where, k if is_dict else "", is_dict and key == "hyperparameters", depth + 1))
            else:
                new = v
                problem = _number_problem(v, _range_of(k, key == "hyperparameters") if is_dict else array_range)
                if problem and (not problem[1] or deferred is None):
                    message = "%s: %s: %s" % (source, path + "." + _key_text(k) if is_dict else "%s[%d]" % (path, k),
                                              problem[0])
                    if not problem[1]:
                        raise PlanError(message)
                    deferred = message
            if is_dict:
                dst[k] = new
            else:
                dst.append(new)
    return root, deferred


# --- the plan ----------------------------------------------------------------------------------

class Plan:
    """A validated plan.json (schema ``accumplan.plan``, any 1.x version).

    Attributes a trainer needs: ``target_batch``, ``world_size``, ``per_rank_batch``,
    ``microbatch_sizes``, ``weights``, ``micro_batch``, ``accumulation_steps``,
    ``max_micro_batch``, ``split_kind`` (the plan's ``split``: "balanced" or "uniform"; the name
    ``split`` is the method), ``multiple_of``, ``normalization``, ``loss``, ``ignore_index``,
    ``memory``, ``fit``, ``setup``, ``model``, ``device``, ``profile`` (1.1 plans; None in 1.0),
    ``tokens`` (1.3 packed plans for ragged data: ``token_budget``, ``max_seq_len``,
    ``longest_sequence_alone``; None for sample plans), ``target_tokens`` (1.4 packed plans whose
    optimizer windows hold a number of valid tokens, see ``token_windows``; None otherwise),
    ``padding_mask``, ``raw`` (the whole document). ``replans`` lists the re-plans made after
    out-of-memory errors.

    The training methods (``split``, ``train_window``) need torch; see accumplan.train.
    """

    def __init__(self, doc, source="plan"):
        self.source = source
        if not isinstance(doc, dict):
            raise PlanError("%s: the document must be a JSON object, not %s" % (source, type(doc).__name__))
        self.raw, out_of_range = _json_copy(doc, source)
        self._validate(self.raw)
        if out_of_range:  # after the fields' own checks, whose messages say more
            raise PlanError(out_of_range)
        self.replans = []

    # ---- reading ----
    def _validate(self, d):
        if not isinstance(d, dict):
            raise PlanError("%s: the document must be a JSON object" % self.source)
        schema = d.get("schema")
        if schema != SCHEMA:
            hint = " (this is a profile: plan it with `accumplan plan --profile`)" if schema == "accumplan.profile" else ""
            raise PlanError("%s: $.schema is %r, not %r%s" % (self.source, schema, SCHEMA, hint))
        version = d.get("schema_version")
        if not isinstance(version, str) or len(version) > 19 or not re.fullmatch(r"[0-9]+\.[0-9]+", version):
            raise PlanError("%s: $.schema_version: %s is not MAJOR.MINOR (digits, a dot, digits, e.g. \"1.5\")"
                            % (self.source, _shown(version)))
        major = int(version.split(".")[0])
        if major != SUPPORTED_MAJOR:
            raise PlanError("%s: schema_version %s is not supported: this reader reads %d.x plans; "
                            "use the accumplan release that wrote it" % (self.source, version, SUPPORTED_MAJOR))
        self.schema_version = version
        p = "$"
        self.target_batch = _positive_int(d, "target_batch", p)
        self.world_size = _positive_int(d, "world_size", p)
        self.per_rank_batch = _positive_int(d, "per_rank_batch", p)
        if self.per_rank_batch * self.world_size != self.target_batch:
            raise PlanError("%s: per_rank_batch %d x world_size %d is not target_batch %d"
                            % (self.source, self.per_rank_batch, self.world_size, self.target_batch))
        sizes = _field(d, "microbatch_sizes", p, (list,))
        if not sizes:
            raise PlanError("%s: $.microbatch_sizes is empty" % self.source)
        for i, n in enumerate(sizes):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise PlanError("%s: $.microbatch_sizes[%d] must be an integer >= 1, got %r" % (self.source, i, n))
        if sum(sizes) != self.per_rank_batch:
            raise PlanError("%s: $.microbatch_sizes (%s) sum to %d, not per_rank_batch %d"
                            % (self.source, ",".join(map(str, sizes)), sum(sizes), self.per_rank_batch))
        self._check_weights(d.get("weights"), sizes)
        self.microbatch_sizes = list(sizes)
        self.max_micro_batch = _positive_int(d, "max_micro_batch", p, required=False, default=max(sizes))
        self.split_kind = _field(d, "split", p, (str,), required=False, default="balanced")
        if self.split_kind not in SPLITS:
            raise PlanError("%s: $.split must be 'balanced' or 'uniform', got %r" % (self.source, self.split_kind))
        self.multiple_of = _positive_int(d, "multiple_of", p, required=False, default=None)
        self.memory = _field(d, "memory", p, (dict,), required=False, default={})
        self.fit = _field(d, "fit", p, (dict,), required=False, default={})
        self.setup = _field(d, "setup", p, (dict,), required=False, default={})
        self.model = _field(d, "model", p, (dict,), required=False, default={})
        self.device = _field(d, "device", p, (dict,), required=False, default={})
        self.profile = _field(d, "profile", p, (dict,), required=False, default=None)  # 1.1
        for key in ("intercept_bytes", "slope_bytes_per_sample"):
            _field(self.fit, key, "$.fit", (int, float), required=False)
        _field(self.memory, "usable_bytes", "$.memory", (int, float), required=False)
        # 1.2: the margin kept free below the budget, in bytes (usable_bytes = budget_bytes - margin_bytes)
        self.margin_bytes = _field(self.memory, "margin_bytes", "$.memory", (int, float), required=False, default=None)
        self.loss = _field(self.setup, "loss", "$.setup", (str,), required=False, default="cross_entropy")
        self.normalization = _field(self.setup, "normalization", "$.setup", (str,), required=False, default="auto")
        if self.normalization not in ("auto", "samples", "tokens"):
            raise PlanError("%s: $.setup.normalization must be auto, samples or tokens, got %r"
                            % (self.source, self.normalization))
        self.ignore_index = _field(self.setup, "ignore_index", "$.setup", (int,), required=False, default=-100)
        # 1.3: ragged data packed under a token budget; absent (None) for sample plans.
        self.padding_mask = bool(_field(self.setup, "padding_mask", "$.setup", (bool,), required=False, default=False))
        tokens = _field(d, "tokens", p, (dict, type(None)), required=False, default=None)
        if tokens is not None:
            tokens = dict(tokens)
            for key in ("token_budget", "max_seq_len"):
                _positive_int(tokens, key, "$.tokens")
            if tokens["max_seq_len"] > tokens["token_budget"]:
                raise PlanError("%s: $.tokens: token_budget %d must hold at least one sequence of max_seq_len %d tokens"
                                % (self.source, tokens["token_budget"], tokens["max_seq_len"]))
        self.tokens = tokens
        # 1.4: each optimizer window holds at least this many valid tokens (over all ranks), not a
        # fixed number of samples; token_windows() cuts them. None: windows of per_rank_batch samples.
        self.target_tokens = _positive_int(tokens, "target_tokens", "$.tokens", required=False) if tokens else None
        # 1.4: what packing minimises (pack_by_token_budget); None: the fewest microbatches.
        self.step_cost = None
        if tokens and tokens.get("step_cost") is not None:
            cost = _field(tokens, "step_cost", "$.tokens", (dict,))
            limits = {"per_microbatch": (0, 1 << 50), "per_token": (1, 1 << 16), "per_token_squared": (0, 1 << 30)}
            for key, (lo, hi) in limits.items():
                v = _field(cost, key, "$.tokens.step_cost", (int,))
                if isinstance(v, bool) or not lo <= v <= hi:
                    raise PlanError("%s: $.tokens.step_cost.%s must be an integer in [%d, %d], got %r"
                                    % (self.source, key, lo, hi, v))
            self.step_cost = {k: cost[k] for k in limits}
            # 1.5: the seconds of per_token units, so the cost predicts seconds (ranged as every *_seconds).
            if cost.get("token_seconds") is not None:
                self.step_cost["token_seconds"] = _field(cost, "token_seconds", "$.tokens.step_cost", (int, float))
        self.confirmed = _field(d, "confirmed", p, (bool,), required=False, default=False)
        self.reason = _field(d, "reason", p, (str,), required=False, default="")

    def _check_weights(self, weights, sizes):
        """$.weights: one number per microbatch, each microbatch_sizes[i] / per_rank_batch (to 1e-9),
        as the C++ reader requires: a hand-edited weight would silently mis-weight."""
        if not isinstance(weights, list):
            raise PlanError("%s: $.weights must be an array of numbers, got %s" % (self.source, _shown(weights)))
        if len(weights) != len(sizes):
            raise PlanError("%s: $.weights has %d entries for %d microbatches" % (self.source, len(weights), len(sizes)))
        for i, (w, n) in enumerate(zip(weights, sizes)):
            if isinstance(w, bool) or not isinstance(w, (int, float)):
                raise PlanError("%s: $.weights[%d] must be a number, got %s" % (self.source, i, _shown(w)))
            expected = n / self.per_rank_batch
            if not abs(w - expected) <= 1e-9:
                raise PlanError("%s: $.weights[%d]: %s is not microbatch_sizes[%d] / per_rank_batch = %s; re-plan "
                                "with `accumplan plan`" % (self.source, i, _shown(w), i, json.dumps(expected)))

    @property
    def micro_batch(self):
        return max(self.microbatch_sizes)

    @property
    def accumulation_steps(self):
        return len(self.microbatch_sizes)

    @property
    def weights(self):
        """n_i / per_rank_batch: the weight of each microbatch's MEAN loss in a full window."""
        return [n / self.per_rank_batch for n in self.microbatch_sizes]

    def check_model(self, model_path, force=False):
        """Raises PlanError when the file's SHA-256 differs from the plan's ``model.sha256``
        (unless ``force``). Returns the file's hash."""
        if not isinstance(force, bool):
            raise TypeError("force must be True or False, not %s (%s)" % (type(force).__name__, _shown(force)))
        digest = _file_sha256(model_path, "model")
        want = self.model.get("sha256")
        if want and digest != want and not force:
            raise PlanError("%s was planned for a model with SHA-256 %s, but %s has %s; re-plan for this model "
                            "or pass force=True" % (self.source, want, model_path, digest))
        return digest

    # ---- splitting and re-planning ----
    @property
    def windows_by_tokens(self):
        """True for a packed plan with ``tokens.target_tokens``: a window holds any number of samples
        (as many as its valid tokens need), not at most ``per_rank_batch``."""
        return self.tokens is not None and self.target_tokens is not None

    def window_sizes(self, samples):
        """Microbatch sizes of a window of ``samples`` on this rank: the plan's own sizes for a full
        window; a short window is re-split under the plan's largest microbatch (a size the full
        window already ran), as the C++ executor does. A plan with ``target_tokens`` splits a window
        of any size >= 1 under that largest microbatch."""
        samples = int_arg(samples, "samples", 1, MAX_COUNT)
        if samples == self.per_rank_batch:
            return list(self.microbatch_sizes)
        if samples > self.per_rank_batch and not self.windows_by_tokens:
            raise ValueError("samples is %d: a window holds 1..%d samples (the plan's per-rank batch)"
                             % (samples, self.per_rank_batch))
        return split_samples(samples, max(self.microbatch_sizes), self.split_kind, self.multiple_of or 1)

    def largest_fitting(self):
        """The largest microbatch b with fit.intercept_bytes + fit.slope_bytes_per_sample * b <=
        memory.usable_bytes (the budget less the margin), or None when the plan carries no memory
        model."""
        a = self.fit.get("intercept_bytes")
        s = self.fit.get("slope_bytes_per_sample")
        usable = self.memory.get("usable_bytes")
        if a is None or s is None or not usable or s <= 0:
            return None
        return int(math.floor((usable - a) / s))

    def replan_below(self, failing_micro_batch):
        """Re-plans in place after microbatch size ``failing_micro_batch`` ran out of memory: the
        same per-rank batch, every microbatch strictly smaller, the fewest microbatches the memory
        model allows, split as the plan splits. Returns a one-line note. Raises OutOfMemoryAtOne
        when the failing size is 1."""
        failing_micro_batch = int_arg(failing_micro_batch, "failing_micro_batch", 1, MAX_COUNT)
        if failing_micro_batch <= 1:
            budget = self.memory.get("budget_bytes")
            raise OutOfMemoryAtOne(
                "out of memory at microbatch size 1: the model's weights, gradients and optimizer state plus one "
                "sample do not fit%s. Nothing smaller can be tried; raise the budget, free device memory, or use "
                "a smaller model or sequence" % (" the budget of %d bytes" % budget if budget else ""))
        T = self.per_rank_batch
        bound = min(failing_micro_batch - 1, self.max_micro_batch)
        unit = self.multiple_of or 1
        how = []
        if unit > bound or T % unit != 0:
            how.append("multiple_of %d dropped (no multiple of it fits below %d)" % (unit, failing_micro_batch))
            unit = 1
        m = min(bound, T)
        fitting = self.largest_fitting()
        if fitting is not None and fitting >= unit and fitting < m:
            m = fitting
            how.append("memory model allows %d" % fitting)
        m = max(unit, (m // unit) * unit)
        old = list(self.microbatch_sizes)
        self.microbatch_sizes = split_samples(T, m, self.split_kind, unit)
        self.max_micro_batch = m
        if unit == 1:
            self.multiple_of = None
        self.confirmed = False
        note = ("out of memory at microbatch %d: re-split %d samples under max_micro_batch %d into %s (was %s)%s"
                % (failing_micro_batch, T, m, ",".join(map(str, self.microbatch_sizes)), ",".join(map(str, old)),
                   "; " + "; ".join(how) if how else ""))
        self.replans.append(note)
        self.reason = (self.reason + " " if self.reason else "") + (
            "Re-planned during training after microbatch %d ran out of memory: %d microbatches (%s)."
            % (failing_micro_batch, self.accumulation_steps, ",".join(map(str, self.microbatch_sizes))))
        return note

    def pack(self, lengths):
        """The microbatches of one window of ragged data under a packed plan (``plan.tokens``):
        lists of sample indices, longest first, each at most the token budget in padded tokens.
        Raises PlanError for a plan without a token budget, or a sequence longer than the plan's
        ``max_seq_len`` (the budget was planned for sequences up to it)."""
        if self.tokens is None:
            raise PlanError("%s packs no tokens: it is a sample plan (no $.tokens); split its windows by "
                            "microbatch_sizes" % self.source)
        lengths = lengths_arg(lengths, "lengths", minimum=1)
        longest = max(lengths, default=0)
        if longest > self.tokens["max_seq_len"]:
            raise PlanError("the window holds a sequence of %d tokens, longer than the %d tokens the plan's token "
                            "budget was planned for ($.tokens.max_seq_len); truncate the sequences or plan again "
                            "with a longer --seq-len" % (longest, self.tokens["max_seq_len"]))
        return pack_by_token_budget(lengths, self.tokens["token_budget"], self.step_cost)

    def repack_below(self, failing_tokens, longest_sequence):
        """Lowers the token budget in place below ``failing_tokens`` (the padded tokens of a
        microbatch that ran out of memory), as the C++ executor does. Returns a one-line note.
        Raises OutOfMemoryAtOne when the new budget cannot hold ``longest_sequence``."""
        failing_tokens = int_arg(failing_tokens, "failing_tokens", 1, MAX_COUNT)
        longest_sequence = int_arg(longest_sequence, "longest_sequence", 1, MAX_COUNT)
        budget = min(self.tokens["token_budget"], failing_tokens - 1)
        if budget < longest_sequence:
            raise OutOfMemoryAtOne(
                "out of memory at %d padded tokens: a token budget below it cannot hold the window's longest "
                "sequence of %d tokens, and one sequence cannot be split. Truncate the sequences to fewer "
                "tokens, or raise the budget" % (failing_tokens, longest_sequence))
        self.tokens["token_budget"] = budget
        self.tokens["max_seq_len"] = min(self.tokens["max_seq_len"], budget)
        # The sample fields follow the new budget, as the C++ repack_below: the window padded to
        # max_seq_len, budget // max_seq_len sequences per microbatch. (The plan's predicted peak
        # stays: made for the larger budget, it still bounds this one; the reader fits no model.)
        m = max(1, budget // self.tokens["max_seq_len"])
        self.microbatch_sizes = split_samples(self.per_rank_batch, m, self.split_kind, 1)
        self.max_micro_batch = m
        self.multiple_of = None
        self.confirmed = False
        note = ("out of memory at %d padded tokens: token budget lowered to %d padded tokens per microbatch"
                % (failing_tokens, budget))
        self.replans.append(note)
        self.reason = (self.reason + " " if self.reason else "") + (
            "Re-packed during training after %d padded tokens ran out of memory: token budget %d." % (failing_tokens, budget))
        return note

    # ---- writing ----
    def to_dict(self):
        """The plan document with the current (possibly re-planned) sizes."""
        d = copy.deepcopy(self.raw)
        d["microbatch_sizes"] = list(self.microbatch_sizes)
        d["micro_batch"] = self.micro_batch
        d["accumulation_steps"] = self.accumulation_steps
        d["weights"] = self.weights
        d["max_micro_batch"] = self.max_micro_batch
        d["multiple_of"] = self.multiple_of
        d["confirmed"] = self.confirmed
        if self.replans:
            d["confirmed_peak_bytes"] = None
            u = largest_divisor_at_most(self.per_rank_batch, self.max_micro_batch, self.multiple_of or 1) or \
                largest_divisor_at_most(self.per_rank_batch, self.max_micro_batch, 1)
            d["uniform"] = {"micro_batch": u, "accumulation_steps": self.per_rank_batch // u}
        if self.tokens is not None:
            d["tokens"] = dict(self.tokens)
            if self.target_tokens is not None:
                d["tokens"]["target_tokens"] = self.target_tokens
            else:
                d["tokens"].pop("target_tokens", None)
        d["reason"] = self.reason
        return d

    def save(self, path):
        """Writes the plan (with any re-plan) atomically: a temporary file in the same directory,
        flushed to disk, then renamed over ``path``; on any error the temporary file is removed and
        ``path`` keeps its old contents. A symlink is followed (its target is replaced). As the
        C++ CLI's outputs, ``path`` is checked first: ValueError naming it for an empty path, a
        directory, a FIFO, device or socket, or a missing or unwritable directory; an error while
        writing is a ValueError naming it too."""
        path = _output_path(path, "path")
        text = json.dumps(self.to_dict(), indent=2) + "\n"
        try:
            _write_atomically(path, text)
        except OSError as e:
            raise ValueError("cannot write the plan to %s: %s" % (_shown(path), e.strerror or e)) from None

    def __repr__(self):
        return ("Plan(target_batch=%d, world_size=%d, per_rank_batch=%d, microbatch_sizes=%s)"
                % (self.target_batch, self.world_size, self.per_rank_batch, self.microbatch_sizes))

    # ---- training (torch) ----
    def split(self, inputs, target=None, **kwargs):
        """See accumplan.train.split."""
        from . import train
        return train.split(self, inputs, target, **kwargs)

    def train_window(self, model, optimizer, inputs, target=None, **kwargs):
        """See accumplan.train.train_window."""
        from . import train
        return train.train_window(self, model, optimizer, inputs, target, **kwargs)


def _output_path(path, name):
    """The real path a file can be written at, checked before anything is written, as the C++
    CLI's check_outputs does: TypeError for a path that is not one; ValueError naming ``name`` for
    '', a directory, a FIFO, device or socket (save replaces a file, it writes no stream), a
    missing directory or one this process cannot write in."""
    path = os.fsdecode(path_arg(path, name))
    shown = "%s %s" % (name, _shown(path))
    real = os.path.realpath(path)
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise ValueError("%s: %s" % (shown, e.strerror)) from None
    if mode is not None and stat.S_ISDIR(mode):
        raise ValueError("%s is a directory; give a file name inside it" % shown)
    if mode is not None and not stat.S_ISREG(mode):
        raise ValueError("%s is not a regular file (a FIFO, device or socket); give a file name" % shown)
    parent = os.path.dirname(real)
    if not os.path.isdir(parent):
        raise ValueError("%s: no such directory %s; create it first or choose another path" % (shown, _shown(parent)))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError("%s: the directory %s is not writable; choose another path" % (shown, _shown(parent)))
    return real


def _write_atomically(path, text):
    """``text`` into a temporary file beside ``path``, synced, renamed over it; the temporary file
    is removed on any error. Keeps an existing file's mode, else the umask's."""
    import tempfile
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), suffix=".tmp", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w") as f:
            # mkstemp makes the file 0600; a plan is as readable as any file the user creates.
            mask = os.umask(0)
            os.umask(mask)
            os.chmod(tmp, (os.stat(path).st_mode & 0o777) if os.path.exists(path) else (0o666 & ~mask))
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # the rename itself survives a power loss once the directory is synced
        dfd = os.open(os.path.dirname(path), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def _read_plan_document(path):
    """The JSON object in the file at ``path``. Refuses, with PlanError naming the path, before
    reading anything it cannot hold: a directory, a FIFO (which would block for ever), a device or
    socket, a file over MAX_PLAN_BYTES; then text that is not UTF-8, not JSON, nested too deep, or
    not an object. An integer of more than 40 digits or NaN/Infinity is kept for Plan to refuse
    with its JSON path."""
    f, st = _open_regular(path, "plan")
    name = _shown(os.fsdecode(path))
    with f:
        if st.st_size > MAX_PLAN_BYTES:
            raise PlanError("plan %s holds %d bytes, more than a plan can (%d); is it the right file?"
                            % (name, st.st_size, MAX_PLAN_BYTES))
        try:
            data = f.read(MAX_PLAN_BYTES + 1)
        except OSError as e:
            raise PlanError("cannot read plan %s: %s" % (name, e.strerror)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PlanError("plan %s is not UTF-8 text (byte %d); is it the right file?" % (name, e.start)) from None
    try:
        doc = json.loads(text, parse_int=_parse_int, parse_constant=float)
    except json.JSONDecodeError as e:
        raise PlanError("plan %s is not JSON: %s" % (name, e)) from None
    except RecursionError:
        raise PlanError("plan %s: %s" % (name, _TOO_DEEP)) from None
    if not isinstance(doc, dict):
        raise PlanError("plan %s holds a JSON %s, not a plan object" % (name, type(doc).__name__))
    return doc


def load_plan(path_or_doc, model=None, force=False):
    """Reads and validates a plan: a path to plan.json, or the already parsed dict.

    ``model`` (a path) also checks the model file's SHA-256 against the plan's (``force=True``
    accepts a different one). Accepts schema_version 1.x (1.0 to 1.5); refuses other majors."""
    if isinstance(path_or_doc, dict):
        plan = Plan(path_or_doc, source="plan")
    elif isinstance(path_or_doc, (str, bytes, os.PathLike)):
        plan = Plan(_read_plan_document(path_or_doc), source=os.fsdecode(path_or_doc))
    else:
        raise TypeError("load_plan: path_or_doc must be a path (str, bytes, os.PathLike) or a dict, not %s"
                        % type(path_or_doc).__name__)
    if model is not None:
        plan.check_model(model, force=force)
    return plan
