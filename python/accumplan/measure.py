"""accumplan.plan — plan an nn.Module in-process, by measuring its real training windows.

What it is: the Python executor of accumplan's one measurement search. ``plan(model, inputs,
target, target_batch=..., optimizer=...)`` runs windows of ``train_window``'s own microbatch step
(forward, loss sum, backward of sum / N; then clipping and the optimizer step) on the user's
unscripted module, and the C++ search (``accumplan._core.search_plan``, the one ``accumplan
profile`` runs on its TorchScript executor) decides which windows run and plans from their peaks
with the C++ solver. Memory is what this process's training allocates: on the CPU device the
counting allocator (``accumplan._probes``, the C++ probe) installed for the duration of planning,
its budget enforced as a GPU enforces its capacity; on CUDA the caching allocator's allocated
peaks (its reserved peak is reported, not planned on: the allocator frees its cache and retries
before it runs out, so the reserved bytes above the allocated ones are cache it keeps because the
cap leaves room), the budget set as the process's memory fraction. Planning leaves nothing
behind (accumplan.snapshot; the probe and the budget removed), also when it fails. Variable-length
data is planned as the CLI plans a ragged ``--batch-file`` (``plan``'s docstring says how).

What it is not: a second search or planner (both are C++), nor a packer (the C++ one is asked
through ``Plan.pack``).
"""
import inspect
import sys
from types import SimpleNamespace

import torch

from . import _core
from ._args import (INT32_MAX, INT32_MIN, MAX_COUNT, budget_arg, callable_arg, choice_arg, documented_arg, flag_arg, int_arg,
                    module_arg, optimizer_arg, real_arg, shown_value)
from .batches import as_inputs, check_lengths, count_samples, input_tensors, ragged_data, target_arg
from .checkpointing import checkpoint_candidates
from .distributed import ddp_bucket_bytes
from .errors import oom_error, plan_error
from .losses import LOSSES, check_class_target, causal_shift, units_rule
from .meters import meter_for, weight_bytes
from .plans import Plan, plan_ranks
from .runner import PERSISTENT_WINDOW, ModuleRunner, persistent_memory, state_bytes
from .sharding import measuring_optimizer, shard_arg, sharding_of, unsharded_view
from .snapshot import RestoreGuard, TrainingState
from .window import autocast_dtype, batch_dependent_layers, trainable_parameters, warn_batch_dependent

_GROUP_KEYS_NOT_SETTINGS = ("params", "initial_lr")  # the parameters, and what an LR scheduler adds


def _group_values(group, cls_name, table, defaults):
    """(lr, hyperparameters, flags) of one param_group: every hyperparameter the C++ table lists
    that the group holds, every flag that differs from the class's default. ValueError naming a
    constructor setting the table does not know, set away from its default (never dropped)."""
    values = dict(group)
    for keyword, members in table["grouped"].items():  # torch's betas: beta1, beta2
        if keyword in values:
            parts = [float(v) for v in values.pop(keyword)]
            if len(parts) != len(members):
                raise ValueError("optimizer: %s's %s holds %d values; a plan records %d (%s)"
                                 % (cls_name, keyword, len(parts), len(members), ", ".join(members)))
            values.update(zip(members, parts))
    hp = {k: _finite(values[k], "optimizer: %s's %s" % (cls_name, k)) for k in table["hyperparameters"] if k in values}
    flags = {}
    for key, value in values.items():
        if key in _GROUP_KEYS_NOT_SETTINGS or key == "lr" or key in hp:
            continue
        default = defaults.get(key, inspect.Parameter.empty)
        if key in table["flags"] and isinstance(value, bool):
            if value != default:
                flags[key] = value
        elif default is not inspect.Parameter.empty and value != default:
            raise ValueError("optimizer: %s's %s=%r is a setting a plan cannot record (it records lr, %s and the flags "
                             "%s); leave it at its default %r" % (cls_name, key, value,
                                                                   ", ".join(table["hyperparameters"]),
                                                                   ", ".join(table["flags"]), default))
    return _finite(values["lr"], "optimizer: %s's lr" % cls_name), hp, flags


