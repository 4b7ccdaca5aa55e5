"""accumplan.window — the one microbatch step: a window's shared settings (``Window``), forward
and loss sum, backward of sum / N, the rounds of a window, and the optimizer step.

``train_window`` (accumplan.train) and ``accumplan.plan``'s measured windows (accumplan.measure)
both run this step, so what is planned is what is trained. Public: ``is_oom``, ``WindowStats``,
``batch_dependent_layers`` (re-exported by accumplan). Internal to the package: ``Window``,
``trainable_parameters``, ``zero_grads``, ``autocast_dtype``, ``run_rounds``, ``optimizer_step``,
``warn_batch_dependent``, ``warn_batch_dependent_once``.
"""

import contextlib
import math
import time
import weakref

import torch
import torch.distributed as dist

from . import _core
from ._args import shown_value, warn_user
from .batches import gather_packed, map_inputs, padding_mask, slice_samples
from .distributed import agree_status, collective_device, group_world_size, is_ddp
from .errors import OutOfMemoryAtOne, PlanError, in_python_terms
from .losses import causal_shift, loss_sum, model_labels, model_output, takes_num_items, units_rule


def is_oom(error):
    """True for torch.cuda.OutOfMemoryError (PyTorch >= 1.13; torch.OutOfMemoryError in 2.x) and
    for any RuntimeError whose message says "out of memory" (older releases, other backends)."""
    for name in ("OutOfMemoryError",):
        for owner in (getattr(torch, "cuda", None), torch):
            cls = getattr(owner, name, None) if owner is not None else None
            if isinstance(cls, type) and isinstance(error, cls):
                return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


def trainable_parameters(model):
    return [p for p in model.parameters() if p.requires_grad]


def zero_grads(params, optimizer=None):
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    for p in params:
        p.grad = None


class WindowStats:
    """What one ``train_window`` call did."""

    def __init__(self):
        self.samples = 0            # of the whole window, all ranks
        self.local_samples = 0      # of this rank
        self.units = 0              # N: samples or valid tokens, all ranks
        self.loss = float("nan")    # the window's mean loss (all ranks)
        self.microbatch_sizes = []  # this rank's split, after any re-plan
        self.stepped = False
        self.skipped = False
        self.skip_reason = ""
        self.grad_norm = None
        self.oom_recoveries = 0
        self.seconds = 0.0
        self.normalization = ""     # what N counted: "samples" or "tokens"
        self.peak_bytes = None      # the window's memory peak (measure_memory): CUDA's caching allocator's
        #                             allocated peak (what the plan predicts), or the CPU counting allocator's
        self.reserved_peak_bytes = None  # CUDA: the caching allocator's reserved peak, reported beside it
        self.predicted_peak_bytes = None  # the plan's predicted peak of a full window ($.memory)

    def __repr__(self):
        return "WindowStats(%s)" % ", ".join("%s=%r" % kv for kv in vars(self).items())


class EvalStats:
    """What one ``evaluate`` call did."""

    def __init__(self):
        self.loss = float("nan")    # the mean loss: the sum over the batch / units, whatever the split
        self.loss_sum = 0.0
        self.units = 0              # samples, or valid tokens in tokens mode
        self.samples = 0
        self.microbatch_sizes = []  # as run, a re-split after an out-of-memory included
        self.oom_recoveries = 0
        self.normalization = ""
        self.peak_bytes = None      # measure_memory: the evaluation's peak, as WindowStats.peak_bytes
        self.predicted_peak_bytes = None  # the plan's eval prediction (plan.eval), None without one
        self.seconds = 0.0

    def __repr__(self):
        return "EvalStats(%s)" % ", ".join("%s=%r" % kv for kv in vars(self).items())


