"""accumplan.batches — a window's data: its tensors, its samples, its microbatches, ragged sequences.

Public: ``pad_sequences``, ``valid_token_counts``, ``padding_mask`` (re-exported by accumplan).
Internal to the package (no underscore so that train, window and measure can share them; not
part of the API): ``as_inputs``, ``input_tensors``, ``map_inputs``, ``count_samples``,
``ragged_data``, ``gather_packed``, ``slice_samples``.
"""

from collections.abc import Mapping

import torch

from . import _core
from ._args import INT32_MAX, INT32_MIN, choice_arg, flag_arg, int_arg, lengths_arg, shown_value, tensor_arg


def as_inputs(inputs):
    """A window's inputs as the model takes them: a tuple of positional tensors, or a dict passed as
    ``model(**inputs)`` (a Hugging Face batch: input_ids, attention_mask, labels). A dict's values
    that are not tensors (flags) go to every microbatch unchanged. TypeError/ValueError naming
    ``inputs`` (or ``inputs[i]``) for anything else, before any window runs."""
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    elif isinstance(inputs, Mapping):  # a dict, or a tokenizer's BatchEncoding (a UserDict)
        inputs = dict(inputs)
        for key, value in inputs.items():
            if isinstance(value, torch.Tensor):
                tensor_arg(value, "inputs[%r]" % (key,))
        if not input_tensors(inputs):
            raise ValueError("inputs holds no tensor (a dict of %d non-tensor values); pass the batch's tensors"
                             % len(inputs))
        return inputs
    elif isinstance(inputs, (list, tuple)):
        inputs = tuple(inputs)
    else:
        raise TypeError("inputs must be a tensor, a tuple of tensors or a dict of them, not %s (%s)"
                        % (type(inputs).__name__, shown_value(inputs)))
    if not inputs:
        raise ValueError("inputs is empty; pass the model's input tensors, e.g. (x,)")
    for i, t in enumerate(inputs):
        tensor_arg(t, "inputs[%d]" % i)
    return inputs


def target_arg(target):
    """The target: None, or a tensor whose dim 0 indexes samples (TypeError/ValueError naming target)."""
    return None if target is None else tensor_arg(target, "target")


def input_tensors(inputs):
    """The sample-indexed tensors of a window's inputs (a tuple, or a dict's tensor values)."""
    if isinstance(inputs, dict):
        return [v for v in inputs.values() if isinstance(v, torch.Tensor)]
    return list(inputs)


def _named_tensors(inputs, target):
    named = [("inputs[%r]" % (k,), v) for k, v in inputs.items() if isinstance(v, torch.Tensor)] \
        if isinstance(inputs, dict) else [("inputs[%d]" % i, t) for i, t in enumerate(inputs)]
    return named + ([("target", target)] if target is not None else [])


