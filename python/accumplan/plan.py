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
import stat

from ._args import MAX_COUNT, int_arg, lengths_arg

SCHEMA = "accumplan.plan"
SUPPORTED_MAJOR = 1
SPLITS = ("balanced", "uniform")
# The C++ reader's limit (json_io.h kMaxInputFileBytes): a plan is a few KiB; 256 MiB is a wrong file.
MAX_PLAN_BYTES = 256 << 20


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
    if parts < 1 or unit < 1 or total % unit != 0 or total // unit < parts:
        raise ValueError("balanced_split(%d, %d, %d) has no solution" % (total, parts, unit))
    units = total // unit
    q, r = divmod(units, parts)
    return [(q + 1) * unit if i < r else q * unit for i in range(parts)]


def largest_divisor_at_most(total, limit, unit=1):
    """The largest d <= limit that divides total and is a multiple of unit; 0 if none."""
    for d in range(min(limit, total), 0, -1):
        if d % unit == 0 and total % d == 0:
            return d
    return 0


def split_samples(total, max_micro_batch, split="balanced", unit=1):
    """Fewest microbatches of at most ``max_micro_batch`` covering ``total`` samples: balanced
    (k = ceil(total / m), sizes differing by at most one unit) or uniform (equal sizes dividing
    total). A total that is not a multiple of ``unit`` (a short last window) ignores the unit."""
    if total < 1 or max_micro_batch < 1:
        raise ValueError("split_samples needs positive sizes, got %d and %d" % (total, max_micro_batch))
    if total % unit != 0:
        unit = 1
    cap = max(unit, (max_micro_batch // unit) * unit)
    if split == "uniform":
        d = largest_divisor_at_most(total, cap, unit)
        return [d] * (total // d)
    units = total // unit
    cap_units = cap // unit
    return balanced_split(total, -(-units // cap_units), unit)


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
    if isinstance(token_budget, bool) or not isinstance(token_budget, int) or token_budget < 1:
        raise PlanError("the token budget must be an integer >= 1, got %r" % (token_budget,))
    lengths = [int(n) for n in lengths]
    for i, n in enumerate(lengths):
        if n < 1:
            raise PlanError("sequence %d's length must be >= 1, got %d" % (i, n))
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable: ties keep index order
    if order and lengths[order[0]] > token_budget:
        raise PlanError("sequence %d has %d tokens, more than the token budget of %d padded tokens per "
                        "microbatch; truncate the sequences to at most %d tokens or raise the budget"
                        % (order[0], lengths[order[0]], token_budget, token_budget))
    if step_cost is None:
        per_mb, per_tok, per_sq = 1, 0, 0  # every microbatch costs the same: the fewest
    else:
        per_mb, per_tok, per_sq = (int(step_cost[k]) for k in ("per_microbatch", "per_token", "per_token_squared"))
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
    if isinstance(value, bool) and bool not in kinds:
        raise PlanError("%s.%s must be %s, got %r" % (path, key, _kind_name(kinds), value))
    if not isinstance(value, kinds):
        raise PlanError("%s.%s must be %s, got %r" % (path, key, _kind_name(kinds), value))
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
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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
        self.raw = copy.deepcopy(doc)
        self._validate(self.raw)
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
        if not isinstance(version, str) or not version.split(".")[0].isdigit():
            raise PlanError("%s: $.schema_version must be a string like \"1.0\", got %r" % (self.source, version))
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
        weights = _field(d, "weights", p, (list,), required=False, default=None)
        if weights is not None and len(weights) != len(sizes):
            raise PlanError("%s: $.weights has %d entries for %d microbatches" % (self.source, len(weights), len(sizes)))
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
        self.confirmed = bool(d.get("confirmed", False))
        self.reason = d.get("reason", "")

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
        digest = file_sha256(model_path)
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
        if samples == self.per_rank_batch:
            return list(self.microbatch_sizes)
        if samples < 1 or (samples > self.per_rank_batch and not self.windows_by_tokens):
            raise ValueError("a window holds 1..%d samples (the plan's per-rank batch); got %d"
                             % (self.per_rank_batch, samples))
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
        ``path`` keeps its old contents. A symlink is followed (its target is replaced)."""
        import os
        import tempfile
        path = os.path.realpath(path)
        text = json.dumps(self.to_dict(), indent=2) + "\n"
        fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), suffix=".tmp",
                                   dir=os.path.dirname(path) or ".")
        try:
            # mkstemp makes the file 0600; a plan is as readable as any file the user creates.
            mask = os.umask(0)
            os.umask(mask)
            os.chmod(tmp, (os.stat(path).st_mode & 0o777) if os.path.exists(path) else (0o666 & ~mask))
            with os.fdopen(fd, "w") as f:
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
            dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass

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


def _read_plan_document(path):
    """The JSON object in the file at ``path``. Refuses, with PlanError naming the path, before
    reading anything it cannot hold: a directory, a FIFO (which would block for ever), a device or
    socket, a file over MAX_PLAN_BYTES; then text that is not UTF-8, not JSON, nested too deep, or
    not an object."""
    name = repr(os.fsdecode(path))
    try:
        st = os.stat(path)
    except OSError as e:
        raise PlanError("cannot read plan %s: %s" % (name, e.strerror)) from None
    if stat.S_ISDIR(st.st_mode):
        raise PlanError("plan %s is a directory; give the path of plan.json in it" % name)
    if not stat.S_ISREG(st.st_mode):
        raise PlanError("plan %s is not a regular file (a FIFO, device or socket); give the path of plan.json" % name)
    if st.st_size > MAX_PLAN_BYTES:
        raise PlanError("plan %s holds %d bytes, more than a plan can (%d); is it the right file?"
                        % (name, st.st_size, MAX_PLAN_BYTES))
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PLAN_BYTES + 1)
    except OSError as e:
        raise PlanError("cannot read plan %s: %s" % (name, e.strerror)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PlanError("plan %s is not UTF-8 text (byte %d); is it the right file?" % (name, e.start)) from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise PlanError("plan %s is not JSON: %s" % (name, e)) from None
    except RecursionError:
        raise PlanError("plan %s nests its JSON too deep to be a plan" % name) from None
    if not isinstance(doc, dict):
        raise PlanError("plan %s holds a JSON %s, not a plan object" % (name, type(doc).__name__))
    return doc


def load_plan(path_or_doc, model=None, force=False):
    """Reads and validates a plan: a path to plan.json, or the already parsed dict.

    ``model`` (a path) also checks the model file's SHA-256 against the plan's (``force=True``
    accepts a different one). Accepts schema_version 1.x (1.0 to 1.4); refuses other majors."""
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