def _finite(value, name):
    """A hyperparameter as a finite float (TypeError/ValueError naming it): NaN cannot cross to
    the core as JSON. Its range is the core's (the plan reader's, with the JSON path)."""
    return real_arg(value, name, -1.7976931348623157e308, 1.7976931348623157e308)


def _optimizer_row(optimizer):
    """(the plan's optimizer name, torch.optim's class, its table row) of the user's optimizer, by the C++ table
    (_core.optimizer_table): the most derived of the table's classes it is an instance of (in 2.x
    AdamW derives from Adam); of the rows sharing that class, the first whose fixed keywords every
    param_group holds (sgd: momentum 0), else the first without any (momentum)."""
    table = _core.optimizer_table()
    classes = {row["torch_class"]: getattr(torch.optim, row["torch_class"], None) for row in table.values()}
    held = [c for c in classes.values() if c is not None and isinstance(optimizer, c)]
    if not held:
        raise TypeError("optimizer must be a torch.optim %s (the optimizers a plan states), not %s"
                        % (", ".join(classes), type(optimizer).__name__))
    cls = next(c for c in held if all(issubclass(c, other) for other in held))
    rows = [(name, row) for name, row in table.items() if classes[row["torch_class"]] is cls]
    for name, row in rows:
        fixed = row["torch_fixed"]
        if fixed and all(g.get(k, v) == v for g in optimizer.param_groups for k, v in fixed.items()):
            return name, cls, row
    return next((name, cls, row) for name, row in rows if not row["torch_fixed"])


def _setup_optimizer(optimizer):
    """A _core.Setup holding the user's optimizer: optimizer, lr, hyperparameters, flags and, for
    more than one parameter group, param_groups (each group's values and its parameter count). The
    table of what each optimizer takes is the C++ one (_core.optimizer_table)."""
    name, cls, table = _optimizer_row(optimizer)
    defaults = {}  # each constructor setting's default: torch's class, then a subclass's own
    for c in (cls, type(optimizer)):
        defaults.update((k, p.default) for k, p in inspect.signature(c.__init__).parameters.items()
                        if p.default is not inspect.Parameter.empty)
    groups = []
    for group in optimizer.param_groups:
        g = _core.OptimizerGroup()
        g.lr, g.hyperparameters, g.flags = _group_values(group, type(optimizer).__name__, table, defaults)
        g.parameter_count = sum(p.numel() for p in group["params"])
        groups.append(g)
    setup = _core.Setup()
    setup.optimizer, setup.lr = name, groups[0].lr
    setup.hyperparameters, setup.flags = groups[0].hyperparameters, groups[0].flags
    if len(groups) > 1:
        setup.param_groups = groups
    return setup


def _spec(t, ragged=False):
    """A tensor's spec as a plan's setup writes one: dtype[B,dims...], integers with :high; ragged
    data's sequence dimension (dim 1) is T, as the CLI writes a ragged --batch-file's."""
    dtype = str(t.dtype).replace("torch.", "")
    dims = [str(d) for d in t.shape[1:]]
    if ragged and dims:
        dims[0] = "T"
    text = "%s[%s]" % (dtype, ",".join(["B"] + dims))
    if not (t.is_floating_point() or t.is_complex()):
        high = int(t.max()) + 1 if t.numel() else 1
        text += ":%d" % max(1, high)
    return text


