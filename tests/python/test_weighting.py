"""Accumulated gradients equal the whole window's gradient: equal, uneven, partial and
token-weighted windows, through plan.split (your own loop) and plan.train_window."""
import functools
import unittest
import warnings

import torch

from helpers import (Classifier, TinyLM, classifier_data, full_batch_grads, make_plan, params_of,
                     token_data)

import accumplan

RTOL, ATOL = 1e-5, 1e-6


class Weighting(unittest.TestCase):
    def assertAllClose(self, got, want):
        self.assertEqual(len(got), len(want))
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=RTOL, atol=ATOL)

    def split_grads(self, plan, model, x, y, **kw):
        model.zero_grad(set_to_none=True)
        used = []
        for (inputs, target), scale in plan.split((x,), y, **kw):
            used.append(target.shape[0])
            out, _ = accumplan.model_output(model(*inputs))
            norm = accumplan.resolve_normalization(plan.normalization, plan.loss, target)
            (scale * accumplan.loss_sum(out, target, plan.loss, norm)).backward()
        grads = [p.grad.detach().clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        return grads, used

    def check_classifier(self, sizes, window):
        plan = make_plan(sizes)
        model = Classifier()
        x, y = classifier_data(window)
        want = full_batch_grads(model, x, y)
        got, used = self.split_grads(plan, model, x, y)
        self.assertAllClose(got, want)
        return plan, used

    def test_equal_microbatches(self):
        _, used = self.check_classifier([4, 4, 4, 4], 16)
        self.assertEqual(used, [4, 4, 4, 4])

    def test_uneven_microbatches(self):
        _, used = self.check_classifier([7, 7, 6, 6], 26)
        self.assertEqual(used, [7, 7, 6, 6])

    def test_partial_last_window(self):
        _, used = self.check_classifier([7, 7, 6, 6], 10)  # a short window of 10: 5,5 under 7
        self.assertEqual(used, [5, 5])

    def test_a_mean_of_microbatch_means_is_not_the_window_mean(self):
        # The test above can fail: weighting 8,8,8,2 as 1/4 each gives another gradient.
        model = Classifier()
        x, y = classifier_data(26)
        want = full_batch_grads(model, x, y)
        model.zero_grad(set_to_none=True)
        for s, n in ((0, 8), (8, 8), (16, 8), (24, 2)):
            (torch.nn.functional.cross_entropy(model(x[s:s + n]), y[s:s + n]) / 4).backward()
        naive = [p.grad for p in model.parameters()]
        self.assertFalse(all(torch.allclose(g, w, rtol=RTOL, atol=ATOL) for g, w in zip(naive, want)))

    def test_token_weighted_windows(self):
        # Different numbers of valid tokens per microbatch: N is the window's valid tokens.
        plan = make_plan([4, 3, 3], normalization="auto")
        model = TinyLM()
        for window in (10, 5):  # full, and a short last window
            x, y = token_data(window)
            want = full_batch_grads(model, x, y, tokens=True)
            got, _ = self.split_grads(plan, model, x, y)
            self.assertAllClose(got, want)
        # the same window in samples mode is a different (per-sample mean) objective
        x, y = token_data(10)
        samples, _ = self.split_grads(plan, model, x, y, normalization="samples")
        self.assertFalse(all(torch.allclose(g, w, rtol=RTOL, atol=ATOL) for g, w in
                             zip(samples, full_batch_grads(model, x, y, tokens=True))))

    def test_train_window_updates_like_one_big_batch(self):
        # SGD(lr): the update is -lr x the full-batch gradient; TorchScript and dict outputs too.
        cases = [([7, 7, 6, 6], 26, Classifier, classifier_data, False),
                 ([7, 7, 6, 6], 11, Classifier, classifier_data, False),
                 ([4, 3, 3], 10, TinyLM, token_data, True)]
        for sizes, window, make_model, data, tokens in cases:
            for scripted in (False, True):
                plan = make_plan(sizes)
                model = make_model()
                x, y = data(window)
                want = [p - 0.5 * g for p, g in zip(params_of(model), full_batch_grads(model, x, y, tokens=tokens))]
                m = torch.jit.script(model) if scripted else model
                opt = torch.optim.SGD(m.parameters(), lr=0.5)
                stats = plan.train_window(m, opt, (x,), y, loss="cross_entropy")
                self.assertTrue(stats.stepped)
                self.assertEqual(stats.samples, window)
                self.assertEqual(stats.units, int(y.ne(-100).sum()) if tokens else window)
                self.assertEqual(sum(stats.microbatch_sizes), window)
                self.assertAllClose(params_of(m), want)

    def test_a_float64_model_trains_in_float64(self):
        # The window's update equals PyTorch's own float64 full-batch step to 1e-12 (a loss summed in
        # float32 misses by about 1e-8), for cross-entropy, mse and a model's own mean loss.
        torch.manual_seed(5)
        x = torch.randn(12, 6, dtype=torch.float64)
        labels, values = torch.randint(0, 3, (12,)), torch.randn(12, 3, dtype=torch.float64)
        mean_losses = {"cross_entropy": (labels, torch.nn.functional.cross_entropy),
                       "mse": (values, torch.nn.functional.mse_loss)}
        for loss, (y, mean_loss) in mean_losses.items():
            torch.manual_seed(6)
            model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()
            reference = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()
            reference.load_state_dict(model.state_dict())
            before = params_of(model)
            mean_loss(reference(x), y).backward()
            torch.optim.SGD(reference.parameters(), lr=0.5).step()
            make_plan([5, 4, 3]).train_window(model, torch.optim.SGD(model.parameters(), lr=0.5), (x,), y, loss=loss)
            for b, g, w in zip(before, params_of(model), params_of(reference)):
                self.assertEqual(g.dtype, torch.float64)
                # The updates, not the parameters: a parameter's size would hide the update's error.
                torch.testing.assert_close(g - b, w - b, rtol=1e-12, atol=0, msg=lambda m: "%s: %s" % (loss, m))

    def test_a_mean_loss_fn_is_refused_before_its_first_backward(self):
        # F.cross_entropy as everyone writes it returns a mean: weighting its microbatches as sums
        # would silently train with another gradient (0.039 away on this window).
        plan = make_plan([5, 4, 3])
        model = Classifier()
        x, y = classifier_data(12)
        before = [p.detach().clone() for p in model.parameters()]
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        with self.assertRaisesRegex(ValueError, r"loss_fn must return the SUM over the microbatch's samples: for "
                                                r"samples 0 and 1 it returned .*, but .* for them one at a time "
                                                r"\(a mean\?\); pass reduction='sum'"):
            plan.train_window(model, opt, (x,), y, loss_fn=torch.nn.functional.cross_entropy)
        self.assertTrue(all(p.grad is None for p in model.parameters()))  # no backward ran
        self.assertAllClose(params_of(model), before)

    def test_a_sum_loss_fn_updates_like_one_big_batch(self):
        plan = make_plan([5, 4, 3])
        model = Classifier()
        x, y = classifier_data(12)
        want = [p - 0.5 * g for p, g in zip(params_of(model), full_batch_grads(model, x, y))]
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        loss_fn = functools.partial(torch.nn.functional.cross_entropy, reduction="sum")
        stats = plan.train_window(model, opt, (x,), y, loss_fn=loss_fn)
        self.assertTrue(stats.stepped)
        self.assertAllClose(params_of(model), want)

    def test_a_sum_loss_fn_with_a_nan_loss_skips_the_step(self):
        # Skipped as a built-in loss's NaN is, not refused as a mean.
        model = Classifier()
        x, y = classifier_data(12)
        x[0, 0] = float("nan")
        before = params_of(model)
        loss_fn = functools.partial(torch.nn.functional.cross_entropy, reduction="sum")
        stats = make_plan([5, 4, 3]).train_window(model, torch.optim.SGD(model.parameters(), lr=0.5), (x,), y,
                                                  loss_fn=loss_fn)
        self.assertFalse(stats.stepped)
        for b, p in zip(before, params_of(model)):
            self.assertTrue(torch.equal(b, p))

    def test_batch_dependent_layers_are_warned_about_once_per_model(self):
        class BnNet(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(8, 8)
                self.bn = torch.nn.BatchNorm1d(8)
                self.out = torch.nn.Linear(8, 4)

            def forward(self, x):
                return self.out(torch.relu(self.bn(self.lin(x))))

        plan = make_plan([4, 4])
        x, y = classifier_data(8)
        for scripted in (False, True):
            model = BnNet()
            m = torch.jit.script(model) if scripted else model
            self.assertEqual(accumplan.batch_dependent_layers(m), ["bn (BatchNorm1d)"])
            opt = torch.optim.SGD(m.parameters(), lr=0.1)
            with self.subTest(scripted=scripted):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    plan.train_window(m, opt, (x,), y)
                    plan.train_window(m, opt, (x,), y)
                said = [str(c.message) for c in caught if "batch-dependent" in str(c.message)]
                self.assertEqual(len(said), 1)
                self.assertIn("1 batch-dependent layer(s) in training mode (e.g. bn (BatchNorm1d)): accumulation will "
                              "not reproduce one large batch", said[0])
        model = BnNet()
        model.bn.eval()  # running statistics only: nothing mixes the samples
        self.assertEqual(accumplan.batch_dependent_layers(model), [])
        self.assertEqual(accumplan.batch_dependent_layers(Classifier()), [])

    def test_clipping_sees_the_combined_gradient(self):
        plan = make_plan([7, 7, 6, 6])
        model = Classifier()
        x, y = classifier_data(26)
        g = full_batch_grads(model, x, y)
        norm = torch.stack([t.norm() for t in g]).norm()
        coef = 0.01 / (norm + 1e-6)
        want = [p - 1.0 * coef * t for p, t in zip(params_of(model), g)]
        stats = plan.train_window(model, torch.optim.SGD(model.parameters(), lr=1.0), (x,), y, max_grad_norm=0.01)
        self.assertAlmostEqual(stats.grad_norm, float(norm), places=5)
        self.assertAllClose(params_of(model), want)

    def test_mse_and_model_losses(self):
        plan = make_plan([3, 3, 2], loss="mse")
        lin = torch.nn.Linear(8, 4)
        x, _ = classifier_data(8)
        t = torch.randn(8, 4)
        lin.zero_grad()
        torch.nn.functional.mse_loss(lin(x), t).backward()
        want = [p - 0.1 * p.grad for p in lin.parameters()]
        plan.train_window(lin, torch.optim.SGD(lin.parameters(), lr=0.1), (x,), t)
        self.assertAllClose(params_of(lin), [w.detach() for w in want])

        class WithLoss(torch.nn.Module):  # forward(x, target) -> {"loss": mean}
            def __init__(self):
                super().__init__()
                self.c = Classifier()

            def forward(self, x, y):
                return {"loss": torch.nn.functional.cross_entropy(self.c(x), y)}

        plan = make_plan([3, 3, 2], loss="model")
        m = WithLoss()
        x, y = classifier_data(8)
        want = [p - 0.1 * g for p, g in zip(params_of(m), full_batch_grads(m.c, x, y))]
        plan.train_window(m, torch.optim.SGD(m.parameters(), lr=0.1), (x,), y)
        self.assertAllClose(params_of(m), want)

    def test_scaler_order_and_scheduler_only_on_real_steps(self):
        calls = []

        class FakeScaler:  # records the order; scales by infinity when told to, so the step is skipped
            def __init__(self, skip):
                self.skip, self.s = skip, 8.0

            def scale(self, t):
                calls.append("scale")
                return t * (float("inf") if self.skip else self.s)

            def unscale_(self, opt):
                calls.append("unscale")
                for g in opt.param_groups:
                    for p in g["params"]:
                        p.grad.div_(self.s)

            def get_scale(self):
                return self.s

            def step(self, opt):
                calls.append("step")
                if not self.skip:
                    opt.step()

            def update(self):
                calls.append("update")
                if self.skip:
                    self.s /= 2

        class Sched:
            steps = 0

            def step(self):
                calls.append("scheduler")
                Sched.steps += 1

        plan = make_plan([3, 3, 2])
        for skip in (False, True):
            del calls[:]
            model = Classifier()
            x, y = classifier_data(8)
            before = params_of(model)
            stats = plan.train_window(model, torch.optim.SGD(model.parameters(), lr=0.1), (x,), y,
                                      scaler=FakeScaler(skip), max_grad_norm=100.0, scheduler=Sched())
            self.assertEqual(calls, ["scale"] * 3 + ["unscale"] + (["update"] if skip else ["step", "update", "scheduler"]))
            self.assertEqual(stats.skipped, skip)
            changed = any(not torch.equal(a, b) for a, b in zip(before, params_of(model)))
            self.assertEqual(changed, not skip)
        self.assertEqual(Sched.steps, 1)

    def test_a_non_finite_gradient_skips_the_step_and_the_scheduler(self):
        plan = make_plan([3, 3, 2])
        model = Classifier()
        x, y = classifier_data(8)
        x[5, 0] = float("nan")  # one sample of the second microbatch
        before = params_of(model)
        steps = []
        sched = type("Sched", (), {"step": lambda self: steps.append(1)})()
        stats = plan.train_window(model, torch.optim.SGD(model.parameters(), lr=0.1), (x,), y, scheduler=sched)
        self.assertTrue(stats.skipped)
        self.assertFalse(stats.stepped)
        self.assertIn("non-finite", stats.skip_reason)
        self.assertEqual(steps, [])
        self.assertAllClose(params_of(model), before)
        self.assertTrue(all(p.grad is None for p in model.parameters()))

    def test_bf16_autocast_runs_the_window_under_autocast(self):
        plan = make_plan([3, 3, 2])
        model = Classifier()
        x, y = classifier_data(8)
        want = [p - 0.5 * g for p, g in zip(params_of(model), full_batch_grads(model, x, y))]
        stats = plan.train_window(model, torch.optim.SGD(model.parameters(), lr=0.5), (x,), y,
                                  autocast=torch.bfloat16)
        self.assertTrue(stats.stepped)
        for got, w in zip(params_of(model), want):  # bf16 matmuls: close, not equal
            torch.testing.assert_close(got, w, rtol=0, atol=2e-2)
        self.assertFalse(all(torch.equal(g, w) for g, w in zip(params_of(model), want)))

    def test_a_window_without_valid_tokens_is_skipped(self):
        plan = make_plan([2, 2])
        model = TinyLM()
        x, y = token_data(4)
        y[:] = -100
        before = params_of(model)
        stats = plan.train_window(model, torch.optim.SGD(model.parameters(), lr=0.1), (x,), y)
        self.assertTrue(stats.skipped)
        self.assertAllClose(params_of(model), before)
        self.assertEqual(list(plan.split((x,), y)), [])


if __name__ == "__main__":
    unittest.main()
