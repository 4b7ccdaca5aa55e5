"""Two gloo processes on the CPU: a bad share of a window on ONE rank (lengths= missing or of the
wrong count, more samples than the per-rank batch, mismatched tensors in split) makes EVERY rank
raise a ValueError naming that rank after the first collective, instead of leaving its peer in the
all-reduce; and token windows (schema 1.4) whose shares exceed the per-rank batch or are empty
train as one process does. The worker is dist_validation_worker.py; a watchdog kills a hang."""
import json
import os
import tempfile
import unittest

import torch

from helpers import DIST_TIMEOUT_S, TinyLM, params_of, run_two_gloo_ranks

import accumplan
import dist_validation_worker as worker


class BadShareOnOneRank(unittest.TestCase):
    def test_every_rank_raises_and_token_windows_match_one_process(self):
        with tempfile.TemporaryDirectory() as out:
            codes, logs = run_two_gloo_ranks("dist_validation_worker.py", out)
            for r in range(2):
                self.assertEqual(codes[r], 0, "rank %d failed (None: killed after %d s, a collective hangs):\n%s"
                                 % (r, DIST_TIMEOUT_S, logs[r]))
            got = []
            for r in range(2):
                with open(os.path.join(out, "rank%d.json" % r)) as f:
                    got.append(json.load(f))
            tokens = [torch.load(os.path.join(out, "rank%d-tokens.pt" % r)) for r in range(2)]

        peer = r"^rank 1 failed while counting the units of window 0 \(its own error says why\)"
        want = {
            "lengths_count": (peer, r"^rank 1: lengths has 1 entries for a window of 2 samples"),
            "lengths_missing": (peer, r"^rank 1: this plan packs ragged data by tokens .*padded batch with lengths="),
            "samples_over_batch": (r"^rank 1 was handed 3 samples of a global window of 5, more than the plan's "
                                   r"per-rank batch 2",) * 2,
            "split_mismatch": (r"^rank 1 failed while checking its share of the window \(its own error says why\)",
                               r"^rank 1: target has 1 samples \(dim 0\) but inputs\[0\] has 2"),
            # Another rank's own failure: an accumplan.PeerError (a PlanError) here, the model's error there.
            "forward_fails": (r"^PeerError: rank 1 failed .*\(its own error says why\); this rank stops with it",
                              r"^PlanError: .*this rank's forward failed"),
        }
        for case, patterns in want.items():
            for r in range(2):
                with self.subTest(case=case, rank=r):
                    self.assertRegex(got[r][case], patterns[r])

        # one process, the whole global windows: the reference
        plan = worker.token_plan(1)
        x, y, lengths = accumplan.pad_sequences(*worker.token_window_data())
        model = TinyLM()
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        windows = accumplan.token_windows(accumplan.valid_token_counts(lengths, y), plan.target_tokens)
        self.assertEqual(windows, [(0, 5), (5, 1), (6, 1)])
        for start, count in windows:
            w = slice(start, start + count)
            plan.train_window(model, opt, (x[w],), y[w], lengths=lengths[w])
        self.assertEqual([t["shares"] for t in tokens], [[3, 1, 1], [2, 0, 0]])  # 3 > the per-rank batch; 0
        for r in range(2):
            for g, w in zip(tokens[r]["params"], params_of(model)):
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, msg=lambda m: "rank %d: %s" % (r, m))


if __name__ == "__main__":
    unittest.main()