def map_inputs(inputs, fn):
    """The inputs with ``fn`` applied to every tensor (a dict keeps its keys and other values)."""
    if isinstance(inputs, dict):
        return {k: fn(v) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    return tuple(fn(t) for t in inputs)


def count_samples(inputs, target):
    """The window's samples: dim 0 of every tensor, which must agree (ValueError naming the tensor)."""
    named = _named_tensors(inputs, target)
    if not named:
        raise ValueError("inputs holds no tensors")
    first_name, first = named[0]
    for name, t in named:
        if t.dim() < 1:
            raise ValueError("%s is a 0-dim tensor; dim 0 must index samples" % name)
        if t.shape[0] != first.shape[0]:
            raise ValueError("%s has %d samples (dim 0) but %s has %d" % (name, t.shape[0], first_name, first.shape[0]))
    return first.shape[0]


def pad_sequences(sequences, targets=None, ignore_index=-100, next_token=False):
    """Ragged data as accumplan holds it (the layout `accumplan run --data` reads from
    ``torch.save([sequences, targets_or_None], f)``): returns ``(inputs, target, lengths)`` with
    inputs int64 [n, T] padded with 0, target [n, T] padded with ``ignore_index`` (per-token
    ``targets``, in their own dtype — int64 class indices, or float values for mse — which every
    target must share; or, with ``next_token=True`` and no targets, the inputs shifted left by one,
    int64, the last position ignored; else None) and lengths int64 [n].
    ``sequences`` may instead be Hugging Face examples, dicts of 1-D tensors of one length each
    (input_ids, attention_mask, labels, ...): inputs is then a dict of [n, T] tensors ("labels"
    padded with ``ignore_index``, everything else with 0, so attention_mask is 0 at padding) and
    target is None (the labels are in the dict). This is the collate helper for ``plan.pack``'s
    microbatches: ``pad_sequences([examples[i] for i in group])``."""
    return padded(sequences, targets, ignore_index, next_token, ("sequences", "targets"))


def padded(sequences, targets, ignore_index, next_token, names):
    """pad_sequences, its messages naming the arguments as ``names`` (the caller's two)."""
    ignore_index = int_arg(ignore_index, "ignore_index", INT32_MIN, INT32_MAX)
    flag_arg(next_token, "next_token")
    if isinstance(sequences, (list, tuple)) and sequences and isinstance(sequences[0], Mapping):
        if targets is not None or next_token:
            raise ValueError("examples given as dicts carry their labels (\"labels\"): pass targets=None and "
                             "next_token=False")
        return _pad_examples(sequences, ignore_index, names[0])
    sequences = _vectors(sequences, names[0], integer=True)
    n = len(sequences)
    if n == 0:
        raise ValueError("%s is empty: no sequences to pad" % names[0])
    lengths = torch.tensor([int(s.numel()) for s in sequences], dtype=torch.long)
    if int(lengths.min()) < 1:
        raise ValueError("%s[%d] is empty; every sequence needs at least one token" % (names[0], int(lengths.argmin())))
    longest = int(lengths.max())
    _check_padded_bytes(n, longest, 16 if targets is not None or next_token else 8)
    inputs = torch.zeros(n, longest, dtype=torch.long)
    for i, s in enumerate(sequences):
        inputs[i, :s.numel()] = s
    target = None
    if targets is not None:
        targets = _vectors(targets, names[1], integer=False)
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


def _check_padded_bytes(n, longest, bytes_per_position):
    """Ragged data padded to n x longest held to the host-data limit before it is allocated."""
    try:
        _core.check_host_data(n * longest * bytes_per_position, "%d sequences padded to the longest, %d tokens," % (
            n, longest), "pass fewer sequences per window (plan.pack groups them by length) or cut the longest")
    except _core.InputError as e:
        raise ValueError(str(e)) from None


def _pad_examples(examples, ignore_index, name):
    """Hugging Face examples (dicts of 1-D tensors, one length per example) padded into one dict."""
    keys = list(examples[0].keys())
    lengths = []
    for i, ex in enumerate(examples):
        if not isinstance(ex, Mapping):
            raise TypeError("%s[%d] is %s but %s[0] is a dict; give every example as a dict"
                            % (name, i, type(ex).__name__, name))
        if list(ex.keys()) != keys:
            raise ValueError("%s[%d] has keys %s but %s[0] has %s; give every example the same keys"
                             % (name, i, list(ex.keys()), name, keys))
        n = None
        for k in keys:
            t = ex[k]
            if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.is_complex():
                raise TypeError("%s[%d][%r] must be a 1-D tensor (one entry per token), not %s"
                                % (name, i, k, "a tensor of shape %s" % list(t.shape) if isinstance(t, torch.Tensor)
                                   else "%s (%s)" % (type(t).__name__, shown_value(t))))
            tensor_arg(t, "%s[%d][%r]" % (name, i, k))
            if n is not None and t.numel() != n:
                raise ValueError("%s[%d][%r] has %d entries but %s[%d][%r] has %d; every tensor of an example has "
                                 "one entry per token" % (name, i, k, t.numel(), name, i, keys[0], n))
            n = t.numel()
        if not n:
            raise ValueError("%s[%d] is empty; every sequence needs at least one token%s"
                             % (name, i, "" if keys else " (input_ids, labels, ...)"))
        lengths.append(n)
    longest = max(lengths)
    _check_padded_bytes(len(examples), longest, sum(examples[0][k].element_size() for k in keys))
    inputs = {}
    for k in keys:
        t0 = examples[0][k]
        pad = ignore_index if k == "labels" else 0
        if not t0.is_floating_point() and t0.dtype != torch.bool:
            info = torch.iinfo(t0.dtype)
            if not info.min <= pad <= info.max:
                raise ValueError("%s[0][%r] is %s, which cannot hold the padding %d; convert it to int64"
                                 % (name, k, t0.dtype, pad))
        out = torch.full((len(examples), longest), pad, dtype=t0.dtype)
        for i, ex in enumerate(examples):
            out[i, :lengths[i]] = ex[k]
        inputs[k] = out
    return inputs, None, torch.tensor(lengths, dtype=torch.long)


def _is_ragged_list(inputs, target, packed):
    """Whether ``inputs`` is ragged data rather than a list of positional tensors: a list of dicts,
    or of 1-D tensors that differ in length, come with a list of targets, or go to a plan made for
    variable-length data (``packed``: one whose setup has seq_len)."""
    if not isinstance(inputs, list) or not inputs:
        return False
    if all(isinstance(x, Mapping) for x in inputs):
        return True
    if not all(isinstance(x, torch.Tensor) and x.dim() == 1 for x in inputs):
        return False
    return packed or isinstance(target, list) or len({x.numel() for x in inputs}) > 1


def is_next_token(target, loss):
    """Whether ragged data trains on next-token targets made from its inputs: no target, and the
    cross_entropy loss."""
    return target is None and loss == "cross_entropy"


def ragged_data(inputs, target, lengths, loss, ignore_index, packed=False):
    """A window's ragged data as (inputs padded along dim 1, target, lengths as a list), or None
    for fixed-shape data. Ragged data is a list of 1-D token tensors (targets: a list of per-token
    tensors, a tensor of one target per sequence, or None: next-token targets for cross_entropy, as
    ``accumplan run --data`` reads ``[sequences, None]``), a list of Hugging Face example dicts
    (``pad_sequences``), or a padded batch with ``lengths=``."""
    if lengths is not None:
        if _is_ragged_list(inputs, target, True):
            raise ValueError("lengths= goes with a padded batch; a list of sequences carries its own lengths: "
                             "drop lengths=")
        return as_inputs(inputs), target_arg(target), lengths_arg(lengths, "lengths", minimum=1)
    if not _is_ragged_list(inputs, target, packed):
        return None
    if isinstance(inputs[0], Mapping):
        if target is not None:
            raise ValueError("examples given as dicts carry their labels (\"labels\"): pass target=None")
        examples, _, lens = padded(inputs, None, ignore_index, False, ("inputs", "target"))
        return examples, None, lens.tolist()
    per_token = isinstance(target, (list, tuple))
    next_token = is_next_token(target, loss)
    tokens, tgt, lens = padded(inputs, target if per_token else None, ignore_index, next_token, ("inputs", "target"))
    if not per_token and target is not None:
        tgt = target_arg(target)
        if tgt.shape[0] != len(inputs):
            raise ValueError("target has %d entries (dim 0) for %d sequences; give one target per sequence or a "
                             "list of per-token targets" % (tgt.shape[0], len(inputs)))
    return (tokens,), tgt, lens.tolist()


def _vectors(tensors, name, integer):
    """``tensors`` (a list or tuple) as a list of 1-D tensors: of integer dtype (token ids) when
    ``integer``, else of a real dtype (class indices or values; not bool or complex). TypeError
    naming ``name[i]``."""
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError("%s must be a list of 1-D tensors, not %s (%s)" % (name, type(tensors).__name__, shown_value(tensors)))
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor) or t.dim() != 1:
            raise TypeError("%s[%d] must be a 1-D tensor, not %s" % (
                name, i, "a tensor of shape %s" % list(t.shape) if isinstance(t, torch.Tensor) else
                "%s (%s)" % (type(t).__name__, shown_value(t))))
        tensor_arg(t, "%s[%d]" % (name, i))
        if t.is_complex() or t.dtype == torch.bool or (integer and t.is_floating_point()):
            raise TypeError("%s[%d] is a %s tensor; %s" % (name, i, str(t.dtype).replace("torch.", ""),
                            "token ids are integers" if integer else "targets are integers or floats"))
    return list(tensors)


