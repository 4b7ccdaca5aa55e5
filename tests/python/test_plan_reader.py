"""The one plan reader: accumplan.load_plan reads through the C++ plan reader (the
compiled core), so it refuses exactly what the accumplan binary refuses, with the same message.

What it is: every file of the plan reader's fuzz corpus (tests/fuzz/corpus/plan_reader/) and a set
of hand-made bad plans — the cases the old Python validator accepted and `accumplan run` refused
among them (a `uniform` split of 3x5 for a batch of 256, NaN weights, schema_version "1.x", an
unknown loss) — each read by the binary (`accumplan export --plan F --to hf`, whose first step is
the plan reader) and by load_plan: both accept, or both refuse with the same text after the
file's name ("--plan 'F': ..." there, "plan 'F': ..." here). The truth is the binary's verdict,
not a copy of its rules.
What it is not: a test of the export, nor of a plan given as a dict (test_hostile_api.py).
"""
import copy
import json
import os
import subprocess
import tempfile
import unittest

from helpers import ROOT, golden_doc, in_python_words

import accumplan

BIN = os.environ.get("ACCUMPLAN_BIN", os.path.join(ROOT, "build", "accumplan"))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus", "plan_reader")


def cli_reader_verdict(path):
    """None when the binary's plan reader accepts ``path``; else its message after "--plan "."""
    r = subprocess.run([BIN, "export", "--plan", path, "--to", "hf"], capture_output=True, text=True, timeout=60)
    prefix = "accumplan: error: --plan "
    first = r.stderr.strip().splitlines()[0] if r.stderr.strip() else ""
    if r.returncode != 0 and first.startswith(prefix):
        return first[len(prefix):]
    return None  # accepted by the reader (export may still have refused for its own reasons)


def python_verdict(path):
    try:
        accumplan.load_plan(path)
    except accumplan.PlanError as e:
        text = str(e)
        return text[len("plan "):] if text.startswith("plan ") else "(no 'plan ' prefix) " + text
    return None


def bad_plans():
    """(name, document) pairs the old Python validator and the C++ reader disagreed on, and others."""
    def edit(fn):
        d = golden_doc()
        fn(d)
        return d
    uniform = golden_doc()
    uniform.update(split="uniform", microbatch_sizes=[3] * 5, weights=[3 / 15] * 5, micro_batch=3,
                   accumulation_steps=5)
    return [
        ("uniform-3x5-for-256", uniform),
        ("nan-weight", edit(lambda d: d["weights"].__setitem__(0, float("nan")))),  # json.dump writes NaN
        ("schema-1.x", edit(lambda d: d.update(schema_version="1.x"))),
        ("unknown-loss", edit(lambda d: d["setup"].update(loss="hinge"))),
        ("major-2", edit(lambda d: d.update(schema_version="2.0"))),
        ("a-profile", edit(lambda d: d.update(schema="accumplan.profile"))),
        ("size-0", edit(lambda d: d["microbatch_sizes"].__setitem__(2, 0))),
        ("sizes-do-not-sum", edit(lambda d: d.update(microbatch_sizes=[1, 1, 1]))),
        ("no-per-rank-batch", edit(lambda d: d.pop("per_rank_batch"))),
        ("world-size-2", edit(lambda d: d.update(world_size=2))),
        ("weight-off", edit(lambda d: d["weights"].__setitem__(0, 0.75))),
        ("weights-null", edit(lambda d: d.update(weights=None))),
        ("confirmed-string", edit(lambda d: d.update(confirmed="no"))),
        ("ignore-index-2^31", edit(lambda d: d["setup"].update(ignore_index=2 ** 31))),
        ("good", golden_doc()),
    ]


class OneReader(unittest.TestCase):
    def assertSameVerdict(self, path):
        cli, py = cli_reader_verdict(path), python_verdict(path)
        # The same refusal, each in its own front end's words (--target-batch / target_batch).
        self.assertEqual(py, None if cli is None else in_python_words(cli),
                         "load_plan and the binary disagree on %s" % os.path.basename(path))
        return cli

    def test_the_fuzz_corpus_is_read_alike(self):
        names = sorted(os.listdir(CORPUS))
        self.assertGreaterEqual(len(names), 10)
        refused = 0
        for name in names:
            with self.subTest(file=name):
                refused += self.assertSameVerdict(os.path.join(CORPUS, name)) is not None
        self.assertGreater(refused, 0)  # the corpus holds bad plans: the comparison is not vacuous

    def test_hand_made_bad_plans_are_refused_alike(self):
        with tempfile.TemporaryDirectory() as d:
            for name, doc in bad_plans():
                path = os.path.join(d, name + ".json")
                with open(path, "w") as f:
                    json.dump(doc, f)
                with self.subTest(plan=name):
                    verdict = self.assertSameVerdict(path)
                    if name == "good":
                        self.assertIsNone(verdict)
                    else:
                        self.assertIsNotNone(verdict, "the binary accepted %s" % name)

    def test_a_dict_is_refused_with_the_files_message(self):
        doc = golden_doc()
        doc["setup"]["loss"] = "hinge"
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "p.json")
            with open(path, "w") as f:
                json.dump(doc, f)
            cli = cli_reader_verdict(path)
        with self.assertRaises(accumplan.PlanError) as cm:
            accumplan.load_plan(copy.deepcopy(doc))
        # "plan: $.setup.loss: ..." against "'.../p.json': $.setup.loss: ...": the same after the source.
        self.assertEqual(str(cm.exception).split(": ", 1)[1], in_python_words(cli.split(": ", 1)[1]))


if __name__ == "__main__":
    unittest.main()
