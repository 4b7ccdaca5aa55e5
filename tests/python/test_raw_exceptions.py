"""accumplan.plan and train_window never end in a raw exception from deep inside torch or the core
every bad argument is a TypeError/ValueError naming the Python argument before any
window runs, what the user's model or loss_fn raises inside a window is one PlanError line saying
which failed (the original chained), and a refused train_window leaves the weights as they were.
The campaign (scripts/hostile-campaign.py, class python-plan) attacks the same surface wider."""
import os
import subprocess
import unittest

import numpy
import torch

import accumplan


def mlp():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 4))
    return m, torch.optim.SGD(m.parameters(), lr=0.1)


def data(n=8):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g)


def plan(m=None, o=None, inputs=None, target=None, **kw):
    if m is None:
        m, o = mlp()
    if inputs is None:
        x, y = data()
        inputs, target = (x,), y
    kw.setdefault("target_batch", 8)
    kw.setdefault("memory_budget", "64MiB")
    kw.setdefault("progress", False)
    return accumplan.plan(m, inputs, target, optimizer=o, **kw)


def a_plan():
    return plan()


class Module(torch.nn.Module):
    def __init__(self, forward):
        super().__init__()
        self.lin = torch.nn.Linear(16, 4)
        self._forward = forward

    def forward(self, x):
        return self._forward(self, x)


class ArgumentsNamedBeforeAnyWindow(unittest.TestCase):
    def refused(self, kind, pattern, **kw):
        with self.assertRaisesRegex(kind, pattern) as caught:
            plan(**kw)
        self.assertNotIn("\n", str(caught.exception))
        self.assertNotRegex(str(caught.exception), r"(?<![\w-])--[a-z]", "a CLI option in a Python message")

    def test_inputs_that_are_not_tensors_are_named(self):
        x, y = data()
        self.refused(ValueError, r"^inputs is empty", inputs=(), target=y)
        self.refused(TypeError, r"^inputs must be a tensor, a tuple of tensors or a dict of them, not str",
                     inputs="abc", target=y)
        m, o = mlp()
        with self.assertRaisesRegex(TypeError, r"^inputs must be a tensor, .* not NoneType"):
            accumplan.plan(m, None, y, target_batch=8, optimizer=o, progress=False)
        self.refused(TypeError, r"^inputs\[0\] must be a torch.Tensor, not ndarray .*torch.as_tensor",
                     inputs=(numpy.zeros((8, 16), "float32"),), target=y)
        self.refused(ValueError, r"^inputs\[0\] is a sparse_coo tensor", inputs=(x.to_sparse(),), target=y)
        self.refused(ValueError, r"^inputs\[0\] is on the meta device", inputs=(torch.empty(8, 16, device="meta"),),
                     target=y)

    def test_a_target_that_is_not_a_tensor_is_named(self):
        x, y = data()
        self.refused(TypeError, r"^target must be a torch.Tensor, not list", inputs=(x,), target=y.tolist())
        self.refused(TypeError, r"^target must be a torch.Tensor, not ndarray", inputs=(x,), target=y.numpy())
        self.refused(ValueError, r"^target has 7 samples \(dim 0\) but inputs\[0\] has 8", inputs=(x,), target=y[:7])

    def test_cuda_on_a_torch_without_it_is_named(self):
        if torch.cuda.is_available():
            self.skipTest("this torch has CUDA")
        self.refused(ValueError, r"^device 'cuda': this torch \(.*\) sees no CUDA device", device="cuda")

    def test_optimizers_a_plan_cannot_use_are_named(self):
        m, o = mlp()
        other, _ = mlp()
        self.refused(TypeError, r"^optimizer must be a torch.optim.Optimizer, not str", m=m, o="adam")
        self.refused(ValueError, r"^optimizer holds none of the model's trainable parameters", m=m,
                     o=torch.optim.SGD(other.parameters(), lr=0.1))
        self.refused(TypeError, r"^optimizer must be a torch.optim SGD, Adam, .* not LBFGS", m=m,
                     o=torch.optim.LBFGS(m.parameters()))
        o.param_groups[0]["lr"] = float("nan")
        self.refused(ValueError, r"^optimizer: SGD's lr is nan", m=m, o=o)

    def test_the_cores_refusals_are_in_python_words(self):
        self.refused(ValueError, r"^normalization 'nope' is unknown", normalization="nope")
        self.refused(ValueError, r"^amp must be", amp="fp8")
        self.refused(TypeError, r"^progress must be True, False or a callable", progress=5)


