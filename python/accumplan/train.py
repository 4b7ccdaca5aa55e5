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
"""

import contextlib
from collections.abc import Mapping
import inspect
import math
import time
import weakref

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ._args import INT32_MAX, INT32_MIN, MAX_COUNT, _shown, choice_arg, int_arg, lengths_arg, real_arg, warn_user
from .meters import CpuMeter, held_bytes, meter_for
from .plans import OutOfMemoryAtOne, _core

LOSSES = ("cross_entropy", "mse", "model")
_BUCKET_BYTES = 25 * 1024 * 1024


# --- small helpers -----------------------------------------------------------------------------

def is_oom(error):
    """True for torch.cuda.OutOfMemoryError (PyTorch >= 1.13; torch.OutOfMemoryError in 2.x) and
    for any RuntimeError whose message says "out of memory" (older releases, other backends)."""
    for name in ("OutOfMemoryError",):
        for owner in (getattr(torch, "cuda", None), torch):
            cls = getattr(owner, name, None) if owner is not None else None
            if isinstance(cls, type) and isinstance(error, cls):
                return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


def _as_tuple(inputs):
    """A window's inputs as the model takes them: a tuple of positional tensors, or a dict passed as
    ``model(**inputs)`` (a Hugging Face batch: input_ids, attention_mask, labels). A dict's values
    that are not tensors (flags) go to every microbatch unchanged."""
    if isinstance(inputs, torch.Tensor):
        return (inputs,)
    if isinstance(inputs, Mapping):  # a dict, or a tokenizer's BatchEncoding (a UserDict)
        return dict(inputs)
    return tuple(inputs)


def _tensors(inputs):
    """The sample-indexed tensors of a window's inputs (a tuple, or a dict's tensor values)."""
    if isinstance(inputs, dict):
        return [v for v in inputs.values() if isinstance(v, torch.Tensor)]
    return list(inputs)


def _map_inputs(inputs, fn):
    """The inputs with ``fn`` applied to every tensor (a dict keeps its keys and other values)."""
    if isinstance(inputs, dict):
        return {k: fn(v) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    return tuple(fn(t) for t in inputs)


def _samples(inputs, target):
    tensors = _tensors(inputs) + ([target] if target is not None else [])
    if not tensors:
        raise ValueError("the window holds no tensors")
    n = tensors[0].shape[0] if tensors[0].dim() > 0 else None
    for i, t in enumerate(tensors):
        if t.dim() < 1:
            raise ValueError("tensor %d of the window is a scalar; dim 0 must index samples" % i)
        if t.shape[0] != n:
            raise ValueError("tensor %d of the window has %d samples (dim 0) but the first has %d" % (i, t.shape[0], n))
    return n


def _refuse_empty(samples, world):
    """A window of no samples at all (over every rank: each sees the same count, so each raises)."""
    if samples == 0:
        raise ValueError("the window holds no samples (dim 0 of its tensors is 0%s); pass at least one"
                         % (" on every rank" if world > 1 else ""))


def _world(group=None):
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(group)
    return 1


def _is_ddp(model):
    return isinstance(model, torch.nn.parallel.DistributedDataParallel)


def resolve_normalization(name, loss, target):
    """'samples' or 'tokens'. 'auto' means tokens for cross-entropy over an integer target with
    more than one dimension ([B,T] targets of [B,T,C] logits), samples otherwise; a floating
    target of cross-entropy (class probabilities [B,C]) is normalized by samples. loss None (a
    loss_fn) follows cross-entropy's rule. The rule is the C++ core's (accumplan/setup_rules.h),
    the one `accumplan run` follows; ValueError names ``normalization``."""
    is_tensor = isinstance(target, torch.Tensor)
    tokens = _core.normalizes_by_tokens(str(name), "cross_entropy" if loss is None else str(loss),
                                        target.dim() if is_tensor else 0,
                                        is_tensor and target.is_floating_point())
    return "tokens" if tokens else "samples"


def count_units(target, samples, normalization, ignore_index=-100, shift_labels=False):
    """The units of a window or microbatch: its samples, or its valid tokens (target !=
    ignore_index; with ``shift_labels``, of target[:, 1:], the positions a causal LM that shifts
    its labels inside its own loss predicts)."""
    normalization = choice_arg(normalization, "normalization", ("samples", "tokens"))
    if normalization == "samples":
        return int_arg(samples, "samples", 0, MAX_COUNT)
    ignore_index = int_arg(ignore_index, "ignore_index", INT32_MIN, INT32_MAX)
    if target is None:
        raise ValueError("tokens normalization needs a target to count tokens in")
    if not isinstance(target, torch.Tensor):
        raise TypeError("tokens normalization needs a target tensor to count tokens in, not %s" % type(target).__name__)
    if shift_labels:
        if target.dim() < 2:
            raise ValueError("shift_labels needs labels with a sequence dimension [B,T]; got %s" % list(target.shape))
        target = target[:, 1:]
    return int(target.ne(ignore_index).sum().item())


# --- a model that computes its own loss (loss="model") ------------------------------------------

# A Hugging Face causal LM's loss predicts labels[:, 1:] from positions [:, :-1]: it shifts the
# labels itself (GPT2LMHeadModel, LlamaForCausalLM, ...), so its valid tokens are those of
# labels[:, 1:]. Counting labels[:, :] instead puts one token per sequence too many in N.
_CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel")


def units_rule(normalization, loss, loss_fn, inputs, target):
    """(normalization, labels): what a window's N counts, "samples" or "tokens", and the tensor
    its tokens are counted in. A model's own loss (loss="model") over integer labels [B,T] — the
    target, or a dict's "labels" — follows cross-entropy's rule: its mean is over valid tokens."""
    own_loss = loss_fn is None and loss == "model"
    labels = model_labels(inputs, target) if own_loss else target
    rule_loss = None if loss_fn is not None else ("cross_entropy" if own_loss else loss)
    return resolve_normalization(normalization, rule_loss, labels), labels


def model_labels(inputs, target):
    """The tensor a model's own loss reads its labels from: ``target`` (passed as the last forward
    argument), or with dict inputs (a Hugging Face batch) their "labels". None if neither."""
    if target is None and isinstance(inputs, Mapping):
        labels = inputs.get("labels")
        return labels if isinstance(labels, torch.Tensor) else None
    return target


def causal_shift(model, shift_labels=None):
    """Whether ``model``'s own loss shifts its labels (predicts labels[:, 1:]): ``shift_labels``
    True or False says so; None detects a Hugging Face causal LM by its class name (one ending in
    ForCausalLM or LMHeadModel; a DDP module's wrapped one; no model: False)."""
    if shift_labels is not None:
        if not isinstance(shift_labels, bool):
            raise TypeError("shift_labels must be True, False or None (detect), not %s" % _shown(shift_labels))
        return shift_labels
    if model is None:
        return False
    inner = model.module if _is_ddp(model) else model
    return type(inner).__name__.endswith(_CAUSAL_LM_SUFFIXES)


def takes_num_items(model):
    """True when ``model``'s forward takes ``num_items_in_batch`` (Hugging Face's loss
    normalizer since transformers 4.46): its loss is then SUM / num_items_in_batch, and
    train_window passes the window's valid tokens instead of re-weighting a mean. Read from an
    explicit parameter, or the model's ``accepts_loss_kwargs`` flag (transformers' own test)."""
    inner = model.module if _is_ddp(model) else model
    if getattr(inner, "accepts_loss_kwargs", None) is True:
        return True
    try:
        return "num_items_in_batch" in inspect.signature(inner.forward).parameters
    except (TypeError, ValueError, AttributeError):  # a TorchScript method has no Python signature
        return False


def model_output(out):
    """(tensor, is_loss) from what a forward returned: a tensor; a tuple/list whose first element
    is the output; or a dict, or an object (a Hugging Face ModelOutput), with "loss" (the
    microbatch's mean loss) or "logits"."""
    if isinstance(out, dict):
        if "loss" in out and out["loss"] is not None:
            return out["loss"], True
        if "logits" in out:
            return out["logits"], False
        raise ValueError("the model returned a dict without 'loss' or 'logits' (keys: %s)" % ", ".join(map(str, out)))
    if isinstance(out, (tuple, list)):
        if not out:
            raise ValueError("the model returned an empty tuple")
        return model_output(out[0])
    if not isinstance(out, torch.Tensor):
        # An output object (a dataclass) with .loss or .logits, as a Hugging Face ModelOutput has.
        if getattr(out, "loss", None) is not None:
            return out.loss, True
        if getattr(out, "logits", None) is not None:
            return out.logits, False
        raise ValueError("the model returned %s; return a tensor, a tuple (output first), or a dict or an "
                         "object with 'loss' or 'logits'" % type(out).__name__)
    return out, False


def loss_sum(output, target, loss="cross_entropy", normalization="samples", ignore_index=-100, samples=None,
             units=None, shift_labels=False):
    """The SUM over units of the per-unit loss of one microbatch (divide by the window's units).

    cross_entropy: logits [B,C] with target [B], or [B,T,C] with [B,T]; in samples mode a sample's
    loss is the mean over its valid positions. Or logits [B,C] with a floating target [B,C] of class
    probabilities (each row non-negative, summing to 1): a sample's loss is -sum_c target[c] *
    log_softmax(output)[c], as F.cross_entropy computes it (samples mode only).
    mse: a sample's loss is the mean over its elements.
    model: ``output`` is the microbatch's mean loss (``target``: its labels); its sum is mean x
    units, the microbatch's samples, or in tokens mode its valid tokens (of target[:, 1:] with
    ``shift_labels``, as a causal LM averages); ``units`` given overrides the count (the window's
    tokens when the model was passed ``num_items_in_batch``: its loss is then SUM / that count).
    """
    ignore_index = int_arg(ignore_index, "ignore_index", INT32_MIN, INT32_MAX)
    if loss == "cross_entropy":
        if isinstance(target, torch.Tensor) and target.is_floating_point():
            if normalization == "tokens":
                raise ValueError("tokens normalization needs a target of class indices; a floating target holds "
                                 "class probabilities per sample: use normalization='samples'")
            _check_class_target(target, output.shape[-1] if output.dim() == 2 else -1, ignore_index, output.shape)
            return -(target.float() * F.log_softmax(output.float(), dim=1)).sum()
        ok2 = output.dim() == 2 and target is not None and target.dim() == 1 and target.shape[0] == output.shape[0]
        ok3 = (output.dim() == 3 and target is not None and target.dim() == 2 and
               tuple(target.shape) == tuple(output.shape[:2]))
        if not (ok2 or ok3):
            raise ValueError("cross_entropy needs logits [B,C] with target [B], or [B,T,C] with [B,T]; got output %s "
                             "and target %s" % (list(output.shape), None if target is None else list(target.shape)))
        _check_class_target(target, output.shape[-1], ignore_index)
        per = F.cross_entropy(output.reshape(-1, output.shape[-1]).float(), target.reshape(-1).long(),
                              reduction="none", ignore_index=ignore_index).reshape(target.shape)
        if normalization == "tokens" or per.dim() == 1:
            return per.sum()
        valid = target.ne(ignore_index)
        return (per.sum(1) / valid.sum(1).clamp_min(1).to(per.dtype)).sum()
    if loss == "model":
        if output.numel() != 1:
            raise ValueError("loss 'model' expects the model to return a scalar mean loss; it returned %s"
                             % list(output.shape))
        if units is None:
            units = count_units(target, samples, normalization, ignore_index, shift_labels)
        return output.reshape(()).float() * float(units)
    if normalization == "tokens":
        raise ValueError("tokens normalization applies to cross_entropy and a model's own loss, not %r" % (loss,))
    if loss == "mse":
        if target is None or output.shape != target.shape:
            raise ValueError("mse needs output and target of the same shape; got %s and %s"
                             % (list(output.shape), None if target is None else list(target.shape)))
        return (output.float() - target.float()).pow(2).reshape(output.shape[0], -1).mean(1).sum()
    raise ValueError("loss %r is unknown; use cross_entropy, mse, model, or pass loss_fn" % (loss,))


def _check_class_target(target, classes, ignore_index, output_shape=None):
    """A cross-entropy target: integer class indices in [0, classes) or ``ignore_index``; or a
    floating [B, classes] of class probabilities, every row non-negative and summing to 1 within
    the core's probability_row_tolerance (the CLI's data check). ValueError naming the first bad
    one (torch would raise an IndexError, or assert on a GPU; or train on rows that are no
    distribution). ``output_shape``: the output's shape, for messages."""
    if target.is_floating_point():
        if target.dim() != 2 or target.shape[1] != classes:
            raise ValueError("cross_entropy with a floating target (class probabilities) needs logits [B,C] and a "
                             "target [B,C] of the same shape; got %starget %s; for class indices pass an int64 "
                             "target" % ("" if output_shape is None else "output %s and " % list(output_shape),
                                         list(target.shape)))
        tolerance = _core.probability_row_tolerance(str(target.dtype).replace("torch.", ""))
        rows = target.detach().double()
        negative = rows.lt(0).any(1)
        sums = rows.sum(1)
        bad = negative | ~(sums - 1).abs().le(tolerance)  # a NaN sum is bad too
        if bool(bad.any()):
            row = int(bad.nonzero()[0, 0])
            rule = "; class probabilities are non-negative and each row sums to 1 (e.g. a softmax, or one-hot rows)"
            if bool(negative[row]):
                column = int(rows[row].lt(0).nonzero()[0, 0])
                raise ValueError("target row %d holds %.6g for class %d%s"
                                 % (row, float(rows[row, column]), column, rule))
            raise ValueError("target row %d sums to %.6g, not 1 (tolerance %.6g)%s"
                             % (row, float(sums[row]), tolerance, rule))
        return
    if target.is_complex() or target.dtype == torch.bool:
        raise ValueError("cross_entropy needs a target of integer class indices or floating class probabilities, "
                         "not %s" % str(target.dtype).replace("torch.", ""))
    bad = target.ne(ignore_index) & (target.lt(0) | target.ge(classes))
    if bool(bad.any()):
        where = bad.reshape(-1).nonzero()[0].item()
        raise ValueError("the target holds class %d (at flat position %d of the microbatch), outside the output's "
                         "%d classes [0, %d] and not ignore_index %d"
                         % (target.reshape(-1)[where].item(), where, classes, classes - 1, ignore_index))


def pad_sequences(sequences, targets=None, ignore_index=-100, next_token=False):
    """Ragged data as accumplan holds it (the layout `accumplan run --data` reads from
    ``torch.save([sequences, targets_or_None], f)``): returns ``(inputs, target, lengths)`` with
    inputs int64 [n, T] padded with 0, target [n, T] padded with ``ignore_index`` (per-token
    ``targets``, in their own dtype — int64 class indices, or float values for mse — which every
    target must share; or, with ``next_token=True`` and no targets, the inputs shifted left by one,
    int64, the last position ignored; else None) and lengths int64 [n]."""
    ignore_index = int_arg(ignore_index, "ignore_index", INT32_MIN, INT32_MAX)
    if not isinstance(next_token, bool):
        raise TypeError("next_token must be True or False, not %s (%s)" % (type(next_token).__name__, _shown(next_token)))
    sequences = _vectors(sequences, "sequences", integer=True)
    n = len(sequences)
    if n == 0:
        raise ValueError("sequences is empty: no sequences to pad")
    lengths = torch.tensor([int(s.numel()) for s in sequences], dtype=torch.long)
    if int(lengths.min()) < 1:
        raise ValueError("sequences[%d] is empty; every sequence needs at least one token" % int(lengths.argmin()))
    longest = int(lengths.max())
    inputs = torch.zeros(n, longest, dtype=torch.long)
    for i, s in enumerate(sequences):
        inputs[i, :s.numel()] = s
    target = None
    if targets is not None:
        targets = _vectors(targets, "targets", integer=False)
        if len(targets) != n:
            raise ValueError("%d sequences but %d targets" % (n, len(targets)))
        dtype = targets[0].dtype
        for i, t in enumerate(targets):
            if t.dtype != dtype:
                raise ValueError("target %d is %s but target 0 is %s; give every target the same dtype (class indices "
                                 "as int64, values for mse as float)" % (i, t.dtype, dtype))
        if not dtype.is_floating_point and dtype != torch.bool:
            info = torch.iinfo(dtype)
            if not info.min <= ignore_index <= info.max:
                raise ValueError("the targets are %s, which cannot hold the padding ignore_index %d; convert them to "
                                 "int64 or pass an ignore_index in %d..%d" % (dtype, ignore_index, info.min, info.max))
        target = torch.full((n, longest), ignore_index, dtype=dtype)
        for i, t in enumerate(targets):
            if t.numel() != int(lengths[i]):
                raise ValueError("target %d has %d entries but sequence %d has %d tokens"
                                 % (i, t.numel(), i, int(lengths[i])))
            target[i, :t.numel()] = t
    elif next_token:
        target = torch.full((n, longest), ignore_index, dtype=torch.long)
        target[:, :-1] = inputs[:, 1:]
        positions = torch.arange(longest).unsqueeze(0)
        target[positions >= (lengths.unsqueeze(1) - 1)] = ignore_index
    return inputs, target, lengths


def _vectors(tensors, name, integer):
    """``tensors`` (a list or tuple) as a list of 1-D tensors: of integer dtype (token ids) when
    ``integer``, else of a real dtype (class indices or values; not bool or complex). TypeError
    naming ``name[i]``."""
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError("%s must be a list of 1-D tensors, not %s (%s)" % (name, type(tensors).__name__, _shown(tensors)))
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor) or t.dim() != 1:
            raise TypeError("%s[%d] must be a 1-D tensor, not %s" % (
                name, i, "a tensor of shape %s" % list(t.shape) if isinstance(t, torch.Tensor) else
                "%s (%s)" % (type(t).__name__, _shown(t))))
        if t.is_complex() or t.dtype == torch.bool or (integer and t.is_floating_point()):
            raise TypeError("%s[%d] is a %s tensor; %s" % (name, i, str(t.dtype).replace("torch.", ""),
                            "token ids are integers" if integer else "targets are integers or floats"))
    return list(tensors)