def _check_loss_fn_sums(loss_fn, out, target):
    """Refuses a ``loss_fn`` that does not return the SUM over samples, before the microbatch's
    backward: a mean (``F.cross_entropy`` as written everywhere) would weight every microbatch by
    1/its size and silently change the objective. The test is additivity on the output already
    computed (no second forward), on its first two samples only, so that the check adds the
    memory of two samples' loss, never of half a microbatch's logits at the microbatch's peak:
    loss(samples 0 and 1) must equal loss(sample 0) + loss(sample 1). Only a tensor output and
    target with two or more samples can be split; anything else is taken at its word."""
    n = target.shape[0] if isinstance(target, torch.Tensor) and target.dim() > 0 else 0
    if n < 2 or not isinstance(out, torch.Tensor) or out.dim() == 0 or out.shape[0] != n:
        return
    with torch.no_grad(), blamed("loss_fn(output, target)"):
        pair = float(_loss_tensor(loss_fn(out[:2], target[:2]), "loss_fn", 2))
        each = sum(float(_loss_tensor(loss_fn(out[i:i + 1], target[i:i + 1]), "loss_fn", 1)) for i in (0, 1))
    if not math.isclose(pair, each, rel_tol=1e-3, abs_tol=1e-6):
        raise ValueError("loss_fn must return the SUM over the microbatch's samples: for samples 0 and 1 it returned "
                         "%.6g, but %.6g for them one at a time (a mean?); pass reduction='sum', e.g. "
                         "functools.partial(F.cross_entropy, reduction='sum'), or use loss='cross_entropy'"
                         % (pair, each))


def _first_line(error):
    text = " ".join(str(error).split("\n")[0].split())
    return type(error).__name__ + (": " + text if text else "")


def _specs(tensors):
    return ", ".join("%s%s" % (str(t.dtype).replace("torch.", ""), list(t.shape)) for t in tensors)


@contextlib.contextmanager
def blamed(what, only=Exception):
    """User code run inside a window — the model's forward, ``loss_fn``, a backward through the
    user's hooks — failing with anything but out-of-memory: one PlanError that says which and the
    error's first line (the original chained as ``__cause__``), not torch's trace from deep inside.
    LibTorch's host allocator failing (a ulimit, the machine's memory) is the C++ core's
    host_out_of_memory line: no smaller microbatch fixes it."""
    try:
        yield
    except only as e:  # noqa: BLE001 - out-of-memory and accumplan's own errors pass unchanged
        if is_oom(e) or isinstance(e, PlanError):
            raise
        asked = _core.failed_host_allocation_bytes(str(e))
        if asked is not None:
            raise PlanError(in_python_terms(_core.host_out_of_memory(asked, "in " + what))) from e
        raise PlanError("%s failed: %s" % (what, _first_line(e))) from e


def _loss_value(s, w, n):
    """The microbatch's loss sum checked before its backward: a 0-dim floating tensor that requires
    grad (a float, a vector or a detached output would otherwise fail inside torch, or train
    nothing)."""
    s = _loss_tensor(s, "loss_fn" if w.loss_fn is not None else "the model's loss", n)
    if not s.requires_grad:
        raise PlanError("the loss does not require grad, so backward cannot train the model: its output is "
                        "detached, computed under torch.no_grad(), or every parameter it uses is frozen")
    return s


def _loss_tensor(s, who, n):
    """``s`` as a 0-dim floating tensor, or PlanError naming ``who`` returned what instead."""
    if not isinstance(s, torch.Tensor):
        raise PlanError("%s returned %s (%s); it must return the microbatch's loss SUM as a 0-dim tensor"
                        % (who, type(s).__name__, shown_value(s)))
    if s.numel() != 1 or not (s.is_floating_point() or s.is_complex()):
        raise PlanError("%s returned a %s tensor of shape %s for a microbatch of %d samples; it must return their "
                        "loss SUM as a 0-dim floating tensor" % (who, str(s.dtype).replace("torch.", ""),
                                                                  list(s.shape), n))
    return s.reshape(())


def _forward_sum(w, mb_inputs, mb_target, n, mask=None, check_loss_fn=False, outputs=None):
    """One microbatch's forward and the SUM of its per-unit losses (divide by the window's units).
    ``outputs``, a list, receives what the model returned (an evaluation that keeps its outputs)."""
    device = w.device
    moved = map_inputs(mb_inputs, lambda t: t.to(device) if t.device != device else t)
    target = None if mb_target is None else (mb_target.to(device) if mb_target.device != device else mb_target)
    pass_units = w.norm == "tokens" and w.num_items  # the model divides its loss SUM by the window's tokens
    if isinstance(moved, dict):
        if mask is not None:
            raise ValueError("a padding mask goes to the model as one more positional argument; with dict "
                             "inputs put it in the dict (attention_mask) and plan without padding_mask")
        kwargs = dict(moved, num_items_in_batch=w.units) if pass_units else moved  # labels are in the dict

        def call():
            return w.model(**kwargs)
    else:
        args = list(moved) + ([mask.to(device)] if mask is not None else [])
        if w.loss_kind == "model" and target is not None:
            args.append(target)

        def call():
            return w.model(*args, num_items_in_batch=w.units) if pass_units else w.model(*args)
    ctx = torch.autocast(device_type=device.type, dtype=w.autocast) if w.autocast is not None else contextlib.nullcontext()
    with ctx:
        with blamed("the model's forward on a microbatch of %d samples (inputs %s)"
                    % (n, _specs(list(moved.values()) if isinstance(moved, dict) else moved))):
            out = call()
        if outputs is not None:
            outputs.append(out)
        if w.loss_fn is not None:
            if check_loss_fn:
                _check_loss_fn_sums(w.loss_fn, out, target)
            with blamed("loss_fn(output, target)"):
                return w.loss_fn(out, target)
        output, is_loss = model_output(out)
        # torch's own errors only (a shape the loss cannot take); accumplan's checks name the target.
        with blamed("the %s loss on the model's output" % w.loss_kind, only=(RuntimeError, IndexError)):
            if not is_loss and w.loss_kind != "model":
                return loss_sum(output, target, w.loss_kind, w.norm, w.ii, n)
            return loss_sum(output, model_labels(moved, target), "model", w.norm, w.ii, n,
                            units=w.units if pass_units else None, shift_labels=w.shift)


