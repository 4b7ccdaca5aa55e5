"""accumplan.plans — read, check, split, re-plan and pack a plan.json; no torch needed here.

Every rule here is the C++ planner's, called through the compiled core (accumplan._core,
python/core/core.cpp): the plan reader (`load_plan` refuses exactly what `accumplan run --plan`
refuses, with the same message), ``balanced_split``, ``split_samples``, the short-window split,
the re-plan after an out-of-memory, the re-pack of a packed plan, ``pack_by_token_budget`` and
``token_windows``. This module checks a Python caller's arguments (types and ranges, with
messages that name them) and turns the core's errors into PlanError / OutOfMemoryAtOne.
docs/plan-format.md describes every field; docs/oom-contract.md the re-planning rule.
"""

import hashlib
import json
import math
import operator
import os
import stat

from ._args import (INT32_MAX, MAX_COUNT, choice_arg, flag_arg, int_arg, lengths_arg, path_arg, real_arg,
                    shown_value)
from .errors import OutOfMemoryAtOne, PlanError, in_python_terms, oom_error, plan_error  # noqa: F401 - re-exported

try:
    from . import _core
except ImportError as e:  # pragma: no cover - a source tree without the compiled core
    raise ImportError("accumplan's compiled core (accumplan._core) is missing: install the package with "
                      "`python3 -m pip install --no-build-isolation .` from the repository root (docs/python.md); "
                      "python/ on PYTHONPATH has no core (%s)" % e) from None

SCHEMA = "accumplan.plan"
SCHEMA_VERSION = _core.SCHEMA_VERSION  # what the C++ writer writes ("1.7")
SPLITS = ("balanced", "uniform")
MAX_ACCUMULATION_STEPS = 1 << 20  # solver.h kMaxAccumulationSteps: the most microbatches of a window
# The step cost's terms (docs/plan-format.md); their ranges are the C++ reader's (_core.check_step_cost).
STEP_COST_TERMS = ("per_microbatch", "per_token", "per_token_squared")
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
# A plan given as a dict is turned into JSON text for the reader: more values than this, or deeper
# nesting, is no plan (a dict sharing one list 2**60 times is refused, not expanded).
MAX_JSON_VALUES = 1 << 20
MAX_JSON_DEPTH = 64  # json_io.h kMaxJsonDepth: a plan nests 4 levels


# --- the planner's arithmetic (the C++ rules; arguments checked here) ----------------------------

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
        raise ValueError(in_python_terms(str(e))) from None
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
            raise PlanError("cannot read %s %s: %s" % (what, shown_value(os.fsdecode(path)), e.strerror)) from None
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
    name = shown_value(os.fsdecode(path))
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


# --- the plan ----------------------------------------------------------------------------------

def _json_text(doc, source):
    """``doc`` (a plan as a dict) as JSON text for the C++ reader, which checks everything else.
    PlanError naming ``source`` for what JSON text cannot hold: a key that is not a string, a value
    that is no JSON value (a tensor, a set, a numpy number), NaN or infinity, more than
    MAX_JSON_VALUES values or nesting deeper than MAX_JSON_DEPTH. Iterative, and counted per
    occurrence: a list shared 2**60 times is refused, never expanded."""
    count, stack = 0, [(doc, "$", 1)]
    while stack:
        obj, path, depth = stack.pop()
        count += len(obj)
        if count > MAX_JSON_VALUES:
            raise PlanError("%s: more than %d JSON values; a plan holds hundreds" % (source, MAX_JSON_VALUES))
        is_dict = isinstance(obj, dict)
        for k, v in (obj.items() if is_dict else enumerate(obj)):
            if is_dict and not isinstance(k, str):
                raise PlanError("%s: %s has the key %s; JSON keys are strings" % (source, path, shown_value(k)))
            where = "%s.%s" % (path, k) if is_dict else "%s[%d]" % (path, k)
            shown = where if len(where) <= 160 else where[:157] + "..."  # as the C++ reader cuts a path
            if isinstance(v, (dict, list, tuple)):
                if depth >= MAX_JSON_DEPTH:
                    raise PlanError("%s: %s: nested deeper than %d levels; accumplan's documents nest 4"
                                    % (source, shown, MAX_JSON_DEPTH))
                stack.append((v, where, depth + 1))
            elif type(v) is float and not math.isfinite(v):
                raise PlanError("%s: %s: %s is not a JSON number; a plan holds finite numbers" % (source, shown, v))
            elif not (v is None or type(v) in (str, bool, int, float)):
                raise PlanError("%s: %s: a value of type %s is not JSON" % (source, shown, type(v).__name__))
    try:
        return json.dumps(doc)
    except ValueError as e:  # an int of more than 4300 digits
        raise PlanError("%s: %s" % (source, e)) from None