def valid_token_counts(lengths, target=None, ignore_index=-100):
    """Each sequence's valid tokens, a list of ints in data order (what ``token_windows`` takes),
    the rule of the C++ executor (valid_tokens_per_sample): with an integer per-token target
    [n, T] (``pad_sequences``), the positions whose target is not ``ignore_index`` (next-token
    targets give length - 1; padding is ``ignore_index``); with ``target=None``, a float target
    (mse values) or one target per sequence, the lengths themselves."""
    lengths = lengths_arg(lengths, "lengths", minimum=0)
    ignore_index = int_arg(ignore_index, "ignore_index", INT32_MIN, INT32_MAX)
    if target is None:
        return lengths
    if not isinstance(target, torch.Tensor):
        raise ValueError("the target must be a tensor (the padded [n, T] target pad_sequences returns) or None, got %s"
                         % type(target).__name__)
    if target.dim() < 1 or target.shape[0] != len(lengths):
        raise ValueError("the target has %s sequences (dim 0) but lengths has %d entries"
                         % (target.shape[0] if target.dim() else "no", len(lengths)))
    if target.dim() < 2 or target.is_floating_point():
        return lengths
    return [int(v) for v in target.ne(ignore_index).reshape(target.shape[0], -1).sum(1).tolist()]


def padding_mask(lengths, padded_length):
    """bool [n, padded_length], True at padding (nn.TransformerEncoder's src_key_padding_mask)."""
    lengths = lengths_arg(lengths, "lengths", minimum=0)
    padded_length = int_arg(padded_length, "padded_length", max(lengths, default=0), INT32_MAX)
    return torch.arange(padded_length).unsqueeze(0) >= torch.tensor(lengths, dtype=torch.long).reshape(-1, 1)


