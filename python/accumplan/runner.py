"""accumplan.runner — the windows accumplan.plan measures: the C++ search's WindowRunner over the
user's module, and the persistent step.

What it is: ``ModuleRunner``, which the C++ search (accumplan._core.search_plan) asks for a
window of given microbatch sizes, an evaluation window, the checkpoint candidates' costs, or a
checkpoint set; each window runs train_window's own microbatch step through the core's window
loop (_core.WindowLoop, recovery off: an out-of-memory is a measurement) on data tiled from the
user's, under the meter's budget; ``persistent_memory`` measures gradients and optimizer state
across one small window, by the C++ protocol (_core.PersistentStep).
What it is not: a search (C++), nor the plan's arguments and header (accumplan.measure).
"""
import time

import torch

from . import _core
from .batches import count_samples, input_tensors, map_inputs
from .checkpointing import Checkpointed, block_costs, wrap_into
from .errors import plan_error
from .losses import count_units
from .sharding import measuring_optimizer
from .window import EvalBackend, EvalMode, TrainBackend, Window, is_oom, trainable_parameters, zero_grads

# The persistent step's window, the C++ profiler's too (two samples: BatchNorm in training mode
# refuses a batch of one).
PERSISTENT_WINDOW = _core.PERSISTENT_WINDOW_SAMPLES


def tile(inputs, target, n, lengths=None, seq_len=None):
    """The window's data: n samples, cycling over the given ones (as ``--batch-file`` is tiled), on
    the host. Ragged data at ``seq_len``: every sample exactly seq_len tokens, sample i being
    sequence i % count with its own tokens repeated to that length (the CLI's (b, T) grid windows
    are synthetic sequences of exactly T tokens; these are the user's tokens and labels). Held to
    the host-data limit before anything is allocated (the C++ rule: 16 GiB, half the machine or
    ACCUMPLAN_MAX_HOST_DATA), so a huge target_batch of small samples is refused, not allocated."""
    first = count_samples(inputs, target)
    tensors = input_tensors(inputs) + ([target] if target is not None else [])
    # At seq_len a sequence tensor [count, T0, ...] holds seq_len / T0 times its row per sample.
    per_sample = sum(nbytes(t) * seq_len // t.shape[1] if seq_len is not None and t.dim() >= 2 else nbytes(t)
                     for t in tensors) // first
    try:
        _core.check_host_data(per_sample * n, "a window of %d samples tiled from inputs and target" % n,
                              "give a smaller target_batch or memory_budget")
    except _core.InputError as e:
        raise plan_error(e) from None
    idx = torch.arange(n) % first
    positions = None
    if seq_len is not None:
        positions = torch.arange(seq_len).unsqueeze(0) % torch.tensor(lengths, dtype=torch.long)[idx].unsqueeze(1)

    def pick(t):  # on the host, as `accumplan run` keeps its data; microbatches go to the device
        t = t.detach().to("cpu")
        if positions is not None and t.dim() >= 2:
            return t[idx.unsqueeze(1), positions]  # [n, seq_len, ...]
        return t.index_select(0, idx)
    return map_inputs(inputs, pick), (None if target is None else pick(target))


def nbytes(t):
    return t.numel() * t.element_size()


def state_bytes(optimizer):
    return sum(nbytes(v) for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor))