def _config(model, inputs, target, loss, loss_fn, device, amp, max_grad_norm, normalization, ignore_index):
    """Every argument checked before any window runs; the settings the windows share."""
    params = trainable_parameters(model)
    if not params:
        raise ValueError("the model has no trainable parameters; there is nothing to plan for")
    where = params[0].device
    try:
        device = where if device is None else torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError("device %s is not a device; use 'cpu', 'cuda' or 'cuda:N'" % shown_value(device)) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device %r: this torch (%s) sees no CUDA device; use device='cpu' or a CUDA build of torch"
                         % (str(device), torch.__version__))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type == "cuda" and device.index >= torch.cuda.device_count():
        raise ValueError("device %r: this machine has %d CUDA device(s)" % (str(device), torch.cuda.device_count()))
    if device != where:
        raise ValueError("the model's parameters are on %s but device=%r: move the model there first (model.to(%r))"
                         % (where, str(device), str(device)))
    if device.type not in ("cpu", "cuda"):
        raise ValueError("device %r: accumplan.plan measures on cpu or cuda" % str(device))
    if loss_fn is None:
        loss = choice_arg(loss, "loss", LOSSES)
    elif not callable(loss_fn):
        raise TypeError("loss_fn must be callable(output, target) returning the loss SUM, not %s" % shown_value(loss_fn))
    if loss == "model" and target is not None and isinstance(inputs, dict):
        raise ValueError("loss='model' with dict inputs takes its labels from the dict: pass target=None")
    if loss_fn is None and loss != "model" and target is None:
        raise ValueError("loss=%r needs a target; pass target= or use loss='model' (the output carries the loss)"
                         % loss)
    n = count_samples(inputs, target)
    if n < 1:
        raise ValueError("inputs hold no samples (dim 0 is 0); pass at least one")
    ii = int_arg(ignore_index, "ignore_index", INT32_MIN, INT32_MAX)
    norm, _ = units_rule(normalization, loss, loss_fn, inputs, target)
    if loss_fn is None and loss == "cross_entropy" and isinstance(target, torch.Tensor) and target.is_floating_point():
        # Class probabilities: every row checked here, before any window runs.
        check_class_target(target, target.shape[-1] if target.dim() == 2 else -1, ii)
    if max_grad_norm is not None:
        max_grad_norm = documented_arg(max_grad_norm, "max_grad_norm", "max_grad_norm")
    return device, {"loss": loss, "loss_fn": loss_fn, "ignore_index": ii, "norm": norm, "normalization": normalization,
                    "autocast": autocast_dtype(amp, device, "amp"), "amp": amp, "max_grad_norm": max_grad_norm}


def _data(inputs, target, lengths, loss, loss_fn, ignore_index, padding_mask):
    """(inputs, target, lengths) as the windows take them: ragged data padded, with its lengths
    (None: fixed shapes). ValueError/TypeError naming the argument."""
    flag_arg(padding_mask, "padding_mask")
    ii = int_arg(ignore_index, "ignore_index", INT32_MIN, INT32_MAX)
    ragged = ragged_data(inputs, target, lengths, None if loss_fn is not None else loss, ii)
    if ragged is None:
        if padding_mask:
            raise ValueError("padding_mask=True needs variable-length data: a list of sequences, or a padded batch "
                             "with lengths=")
        return as_inputs(inputs), target_arg(target), None
    inputs, target, lengths = ragged
    if padding_mask and isinstance(inputs, dict):
        raise ValueError("padding_mask=True passes the mask as one more positional argument; dict inputs carry "
                         "theirs (attention_mask): plan without padding_mask")
    lengths = check_lengths(inputs, target, lengths, count_samples(inputs, target))
    if not any(t.dim() >= 2 for t in input_tensors(inputs)):
        raise ValueError("lengths= needs inputs with a sequence dimension (dim 1, padded); every input tensor is 1-D")
    return inputs, target, lengths