def valid_token_counts(lengths, target=None, ignore_index=-100, loss="cross_entropy"):
    """Each sequence's valid tokens, a list of ints in data order (what ``token_windows`` takes),
    the rule of the C++ executor (valid_tokens_per_sample) and of ``train_window``: with an integer
    per-token target [n, T] (``pad_sequences``), the positions whose target is not ``ignore_index``
    (next-token targets give length - 1; padding is ``ignore_index``); with ``target=None`` and
    ``loss="cross_entropy"``, the next-token targets ``train_window`` makes (length - 1); with a
    float target (mse values), one target per sequence, or ``target=None`` under another loss, the
    lengths themselves."""
    lengths = lengths_arg(lengths, "lengths", minimum=0)
    ignore_index = int_arg(ignore_index, "ignore_index", INT32_MIN, INT32_MAX)
    loss = choice_arg(loss, "loss", _core.LOSSES)
    if target is None:
        return [max(0, n - 1) for n in lengths] if is_next_token(target, loss) else lengths
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


def check_lengths(inputs, target, lengths, n):
    """Ragged data's lengths against its padded tensors: one per sample, each at least one token,
    none longer than the tensors' dim 1. Returns them as a list of ints; ValueError naming them."""
    lengths = lengths_arg(lengths, "lengths", minimum=1)  # every sequence needs at least one token
    if len(lengths) != n:
        raise ValueError("lengths has %d entries for a window of %d samples" % (len(lengths), n))
    longest = max(lengths) if lengths else 0
    for i, t in enumerate(input_tensors(inputs) + ([target] if target is not None else [])):
        if t.dim() >= 2 and longest > t.shape[1]:
            raise ValueError("lengths says sequence %d has %d tokens but tensor %d of the window holds %d "
                             "positions (dim 1); pass the lengths of these padded sequences"
                             % (lengths.index(longest), longest, i, t.shape[1]))
    return lengths


def gather_packed(inputs, target, indices, lengths):
    """A packed microbatch: the samples at ``indices``, every tensor with a sequence dimension
    (dim >= 2) cut to the longest of them (the C++ Batch::gather)."""
    longest = max(lengths[i] for i in indices)

    def pick(t):
        idx = torch.tensor(indices, dtype=torch.long, device=t.device)
        return (t[:, :longest] if t.dim() >= 2 else t).index_select(0, idx)

    return map_inputs(inputs, pick), (None if target is None else pick(target)), longest


def slice_samples(inputs, target, start, n):
    return map_inputs(inputs, lambda t: t[start:start + n]), (None if target is None else target[start:start + n])