class UserCodeInAWindowIsOneLine(unittest.TestCase):
    def planned_with(self, forward, pattern, **kw):
        m = Module(forward)
        o = torch.optim.SGD(m.parameters(), lr=0.1)
        before = [p.detach().clone() for p in m.parameters()]
        with self.assertRaisesRegex(accumplan.PlanError, pattern) as caught:
            plan(m, o, **kw)
        self.assertNotIn("\n", str(caught.exception))
        self.assertTrue(all(torch.equal(a, p) for a, p in zip(before, m.parameters())), "the weights changed")
        return caught.exception

    def test_a_dtype_the_model_rejects_names_the_inputs(self):
        x, y = data()
        e = self.planned_with(lambda self, x: self.lin(x),
                              r"^the model's forward on a microbatch of \d+ samples \(inputs float64\[\d+, 16\]\) "
                              r"failed: RuntimeError: ", inputs=(x.double(),), target=y)
        self.assertIsInstance(e.__cause__, RuntimeError)

    def test_lengths_for_inputs_without_a_sequence_dimension_are_named_when_the_forward_fails(self):
        m = Module(lambda self, x: self.lin(x))
        o = torch.optim.SGD(m.parameters(), lr=0.1)
        x, y = data()
        with self.assertRaisesRegex(accumplan.PlanError, r"^the model's forward on a microbatch of \d+ samples "
                                    r"\(inputs float32\[\d+, 1\], each cut along dim 1 to the longest of its "
                                    r"lengths=\) failed: "):
            a_plan().train_window(m, o, (x,), y, lengths=[1] * 8)

    def test_an_output_that_does_not_require_grad_is_named(self):
        self.planned_with(lambda self, x: self.lin(x).detach(), r"^the loss does not require grad")

    def test_a_multi_line_error_from_the_model_is_its_first_line(self):
        def forward(self, x):
            raise NotImplementedError("first\nsecond")
        self.planned_with(forward, r"failed: NotImplementedError: first$")

    def test_an_error_whose_message_cannot_be_read_is_still_one_line(self):
        class Unreadable(Exception):
            def __str__(self):
                raise RuntimeError("no message")

        def forward(self, x):
            raise Unreadable()
        self.planned_with(forward, r"failed: Unreadable: \(its message could not be read\)$")

    def test_the_optimizers_and_the_schedulers_own_errors_are_one_line(self):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(10, 4, sparse=True), torch.nn.Flatten(), torch.nn.Linear(8, 3))
        x, y = torch.randint(0, 10, (8, 2)), torch.randint(0, 3, (8,))
        adam = torch.optim.Adam(model.parameters(), lr=0.01)
        with self.assertRaisesRegex(accumplan.PlanError, r"^the optimizer's step \(Adam\) failed: RuntimeError: "
                                                         r"Adam does not support sparse gradients"):
            accumplan.plan(model, (x,), y, target_batch=8, optimizer=adam, progress=False, eval=False)

        class Broken:
            def step(self):
                raise KeyError("a scheduler's own bug")
        m, o = mlp()
        x, y = data()
        with self.assertRaisesRegex(accumplan.PlanError, r"^the scheduler's step \(Broken\) failed: KeyError"):
            a_plan().train_window(m, o, (x,), y, scheduler=Broken())

    def test_a_group_after_the_process_group_was_destroyed_is_named(self):
        import torch.distributed as dist
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        group = dist.group.WORLD
        dist.destroy_process_group()
        m, o = mlp()
        x, y = data()
        before = [p.detach().clone() for p in m.parameters()]
        with self.assertRaisesRegex(ValueError, r"^group: torch.distributed is not initialized"):
            a_plan().train_window(m, o, (x,), y, group=group)
        self.assertTrue(all(torch.equal(b, p) for b, p in zip(before, m.parameters())))

    def test_a_model_whose_loss_is_nan_is_refused_not_planned(self):
        m, o = mlp()
        with torch.no_grad():
            m[0].weight.fill_(float("nan"))
        with self.assertRaisesRegex(accumplan.PlanError, r"^the loss of the first window \(2 samples\) is nan, so the "
                                                         r"optimizer cannot step"):
            plan(m, o)

    def test_a_model_loss_that_is_not_a_tensor_is_named(self):
        x, y = data()
        self.planned_with(lambda self, x: {"loss": 3},
                          r"^the model returned 'loss': int \(3\), not a tensor$", loss="model", inputs=(x,), target=None)

    def test_a_dict_batch_with_a_flag_plans_trains_and_evaluates(self):
        class WithFlag(torch.nn.Module):  # a Hugging Face style keyword that is no tensor
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(16, 4)

            def forward(self, x, use_cache=True):
                assert use_cache is False, "the flag reached every microbatch unchanged"
                return self.lin(x)
        m = WithFlag()
        o = torch.optim.SGD(m.parameters(), lr=0.1)
        x, y = data()
        p = plan(m, o, inputs={"x": x, "use_cache": False}, target=y)
        self.assertEqual(p.train_window(m, o, {"x": x, "use_cache": False}, y).samples, 8)
        self.assertEqual(p.evaluate(m, {"x": x, "use_cache": False}, y).samples, 8)

    def test_empty_checkpoint_candidates_are_refused_whatever_the_progress(self):
        for progress in (False, True):
            with self.subTest(progress=progress), self.assertRaisesRegex(ValueError, r"^checkpoint_candidates=\[\] names no"):
                plan(checkpointing="auto", checkpoint_candidates=[], progress=progress)

    def test_loss_fn_returning_a_float_or_a_vector_is_named_before_backward(self):
        x, y = data()
        for loss_fn, pattern in [(lambda out, t: 1.0, r"^loss_fn returned float \(1.0\)"),
                                 (lambda out, t: (out * 1).sum(1), r"^loss_fn returned a float32 tensor of shape \[\d+\]"),
                                 (lambda out, t: None, r"^loss_fn returned NoneType")]:
            with self.subTest(pattern=pattern):
                self.planned_with(lambda self, x: self.lin(x), pattern, loss_fn=loss_fn)


