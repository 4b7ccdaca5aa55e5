"""accumplan.plan leaves the user's training state exactly as it was: a buffer or module a forward
reassigns, the training flag a forward changes, optimizer state with its own dtypes, gradients of
optimizer parameters outside the model, Python's and NumPy's RNGs, grad mode, the default dtype —
also when planning is interrupted (Ctrl-C), even while it puts things back."""
import os
import random
import signal
import unittest

import numpy
import torch

import accumplan
from accumplan import snapshot


class Restless(torch.nn.Module):
    """A forward that changes itself: an EMA buffer reassigned, a module registered on first use,
    eval mode switched on (as some 'freeze BN' code does)."""

    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(6, 12)
        self.l2 = torch.nn.Linear(12, 3)
        self.register_buffer("ema", torch.zeros(12))

    def forward(self, x):
        h = torch.relu(self.l1(x))
        self.ema = 0.9 * self.ema + 0.1 * h.detach().mean(0)  # a new tensor object each call
        if not hasattr(self, "extra"):
            self.extra = torch.nn.Identity()
        self.l1.eval()
        return self.l2(h)


def setup():
    torch.manual_seed(0)
    model = Restless()
    extra = torch.nn.Parameter(torch.ones(4))  # optimized, but not the model's
    opt = torch.optim.Adam([{"params": model.parameters()}, {"params": [extra], "lr": 0.5}], lr=0.01)
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    torch.nn.functional.cross_entropy(model.l2(torch.relu(model.l1(x))), y).backward()
    extra.grad = torch.full((4,), 3.0)
    opt.step()  # the state exists already
    opt.state[extra]["counter"] = torch.tensor(7, dtype=torch.int64)
    opt.state[extra]["wide"] = torch.ones(2, dtype=torch.float64)
    model.l2.weight.grad = torch.full_like(model.l2.weight, 2.0)
    return model, opt, extra, x, y


def state_of(model, opt, extra):
    return {
        "ema_id": id(model.ema), "ema": model.ema.clone(), "has_extra": "extra" in model._modules,
        "training": [m.training for m in model.modules()],
        "params": [p.detach().clone() for p in model.parameters()],
        "grads": [None if p.grad is None else p.grad.clone() for p in list(model.parameters()) + [extra]],
        "state": {(i, k): (v.dtype, v.clone()) if torch.is_tensor(v) else v
                  for i, s in enumerate(opt.state.values()) for k, v in s.items()},
        "lrs": [g["lr"] for g in opt.param_groups],
        "torch_rng": torch.get_rng_state(), "py_rng": random.getstate(), "np_rng": numpy.random.get_state()[1].copy(),
        "grad_enabled": torch.is_grad_enabled(), "dtype": torch.get_default_dtype(),
        # a checkpointing wrap left behind is an instance attribute `forward`
        "own_forwards": [n for n, m in model.named_modules() if "forward" in m.__dict__],
    }


