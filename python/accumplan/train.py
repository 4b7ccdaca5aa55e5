"""accumplan.train — follow a plan in a PyTorch training loop, with exact weighting and OOM recovery.

The rules (docs/weighting.md, docs/oom-contract.md), the same as ``accumplan run``:

* a window is the per-rank batch (or a shorter last one); it is split into the plan's microbatches;
* every microbatch contributes the SUM of its per-unit losses divided by N, the window's units:
  samples, or valid tokens (target != ignore_index) — counted before the first backward, and over
  all ranks under torch.distributed — so the accumulated gradient is the whole window's mean;
* gradients are synchronised once per window; the optimizer steps once per window; clipping sees
  the combined gradient; a GradScaler unscales once; a scheduler advances only on real steps;
* on out-of-memory the window's gradients are dropped, the plan is re-split below the failing size
  and the window is replayed from its first sample (under torch.distributed every rank agrees on
  the failure and re-plans identically).

Works with Debian's PyTorch 1.13 and with 2.x; ``model`` may be an ``nn.Module``, a DDP module or
a TorchScript module from ``torch.jit.load``.

Module layout (docs/python.md): the step of one microbatch is in accumplan.window, the losses in
accumplan.losses, the data in accumplan.batches, torch.distributed in accumplan.distributed; this
module holds the public entry points (``train_window``, ``split``) and re-exports the helpers in
``__all__``. It does not import accumplan.plans (a Plan is passed in), so plans may import it.
"""

import contextlib
import time

import torch.distributed as dist

from . import _core
from ._args import (INT32_MAX, INT32_MIN, budget_arg, callable_arg, choice_arg, documented_arg, flag_arg, int_arg,
                    module_arg, optimizer_arg)
from .batches import (as_inputs, check_lengths, count_samples, pad_sequences, padding_mask,
                      ragged_data, slice_samples, target_arg, valid_token_counts)
from .distributed import (all_reduce_gradients, all_reduce_ints, collective_device, ddp_bucket_bytes, group_world_size,
                          is_ddp, on_rank)
from .errors import OutOfMemoryAtOne
from .losses import (LOSSES, causal_shift, count_units, loss_sum, model_labels, model_output, resolve_normalization,
                     takes_num_items, units_rule)
from .meters import CpuMeter, held_bytes, meter_for
from .sharding import check_plan_and_optimizer
from .window import (EvalBackend, EvalMode, EvalStats, TrainBackend, Window, batch_dependent_layers, is_oom,
                     trainable_parameters, warn_batch_dependent_once, zero_grads)

WindowStats = _core.WindowStats


def _refuse_empty(samples, world):
    """A window of no samples at all (over every rank: each sees the same count, so each raises)."""
    if samples == 0:
        raise ValueError("the window holds no samples (dim 0 of its tensors is 0%s); pass at least one"
                         % (" on every rank" if world > 1 else ""))


# --- the low-level way: your own loop ----------------------------------------------------------

def split(plan, inputs, target=None, *, ignore_index=None, normalization=None, loss=None, model=None, group=None,
          shift_labels=None):
    """Yields ``((inputs, target), scale)`` for each microbatch of one window.

    ``scale`` is 1/N, N the window's units (samples, or valid tokens; summed over all ranks when
    torch.distributed is initialised), so ``(scale * sum_of_per_unit_losses).backward()`` over the
    microbatches accumulates the window's mean-loss gradient. Pass ``model=`` a DDP module to have
    every microbatch but the last run under ``model.no_sync()`` (the scale then also undoes DDP's
    division by the world size). Without DDP under torch.distributed, call
    ``all_reduce_gradients(params)`` once after the loop. Yields nothing for a window without
    valid tokens. No OOM recovery here: use ``train_window`` for that. With loss="model" over
    per-token labels, N counts the labels' valid tokens (of labels[:, 1:] when the model shifts
    them: ``shift_labels``, or detected from ``model=``); weight each microbatch's mean by its
    own: ``loss_sum(out.loss, labels, "model", "tokens", shift_labels=...)``."""
    inputs, target = as_inputs(inputs), target_arg(target)
    loss_kind = loss if loss is not None else plan.loss
    ii = plan.ignore_index if ignore_index is None else int_arg(ignore_index, "ignore_index", INT32_MIN, INT32_MAX)
    world, sizes = group_world_size(group), []

    def count():  # this rank's share and split, checked before the core's collective agrees on every rank's
        n = count_samples(inputs, target)
        sizes[:] = plan.window_sizes(n, dist.get_rank(group) if world > 1 else 0) if n > 0 else []
        norm, labels = units_rule(normalization or plan.normalization, loss_kind, None, inputs, target)
        shift = causal_shift(model, shift_labels) if loss_kind == "model" and norm == "tokens" else False
        return _core.ShareCounts(n, count_units(labels, n, norm, ii, shift) if n > 0 else 0, normalization=norm)
    params = trainable_parameters(model.module if is_ddp(model) else model) if model is not None else []
    counts = _core.WindowLoop(plan._core).count_window(_ShareCounter(count, group, params),
                                                       "while checking its share of the window")
    rank_samples, units = counts.rank_samples, counts.units
    _refuse_empty(sum(rank_samples), world)
    if units == 0:
        return
    ddp = model is not None and is_ddp(model)
    if ddp and min(rank_samples) == 0:
        raise ValueError("rank %d has no samples in the window, so it cannot join DDP's gradient all-reduce; "
                         "use plan.train_window, which exchanges gradients itself" % rank_samples.index(0))
    scale = (world if ddp else 1) / units
    start = 0
    for i, m in enumerate(sizes):
        ctx = model.no_sync() if ddp and i < len(sizes) - 1 else contextlib.nullcontext()
        with ctx:
            yield slice_samples(inputs, target, start, m), scale
        start += m