def _gather(inputs, target, indices, lengths):
    """A packed microbatch: the samples at ``indices``, every tensor with a sequence dimension
    (dim >= 2) cut to the longest of them (the C++ Batch::gather)."""
    longest = max(lengths[i] for i in indices)

    def pick(t):
        idx = torch.tensor(indices, dtype=torch.long, device=t.device)
        return (t[:, :longest] if t.dim() >= 2 else t).index_select(0, idx)

    return _map_inputs(inputs, pick), (None if target is None else pick(target)), longest


def _slice(inputs, target, start, n):
    return _map_inputs(inputs, lambda t: t[start:start + n]), (None if target is None else target[start:start + n])


def _all_reduce_ints(values, group, device):
    t = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return [int(v) for v in t.tolist()]


def _raise_if_a_rank_failed(slots, local_error, rank, during):
    """After the counts collective: ``slots[r]`` is -1 when rank r could not check its share (the
    C++ executor's throw_if_a_rank_failed). Every rank raises, so none waits in a collective its
    peer will never join: the failing rank its own error (a ValueError names the rank), every other
    rank a ValueError naming the failing rank."""
    failed = [r for r, v in enumerate(slots) if v < 0]
    if not failed:
        return
    if local_error is not None:
        if isinstance(local_error, ValueError):
            try:
                named = type(local_error)("rank %d: %s" % (rank, local_error))
            except Exception:  # noqa: BLE001 - a subclass with another constructor
                named = ValueError("rank %d: %s" % (rank, local_error))
            raise named from local_error
        raise local_error
    raise ValueError("rank%s %s failed %s (its own error says why); this rank stops with it"
                     % ("s" if len(failed) > 1 else "", ", ".join(map(str, failed)), during))


