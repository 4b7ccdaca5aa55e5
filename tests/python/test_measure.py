"""accumplan.plan: planning an unscripted nn.Module in-process, on the C++ search and probe.

What it checks: the plan's window is one the budget allows and a real window ran at; planning
leaves the model, its gradients, the optimizer and the RNG exactly as they were and removes the
budget; a Hugging Face-style dict model with its own loss plans and trains; a mean loss_fn and
bad arguments are refused before anything changes; batch-dependent layers are warned about; the
saved plan is the file the CLI reads. Small models, so each plan takes well under a second.
What it is not: the comparison with the CLI on real models (tests/bench/python_vs_cli.py)."""
import collections
import functools
import os
import subprocess
import tempfile
import unittest
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

import accumplan
from helpers import ROOT

BIN = os.environ.get("ACCUMPLAN_BIN", os.path.join(ROOT, "build", "accumplan"))


class Net(nn.Module):
    """BatchNorm (buffers that training changes) and dropout (draws from the RNG)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.bn, self.drop, self.fc2 = nn.Linear(32, 256), nn.BatchNorm1d(256), nn.Dropout(0.3), nn.Linear(256, 10)

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.bn(self.fc1(x)))))


class Output:
    """What a Hugging Face model returns: an object with .loss and .logits."""

    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits


class TinyLM(nn.Module):
    """An HF-style causal LM: model(input_ids=..., attention_mask=..., labels=...) -> Output."""

    def __init__(self, vocab=50, d=32):
        super().__init__()
        self.emb, self.head = nn.Embedding(vocab, d), nn.Linear(d, vocab)

    def forward(self, input_ids, attention_mask=None, labels=None):
        h = self.emb(input_ids)
        if attention_mask is not None:
            h = h * attention_mask.unsqueeze(-1)
        logits = self.head(torch.tanh(h))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
        return Output(loss, logits)


def data(n=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 32, generator=g), torch.randint(0, 10, (n,), generator=g)


def trained(model, opt, x, y):
    """One real step first: the optimizer has state and the parameters have gradients."""
    F.cross_entropy(model(x), y).backward()
    opt.step()
    F.cross_entropy(model(x), y).backward()  # gradients left in place, as a user's loop may
    return model, opt


def state_of(model, opt):
    return ([t.detach().clone() for t in model.state_dict().values()],
            [None if p.grad is None else p.grad.clone() for p in model.parameters()],
            {k: {n: (v.clone() if torch.is_tensor(v) else v) for n, v in s.items()} for k, s in opt.state_dict()["state"].items()},
            [dict(g) for g in opt.state_dict()["param_groups"]], torch.get_rng_state())


def same(a, b):
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


BUDGET = 3 << 20  # 3 MiB: the windows of Net fit a few hundred samples


class PlanTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.x, self.y = data()
        self.model = Net()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        trained(self.model, self.opt, self.x, self.y)

    def plan(self, **kw):
        args = dict(target_batch=512, optimizer=self.opt, memory_budget=BUDGET, progress=False)
        args.update(kw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return accumplan.plan(self.model, (self.x,), self.y, **args)

    def test_plan_is_a_window_a_real_window_ran_at_within_the_budget(self):
        plan = self.plan()
        self.assertTrue(plan.confirmed, plan.reason)
        self.assertEqual(sum(plan.microbatch_sizes), 512)
        self.assertLessEqual(plan.memory["predicted_peak_bytes"], BUDGET)
        ran = [max(t["window"]) for t in plan.profile["trials"] if t["fit"]]
        self.assertGreaterEqual(max(ran), plan.micro_batch, plan.profile["trials"])
        self.assertEqual(plan.setup["optimizer"], "adam")
        self.assertEqual(plan.profile["probe"], "cpu-counting")
        self.assertEqual(plan.profile["setup"]["inputs"], ["float32[B,32]"])
        self.assertEqual(plan.profile["setup"]["target"], "int64[B]:10")

    def test_a_parameter_the_optimizer_holds_beside_the_model_counts_with_the_weights(self):
        foreign = torch.nn.Parameter(torch.zeros(64, 64))
        opt = torch.optim.SGD(list(self.model.parameters()) + [foreign], lr=0.1)
        model_bytes = sum(t.numel() * t.element_size() for t in list(self.model.parameters()) + list(self.model.buffers()))
        plan = self.plan(optimizer=opt, target_batch=64)
        self.assertEqual(plan.memory["weights_bytes"], model_bytes + 64 * 64 * 4)
        x, y = self.x[:64], self.y[:64]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            st = plan.train_window(self.model, opt, (x,), y, measure_memory=True)
        self.assertGreaterEqual(st.peak_bytes, model_bytes + 64 * 64 * 4)

    def test_planning_leaves_model_optimizer_and_rng_untouched(self):
        before = state_of(self.model, self.opt)
        self.plan()
        after = state_of(self.model, self.opt)
        for what, a, b in zip(("parameters and buffers", "gradients", "optimizer state", "param groups", "rng"),
                              before, after):
            self.assertTrue(same(a, b), what)

    def test_a_window_says_whether_the_optimizer_state_existed_before_it(self):
        for opt in (torch.optim.AdamW, functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9)):
            model, ready = Net(), [False, True, True]  # the first step creates the state
            optimizer = opt(model.parameters())
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                plan = accumplan.plan(model, (self.x,), self.y, target_batch=64, optimizer=optimizer,
                                      memory_budget=BUDGET, progress=False)
                stats = [plan.train_window(model, optimizer, (self.x[:64],), self.y[:64]) for _ in range(3)]
            self.assertEqual([s.optimizer_state_ready for s in stats], ready, opt)
            self.assertIn("optimizer_state_ready=%s" % ready[0], repr(stats[0]))

    def test_no_budget_stays_installed(self):
        self.plan()
        big = torch.empty(2 * BUDGET, dtype=torch.uint8)  # past the budget: would raise if it were still enforced
        big.fill_(1)
        self.assertEqual(int(big[-1]), 1)

    def test_batchnorm_is_warned_about(self):
        with self.assertWarnsRegex(UserWarning, r"batch-dependent layer.*bn \(BatchNorm1d\)"):
            accumplan.plan(self.model, (self.x,), self.y, target_batch=64, optimizer=self.opt,
                           memory_budget=BUDGET, progress=False)

    def test_saved_plan_is_the_file_the_cli_reads(self):
        plan = self.plan()
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "plan.json")
            plan.save(path)
            self.assertEqual(accumplan.load_plan(path).microbatch_sizes, plan.microbatch_sizes)
            if os.path.exists(BIN):
                out = subprocess.run([BIN, "export", "--plan", path, "--to", "accelerate"], capture_output=True, text=True)
                self.assertEqual(out.returncode, 0, out.stderr)
                self.assertIn(str(len(plan.microbatch_sizes)), out.stdout)

    def test_persistent_memory_alone_over_the_budget_is_refused_and_nothing_changes(self):
        before = state_of(self.model, self.opt)
        with self.assertRaisesRegex(accumplan.OutOfMemoryAtOne, "persistent memory alone is .*Raise"):
            self.plan(memory_budget=64 << 10)
        self.assertTrue(same(before, state_of(self.model, self.opt)))
        torch.empty(1 << 20, dtype=torch.uint8).fill_(0)  # the 64 KiB budget is gone

    def test_mean_loss_fn_is_refused_naming_the_fix_and_nothing_changes(self):
        before = state_of(self.model, self.opt)
        with self.assertRaisesRegex(ValueError, r"reduction='sum'"):
            self.plan(loss_fn=F.cross_entropy)
        self.assertTrue(same(before, state_of(self.model, self.opt)))

    def test_sum_loss_fn_plans(self):
        plan = self.plan(loss_fn=functools.partial(F.cross_entropy, reduction="sum"))
        self.assertEqual(sum(plan.microbatch_sizes), 512)

    def test_max_micro_batch_bounds_the_plan_as_the_cli_option_does(self):
        free = self.plan()
        bound = max(1, free.micro_batch // 3)
        plan = self.plan(max_micro_batch=bound)
        self.assertLess(bound, free.micro_batch)
        self.assertLessEqual(max(plan.microbatch_sizes), bound)
        self.assertEqual(sum(plan.microbatch_sizes), 512)
        self.assertIn("bounds the microbatch at %d (memory alone would allow" % bound, plan.reason)

    def test_bad_arguments_are_refused_before_any_window(self):
        cases = [
            (dict(target_batch=0), ValueError, "target_batch"),
            (dict(max_micro_batch=0), ValueError, "max_micro_batch"),
            (dict(max_micro_batch=2.5), TypeError, "max_micro_batch"),
            (dict(memory_budget="12 parsecs"), ValueError, "12 parsecs"),
            (dict(headroom="lots"), ValueError, "lots"),
            (dict(device="cuda:0" if not torch.cuda.is_available() else "meta"), ValueError, "device"),
            (dict(optimizer=torch.optim.LBFGS(self.model.parameters())), TypeError, "LBFGS"),
            (dict(world_size=3), ValueError, "3"),
            (dict(loss="hinge"), ValueError, "hinge"),
            (dict(device="tpu:x"), ValueError, "tpu:x"),
            (dict(headroom=[0.1]), TypeError, "headroom"),
        ]
        for kw, error, text in cases:
            calls = []
            with self.subTest(kw=kw):
                with self.assertRaisesRegex(error, text):
                    self.plan(progress=calls.append, **kw)
                self.assertEqual(calls, [], "a window ran before the argument was refused")


class OptimizerTableTest(unittest.TestCase):
    """accumplan.plan names the user's optimizer by the C++ table (_core.optimizer_table): its
    torch class, the most derived one, and the keywords that fix it (SGD's momentum 0 is sgd)."""

    def test_each_row_recognises_its_torch_class(self):
        from accumplan import _core
        from accumplan.measure import _optimizer_row
        params = [torch.nn.Parameter(torch.zeros(2))]
        for name, row in _core.optimizer_table().items():
            with self.subTest(name=name):
                cls = getattr(torch.optim, row["torch_class"])
                kwargs = {"momentum": 0.5} if name == "momentum" else {}
                self.assertEqual(_optimizer_row(cls(params, lr=0.1, **kwargs))[0], name)

        class MyAdamW(torch.optim.AdamW):  # a subclass is its base's row, AdamW before Adam
            pass
        self.assertEqual(_optimizer_row(MyAdamW(params))[0], "adamw")
        with self.assertRaisesRegex(TypeError, "SGD, Adam, AdamW, Adagrad, RMSprop.*not LBFGS"):
            _optimizer_row(torch.optim.LBFGS(params))


class DictModelTest(unittest.TestCase):
    def test_hf_style_dict_model_with_its_own_loss_plans_and_trains(self):
        torch.manual_seed(0)
        model = TinyLM()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        ids = torch.randint(0, 50, (8, 12))
        batch = {"input_ids": ids, "attention_mask": torch.ones(8, 12), "labels": ids}
        plan = accumplan.plan(model, batch, None, loss="model", target_batch=64, optimizer=opt,
                              memory_budget=1 << 20, progress=False)
        self.assertEqual(sum(plan.microbatch_sizes), 64)
        self.assertEqual(plan.setup["optimizer"], "momentum")
        high = int(ids.max()) + 1  # integers are specified by the largest the data holds
        self.assertEqual(plan.setup["inputs"], ["int64[B,12]:%d" % high, "float32[B,12]", "int64[B,12]:%d" % high])
        # A tokenizer's BatchEncoding is a UserDict, not a dict: taken as model(**window) too.
        window = collections.UserDict({k: v.repeat(8, 1) for k, v in batch.items()})
        before = [p.detach().clone() for p in model.parameters()]
        st = accumplan.train_window(plan, model, opt, window, loss="model")
        self.assertTrue(st.stepped)
        self.assertEqual(sum(st.microbatch_sizes), 64)
        self.assertTrue(torch.isfinite(torch.tensor(st.loss)))
        self.assertTrue(any(not torch.equal(a, b) for a, b in zip(before, model.parameters())))

    def test_labels_outside_the_dict_are_refused(self):
        model = TinyLM()
        ids = torch.randint(0, 50, (4, 6))
        with self.assertRaisesRegex(ValueError, "labels from the dict"):
            accumplan.plan(model, {"input_ids": ids}, ids, loss="model", target_batch=8,
                           optimizer=torch.optim.SGD(model.parameters(), lr=0.1), progress=False)


if __name__ == "__main__":
    unittest.main()