class _ShareCounter(_core.WindowBackend):
    """The window loop's counting step alone, for ``split``: this rank's share (``count()``, a
    refusal naming the rank when there are several) and the group's collective."""

    def __init__(self, count, group, params):
        super().__init__()
        self._count, self._group, self._params = count, group, params

    def world_size(self):
        return group_world_size(self._group)

    def rank(self):
        return dist.get_rank(self._group) if self.world_size() > 1 else 0

    def sum_over_ranks(self, values):
        return all_reduce_ints(list(values), self._group, collective_device(self._group, self._params))

    def count_share(self):
        try:
            return self._count()
        except ValueError as e:
            if self.world_size() == 1:
                raise
            raise on_rank(e, self.rank()) from e


# --- the high-level way: one call per window ---------------------------------------------------

def _check_share(w, normalization):
    """This rank's share: its samples, lengths (packed plans) and units. Returns n; sets w.norm,
    w.units, w.longest and w.lengths. Raises ValueError naming what is wrong."""
    n = count_samples(w.inputs, w.target)
    labels = w.set_units_rule(normalization or w.plan.normalization)
    if w.packed and w.lengths is None:
        raise ValueError("this plan packs ragged data by tokens (plan.tokens): pass the sequences as a list of 1-D "
                         "tensors (or of example dicts), or a padded batch with lengths= (accumplan.pad_sequences "
                         "returns them)")
    if w.lengths is not None:
        w.lengths = check_lengths(w.inputs, w.target, w.lengths, n)
        w.longest = max(w.lengths) if w.lengths else 0
    w.units = count_units(labels, n, w.norm, w.ii, w.shift) if n > 0 else 0
    return n


def _share_counts(w, normalization):
    """This rank's share as the core's window loop counts it (_core.ShareCounts); a refused share
    names this rank when there are several."""
    try:
        n = _check_share(w, normalization)
    except ValueError as e:
        if not w.distributed:
            raise
        raise on_rank(e, w.rank()) from e
    return _core.ShareCounts(n, w.units, w.units if w.norm == "tokens" else 0, w.lengths or [], w.norm)


def _start_measuring(w, optimizer, measure_memory, memory_budget=None):
    """The meter that reads this window's peak (None: not measured). None measures on CUDA (the
    caching allocator's peak statistics, reset here) and not on the CPU, where it installs the
    counting allocator for the window, with memory_budget (CPU only) enforced. Call after the
    gradients were dropped: what exists then (weights, buffers, optimizer state) is added to the
    figures, not counted."""
    if memory_budget is not None and (measure_memory is False or w.device.type != "cpu"):
        raise ValueError("memory_budget is enforced on the CPU by the window's counting allocator%s" % (
            ": drop measure_memory=False" if w.device.type == "cpu" else
            "; on %s the device enforces its own capacity (torch.cuda.set_per_process_memory_fraction caps it)"
            % w.device.type))
    if measure_memory is None:  # checked already (_checked_arguments)
        measure_memory = w.device.type == "cuda" or memory_budget is not None
    if not measure_memory:
        return None
    if w.device.type not in ("cpu", "cuda"):
        raise ValueError("measure_memory reads cpu or cuda memory; the model is on %s" % w.device)
    meter = meter_for(w.device, held_bytes(w.inner, optimizer) + ddp_bucket_bytes(w.model))
    if memory_budget is not None:
        try:
            meter.limit(budget_arg(memory_budget, meter.total_bytes))
        except (TypeError, ValueError):
            meter.close()  # the counting allocator goes with the refusal
            raise
    meter.sync()
    meter.reset_peak()
    return meter


