"""accumplan.plans — read, check, split, re-plan and pack a plan.json; no torch needed here.

A ``Plan`` holds the C++ planner's own plan object (accumplan._core.Plan), read once by the C++
reader (`load_plan` refuses exactly what `accumplan run --plan` refuses, with the same message),
and reads its fields through it. Every rule is the planner's, asked of that object or of the core:
``balanced_split``, ``split_samples``, the short-window split, the re-plan after an out-of-memory,
the re-pack of a packed plan, ``pack_by_token_budget``, ``token_windows``, and the window loop
itself (``Plan.run_window``: the one `accumplan run` executes). This module checks a Python
caller's arguments (types and ranges, with messages that name them) and turns the core's errors
into PlanError / OutOfMemoryAtOne. docs/plan-format.md describes every field;
docs/oom-contract.md the re-planning rule.
"""

import os

from . import _core
from ._args import (INT32_MAX, MAX_COUNT, choice_arg, documented_arg, flag_arg, int_arg, lengths_arg, path_arg,
                    shown_value)
from .errors import OutOfMemoryAtOne, PeerError, PlanError, oom_error, plan_error  # noqa: F401 - re-exported
from .files import file_digest, file_sha256, json_text, output_path, write_atomically  # noqa: F401 - re-exported
from .splits import (balanced_split, largest_divisor_at_most, pack_by_token_budget,  # noqa: F401 - re-exported
                     split_samples, token_windows)

SCHEMA_VERSION = _core.SCHEMA_VERSION  # what the C++ writer writes


# --- the plan ----------------------------------------------------------------------------------

