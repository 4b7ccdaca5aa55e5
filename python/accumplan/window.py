"""accumplan.window — the one microbatch step, and the torch side of the core's window loop.

The window algorithm itself (the split, the counts every rank agrees on, the agreement, the re-plan
and replay after an out-of-memory, clipping and the order of the update) is C++
(accumplan/window_loop.h), the one ``accumplan run`` executes. This module supplies what only
Python has, the torch sides ``TrainBackend`` and ``EvalBackend``: ``train_window``
(accumplan.train) and ``accumplan.plan``'s measured windows (accumplan.measure) both drive them,
so what is planned is what is trained. Public: ``is_oom``, ``batch_dependent_layers``
(re-exported by accumplan). Internal to the package: ``Window``, ``TrainBackend``,
``EvalBackend``, ``EvalMode``, ``trainable_parameters``, ``zero_grads``, ``autocast_dtype``,
``warn_batch_dependent``, ``warn_batch_dependent_once``.
"""

import contextlib
import math
import weakref

import torch
import torch.distributed as dist

from . import _core
from ._args import shown_value, warn_user
from .batches import gather_packed, map_inputs, padding_mask, slice_samples
from .checkpointing import interrupted_in_recompute
from .distributed import REHEARSAL, all_reduce_gradients, all_reduce_ints, collective_device, group_world_size, is_ddp
from .errors import PlanError
from .sharding import local_state
from .losses import causal_shift, loss_sum, model_labels, model_output, takes_num_items, units_rule


def is_oom(error):
    """True for torch.cuda.OutOfMemoryError (PyTorch >= 1.13; torch.OutOfMemoryError in 2.x) and
    for any RuntimeError whose message says "out of memory" (older releases, other backends)."""
    for owner in (torch.cuda, torch):
        cls = getattr(owner, "OutOfMemoryError", None)
        if isinstance(cls, type) and isinstance(error, cls):
            return True
    return isinstance(error, RuntimeError) and "out of memory" in (_message(error) or "").lower()


def _message(error):
    """str(error), or None for an exception whose __str__ raises."""
    try:
        return str(error)
    except Exception:  # noqa: BLE001 - a broken __str__ is the user's; its type still names it
        return None


def trainable_parameters(model):
    return [p for p in model.parameters() if p.requires_grad]


def zero_grads(params, optimizer=None):
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    for p in params:
        p.grad = None


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
    if not (math.isfinite(pair) and math.isfinite(each)):
        return  # nothing to compare: the window loop skips the step of a non-finite loss
    if not math.isclose(pair, each, rel_tol=1e-3, abs_tol=1e-6):
        raise ValueError("loss_fn must return the SUM over the microbatch's samples: for samples 0 and 1 it returned "
                         "%.6g, but %.6g for them one at a time (a mean?); pass reduction='sum', e.g. "
                         "functools.partial(F.cross_entropy, reduction='sum'), or use loss='cross_entropy'"
                         % (pair, each))


def _first_line(error):
    message = _message(error)
    text = "(its message could not be read)" if message is None else " ".join(message.split("\n")[0].split())
    return type(error).__name__ + (": " + text if text else "")


def _specs(values):
    """The microbatch's inputs as a message shows them: dtype[shape] per tensor, the type of any other value."""
    return ", ".join("%s%s" % (str(t.dtype).replace("torch.", ""), list(t.shape)) if isinstance(t, torch.Tensor)
                     else type(t).__name__ for t in values)


@contextlib.contextmanager
def blamed(what, only=Exception):
    """User code run inside a window — the model's forward, ``loss_fn``, a backward through the
    user's hooks — failing with anything but out-of-memory: one PlanError that says which and the
    error's first line (the original chained as ``__cause__``), not torch's trace from deep inside.
    LibTorch's host allocator failing (a ulimit, the machine's memory) is the C++ core's
    host_out_of_memory line: no smaller microbatch fixes it."""
    interrupted_in_recompute()  # a Ctrl-C noted before this block is not this block's
    try:
        yield
    except KeyboardInterrupt:
        interrupted_in_recompute()  # torch 2.x hands a recompute's Ctrl-C on as itself: noted and said
        raise
    except only as e:  # noqa: BLE001 - out-of-memory and accumplan's own errors pass unchanged
        if is_oom(e) or isinstance(e, PlanError):
            raise
        if interrupted_in_recompute():
            raise KeyboardInterrupt from e
        asked = _core.failed_host_allocation_bytes(_message(e) or "")
        if asked is not None:
            raise PlanError(_core.host_out_of_memory(asked, "in " + what)) from e
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
        cut = ", each cut along dim 1 to the longest of its lengths=" if w.lengths is not None else ""
        with blamed("the model's forward on a microbatch of %d samples (inputs %s%s)"
                    % (n, _specs(list(moved.values()) if isinstance(moved, dict) else moved), cut)):
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
        self.rehearse = False  # accumplan.plan's windows for W ranks: a rank's exchange, with no peer
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


