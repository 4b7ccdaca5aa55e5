"""Two gloo processes training a plan whose ranks differ (shares 3 and 9 of each window, their own
microbatches) end with the parameters of one process training each whole window, in float64, with
per-sample and per-token losses, and after an out-of-memory on one rank; only that rank re-plans."""
import json
import os
import tempfile
import unittest

import torch

from helpers import DIST_TIMEOUT_S, Classifier, Gated, TinyLM, make_plan, params_of, ranks_doc, run_two_gloo_ranks

import accumplan
import ranks_worker


def one_process(model, data, normalization):
    """The reference: every global window as one process's window."""
    plan = make_plan([ranks_worker.TARGET], normalization=normalization)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x, y = data
    for s in range(0, ranks_worker.SAMPLES, ranks_worker.TARGET):
        plan.train_window(model, opt, (x[s:s + ranks_worker.TARGET],), y[s:s + ranks_worker.TARGET])
    return params_of(model)


class RanksThatDiffer(unittest.TestCase):
    def test_each_rank_trains_its_share_and_the_update_is_one_process(self):
        g = torch.Generator().manual_seed(5)
        samples = (torch.randn(ranks_worker.SAMPLES, 8, generator=g, dtype=torch.float64),
                   torch.randint(0, 4, (ranks_worker.SAMPLES,), generator=g))
        want = {"samples": one_process(Classifier().double(), samples, "auto"),
                "tokens": one_process(TinyLM().double(), ranks_worker.token_data(ranks_worker.SAMPLES), "tokens")}
        want["oom"] = want["tokens"]
        with tempfile.TemporaryDirectory() as out:
            codes, logs = run_two_gloo_ranks("ranks_worker.py", out)
            for r in range(2):
                self.assertEqual(codes[r], 0, "rank %d failed (None: killed after %d s):\n%s" % (r, DIST_TIMEOUT_S, logs[r]))
            for way, params in want.items():
                for r in range(2):
                    got = torch.load(os.path.join(out, "rank%d-%s.pt" % (r, way)))
                    for a, b in zip(got, params):
                        self.assertEqual(a.dtype, torch.float64)
                        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12, msg=lambda m: "%s rank %d: %s" % (way, r, m))
            for r in range(2):
                with open(os.path.join(out, "rank%d-ranks.json" % r)) as f:
                    ranks = json.load(f)
                self.assertEqual([w["per_rank_batch"] for w in ranks], [3, 9])  # the shares stay
                self.assertEqual(ranks[0]["microbatch_sizes"], [2, 1])  # rank 0's window untouched
                self.assertLess(max(ranks[1]["microbatch_sizes"]), 4)  # rank 1 re-planned below 4

    def test_rank_slice_and_window_sizes_follow_each_rank(self):
        plan = accumplan.load_plan(ranks_doc([[2, 1], [4, 4, 1]]))
        self.assertEqual(plan.rank_slice(0, 12), slice(0, 3))
        self.assertEqual(plan.rank_slice(1, 12), slice(3, 12))
        self.assertEqual(plan.rank_slice(1, 5), slice(1, 5))  # a short window, in proportion
        self.assertEqual(plan.window_sizes(9, rank=1), [4, 4, 1])
        self.assertEqual(plan.window_sizes(3, rank=0), [2, 1])
        uniform = make_plan([2, 2], world_size=2)
        self.assertEqual(uniform.rank_slice(1, 8), slice(1, 8, 2))
        with self.assertRaisesRegex(ValueError, "rank"):
            plan.window_sizes(3, rank=2)

    def test_the_reader_refuses_ranks_that_do_not_add_up(self):
        doc = ranks_doc([[2, 1], [4, 4, 1]])
        doc["ranks"][1]["per_rank_batch"] = 8
        doc["ranks"][1]["microbatch_sizes"] = [4, 4]
        with self.assertRaisesRegex(accumplan.PlanError, r"\$\.ranks: the shares sum to 11, but target_batch is 12"):
            accumplan.load_plan(doc)
        doc = ranks_doc([[2, 1], [4, 4, 1]])
        doc["world_size"] = 3
        with self.assertRaisesRegex(accumplan.PlanError, r"\$\.ranks: 2 ranks for world_size 3"):
            accumplan.load_plan(doc)


