"""accumplan.checkpointing (its Python groundwork): candidate discovery and the wrap.

What it checks: the longest run of same-class blocks is found in an nn.ModuleList (a transformer)
and in a root nn.Sequential (a ResNet-like stack); explicit names are checked and kept; a model
with no repeated blocks and a TorchScript module are refused with the fix; a checkpointed block
really recomputes its forward in backward, gives the same gradients as without it with dropout on
(1e-6), runs once under no_grad, and remove() puts every forward back.
accumplan.plan(checkpointing="auto"): a stack whose one-sample window does not fit without
checkpointing gets a checkpointed plan whose real train_window peaks are within 1% of the
prediction and whose 1.1x+1 window runs out of memory; a per-microbatch cost makes a checkpointed
set win with one confirming window (at most two windows more than without) and the same update;
an explicit list is searched with; bad arguments are refused by their Python names before any
window runs.
What it is not: the planner's model and choice by hand (tests/planner/test_checkpoint.cpp)."""
import contextlib
import json
import math
import time
import unittest

import torch
import torch.nn as nn

import accumplan
from accumplan import _core
from accumplan.checkpointing import apply_checkpointing, block_costs, checkpoint_candidates, interrupted_in_recompute
from accumplan.meters import CpuMeter, held_bytes
from helpers import plan_doc


class Block(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.fc, self.drop, self.norm = nn.Linear(d, d), nn.Dropout(0.3), nn.LayerNorm(d)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.norm(x + self.drop(torch.tanh(self.fc(x))))


class Transformerish(nn.Module):
    def __init__(self, layers=4, block=Block):
        super().__init__()
        self.emb = nn.Linear(8, 16)
        self.layers = nn.ModuleList([block() for _ in range(layers)])
        self.head = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2))

    def forward(self, x):
        h = self.emb(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def resnetish():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), Block(), Block(), Block(), nn.Linear(16, 2))


class Candidates(unittest.TestCase):
    def test_a_module_list_of_blocks_is_found(self):
        self.assertEqual(checkpoint_candidates(Transformerish()), ["layers.0", "layers.1", "layers.2", "layers.3"])

    def test_the_root_sequential_run_is_found_and_named_from_the_root(self):
        self.assertEqual(checkpoint_candidates(resnetish()), ["2", "3", "4"])

    def test_explicit_names_are_kept_and_checked(self):
        m = Transformerish()
        self.assertEqual(checkpoint_candidates(m, ["layers.1", "head"]), ["layers.1", "head"])
        with self.assertRaisesRegex(ValueError, r"^checkpoint_candidates\[0\] is 'layer.1', not a submodule of the "
                                                r"model; did you mean layers\.1"):
            checkpoint_candidates(m, ["layer.1"])
        with self.assertRaisesRegex(ValueError, r"names 'head' twice"):
            checkpoint_candidates(m, ["head", "head"])
        with self.assertRaisesRegex(TypeError, "must be a list of module names"):
            checkpoint_candidates(m, "head")

    def test_a_model_without_repeated_blocks_is_refused_with_the_fix(self):
        with self.assertRaisesRegex(ValueError, r"^Sequential has no repeated blocks to checkpoint .*"
                                                r"checkpoint_candidates=\[\.\.\.\]$"):
            checkpoint_candidates(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)))

    def test_a_torchscript_module_is_refused(self):
        with self.assertRaisesRegex(TypeError, "TorchScript module: activation checkpointing wraps a Python"):
            checkpoint_candidates(torch.jit.script(resnetish()))


class Wrap(unittest.TestCase):
    def grads(self, model, x, checkpointed):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(5)
        if checkpointed:
            with apply_checkpointing(model, checkpoint_candidates(model)):
                model(x).pow(2).sum().backward()
        else:
            model(x).pow(2).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    def test_the_gradients_equal_those_without_it_with_dropout_on(self):
        torch.manual_seed(0)
        model, x = Transformerish().train(), torch.randn(6, 8)
        plain = self.grads(model, x, False)
        calls = [layer.calls for layer in model.layers]
        checked = self.grads(model, x, True)
        # Each block ran its forward twice: once forward, once recomputed in backward.
        self.assertEqual([layer.calls - c for layer, c in zip(model.layers, calls)], [2] * 4)
        for a, b in zip(plain, checked):
            self.assertLess(float((a - b).abs().max()), 1e-6)

    def test_remove_puts_every_forward_back_and_no_grad_runs_once(self):
        model = Transformerish()
        bound = [layer.forward for layer in model.layers]
        handle = apply_checkpointing(model, ["layers.0", "layers.2"])
        self.assertEqual(handle.names, ["layers.0", "layers.2"])
        with torch.no_grad():
            before = model.layers[0].calls
            model(torch.randn(2, 8))
            self.assertEqual(model.layers[0].calls - before, 1)
        handle.remove()
        self.assertNotIn("forward", model.layers[0].__dict__)
        self.assertEqual([layer.forward for layer in model.layers], bound)


