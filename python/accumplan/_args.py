"""accumplan._args — the checks of the public functions' integer arguments, one place for both
modules (plan.py needs no torch; tensors are recognised by what they have, not by importing torch).

What it is: every public function that takes a count, a size, an index or per-sequence lengths
turns it into Python ints here, or raises TypeError/ValueError naming the argument. Without it a
2**70 reached torch as an OverflowError, a float tensor of lengths was truncated silently and a
list of strings was parsed. What it is not: the plan's validation (the C++ reader does that).
"""

import math
import numbers
import os

try:
    from . import _core
except ImportError as e:  # pragma: no cover - a source tree without the compiled core
    raise ImportError("accumplan's compiled core (accumplan._core) is missing: install the package with "
                      "`python3 -m pip install --no-build-isolation .` from the repository root (docs/python.md); "
                      "python/ on PYTHONPATH has no core (%s)" % e) from None

# The planner's bounds, from the core: an index or ignore_index is an int32, a count of samples
# or of a microbatch's samples at most MAX_COUNT.
INT32_MIN, INT32_MAX = _core.INT32_MIN, _core.INT32_MAX
MAX_COUNT = _core.MAX_SAMPLES


def shown_value(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_tensor(value):
    return hasattr(value, "dim") and hasattr(value, "tolist") and hasattr(value, "is_floating_point")


def int_arg(value, name, lo, hi):
    """``value`` as an int in [lo, hi]: an int (not a bool), a NumPy integer or a 0-dim integer
    tensor. TypeError or ValueError naming ``name``."""
    if _is_tensor(value) and value.dim() == 0 and not value.is_floating_point() and not value.is_complex() \
            and str(value.dtype) != "torch.bool":
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError("%s must be an integer, not %s (%s)" % (name, type(value).__name__, shown_value(value)))
    value = int(value)
    if not lo <= value <= hi:
        raise ValueError("%s is %d, out of range [%d, %d]" % (name, value, lo, hi))
    return value


def lengths_arg(lengths, name="lengths", minimum=1):
    """Per-sequence lengths as a list of ints in [minimum, 2**31 - 1]: a 1-D integer tensor or an
    iterable of integers. TypeError or ValueError naming ``name`` or ``name[i]``."""
    if _is_tensor(lengths):
        if lengths.dim() != 1 or lengths.is_floating_point() or lengths.is_complex() or str(lengths.dtype) == "torch.bool":
            raise TypeError("%s must be a 1-D integer tensor or a list of integers, not a %s tensor of shape %s"
                            % (name, str(lengths.dtype).replace("torch.", ""), list(lengths.shape)))
        values = lengths.tolist()
    elif isinstance(lengths, (str, bytes, dict)) or not hasattr(lengths, "__iter__"):
        raise TypeError("%s must be a 1-D integer tensor or a list of integers, not %s (%s)"
                        % (name, type(lengths).__name__, shown_value(lengths)))
    else:
        values = list(lengths)
    return [int_arg(v, "%s[%d]" % (name, i), minimum, INT32_MAX) for i, v in enumerate(values)]


def real_arg(value, name, lo, hi, lo_open=False):
    """``value`` as a finite float in [lo, hi] ((lo, hi] with ``lo_open``): a real number (not a
    bool) or a 0-dim real tensor. TypeError or ValueError naming ``name``."""
    if _is_tensor(value) and value.dim() == 0 and not value.is_complex() and str(value.dtype) != "torch.bool":
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError("%s must be a number, not %s (%s)" % (name, type(value).__name__, shown_value(value)))
    try:
        value = float(value)
    except OverflowError:
        value = math.inf
    if not (math.isfinite(value) and (lo < value if lo_open else lo <= value) and value <= hi):
        raise ValueError("%s is %s, out of range %s%s, %s]" % (name, shown_value(value), "(" if lo_open else "[",
                                                               bound_text(lo), bound_text(hi)))
    return value


def documented_arg(value, name, key, lo_open=None):
    """``value`` as real_arg takes it, in the range the plan readers document for ``key``
    (_core.documented_range: "max_grad_norm", "seconds"); ``lo_open`` overrides its lower end."""
    lo, hi, documented_lo_open, _ = _core.documented_range(key)
    return real_arg(value, name, lo, hi, lo_open=documented_lo_open if lo_open is None else lo_open)


def choice_arg(value, name, choices):
    """``value`` if it is one of the strings ``choices``; else TypeError or ValueError naming ``name``."""
    if not isinstance(value, str):
        raise TypeError("%s must be a string, one of %s; not %s (%s)"
                        % (name, ", ".join(choices), type(value).__name__, shown_value(value)))
    if value not in choices:
        raise ValueError("%s is %s; use one of %s" % (name, shown_value(value), ", ".join(choices)))
    return value


def path_arg(value, name):
    """``value`` as a str or bytes path: a str, bytes or os.PathLike whose ``__fspath__`` gives one
    (an int would be a file descriptor to ``open``). TypeError naming ``name``; ValueError for an
    empty path or one holding a NUL byte."""
    if not isinstance(value, (str, bytes, os.PathLike)):
        raise TypeError("%s must be a path (str, bytes or os.PathLike), not %s (%s)"
                        % (name, type(value).__name__, shown_value(value)))
    try:
        path = os.fspath(value)
    except TypeError as e:
        raise TypeError("%s: %s" % (name, e)) from None
    if not path or ("\0" if isinstance(path, str) else b"\0") in path:
        raise ValueError("%s %s: %s" % (name, shown_value(path), "an empty path" if not path else "a NUL byte in the path"))
    return path


def tensor_arg(value, name):
    """``value`` if it is a dense tensor on a real device whose dim 0 indexes samples; TypeError or
    ValueError naming ``name`` (a list, an ndarray, a sparse or meta tensor, a 0-dim tensor)."""
    if not _is_tensor(value) or not hasattr(value, "layout"):
        raise TypeError("%s must be a torch.Tensor, not %s (%s)%s" % (
            name, type(value).__name__, shown_value(value),
            "; torch.as_tensor(...) converts it" if hasattr(value, "__len__") and not isinstance(value, str) else ""))
    if str(value.layout) != "torch.strided":
        raise ValueError("%s is a %s tensor; pass a dense one (.to_dense())" % (name, str(value.layout).replace("torch.", "")))
    if value.device.type == "meta":
        raise ValueError("%s is on the meta device (no data); pass real tensors" % name)
    if value.dim() < 1:
        raise ValueError("%s is a 0-dim tensor; dim 0 must index samples" % name)
    return value


def callable_arg(value, name, what, methods=()):
    """``value`` if it is None or, with ``methods``, has each as a callable attribute (else is
    callable); TypeError naming ``name`` and ``what`` it should be."""
    ok = value is None or (all(callable(getattr(value, m, None)) for m in methods) if methods else callable(value))
    if not ok:
        raise TypeError("%s must be %s or None, not %s (%s)" % (name, what, type(value).__name__, shown_value(value)))
    return value


def flag_arg(value, name, none_ok=False):
    """``value`` if it is True or False (or None with ``none_ok``); TypeError naming ``name``."""
    if not (isinstance(value, bool) or (none_ok and value is None)):
        raise TypeError("%s must be True%s, not %s (%s)" % (name, ", False or None" if none_ok else " or False",
                                                            type(value).__name__, shown_value(value)))
    return value


def module_arg(value, name="model"):
    """``value`` if it is a torch.nn.Module; TypeError naming ``name``."""
    import torch
    if not isinstance(value, torch.nn.Module):
        raise TypeError("%s must be a torch.nn.Module, not %s (%s)" % (name, type(value).__name__, shown_value(value)))
    return value


def optimizer_arg(value, model=None, name="optimizer"):
    """``value`` if it is a torch.optim.Optimizer (holding at least one of ``model``'s trainable
    parameters, when given); TypeError/ValueError naming ``name``."""
    import torch
    if not isinstance(value, torch.optim.Optimizer):
        raise TypeError("%s must be a torch.optim.Optimizer, not %s (%s)" % (name, type(value).__name__, shown_value(value)))
    if model is not None:
        held = {id(p) for g in value.param_groups for p in g["params"]}
        if not any(id(p) in held for p in model.parameters() if p.requires_grad):
            raise ValueError("%s holds none of the model's trainable parameters (was it built for another model?); "
                             "pass torch.optim.X(model.parameters(), ...)" % name)
    return value


def bound_text(v):
    """A bound as the C++ messages print it: integral values as integers, others as %g."""
    return "%d" % v if abs(v) < 9.007199254740992e15 and v == int(v) else "%g" % v


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def warn_user(message, category=UserWarning):
    """warnings.warn pointing at the user's line: the first frame outside this package (a
    warning raised three calls deep in accumplan names the caller of accumplan.plan, not
    accumplan/__init__.py)."""
    import sys
    import warnings
    level, frame = 2, sys._getframe(1)  # level 2: warn_user's caller
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _PACKAGE_DIR:
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def budget_arg(value, total_bytes, name="memory_budget"):
    """A memory budget in bytes: an int, or text as the CLI's --memory-budget takes it ("12GiB",
    "90%" of ``total_bytes``), read by the core's one parser. TypeError/ValueError naming ``name``."""
    text = value if isinstance(value, str) else str(int_arg(value, name, 1, _core.MAX_BYTES))
    try:
        return _core.resolve_budget(text, total_bytes)
    except _core.InputError as e:
        raise ValueError(str(e)) from None