class TrainBackend(_core.WindowBackend):
    """The torch side of the core's window loop (_core.WindowLoop) for one window ``w``: the user's
    forward, loss sum and backward of sum / N per microbatch, the gradient exchange, the scaler
    and the optimizer step. ``count()`` returns this rank's _core.ShareCounts; ``meter`` (or None)
    is the memory meter whose budget may raise an out-of-memory."""

    def __init__(self, w, optimizer, count, scheduler=None, meter=None):
        super().__init__()
        self.w, self.optimizer, self.count, self.scheduler, self.meter = w, optimizer, count, scheduler, meter
        self.total = None  # the attempt's loss sum, a float64 tensor read once per window

    def world_size(self):
        return self.w.world if self.w.distributed else 1

    def rank(self):
        return self.w.rank() if self.w.distributed else 0

    def sum_over_ranks(self, values):
        return all_reduce_ints(list(values), self.w.group, self.w.cdev)

    def count_share(self):
        return self.count()

    def begin_attempt(self):
        zero_grads(self.w.params, self.optimizer)
        self.total = None

    def run_microbatch(self, mb, units):
        w, m = self.w, mb.where.size
        w.units = units  # a model's num_items_in_batch
        mb_inputs, mb_target, mask = _microbatch(w, list(mb.samples) if w.packed else None, mb.start, m)
        with w.ddp_ctx():
            s = _loss_value(_forward_sum(w, mb_inputs, mb_target, m, mask, check_loss_fn=mb.where.index == 0), w, m)
            part = s.detach().to(torch.float64)
            obj = s / units
            with blamed("the backward of a microbatch of %d samples" % m):
                (w.scaler.scale(obj) if w.scaler is not None else obj).backward()
        self.total = part if self.total is None else self.total + part

    def is_out_of_memory(self, error):
        # Only asked: holding the error would hold its traceback's frames, and their tensors.
        return is_oom(error) or (self.meter is not None and self.meter.oom())

    def after_out_of_memory(self):
        zero_grads(self.w.params, self.optimizer)
        self.total = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if self.meter is not None:
            self.meter.clear()

    def loss_sum(self):
        return 0.0 if self.total is None else float(self.total)

    def exchanges(self):
        return self.w.distributed or self.w.rehearse

    def exchange_gradients(self):
        group = self.w.group if self.w.distributed else REHEARSAL
        return all_reduce_gradients(self.w.params, group, extra=self.loss_sum())

    def has_scaler(self):
        return self.w.scaler is not None

    def loss_scale(self):
        return float(self.w.scaler.get_scale()) if self.w.scaler is not None else 1.0

    def unscale_finds_non_finite(self):
        scaler = self.w.scaler
        if scaler is None:
            return False
        scaler.unscale_(self.optimizer)
        found = getattr(scaler, "_found_inf_per_device", None)  # what torch's GradScaler's unscale_ found
        if callable(found):
            return any(bool(v.item()) for v in found(self.optimizer).values())
        return not all(bool(torch.isfinite(p.grad).all()) for p in self.w.params if p.grad is not None)

    def gradient_norm(self):
        """The combined gradient's 2-norm, in float64 as the C++ executor computes it."""
        norms = [p.grad.detach().norm(2).to(torch.float64) for p in self.w.params if p.grad is not None]
        return float(torch.stack(norms).norm(2)) if norms else 0.0

    def scale_gradients(self, coefficient):
        for p in self.w.params:
            if p.grad is not None:
                p.grad.mul_(coefficient)

    def optimizer_step(self, step):
        with blamed("the optimizer's step (%s)" % type(self.optimizer).__name__):
            if self.w.scaler is not None:
                self.w.scaler.step(self.optimizer)
            else:
                self.optimizer.step()

    def after_update(self, stepped, event):
        if self.w.scaler is not None:
            self.w.scaler.update()
        if stepped and self.scheduler is not None:
            with blamed("the scheduler's step (%s)" % type(self.scheduler).__name__):
                self.scheduler.step()

    def release_cached(self):
        # Before the step that makes the optimizer's state: its tensors in fresh blocks of the
        # caching allocator, not in those the window's activations left cached.
        if self.w.device.type == "cuda":
            torch.cuda.empty_cache()

    def drop_gradients(self):
        zero_grads(self.w.params, self.optimizer)

    def optimizer_state_exists(self):
        return bool(local_state(self.optimizer))

    def wall_time_is_device_time(self):
        return self.w.device.type == "cpu"


class EvalBackend(_core.EvalBackend):
    """The torch side of the core's evaluation loop (_core.run_eval): one microbatch's forward and
    loss sum under the caller's no_grad and eval mode; a kept output goes to ``on_outputs(output,
    start)`` when the loop hands it over."""

    def __init__(self, w, meter=None, on_outputs=None):
        super().__init__()
        self.w, self.meter, self.on_outputs = w, meter, on_outputs
        self.total, self.held = 0.0, []

    def eval_microbatch(self, index, start, size, keep_output):
        w = self.w
        mb_inputs, mb_target, mask = _microbatch(w, None, start, size)
        outs = [] if keep_output else None
        s = _forward_sum(w, mb_inputs, mb_target, size, mask, check_loss_fn=index == 0, outputs=outs)
        self.total += float(_loss_tensor(s, "loss_fn" if w.loss_fn is not None else "the model's loss", size))
        if keep_output:
            self.held.append((outs[0], start))

    def is_out_of_memory(self, error):
        return is_oom(error) or (self.meter is not None and self.meter.oom())

    def after_out_of_memory(self):
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if self.meter is not None:
            self.meter.clear()

    def hand_over_output(self):
        output, start = self.held.pop(0)
        if self.on_outputs is not None:
            self.on_outputs(output, start)


class EvalMode:
    """Every submodule in eval mode, and no_grad, inside the block; each module's own flag put back
    after (a model may keep a frozen BatchNorm in eval mode while it trains: model.train() would
    undo that)."""

    def __init__(self, model):
        self.model, self.flags = model, [(m, m.training) for m in model.modules()]
        self.no_grad = torch.no_grad()

    def __enter__(self):
        self.model.eval()
        self.no_grad.__enter__()

    def __exit__(self, *exc):
        self.no_grad.__exit__(*exc)
        for m, training in self.flags:
            m.training = training
