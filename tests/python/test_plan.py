"""accumplan.load_plan: versions, validation, the split arithmetic and the re-plan rule."""
import json
import os
import tempfile
import unittest

from helpers import GOLDEN_PLAN, as_version, golden_doc, make_plan, plan_doc

import accumplan


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


class LoadPlan(unittest.TestCase):
    def test_reads_the_golden_plans(self):
        paths = [GOLDEN_PLAN] + [p for p in (GOLDEN_PLAN.replace("plan.json", "plan-1.0.json"),) if os.path.exists(p)]
        self.assertEqual(len(paths), 2)
        for path in paths:
            with open(path) as f:
                doc = json.load(f)
            plan = accumplan.load_plan(path)
            self.assertIn(plan.schema_version, ("1.0", "1.1", "1.2", "1.3", "1.4", "1.5", "1.6", "1.7", "1.8", "1.9", "1.10", "1.11", "1.12", "1.13"))
            self.assertEqual(plan.microbatch_sizes, doc["microbatch_sizes"])
            self.assertEqual((plan.micro_batch, plan.accumulation_steps), (doc["micro_batch"], doc["accumulation_steps"]))
            self.assertEqual(plan.weights, doc["weights"])  # n_i / T, recomputed here
            self.assertEqual(plan.split_kind, "balanced")
            self.assertEqual(plan.normalization, "auto")
            # the reader's own arithmetic on fit + memory lands on the C++ solver's answer
            self.assertEqual(plan.largest_fitting(), doc["max_micro_batch"])
        self.assertEqual(accumplan.load_plan(paths[1]).largest_fitting(), 60)  # 1.0: budget x 0.9 headroom
        plan = accumplan.load_plan(paths[0])  # 1.2: the margin is bytes
        self.assertEqual(plan.margin_bytes, golden_doc()["memory"]["margin_bytes"])
        self.assertEqual(plan.memory["usable_bytes"], plan.memory["budget_bytes"] - plan.margin_bytes)

    def test_reads_1_0_and_1_1_layouts(self):
        old = as_version(golden_doc(), "1.0")
        self.assertIn("profile_points", old)
        # The C++ reader moves 1.0's top-level points into the profile, as it reads every 1.x layout.
        self.assertEqual(len(accumplan.load_plan(old).profile["points"]), len(old["profile_points"]))
        doc = as_version(golden_doc(), "1.1")
        self.assertNotIn("profile_points", doc)
        self.assertNotIn("trials", doc)
        plan = accumplan.load_plan(doc)
        self.assertEqual(plan.profile["points"][0]["micro_batch"], 1)
        self.assertEqual(plan.largest_fitting(), doc["max_micro_batch"])  # from fit + memory, not the points
        # 1.1 stated a headroom fraction; the C++ reader turns it into the 1.2 bytes of the budget.
        self.assertEqual(plan.margin_bytes, round(doc["memory"]["headroom"] * doc["memory"]["budget_bytes"]))
        doc["schema_version"] = "1.9"  # a later minor version: unknown fields are ignored
        doc["something_new"] = {"x": 1}
        self.assertEqual(accumplan.load_plan(doc).microbatch_sizes, golden_doc()["microbatch_sizes"])

    def test_refuses_another_major_version_and_another_schema(self):
        doc = golden_doc()
        doc["schema_version"] = "2.0"
        with self.assertRaisesRegex(accumplan.PlanError, "version 2.0 is not readable by this accumplan, which reads 1.x"):
            accumplan.load_plan(doc)
        doc = golden_doc()
        doc["schema"] = "accumplan.profile"
        with self.assertRaisesRegex(accumplan.PlanError, "this is a 'accumplan.profile' document, expected 'accumplan.plan'"):
            accumplan.load_plan(doc)

    def test_names_the_bad_field(self):
        doc = golden_doc()
        doc["microbatch_sizes"][2] = 0
        with self.assertRaisesRegex(accumplan.PlanError, r"\$\.microbatch_sizes\[2\]"):
            accumplan.load_plan(doc)
        doc = golden_doc()
        doc["microbatch_sizes"] = [52, 51]
        with self.assertRaisesRegex(accumplan.PlanError, "sizes sum to 103, but per_rank_batch is 256"):
            accumplan.load_plan(doc)
        doc = golden_doc()
        del doc["per_rank_batch"]
        with self.assertRaisesRegex(accumplan.PlanError, r"\$\.per_rank_batch: missing required field"):
            accumplan.load_plan(doc)
        doc = golden_doc()
        doc["world_size"] = 2
        with self.assertRaisesRegex(accumplan.PlanError, r"\$\.per_rank_batch: per_rank_batch \* world_size != target_batch"):
            accumplan.load_plan(doc)

    def test_hostile_files_are_refused_with_plan_error_before_reading(self):
        with tempfile.TemporaryDirectory() as d:
            fifo = os.path.join(d, "fifo")
            os.mkfifo(fifo)  # no writer: opening it would block for ever
            with self.assertRaisesRegex(accumplan.PlanError, r"is a FIFO \(named pipe\), not a file"):
                accumplan.load_plan(fifo)
            with self.assertRaisesRegex(accumplan.PlanError, "is a directory"):
                accumplan.load_plan(d)
            with self.assertRaisesRegex(accumplan.PlanError, "is a device, not a file"):
                accumplan.load_plan("/dev/zero")  # was a MemoryError
            latin = os.path.join(d, "latin1.json")
            with open(latin, "wb") as f:
                f.write(b'{"reason": "caf\xe9"}')
            with self.assertRaisesRegex(accumplan.PlanError, r"latin1\.json' is not valid JSON \(line 1, column 17, in \$\.reason\)"):
                accumplan.load_plan(latin)
            deep = os.path.join(d, "deep.json")
            with open(deep, "w") as f:
                f.write("[" * 100000 + "]" * 100000)
            with self.assertRaisesRegex(accumplan.PlanError, "nested deeper than 64 levels"):
                accumplan.load_plan(deep)
            array = os.path.join(d, "array.json")
            with open(array, "w") as f:
                f.write("[1, 2]")
            with self.assertRaisesRegex(accumplan.PlanError, r"array\.json': \$: expected an object, found array"):
                accumplan.load_plan(array)
            with self.assertRaisesRegex(TypeError, "path_or_doc"):
                accumplan.load_plan(42)

    def test_file_errors_and_the_model_hash(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaisesRegex(accumplan.PlanError, r"cannot open '.*missing\.json': No such file or directory"):
                accumplan.load_plan(os.path.join(d, "missing.json"))
            bad = os.path.join(d, "bad.json")
            with open(bad, "w") as f:
                f.write("{not json")
            with self.assertRaisesRegex(accumplan.PlanError, r"is not valid JSON \(line 1, column 3\)"):
                accumplan.load_plan(bad)
            model = os.path.join(d, "m.pt")
            with open(model, "wb") as f:
                f.write(b"model bytes")
            with self.assertRaisesRegex(accumplan.PlanError, "SHA-256"):
                accumplan.load_plan(GOLDEN_PLAN, model=model)
            accumplan.load_plan(GOLDEN_PLAN, model=model, force=True)
            doc = golden_doc()
            doc["model"]["sha256"] = accumplan.file_sha256(model)
            accumplan.load_plan(doc, model=model)
            # save() writes the current sizes and reads back
            plan = accumplan.load_plan(doc)
            plan.replan_below(52)
            out = os.path.join(d, "new.json")
            plan.save(out)
            again = accumplan.load_plan(out)
            self.assertEqual(again.microbatch_sizes, plan.microbatch_sizes)
            with open(out) as f:
                self.assertFalse(json.load(f)["confirmed"])
            # atomic: a save that cannot replace its target leaves the directory as it was
            os.mkdir(os.path.join(d, "taken"))
            before = sorted(os.listdir(d))
            with self.assertRaisesRegex(ValueError, "is a directory"):
                plan.save(os.path.join(d, "taken"))
            self.assertEqual(sorted(os.listdir(d)), before)
            self.assertEqual(os.stat(out).st_mode & 0o777, 0o666 & ~_umask())


class Arithmetic(unittest.TestCase):
    def test_balanced_and_uniform_splits_as_the_cpp_solver(self):
        self.assertEqual(accumplan.split_samples(256, 60), [52, 51, 51, 51, 51])
        self.assertEqual(accumplan.split_samples(256, 60, "uniform"), [32] * 8)
        self.assertEqual(accumplan.split_samples(26, 8), [7, 7, 6, 6])
        self.assertEqual(accumplan.split_samples(256, 60, "balanced", 8), [56, 56, 48, 48, 48])
        self.assertEqual(accumplan.balanced_split(256, 5, 8), [56, 56, 48, 48, 48])
        self.assertEqual(accumplan.split_samples(7, 4, "balanced", 8), [4, 3])  # short window drops the unit

    def test_short_windows_split_under_the_plans_largest_microbatch(self):
        doc = plan_doc([52, 51, 51, 51, 51])
        doc["max_micro_batch"] = 60  # memory allows 60; the window runs 52 at most
        plan = accumplan.load_plan(doc)
        self.assertEqual(plan.window_sizes(256), [52, 51, 51, 51, 51])
        self.assertEqual(plan.window_sizes(60), [30, 30])  # not one 60 nobody ran
        self.assertEqual(plan.window_sizes(7), [7])
        with self.assertRaises(ValueError):
            plan.window_sizes(257)

    def test_replan_below_uses_the_memory_model_and_the_bound(self):
        # the fit says 67 fit; an OOM at 52 bounds the microbatch by 51: 256 = 6 microbatches.
        plan = accumplan.load_plan(GOLDEN_PLAN)
        self.assertEqual(plan.largest_fitting(), 67)
        note = plan.replan_below(52)
        self.assertEqual(plan.microbatch_sizes, [43, 43, 43, 43, 42, 42])
        self.assertIn("out of memory at microbatch 52", note)
        self.assertFalse(plan.confirmed)
        # a memory model that allows only 20 wins over the bound 51
        usable = 208004920.3478261 + 12582448.973913044 * 20.5
        plan = make_plan([52, 51, 51, 51, 51], usable_bytes=int(usable))
        plan.replan_below(52)
        self.assertEqual(max(plan.microbatch_sizes), 20)
        self.assertEqual(len(plan.microbatch_sizes), 13)
        # uniform plans stay uniform; multiple_of is kept while it fits and dropped when not
        plan = make_plan([32] * 8, split="uniform")
        plan.replan_below(32)
        self.assertEqual(plan.microbatch_sizes, [16] * 16)
        plan = make_plan([56, 56, 48, 48, 48], multiple_of=8)
        plan.replan_below(56)
        self.assertEqual(plan.microbatch_sizes, [48, 48, 40, 40, 40, 40])
        plan = make_plan([8, 8], multiple_of=8)
        plan.replan_below(8)
        self.assertIsNone(plan.multiple_of)
        self.assertEqual(plan.microbatch_sizes, [6, 5, 5])
        with self.assertRaises(accumplan.OutOfMemoryAtOne):
            plan.replan_below(1)


if __name__ == "__main__":
    unittest.main()