def _stop_measuring(meter, st):
    """The window's peak into ``st``; the CPU's counting allocator removed (CUDA's budget is not
    touched: train_window never sets one)."""
    if meter is None:
        return
    try:
        meter.sync()
        if st is not None:  # a window that failed has no figures; the meter goes all the same
            st.peak_bytes, st.reserved_peak_bytes = meter.peak(), meter.reserved_peak()
    finally:
        if isinstance(meter, CpuMeter):
            meter.close()


def train_window(plan, model, optimizer, inputs, target=None, *, loss=None, loss_fn=None, scaler=None,
                 max_grad_norm=None, scheduler=None, autocast=None, normalization=None, ignore_index=None,
                 oom_recovery=True, group=None, on_oom=None, lengths=None, shift_labels=None, measure_memory=None,
                 memory_budget=None, packing="time"):
    """Trains one window (the per-rank batch, or a shorter last one) and steps the optimizer once.

    loss: "cross_entropy" | "mse" | "model" (default: the plan's setup.loss), or ``loss_fn(output,
    target)`` returning the SUM over units of the microbatch (it receives what the model returned);
    a loss_fn that returns a mean is refused before the window's first backward (ValueError).
    Batch-dependent layers in training mode are warned about once per model.
    scaler: a GradScaler (fp16): scaled backward per microbatch, unscaled once, clipped, stepped,
    updated. max_grad_norm clips the combined gradient. scheduler.step() runs only when the
    optimizer really stepped. autocast: a dtype (torch.bfloat16, torch.float16) to run forwards under.
    On out-of-memory (``is_oom``) the window's gradients are dropped, the plan re-planned below the
    failing size (``plan.replans`` says how; ``on_oom(note)`` is called) and the window replayed.
    loss="model": the forward returns the microbatch's MEAN loss (a Hugging Face model given
    labels). With integer labels [B,T] (the target, or the dict's "labels") N counts their valid
    tokens (normalization "auto" decides as for cross_entropy) and each microbatch's mean is
    weighted by its own valid tokens, of labels[:, 1:] when the model shifts them (shift_labels:
    None detects a Hugging Face causal LM by its class name; True/False states it); a forward that
    takes ``num_items_in_batch`` is passed the window's tokens instead. ``WindowStats.normalization``
    says which was used.
    A plan with ``checkpoint`` (schema 1.7) trains the window with those modules checkpointed
    (``plan.apply_checkpointing``; the forwards put back after the window).
    measure_memory: the window's memory peak in ``WindowStats.peak_bytes`` (beside the plan's
    ``predicted_peak_bytes``): None measures on CUDA only (resets the device's peak statistics), True
    on the CPU too (the counting allocator is installed for the window), False never.
    memory_budget (CPU): bytes, "12GiB" or "90%", enforced by that allocator as a GPU enforces its
    capacity: a microbatch past it runs out of memory and is recovered as any out-of-memory is.
    Under torch.distributed (world size > 1) every rank must call it for every window; the units
    are counted globally, failures are agreed on after each rank's microbatches, and the gradients
    are exchanged once, after the last microbatch (a DDP module runs every microbatch under
    ``no_sync()``: a DDP backward cannot be abandoned when a peer runs out of memory).
    Ragged data: pass the window's sequences as a list of 1-D token tensors with target a list of
    per-token tensors, a tensor of one target per sequence, or None (next-token targets for
    cross_entropy, as ``accumplan run --data`` reads ``[sequences, None]``); or a list of Hugging
    Face example dicts (loss="model", labels in each dict); or inputs and target padded along dim 1
    with ``lengths=`` (``pad_sequences`` returns them). Under a packed plan (``plan.tokens``) the
    window is packed longest first under the token budget (``plan.pack``); under a sample plan it is
    split by the plan's sizes in the order given. Either way each microbatch is cut to its own
    longest, with ``padding_mask(...)`` as one more forward argument when the plan's setup asks for
    it, and a packed window's ``WindowStats.predicted_peak_bytes`` is the plan's token model's
    prediction for what it packed. packing ("time" or "fill", as ``accumplan run --packing``): "time"
    cuts each window where ``plan.packing_cost()`` predicts the least time, a cost refitted on the
    CPU from every packed microbatch this plan has timed (the plan's step cost until then); "fill"
    fills each microbatch to the token budget. An out-of-memory lowers the budget below the failing
    microbatch's padded tokens and replays. A packed plan with ``tokens.target_tokens`` (schema 1.4)
    windows by valid tokens (``token_windows`` over ``valid_token_counts``): its window holds any
    number of samples, a rank's share too (under torch.distributed a rank may hold none). Under
    torch.distributed a rank whose share is bad (``lengths=`` missing or of the wrong count,
    mismatched tensors) reports it in the counts all-reduce and every rank raises a ValueError
    naming it, instead of its peers hanging."""
    t0 = time.perf_counter()
    loss_kind = loss if loss is not None else plan.loss
    ii = plan.ignore_index if ignore_index is None else int_arg(ignore_index, "ignore_index", INT32_MIN, INT32_MAX)
    inputs, target, lengths = _checked_arguments(model, optimizer, inputs, target, scheduler, scaler, on_oom,
                                                 oom_recovery, measure_memory, lengths, loss_kind, ii, plan)
    if group is not None and not (dist.is_available() and dist.is_initialized()):
        raise ValueError("group: torch.distributed is not initialized (was the process group destroyed?); "
                         "initialize it, or leave group out")
    world = group_world_size(group)
    if world != plan.world_size and world > 1:
        raise ValueError("the plan is for world size %d but the process group has %d ranks; re-plan with "
                         "world_size=%d" % (plan.world_size, world, world))
    if world != plan.world_size and group is not None and group_world_size() > 1:
        raise ValueError("group: it holds %d rank%s but the plan is for %d (the default group has %d): pass the group "
                         "of the plan's ranks, or leave group out" % (world, "" if world == 1 else "s", plan.world_size,
                                                                     group_world_size()))
    if loss_fn is None and loss_kind not in LOSSES:
        raise ValueError("loss %r is unknown; use cross_entropy, mse, model, or pass loss_fn" % (loss_kind,))
    if loss_fn is None and loss_kind == "model" and target is not None and isinstance(inputs, dict):
        raise ValueError("loss='model' with dict inputs takes its labels from the dict: pass target=None")
    if max_grad_norm is not None:
        max_grad_norm = documented_arg(max_grad_norm, "max_grad_norm", "max_grad_norm")
    packing = choice_arg(packing, "packing", _core.PACKINGS)  # run --packing's names
    w = Window(plan, model, inputs, target, lengths, loss_kind, loss_fn, ii, autocast, scaler, group,
               shift_arg=causal_shift(model, shift_labels) if shift_labels is not None else None)
    warn_batch_dependent_once(w.inner)
    backend = TrainBackend(w, optimizer, lambda: _share_counts(w, normalization), scheduler)
    zero_grads(w.params, optimizer)
    checkpointed = plan.apply_checkpointing(w.inner)  # the plan's checkpointing for this window only
    st = None
    try:
        backend.meter = _start_measuring(w, optimizer, measure_memory, memory_budget)
        st = plan.run_window(backend, on_oom, oom_recovery=oom_recovery, max_grad_norm=max_grad_norm, packing=packing)
    finally:
        if checkpointed is not None:
            checkpointed.remove()
        _stop_measuring(backend.meter, st)
    if st.predicted_peak_bytes is None and not w.packed:  # this rank's: a sharded plan's ranks differ
        st.predicted_peak_bytes = _core.predicted_peak_of_rank(plan._core, dist.get_rank(group) if world > 1 else 0)
    st.seconds = time.perf_counter() - t0
    return st


