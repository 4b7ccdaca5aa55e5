"""Optimizer state sharded over ranks (ZeRO-1): plan(shard=) and its refusals, and two gloo ranks
training a sharded plan with ZeroRedundancyOptimizer ending with the parameters one process gets
from the same global windows (a loss per sample with an OOM on one rank, and a loss per token)."""
import os
import tempfile
import unittest

import torch

from helpers import (DIST_TIMEOUT_S, Classifier, TinyLM, classifier_data, make_plan, params_of, run_two_gloo_ranks,
                     token_data)

import accumplan
from accumplan.sharding import measuring_optimizer, sharding_of
import sharding_worker as worker


def reference(model, x, y):
    """One process, one plan window per global window, AdamW as the worker's."""
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
    plan = make_plan([4, 4])
    for s in range(0, worker.SAMPLES, worker.TARGET):
        plan.train_window(model, opt, (x[s:s + worker.TARGET],), y[s:s + worker.TARGET])
    return params_of(model)


class ShardArguments(unittest.TestCase):
    def setUp(self):
        self.model = Classifier()
        self.x, self.y = classifier_data(8)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=0.01)

    def plan(self, **kw):
        return accumplan.plan(self.model, (self.x,), self.y, target_batch=8, optimizer=self.opt, progress=False,
                              eval=False, **kw)

    def test_a_sharded_plan_needs_two_ranks_and_names_shard(self):
        with self.assertRaisesRegex(ValueError, r"shard='optimizer' .*world_size= of at least 2"):
            self.plan(shard="optimizer")
        with self.assertRaisesRegex(ValueError, r"shard"):
            self.plan(shard="zero3", world_size=2)
        with self.assertRaisesRegex(ValueError, r"shard='auto' with checkpointing"):
            self.plan(shard="auto", world_size=2, checkpointing="auto")

    def test_a_zero_optimizer_over_one_rank_is_refused_with_a_way_out(self):
        import torch.distributed as dist
        from torch.distributed.optim import ZeroRedundancyOptimizer
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            zero = ZeroRedundancyOptimizer(self.model.parameters(), optimizer_class=torch.optim.AdamW, lr=0.01)
            with self.assertRaisesRegex(ValueError, r"^optimizer: the ZeroRedundancyOptimizer shards over 1 rank.*"
                                                    r"pass the optimizer it wraps \(AdamW\) with shard='off'$"):
                accumplan.plan(self.model, (self.x,), self.y, target_batch=8, optimizer=zero, progress=False, eval=False)
        finally:
            dist.destroy_process_group()

    def test_a_sharded_plan_holds_the_largest_share_and_leaves_the_optimizer_alone(self):
        plan = self.plan(shard="optimizer", world_size=2)
        s = plan.sharding
        self.assertEqual(s["world_size"], 2)
        self.assertEqual(max(s["per_rank_state_bytes"]), s["per_rank_state_bytes"][s["measured_rank"]])
        # AdamW: two copies of each parameter and a step counter, shared out whole
        weights = sum(p.numel() * 4 for p in self.model.parameters())
        self.assertEqual(sum(s["per_rank_state_bytes"]), 2 * weights + 4 * len(list(self.model.parameters())))
        self.assertIn("sharded over 2 ranks", plan.reason)
        self.assertEqual(len(self.opt.state), 0)  # the measuring optimizer was a private one
        again = accumplan.load_plan(plan.to_dict())
        self.assertEqual(again.sharding, s)

    def test_plain_sgd_has_nothing_to_shard(self):
        sgd = torch.optim.SGD(self.model.parameters(), lr=0.1)
        with self.assertRaisesRegex(ValueError, r"nothing to shard; plan with shard='off'"):
            accumplan.plan(self.model, (self.x,), self.y, target_batch=8, optimizer=sgd, world_size=2,
                           shard="optimizer", progress=False, eval=False)

    def test_auto_does_not_shard_when_the_whole_window_already_fits(self):
        plan = self.plan(shard="auto", world_size=2)
        self.assertIsNone(plan.sharding)
        self.assertIn("shard='auto' did not shard", plan.reason)

    def test_auto_shards_when_the_freed_state_fits_a_larger_microbatch(self):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 512), torch.nn.Tanh(), torch.nn.Linear(512, 4))
        x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
        common = dict(target_batch=1024, world_size=2, memory_budget=900 * 1024, progress=False, eval=False)
        off = accumplan.plan(model, (x,), y, optimizer=torch.optim.AdamW(model.parameters()), shard="off", **common)
        auto = accumplan.plan(model, (x,), y, optimizer=torch.optim.AdamW(model.parameters()), shard="auto", **common)
        self.assertIsNotNone(auto.sharding)
        self.assertGreater(auto.max_micro_batch, off.max_micro_batch)
        self.assertIn("shard='auto' sharded it", auto.reason)

    def test_a_sharded_plan_refuses_an_optimizer_that_does_not_shard(self):
        plan = make_plan([2, 2], world_size=2, sharded=True)
        with self.assertRaisesRegex(ValueError, r"ZeroRedundancyOptimizer"):
            plan.train_window(self.model, self.opt, (self.x[:4],), self.y[:4])