class PlannedRanks(unittest.TestCase):
    def test_each_rank_planned_on_its_budget_peaks_as_predicted_under_it(self):
        # Each rank's own plan, measured here (CPU: the counting allocator) under its own budget.
        g = torch.Generator().manual_seed(3)
        x, y = torch.randn(8, 16, 32, generator=g), torch.randint(0, 8, (8,), generator=g)
        own = []
        for budget in ("3MiB", "6MiB"):
            model = Gated()
            own.append(accumplan.plan(model, (x,), y, target_batch=192, world_size=2, memory_budget=budget,
                                      optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), progress=False,
                                      eval=False))
        plan = accumplan.plan_ranks(own)
        self.assertEqual([r["budget_bytes"] for r in plan.ranks], [3 << 20, 6 << 20])
        self.assertEqual(sum(r["per_rank_batch"] for r in plan.ranks), 192)
        self.assertGreater(plan.ranks[1]["max_micro_batch"], plan.ranks[0]["max_micro_batch"])
        self.assertGreater(plan.ranks[1]["per_rank_batch"], plan.ranks[0]["per_rank_batch"])
        with tempfile.TemporaryDirectory() as out:
            plan.save(os.path.join(out, "plan.json"))
            codes, logs = run_two_gloo_ranks("ranks_planned_worker.py", out)
            for r in range(2):
                self.assertEqual(codes[r], 0, "rank %d failed:\n%s" % (r, logs[r]))
                with open(os.path.join(out, "rank%d-peaks.json" % r)) as f:
                    rows = json.load(f)
                self.assertEqual(rows[0]["sizes"], plan.ranks[r]["microbatch_sizes"])
                for w, row in enumerate(rows[1:], 1):  # the steady windows: the optimizer state exists
                    self.assertEqual(row["oom"], 0)
                    self.assertEqual(row["predicted"], plan.ranks[r]["predicted_peak_bytes"])
                    self.assertLessEqual(row["peak"], plan.ranks[r]["budget_bytes"], "rank %d window %d" % (r, w))
                    self.assertLessEqual(abs(row["peak"] / row["predicted"] - 1), 0.01, "rank %d window %d: %s" % (r, w, row))
        with self.assertRaisesRegex(TypeError, "plans: a list of accumplan.Plan"):
            accumplan.plan_ranks(own[0])
        # One budget per rank from one process: the same searches, combined the same way.
        model = Gated()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        before, rng = {k: v.clone() for k, v in model.state_dict().items()}, torch.get_rng_state()
        here = accumplan.plan(model, (x,), y, target_batch=192, world_size=2, memory_budget=["3MiB", "6MiB"],
                              optimizer=opt, progress=False, eval=False)
        # Two searches, and the model, optimizer and RNG are as they were, bit for bit.
        for k, v in model.state_dict().items():
            self.assertTrue(torch.equal(v, before[k]) and v.dtype == before[k].dtype, k)
        self.assertEqual(opt.state_dict()["state"], {})
        self.assertTrue(all(p.grad is None for p in model.parameters()))
        self.assertTrue(torch.equal(torch.get_rng_state(), rng))
        self.assertEqual([r["budget_bytes"] for r in here.ranks], [3 << 20, 6 << 20])
        self.assertEqual(sum(r["per_rank_batch"] for r in here.ranks), 192)
        self.assertGreater(here.ranks[1]["max_micro_batch"], here.ranks[0]["max_micro_batch"])
        for r in here.ranks:
            self.assertLessEqual(r["predicted_peak_bytes"], r["budget_bytes"])
        with self.assertRaisesRegex(ValueError, "memory_budget: 3 budgets for world_size=2"):
            accumplan.plan(model, (x,), y, target_batch=192, world_size=2, memory_budget=["3MiB"] * 3,
                           optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), progress=False)


if __name__ == "__main__":
    unittest.main()