_AUTOCAST_NAMES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}


def autocast_dtype(autocast, device, name="autocast"):
    """The dtype ``train_window`` runs forwards under, or None: torch.bfloat16 or torch.float16, or
    its name as the plan's setup.amp writes it ("bf16", "fp16"; "none" for None). ValueError naming
    autocast for another dtype, or one torch cannot autocast to on ``device``."""
    if autocast is None or (isinstance(autocast, str) and autocast == "none"):
        return None
    dtype = _AUTOCAST_NAMES.get(autocast) if isinstance(autocast, str) else autocast
    if not isinstance(dtype, torch.dtype) or dtype not in (torch.bfloat16, torch.float16):
        kind = TypeError if not isinstance(autocast, (str, torch.dtype)) else ValueError
        raise kind("%s must be torch.bfloat16, torch.float16, 'bf16', 'fp16', 'none' or None, not %s"
                   % (name, shown_value(autocast)))
    import warnings
    why = None
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.autocast(device_type=device.type, dtype=dtype):
                pass
        # newer releases warn and disable it
        why = next((str(c.message) for c in caught if "autocast" in str(c.message).lower()), None)
    except RuntimeError as e:  # torch 1.13 on a CPU: "AutocastCPU only support Bfloat16"
        why = str(e)
    if why:
        raise ValueError("%s %s is not supported on %s by this torch: %s"
                         % (name, shown_value(autocast), device.type, (why.strip().splitlines() or [""])[0]))
    return dtype


def batch_dependent_layers(model):
    """The submodules of ``model`` in training mode whose statistics mix the samples of a batch, as
    "name (Type)": the C++ rule (``is_batch_dependent_type``, the one ``accumplan run`` and the
    profile use) on each submodule's class name. Accumulation cannot reproduce one large batch
    for them: each sees one microbatch at a time."""
    found = []
    for name, m in model.named_modules():
        type_name = getattr(m, "original_name", None) or type(m).__name__  # a ScriptModule's class name
        tracks = getattr(m, "track_running_stats", False) is True
        if m.training and _core.is_batch_dependent_type(type_name, tracks):
            found.append("%s (%s)" % (name or "(root)", type_name))
    return found


_WARNED_MODELS = weakref.WeakSet()  # a model is walked and warned about once, not every window


def warn_batch_dependent_once(model):
    try:
        if model in _WARNED_MODELS:
            return
        _WARNED_MODELS.add(model)
    except TypeError:  # not weak-referenceable: walked every window
        pass
    warn_batch_dependent(batch_dependent_layers(model))


def warn_batch_dependent(layers):
    """The one warning about batch-dependent layers (BatchNorm in training mode), at the user's line."""
    if layers:
        warn_user("accumplan: %d batch-dependent layer(s) in training mode (e.g. %s): accumulation will not "
                  "reproduce one large batch for them; each sees one microbatch's statistics"
                  % (len(layers), layers[0]))