class _Mlp(nn.Module):
    def __init__(self, w):
        super().__init__()
        self.n, self.a, self.b = nn.LayerNorm(w), nn.Linear(w, 4 * w), nn.Linear(4 * w, w)

    def forward(self, x):
        return x + self.b(torch.nn.functional.gelu(self.a(self.n(x))))


class _Pool(nn.Module):
    def __init__(self, w, classes):
        super().__init__()
        self.out = nn.Linear(w, classes)

    def forward(self, h):
        return self.out(h.mean(1))


class Costs(unittest.TestCase):
    """block_costs and the planner's model (accumplan/checkpoint.h) against the counting
    allocator's peak of real training steps with the gradients resident (a window's later
    microbatches, where a plan's peak is)."""

    @classmethod
    def setUpClass(cls):
        torch.manual_seed(0)
        cls.model = nn.Sequential(nn.Linear(64, 128), *[_Mlp(128) for _ in range(4)], _Pool(128, 10))
        cls.x, cls.y = torch.randn(32, 16, 64), torch.randint(0, 10, (32,))
        cls.names = checkpoint_candidates(cls.model)
        meter = CpuMeter(held_bytes(cls.model))  # the costs window's meter, as plan() gives it
        try:
            meter.reset_peak()
            cls.costs = block_costs(cls.model, cls.names, lambda: cls.step(32), 32, memory=meter)
        finally:
            meter.close()
        cls.model.zero_grad(set_to_none=True)

    @classmethod
    def step(cls, b):
        nn.functional.cross_entropy(cls.model(cls.x[:b]), cls.y[:b], reduction="sum").backward()

    def peak(self, blocks, b):
        model = self.model
        model.zero_grad(set_to_none=True)
        self.step(b)  # the gradients resident
        meter = CpuMeter(held_bytes(model))
        try:
            with apply_checkpointing(model, [self.names[i] for i in blocks]) if blocks else contextlib.nullcontext():
                meter.reset_peak()
                self.step(b)
                return meter.peak()
        finally:
            meter.close()
            model.zero_grad(set_to_none=True)

    def test_each_block_saves_the_same_and_takes_time(self):
        self.assertEqual([c[0] for c in self.costs], ["1", "2", "3", "4"])
        saved = [c[1] for c in self.costs]
        self.assertGreater(saved[0], 0)
        self.assertEqual(len(set(saved)), 1)  # four identical blocks
        self.assertTrue(all(c[2] > 0 for c in self.costs))

    def test_the_planners_peak_from_measured_costs_is_the_real_peak(self):
        # The no-checkpoint line from two real steps, then the model's prediction per set.
        none16, none32 = self.peak([], 16), self.peak([], 32)
        slope = (none32 - none16) / 16.0
        model = {"intercept_bytes": none32 - 32 * slope, "slope_bytes_per_sample": slope,
                 "blocks": list(self.costs), "head_bytes_per_sample": self.costs.head_bytes_per_sample}
        for blocks in ([1, 3], [0, 1, 2, 3]):
            predicted = _core.checkpoint_peak_bytes(model, blocks, 32)
            measured = self.peak(blocks, 32)
            self.assertLess(abs(predicted / measured - 1), 0.01, (blocks, predicted, measured))
            self.assertLess(measured, none32)
        # No cost per microbatch: recomputing only adds time, so none wins. A large one: fewer,
        # larger checkpointed microbatches win.
        options, chosen = _core.checkpoint_options(model, 256, int(none32 * 0.8))
        self.assertEqual((options[0]["rule"], chosen), ("none", 0))
        model["step_time"] = {"points": [(1, 10.0), (2, 10.0)], "slope_seconds_per_sample": 0.0}
        options, chosen = _core.checkpoint_options(model, 256, int(none32 * 0.8))
        self.assertGreater(options[chosen]["micro_batch"], options[0]["micro_batch"])
        self.assertEqual(options[chosen]["modules"], ["1", "2", "3", "4"])