def _setup(optimizer, inputs, target, cfg):
    """The _core.Setup the windows trained with: the optimizer, precision, clipping, loss and the data's specs."""
    setup = _setup_optimizer(optimizer)
    setup.amp = {None: "none", torch.bfloat16: "bf16", torch.float16: "fp16"}[cfg["autocast"]]
    setup.max_grad_norm, setup.loss = cfg["max_grad_norm"], cfg["loss"]
    setup.normalization, setup.ignore_index = _recorded_normalization(cfg), cfg["ignore_index"]
    tensors = list(inputs.values()) if isinstance(inputs, dict) else list(inputs)
    ragged = cfg["seq_range"] is not None
    setup.inputs = [_spec(t, ragged) for t in tensors if isinstance(t, torch.Tensor)]
    setup.target = "" if target is None else _spec(target, ragged)
    if ragged:  # the range the (b, T) grid plans for, and the mask as the CLI's --padding-mask
        setup.set_seq_len(*cfg["seq_range"])
        setup.padding_mask = bool(cfg["padding_mask"])
    return setup


def _header(model, inputs, target, optimizer, device, meter, cfg, persistent, trials):
    """The profile's header (_core.Profile): what was measured, on what, for what."""
    inner, budget = getattr(model, "module", model), cfg["budget"]  # inner: DDP's module
    header = _core.Profile()
    header.set_device(device.type, device.index or 0, meter.device_name,
                      budget if (budget is not None and meter.simulated) else meter.total_bytes)
    header.set_python_model(type(model).__name__, sum(p.numel() for p in model.parameters()),
                            batch_dependent_layers(model),
                            getattr(inner, "supports_gradient_checkpointing", False) is True
                            and callable(getattr(inner, "gradient_checkpointing_enable", None)))  # Trainer's flag calls it
    header.setup = _setup(optimizer, inputs, target, cfg)
    header.libtorch_version, header.probe = torch.__version__.split("+")[0], meter.probe_name
    header.budget_bytes = budget
    header.set_persistent(**persistent)
    header.trials = trials
    return header


def _recorded_normalization(cfg):
    """The plan's setup.normalization: the argument as given, except that a model's own loss
    weighted per token says "tokens" (the CLI's executor weights a model's loss by samples)."""
    if cfg["loss_fn"] is None and cfg["loss"] == "model" and cfg["norm"] == "tokens":
        return "tokens"
    return cfg["normalization"]


def _say(progress):
    if progress is False:
        return None
    if callable(progress):
        return progress
    return lambda line: print("accumplan: " + line, file=sys.stderr, flush=True)