class Window:
    """What every step of one window shares: the plan, the model and where it runs, the data of
    this rank, the loss settings and the process group. ``train_window`` fills it once."""

    def __init__(self, plan, model, inputs, target, lengths, loss_kind, loss_fn, ii, autocast, scaler, group,
                 shift_arg=None, local=False):
        self.plan, self.model, self.inputs, self.target, self.lengths = plan, model, inputs, target, lengths
        self.loss_kind, self.loss_fn, self.ii, self.scaler = loss_kind, loss_fn, ii, scaler
        self.group = group
        self.world = group_world_size(group)
        self.distributed = self.world > 1 and not local  # local: this process's own window (accumplan.plan's)
        self.inner = model.module if is_ddp(model) else model
        self.params = trainable_parameters(self.inner)
        if not self.params:
            raise ValueError("the model has no trainable parameters")
        self.device = self.params[0].device
        self.autocast = autocast_dtype(autocast, self.device)
        self.cdev = collective_device(group, self.params) if self.distributed else None
        self.packed = plan is not None and plan.tokens is not None  # None: accumplan.plan's measured windows
        # The padding mask as one more forward argument, for ragged data (lengths given).
        self.mask = plan is not None and plan.padding_mask
        self.ddp_ctx = model.no_sync if is_ddp(model) else contextlib.nullcontext
        self.norm, self.units, self.longest = None, 0, 0
        self.timed = None  # packed windows on the CPU: (sequences, padded length, seconds) per microbatch
        self.shift, self.num_items = False, False  # loss="model" per token: set_units_rule
        self.shift_arg = shift_arg  # shift_labels as given (None: detected by set_units_rule)

    def set_units_rule(self, normalization):
        """Sets what N counts (``norm``) and, for a model's own per-token loss, whether its labels
        shift and whether it takes ``num_items_in_batch``. Returns the tensor units are counted in."""
        self.norm, labels = units_rule(normalization, self.loss_kind, self.loss_fn, self.inputs, self.target)
        per_token_model = self.loss_fn is None and self.loss_kind == "model" and self.norm == "tokens"
        self.shift = causal_shift(self.model, self.shift_arg) if per_token_model else False
        self.num_items = takes_num_items(self.model) if per_token_model else False
        return labels

    def rank(self):
        return dist.get_rank(self.group)


def _run_microbatch(w, i, m, groups, start, oom_recovery):
    """Microbatch i (m samples from `start`, or the packed group i): forward, loss sum, backward of
    sum / N. Returns (loss sum, status, error): status 0, the failing size (packed: padded tokens)
    on out-of-memory, or -1 with the error on another failure under torch.distributed."""
    # Before the try: an out-of-memory while gathering must still report this size.
    padded = m * max(w.lengths[j] for j in groups[i]) if w.packed else 0
    try:
        mb_inputs, mb_target, mask = _microbatch(w, groups[i] if w.packed else None, start, m)
        with w.ddp_ctx():
            s = _loss_value(_forward_sum(w, mb_inputs, mb_target, m, mask, check_loss_fn=(i == 0)), w, m)
            total = float(s.detach())
            obj = s / w.units
            with blamed("the backward of a microbatch of %d samples" % m):
                (w.scaler.scale(obj) if w.scaler is not None else obj).backward()
        del s, obj
        return total, 0, None
    except Exception as e:  # noqa: BLE001 - only out-of-memory is recovered
        if not (oom_recovery and is_oom(e)):
            if not w.distributed:
                raise
            return 0.0, -1, e
        return 0.0, (padded if w.packed else m), None


def _microbatch(w, group, start, m):
    """(inputs, target, padding mask or None) of a microbatch: the packed ``group``'s sequences, or
    the next m samples from ``start``; ragged data (a sample plan on ragged data, accumplan.plan's
    windows at one length, an evaluation) cut to its own longest."""
    indices = group if group is not None else (list(range(start, start + m)) if w.lengths is not None else None)
    if indices is None:
        mb_inputs, mb_target = slice_samples(w.inputs, w.target, start, m)
        return mb_inputs, mb_target, None
    mb_inputs, mb_target, mb_longest = gather_packed(w.inputs, w.target, indices, w.lengths)
    mask = padding_mask([w.lengths[j] for j in indices], mb_longest) if w.mask else None
    return mb_inputs, mb_target, mask


class _EvalMode:
    """Every submodule in eval mode inside the block; each one's own flag put back after (a model may
    keep a frozen BatchNorm in eval mode while it trains: model.train() would undo that)."""

    def __init__(self, model):
        self.model, self.flags = model, [(m, m.training) for m in model.modules()]

    def __enter__(self):
        self.model.eval()

    def __exit__(self, *exc):
        for m, training in self.flags:
            m.training = training