class _NormBlock(Block):
    """Block with BatchNorm's running statistics, which a forward in training mode moves."""

    def __init__(self, d=16):
        super().__init__(d)
        self.bn = nn.BatchNorm1d(d)

    def forward(self, x):
        return self.bn(super().forward(x))


class CostsLeaveTheStepAlone(unittest.TestCase):
    """block_costs times each forward three times (the step's and two more on the same arguments):
    the step must come out as a plain one, dropout's draws and BatchNorm's statistics included."""

    def run_step(self, model, x, costs):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(5)
        step = lambda: model(x).pow(2).sum().backward()  # noqa: E731
        if costs:
            block_costs(model, ["1", "2", "3"], step, len(x))
        else:
            step()
        return ([p.grad.clone() for p in model.parameters()], [b.clone() for b in model.buffers()],
                torch.get_rng_state())

    def test_gradients_buffers_and_rng_equal_a_plain_steps(self):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), _NormBlock(), _NormBlock(), _NormBlock(), nn.Linear(16, 2)).train()
        x = torch.randn(6, 8)
        start = {k: v.clone() for k, v in model.state_dict().items()}
        plain = self.run_step(model, x, False)
        model.load_state_dict(start)
        calls = [model[i].calls for i in (1, 2, 3)]
        timed = self.run_step(model, x, True)
        self.assertEqual([model[i].calls - c for i, c in zip((1, 2, 3), calls)], [3, 3, 3])
        for a, b in zip(plain[0] + plain[1], timed[0] + timed[1]):
            self.assertTrue(torch.equal(a, b))
        self.assertTrue(torch.equal(plain[2], timed[2]))
        self.assertTrue(all("forward" not in model[i].__dict__ for i in (1, 2, 3)))


