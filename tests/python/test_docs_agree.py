"""The docs against the code they describe: every schema range the docs state ("1.0 to 1.7")
ends at the readers' version; every `--option` the docs name is an option of some accumplan
command, or of another tool the docs show (named below with its tool); the signature of
accumplan.plan in docs/python.md lists exactly the function's parameters.
What it is not: a check of prose; the runnable examples are test_doc_code's."""
import glob
import inspect
import os
import re
import subprocess
import unittest

from helpers import ROOT

import accumplan
from accumplan import _core

BIN = os.environ.get("ACCUMPLAN_BIN") or os.path.join(ROOT, "build", "accumplan")
DOCS = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
OTHER_TOOLS = {  # options the docs show on other tools' command lines
    "cmake": {"--build", "--install", "--prefix"}, "ctest": {"--test-dir"}, "pkg-config": {"--cflags", "--libs"},
    "pip": {"--no-build-isolation"}, "python -m venv": {"--system-site-packages"}, "ld": {"--exclude-libs"},
    "accelerate launch / LightningCLI": {"--config_file", "--config"},
    "torchrun": {"--nnodes", "--nproc_per_node", "--node_rank", "--master_addr", "--master_port", "--no_python",
                 "--redirects", "--tee"},
    "scripts/gpu-check.sh, tests/bench/checkpoint_bench.py, tests/bench/sharding_bench.py": {"--rehearse", "--models",
                                                                                            "--worlds"},
    "tests/bench/gpu_probes.py": {"--rehearsal-ok", "--into", "--base"},
}


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


class DocsAgree(unittest.TestCase):
    def test_every_schema_range_ends_at_the_readers_version(self):
        major, minor = _core.SCHEMA_VERSION.split(".")
        for path in DOCS:
            for m in re.finditer(r"\b1\.0 ?(?:to|–|-|\.\.) ?(\d+)\.(\d+)\b", read(path)):
                with self.subTest(os.path.relpath(path, ROOT), said=m.group(0)):
                    self.assertEqual((m.group(1), m.group(2)), (major, minor))

    def test_every_option_the_docs_name_is_a_command_line_option(self):
        if not os.access(BIN, os.X_OK):
            self.skipTest("no accumplan binary at %s (ACCUMPLAN_BIN)" % BIN)
        top = subprocess.run([BIN, "--help"], capture_output=True, text=True, check=True).stdout
        commands = re.findall(r"^  ([a-z]+)\b", top.split("Subcommands:")[1], re.M)
        self.assertIn("run", commands)
        helps = top + "".join(subprocess.run([BIN, c, "--help"], capture_output=True, text=True, check=True).stdout
                              for c in commands)
        known = set(re.findall(r"--[a-z][a-z0-9-]+", helps)).union(*OTHER_TOOLS.values())
        for path in DOCS:
            named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9_-]+", read(path)))
            with self.subTest(os.path.relpath(path, ROOT)):
                self.assertEqual(sorted(named - known), [])

    def test_the_documented_signature_of_plan_is_the_functions(self):
        text = read(os.path.join(ROOT, "docs", "python.md"))
        block = re.search(r"^plan = accumplan\.plan\((.*?)^plan\.save", text, re.S | re.M).group(1)
        documented = set(re.findall(r"\b([a-z_]+)=", re.sub(r"#[^\n]*", "", block)))
        documented |= {"model", "inputs", "target", "target_batch", "optimizer"} & set(re.findall(r"\w+", block))
        actual = set(inspect.signature(accumplan.plan).parameters)
        if actual == {"model", "inputs", "target", "kwargs"}:  # the package's wrapper: the measuring function's
            from accumplan.measure import plan as measured
            actual = set(inspect.signature(measured).parameters)
        self.assertEqual(documented, actual)


if __name__ == "__main__":
    unittest.main()