class Plan:
    """A plan.json (schema ``accumplan.plan``, any 1.x version), read and checked by the C++ plan
    reader: what ``accumplan run --plan`` refuses, this refuses with the same message.

    Attributes a trainer needs: ``target_batch``, ``world_size``, ``per_rank_batch``,
    ``microbatch_sizes``, ``weights``, ``micro_batch``, ``accumulation_steps``,
    ``max_micro_batch``, ``split_kind`` (the plan's ``split``: "balanced" or "uniform"; the name
    ``split`` is the method), ``multiple_of``, ``normalization``, ``loss``, ``ignore_index``,
    ``memory``, ``fit``, ``setup``, ``model``, ``device``, ``profile``, ``tokens`` (packed plans
    for ragged data: ``token_budget``, ``max_seq_len``, ``longest_sequence_alone``; None for sample
    plans), ``target_tokens`` (packed plans whose optimizer windows hold a number of valid tokens,
    see ``token_windows``; None otherwise), ``step_cost``, ``padding_mask``, ``eval`` (schema 1.7: the
    evaluation batch, ``micro_batch``, ``predicted_peak_bytes``, ``keep_outputs``, ``resident``,
    ``confirmed``, ``trials``; None when not planned), ``checkpoint`` (schema 1.7: the modules trained
    with activation checkpointing, what each candidate frees and costs, the alternative without;
    None without), ``schema_version``
    (the file's), ``raw`` (the document as the C++ writer writes it). ``replans`` lists the
    re-plans made after out-of-memory errors. The attributes follow the plan: change it with
    ``replan_below`` / ``repack_below``, not by assigning them.

    The training methods (``split``, ``train_window``) need torch; see accumplan.train.
    """

    def __init__(self, doc, source="plan"):
        if not isinstance(source, str):
            raise TypeError("source must be a str naming the plan in messages, not %s (%s)"
                            % (type(source).__name__, shown_value(source)))
        if not isinstance(doc, dict):
            raise PlanError("%s: the document must be a JSON object, not %s" % (source, type(doc).__name__))
        try:
            text, version = _core.read_plan_text(_json_text(doc, source), source)
        except _core.InputError as e:
            raise plan_error(e) from None
        self._start(text, version, source)

    @classmethod
    def read(cls, path):
        """The plan in the file at ``path``, read as ``accumplan run --plan`` reads it."""
        try:
            path = path_arg(path, "path")
            # bytes: a file name that is not UTF-8 reaches the reader as it is on disk.
            text, version = _core.read_plan_file(os.fsencode(path))
        except (ValueError, _core.InputError) as e:
            raise plan_error(e) from None
        source = os.fsdecode(path)
        plan = cls.__new__(cls)
        plan._start(text, version, source)
        return plan

    @classmethod
    def _from_text(cls, text, source):
        """The plan in JSON text (accumplan.plan's search returns the C++ writer's), read as a file is."""
        try:
            text, version = _core.read_plan_text(text, source)
        except _core.InputError as e:
            raise plan_error(e) from None
        plan = cls.__new__(cls)
        plan._start(text, version, source)
        return plan

    def _start(self, text, version, source):
        self.source = source
        self.schema_version = version or SCHEMA_VERSION
        self.replans = []
        self._set(text)

    def _set(self, text):
        """Every attribute from the plan's canonical text (the C++ writer's: every field present)."""
        self._text = text
        d = self.raw = json.loads(text)
        self.target_batch, self.world_size = d["target_batch"], d["world_size"]
        self.per_rank_batch = d["per_rank_batch"]
        self.microbatch_sizes = list(d["microbatch_sizes"])
        self.max_micro_batch, self.split_kind, self.multiple_of = d["max_micro_batch"], d["split"], d["multiple_of"]
        self.memory, self.fit = d["memory"], d["fit"]
        self.setup, self.model, self.device, self.profile = d["setup"], d["model"], d["device"], d["profile"]
        self.margin_bytes = self.memory.get("margin_bytes")
        self.loss = self.setup.get("loss", "cross_entropy")
        self.normalization = self.setup.get("normalization", "auto")
        self.ignore_index = self.setup.get("ignore_index", -100)
        self.padding_mask = bool(self.setup.get("padding_mask", False))
        self.tokens = dict(d["tokens"]) if d.get("tokens") else None
        self.target_tokens = self.tokens.get("target_tokens") if self.tokens else None
        self.step_cost = dict(self.tokens["step_cost"]) if self.tokens and self.tokens.get("step_cost") else None
        self.confirmed, self.reason = d["confirmed"], d["reason"]
        self.eval = dict(d["eval"]) if d.get("eval") else None  # 1.7: the evaluation batch
        self.checkpoint = dict(d["checkpoint"]) if d.get("checkpoint") else None  # 1.7: activation checkpointing
        self._packed_peak = None  # fitted from the profile when first asked (predicted_packed_peak_bytes)
        if not hasattr(self, "_packing"):
            self._packing = None  # the run's step-time fit (packing_cost); kept across a re-pack

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
            raise TypeError("force must be True or False, not %s (%s)" % (type(force).__name__, shown_value(force)))
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
        if samples > self.per_rank_batch and self.windows_by_tokens:
            return split_samples(samples, max(self.microbatch_sizes), self.split_kind, self.multiple_of or 1)
        try:
            return _core.window_sizes(self._text, samples)
        except _core.InputError as e:
            raise ValueError(in_python_terms(str(e))) from None

    def largest_fitting(self):
        """The largest microbatch b whose predicted peak on the plan's fitted line (fit.intercept_bytes
        + fit.slope_bytes_per_sample * b) fits memory.usable_bytes (the budget less the margin), by
        the C++ memory model (MemoryModel::line_largest_fitting); 0 when not even one sample does;
        None when the plan carries no memory line."""
        return _core.plan_largest_fitting(self._text)

    def replan_below(self, failing_micro_batch):
        """Re-plans in place after microbatch size ``failing_micro_batch`` ran out of memory, by the
        C++ executor's rule (accumplan/replan.h): the same per-rank batch, every microbatch strictly
        smaller, solved again from the plan's profile under its budget when it has both, else
        re-split under the failing size. Returns a one-line note. Raises OutOfMemoryAtOne when the
        failing size is 1."""
        failing_micro_batch = int_arg(failing_micro_batch, "failing_micro_batch", 1, MAX_COUNT)
        old = ",".join(map(str, self.microbatch_sizes))
        try:
            text, how = _core.replan_below(self._text, failing_micro_batch)
        except _core.InfeasibleError as e:
            raise oom_error(e) from None
        self._set(text)
        note = ("out of memory at microbatch %d: re-planned %d samples into %s (was %s); %s"
                % (failing_micro_batch, self.per_rank_batch, ",".join(map(str, self.microbatch_sizes)), old,
                   in_python_terms(how)))
        self.replans.append(note)
        return note

    def pack(self, lengths, packing="time"):
        """The microbatches of one window of ragged data under a packed plan (``plan.tokens``):
        lists of sample indices, longest first, each at most the token budget in padded tokens.
        packing: "time" cuts where ``packing_cost()`` predicts the least time; "fill" fills each
        microbatch to the budget (fewest microbatches), as ``accumplan run --packing``. Raises
        PlanError for a plan without a token budget, or a sequence longer than the plan's
        ``max_seq_len`` (the budget was planned for sequences up to it)."""
        packing = choice_arg(packing, "packing", _core.PACKINGS)
        if self.tokens is None:
            raise PlanError("%s packs no tokens: it is a sample plan (no $.tokens); split its windows by "
                            "microbatch_sizes" % self.source)
        lengths = lengths_arg(lengths, "lengths", minimum=1)
        longest = max(lengths, default=0)
        if longest > self.tokens["max_seq_len"]:
            raise PlanError("the window holds a sequence of %d tokens, longer than the %d tokens the plan's token "
                            "budget was planned for ($.tokens.max_seq_len); truncate the sequences, or plan again "
                            "with sequences that long (accumplan.plan on data holding one, or `accumplan profile "
                            "--seq-len`)" % (longest, self.tokens["max_seq_len"]))
        return pack_by_token_budget(lengths, self.tokens["token_budget"],
                                    self.packing_cost() if packing == "time" else None)

    def predicted_packed_peak_bytes(self, microbatches, optimizer_state_exists=True):
        """The peak the plan predicts for a window of packed microbatches, each ``(sequences,
        padded_length)`` in window order (the first runs with no gradient resident;
        ``optimizer_state_exists``: the optimizer has stepped before): the highest of theirs by the
        plan's token memory model, and of the optimizer step the profile measured — what
        ``accumplan run`` reports as packed_predicted_peak_bytes, by the same C++ rule
        (accumplan/token_model.h PackedPeakPredictor). None when the plan's profile holds too few
        (b, T) windows to fit the model (a hand-made plan)."""
        if self.tokens is None:
            raise PlanError("%s packs no tokens: it is a sample plan (no $.tokens); its predicted peak is "
                            "memory['predicted_peak_bytes']" % self.source)
        flag_arg(optimizer_state_exists, "optimizer_state_exists")
        pairs = [(int_arg(b, "microbatches[%d][0]" % i, 1, MAX_COUNT), int_arg(t, "microbatches[%d][1]" % i, 1, INT32_MAX))
                 for i, (b, t) in enumerate(microbatches)]
        if self._packed_peak is None:
            self._packed_peak = _core.PackedPeakPredictor(self._text)
        return self._packed_peak.window_peak_bytes(pairs, optimizer_state_exists)

    def packing_cost(self):
        """The step cost ``pack`` cuts the next window by: ``train_window``'s own fit over the packed
        microbatches it timed on the CPU so far (refitted after every window), else the plan's
        ``step_cost`` (None: each microbatch filled) — the rule of ``accumplan run --packing time``
        (accumplan/step_time.h PackingCost)."""
        return self._packing.cost() if self._packing is not None else self.step_cost

    def observe_packed_window(self, timed):
        """Feeds ``packing_cost()``'s fit one packed window's microbatches as they ran, each
        ``(sequences, padded length, seconds of forward + backward)``, and refits (the C++ rule:
        the most recent 512 are kept). ``train_window`` calls it on the CPU; a loop of your own over
        ``pack`` may call it with its own timings."""
        checked = []
        for i, item in enumerate(timed):
            if not isinstance(item, (tuple, list)) or len(item) != 3:
                raise TypeError("timed[%d] must be (sequences, padded length, seconds), not %s" % (i, shown_value(item)))
            checked.append((int_arg(item[0], "timed[%d][0]" % i, 1, MAX_COUNT),
                            int_arg(item[1], "timed[%d][1]" % i, 1, INT32_MAX),
                            real_arg(item[2], "timed[%d][2]" % i, 0, 1e9, lo_open=True)))
        if self._packing is None:
            self._packing = _core.PackingCost(self._text)
        self._packing.observe_window(checked)

    def repack_below(self, failing_tokens, longest_sequence):
        """Lowers the token budget in place below ``failing_tokens`` (the padded tokens of a
        microbatch that ran out of memory) by the C++ executor's rule (accumplan/replan.h: the
        sample fields follow the new budget, the predicted peak is the token model's under it).
        Returns a one-line note. Raises OutOfMemoryAtOne when the new budget cannot hold
        ``longest_sequence`` (one sequence cannot be split)."""
        failing_tokens = int_arg(failing_tokens, "failing_tokens", 1, MAX_COUNT)
        longest_sequence = int_arg(longest_sequence, "longest_sequence", 1, MAX_COUNT)
        if self.tokens is None:
            raise PlanError("%s packs no tokens: it is a sample plan (no $.tokens); re-plan it with replan_below"
                            % self.source)
        if min(self.tokens["token_budget"], failing_tokens - 1) < longest_sequence:
            raise OutOfMemoryAtOne(
                "out of memory at %d padded tokens: a token budget below it cannot hold the window's longest "
                "sequence of %d tokens, and one sequence cannot be split. Truncate the sequences to fewer "
                "tokens, or raise the budget" % (failing_tokens, longest_sequence))
        try:
            self._set(_core.repack_below(self._text, failing_tokens))
        except _core.InfeasibleError as e:
            raise oom_error(e) from None
        note = ("out of memory at %d padded tokens: token budget lowered to %d padded tokens per microbatch"
                % (failing_tokens, self.tokens["token_budget"]))
        self.replans.append(note)
        return note

    # ---- writing ----
    def to_dict(self):
        """The plan document as the C++ writer writes it, with any re-plan."""
        return json.loads(self._text)

    def save(self, path):
        """Writes the plan (with any re-plan) atomically: a temporary file in the same directory,
        flushed to disk, then renamed over ``path``; on any error the temporary file is removed and
        ``path`` keeps its old contents. A symlink is followed (its target is replaced). As the
        C++ CLI's outputs, ``path`` is checked first: ValueError naming it for an empty path, a
        directory, a FIFO, device or socket, or a missing or unwritable directory; an error while
        writing is a ValueError naming it too."""
        path = _output_path(path, "path")
        try:
            _write_atomically(path, self._text)
        except OSError as e:
            raise ValueError("cannot write the plan to %s: %s" % (shown_value(path), e.strerror or e)) from None

    def export(self, to, out=None, *, allow_slow=False, allow_lossy=False, lightning_datamodule=None,
               plan_path=None):
        """The plan as ``accumplan export --to TO`` renders it (docs/exports.md): deepspeed,
        accelerate, accelerate-config, lightning, hf or torchrun. Returns the text; ``out`` (a path)
        also writes it there atomically. The exporter is the CLI's (_core.export_plan): PlanError
        names what it refuses, before anything is written: an optimizer value the trainer cannot
        carry (parameter groups with different values; ``allow_lossy=True`` writes the first group's
        values anyway and names the loss inside the text), a uniform split predicted more than 25%
        slower (``allow_slow=True``). ``lightning_datamodule``: a class path for the lightning data
        section; ``plan_path``: the plan file the text names (default: where this plan was read, else
        plan.json). The notes the CLI prints to stderr are in ``self.export_notes`` afterwards."""
        to = choice_arg(to, "to", tuple(_core.EXPORT_TARGETS))
        for value, name in ((allow_slow, "allow_slow"), (allow_lossy, "allow_lossy")):
            if not isinstance(value, bool):
                raise TypeError("%s must be True or False, not %s" % (name, shown_value(value)))
        if lightning_datamodule is not None and not isinstance(lightning_datamodule, str):
            raise TypeError("lightning_datamodule must be a class path string, not %s" % shown_value(lightning_datamodule))
        if plan_path is None:
            plan_path = self.source if os.path.exists(str(self.source)) else "plan.json"
        plan_path = os.fsdecode(path_arg(plan_path, "plan_path"))
        out = None if out is None else _output_path(out, "out")
        try:
            text, notes = _core.export_plan(self._text, to, plan_path, allow_slow, allow_lossy,
                                            lightning_datamodule or "")
        except _core.InputError as e:  # InfeasibleError (a slow split) included
            raise plan_error(e) from None
        self.export_notes = notes.splitlines()
        if out is not None:
            try:
                _write_atomically(out, text)
            except OSError as e:
                raise ValueError("cannot write the export to %s: %s" % (shown_value(out), e.strerror or e)) from None
        return text

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

    def evaluate(self, model, inputs, target=None, **kwargs):
        """See accumplan.train.evaluate: the exact mean loss over an eval batch, in the plan's eval
        microbatches."""
        from . import train
        return train.evaluate(self, model, inputs, target, **kwargs)

    def apply_checkpointing(self, model):
        """Wraps the plan's checkpointed modules (``checkpoint["modules"]``) in ``model`` for your own
        loop: non-reentrant torch.utils.checkpoint, RNG preserved. Returns the handle whose
        ``remove()`` (or a ``with`` block) puts the forwards back; None for a plan without
        checkpointing. ``train_window`` applies it by itself."""
        if self.checkpoint is None:
            return None
        from .checkpointing import apply_checkpointing
        return apply_checkpointing(model, self.checkpoint["modules"])

    def eval_sizes(self, samples):
        """The eval microbatches of ``samples`` (the planner's rule, as ``accumplan run --eval-data``):
        ``eval.micro_batch`` each, the last the remainder; the training microbatch without an eval batch."""
        try:
            return list(_core.eval_sizes(self._text, int_arg(samples, "samples", 0, MAX_COUNT)))
        except _core.InputError as e:
            raise plan_error(e) from None


