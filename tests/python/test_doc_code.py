"""Every ```python block of docs/exports.md and docs/plan-format.md runs, unless the line before it
is an HTML comment `<!-- not run ... -->` (illustrations that need packages Debian does not ship).
A block that trains (it calls backward) must train as plan.train_window does, to 1e-6 on every
parameter. The fixtures a block leaves to the reader (a plan and its exports in the working
directory, `model`, `optimizer`, `windows`) are made here.

exports.md's blocks read real exports: $ACCUMPLAN_BIN, else an accumplan built in build/."""
import json
import os
import re
import subprocess
import tempfile
import unittest

import torch

from helpers import ROOT, TinyLM, params_of, plan_doc, token_data

import accumplan

BIN = os.environ.get("ACCUMPLAN_BIN") or next(
    (p for p in (os.path.join(ROOT, d, "accumplan") for d in ("build", "build-planner-only")) if os.access(p, os.X_OK)),
    os.path.join(ROOT, "build", "accumplan"))
BLOCK = re.compile(r"^(<!--\s*not run\b[^\n]*-->\n)?```python\n(.*?)^```", re.S | re.M)
ATOL = 1e-6


def python_blocks(doc):
    """(code, runs) of every ```python block in docs/<doc>."""
    with open(os.path.join(ROOT, "docs", doc)) as f:
        return [(m.group(2), m.group(1) is None) for m in BLOCK.finditer(f.read())]


class LogitsLM(TinyLM):
    """TinyLM returning its logits [B,T,C] as a tensor, as the documented loops expect."""

    def forward(self, tokens):
        return super().forward(tokens)["logits"]


def token_plan_doc(sizes):
    """A per-token plan (auto normalization, [B,T] targets) stating AdamW and clipping."""
    doc = plan_doc(sizes)
    doc["setup"].update(optimizer="adamw", lr=0.01, hyperparameters={"beta2": 0.99, "weight_decay": 0.05},
                        max_grad_norm=0.05, amp="none", inputs=["int64[B,6]:10"], target="int64[B,6]:5")
    return accumplan.load_plan(doc).to_dict()


def reference(doc, x, y):
    """LogitsLM's parameters after plan.train_window over windows of per_rank_batch samples, with
    the plan's optimizer (torch.optim.AdamW with setup's values) and clipping."""
    model = LogitsLM()
    hp = doc["setup"]["hyperparameters"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=doc["setup"]["lr"], betas=(0.9, hp["beta2"]),
                                  weight_decay=hp["weight_decay"])
    plan = accumplan.load_plan(doc)
    T = plan.per_rank_batch
    for s in range(0, y.shape[0], T):
        plan.train_window(model, optimizer, (x[s:s + T],), y[s:s + T], max_grad_norm=doc["setup"]["max_grad_norm"])
    return params_of(model)


class DocCode(unittest.TestCase):
    def run_blocks(self, doc, make_namespace, expected):
        blocks = python_blocks(doc)
        runnable = [code for code, runs in blocks if runs]
        self.assertTrue(runnable, "no runnable python block found in %s" % doc)
        trained = 0
        for i, code in enumerate(runnable):
            with self.subTest(doc=doc, block=i), tempfile.TemporaryDirectory() as d:
                ns = make_namespace(d)
                cwd = os.getcwd()
                os.chdir(d)
                try:
                    exec(compile(code, "%s python block %d" % (doc, i), "exec"), ns)
                finally:
                    os.chdir(cwd)
                if "backward(" in code:
                    trained += 1
                    for g, r in zip(params_of(ns["model"]), expected):
                        torch.testing.assert_close(g, r, rtol=0, atol=ATOL)
        self.assertGreater(trained, 0, "%s has no training block to check" % doc)

    def test_plan_format_md_blocks_run_and_train_as_train_window(self):
        doc = token_plan_doc([4, 3, 3])
        x, y = token_data(20)  # two full windows of 10, -100 padding
        expected = reference(doc, x, y)
        self.assertGreater(max(float((a - b).abs().max()) for a, b in zip(expected, params_of(LogitsLM()))), 100 * ATOL)

        def namespace(d):
            with open(os.path.join(d, "plan.json"), "w") as f:
                json.dump(doc, f)
            model = LogitsLM()
            return {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.9, 0.99),
                                                                   weight_decay=0.05),
                    "windows": [(x[s:s + 10], y[s:s + 10]) for s in (0, 10)]}
        self.run_blocks("plan-format.md", namespace, expected)

    @unittest.skipUnless(os.access(BIN, os.X_OK) or "ACCUMPLAN_BIN" in os.environ, "no accumplan binary at %s" % BIN)
    def test_exports_md_blocks_run_on_real_exports_and_train_as_train_window(self):
        doc = token_plan_doc([4, 4])  # equal microbatches: what the exports run
        x, y = token_data(16)
        expected = reference(doc, x, y)

        def namespace(d):
            plan = os.path.join(d, "plan.json")
            with open(plan, "w") as f:
                json.dump(doc, f)
            for to, out in (("hf", "hf.json"), ("lightning", "lightning.yaml")):  # the default forms
                p = subprocess.run([BIN, "export", "--plan", plan, "--to", to, "--out", os.path.join(d, out)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
                self.assertEqual(p.returncode, 0, p.stderr.decode())
            return {"model": LogitsLM(),
                    "windows": [[(x[s:s + 4], y[s:s + 4]), (x[s + 4:s + 8], y[s + 4:s + 8])] for s in (0, 8)]}
        self.run_blocks("exports.md", namespace, expected)


if __name__ == "__main__":
    unittest.main()