class Plan:
    """A plan.json (schema ``accumplan.plan``, any 1.x version), read and held as the module says.

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
    None without), ``schema_version`` (the file's), ``raw`` (the document as the C++ writer writes
    it). ``replans`` lists the re-plans made after out-of-memory errors. The attributes follow the
    plan: change it with ``replan_below`` / ``repack_below`` (or let ``train_window``'s window loop
    do it), not by assigning them.

    The training methods (``split``, ``train_window``) need torch; see accumplan.train.
    """

    def __init__(self, doc, source="plan"):
        if not isinstance(source, str):
            raise TypeError("source must be a str naming the plan in messages, not %s (%s)"
                            % (type(source).__name__, shown_value(source)))
        if not isinstance(doc, dict):
            raise PlanError("%s: the document must be a JSON object, not %s" % (source, type(doc).__name__))
        try:
            core, version = _core.Plan.read_text(json_text(doc, source), source)
        except _core.InputError as e:
            raise plan_error(e) from None
        self._start(core, version, source)

    @classmethod
    def read(cls, path):
        """The plan in the file at ``path``, read as ``accumplan run --plan`` reads it."""
        try:
            path = path_arg(path, "path")
            # bytes: a file name that is not UTF-8 reaches the reader as it is on disk.
            core, version = _core.Plan.read_file(os.fsencode(path))
        except (ValueError, _core.InputError) as e:
            raise plan_error(e) from None
        return cls._from_core(core, os.fsdecode(path), version)

    @classmethod
    def _from_core(cls, core, source, version=None):
        """A Plan over a _core.Plan the C++ planner made (accumplan.plan's search) or read."""
        plan = cls.__new__(cls)
        plan._start(core, version, source)
        return plan

    def _start(self, core, version, source):
        self._core, self._loop, self._doc, self._peak = core, None, None, None
        self.source = source
        self.schema_version = version or SCHEMA_VERSION
        self.replans = []

    @property
    def raw(self):
        """The document as the C++ writer writes it (every field present), with any re-plan."""
        if self._doc is None:
            self._doc = self._core.to_dict()
        return self._doc

    def _field(key, optional=False):  # noqa: N805 - a property factory used in the class body only
        """The document's field ``key``; an ``optional`` one absent or empty reads None."""
        return property((lambda self: self.raw.get(key) or None) if optional else (lambda self: self.raw[key]))

    target_batch, world_size, per_rank_batch = _field("target_batch"), _field("world_size"), _field("per_rank_batch")
    microbatch_sizes, max_micro_batch = _field("microbatch_sizes"), _field("max_micro_batch")
    split_kind, multiple_of = _field("split"), _field("multiple_of")
    memory, fit, setup, model = _field("memory"), _field("fit"), _field("setup"), _field("model")
    device, profile, confirmed, reason = _field("device"), _field("profile"), _field("confirmed"), _field("reason")
    tokens, eval, checkpoint = _field("tokens", True), _field("eval", True), _field("checkpoint", True)
    checkpoint_choice = _field("checkpoint_choice", True)  # what checkpointing="auto" weighed
    sharding = _field("sharding", True)  # 1.9: the optimizer state sharded over the ranks
    ranks = _field("ranks", True)  # 1.13: each rank's window where the ranks differ
    del _field

    margin_bytes = property(lambda self: self.memory.get("margin_bytes"))
    loss = property(lambda self: self.setup.get("loss", "cross_entropy"))
    normalization = property(lambda self: self.setup.get("normalization", "auto"))
    ignore_index = property(lambda self: self.setup.get("ignore_index", -100))
    padding_mask = property(lambda self: bool(self.setup.get("padding_mask", False)))
    target_tokens = property(lambda self: self.tokens.get("target_tokens") if self.tokens else None)
    step_cost = property(lambda self: (self.tokens.get("step_cost") or None) if self.tokens else None)
    micro_batch = property(lambda self: self._core.micro_batch)
    accumulation_steps = property(lambda self: len(self.microbatch_sizes))

    @property
    def weights(self):
        """n_i / per_rank_batch: the weight of each microbatch's MEAN loss in a full window."""
        return [n / self.per_rank_batch for n in self.microbatch_sizes]

    def check_model(self, model_path, force=False):
        """Raises PlanError when the file's SHA-256 differs from the plan's ``model.sha256``
        (unless ``force``). Returns the file's hash."""
        flag_arg(force, "force")
        digest = file_digest(model_path, "model")
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

    def window_sizes(self, samples, rank=0):
        """Microbatch sizes of a window of ``samples`` on rank ``rank`` (its own window where the
        ranks differ, ``plan.ranks``): the plan's own sizes for a full window; a short window is
        re-split under the plan's largest microbatch (a size the full window already ran), as the
        C++ executor does. A plan with ``target_tokens`` splits a window of any size >= 1 under that
        largest microbatch."""
        try:
            return self._core.window_sizes(int_arg(samples, "samples", 1, MAX_COUNT),
                                           int_arg(rank, "rank", 0, self.world_size - 1))
        except _core.InputError as e:
            raise ValueError(str(e)) from None

    def rank_slice(self, rank, samples):
        """The samples of a global window of ``samples`` that rank ``rank`` trains, as a slice of the
        window: where the ranks differ (``plan.ranks``) its consecutive share (a short window shared
        in proportion), otherwise every world_size-th sample from ``rank`` (strided)."""
        start, stop, step = self._core.rank_slice(int_arg(rank, "rank", 0, self.world_size - 1),
                                                  int_arg(samples, "samples", 0, MAX_COUNT))
        return slice(start, stop, step if step != 1 else None)

    def largest_fitting(self):
        """The largest microbatch b whose predicted peak on the plan's fitted line (fit.intercept_bytes
        + fit.slope_bytes_per_sample * b) fits memory.usable_bytes (the budget less the margin), by
        the C++ memory model (MemoryModel::line_largest_fitting); 0 when not even one sample does;
        None when the plan carries no memory line."""
        return self._core.largest_fitting()

    def replan_below(self, failing_micro_batch):
        """Re-plans in place after microbatch size ``failing_micro_batch`` ran out of memory, by the
        C++ executor's rule (accumplan/replan.h): the same per-rank batch, every microbatch strictly
        smaller, solved again from the plan's profile under its budget when it has both, else
        re-split under the failing size. Returns a one-line note. Raises OutOfMemoryAtOne when the
        failing size is 1."""
        failing_micro_batch = int_arg(failing_micro_batch, "failing_micro_batch", 1, MAX_COUNT)
        old = ",".join(map(str, self.microbatch_sizes))
        try:
            how = self._core.replan_below(failing_micro_batch)
        except _core.InfeasibleError as e:
            raise oom_error(e) from None
        return self._replanned("out of memory at microbatch %d: re-planned %d samples into %s (was %s); %s"
                               % (failing_micro_batch, self.per_rank_batch, ",".join(map(str, self.microbatch_sizes)),
                                  old, how))

    def _need_tokens(self, instead):
        """PlanError for a sample plan (no $.tokens), saying what to do ``instead``."""
        if self.tokens is None:
            raise PlanError("%s packs no tokens: it is a sample plan (no $.tokens); %s" % (self.source, instead))

    def _replanned(self, note):
        """After the core re-planned the plan in place: its fields read again, the note kept."""
        self._doc = None
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
        self._need_tokens("split its windows by microbatch_sizes")
        lengths = lengths_arg(lengths, "lengths", minimum=1)
        longest = max(lengths, default=0)
        if longest > self.tokens["max_seq_len"]:
            raise PlanError("the window holds a sequence of %d tokens, longer than the %d tokens the plan's token "
                            "budget was planned for ($.tokens.max_seq_len); truncate the sequences, or plan again "
                            "with sequences that long (accumplan.plan on data holding one)" % (longest, self.tokens["max_seq_len"]))
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
        self._need_tokens("its predicted peak is memory['predicted_peak_bytes']")
        flag_arg(optimizer_state_exists, "optimizer_state_exists")
        pairs = [(int_arg(b, "microbatches[%d][0]" % i, 1, MAX_COUNT), int_arg(t, "microbatches[%d][1]" % i, 1, INT32_MAX))
                 for i, (b, t) in enumerate(microbatches)]
        if self._peak is None:  # fitted from the profile once; a re-pack does not change the profile
            self._peak = _core.PackedPeakPredictor(self._core)
        return self._peak.window_peak_bytes(pairs, optimizer_state_exists)

    def packing_cost(self):
        """The step cost ``pack`` cuts the next window by: ``train_window``'s own fit over the packed
        microbatches it timed on the CPU so far (refitted after every window), else the plan's
        ``step_cost`` (None: each microbatch filled) — the rule of ``accumplan run --packing time``
        (accumplan/step_time.h PackingCost)."""
        return self.window_loop.packing_cost("time")

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
                            documented_arg(item[2], "timed[%d][2]" % i, "seconds", lo_open=True)))
        self.window_loop.observe_window(checked)

    @property
    def window_loop(self):
        """The C++ window loop that trains this plan's windows (accumplan._core.WindowLoop, the one
        ``accumplan run`` executes): it re-plans this plan in place after an out-of-memory and keeps
        the packing fit from window to window."""
        if self._loop is None:
            self._loop = _core.WindowLoop(self._core)
        return self._loop

    def run_window(self, backend, on_oom=None, **options):
        """One window through the plan's window loop: ``backend`` (a _core.WindowBackend; the torch
        one is train_window's) runs the microbatches and steps the optimizer; the loop splits, agrees,
        re-plans after an out-of-memory (``on_oom(note)`` after each, the note also in
        ``replans``), clips and orders the update. ``options``: the loop's (oom_recovery,
        max_grad_norm, packing). Returns its _core.WindowStats; OutOfMemoryAtOne when it cannot
        recover."""
        def replanned(event):
            self._replanned(event.line)
            if on_oom is not None:
                on_oom(event.line)
        loop = self.window_loop
        try:
            stats = loop.accumulate(backend, on_replan=replanned, **options)
            loop.apply(backend, stats, **options)
        except _core.ExecutorOomError as e:
            raise oom_error(e) from None
        except _core.InputError as e:  # the window's counts or sequences, refused by the loop
            raise plan_error(e) from None
        except _core.PeerError as e:  # another rank failed: every rank stops alike
            raise PeerError(str(e)) from None
        return stats

    def repack_below(self, failing_tokens, longest_sequence):
        """Lowers the token budget in place below ``failing_tokens`` (the padded tokens of a
        microbatch that ran out of memory) by the C++ executor's rule (accumplan/replan.h: the
        sample fields follow the new budget, the predicted peak is the token model's under it).
        Returns a one-line note. Raises OutOfMemoryAtOne when the new budget cannot hold
        ``longest_sequence`` (one sequence cannot be split)."""
        failing_tokens = int_arg(failing_tokens, "failing_tokens", 1, MAX_COUNT)
        longest_sequence = int_arg(longest_sequence, "longest_sequence", 1, MAX_COUNT)
        self._need_tokens("re-plan it with replan_below")
        if min(self.tokens["token_budget"], failing_tokens - 1) < longest_sequence:
            raise OutOfMemoryAtOne(
                "out of memory at %d padded tokens: a token budget below it cannot hold the window's longest "
                "sequence of %d tokens, and one sequence cannot be split. Truncate the sequences to fewer "
                "tokens, or raise the budget" % (failing_tokens, longest_sequence))
        try:
            self._core.repack_below(failing_tokens)
        except _core.InfeasibleError as e:
            raise oom_error(e) from None
        self._doc = None  # the note reads the new budget
        return self._replanned("out of memory at %d padded tokens: token budget lowered to %d padded tokens per "
                               "microbatch" % (failing_tokens, self.tokens["token_budget"]))

    # ---- writing ----
    def to_dict(self):
        """The plan document as the C++ writer writes it, with any re-plan."""
        return self._core.to_dict()

    def save(self, path):
        """Writes the plan (with any re-plan) atomically: a temporary file in the same directory,
        flushed to disk, then renamed over ``path``; on any error the temporary file is removed and
        ``path`` keeps its old contents. A symlink is followed (its target is replaced). As the
        C++ CLI's outputs, ``path`` is checked first: ValueError naming it for an empty path, a
        directory, a FIFO, device or socket, or a missing or unwritable directory; an error while
        writing is a ValueError naming it too."""
        write_atomically(output_path(path, "path"), self._core.text(), "the plan")

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
        flag_arg(allow_slow, "allow_slow"), flag_arg(allow_lossy, "allow_lossy")
        if lightning_datamodule is not None and not isinstance(lightning_datamodule, str):
            raise TypeError("lightning_datamodule must be a class path string, not %s" % shown_value(lightning_datamodule))
        if plan_path is None:
            plan_path = self.source if os.path.exists(str(self.source)) else "plan.json"
        plan_path = os.fsdecode(path_arg(plan_path, "plan_path"))
        out = None if out is None else output_path(out, "out")
        try:
            text, notes = _core.export_plan(self._core, to, plan_path, allow_slow, allow_lossy,
                                            lightning_datamodule or "")
        except _core.InputError as e:  # InfeasibleError (a slow split) included
            raise plan_error(e) from None
        self.export_notes = notes.splitlines()
        if out is not None:
            write_atomically(out, text, "the export")
        return text

    def __str__(self):
        return self._core.describe()  # the CLI's summary: the split, the memory, the choices and why

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
        return apply_checkpointing(model, self.checkpoint["modules"], "plan.checkpoint['modules']")

    def eval_sizes(self, samples):
        """The eval microbatches of ``samples`` (the planner's rule, as ``accumplan run --eval-data``):
        ``eval.micro_batch`` each, the last the remainder; the training microbatch without an eval batch."""
        try:
            return list(self._core.eval_sizes(int_arg(samples, "samples", 0, MAX_COUNT)))
        except _core.InputError as e:
            raise plan_error(e) from None


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


def plan_ranks(plans):
    """The plan of ranks that differ, from each rank's own plan: ``plans[r]`` made for rank r on
    its own device and budget (``accumplan.plan(..., world_size=W, memory_budget=...)`` in rank r's
    process, gathered; or plans read from files). Each rank gets the largest microbatch its budget
    allows and the share of every window that its measured step times finish with the others
    (``plan.ranks``; train it with ``plan.rank_slice(rank, n)`` of each global window). PlanError
    naming a plan for another target, world size or model."""
    if not isinstance(plans, (list, tuple)) or not all(isinstance(p, Plan) for p in plans):
        raise TypeError("plans: a list of accumplan.Plan, one per rank (got %s)" % type(plans).__name__)
    try:
        return Plan._from_core(_core.Plan.for_ranks([p._core for p in plans]), "accumplan.plan_ranks")
    except _core.InputError as e:
        raise plan_error(e) from None