def _collective_device(group, params):
    try:
        backend = dist.get_backend(group)
    except Exception:  # noqa: BLE001 - older releases raise different types here
        backend = "gloo"
    if backend == "nccl":
        return params[0].device if params else torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _parameters(model):
    return [p for p in model.parameters() if p.requires_grad]


def _zero_grads(params, optimizer=None):
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    for p in params:
        p.grad = None


def all_reduce_gradients(params, group=None, extra=None):
    """ONE gradient exchange (flat buckets of at most 25 MiB, summed) over the process group.
    Parameters without a gradient send zeros, so every rank sends the same list. ``extra`` (a
    float) rides along in the last bucket; the summed value is returned."""
    device = _collective_device(group, params)
    grads = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    tail = torch.tensor([0.0 if extra is None else float(extra)], dtype=torch.float64)
    by_dtype = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    buckets = []
    for dtype, gs in by_dtype.items():
        bucket, size = [], 0
        for g in gs:
            nbytes = g.numel() * g.element_size()
            if bucket and size + nbytes > _BUCKET_BYTES:
                buckets.append(bucket)
                bucket, size = [], 0
            bucket.append(g)
            size += nbytes
        if bucket:
            buckets.append(bucket)
    for i, bucket in enumerate(buckets):
        flat = torch.cat([g.reshape(-1).to(device) for g in bucket])
        last = i == len(buckets) - 1
        if last:
            flat = torch.cat([flat, tail.to(device=device, dtype=flat.dtype)])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        if last:
            tail = flat[-1:].to(torch.float64).cpu()
            flat = flat[:-1]
        offset = 0
        for g in bucket:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
    if not buckets and extra is not None:
        tail = tail.to(device)
        dist.all_reduce(tail, op=dist.ReduceOp.SUM, group=group)
    return float(tail.item())


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
    inputs = _as_tuple(inputs)
    loss_kind = loss if loss is not None else plan.loss
    ii = plan.ignore_index if ignore_index is None else int_arg(ignore_index, "ignore_index", INT32_MIN, INT32_MAX)
    world = _world(group)
    # This rank's share is checked before the collective; under torch.distributed a bad share is
    # reported in the collective (a slot of -1) and every rank raises after it, so none hangs.
    n, sizes, units, local_error = 0, [], 0, None
    try:
        n = _samples(inputs, target)
        sizes = plan.window_sizes(n) if n > 0 else []
        norm, labels = units_rule(normalization or plan.normalization, loss_kind, None, inputs, target)
        shift = causal_shift(model, shift_labels) if loss_kind == "model" and norm == "tokens" else False
        units = count_units(labels, n, norm, ii, shift) if n > 0 else 0
    except Exception as e:  # noqa: BLE001 - re-raised below, on every rank
        if world == 1:
            raise
        local_error = e
    rank_samples = [n]
    if world > 1:
        rank = dist.get_rank(group)
        counts = [0] * (1 + world)  # [units, samples of rank 0 .. W-1 (-1: that rank failed)]
        if local_error is None:
            counts[0], counts[1 + rank] = units, n
        else:
            counts[1 + rank] = -1
        model_params = _parameters(model.module if _is_ddp(model) else model) if model is not None else []
        counts = _all_reduce_ints(counts, group, _collective_device(group, model_params))
        units, rank_samples = counts[0], counts[1:]
        _raise_if_a_rank_failed(rank_samples, local_error, rank, "while checking its share of the window")
    _refuse_empty(sum(rank_samples), world)
    if units == 0:
        return
    ddp = model is not None and _is_ddp(model)
    if ddp and min(rank_samples) == 0:
        raise ValueError("rank %d has no samples in the window, so it cannot join DDP's gradient all-reduce; "
                         "use plan.train_window, which exchanges gradients itself" % rank_samples.index(0))
    scale = (world if ddp else 1) / units
    start = 0
    for i, m in enumerate(sizes):
        ctx = model.no_sync() if ddp and i < len(sizes) - 1 else contextlib.nullcontext()
        with ctx:
            yield _slice(inputs, target, start, m), scale
        start += m