class ModuleRunner(_core.WindowRunner):
    """The Python WindowRunner: windows of train_window's microbatch step on the user's module."""

    def __init__(self, meter, model, optimizer, inputs, target, cfg):
        super().__init__()
        self.meter, self.model, self.optimizer = meter, model, optimizer
        self.inputs, self.target, self.cfg = inputs, target, cfg
        self.budget = cfg["budget"]
        self.checkpointed = Checkpointed([])  # set_checkpointing's wrap; plan() removes it before returning
        self.shares = None  # sharded state: (the optimizer's unsharded view, the core's sharding), for run_rank_window

    def data(self, n, seq_len=None):
        """A window's n samples (ragged data: each of exactly seq_len tokens) and their lengths."""
        c = self.cfg
        inputs, target = tile(self.inputs, self.target, n, c["lengths"], seq_len)
        return inputs, target, (None if seq_len is None else [seq_len] * n)

    def held_data(self, n, seq_len=None):
        """data(n, seq_len) made with no budget, and the bytes it holds: the data set's, outside the budget."""
        self.meter.limit(None)
        before = self.meter.current()
        inputs, target, lengths = self.data(n, seq_len)
        return inputs, target, lengths, self.meter.current() - before

    def window(self, inputs, target, n, lengths=None):
        """The Window of n samples (every window is this process's own: the plan is per rank)."""
        c = self.cfg
        w = Window(None, self.model, inputs, target, lengths, c["loss"], c["loss_fn"], c["ignore_index"],
                   c["autocast"], None, None, shift_arg=c["shift_labels"], local=True)
        w.mask = c["padding_mask"]
        w.rehearse = c.get("exchange", False)
        labels = w.set_units_rule(c["normalization"])
        w.units = max(1, count_units(labels, n, w.norm, w.ii, w.shift))
        return w

    def loop(self, w, sizes):
        """(the core's window loop over a plan of exactly these sizes, the window's TrainBackend)."""
        n = sum(sizes)
        backend = TrainBackend(w, self.optimizer, lambda: _core.ShareCounts(n, w.units, normalization=w.norm),
                               meter=self.meter)
        return _core.WindowLoop(_core.Plan.for_window(list(sizes))), backend

    def set_checkpointing(self, modules):
        """Every later window trains with these modules checkpointed (empty: none); the C++ search
        calls it to confirm a chosen set."""
        self.checkpointed.remove()
        wrap_into(self.checkpointed, self.model, list(modules))

    def block_costs(self, names, n, lifted):
        """(the candidate blocks' BlockCosts: saved bytes and forward seconds per sample, and the
        head's share of the peak, measured on the meter; the window's (peak bytes, seconds)), from
        one microbatch of n samples (forward, loss, backward) under the budget (lifted: none),
        without checkpointing. PlanError when it runs out of memory."""
        meter, costs, peaks, t0 = self.meter, [], [], time.perf_counter()
        inputs, target, lengths, data = self.held_data(n)

        def window():
            w = self.window(inputs, target, n, lengths)
            loop, backend = self.loop(w, [n])
            zero_grads(w.params, self.optimizer)
            meter.reset_peak()
            meter.limit(None if lifted else self.budget, data)
            costs.append(block_costs(self.model, names, lambda: loop.accumulate(backend, [n], oom_recovery=False), n,
                                     memory=meter))
            meter.sync()
            peaks.append((costs[0].step_peak_bytes or meter.peak()) - data)
            zero_grads(w.params, self.optimizer)
        if self.measured(window):
            raise plan_error("measuring the checkpoint candidates at %d samples ran out of memory on %s; plan with "
                             "checkpointing='off'" % (n, meter.device_name))
        return costs[0], (int(peaks[0]), time.perf_counter() - t0)

    def measured(self, window):
        """Runs ``window()`` (a measured window under the meter's limit) with an out-of-memory
        reported (True) rather than raised; the limit is lifted after, and after an out-of-memory
        the gradients are dropped and the meter cleared."""
        meter, oom = self.meter, False
        try:
            window()
        except Exception as e:  # noqa: BLE001 - only out-of-memory is a measurement
            if not (isinstance(e, _core.ExecutorOomError) or meter.oom() or is_oom(e)):
                raise
            oom = True
        finally:
            meter.limit(None)
        if oom:
            zero_grads(trainable_parameters(self.model), self.optimizer)
            meter.clear()
        return oom

    def run_window(self, sizes, seq_len, limit_bytes):
        if seq_len and self.cfg["lengths"] is None:
            raise plan_error("the search asked for sequences of %d tokens, but the data has fixed shapes" % seq_len)
        return self.measure(list(sizes), limit_bytes, seq_len or None)

    def run_rank_window(self, rank, sizes, seq_len, limit_bytes):
        """Sharded state: a window whose optimizer holds rank `rank`'s share, after one that lets it
        allocate that share's state; the largest share's optimizer stays alive beside it (the core's
        search takes its state off). None when the windows hold no share."""
        if self.shares is None:
            return None
        view, sharding = self.shares
        largest = self.optimizer
        self.optimizer = measuring_optimizer(view, dict(sharding, measured_rank=rank))
        try:
            first = self.run_window(sizes, seq_len, limit_bytes)
            m = first if first.oom else self.run_window(sizes, seq_len, limit_bytes)
        finally:
            self.optimizer = largest  # the rank's optimizer and its state dropped
        if m is not first:
            m.seconds += first.seconds
        return m

    def measure(self, sizes, limit, seq_len=None):
        """One window of these microbatch sizes (ragged data: sequences of exactly seq_len tokens)
        and its optimizer step under ``limit`` bytes (None: none): its peaks, persistent memory
        included, its data excluded; an OOM is reported."""
        m, meter, t0 = _core.WindowMeasurement(), self.meter, time.perf_counter()
        n = sum(sizes)
        inputs, target, lengths, data = self.held_data(n, seq_len)
        peaks, reserved, seconds, started = [], [], [], []

        def before_microbatch(event):
            meter.sync()
            meter.reset_peak()
            started.append(time.perf_counter())

        def after_microbatch(event, out_of_memory):  # the reserved peak too: a reset clears both
            meter.sync()
            seconds.append(time.perf_counter() - started[-1])
            peaks.append(meter.peak())
            reserved.append(meter.reserved_peak())
            meter.reset_peak()

        def window():
            w = self.window(inputs, target, n, lengths)
            loop, backend = self.loop(w, sizes)
            zero_grads(w.params, self.optimizer)
            meter.limit(limit, data)
            stats = loop.accumulate(backend, sizes, oom_recovery=False, max_grad_norm=self.cfg["max_grad_norm"],
                                    before_microbatch=before_microbatch, after_microbatch=after_microbatch)
            m.step_seconds = min(seconds)
            meter.sync()
            exchange = meter.peak()  # between the last microbatch and the step: the gradient exchange, if made
            reserved.append(meter.reserved_peak())
            meter.reset_peak()
            loop.apply(backend, stats)
            meter.sync()
            m.optimizer_step_peak_bytes = max(exchange, meter.peak()) - data
            m.peak_bytes = max(peaks) - data
            m.first_microbatch_peak_bytes = peaks[0] - data
            m.steady_peak_bytes = max(peaks[1:]) - data if len(peaks) > 1 else 0
            m.max_peak_bytes = max(m.peak_bytes, m.optimizer_step_peak_bytes)
            reserved.append(meter.reserved_peak())
            if reserved[0] is not None:
                m.reserved_peak_bytes = max(reserved)
        m.oom = self.measured(window)
        m.seconds = time.perf_counter() - t0
        return m

    def run_eval_window(self, sizes, seq_len, limit_bytes, keep_outputs):
        """One evaluation window (the core's evaluation loop, the one plan.evaluate runs) with the
        weights and optimizer state resident and the gradients freed: each microbatch's peak, its
        data excluded; an OOM is reported."""
        m, meter, t0 = _core.EvalMeasurement(), self.meter, time.perf_counter()
        n, limit = sum(sizes), limit_bytes
        zero_grads(trainable_parameters(self.model), self.optimizer)  # zero_grad(set_to_none=True)
        inputs, target, lengths, data = self.held_data(n, seq_len or None)
        peaks = []

        def read():
            meter.sync()
            peaks.append(meter.peak() - data)

        def before_microbatch(index, size):
            if index > 0:
                read()
            meter.reset_peak()

        def window():
            w = self.window(inputs, target, n, lengths)
            meter.limit(limit, data)
            with EvalMode(w.inner):
                _core.run_eval(EvalBackend(w, meter), n, list(sizes), False, keep_outputs, None, before_microbatch)
            read()
            m.peak_bytes = peaks
        m.oom = self.measured(window)
        m.seconds = time.perf_counter() - t0
        return m