def _checked_arguments(model, optimizer, inputs, target, scheduler, scaler, on_oom, oom_recovery, measure_memory,
                       lengths, loss_kind, ii, plan):
    """train_window's objects checked before anything runs (a bad scheduler is refused before the
    optimizer steps, not after). Returns (inputs, target, lengths) as the window takes them: ragged
    data (a list of sequences or of example dicts) padded, with its lengths."""
    module_arg(model, "model")
    optimizer_arg(optimizer)
    check_plan_and_optimizer(plan, optimizer)  # a sharded plan's microbatch fits beside a share of the state only
    callable_arg(scheduler, "scheduler", "an LR scheduler (an object with step())", ("step",))
    callable_arg(scaler, "scaler", "a torch.cuda.amp.GradScaler", ("scale", "unscale_", "step", "update", "get_scale"))
    callable_arg(on_oom, "on_oom", "a callable(note)")
    flag_arg(oom_recovery, "oom_recovery")
    flag_arg(measure_memory, "measure_memory", none_ok=True)
    return _window_data(plan, inputs, target, lengths, loss_kind, ii)


def _window_data(plan, inputs, target, lengths, loss_kind, ii):
    """As _checked_arguments returns them; a plan made for variable-length data takes any list as sequences."""
    ragged = ragged_data(inputs, target, lengths, loss_kind, ii,
                         packed=plan.tokens is not None or bool(plan.setup.get("seq_len")))
    return ragged if ragged is not None else (as_inputs(inputs), target_arg(target), None)