# --- the high-level way: one call per window ---------------------------------------------------

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
        self.peak_bytes = None      # the window's memory peak (measure_memory): CUDA's caching allocator
        #                             (allocated or reserved, the larger), or the CPU counting allocator's
        self.predicted_peak_bytes = None  # the plan's predicted peak of a full window ($.memory)

    def __repr__(self):
        return "WindowStats(%s)" % ", ".join("%s=%r" % kv for kv in vars(self).items())


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
    with torch.no_grad():
        pair = float(loss_fn(out[:2], target[:2]))
        each = float(loss_fn(out[:1], target[:1])) + float(loss_fn(out[1:2], target[1:2]))
    if not math.isclose(pair, each, rel_tol=1e-3, abs_tol=1e-6):
        raise ValueError("loss_fn must return the SUM over the microbatch's samples: for samples 0 and 1 it returned "
                         "%.6g, but %.6g for them one at a time (a mean?); pass reduction='sum', e.g. "
                         "functools.partial(F.cross_entropy, reduction='sum'), or use loss='cross_entropy'"
                         % (pair, each))


def _forward_sum(w, mb_inputs, mb_target, n, mask=None, check_loss_fn=False):
    """One microbatch's forward and the SUM of its per-unit losses (divide by the window's units)."""
    device = w.device
    moved = _map_inputs(mb_inputs, lambda t: t.to(device) if t.device != device else t)
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
        out = call()
        if w.loss_fn is not None:
            if check_loss_fn:
                _check_loss_fn_sums(w.loss_fn, out, target)
            return w.loss_fn(out, target)
        output, is_loss = model_output(out)
        if not is_loss and w.loss_kind != "model":
            return loss_sum(output, target, w.loss_kind, w.norm, w.ii, n)
        return loss_sum(output, model_labels(moved, target), "model", w.norm, w.ii, n,
                        units=w.units if pass_units else None, shift_labels=w.shift)


