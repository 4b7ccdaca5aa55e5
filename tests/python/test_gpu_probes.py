"""tests/bench/gpu_probes.py, the step that adds a GPU run's probe sequences to the set the
planner's tests replay: what it writes has the fields of the committed set (the C++ replay reads
them), a rehearsal's results are refused without --rehearsal-ok, a sequence already there is
replaced, and a refusal leaves the target untouched."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "bench", "gpu_probes.py")
COMMITTED = os.path.join(ROOT, "tests", "bench", "gpu-probes.json")


def results(rehearsal=False):
    row = {"model": "resnet18", "budget": "8GiB", "budget_bytes": 8 << 30, "kind": "main", "target_batch": 1024,
           "status": "ok",
           "plan": {"points": [{"micro_batch": 2, "peak_bytes": 300, "reserved_peak_bytes": 310},
                               {"micro_batch": 4, "peak_bytes": 400, "reserved_peak_bytes": None}],
                    "persistent": {"weights_bytes": 10, "gradients_bytes": 10, "optimizer_state_bytes": 20}},
           "truth": {"true_max": 366}}
    skipped = {"model": "gpt_decoder", "budget": "8GiB", "kind": "main", "status": "skipped: time limit"}
    return {"rehearsal": rehearsal, "device": "NVIDIA H100", "started": "2026-12-07T00:00:00+00:00",
            "accumplan": "accumplan 0.1.0", "rows": [row, skipped]}


class GpuProbes(unittest.TestCase):
    def run_script(self, folder, doc, *extra):
        path = os.path.join(folder, "results-gpu.json")
        with open(path, "w") as f:
            json.dump(doc, f)
        into = os.path.join(folder, "gpu-probes.json")
        r = subprocess.run([sys.executable, SCRIPT, path, "--into", into, *extra], capture_output=True, text=True)
        return r, into

    def test_a_run_adds_its_sequences_with_the_fields_the_replay_reads(self):
        with open(COMMITTED) as f:
            committed = json.load(f)
        with tempfile.TemporaryDirectory() as d:
            r, into = self.run_script(d, results())
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("skipped gpt_decoder at 8GiB", r.stderr)
            with open(into) as f:
                out = json.load(f)
            self.assertEqual(len(out["sequences"]), len(committed["sequences"]) + 1)
            added = out["sequences"][-1]
            self.assertEqual(set(added), set(committed["sequences"][0]))
            self.assertEqual(set(added["points"][0]), set(committed["sequences"][0]["points"][0]))
            self.assertEqual(added["true_max"], 366)
            # The same run again replaces its sequence rather than repeating it.
            r, _ = self.run_script(d, results(), "--base", into)
            with open(into) as f:
                self.assertEqual(len(json.load(f)["sequences"]), len(out["sequences"]))

    def test_a_rehearsal_is_refused_and_the_target_left_alone(self):
        with tempfile.TemporaryDirectory() as d:
            target = os.path.join(d, "gpu-probes.json")
            with open(target, "w") as f:
                f.write("before")
            r, _ = self.run_script(d, results(rehearsal=True))
            self.assertEqual(r.returncode, 2)
            self.assertIn("rehearsal", r.stderr)
            self.assertIn("--rehearsal-ok", r.stderr)
            with open(target) as f:
                self.assertEqual(f.read(), "before")
            r, _ = self.run_script(d, results(rehearsal=True), "--rehearsal-ok")
            self.assertEqual(r.returncode, 0, r.stderr)


if __name__ == "__main__":
    unittest.main()
