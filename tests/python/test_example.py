"""examples/python/train_with_plan.py runs as documented and trains like plan.train_window;
examples/python/plan_ragged.py plans and trains packed windows of ragged sequences."""
import os
import subprocess
import sys
import tempfile
import unittest

import torch

from helpers import ROOT, Classifier, classifier_data, params_of, plan_doc

import accumplan

EXAMPLE = os.path.join(ROOT, "examples", "python", "train_with_plan.py")


class Example(unittest.TestCase):
    def test_the_example_trains_as_train_window_does(self):
        with tempfile.TemporaryDirectory() as d:
            m, data, plan_path, out = (os.path.join(d, n) for n in ("m.pt", "data.pt", "plan.json", "out.pt"))
            torch.jit.save(torch.jit.script(Classifier()), m)
            x, y = classifier_data(30)  # windows 13, 13, 4
            torch.save([x, y], data)
            doc = plan_doc([5, 4, 4])
            doc["model"]["sha256"] = accumplan.file_sha256(m)
            doc["setup"]["lr"] = 0.5
            accumplan.Plan(doc).save(plan_path)
            p = subprocess.run([sys.executable, EXAMPLE, "--plan", plan_path, "--model", m, "--data", data,
                                "--save", out], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120,
                               env=dict(os.environ, WORLD_SIZE="1"))
            self.assertEqual(p.returncode, 0, p.stdout.decode())
            self.assertIn("window 2: loss", p.stdout.decode())

            ref = torch.jit.load(m)
            opt = torch.optim.SGD(ref.parameters(), lr=0.5)
            plan = accumplan.load_plan(plan_path)
            for s in (0, 13, 26):
                plan.train_window(ref, opt, (x[s:s + 13],), y[s:s + 13])
            for g, w in zip(params_of(torch.jit.load(out)), params_of(ref)):
                torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-7)




class RaggedExample(unittest.TestCase):
    def test_the_ragged_example_plans_and_trains_packed_windows(self):
        script = os.path.join(ROOT, "examples", "python", "plan_ragged.py")
        with tempfile.TemporaryDirectory() as d:
            plan_path = os.path.join(d, "plan.json")
            p = subprocess.run([sys.executable, script, "--windows", "2", "--plan-out", plan_path],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
            out = p.stdout.decode()
            self.assertEqual(p.returncode, 0, out)
            self.assertRegex(out, r"window 2: loss [0-9.]+ over [0-9]+ tokens in microbatches \[")
            plan = accumplan.load_plan(plan_path)
            self.assertIsNotNone(plan.tokens)
            self.assertIn("plan: token budget %d padded tokens" % plan.tokens["token_budget"], out)


if __name__ == "__main__":
    unittest.main()
