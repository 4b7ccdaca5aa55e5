"""Cross-entropy with probability targets (mixup, cutmix, label smoothing, distillation): a
floating [B,C] target of the output's shape, normalized by samples.

What it checks: a [4,3,3] window through train_window moves the parameters as one full-batch
step of F.cross_entropy(logits, probs) over all 10 samples; the normalization rule (the C++
core's) makes such a target "samples" under auto and refuses "tokens"; rows that are not
distributions are refused naming the row; accumplan.plan plans with such a target.
What it is not: the CLI's path (tests/executor/test_probability_targets.cpp)."""
import unittest
import warnings

import torch
import torch.nn.functional as F

from helpers import Classifier, make_plan, params_of

import accumplan

RTOL, ATOL = 1e-5, 1e-6


def probability_data(n, classes=4, seed=3):
    """Inputs [n,8] and soft targets [n,classes]: mixup-like rows, a one-hot row and a smoothed one."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    probs = torch.softmax(2 * torch.randn(n, classes, generator=g), dim=1)
    probs[0] = F.one_hot(torch.tensor(2), classes).float()
    probs[1] = torch.full((classes,), 0.1 / classes) + 0.9 * F.one_hot(torch.tensor(1), classes).float()
    return x, probs


class ProbabilityTargets(unittest.TestCase):
    def test_train_window_steps_like_one_full_batch_step(self):
        plan = make_plan([4, 3, 3])
        x, probs = probability_data(10)
        for scripted in (False, True):
            with self.subTest(scripted=scripted):
                reference = Classifier()
                ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5, momentum=0.9)
                F.cross_entropy(reference(x), probs).backward()  # mean over the 10 samples
                ref_opt.step()

                model = Classifier()
                m = torch.jit.script(model) if scripted else model
                opt = torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.9)
                stats = plan.train_window(m, opt, (x,), probs, loss="cross_entropy")
                self.assertTrue(stats.stepped)
                self.assertEqual(stats.microbatch_sizes, [4, 3, 3])
                self.assertEqual(stats.units, 10)  # samples, not classes or "tokens"
                for got, want in zip(params_of(m), params_of(reference)):
                    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)  # 1e-6 on every parameter
                # The step moved the parameters: the comparison above could fail.
                self.assertFalse(all(torch.equal(a, b) for a, b in zip(params_of(m), params_of(Classifier()))))

    def test_equal_weights_per_microbatch_would_not_match(self):
        # The equality above can fail: microbatch means weighted 1/3 each (not 4/10, 3/10, 3/10)
        # give another gradient for the same [4,3,3] window.
        x, probs = probability_data(10)
        model = Classifier()
        F.cross_entropy(model(x), probs).backward()
        want = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        for s, n in ((0, 4), (4, 3), (7, 3)):
            (accumplan.loss_sum(model(x[s:s + n]), probs[s:s + n], "cross_entropy", "samples") / n / 3).backward()
        naive = [p.grad for p in model.parameters()]
        self.assertFalse(all(torch.allclose(g, w, rtol=RTOL, atol=ATOL) for g, w in zip(naive, want)))

    def test_normalization_is_samples_for_probability_targets(self):
        probs = torch.full((5, 4), 0.25)
        self.assertEqual(accumplan.resolve_normalization("auto", "cross_entropy", probs), "samples")
        self.assertEqual(accumplan.resolve_normalization("auto", None, probs), "samples")
        # a [B,T] target of class indices is still tokens: the rule reads the dtype, not only dims
        self.assertEqual(accumplan.resolve_normalization("auto", "cross_entropy", torch.zeros(5, 4, dtype=torch.long)),
                         "tokens")
        with self.assertRaisesRegex(ValueError, r"^normalization 'tokens' needs a target of class indices") as cm:
            accumplan.resolve_normalization("tokens", "cross_entropy", probs)
        self.assertNotIn("\n", str(cm.exception))
        with self.assertRaisesRegex(ValueError, r"^normalization 'tokens' needs a per-token loss \(cross_entropy, or a model's own loss\); "
                                                r"'mse' has no tokens"):
            accumplan.resolve_normalization("tokens", "mse", None)
        with self.assertRaisesRegex(ValueError, r"^normalization 'token' is unknown; use samples, tokens or auto"):
            accumplan.resolve_normalization("token", "cross_entropy", probs)

    def test_rows_that_are_no_distribution_are_refused_naming_the_row(self):
        x, probs = probability_data(10)
        negative = probs.clone()
        negative[2, 1], negative[2, 0] = -0.2, negative[2, 0] + negative[2, 1] + 0.2  # still sums to 1
        short = probs.clone()
        short[3] = short[3] * 0.7
        cases = ((negative, r"^target row 2 holds -0\.2 for class 1; class probabilities are non-negative"),
                 (short, r"^target row 3 sums to 0\.7, not 1 \(tolerance 0\.001\)"))
        for bad, pattern in cases:
            with self.subTest(pattern=pattern):
                model = Classifier()
                before = params_of(model)
                opt = torch.optim.SGD(model.parameters(), lr=0.5)
                with self.assertRaisesRegex(ValueError, pattern) as cm:
                    make_plan([4, 3, 3]).train_window(model, opt, (x,), bad, loss="cross_entropy")
                self.assertNotIn("\n", str(cm.exception))
                for p, q in zip(before, params_of(model)):  # no step was taken
                    self.assertTrue(torch.equal(p, q))
                with self.assertRaisesRegex(ValueError, pattern):
                    accumplan.loss_sum(model(x), bad, "cross_entropy", "samples")
        # within the tolerance is accepted: 1e-4 off one
        near = probs.clone()
        near[0] = near[0] * (1 + 1e-4)
        self.assertTrue(torch.isfinite(accumplan.loss_sum(Classifier()(x), near, "cross_entropy", "samples")))

    def test_a_probability_target_of_another_shape_is_refused(self):
        x, _ = probability_data(4)
        with self.assertRaisesRegex(ValueError, r"needs logits \[B,C\] and a target \[B,C\] of the same shape; "
                                                r"got output \[4, 4\] and target \[4, 3\]"):
            accumplan.loss_sum(Classifier()(x), torch.full((4, 3), 1 / 3), "cross_entropy", "samples")
        with self.assertRaisesRegex(ValueError, r"^tokens normalization needs a target of class indices"):
            accumplan.loss_sum(Classifier()(x), torch.full((4, 4), 0.25), "cross_entropy", "tokens")

    def test_plan_plans_with_a_probability_target(self):
        x, probs = probability_data(16)
        model = Classifier()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan = accumplan.plan(model, (x,), probs, target_batch=64, optimizer=opt, memory_budget=8 << 20,
                                  progress=False)
        self.assertEqual(sum(plan.microbatch_sizes), 64)
        self.assertEqual(plan.setup["target"], "float32[B,4]")
        self.assertTrue(plan.train_window(model, opt, (x,), probs).stepped)
        short = probs.clone()
        short[5] = short[5] * 0.7
        with self.assertRaisesRegex(ValueError, r"^target row 5 sums to 0\.7"):
            accumplan.plan(model, (x,), short, target_batch=64, optimizer=opt, memory_budget=8 << 20, progress=False)


if __name__ == "__main__":
    unittest.main()
