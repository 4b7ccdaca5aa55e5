"""accumplan.plan for per-rank batches of 1, 2 and 3: planned from the probes at 2 and 4
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



class SmallModelsThatChangeTheirGradientPath(unittest.TestCase):
    """bf16, a gradient hook, tied weights, weight_norm and spectral_norm on a small MLP plan (they
    once ended in "peak does not grow ... probe sizes further apart", advice Python cannot follow),
    and the plan's split reaches the target."""

    def variants(self):
        def tied():
            m = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 10))
            m[1].weight = m[0].weight
            return m

        def reparametrised(wrap):
            def build():
                m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
                m[0] = wrap(m[0])
                return m
            return build

        def hooked():
            m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
            m[0].weight.register_hook(lambda g: g * 2)
            return m
        plain = model_and_data
        return [("amp bf16", lambda: plain()[0], {"amp": "bf16"}), ("a gradient hook", hooked, {}),
                ("tied weights", tied, {}), ("weight_norm", reparametrised(nn.utils.weight_norm), {}),
                ("spectral_norm", reparametrised(nn.utils.spectral_norm), {})]

    def test_each_plans_to_its_target(self):
        _, x, y = model_and_data()
        for name, build, kw in self.variants():
            with self.subTest(name):
                torch.manual_seed(0)
                model = build()
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    plan = accumplan.plan(model, (x,), y, target_batch=32, optimizer=opt, memory_budget="64MiB",
                                          progress=False, **kw)
                self.assertEqual(sum(plan.microbatch_sizes), 32)
                self.assertTrue(plan.confirmed)


if __name__ == "__main__":
    unittest.main()