def plan(model, inputs, target=None, *, target_batch=None, optimizer, loss="cross_entropy", loss_fn=None,
         memory_budget=None, device=None, amp=None, max_grad_norm=None, world_size=1, shard=None, headroom="auto",
         normalization="auto", ignore_index=-100, shift_labels=None, lengths=None, padding_mask=False,
         target_tokens=None, eval=True, eval_keep_outputs=False, checkpointing="off", checkpoint_candidates=None,
         max_seq_len=None, max_micro_batch=None, progress=None):
    """The plan for training ``model`` with ``optimizer`` at an effective batch of ``target_batch``,
    measured by real windows of ``train_window``'s step on this module in this process.

    inputs: a tuple of tensors (dim 0 = samples; tiled to any window size) or a dict passed as
    ``model(**inputs)``. target: the target tensor; None with loss="model" (the output carries the
    mean loss: a Hugging Face model given labels). loss_fn(output, target) returning the SUM over
    the microbatch replaces ``loss``. memory_budget: bytes, "12GiB" or "90%" (None: the device's
    memory), or a list of one per rank (world_size of them) for ranks that differ: one search per
    budget here, each rank then at this process's speed (``accumplan.plan_ranks`` combines plans made
    on each rank's own device instead). device: "cpu" or "cuda[:N]", where the model is (None: there). amp: None, "bf16"
    or "fp16". headroom: "auto", a fraction ("0.05") or bytes ("256MiB"), as ``--headroom``.
    shift_labels: with loss="model" and per-token labels, whether the model's loss shifts them
    (None: detected, as ``train_window`` does; the plan records normalization "tokens").
    Variable-length data (a packed plan, ``plan.tokens``, the CLI's token plan): inputs a list of 1-D
    token tensors with target a list of per-token tensors, a tensor of one target per sequence, or
    None (next-token targets for cross_entropy, as ``accumplan run --data`` reads ``[sequences,
    None]``); or a list of Hugging Face example dicts (loss="model"); or a padded batch with
    ``lengths=``. The C++ search measures windows of b sequences of exactly T tokens (the data's own
    tokens repeated) over T up to max_seq_len (``--seq-len``; None: the longest given), and plans the
    token budget by the CLI's token model. padding_mask=True passes ``padding_mask(lengths, T)`` as one more forward argument
    (``--padding-mask``; dict inputs carry their attention_mask instead). target_tokens, instead of
    target_batch: each update a window of consecutive sequences holding at least that many valid
    tokens (``--target-tokens``; ``plan.target_tokens``, ``token_windows``).
    eval: also plan the evaluation batch (``plan.eval``, as the CLI does unless ``--no-eval``): at most
    two more windows of ``plan.evaluate``'s loop (forward under no_grad, eval mode) with the weights and
    optimizer state resident find the largest eval microbatch under the same budget.
    eval_keep_outputs: that evaluation keeps each microbatch's outputs until the next microbatch's
    forward has finished (``evaluate(..., on_outputs=)``), and the eval batch counts them.
    checkpointing: "off" (the default), "auto" or a list of module names. "auto" also plans
    activation checkpointing (``plan.checkpoint``): after the search, one window measures what each
    candidate block frees and costs (``accumplan.checkpointing.block_costs``), the C++ planner picks
    the checkpoint set (none, every k-th candidate, all) with the least predicted window time whose
    microbatch fits (when 10% under the fitting set with the fewest blocks; else that set), one more
    window confirming it when the search ran with another; when not one sample fits without it, the
    search runs again with every candidate checkpointed and the choice starts from there. A list
    checkpoints exactly those modules in every window the search runs.
    checkpoint_candidates: the blocks "auto" chooses among (None: the longest run of same-class
    children of an nn.ModuleList or nn.Sequential, ``checkpoint_candidates(model)``).
    shard: "off", "optimizer" or "auto" (None: "optimizer" for a torch.distributed.optim.ZeroRedundancyOptimizer,
    whose world size is then the plan's, else "off"). "optimizer" plans the optimizer state sharded over world_size
    ranks as ZeroRedundancyOptimizer partitions it (``plan.sharding``): the windows hold every weight and gradient
    and the state of the rank with the largest share only (an optimizer of the same class over its parameters,
    built here and dropped after), so each peak is that rank's; train it with a ZeroRedundancyOptimizer. "auto"
    plans unsharded first and searches again sharded only when the state sharding frees lets a larger microbatch
    fit (or when not one sample fits unsharded); the reason says which.
    max_micro_batch: never plan a microbatch above it (``--max-micro-batch``; None: memory decides).
    progress: None prints one line per window to stderr, False is silent, a callable gets the lines.
    The plan's setup records the optimizer whole: every parameter group's lr and hyperparameters and
    its flags (nesterov, amsgrad, maximize, foreach, ...; docs/plan-format.md), so an export carries
    each value or refuses naming it; ValueError names a constructor setting a plan cannot record.
    Returns the ``Plan`` ``load_plan`` returns; ``plan.save(path)`` writes the file the CLI writes.
    The model, optimizer and RNG are left as they were; ValueError/TypeError name a bad argument
    before anything runs; OutOfMemoryAtOne when not even one sample fits."""
    job = _job(model, optimizer, _request(target_batch, target_tokens, world_size, headroom, eval, eval_keep_outputs,
                                          max_micro_batch), shard, progress)
    job.inputs, job.target, lengths = _data(inputs, target, lengths, loss, loss_fn, ignore_index, padding_mask)
    if job.shard == "auto" and not (isinstance(checkpointing, str) and checkpointing == "off"):
        raise ValueError("shard='auto' with checkpointing=%s: plan one knob automatically at a time; pass "
                         "shard='optimizer' or shard='off'" % shown_value(checkpointing))
    job.knob = _checkpointing_arg(model, checkpointing, checkpoint_candidates, lengths)
    if target_tokens is not None and lengths is None:
        raise ValueError("target_tokens=%d counts the tokens of variable-length data: pass a list of sequences (or a "
                         "padded batch with lengths=); otherwise use target_batch" % target_tokens)
    job.device, job.cfg = _config(model, job.inputs, job.target, loss, loss_fn, device, amp, max_grad_norm,
                                  normalization, ignore_index)
    job.cfg.update(lengths=lengths, padding_mask=padding_mask, seq_range=_seq_range(lengths, max_seq_len),
                   shift_labels=causal_shift(model, shift_labels) if shift_labels is not None else None)
    if isinstance(memory_budget, (list, tuple)):
        return _per_rank_plan(job, model, optimizer, memory_budget)
    return Plan._from_core(_measured_plan(job, model, optimizer, memory_budget),
                           "accumplan.plan(%s)" % type(model).__name__)


