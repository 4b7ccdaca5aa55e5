"""accumplan.plan with an optimizer at lr 0 (every warm-up scheduler's first step): the
plan records lr 0 and reads back, where the core's plan reader refused it."""
import os
import tempfile
import unittest
import warnings

import torch
import torch.nn as nn

import accumplan


class LrZero(unittest.TestCase):
    def test_an_optimizer_at_lr_0_plans_saves_and_reads_back(self):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan = accumplan.plan(model, (torch.randn(8, 8),), torch.randint(0, 4, (8,)), target_batch=8,
                                  optimizer=opt, memory_budget="3MiB", progress=False)
        self.assertEqual(plan.setup["lr"], 0.0)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "plan.json")
            plan.save(path)
            self.assertEqual(accumplan.load_plan(path).setup["lr"], 0.0)


if __name__ == "__main__":
    unittest.main()
