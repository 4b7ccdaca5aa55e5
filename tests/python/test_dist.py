"""Two processes with gloo on the CPU end with the same parameters as one process training the
same global windows: global token counts, one gradient exchange per window, OOM agreement."""
import os
import tempfile
import unittest

import torch

from helpers import DIST_TIMEOUT_S, TinyLM, make_plan, params_of, run_two_gloo_ranks, token_data

import dist_worker


class TwoRanks(unittest.TestCase):
    def test_two_gloo_ranks_match_one_process(self):
        # the reference: one process, per-rank batch = the global window
        model = TinyLM()
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        plan = make_plan([4, 4])
        x, y = token_data(dist_worker.SAMPLES)
        for s in range(0, dist_worker.SAMPLES, dist_worker.TARGET):
            plan.train_window(model, opt, (x[s:s + 8],), y[s:s + 8])
        want = params_of(model)

        with tempfile.TemporaryDirectory() as out:
            codes, logs = run_two_gloo_ranks("dist_worker.py", out)
            for r in range(2):
                self.assertEqual(codes[r], 0, "rank %d failed (None: killed after %d s):\n%s"
                                 % (r, DIST_TIMEOUT_S, logs[r]))
            for way in ("plain", "ddp", "split"):
                for r in range(2):
                    got = torch.load(os.path.join(out, "rank%d-%s.pt" % (r, way)))
                    for g, w in zip(got, want):
                        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, msg=lambda m: "%s rank %d: %s" % (way, r, m))


if __name__ == "__main__":
    unittest.main()