def _per_rank_plan(job, model, optimizer, budgets):
    """memory_budget=[one per rank]: one search per distinct budget in this process (so every rank at
    this process's speed), the plans combined by accumplan.plan_ranks."""
    if len(budgets) != job.request.world_size:
        raise ValueError("memory_budget: %d budgets for world_size=%d; give one per rank, or one for all"
                         % (len(budgets), job.request.world_size))
    if job.shard != "off" or job.knob is not None or job.request.target_tokens != 0:
        raise ValueError("memory_budget: one per rank plans fixed-shape samples with the whole optimizer state and no "
                         "checkpointing; pass one budget with shard, checkpointing or target_tokens")
    own = {}
    for b in budgets:
        if repr(b) not in own:
            own[repr(b)] = Plan._from_core(_measured_plan(job, model, optimizer, b),
                                           "accumplan.plan(%s)" % type(model).__name__)
    return plan_ranks([own[repr(b)] for b in budgets])


def _job(model, optimizer, request, shard, progress):
    """The planning job so far: the request, the shard mode and the optimizer view a setup records,
    the progress callback; each argument checked (ValueError/TypeError naming it)."""
    module_arg(model, "model")
    optimizer_arg(optimizer, model)
    shard, request.world_size = shard_arg(shard, optimizer, request.world_size)
    view = unsharded_view(optimizer)  # what the setup records: a ZeroRedundancyOptimizer's class and groups
    _setup_optimizer(view)
    if not (progress is None or isinstance(progress, bool)):
        callable_arg(progress, "progress", "True, False or a callable(line)")
    return SimpleNamespace(request=request, shard=shard, view=view, say=_say(progress))


