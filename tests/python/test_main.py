"""python -m accumplan: the executable's planner commands from pip. The same command lines through
`python -m accumplan` and through the accumplan executable give the same stdout, stderr and exit
code (plans, exports, reports and refusals); the device commands are refused in one line.
What it is not: a test of the commands themselves (tests/planner, tests/cli)."""
import os
import subprocess
import sys
import tempfile
import unittest

from helpers import ROOT

BIN = os.environ.get("ACCUMPLAN_BIN") or os.path.join(ROOT, "build", "accumplan")
PLAN = os.path.join(ROOT, "tests", "golden", "plan.json")
PROFILE = os.path.join(ROOT, "tests", "golden", "profile.json")


def run(argv, cwd):
    p = subprocess.run(argv, capture_output=True, cwd=cwd, env=dict(os.environ, NO_COLOR="1"), timeout=120)
    return p.returncode, p.stdout, p.stderr


class PythonDashM(unittest.TestCase):
    def test_the_same_command_lines_answer_the_same(self):
        if not os.access(BIN, os.X_OK):
            self.skipTest("no accumplan binary at %s (ACCUMPLAN_BIN)" % BIN)
        cases = [["export", "--plan", PLAN, "--to", "deepspeed"],
                 ["export", "--plan", PLAN, "--to", "lightning"],
                 ["export", "--plan", PLAN, "--to", "nope"],
                 ["export", "--plan", "missing.json", "--to", "hf"],
                 ["report", PLAN, "--format", "svg", "--out", "-"],
                 ["plan", "--profile", PROFILE, "--target-batch", "64", "--memory-budget", "256MiB"],
                 ["plan", "--profile", PROFILE, "--target-batch", "0"],
                 ["plan", "--profile", b"\xff\xfe.json", "--target-batch", "8"],  # a name that is not UTF-8
                 ["export", "--help"]]
        with tempfile.TemporaryDirectory() as d:
            for args in cases:
                with self.subTest(" ".join(map(os.fsdecode, args[:2]))):
                    ours = run([sys.executable, "-m", "accumplan"] + args, d)
                    theirs = run([BIN] + args, d)
                    self.assertEqual(ours, theirs)
                    self.assertIn(ours[0], (0, 2))
            self.assertEqual(run([sys.executable, "-m", "accumplan", "export", "--plan", PLAN, "--to", "nope"], d)[0], 2)

    def test_the_device_commands_are_refused_in_one_line(self):
        with tempfile.TemporaryDirectory() as d:
            code, out, err = run([sys.executable, "-m", "accumplan"], d)
        self.assertEqual((code, out), (2, b""))
        self.assertRegex(err.decode(), r"^accumplan: error: this runs the planner's commands only: plan, export and "
                                       r"report \(measure and train with accumplan.plan .*\)\n$")


if __name__ == "__main__":
    unittest.main()