_AUTOCAST_NAMES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}


def _autocast_dtype(autocast, device):
    """The dtype ``train_window`` runs forwards under, or None: torch.bfloat16 or torch.float16, or
    its name as the plan's setup.amp writes it ("bf16", "fp16"; "none" for None). ValueError naming
    autocast for another dtype, or one torch cannot autocast to on ``device``."""
    if autocast is None or (isinstance(autocast, str) and autocast == "none"):
        return None
    dtype = _AUTOCAST_NAMES.get(autocast) if isinstance(autocast, str) else autocast
    if not isinstance(dtype, torch.dtype) or dtype not in (torch.bfloat16, torch.float16):
        kind = TypeError if not isinstance(autocast, (str, torch.dtype)) else ValueError
        raise kind("autocast must be torch.bfloat16, torch.float16, 'bf16', 'fp16', 'none' or None, not %s"
                   % _shown(autocast))
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
        raise ValueError("autocast %s is not supported on %s by this torch: %s"
                         % (_shown(autocast), device.type, (why.strip().splitlines() or [""])[0]))
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


def _warn_batch_dependent(model):
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


class _Window:
    """What every step of one window shares: the plan, the model and where it runs, the data of
    this rank, the loss settings and the process group. ``train_window`` fills it once."""

    def __init__(self, plan, model, inputs, target, lengths, loss_kind, loss_fn, ii, autocast, scaler, group):
        self.plan, self.model, self.inputs, self.target, self.lengths = plan, model, inputs, target, lengths
        self.loss_kind, self.loss_fn, self.ii, self.autocast, self.scaler = loss_kind, loss_fn, ii, autocast, scaler
        self.group = group
        self.world = _world(group)
        self.distributed = self.world > 1
        self.inner = model.module if _is_ddp(model) else model
        self.params = _parameters(self.inner)
        if not self.params:
            raise ValueError("the model has no trainable parameters")
        self.device = self.params[0].device
        self.cdev = _collective_device(group, self.params) if self.distributed else None
        self.packed = plan is not None and plan.tokens is not None  # None: accumplan.plan's measured windows
        self.ddp_ctx = model.no_sync if _is_ddp(model) else contextlib.nullcontext
        self.norm, self.units, self.longest = None, 0, 0
        self.shift, self.num_items = False, False  # loss="model" per token: set_units_rule
        self.shift_arg = None  # train_window's shift_labels

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


def _check_share(w, normalization):
    """This rank's share: its samples, lengths (packed plans) and units. Returns n; sets w.norm,
    w.units, w.longest and w.lengths. Raises ValueError naming what is wrong."""
    n = _samples(w.inputs, w.target)
    labels = w.set_units_rule(normalization or w.plan.normalization)
    if w.packed:
        if w.lengths is None:
            raise ValueError("this plan packs ragged data by tokens (plan.tokens): pass lengths=, each sample's "
                             "length (accumplan.pad_sequences returns them)")
        lengths = lengths_arg(w.lengths, "lengths", minimum=1)  # every sequence needs at least one token
        if len(lengths) != n:
            raise ValueError("lengths has %d entries for a window of %d samples" % (len(lengths), n))
        w.lengths = lengths
        w.longest = max(lengths) if lengths else 0
        for i, t in enumerate(_tensors(w.inputs) + ([w.target] if w.target is not None else [])):
            if t.dim() >= 2 and w.longest > t.shape[1]:
                raise ValueError("lengths says sequence %d has %d tokens but tensor %d of the window holds %d "
                                 "positions (dim 1); pass the lengths of these padded sequences"
                                 % (lengths.index(w.longest), w.longest, i, t.shape[1]))
    w.units = count_units(labels, n, w.norm, w.ii, w.shift) if n > 0 else 0
    return n


def _agree_counts(w, st, n, local_error):
    """The counts every rank agrees on before the first backward, in one all-reduce: [units,
    samples, samples of rank 0 .. W-1 (-1: that rank failed), longest of rank 0 .. W-1]. Returns
    every rank's samples; sets st.samples, w.units and w.longest to the global figures."""
    if not w.distributed:
        st.samples = n
        return [n]
    world, rank = w.world, w.rank()
    counts = [0] * (2 + world * (2 if w.packed else 1))
    if local_error is None:
        counts[0], counts[1], counts[2 + rank] = w.units, n, n
        if w.packed:
            counts[2 + world + rank] = w.longest
    else:
        counts[2 + rank] = -1
    counts = _all_reduce_ints(counts, w.group, w.cdev)
    w.units, st.samples, rank_samples = counts[0], counts[1], counts[2:2 + world]
    _raise_if_a_rank_failed(rank_samples, local_error, rank, "while checking its share of the window")
    if w.packed:
        w.longest = max(counts[2 + world:])
    return rank_samples


def _check_counts(w, st, rank_samples):
    """Every rank sees every rank's count, so every rank raises the same error. A plan with
    target_tokens windows by valid tokens: a window (and a rank's share) holds any number of samples."""
    plan = w.plan
    if not plan.windows_by_tokens:
        for r, m in enumerate(rank_samples):
            if m > plan.per_rank_batch and w.distributed:
                raise ValueError("rank %d was handed %d samples of a global window of %d, more than the plan's "
                                 "per-rank batch of %d; shard each global window of at most target_batch %d samples "
                                 "over the %d ranks"
                                 % (r, m, st.samples, plan.per_rank_batch, plan.target_batch, w.world))
            if m > plan.per_rank_batch:
                raise ValueError("a window holds at most the plan's per-rank batch of %d samples; got %d"
                                 % (plan.per_rank_batch, m))
    if w.packed and w.longest > plan.tokens["max_seq_len"]:
        plan.pack([w.longest])  # raises PlanError naming the sequence and the fix


