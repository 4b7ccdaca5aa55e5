"""accumplan._args — the checks of the public functions' integer arguments, one place for both
modules (plan.py needs no torch; tensors are recognised by what they have, not by importing torch).

What it is: every public function that takes a count, a size, an index or per-sequence lengths
turns it into Python ints here, or raises TypeError/ValueError naming the argument. Without it a
2**70 reached torch as an OverflowError, a float tensor of lengths was truncated silently and a
list of strings was parsed. What it is not: the plan's validation (plan.py's reader does that).
"""

import numbers

INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1
MAX_COUNT = 2 ** 40  # the C++ options' bound on samples and microbatch sizes


def _shown(value):
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
        raise TypeError("%s must be an integer, not %s (%s)" % (name, type(value).__name__, _shown(value)))
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
                        % (name, type(lengths).__name__, _shown(lengths)))
    else:
        values = list(lengths)
    return [int_arg(v, "%s[%d]" % (name, i), minimum, INT32_MAX) for i, v in enumerate(values)]