def evaluate(plan, model, inputs, target=None, *, loss=None, loss_fn=None, autocast=None, normalization=None,
             ignore_index=None, lengths=None, shift_labels=None, oom_recovery=True, on_oom=None, on_outputs=None,
             measure_memory=None, memory_budget=None, optimizer=None):
    """Evaluates a batch in the plan's eval microbatches (``plan.eval``; the training microbatch for
    a plan without one): forward only, under no_grad, with every submodule in eval mode (each
    module's own flag put back after). Returns ``EvalStats`` whose ``loss`` is the exact mean over
    the batch's units (samples, or valid tokens as train_window counts them): the sum of the
    microbatches' loss sums divided once, so the same number whatever the split.
    The arguments are train_window's (inputs, target, loss, loss_fn, autocast, normalization,
    ignore_index, lengths, shift_labels, measure_memory, memory_budget); ragged data is split by count, each
    microbatch cut to its own longest. On out-of-memory (``is_oom``) the samples from the failing
    microbatch on run at half its size (``on_oom(note)`` is called), nothing skipped or counted twice;
    OutOfMemoryAtOne at one sample. on_outputs(output, start): the model's output of each
    microbatch, handed over once the NEXT microbatch's forward has finished (the plan's
    ``eval_keep_outputs`` measured exactly that); move it off the device there. Gradients are not
    touched: free them first (``optimizer.zero_grad(set_to_none=True)``), as the plan assumes.
    optimizer: the one whose state stays resident, so that measure_memory on the CPU counts it as the
    plan's eval peak does (its ``predicted_peak_bytes``); it is not stepped."""
    t0 = time.perf_counter()
    loss_kind = loss if loss is not None else plan.loss
    ii = plan.ignore_index if ignore_index is None else int_arg(ignore_index, "ignore_index", INT32_MIN, INT32_MAX)
    module_arg(model, "model")
    callable_arg(on_oom, "on_oom", "a callable(note)")
    callable_arg(on_outputs, "on_outputs", "a callable(output, start)")
    flag_arg(oom_recovery, "oom_recovery")
    flag_arg(measure_memory, "measure_memory", none_ok=True)
    if optimizer is not None:
        optimizer_arg(optimizer)
    if loss_fn is None and loss_kind not in LOSSES:
        raise ValueError("loss %r is unknown; use cross_entropy, mse, model, or pass loss_fn" % (loss_kind,))
    inputs, target, lengths = _window_data(plan, inputs, target, lengths, loss_kind, ii)
    w = Window(plan, model, inputs, target, lengths, loss_kind, loss_fn, ii, autocast, None, None,
               shift_arg=causal_shift(model, shift_labels) if shift_labels is not None else None, local=True)
    w.packed = False  # an evaluation splits by count: plan.eval was measured at the longest sequences
    n = _check_share(w, normalization)
    _refuse_empty(n, 1)
    st = EvalStats()
    st.samples, st.units, st.normalization = n, w.units, w.norm
    if plan.eval is not None and plan.eval.get("micro_batch"):
        st.predicted_peak_bytes = plan.eval["predicted_peak_bytes"]
    meter = _start_measuring(w, optimizer, measure_memory, memory_budget)
    backend = EvalBackend(w, meter, on_outputs)
    try:
        with EvalMode(w.inner):
            done = _core.run_eval(backend, n, plan.eval_sizes(n), oom_recovery, on_outputs is not None, on_oom)
        st.microbatch_sizes, st.oom_recoveries = list(done.microbatch_sizes), done.oom_recoveries
    except _core.ExecutorOomError as e:
        raise OutOfMemoryAtOne(str(e)) from None
    finally:
        _stop_measuring(meter, st)
    total = backend.total
    st.loss_sum = total
    st.loss = total / w.units if w.units else float("nan")
    st.seconds = time.perf_counter() - t0
    return st


__all__ = ["is_oom", "resolve_normalization", "count_units", "model_output", "loss_sum", "split", "pad_sequences",
           "model_labels", "causal_shift", "takes_num_items", "padding_mask", "valid_token_counts", "train_window",
           "evaluate", "all_reduce_gradients", "WindowStats", "EvalStats", "OutOfMemoryAtOne", "batch_dependent_layers"]
