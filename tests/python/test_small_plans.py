"""accumplan.plan for per-rank batches of 1, 2 and 3 (issue 41): planned from the probes at 2 and 4
like any other target (the search is the C++ core's, _core.search_plan), confirmed, saved as a plan
the CLI's reader takes, and trained by train_window."""
import os
import tempfile
import unittest
import warnings

import torch
import torch.nn as nn

import accumplan

BUDGET = 3 << 20  # 3 MiB: far more than three samples of this model need


def model_and_data():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    return model, torch.randn(16, 32), torch.randint(0, 10, (16,))


class SmallPlans(unittest.TestCase):
    def plan(self, target_batch, **kw):
        model, x, y = model_and_data()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan = accumplan.plan(model, (x,), y, target_batch=target_batch, optimizer=opt, memory_budget=BUDGET,
                                  progress=False, **kw)
        return plan, model, opt, x, y

    def test_target_batches_1_2_and_3_plan_in_one_confirmed_microbatch_and_train(self):
        for target in (1, 2, 3):
            with self.subTest(target_batch=target):
                plan, model, opt, x, y = self.plan(target)
                self.assertEqual(plan.microbatch_sizes, [target])
                self.assertTrue(plan.confirmed)
                before = [p.detach().clone() for p in model.parameters()]
                plan.train_window(model, opt, (x[:target],), y[:target])
                self.assertTrue(any(not torch.equal(a, b) for a, b in zip(before, model.parameters())))
                with tempfile.TemporaryDirectory() as d:
                    path = os.path.join(d, "plan.json")
                    plan.save(path)
                    self.assertEqual(accumplan.load_plan(path).microbatch_sizes, [target])

    def test_eight_over_four_ranks_plans_a_per_rank_batch_of_two(self):
        plan = self.plan(8, world_size=4)[0]
        self.assertEqual(plan.microbatch_sizes, [2])
        self.assertTrue(plan.confirmed)


if __name__ == "__main__":
    unittest.main()
