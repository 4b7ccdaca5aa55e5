"""The gradient exchange planned: accumplan.plan for W ranks measures windows that make a rank's
exchange (its flat buffers beside the gradients), and two gloo ranks training such a plan, whole and
with a ZeroRedundancyOptimizer, each peak at its own rank's prediction in every steady window, under
the budget."""
import json
import os
import tempfile
import unittest

import torch

from helpers import DIST_TIMEOUT_S, run_two_gloo_ranks

import accumplan
import exchange_worker as worker


def plan_for(world_size):
    model = worker.wide_model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
    return accumplan.plan(model, (x,), y, target_batch=16, optimizer=opt, world_size=world_size,
                          memory_budget=worker.BUDGET, progress=False, eval=False), model


class RehearsedExchange(unittest.TestCase):
    def test_the_loss_sum_rides_in_the_widest_bucket_beside_half_precision_gradients(self):
        from accumplan.distributed import REHEARSAL
        params = [torch.zeros(4, dtype=torch.bfloat16, requires_grad=True),
                  torch.zeros(4, dtype=torch.float32, requires_grad=True),
                  torch.zeros(4, dtype=torch.bfloat16, requires_grad=True)]
        # bfloat16 keeps 3 digits of 1/3 (0.333984375); the float32 bucket keeps 7.
        self.assertAlmostEqual(accumplan.all_reduce_gradients(params, REHEARSAL, extra=1 / 3), 1 / 3, places=6)

    def test_windows_for_two_ranks_hold_the_exchange_buffer_after_the_microbatches(self):
        two, model = plan_for(2)
        one, _ = plan_for(1)
        grads = sum(p.numel() * p.element_size() for p in model.parameters())
        self.assertTrue(two.profile.get("gradient_exchange"))
        self.assertNotIn("gradient_exchange", one.profile)
        for plan, holds in ((two, True), (one, False)):
            per = plan.profile["persistent"]
            resident = per["weights_bytes"] + per["gradients_bytes"] + per["optimizer_state_bytes"]
            for point in plan.profile["points"]:
                after = point["optimizer_step_peak_bytes"]
                # AdamW's step holds less than a gradient's size beside the state; the exchange holds all of them.
                self.assertEqual(after >= resident + grads, holds, (point, resident, grads))

    def test_two_gloo_ranks_peak_at_the_prediction_in_every_steady_window(self):
        with tempfile.TemporaryDirectory() as out:
            codes, logs = run_two_gloo_ranks("exchange_worker.py", out)
            for r in range(2):
                self.assertEqual(codes[r], 0, "rank %d failed (None: killed after %d s):\n%s"
                                 % (r, DIST_TIMEOUT_S, logs[r]))
            for way in ("whole", "zero"):
                for r in range(2):
                    with open(os.path.join(out, "rank%d-%s.json" % (r, way))) as f:
                        rec = json.load(f)
                    self.assertTrue(rec["exchange"])
                    self.assertEqual(rec["world_size"], 2)
                    for i, w in enumerate(rec["windows"][1:], 1):  # the first window makes the state
                        msg = "%s rank %d window %d: %s (plan %s)" % (way, r, i, w, rec["sizes"])
                        self.assertEqual(w["oom"], 0, msg)
                        self.assertLessEqual(w["peak"], worker.BUDGET, msg)
                        # Every rank at its own prediction: a sharded plan's ranks hold different shares.
                        self.assertLessEqual(w["peak"], w["predicted"] * 1.01, msg)
                        self.assertGreaterEqual(w["peak"], w["predicted"] * 0.99, msg)
            for r in range(2):
                with open(os.path.join(out, "rank%d-alone.json" % r)) as f:
                    refused = json.load(f)["refused"]
                self.assertRegex(refused or "", r"^group: it holds 1 rank but the plan is for 2 \(the default group has 2\)")


    def test_a_ddp_module_planned_and_trained_peaks_at_the_prediction_its_buckets_included(self):
        # The truth is a probe installed before the model exists: it counts the reducer's buckets,
        # which DDP allocates when it wraps the module, and shares nothing with the plan's figures.
        import ddp_worker
        with tempfile.TemporaryDirectory() as out:
            for mode in ("plan", "train"):
                codes, logs = run_two_gloo_ranks("ddp_worker.py", out, mode)
                for r in range(2):
                    self.assertEqual(codes[r], 0, "%s: rank %d failed (None: killed after %d s):\n%s"
                                     % (mode, r, DIST_TIMEOUT_S, logs[r]))
            for r in range(2):
                with open(os.path.join(out, "rank%d-ddp.json" % r)) as f:
                    rec = json.load(f)
                for i, w in enumerate(rec["windows"][1:], 1):  # the first window makes the state
                    msg = "rank %d window %d: %s (plan %s)" % (r, i, w, rec["sizes"])
                    self.assertEqual(w["oom"], 0, msg)
                    self.assertLessEqual(w["peak"], ddp_worker.BUDGET, msg)
                    self.assertLessEqual(w["peak"], w["predicted"] * 1.01, msg)
                    self.assertGreaterEqual(w["peak"], w["predicted"] * 0.99, msg)


if __name__ == "__main__":
    unittest.main()