class RaggedItemsNamed(unittest.TestCase):
    def test_meta_sparse_and_empty_items_are_named_in_each_callers_words(self):
        m = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10))
        o = torch.optim.SGD(m.parameters(), lr=0.1)
        small = plan(m, o, [torch.ones(n, dtype=torch.long) for n in (8, 6, 8, 5)], None, target_batch=4)
        ok, meta = torch.ones(5, dtype=torch.long), torch.ones(3, dtype=torch.long, device="meta")
        sparse = torch.ones(3, dtype=torch.long).to_sparse()
        cases = [([meta, ok], None, r"\[0\] is on the meta device \(no data\); pass real tensors"),
                 ([sparse, ok], None, r"\[0\] is a sparse_coo tensor; pass a dense one \(\.to_dense\(\)\)"),
                 ([{}, {}], None, r"\[0\] is empty; every sequence needs at least one token \(input_ids"),
                 ([{"input_ids": meta}, {"input_ids": ok}], None, r"\[0\]\['input_ids'\] is on the meta device"),
                 ([ok[:3], ok], [sparse, ok], r"\[0\] is a sparse_coo tensor")]
        for x, t, pattern in cases:
            first = "targets" if t is not None else "sequences"
            calls = [(first, lambda: accumplan.pad_sequences(x, t) if t is not None or isinstance(x[0], dict)
                      else accumplan.pad_sequences(x, next_token=True)),
                     ("target" if t is not None else "inputs", lambda: plan(m, o, x, t, target_batch=2)),
                     ("target" if t is not None else "inputs", lambda: small.train_window(m, o, x, t))]
            for name, call in calls:
                with self.subTest(pattern, name=name), self.assertRaisesRegex(ValueError, "^" + name + pattern):
                    call()


class TrainWindowRefusesBeforeItSteps(unittest.TestCase):
    def test_bad_objects_leave_the_weights_as_they_were(self):
        p = a_plan()
        for kw, pattern in [({"scheduler": 5}, r"^scheduler must be an LR scheduler"),
                            ({"scaler": 5}, r"^scaler must be a torch.cuda.amp.GradScaler"),
                            ({"on_oom": 5}, r"^on_oom must be a callable"),
                            ({"oom_recovery": "yes"}, r"^oom_recovery must be True or False")]:
            with self.subTest(kw=kw):
                m, o = mlp()
                x, y = data()
                before = [t.detach().clone() for t in m.parameters()]
                with self.assertRaisesRegex(TypeError, pattern):
                    p.train_window(m, o, (x,), y, **kw)
                self.assertTrue(all(torch.equal(a, t) for a, t in zip(before, m.parameters())))
                self.assertTrue(all(t.grad is None for t in m.parameters()))

    def test_model_and_optimizer_are_checked(self):
        p = a_plan()
        m, o = mlp()
        x, y = data()
        with self.assertRaisesRegex(TypeError, r"^model must be a torch.nn.Module, not int"):
            p.train_window(5, o, (x,), y)
        with self.assertRaisesRegex(TypeError, r"^optimizer must be a torch.optim.Optimizer, not str"):
            p.train_window(m, "sgd", (x,), y)