def _cut(w, n, rank_samples):
    """This rank's microbatches under the plan as it is now: (sizes, groups of sample indices for
    packed plans, rounds every rank runs — the most microbatches of any rank)."""
    plan = w.plan
    if w.packed:
        groups = plan.pack(w.lengths) if n > 0 else []
        sizes = [len(g) for g in groups]
        rounds = len(sizes)
        if w.distributed:
            per_rank = [0] * w.world
            per_rank[w.rank()] = rounds
            rounds = max(_all_reduce_ints(per_rank, w.group, w.cdev))
        return sizes, groups, rounds
    sizes = plan.window_sizes(n) if n > 0 else []
    rounds = max(len(plan.window_sizes(m)) if m > 0 else 0 for m in rank_samples) if w.distributed else len(sizes)
    return sizes, None, rounds


def _run_microbatch(w, i, m, groups, start, oom_recovery):
    """Microbatch i (m samples from `start`, or the packed group i): forward, loss sum, backward of
    sum / N. Returns (loss sum, status, error): status 0, the failing size (packed: padded tokens)
    on out-of-memory, or -1 with the error on another failure under torch.distributed."""
    # Before the try: an out-of-memory while gathering must still report this size.
    padded = m * max(w.lengths[j] for j in groups[i]) if w.packed else 0
    try:
        mask = None
        if w.packed:
            mb_inputs, mb_target, mb_longest = _gather(w.inputs, w.target, groups[i], w.lengths)
            if w.plan.padding_mask:
                mask = padding_mask([w.lengths[j] for j in groups[i]], mb_longest)
        else:
            mb_inputs, mb_target = _slice(w.inputs, w.target, start, m)
        with w.ddp_ctx():
            s = _forward_sum(w, mb_inputs, mb_target, m, mask, check_loss_fn=(i == 0))
            total = float(s.detach())
            obj = s / w.units
            (w.scaler.scale(obj) if w.scaler is not None else obj).backward()
        del s, obj
        return total, 0, None
    except Exception as e:  # noqa: BLE001 - only out-of-memory is recovered
        if not (oom_recovery and is_oom(e)):
            if not w.distributed:
                raise
            return 0.0, -1, e
        return 0.0, (padded if w.packed else m), None


def _agree_status(w, status, error):
    """The agreement point of a round: every rank's status in one all-reduce. Raises when any rank
    failed otherwise than for memory; returns the smallest failing size anywhere (0: none)."""
    if not w.distributed:
        return status
    flags = [0] * w.world
    flags[w.rank()] = status
    flags = _all_reduce_ints(flags, w.group, w.cdev)
    if any(f < 0 for f in flags):
        if status < 0:
            raise error
        raise RuntimeError("rank %d failed in a microbatch (its own error says why); this rank stops with it"
                           % flags.index(min(flags)))
    failed = [f for f in flags if f > 0]
    return min(failed) if failed else 0


def _run_rounds(w, sizes, groups, rounds, oom_recovery, before_microbatch=None):
    """One attempt at the window. Returns (loss sum, failing size or 0). ``before_microbatch(i)``
    is called before microbatch i starts (accumplan.plan reads the memory peaks there)."""
    total, start = 0.0, 0
    for i in range(rounds):
        status, error = 0, None
        if before_microbatch is not None and i < len(sizes):
            before_microbatch(i)
        if i < len(sizes):
            part, status, error = _run_microbatch(w, i, sizes[i], groups, start, oom_recovery)
            total += part
            start += sizes[i]
        failing = _agree_status(w, status, error)
        if failing:
            return total, failing
    return total, 0


def _step(w, optimizer, st, max_grad_norm, scheduler):
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


def _start_measuring(w, optimizer, measure_memory):
    """The meter that reads this window's peak (None: not measured). None measures on CUDA (the
    caching allocator's peak statistics, reset here) and not on the CPU, where it installs the
    counting allocator for the window. Call after the gradients were dropped: what exists then
    (weights, buffers, optimizer state) is added to the figures, not counted."""
    if measure_memory is None:
        measure_memory = w.device.type == "cuda"
    elif not isinstance(measure_memory, bool):
        raise TypeError("measure_memory must be True, False or None, not %s" % _shown(measure_memory))
    if not measure_memory:
        return None
    if w.device.type not in ("cpu", "cuda"):
        raise ValueError("measure_memory reads cpu or cuda memory; the model is on %s" % w.device)
    meter = meter_for(w.device, held_bytes(w.inner, optimizer))
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
        st.peak_bytes = max(meter.peak(), meter.reserved_peak() or 0)
    finally:
        if isinstance(meter, CpuMeter):
            meter.close()