class RaggedRestless(Restless):
    """The same, on token sequences [B, T]: an embedding, the mean over T, then Restless."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 6)

    def forward(self, tokens):
        return super().forward(self.emb(tokens).mean(1))


def ragged_setup():
    """setup() for variable-length data: the state, and a list of sequences of 3 to 24 tokens."""
    torch.manual_seed(0)
    model = RaggedRestless()
    extra = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.Adam([{"params": model.parameters()}, {"params": [extra], "lr": 0.5}], lr=0.01)
    seqs = [torch.randint(0, 20, (n,)) for n in [24] + list(range(3, 18))]
    model(torch.stack([s[:3] for s in seqs])).sum().backward()
    extra.grad = torch.full((4,), 3.0)
    opt.step()
    opt.state[extra]["wide"] = torch.ones(2, dtype=torch.float64)
    model.l2.weight.grad = torch.full_like(model.l2.weight, 2.0)
    return model, opt, extra, seqs, torch.randint(0, 3, (len(seqs),))


def plan(model, opt, x, y, **kw):
    return accumplan.plan(model, (x,), y, target_batch=32, optimizer=opt, memory_budget="64MiB", **kw)


def interrupt_at(n):
    """A progress callback that raises KeyboardInterrupt at its n-th line, as Ctrl-C there would."""
    lines = []

    def progress(line):
        lines.append(line)
        if len(lines) == n:
            raise KeyboardInterrupt
    return progress


class LeavesNothingBehind(unittest.TestCase):
    def setUp(self):
        # Ctrl-C as a terminal delivers it: a process started in the background (`cmd &`) inherits
        # SIGINT ignored, and plan() rightly leaves an ignored SIGINT ignored.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        self.addCleanup(signal.signal, signal.SIGINT, previous)

    def assertSameState(self, before, after):
        for key in before:
            a, b = before[key], after[key]
            if key == "state":
                self.assertEqual(a.keys(), b.keys())
                for k in a:
                    if isinstance(a[k], tuple):
                        self.assertEqual(a[k][0], b[k][0], "optimizer state %s: dtype" % (k,))
                        self.assertTrue(torch.equal(a[k][1], b[k][1]), "optimizer state %s" % (k,))
                    else:
                        self.assertEqual(a[k], b[k])
            elif key in ("params", "grads"):
                for i, (u, v) in enumerate(zip(a, b)):
                    self.assertTrue((u is None and v is None) or torch.equal(u, v), "%s[%d]" % (key, i))
            elif torch.is_tensor(a):
                self.assertTrue(torch.equal(a, b), key)
            elif isinstance(a, numpy.ndarray):
                self.assertTrue((a == b).all(), key)
            else:
                self.assertEqual(a, b, key)

    def test_a_forward_that_changes_the_module_is_undone(self):
        model, opt, extra, x, y = setup()
        before = state_of(model, opt, extra)
        plan(model, opt, x, y, progress=False)
        self.assertSameState(before, state_of(model, opt, extra))

    def test_a_torchscript_module_plans_and_comes_back(self):
        # Its _parameters are read-only wrappers: putting back must not fail with AttributeError
        # after the search had run (the Python-vs-CLI benchmark's TorchScript row).
        torch.manual_seed(0)
        model = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3)))
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
        before = [p.detach().clone() for p in model.parameters()]
        p = plan(model, opt, x, y, progress=False)
        self.assertEqual(sum(p.microbatch_sizes), 32)
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(before, model.parameters())))
        self.assertTrue(all(q.grad is None for q in model.parameters()))
        self.assertEqual(opt.state, {})
        self.assertTrue(model.training)

    def test_an_interrupt_while_planning_restores_and_removes_the_probe(self):
        model, opt, extra, x, y = setup()
        before = state_of(model, opt, extra)
        with self.assertRaises(KeyboardInterrupt):
            plan(model, opt, x, y, progress=interrupt_at(3))  # mid-search: a window has trained the model
        self.assertSameState(before, state_of(model, opt, extra))
        plan(model, opt, x, y, progress=False)  # the counting allocator is gone: a second plan() works

    def test_variable_length_data_is_planned_and_everything_comes_back_also_when_interrupted(self):
        model, opt, extra, seqs, y = ragged_setup()
        before = state_of(model, opt, extra)
        with self.assertRaises(KeyboardInterrupt):  # inside the (b, T) grid: windows have trained the model
            accumplan.plan(model, seqs, y, target_batch=16, optimizer=opt, memory_budget="64MiB",
                           progress=interrupt_at(4))
        self.assertSameState(before, state_of(model, opt, extra))
        p = accumplan.plan(model, seqs, y, target_batch=16, optimizer=opt, memory_budget="64MiB", progress=False)
        self.assertIsNotNone(p.tokens)
        self.assertSameState(before, state_of(model, opt, extra))

    def test_a_sharded_plan_leaves_everything_as_it_was_also_when_interrupted(self):
        # shard= measures with an optimizer of its own over the largest share: the user's
        # optimizer (a foreign parameter, state of other dtypes) and the model come back bitwise.
        for shard in ("optimizer", "auto"):
            with self.subTest(shard=shard):
                model, opt, extra, x, y = setup()
                before = state_of(model, opt, extra)
                with self.assertRaises(KeyboardInterrupt):  # mid-search: a window has trained the model
                    plan(model, opt, x, y, world_size=2, shard=shard, progress=interrupt_at(3))
                self.assertSameState(before, state_of(model, opt, extra))
                plan(model, opt, x, y, world_size=2, shard=shard, progress=False)
                self.assertSameState(before, state_of(model, opt, extra))

    def test_an_interrupt_inside_an_eval_window_restores_modes_and_grad_mode(self):
        # The eval windows run under no_grad with every module in eval mode: a Ctrl-C in
        # their forward must leave the training flags and grad mode as they were too.
        model, opt, extra, x, y = setup()
        before = state_of(model, opt, extra)
        forward, seen = model.forward, []

        def interrupted(*args):
            if not torch.is_grad_enabled():
                seen.append(model.l2.training)
                raise KeyboardInterrupt
            return forward(*args)
        model.forward = interrupted
        with self.assertRaises(KeyboardInterrupt):
            plan(model, opt, x, y, progress=False)
        del model.forward
        self.assertEqual(seen, [False])  # it was inside an eval window, in eval mode
        self.assertSameState(before, state_of(model, opt, extra))
        self.assertIsNotNone(plan(model, opt, x, y, progress=False).eval)  # and nothing was left behind
        self.assertSameState(before, state_of(model, opt, extra))

    def test_an_interrupt_while_putting_back_is_held_until_everything_is_back(self):
        model, opt, extra, x, y = setup()
        before = state_of(model, opt, extra)
        original = snapshot.TrainingState.restore

        def interrupted_restore(self):
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C as the restore starts
            original(self)
        snapshot.TrainingState.restore = interrupted_restore
        try:
            with self.assertRaises(KeyboardInterrupt):
                plan(model, opt, x, y, progress=False)
        finally:
            snapshot.TrainingState.restore = original
        self.assertSameState(before, state_of(model, opt, extra))
        self.assertIs(signal.getsignal(signal.SIGINT), signal.default_int_handler)


if __name__ == "__main__":
    unittest.main()