class PlanCheckpointing(unittest.TestCase):
    """A plan with `checkpoint` (schema 1.7): train_window applies it for the window only, with the
    same update as without (dropout on); apply_checkpointing wraps for a user's own loop."""

    def plan(self, modules):
        doc = plan_doc([3, 3, 2])
        if modules is not None:
            doc["checkpoint"] = {"modules": modules, "rule": "every 2nd block", "saved_bytes_per_sample": 100.0,
                                 "recompute_seconds": 0.01, "predicted_seconds_per_window": 0.1,
                                 "without": {"micro_batch": None, "accumulation_steps": None, "predicted_peak_bytes": 0,
                                             "predicted_seconds_per_window": 0.0},
                                 "candidates": [{"name": "layers.%d" % i, "saved_bytes_per_sample": 100.0,
                                                 "forward_seconds_per_sample": 0.001} for i in range(4)]}
        return accumplan.load_plan(doc)

    def trained(self, modules, block=Block):
        torch.manual_seed(3)
        model = Transformerish(block=block)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(8, 8), torch.randint(0, 2, (8,))
        torch.manual_seed(4)  # the dropout masks
        st = self.plan(modules).train_window(model, opt, (x,), y)
        return model, st

    def test_train_window_applies_the_plans_checkpointing_with_the_same_update(self):
        plain, _ = self.trained(None)
        checked, st = self.trained(["layers.1", "layers.3"])
        self.assertTrue(st.stepped)
        worst = max((a - b).abs().max().item() for a, b in zip(plain.parameters(), checked.parameters()))
        self.assertLess(worst, 1e-6)
        # Recomputed in backward: the checkpointed blocks ran their forward twice per microbatch.
        self.assertEqual([layer.calls for layer in checked.layers], [3, 6, 3, 6])
        self.assertEqual([layer.calls for layer in plain.layers], [3, 3, 3, 3])
        self.assertTrue(all("forward" not in layer.__dict__ for layer in checked.layers))  # removed after

    def test_a_recomputed_batchnorm_leaves_every_buffer_as_the_window_without_checkpointing(self):
        plain, _ = self.trained(None, _NormBlock)
        checked, _ = self.trained(["layers.1", "layers.3"], _NormBlock)
        self.assertEqual([layer.calls for layer in checked.layers], [3, 6, 3, 6])
        buffers = dict(plain.named_buffers())
        self.assertEqual(int(buffers["layers.1.bn.num_batches_tracked"]), 3)  # once per microbatch
        for name, b in checked.named_buffers():
            self.assertTrue(torch.allclose(b, buffers[name], rtol=0, atol=1e-6), name)
        worst = max((a - b).abs().max().item() for a, b in zip(plain.parameters(), checked.parameters()))
        self.assertLess(worst, 1e-6)

    def test_ctrl_c_in_a_recompute_is_a_keyboard_interrupt_and_unwraps(self):
        class Interrupted(Block):
            def forward(self, x):
                if self.calls == 1:  # its recompute in the first microbatch's backward
                    raise KeyboardInterrupt
                return super().forward(x)
        model = Transformerish(block=Interrupted)
        with self.assertRaises(KeyboardInterrupt):
            self.plan(["layers.1"]).train_window(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                                 (torch.randn(8, 8),), torch.randint(0, 2, (8,)))
        self.assertTrue(all("forward" not in layer.__dict__ for layer in model.layers))  # unwrapped after
        self.assertFalse(interrupted_in_recompute())  # said once: a later error is not taken for it
        # A Ctrl-C noted in a user's own loop (apply_checkpointing) is not taken for a later window's error.
        for layer in model.layers:
            layer.calls = 5  # none raises but layers.1's recompute below
        with apply_checkpointing(model, ["layers.1"]):
            model.layers[1].calls = 0  # its forward runs, its recompute raises
            # autograd hands the interrupt on as itself (torch 2.x) or as a RuntimeError (1.13)
            with self.assertRaises((KeyboardInterrupt, RuntimeError)):
                model(torch.randn(8, 8)).sum().backward()
        model.layers[1].calls = 5

        def mismatched(out, y):
            raise ValueError("shapes do not match")
        with self.assertRaisesRegex(accumplan.PlanError, r"^loss_fn\(output, target\) failed: ValueError: shapes"):
            self.plan(None).train_window(model, torch.optim.SGD(model.parameters(), lr=0.1), (torch.randn(8, 8),),
                                         torch.randint(0, 2, (8,)), loss_fn=mismatched)

    def test_the_hf_export_sets_trainers_flag_only_for_a_transformers_model(self):
        every = ["layers.%d" % i for i in range(4)]
        doc = dict(self.plan(every).raw)
        doc["model"] = dict(doc["model"], hf_gradient_checkpointing=False)
        text = json.loads(accumplan.load_plan(doc).export("hf"))  # a plain nn.Module: the blocks to wrap instead
        self.assertNotIn("gradient_checkpointing", text["TrainingArguments"])
        self.assertTrue(any("plan.apply_checkpointing(model)" in n for n in text["accumplan"]["notes"]))

        class HfLike(Transformerish):
            supports_gradient_checkpointing = True

            def gradient_checkpointing_enable(self, **kwargs):
                pass
        for model, hf in ((Transformerish(), False), (HfLike(), True)):
            planned = accumplan.plan(model, (torch.randn(8, 8),), torch.randint(0, 2, (8,)), target_batch=8,
                                     optimizer=torch.optim.SGD(model.parameters(), lr=0.1), memory_budget="64MiB",
                                     progress=False, eval=False)
            self.assertEqual(planned.model.get("hf_gradient_checkpointing", False), hf)
        doc = dict(self.plan(every).raw)
        doc["model"] = dict(doc["model"], hf_gradient_checkpointing=True)
        self.assertIs(json.loads(accumplan.load_plan(doc).export("hf"))["TrainingArguments"]["gradient_checkpointing"],
                      True)

    def test_apply_checkpointing_for_your_own_loop_and_refusals(self):
        model = Transformerish()
        plan = self.plan(["layers.0"])
        with plan.apply_checkpointing(model) as handle:
            self.assertEqual(handle.names, ["layers.0"])
            self.assertIn("forward", model.layers[0].__dict__)
        self.assertNotIn("forward", model.layers[0].__dict__)
        self.assertIsNone(self.plan(None).apply_checkpointing(model))
        self.assertIsNone(self.plan(None).checkpoint)
        with self.assertRaisesRegex(accumplan.PlanError, r'^to="torchrun" launches `accumplan run`, which cannot apply '
                                                         r"[^-]*plan.train_window$"):
            plan.export("torchrun")
        with self.assertRaisesRegex(ValueError, "layers.9"):
            bad = plan_doc([3, 3, 2])
            bad["checkpoint"] = dict(self.plan(["layers.0"]).checkpoint, modules=["layers.9"])
            accumplan.load_plan(bad)
        other = nn.Sequential(nn.Linear(8, 2))
        with self.assertRaisesRegex(ValueError, r"^plan.checkpoint\['modules'\]\[0\] is 'layers.0', not a submodule"):
            plan.train_window(other, torch.optim.SGD(other.parameters(), lr=0.1), (torch.randn(8, 8),),
                              torch.randint(0, 2, (8,)))
        # Applied twice: refused, so that removing the handles in any order unwraps every forward.
        first = plan.apply_checkpointing(model)
        with self.assertRaisesRegex(ValueError, r"^layers.0 is checkpointed already"):
            plan.apply_checkpointing(model)
        with self.assertRaisesRegex(ValueError, r"^layers.0 is checkpointed already"):
            plan.train_window(model, torch.optim.SGD(model.parameters(), lr=0.1), (torch.randn(8, 8),),
                              torch.randint(0, 2, (8,)), measure_memory=True)
        first.remove()
        self.assertNotIn("forward", model.layers[0].__dict__)
        self.assertTrue(plan.train_window(model, torch.optim.SGD(model.parameters(), lr=0.1), (torch.randn(8, 8),),
                                          torch.randint(0, 2, (8,)), measure_memory=True).stepped)