def _measured_plan(job, model, optimizer, memory_budget):
    """The searched plan (_core.Plan) of a checked job, measured on the model with the model,
    optimizer and RNG put back after, also when interrupted."""
    request, cfg, view, say = job.request, job.cfg, job.view, job.say
    warn_batch_dependent(batch_dependent_layers(model))
    sharding = sharding_of(view, model, request.world_size, job.device) if job.shard != "off" else None
    measuring = measuring_optimizer(view, sharding) if job.shard == "optimizer" else optimizer
    weights = weight_bytes(model, view)  # a parameter the optimizer holds beside the model's is held too
    guard = RestoreGuard()  # Ctrl-C from here on cannot cut the put-back below in half
    try:
        held = weights + state_bytes(measuring) + ddp_bucket_bytes(model)  # what the meter, started now, would not count
        guard.protected(lambda: guard.hold(TrainingState(model, optimizer, job.device), meter_for(job.device, held)))
        meter = guard.meter
        cfg["budget"] = None if memory_budget is None else budget_arg(memory_budget, meter.total_bytes)
        cfg["exchange"] = request.world_size > 1  # every window makes a rank's gradient exchange
        runner = ModuleRunner(meter, model, measuring, job.inputs, job.target, cfg)
        runner.shares = (view, sharding) if sharding else None
        guard.also_undo(runner.checkpointed.remove)  # nothing is wrapped before set_checkpointing
        request.budget_is_simulated = meter.simulated

        def search():
            if say:
                say("measuring persistent memory on %s (one window of %d samples%s)" % (
                    meter.device_name, PERSISTENT_WINDOW, "" if runner.optimizer is optimizer else
                    ", holding rank %d's optimizer state of %d" % (sharding["measured_rank"], request.world_size)))
            persistent, trials, over = persistent_memory(runner, meter, weights, state_bytes(runner.optimizer))
            request.persistent_over_budget = over
            header = _header(model, job.inputs, job.target, view, job.device, meter, cfg, persistent, trials)
            if runner.optimizer is not optimizer:
                header.set_sharding(sharding["world_size"], sharding["per_rank_state_bytes"], sharding["measured_rank"])
            header.gradient_exchange = cfg["exchange"]
            return _core.search_plan(runner, header, request, say)
        restart = lambda: guard.protected(guard.snapshot.restore)  # noqa: E731 - the state before the first window
        if job.shard == "auto":
            return _auto_sharded_search(runner, search, restart, view, sharding, request.world_size, say)
        if job.knob is None:
            return search()
        return _checkpointed_search(runner, search, restart, job.knob, request, say)
    except _core.InfeasibleError as e:
        raise oom_error(e) from None
    except _core.InputError as e:
        raise plan_error(e) from None
    finally:
        guard.put_back()  # the wraps removed, the meter closed, the state restored, Ctrl-C held meanwhile


def _auto_sharded_search(runner, search, restart, view, sharding, world_size, say):
    """shard="auto", the core's choice (_core.plan_auto_sharding): the unsharded search, then, when it
    says so, again from the state before the first window with the largest share's measuring optimizer."""
    def unsharded():
        try:
            return search()
        except _core.InfeasibleError:
            return None

    def sharded():
        restart()
        runner.optimizer = measuring_optimizer(view, sharding)
        return search()
    return _core.plan_auto_sharding(unsharded, sharded, world_size, sharding["freed_bytes"], say)


def _seq_range(lengths, max_seq_len):
    """(shortest, longest) sequence the (b, T) grid plans for: the data's, the longest up to max_seq_len."""
    if lengths is None and max_seq_len is not None:
        raise ValueError("max_seq_len=%s is for variable-length data: pass a list of sequences (or lengths=)"
                         % shown_value(max_seq_len))
    if lengths is None or max_seq_len is None:
        return None if lengths is None else (min(lengths), max(lengths))
    longest = int_arg(max_seq_len, "max_seq_len", 1, INT32_MAX)
    if longest < max(lengths):
        raise ValueError("max_seq_len=%d is shorter than the longest sequence given (%d tokens); pass at least that"
                         % (longest, max(lengths)))
    return min(lengths), longest


def _request(target_batch, target_tokens, world_size, headroom, eval, eval_keep_outputs, max_micro_batch=None):
    """The search's request from plan()'s arguments, checked by the CLI's rules (_core.check_request)."""
    if (target_batch is None) == (target_tokens is None):
        raise TypeError("give target_batch (samples per optimizer step) or, for variable-length data, target_tokens "
                        "(valid tokens per optimizer step)%s" % (", not both" if target_batch is not None else ""))
    request = _core.SearchRequest()
    request.world_size = int_arg(world_size, "world_size", 1, _core.MAX_WORLD_SIZE)
    request.eval = flag_arg(eval, "eval")
    request.eval_keep_outputs = flag_arg(eval_keep_outputs, "eval_keep_outputs")
    if eval_keep_outputs and not eval:
        raise ValueError("eval_keep_outputs=True sizes the evaluation batch, which eval=False skips: drop one of them")
    if target_tokens is None:
        request.target_batch = int_arg(target_batch, "target_batch", 1, MAX_COUNT)
    else:
        request.target_tokens = int_arg(target_tokens, "target_tokens", 1, (1 << 63) - 1)  # its range: the solver's
    if isinstance(headroom, bool) or not isinstance(headroom, (str, int, float)):
        raise TypeError("headroom must be 'auto', a fraction (0.05) or a size ('256MiB', bytes), not %s" % shown_value(headroom))
    request.headroom = str(headroom)  # read by the CLI's --headroom parser
    if max_micro_batch is not None:
        request.max_micro_batch = int_arg(max_micro_batch, "max_micro_batch", 1, MAX_COUNT)
    try:
        _core.check_request(request)
    except _core.InputError as e:
        raise ValueError(str(e)) from None
    return request