def eval_rounds(w, sizes, oom_recovery, keep_outputs=False, on_outputs=None, before_microbatch=None, on_resplit=None):
    """The one Python evaluation loop, the C++ one's rules (executor/evaluate.h): microbatches of
    ``sizes`` under no_grad with the model in eval mode, their loss SUMS added. After an out-of-memory
    the samples from the failing microbatch on run at the planner's smaller size
    (``_core.eval_size_after_oom``: half; OutOfMemoryAtOne at one sample), nothing skipped or counted
    twice. keep_outputs: a microbatch's output stays referenced until the next microbatch's forward
    has finished, then goes to ``on_outputs(output, start)``. Returns (loss sum, sizes run, re-splits)."""
    sizes, total, start, i, held, resplits = list(sizes), 0.0, 0, 0, None, 0
    n = sum(sizes)
    with _EvalMode(w.inner), torch.no_grad():
        while i < len(sizes):
            m, failed = sizes[i], False
            if before_microbatch is not None:
                before_microbatch(i)
            try:
                mb_inputs, mb_target, mask = _microbatch(w, None, start, m)
                outs = [] if keep_outputs else None
                s = _forward_sum(w, mb_inputs, mb_target, m, mask, check_loss_fn=(i == 0), outputs=outs)
                total += float(_loss_tensor(s, "loss_fn" if w.loss_fn is not None else "the model's loss", m))
                if keep_outputs:
                    if held is not None and on_outputs is not None:
                        on_outputs(*held)
                    held = (outs[0], start)
                del s, outs, mb_inputs, mb_target, mask
            except Exception as e:  # noqa: BLE001 - only out-of-memory is recovered
                if not (oom_recovery and is_oom(e)):
                    raise
                failed = True
            if failed:  # out of the except block: the failed microbatch's tensors are released
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                try:
                    smaller = _core.eval_size_after_oom(m)
                except _core.InfeasibleError as e:
                    raise OutOfMemoryAtOne(in_python_terms(str(e))) from None
                sizes[i:] = _core.eval_split(n - start, smaller)
                resplits += 1
                if on_resplit is not None:
                    on_resplit("evaluation ran out of memory at a microbatch of %d samples; the %d samples from sample "
                               "%d on run in microbatches of %d" % (m, n - start, start, smaller))
                continue
            start += m
            i += 1
        if held is not None and on_outputs is not None:
            on_outputs(*held)
    return total, sizes, resplits


def run_rounds(w, sizes, groups, rounds, oom_recovery, before_microbatch=None):
    """One attempt at the window. Returns (loss sum, failing size or 0). ``before_microbatch(i)``
    is called before microbatch i starts (accumplan.plan reads the memory peaks there)."""
    total, start = 0.0, 0
    for i in range(rounds):
        status, error = 0, None
        if before_microbatch is not None and i < len(sizes):
            before_microbatch(i)
        if i < len(sizes):
            t0 = time.perf_counter()
            part, status, error = _run_microbatch(w, i, sizes[i], groups, start, oom_recovery)
            if w.timed is not None and status == 0:  # packed, on the CPU: what the step-time fit learns from
                w.timed.append((sizes[i], max(w.lengths[j] for j in groups[i]), time.perf_counter() - t0))
            total += part
            start += sizes[i]
        failing = agree_status(w, status, error)
        if failing:
            return total, failing
    return total, 0


def optimizer_step(w, optimizer, st, max_grad_norm, scheduler):
    """The AMP order: unscale once, clip the combined gradient, step, update; no step on a
    non-finite gradient; the scheduler only after a real step."""
    scaler, params = w.scaler, w.params
    if scaler is not None and max_grad_norm is not None:
        scaler.unscale_(optimizer)
    if max_grad_norm is not None:
        st.grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
    elif scaler is None:
        # As the C++ executor: the combined gradient's norm, and no step on inf/NaN (a scaler
        # finds those itself, on the unscaled gradient).
        norms = [p.grad.detach().norm(2) for p in params if p.grad is not None]
        st.grad_norm = float(torch.stack(norms).norm(2)) if norms else 0.0
    if scaler is not None:
        before = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        st.stepped = not (scaler.get_scale() < before)
        if not st.stepped:
            st.skipped, st.skip_reason = True, "non-finite gradient at loss scale %g" % before
    elif st.grad_norm is not None and not math.isfinite(st.grad_norm):
        st.skipped, st.skip_reason = True, "non-finite gradient norm"
    else:
        optimizer.step()
        st.stepped = True
    if st.stepped and scheduler is not None:
        scheduler.step()