def train_window(plan, model, optimizer, inputs, target=None, *, loss=None, loss_fn=None, scaler=None,
                 max_grad_norm=None, scheduler=None, autocast=None, normalization=None, ignore_index=None,
                 oom_recovery=True, group=None, on_oom=None, lengths=None, shift_labels=None, measure_memory=None):
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
    measure_memory: the window's memory peak in ``WindowStats.peak_bytes`` (beside the plan's
    ``predicted_peak_bytes``): None measures on CUDA only (resets the device's peak statistics), True
    on the CPU too (the counting allocator is installed for the window), False never.
    Under torch.distributed (world size > 1) every rank must call it for every window; the units
    are counted globally, failures are agreed on after every microbatch round, and the gradients
    are exchanged once, after the last microbatch (a DDP module runs every microbatch under
    ``no_sync()``: a DDP backward cannot be abandoned when a peer runs out of memory).
    Ragged data under a packed plan (``plan.tokens``): pass ``lengths=`` (each sample's length;
    ``pad_sequences`` returns them) with inputs and target padded along dim 1; the window is packed
    longest first under the token budget (``plan.pack``), each microbatch cut to its own longest,
    with ``padding_mask(...)`` as one more forward argument when the plan's setup asks for it. An
    out-of-memory lowers the budget below the failing microbatch's padded tokens and replays. A
    packed plan with ``tokens.target_tokens`` (schema 1.4) windows by valid tokens (``token_windows``
    over ``valid_token_counts``): its window holds any number of samples, a rank's share too (under
    torch.distributed a rank may hold none). Under torch.distributed a rank whose share is bad
    (``lengths=`` missing or of the wrong count, mismatched tensors) reports it in the counts
    all-reduce and every rank raises a ValueError naming it, instead of its peers hanging."""
    t0 = time.perf_counter()
    inputs = _as_tuple(inputs)
    world = _world(group)
    if world != plan.world_size and world > 1:
        raise ValueError("the plan is for world size %d but the process group has %d ranks; re-plan with "
                         "--world-size %d" % (plan.world_size, world, world))
    loss_kind = loss if loss is not None else plan.loss
    if loss_fn is None and loss_kind not in LOSSES:
        raise ValueError("loss %r is unknown; use cross_entropy, mse, model, or pass loss_fn" % (loss_kind,))
    if loss_fn is None and loss_kind == "model" and target is not None and isinstance(inputs, dict):
        raise ValueError("loss='model' with dict inputs takes its labels from the dict: pass target=None")
    ii = plan.ignore_index if ignore_index is None else int_arg(ignore_index, "ignore_index", INT32_MIN, INT32_MAX)
    if max_grad_norm is not None:
        max_grad_norm = real_arg(max_grad_norm, "max_grad_norm", 0, 1e12, lo_open=True)  # setup.max_grad_norm's range
    w = _Window(plan, model, inputs, target, lengths, loss_kind, loss_fn, ii, None, scaler, group)
    w.autocast = _autocast_dtype(autocast, w.device)
    w.shift_arg = causal_shift(model, shift_labels) if shift_labels is not None else None
    _warn_batch_dependent(w.inner)

    # This rank's share, checked before the first collective. Under torch.distributed a rank whose
    # share is bad must not raise here (its peers would wait in the counts all-reduce forever): it
    # reports -1 in its slot and every rank raises after it.
    n, local_error = 0, None
    try:
        n = _check_share(w, normalization)
    except Exception as e:  # noqa: BLE001 - re-raised after the collective, on every rank
        if not w.distributed:
            raise
        local_error = e
    st = WindowStats()
    st.local_samples = n
    rank_samples = _agree_counts(w, st, n, local_error)
    _check_counts(w, st, rank_samples)
    _refuse_empty(st.samples, w.world)
    st.units, st.normalization = w.units, w.norm
    st.predicted_peak_bytes = plan.memory.get("predicted_peak_bytes")
    _zero_grads(w.params, optimizer)
    if w.units == 0:
        st.skipped, st.skip_reason = True, "the window has no valid tokens (every target is ignore_index)"
        st.seconds = time.perf_counter() - t0
        return st
    meter = _start_measuring(w, optimizer, measure_memory)
    try:
        _train(w, st, plan, optimizer, n, rank_samples, oom_recovery, on_oom, max_grad_norm, scheduler)
    finally:
        _stop_measuring(meter, st)
    st.seconds = time.perf_counter() - t0
    return st


def _train(w, st, plan, optimizer, n, rank_samples, oom_recovery, on_oom, max_grad_norm, scheduler):
    """The window after its counts are agreed: attempts until one runs without out-of-memory
    (re-planned below each failure), the gradient exchange, the step."""
    while True:
        _zero_grads(w.params, optimizer)
        sizes, groups, rounds = _cut(w, n, rank_samples)
        total, failing = _run_rounds(w, sizes, groups, rounds, oom_recovery)
        if not failing:
            break
        # Out of the except block: the failed microbatch's tensors are released already.
        _zero_grads(w.params, optimizer)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if w.packed:
            note = plan.repack_below(failing, w.longest)  # raises OutOfMemoryAtOne below the longest sequence
        else:
            note = plan.replan_below(failing)  # raises OutOfMemoryAtOne at size 1
        st.oom_recoveries += 1
        if on_oom is not None:
            on_oom(note)

    st.microbatch_sizes = sizes
    if w.distributed:
        total = all_reduce_gradients(w.params, w.group, extra=total)
    st.loss = total / w.units
    _step(w, optimizer, st, max_grad_norm, scheduler)
    _zero_grads(w.params, optimizer)


__all__ = ["is_oom", "resolve_normalization", "count_units", "model_output", "loss_sum", "split", "pad_sequences",
           "model_labels", "causal_shift", "takes_num_items",
           "padding_mask", "valid_token_counts",
           "train_window", "all_reduce_gradients", "WindowStats", "OutOfMemoryAtOne", "batch_dependent_layers"]