class _Wide(nn.Module):
    """A residual MLP block whose activations (128 tokens x 256 hidden per sample) dwarf its weights."""

    def __init__(self, d=32, h=256):
        super().__init__()
        self.a, self.b, self.drop = nn.Linear(d, h), nn.Linear(h, d), nn.Dropout(0.1)

    def forward(self, x):
        return x + self.drop(self.b(torch.relu(self.a(x))))


class _Stack(nn.Module):
    """Six _Wide blocks; ``pause`` seconds of fixed cost per forward (a per-microbatch overhead, as a
    GPU's kernel launches are), which makes fewer, larger microbatches faster."""

    def __init__(self, pause=0.0):
        super().__init__()
        self.blocks = nn.ModuleList(_Wide() for _ in range(6))
        self.head = nn.Linear(32, 10)
        self.pause = pause

    def forward(self, x):
        if self.pause:
            time.sleep(self.pause)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(1))


def _setup(pause=0.0, seed=0):
    torch.manual_seed(seed)
    model = _Stack(pause)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3), torch.randn(16, 128, 32), torch.randint(0, 10, (16,))


def _windows(lines):
    """The real windows a plan's progress lines report (the choice's own line is not one)."""
    return [line for line in lines if not line.startswith(("checkpointing:", "not one sample", "eval microbatch"))
            and ": next window [" not in line]  # a window's announcement, before its own line


