"""Two processes with gloo on the CPU end with the same parameters as one process training the
same global windows: global token counts, one gradient exchange per window, OOM agreement."""
import os
import socket
import subprocess
import sys
import tempfile
import unittest

import torch

from helpers import HERE, TinyLM, make_plan, params_of, token_data

import dist_worker

TIMEOUT_S = 120  # watchdog: a hung collective fails the test instead of the suite


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                       WORLD_SIZE="2", OMP_NUM_THREADS="1")
            procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "dist_worker.py"), out],
                                      cwd=HERE, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                     for r in range(2)]
            logs = []
            try:
                for p in procs:
                    logs.append(p.communicate(timeout=TIMEOUT_S)[0].decode(errors="replace"))
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                        p.wait()
            for r, p in enumerate(procs):
                self.assertEqual(p.returncode, 0, "rank %d failed:\n%s" % (r, logs[r] if r < len(logs) else ""))
            for way in ("plain", "ddp", "split"):
                for r in range(2):
                    got = torch.load(os.path.join(out, "rank%d-%s.pt" % (r, way)))
                    for g, w in zip(got, want):
                        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, msg=lambda m: "%s rank %d: %s" % (way, r, m))


if __name__ == "__main__":
    unittest.main()