def _output_path(path, name):
    """The real path a file can be written at, checked before anything is written, as the C++
    CLI's check_outputs does: TypeError for a path that is not one; ValueError naming ``name`` for
    '', a directory, a FIFO, device or socket (save replaces a file, it writes no stream), a
    missing directory or one this process cannot write in."""
    path = os.fsdecode(path_arg(path, name))
    shown = "%s %s" % (name, shown_value(path))
    real = os.path.realpath(path)
    try:
        mode = os.stat(path).st_mode  # as given: realpath drops a trailing '/'; stat does not
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise ValueError("%s: %s" % (shown, e.strerror)) from None
    if mode is not None and stat.S_ISDIR(mode):
        raise ValueError("%s is a directory; give a file name inside it" % shown)
    if mode is not None and not stat.S_ISREG(mode):
        raise ValueError("%s is not a regular file (a FIFO, device or socket); give a file name" % shown)
    # 'p.json/' names a directory p.json, which the CLI refuses as missing; realpath would make
    # it the file p.json.
    parent = real if path.endswith(("/", os.sep)) else os.path.dirname(real)
    if not os.path.isdir(parent):
        raise ValueError("%s: no such directory %s; create it first or choose another path" % (shown, shown_value(parent)))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError("%s: the directory %s is not writable; choose another path" % (shown, shown_value(parent)))
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


def load_plan(path_or_doc, model=None, force=False):
    """Reads and checks a plan: a path to plan.json, or the already parsed dict, through the C++
    plan reader (PlanError with the message `accumplan run --plan` gives). ``model`` (a path) also
    checks the model file's SHA-256 against the plan's (``force=True`` accepts a different one).
    Accepts schema_version 1.x (1.0 up to SCHEMA_VERSION); refuses other majors."""
    if isinstance(path_or_doc, dict):
        plan = Plan(path_or_doc, source="plan")
    elif isinstance(path_or_doc, (str, bytes, os.PathLike)):
        plan = Plan.read(path_or_doc)
    else:
        raise TypeError("load_plan: path_or_doc must be a path (str, bytes, os.PathLike) or a dict, not %s"
                        % type(path_or_doc).__name__)
    if model is not None:
        plan.check_model(model, force=force)
    return plan
