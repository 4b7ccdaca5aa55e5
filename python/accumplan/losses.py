"""accumplan.losses — what a microbatch contributes: the loss SUM over its units, and what N counts.

Public: ``resolve_normalization``, ``count_units``, ``model_output``, ``loss_sum``,
``model_labels``, ``causal_shift``, ``takes_num_items`` (re-exported by accumplan). Internal to
the package: ``LOSSES``, ``units_rule``, ``check_class_target`` (measure checks a probability
target with it before any window runs). The normalization rule and the probability-row tolerance
are the C++ core's (``_core.normalizes_by_tokens``, ``_core.probability_row_tolerance``).
"""

import inspect
from collections.abc import Mapping

import torch
import torch.nn.functional as F

from . import _core
from ._args import INT32_MAX, INT32_MIN, MAX_COUNT, choice_arg, int_arg, shown_value
from .distributed import is_ddp
from .errors import plan_error


LOSSES = _core.LOSSES  # setup.loss's names



def _at_least_float(t):
    """``t`` in at least float32: half and bfloat16 go up, float32 and float64 stay (a float64 model's
    loss keeps float64's precision)."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()

def resolve_normalization(name, loss, target):
    """'samples' or 'tokens'. 'auto' means tokens for cross-entropy over an integer target with
    more than one dimension ([B,T] targets of [B,T,C] logits), samples otherwise; a floating
    target of cross-entropy (class probabilities [B,C]) is normalized by samples. loss None (a
    loss_fn) follows cross-entropy's rule. The rule is the C++ core's (accumplan/setup_rules.h),
    the one `accumplan run` follows; ValueError names ``normalization``."""
    is_tensor = isinstance(target, torch.Tensor)
    try:
        tokens = _core.normalizes_by_tokens(str(name), "cross_entropy" if loss is None else str(loss),
                                            target.dim() if is_tensor else 0,
                                            is_tensor and target.is_floating_point())
    except _core.InputError as e:
        raise plan_error(e) from None
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
    its tokens are counted in: the target, or for a model's own loss (loss="model") with dict
    inputs their "labels". The rule is the core's (a model's own loss over integer labels [B,T]
    is per token, as cross-entropy's: its mean is over valid tokens)."""
    own_loss = loss_fn is None and loss == "model"
    labels = model_labels(inputs, target) if own_loss else target
    return resolve_normalization(normalization, None if loss_fn is not None else loss, labels), labels


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
            raise TypeError("shift_labels must be True, False or None (detect), not %s" % shown_value(shift_labels))
        return shift_labels
    if model is None:
        return False
    inner = model.module if is_ddp(model) else model
    return type(inner).__name__.endswith(_CAUSAL_LM_SUFFIXES)


def takes_num_items(model):
    """True when ``model``'s forward takes ``num_items_in_batch`` (Hugging Face's loss
    normalizer since transformers 4.46): its loss is then SUM / num_items_in_batch, and
    train_window passes the window's valid tokens instead of re-weighting a mean. Read from an
    explicit parameter, or the model's ``accepts_loss_kwargs`` flag (transformers' own test)."""
    inner = model.module if is_ddp(model) else model
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
    if isinstance(out, (tuple, list)):
        if not out:
            raise plan_error("the model returned an empty tuple")
        return model_output(out[0])
    if isinstance(out, torch.Tensor):
        return out, False
    # A dict, or an output object (a dataclass) with .loss or .logits, as a Hugging Face ModelOutput has.
    get = out.get if isinstance(out, dict) else (lambda key, default: getattr(out, key, default))
    for key, is_loss in (("loss", True), ("logits", False)):
        value = get(key, None)
        if value is not None and not isinstance(value, torch.Tensor):
            raise plan_error("the model returned %r: %s (%s), not a tensor" % (key, type(value).__name__, shown_value(value)))
        if value is not None:
            return value, is_loss
    if isinstance(out, dict):
        raise plan_error("the model returned a dict without 'loss' or 'logits' (keys: %s)" % ", ".join(map(str, out)))
    raise plan_error("the model returned %s; return a tensor, a tuple (output first), or a dict or an "
                     "object with 'loss' or 'logits'" % type(out).__name__)


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
            check_class_target(target, output.shape[-1] if output.dim() == 2 else -1, ignore_index, output.shape)
            return -(_at_least_float(target) * F.log_softmax(_at_least_float(output), dim=1)).sum()
        ok2 = output.dim() == 2 and target is not None and target.dim() == 1 and target.shape[0] == output.shape[0]
        ok3 = (output.dim() == 3 and target is not None and target.dim() == 2 and
               tuple(target.shape) == tuple(output.shape[:2]))
        if not (ok2 or ok3):
            raise ValueError("cross_entropy needs logits [B,C] with target [B], or [B,T,C] with [B,T]; got output %s "
                             "and target %s" % (list(output.shape), None if target is None else list(target.shape)))
        check_class_target(target, output.shape[-1], ignore_index)
        per = F.cross_entropy(_at_least_float(output.reshape(-1, output.shape[-1])), target.reshape(-1).long(),
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
        return _at_least_float(output.reshape(())) * float(units)
    if normalization == "tokens":
        raise ValueError("tokens normalization applies to cross_entropy and a model's own loss, not %r" % (loss,))
    if loss == "mse":
        if target is None or output.shape != target.shape:
            raise ValueError("mse needs output and target of the same shape; got %s and %s"
                             % (list(output.shape), None if target is None else list(target.shape)))
        return (_at_least_float(output) - _at_least_float(target)).pow(2).reshape(output.shape[0], -1).mean(1).sum()
    raise ValueError("loss %r is unknown; use cross_entropy, mse, model, or pass loss_fn" % (loss,))


def check_class_target(target, classes, ignore_index, output_shape=None):
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