def _checkpointing_arg(model, checkpointing, candidates, lengths):
    """(mode "auto" or "given", the candidates' names, the given names) for plan's checkpointing=,
    checkpoint_candidates= (None for "off"). ValueError/TypeError naming the argument, before any
    window runs."""
    if isinstance(checkpointing, str) and checkpointing == "off":
        if candidates is not None:
            raise ValueError("checkpoint_candidates names the blocks checkpointing='auto' chooses among; with "
                             "checkpointing='off' drop it, or pass checkpointing='auto'")
        return None
    if lengths is not None:
        raise ValueError("checkpointing=%s: activation checkpointing is planned for fixed-shape data; variable-length "
                         "data plans without it (checkpointing='off')" % shown_value(checkpointing))
    if isinstance(checkpointing, str):
        choice_arg(checkpointing, "checkpointing", ("off", "auto"))
        if isinstance(candidates, (list, tuple)) and not candidates:
            raise ValueError("checkpoint_candidates=[] names no block; name at least one, or pass None to find them")
        return "auto", checkpoint_candidates(model, candidates), []
    if not isinstance(checkpointing, (list, tuple)):
        raise TypeError("checkpointing must be 'off', 'auto' or a list of module names, not %s"
                        % shown_value(checkpointing))
    given = checkpoint_candidates(model, list(checkpointing), "checkpointing")
    if not given:
        raise ValueError("checkpointing=[] names no module; pass checkpointing='off' to plan without checkpointing")
    names = given if candidates is None else checkpoint_candidates(model, candidates)
    missing = [n for n in given if n not in names]
    if missing:
        raise ValueError("checkpointing names %r, which checkpoint_candidates does not list; add it there or drop it"
                         % missing[0])
    return "given", names, given


def _checkpointed_search(runner, search, restart, knob, request, say):
    """The plan with activation checkpointing (plan's checkpointing=): the search with the given
    modules checkpointed, or for "auto" without (when not one sample fits, again from the state
    before the first window, ``restart()``, with every candidate checkpointed); one window of
    block_costs; then the C++ planner's choice and its confirming window (_core.checkpoint_plan)."""
    mode, names, given = knob
    applied = given if mode == "given" else []
    runner.set_checkpointing(applied)
    try:
        searched = search()
    except _core.InfeasibleError:
        if mode != "auto":
            raise
        if say:
            say("not one sample fits without checkpointing: searching again with all %d candidate blocks "
                "checkpointed" % len(names))
        applied = list(names)
        restart()  # the optimizer state the first search made would not count as persistent memory
        runner.set_checkpointing(applied)
        searched = search()
    # The costs at the plan's microbatch, which fits, without checkpointing; when only a
    # checkpointed one fits, at the persistent step's two samples without the budget.
    n = searched.micro_batch if not applied else PERSISTENT_WINDOW
    if say:
        say("measuring what checkpointing frees and costs: %d candidate blocks (%s .. %s), one window of %d samples"
            % (len(names), names[0], names[-1], n))
    runner.set_checkpointing([])
    costs, (peak, seconds) = runner.block_costs(names, n, lifted=bool(applied))
    runner.set_checkpointing(applied)
    return _core.checkpoint_plan(runner, searched, costs, costs.head_bytes_per_sample,
                                 [names.index(a) for a in applied], mode == "auto", request.budget_is_simulated,
                                 (n, peak, seconds), say)


__all__ = ["plan"]