def _raised(plan, micro):
    """The plan's document with every microbatch at most ``micro`` (a balanced split), unconfirmed."""
    d = dict(plan.raw)
    sizes = accumplan.split_samples(d["per_rank_batch"], micro)
    T = sum(sizes)
    d.update(microbatch_sizes=sizes, weights=[n / T for n in sizes], micro_batch=max(sizes),
             accumulation_steps=len(sizes), max_micro_batch=max(sizes), confirmed=False, confirmed_peak_bytes=None)
    u = accumplan.largest_divisor_at_most(T, max(sizes))
    d["uniform"] = {"micro_batch": u, "accumulation_steps": T // u}
    return accumplan.load_plan(d)


class PlanAuto(unittest.TestCase):
    """accumplan.plan(checkpointing=...) against real training on the counting allocator."""

    def test_a_stack_that_fits_only_checkpointed_gets_a_plan_that_holds(self):
        budget = int(2.6 * 2 ** 20)  # one sample without checkpointing needs about 2.75 MiB
        model, opt, x, y = _setup()
        with self.assertRaises(accumplan.OutOfMemoryAtOne):
            accumplan.plan(model, (x,), y, target_batch=32, optimizer=opt, memory_budget=budget, progress=False)
        plan = accumplan.plan(model, (x,), y, target_batch=32, optimizer=opt, memory_budget=budget,
                              checkpointing="auto", progress=False)
        self.assertTrue(all("forward" not in m.__dict__ for m in model.modules()))  # plan() unwrapped them
        c = plan.checkpoint
        self.assertIsNotNone(c)
        self.assertIsNone(c["without"]["micro_batch"])
        self.assertTrue(plan.confirmed)
        predicted = plan.memory["predicted_peak_bytes"]
        g = torch.Generator().manual_seed(1)
        xs, ys = torch.randn(32, 128, 32, generator=g), torch.randint(0, 10, (32,), generator=g)
        peaks = [plan.train_window(model, opt, (xs,), ys, measure_memory=True).peak_bytes for _ in range(3)]
        self.assertTrue(all(p <= budget for p in peaks), peaks)
        for p in peaks[1:]:  # steady: the optimizer state exists from the first window on
            self.assertLess(abs(p / predicted - 1), 0.01, (peaks, predicted))
        # 1.1x the planned microbatch + 1, the same checkpointing, under the budget: out of memory.
        raised = _raised(plan, int(math.floor(1.1 * plan.micro_batch)) + 1)
        self.assertEqual(raised.checkpoint["modules"], c["modules"])
        meter = CpuMeter(held_bytes(model, opt))
        try:
            meter.limit(budget)
            with self.assertRaises(Exception) as caught:
                raised.train_window(model, opt, (xs,), ys, oom_recovery=False)
            self.assertTrue(meter.oom() or accumplan.is_oom(caught.exception), caught.exception)
        finally:
            meter.close()

    def test_a_per_microbatch_cost_makes_a_checkpointed_set_win_with_one_confirming_window(self):
        budget = 5 * 2 ** 20  # microbatches of 2 without checkpointing, 6 or 7 with every block
        runs = {}
        for mode in ("off", "auto"):
            # 16 microbatches pause 6.4 s, 5 pause 2 s, against about 0.3 s of recomputing every block:
            # the step-time line's intercept stays clearly positive even when a loaded machine slows
            # one of its two probe windows threefold.
            model, opt, x, y = _setup(pause=0.4)
            lines = []
            runs[mode] = (accumplan.plan(model, (x,), y, target_batch=32, optimizer=opt, memory_budget=budget,
                                         checkpointing=mode, progress=lines.append), _windows(lines), lines)
        (off, off_windows, _), (auto, auto_windows, _) = runs["off"], runs["auto"]
        self.assertIsNone(off.checkpoint)
        c = auto.checkpoint
        self.assertIsNotNone(c, auto.reason)
        self.assertGreater(auto.micro_batch, off.micro_batch)
        self.assertEqual(c["without"]["micro_batch"], off.micro_batch)
        self.assertEqual([t["kind"] for t in c["trials"]], ["costs", "confirm"])
        self.assertTrue(auto.confirmed and c["trials"][1]["fit"])
        self.assertLess(c["predicted_seconds_per_window"], c["without"]["predicted_seconds_per_window"])
        self.assertLessEqual(len(auto_windows) - len(off_windows), 2, (off_windows, auto_windows))
        # A window of a second or more (the eval window's, 0.4 s a forward) is announced before it runs.
        self.assertTrue(any(": next window [" in line and "at the pace of the" in line for line in runs["auto"][2]),
                        runs["auto"][2])
        # Every set weighed is in the plan, the chosen one named, and print(plan) shows it and the next best.
        self.assertIsNone(off.checkpoint_choice)
        choice = auto.checkpoint_choice
        self.assertEqual([o["rule"] for o in choice["options"]][0], "none")
        self.assertEqual(len(choice["options"]), 7)
        self.assertEqual(choice["chosen"], c["rule"])
        chosen = next(o for o in choice["options"] if o["rule"] == c["rule"])
        self.assertEqual((chosen["micro_batch"], chosen["modules"]), (auto.micro_batch, c["modules"]))
        self.assertIn("checkpointing: %s (microbatch %d x %d" % (c["rule"], auto.micro_batch, auto.accumulation_steps),
                      str(auto))
        self.assertIn("next best: ", str(auto))
        self.assertIn("the rule: the least predicted seconds per window when at least 10%", str(auto))
        # The chosen checkpointing trains the same update as the same window without it (dropout on).
        plain_doc = dict(auto.raw)
        plain_doc.pop("checkpoint")
        plain_doc.pop("checkpoint_choice")
        trained = []
        for plan in (auto, accumplan.load_plan(plain_doc)):
            model, opt, _, _ = _setup(pause=0.0, seed=5)
            g = torch.Generator().manual_seed(2)
            xs, ys = torch.randn(32, 128, 32, generator=g), torch.randint(0, 10, (32,), generator=g)
            torch.manual_seed(6)  # the dropout masks
            plan.train_window(model, opt, (xs,), ys)
            trained.append(model)
        worst = max((a - b).abs().max().item() for a, b in zip(trained[0].parameters(), trained[1].parameters()))
        self.assertLess(worst, 1e-6)

    def test_auto_keeping_none_still_shows_what_it_weighed(self):
        model, opt, x, y = _setup()
        plan = accumplan.plan(model, (x,), y, target_batch=32, optimizer=opt, memory_budget=64 * 2 ** 20,
                              checkpointing="auto", progress=False, eval=False)
        self.assertIsNone(plan.checkpoint)
        choice = plan.checkpoint_choice
        self.assertEqual(choice["chosen"], "none")
        self.assertEqual(choice["options"][0]["micro_batch"], plan.micro_batch)
        self.assertTrue(all(o["micro_batch"] == 32 for o in choice["options"]), choice)  # all fit whole
        self.assertIn("checkpointing: none (microbatch 32 x 1", str(plan))

    def test_an_explicit_list_is_searched_with(self):
        model, opt, x, y = _setup()
        plan = accumplan.plan(model, (x,), y, target_batch=32, optimizer=opt, memory_budget=5 * 2 ** 20,
                              checkpointing=["blocks.1", "blocks.2", "blocks.3", "blocks.4"], progress=False,
                              eval=False)
        c = plan.checkpoint
        self.assertEqual(c["modules"], ["blocks.1", "blocks.2", "blocks.3", "blocks.4"])
        self.assertEqual([b["name"] for b in c["candidates"]], c["modules"])
        self.assertEqual([t["kind"] for t in c["trials"]], ["costs"])  # the search's own windows ran with it
        self.assertTrue(plan.confirmed)
        self.assertGreater(plan.micro_batch, c["without"]["micro_batch"])

    def test_bad_arguments_are_refused_by_their_python_names_before_any_window(self):
        model, opt, x, y = _setup()
        lines = []

        def plan(**kw):
            return accumplan.plan(model, (x,), y, target_batch=32, optimizer=opt, progress=lines.append, **kw)
        with self.assertRaisesRegex(ValueError, "checkpointing is 'sometimes'; use one of off, auto"):
            plan(checkpointing="sometimes")
        with self.assertRaisesRegex(ValueError, "with checkpointing='off' drop it"):
            plan(checkpoint_candidates=["blocks.0"])
        with self.assertRaisesRegex(ValueError, r"checkpointing\[0\] is 'blocks.9', not a submodule"):
            plan(checkpointing=["blocks.9"])
        with self.assertRaisesRegex(ValueError, "checkpoint_candidates does not list"):
            plan(checkpointing=["blocks.1"], checkpoint_candidates=["blocks.0", "blocks.2"])
        with self.assertRaisesRegex(ValueError, "checkpointing=\\[\\] names no module"):
            plan(checkpointing=[])
        with self.assertRaisesRegex(TypeError, "checkpointing must be 'off', 'auto' or a list"):
            plan(checkpointing=3)
        flat = nn.Sequential(nn.Flatten(), nn.Linear(128 * 32, 10))
        with self.assertRaisesRegex(ValueError, "no repeated blocks to checkpoint"):
            accumplan.plan(flat, (x,), y, target_batch=32, optimizer=torch.optim.SGD(flat.parameters(), lr=0.1),
                           checkpointing="auto", progress=lines.append)
        seqs = [torch.randint(0, 10, (n,)) for n in (5, 7)]
        lm = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8), nn.Linear(8, 10))
        with self.assertRaisesRegex(ValueError, "variable-length data plans without it"):
            accumplan.plan(lm, seqs, None, target_batch=4, optimizer=torch.optim.SGD(lm.parameters(), lr=0.1),
                           checkpointing="auto", checkpoint_candidates=["1"], progress=lines.append)
        self.assertEqual(lines, [])  # not one window ran


if __name__ == "__main__":
    unittest.main()