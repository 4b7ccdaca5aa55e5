"""The evaluation batch from Python: accumplan.plan measures it, plan.evaluate runs it.

What it is: plan() on a small model with dropout under a CPU budget gives ``plan.eval`` (larger than
the training microbatch, confirmed, at most two eval windows); eval=False plans none; kept outputs
are counted (a smaller eval microbatch); evaluate() returns the whole batch's eval-mode mean loss to
1e-6 whatever the split, also after a forced out-of-memory re-split; outputs go to on_outputs one
microbatch behind; the model's flags and gradients are left as they were; bad arguments are refused
by their Python names. What it is not: the 3-model benchmark (tests/bench/eval_bench.py)."""
import unittest

import torch
import torch.nn as nn

import accumplan


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, 128), nn.ReLU(),
                         nn.Linear(128, 10))


def _planned(**kwargs):
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 32), torch.randint(0, 10, (32,))
    plan = accumplan.plan(model, (x,), y, target_batch=512, optimizer=opt, memory_budget="4MiB", progress=False,
                          **kwargs)
    return model, opt, plan


def _reference(model, x, y):
    model.eval()
    with torch.no_grad():
        loss = nn.functional.cross_entropy(model(x), y).item()
    model.train()
    return loss


class EvalPlanned(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model, cls.opt, cls.plan = _planned()

    def test_the_plan_states_a_confirmed_eval_batch_larger_than_training(self):
        e = self.plan.eval
        self.assertIsNotNone(e)
        self.assertTrue(e["confirmed"])
        self.assertGreater(e["micro_batch"], self.plan.micro_batch)
        self.assertLessEqual(len(e["trials"]), 2)
        self.assertEqual({t["kind"] for t in e["trials"]}, {"eval"})
        self.assertLessEqual(e["predicted_peak_bytes"], self.plan.memory["usable_bytes"])
        self.assertEqual(self.plan.eval_sizes(2 * e["micro_batch"] + 3), [e["micro_batch"]] * 2 + [3])
        self.assertFalse(e["keep_outputs"])

    def test_evaluate_is_the_whole_batch_mean_in_eval_mode_whatever_the_split(self):
        torch.manual_seed(1)
        n = 2 * self.plan.eval["micro_batch"] + 7
        x, y = torch.randn(n, 32), torch.randint(0, 10, (n,))
        st = self.plan.evaluate(self.model, (x,), y)
        self.assertEqual(len(st.microbatch_sizes), 3)
        self.assertEqual((st.samples, st.units, st.oom_recoveries), (n, n, 0))
        self.assertLess(abs(st.loss - _reference(self.model, x, y)), 1e-6)
        self.assertTrue(self.model.training)  # put back
        self.assertTrue(all(p.grad is None for p in self.model.parameters()))

    def test_a_forced_out_of_memory_re_splits_and_gives_the_same_mean(self):
        torch.manual_seed(2)
        m = self.plan.eval["micro_batch"]
        x, y = torch.randn(m + 5, 32), torch.randint(0, 10, (m + 5,))
        fired, notes = [], []

        def loss_fn(out, target):  # the first microbatch of the full size fails once, as a device would
            if out.shape[0] == m and not fired:
                fired.append(True)
                raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
            return nn.functional.cross_entropy(out, target, reduction="sum")
        st = self.plan.evaluate(self.model, (x,), y, loss_fn=loss_fn, on_oom=notes.append)
        self.assertEqual(st.oom_recoveries, 1)
        self.assertEqual(sum(st.microbatch_sizes), m + 5)
        self.assertEqual(st.microbatch_sizes[0], m // 2)
        self.assertEqual(len(notes), 1)
        self.assertIn("evaluation ran out of memory at a microbatch of %d samples" % m, notes[0])
        self.assertLess(abs(st.loss - _reference(self.model, x, y)), 1e-6)

    def test_outputs_go_to_on_outputs_one_microbatch_behind(self):
        m = self.plan.eval["micro_batch"]
        x, y = torch.randn(2 * m + 1, 32), torch.randint(0, 10, (2 * m + 1,))
        got = []
        self.plan.evaluate(self.model, (x,), y, on_outputs=lambda out, start: got.append((start, out.shape[0])))
        self.assertEqual(got, [(0, m), (m, m), (2 * m, 1)])

    def test_measured_peak_is_the_prediction_with_the_state_resident(self):
        model, opt = self.model, self.opt
        x, y = torch.randn(self.plan.per_rank_batch, 32), torch.randint(0, 10, (self.plan.per_rank_batch,))
        self.plan.train_window(model, opt, (x,), y)  # the optimizer state exists, as mid-training
        opt.zero_grad(set_to_none=True)
        m = self.plan.eval["micro_batch"]
        st = self.plan.evaluate(model, (torch.randn(m, 32),), torch.randint(0, 10, (m,)), measure_memory=True,
                                optimizer=opt)
        self.assertLess(abs(st.peak_bytes / st.predicted_peak_bytes - 1), 0.01)

    def test_bad_arguments_name_the_python_argument(self):
        x, y = torch.randn(4, 32), torch.randint(0, 10, (4,))
        with self.assertRaisesRegex(TypeError, "on_outputs"):
            self.plan.evaluate(self.model, (x,), y, on_outputs=5)
        with self.assertRaisesRegex(TypeError, "oom_recovery"):
            self.plan.evaluate(self.model, (x,), y, oom_recovery="yes")
        with self.assertRaisesRegex(ValueError, "no samples"):
            self.plan.evaluate(self.model, (x[:0],), y[:0])


class EvalOptions(unittest.TestCase):
    def test_eval_false_plans_no_eval_batch(self):
        _, _, plan = _planned(eval=False)
        self.assertIsNone(plan.eval)
        self.assertEqual(plan.eval_sizes(3 * plan.micro_batch), [plan.micro_batch] * 3)  # the training microbatch

    def test_kept_outputs_count(self):
        _, _, kept = _planned(eval_keep_outputs=True)
        _, _, plain = _planned()
        self.assertTrue(kept.eval["keep_outputs"])
        self.assertLess(kept.eval["micro_batch"], plain.eval["micro_batch"])
        self.assertEqual(kept.eval["trials"][0]["window"][:2], [kept.micro_batch, kept.micro_batch])

    def test_keep_outputs_without_eval_is_refused(self):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with self.assertRaisesRegex(ValueError, "eval_keep_outputs=True"):
            accumplan.plan(model, (torch.randn(4, 32),), torch.randint(0, 10, (4,)), target_batch=8, optimizer=opt,
                           eval=False, eval_keep_outputs=True, progress=False)
        with self.assertRaisesRegex(TypeError, "^eval must be True or False"):
            accumplan.plan(model, (torch.randn(4, 32),), torch.randint(0, 10, (4,)), target_batch=8, optimizer=opt,
                           eval=1, progress=False)


if __name__ == "__main__":
    unittest.main()