def persistent_memory(runner, meter, weights_bytes, state_bytes):
    """Gradients and optimizer state as the C++ profiler measures them: deltas across one small
    window (its backward, then its optimizer step). The attempts and their verdicts are the C++
    protocol's (_core.PersistentStep: under the budget, then without it); this reports what each
    attempt measured. Returns (persistent, trials, over the budget)."""
    cfg = runner.cfg
    # On the CPU the attempt without the budget is still held to the host-data limit.
    step = _core.PersistentStep(cfg["budget"], _core.max_host_data_bytes() if meter.simulated else None)
    had_state = set(runner.optimizer.state)
    trials = []
    while True:
        limit = step.attempt_budget_bytes
        t0 = time.perf_counter()
        before = meter.current()
        n = PERSISTENT_WINDOW
        # Ragged data: the shortest sequences, as the C++ profiler's persistent step.
        inputs, target, lengths = runner.data(n, cfg["seq_range"][0] if cfg["seq_range"] else None)
        with_data = meter.current()
        grads = []
        try:
            w = runner.window(inputs, target, n, lengths)
            loop, backend = runner.loop(w, [n])
            zero_grads(w.params, runner.optimizer)
            meter.reset_peak()
            meter.limit(limit, with_data - before)
            stats = loop.accumulate(backend, [n], oom_recovery=False, max_grad_norm=cfg["max_grad_norm"])
            _core.PersistentStep.check_loss(stats.loss)
            grads.append(meter.current() - with_data)
            loop.apply(backend, stats)
            peak = meter.peak() - (with_data - before)
        except Exception as e:  # noqa: BLE001
            meter.limit(None)
            if not (isinstance(e, _core.ExecutorOomError) or meter.oom() or is_oom(e)):
                raise
            zero_grads(trainable_parameters(runner.model), runner.optimizer)
            for p in [p for p in runner.optimizer.state if p not in had_state]:
                del runner.optimizer.state[p]  # half-built by the failed step: measured again
            meter.clear()
            # The failed attempt's window and data go now, not while the next attempt measures it.
            w = loop = backend = inputs = target = None
            # InfeasibleError when it ran without a budget: plan() raises it as OutOfMemoryAtOne.
            trials.append(step.out_of_memory(time.perf_counter() - t0, meter.device_name))
            continue
        meter.limit(None)
        persistent = {"weights_bytes": weights_bytes, "gradients_bytes": grads[0],
                      "optimizer_state_bytes": state_bytes + meter.current() - with_data}
        trials.append(step.measured(int(peak), time.perf_counter() - t0))
        return persistent, trials, step.over_budget