class TwoShardedRanks(unittest.TestCase):
    def test_two_gloo_ranks_with_zero_match_one_process(self):
        want = {"samples": reference(Classifier(), *classifier_data(worker.SAMPLES)),
                "tokens": reference(TinyLM(), *token_data(worker.SAMPLES))}
        with tempfile.TemporaryDirectory() as out:
            codes, logs = run_two_gloo_ranks("sharding_worker.py", out)
            for r in range(2):
                self.assertEqual(codes[r], 0, "rank %d failed (None: killed after %d s):\n%s"
                                 % (r, DIST_TIMEOUT_S, logs[r]))
            for way, params in want.items():
                for r in range(2):
                    got = torch.load(os.path.join(out, "rank%d-%s.pt" % (r, way)))
                    for g, w in zip(got, params):
                        torch.testing.assert_close(g, w, rtol=0, atol=1e-6, msg=lambda m: "%s rank %d: %s" % (way, r, m))


class ShareOfEachRank(unittest.TestCase):
    """Each rank's share is the state a real step of the user's optimizer leaves on its parameters."""

    def real_shares(self, model, make_optimizer, world_size):
        view = make_optimizer(model)
        sharding = sharding_of(view, model, world_size, torch.device("cpu"))
        real = []
        for r in range(world_size):
            opt = measuring_optimizer(make_optimizer(model), dict(sharding, measured_rank=r))
            model.zero_grad(set_to_none=True)
            model(torch.randn(4, 64)).sum().backward()
            opt.step()
            real.append(sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values()
                            if isinstance(v, torch.Tensor)))
        return sharding, real

    def check(self, model, make_optimizer, world_size=2):
        sharding, real = self.real_shares(model, make_optimizer, world_size)
        self.assertEqual(sharding["per_rank_state_bytes"], real)
        self.assertEqual(sharding["measured_rank"], real.index(max(real)))

    def test_a_frozen_layer_left_in_the_optimizer_holds_no_state(self):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 128), torch.nn.Linear(128, 10))
        for p in model[1].parameters():
            p.requires_grad_(False)
        self.check(model, lambda m: torch.optim.AdamW(m.parameters(), lr=0.01))

    def test_a_parameter_not_in_the_model_holds_no_state(self):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 10))
        foreign = torch.nn.Parameter(torch.zeros(128, 128))
        self.check(model, lambda m: torch.optim.Adam(list(m.parameters()) + [foreign], lr=0.01))

    def test_groups_with_other_settings_hold_their_own_state(self):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 96), torch.nn.Linear(96, 10))
        self.check(model, lambda m: torch.optim.Adam([{"params": m[0].parameters(), "amsgrad": True},
                                                      {"params": list(m[1].parameters()) + list(m[2].parameters())}],
                                                     lr=0.01), world_size=3)


if __name__ == "__main__":
    unittest.main()