class HostMemory(unittest.TestCase):
    def test_a_window_tiled_past_the_host_data_limit_is_refused_before_it_is_allocated(self):
        os.environ["ACCUMPLAN_MAX_HOST_DATA"] = "1MiB"
        try:
            # 64 samples of 64 KiB: the persistent step's two fit, a window of 32 would not.
            m = torch.nn.Sequential(torch.nn.Linear(16384, 2))
            o = torch.optim.SGD(m.parameters(), lr=0.1)
            with self.assertRaisesRegex(accumplan.PlanError, r"a window of \d+ samples tiled from inputs and target "
                                        r"would take .*\(ACCUMPLAN_MAX_HOST_DATA raises it\).*target_batch"):
                plan(m, o, (torch.zeros(4, 16384),), torch.zeros(4, dtype=torch.long), target_batch=64,
                     memory_budget="1GiB")
        finally:
            del os.environ["ACCUMPLAN_MAX_HOST_DATA"]

    def test_ragged_data_padded_past_the_host_data_limit_is_refused_before_it_is_allocated(self):
        # 2,000 one-token sequences and one of 1,000 tokens: 2,001 x 1,000 positions padded, 32 MB.
        seqs = [torch.ones(1, dtype=torch.long)] * 2000 + [torch.ones(1000, dtype=torch.long)]
        examples = [{"input_ids": s, "labels": s} for s in seqs]
        m = torch.nn.Sequential(torch.nn.Embedding(4, 4), torch.nn.Linear(4, 4))
        o = torch.optim.SGD(m.parameters(), lr=0.1)
        small = accumplan.plan(m, [torch.ones(n, dtype=torch.long) for n in (8, 6, 8, 5)], None, target_batch=4, optimizer=o,
                               memory_budget="64MiB", progress=False)
        calls = {"pad_sequences": lambda: accumplan.pad_sequences(seqs, next_token=True),
                 "pad_sequences(examples)": lambda: accumplan.pad_sequences(examples),
                 "plan": lambda: plan(m, o, seqs, None, target_batch=2),
                 "train_window": lambda: small.train_window(m, o, seqs, None)}
        os.environ["ACCUMPLAN_MAX_HOST_DATA"] = "1MiB"
        try:
            for name, call in calls.items():
                with self.subTest(name), self.assertRaisesRegex(ValueError, r"^2001 sequences padded to the longest, "
                                                                r"1000 tokens, would take .* more than the 1.0 MiB "
                                                                r"allowed .*plan.pack groups them by length"):
                    call()
        finally:
            del os.environ["ACCUMPLAN_MAX_HOST_DATA"]

    def test_persistent_memory_over_the_budget_is_measured_within_the_host_data_limit(self):
        # Python and the CLI: the attempt without the budget is held to ACCUMPLAN_MAX_HOST_DATA, not
        # unbounded (a 64 MiB budget's fallback once took 1.2 GiB of the host).
        m = torch.nn.Sequential(torch.nn.Linear(512, 512))  # 1 MiB of weights, 2 more of Adam state
        o = torch.optim.Adam(m.parameters())
        os.environ["ACCUMPLAN_MAX_HOST_DATA"] = "1MiB"
        try:
            with self.assertRaisesRegex(accumplan.OutOfMemoryAtOne, r"do not fit on .* even without the budget, within "
                                        r"the host-data limit of 1.0 MiB \(ACCUMPLAN_MAX_HOST_DATA raises it\)"):
                plan(m, o, (torch.zeros(4, 512),), torch.zeros(4, dtype=torch.long), memory_budget=1024)
        finally:
            del os.environ["ACCUMPLAN_MAX_HOST_DATA"]
        binary = os.environ.get("ACCUMPLAN_BIN")
        if not binary:
            self.skipTest("ACCUMPLAN_BIN is not set (scripts/test.sh sets it)")
        run = subprocess.run([binary, "--model", "builtin:mlp", "--target-batch", "8", "--device", "cpu",
                              "--memory-budget", "1KiB", "--optimizer", "adam", "--progress", "none"],
                             env=dict(os.environ, ACCUMPLAN_MAX_HOST_DATA="1MiB"), capture_output=True, text=True)
        self.assertEqual(run.returncode, 2, run.stderr)
        self.assertEqual(run.stdout, "")
        self.assertRegex(run.stderr.splitlines()[-1], r"^accumplan: error: .* even without the budget, within the "
                         r"host-data limit of 1.0 MiB")


if __name__ == "__main__":
    unittest.main()
