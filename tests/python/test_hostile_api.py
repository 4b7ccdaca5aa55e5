"""Hostile input to the public API: every public function raises PlanError, ValueError or
TypeError with a one-line message naming the argument (or the plan field's JSON path), never an
internal error (RecursionError, OSError, IndexError, torch's RuntimeError, ZeroDivisionError...),
never a hang, and never accepts a wrong value silently. The plan reader refuses what the C++ reader
(planner/src/schema.cpp) refuses, with its ranges."""
import json
import os
import tempfile
import unittest

import torch

from helpers import golden_doc, make_plan, plan_doc
from test_packing import packed_plan

import accumplan


def _one_line(test, error):
    test.assertNotIn("\n", str(error))


class HostilePlanDocuments(unittest.TestCase):
    def assertRefused(self, doc, pattern):
        with self.assertRaisesRegex(accumplan.PlanError, pattern) as cm:
            accumplan.load_plan(doc)
        _one_line(self, cm.exception)

    def test_deep_nesting_is_refused_with_its_path(self):
        doc = plan_doc([4, 4])
        deep = inner = {}
        for _ in range(100000):
            inner["x"] = {}
            inner = inner["x"]
        doc["setup"]["extra"] = deep
        self.assertRefused(doc, r"\$\.setup\.extra(\.x)+(\.\.\.)?: nested deeper than 64 levels")
        loop = plan_doc([4, 4])
        loop["setup"]["self"] = loop["setup"]  # a cycle is nesting without end
        self.assertRefused(loop, r"\$\.setup\.self\.self.*nested deeper than 64 levels")
        shared = []
        for _ in range(40):  # 2**40 leaves if expanded
            shared = [shared, shared]
        bomb = plan_doc([4, 4])
        bomb["reason_parts"] = shared
        self.assertRefused(bomb, "more than 1048576 JSON values")
        with tempfile.TemporaryDirectory() as d:
            for depth in (100, 100000):
                path = os.path.join(d, "deep%d.json" % depth)
                text = json.dumps(plan_doc([4, 4]))
                with open(path, "w") as f:
                    f.write(text[:-1] + ', "setup2": ' + '{"a": ' * depth + "1" + "}" * depth + "}")
                with self.subTest(depth=depth):
                    self.assertRefused(path, r"plan '.*deep%d\.json': \$(\.a|\.setup2)+.*: nested deeper than 64 levels" % depth)

    def test_huge_integers_in_a_file_name_their_field(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "plan.json")
            text = json.dumps(plan_doc([4, 4]))
            with open(path, "w") as f:
                f.write(text.replace('"world_size": 1', '"world_size": 1' + "0" * 100000))
            self.assertRefused(path, r"plan\.json.*\$\.world_size: the number 10+\.\.\. \(100001 characters\) is beyond the "
                                     r"range of a double")
            with open(path, "w") as f:
                f.write(text[:-1] + ', "extra": NaN}')
            self.assertRefused(path, r"plan\.json' is not valid JSON \(line 1, column \d+, in \$\.extra\)")  # NaN is not JSON
            with open(path, "w") as f:
                f.write(text[:-1] + ', "extra": 1e400}')
            self.assertRefused(path, r"\$\.extra: the number 1e400 is beyond the range of a double")

    def test_numbers_out_of_the_cli_readers_ranges(self):
        big = 2 ** 70
        doc = plan_doc([big, big])
        # Beyond 64 bits the JSON reader holds the number as a double, and says so.
        self.assertRefused(doc, r"\$\.\w+: [0-9.]+e\+21 is out of range; expected a number in \[1, 1099511627776\]")
        cases = [
            (("setup", "ignore_index"), 2 ** 63, r"\$\.setup\.ignore_index: 9223372036854775808 is out of range; "
                                                 r"expected a number in \[-2147483648, 2147483647\]"),
            (("setup", "ignore_index"), 2 ** 31, r"\$\.setup\.ignore_index: 2147483648 is out of range"),
            (("setup", "max_grad_norm"), -1.0, r"\$\.setup\.max_grad_norm: -1\.0 is out of range; expected a number "
                                               r"in \(0, 1000000000000\]"),
        ]
        for keys, value, pattern in cases:
            doc = plan_doc([4, 4])
            holder = doc
            for k in keys[:-1]:
                holder = holder[k]
            holder[keys[-1]] = value
            with self.subTest(keys=keys, value=value):
                self.assertRefused(doc, pattern or r"\$\.%s" % keys[-1])
        self.assertRefused(plan_doc([4, 4], world_size=2 ** 21), r"\$\.world_size: 2097152 is out of range; expected a "
                                                                 r"number in \[1, 1048576\]")
        doc = plan_doc([4, 4], version="1.3")
        doc["tokens"] = {"token_budget": 2 ** 70, "max_seq_len": 8, "longest_sequence_alone": 8}
        self.assertRefused(doc, r"\$\.tokens\.token_budget: 1\.18059[0-9]*e\+21 is out of range; expected a "
                                r"number in \[1, 1099511627776\]")

    def test_weights_are_numbers_equal_to_the_sizes_over_the_batch(self):
        for weights, pattern in (([float("nan"), 0.5], r"\$\.weights\[0\]: nan is not a JSON number"),
                                 (["x", 0.5], r"\$\.weights\[0\]: expected a number, found string"),
                                 ([True, 0.5], r"\$\.weights\[0\]: expected a number, found boolean"),
                                 (None, r"\$\.weights: expected an array, found null"),
                                 ([0.5], r"\$\.weights: 1 weights for 2 microbatches"),
                                 ([0.75, 0.25], r"\$\.weights\[0\]: 0\.75 is not microbatch_sizes\[0\] / "
                                                r"per_rank_batch = 0\.5")):
            doc = plan_doc([4, 4])
            doc["weights"] = weights
            with self.subTest(weights=weights):
                self.assertRefused(doc, pattern)
        doc = plan_doc([4, 4])
        del doc["weights"]
        self.assertRefused(doc, r"\$\.weights: missing required field")

    def test_schema_version_is_major_dot_minor_digits(self):
        for version in ("1.0.0", "\u00b9.0", "1.", "+1.0", "-1.0", "1", "1.x", "1" * 20 + ".0", 1.0, None):
            doc = plan_doc([4, 4])
            doc["schema_version"] = version
            with self.subTest(version=version):
                self.assertRefused(doc, r"\$\.schema_version: (.* is not MAJOR\.MINOR|expected a string, found)")
        doc = plan_doc([4, 4])
        doc["schema_version"] = "1.12"
        accumplan.load_plan(doc)

    def test_other_fields_keep_their_types(self):
        for key, value, kind in (("confirmed", "no", "a boolean"), ("reason", 5, "a string")):
            doc = plan_doc([4, 4])
            doc[key] = value
            with self.subTest(key=key):
                self.assertRefused(doc, r"\$\.%s: expected %s" % (key, kind))
        doc = plan_doc([4, 4])
        doc["setup"][3] = "x"
        self.assertRefused(doc, r"\$\.setup has the key 3; JSON keys are strings")
        doc = plan_doc([4, 4])
        doc["setup"]["extra"] = {1, 2}
        self.assertRefused(doc, r"\$\.setup\.extra: a value of type set is not JSON")


class HostileFiles(unittest.TestCase):
    def test_the_model_argument_is_a_regular_file(self):
        doc = golden_doc()
        with tempfile.TemporaryDirectory() as d:
            fifo = os.path.join(d, "fifo")
            os.mkfifo(fifo)
            for model, kind, pattern in ((123, TypeError, "model must be a path"),
                                         (True, TypeError, "model must be a path"),
                                         ("/dev/zero", accumplan.PlanError, "model '/dev/zero' is not a regular file"),
                                         (fifo, accumplan.PlanError, "is not a regular file"),
                                         (".", accumplan.PlanError, "model '.' is a directory"),
                                         (os.path.join(d, "missing"), accumplan.PlanError, "cannot read model"),
                                         ("", accumplan.PlanError, "model '': an empty path"),
                                         ("a\0b", accumplan.PlanError, "NUL")):
                with self.subTest(model=model):
                    with self.assertRaisesRegex(kind, pattern):
                        accumplan.load_plan(doc, model=model)
            for path, kind, pattern in (("/dev/zero", accumplan.PlanError, "path '/dev/zero' is not a regular file"),
                                        (fifo, accumplan.PlanError, "not a regular file"),
                                        (d, accumplan.PlanError, "is a directory"),
                                        (7, TypeError, "path must be a path")):
                with self.subTest(path=path):
                    with self.assertRaisesRegex(kind, pattern):
                        accumplan.file_sha256(path)
            model = os.path.join(d, "m.pt")
            with open(model, "wb") as f:
                f.write(b"weights")
            with self.assertRaisesRegex(TypeError, "force must be True or False"):
                accumplan.load_plan(doc, model=model, force="no")

    def test_save_checks_its_path_before_writing(self):
        plan = make_plan([4, 4])
        with tempfile.TemporaryDirectory() as d:
            for path, pattern in ((os.path.join(d, "nodir", "p.json"), "no such directory"),
                                  (d, "is a directory"),
                                  ("", "an empty path"),
                                  ("/dev/null", "not a regular file")):
                with self.subTest(path=path):
                    with self.assertRaisesRegex(ValueError, pattern) as cm:
                        plan.save(path)
                    _one_line(self, cm.exception)
            with self.assertRaisesRegex(TypeError, "path must be a path"):
                plan.save(3)
            self.assertEqual(os.listdir(d), [])  # nothing half-written
            if os.geteuid() != 0:
                locked = os.path.join(d, "locked")
                os.mkdir(locked, 0o500)
                with self.assertRaisesRegex(ValueError, "is not writable"):
                    plan.save(os.path.join(locked, "p.json"))
                self.assertEqual(os.listdir(locked), [])
            plan.save(os.path.join(d, "p.json"))
            self.assertEqual(accumplan.load_plan(os.path.join(d, "p.json")).microbatch_sizes, [4, 4])


class HostileArithmetic(unittest.TestCase):
    def test_window_sizes_takes_a_sample_count(self):
        plan = make_plan([4, 4])
        for bad, kind in (("3", TypeError), (3.5, TypeError), (None, TypeError), (0, ValueError), (-1, ValueError)):
            with self.subTest(bad=bad):
                with self.assertRaisesRegex(kind, "samples"):
                    plan.window_sizes(bad)
        self.assertEqual(plan.window_sizes(torch.tensor(5)), [3, 2])

    def test_the_split_functions_name_their_arguments(self):
        cases = ((accumplan.balanced_split, (10, 0), ValueError, r"parts is 0, out of range"),
                 (accumplan.balanced_split, (10, -2), ValueError, r"parts is -2"),
                 (accumplan.balanced_split, (10.5, 2), TypeError, r"total must be an integer"),
                 (accumplan.balanced_split, (10, 4, 4), ValueError, r"has no solution"),
                 (accumplan.balanced_split, (2 ** 40, 2 ** 40), ValueError, r"parts is 1099511627776"),
                 (accumplan.split_samples, (8, 0), ValueError, r"max_micro_batch is 0"),
                 (accumplan.split_samples, (8, 4, "nope"), ValueError, r"split is 'nope'; use one of balanced, uniform"),
                 (accumplan.split_samples, (8, 4, None), TypeError, r"split must be a string"),
                 (accumplan.split_samples, (8, 4, "balanced", 0), ValueError, r"unit is 0"),
                 (accumplan.split_samples, (8.5, 4), TypeError, r"total must be an integer, not float"),
                 (accumplan.split_samples, (2 ** 40, 1), ValueError, r"need 1099511627776 microbatches; .* at most"),
                 (accumplan.largest_divisor_at_most, (8, 0), ValueError, r"limit is 0"),
                 (accumplan.largest_divisor_at_most, (0, 4), ValueError, r"total is 0"),
                 (accumplan.pack_by_token_budget, ([3, 4], 2 ** 70), ValueError, r"token_budget is 1180591620717411303424"),
                 (accumplan.pack_by_token_budget, (["x"], 8), TypeError, r"lengths\[0\] must be an integer, not str"),
                 (accumplan.pack_by_token_budget, ([3], 8, {"per_token": 1}), ValueError, r"step_cost has no per_microbatch"),
                 (accumplan.pack_by_token_budget, ([3], 8, {"per_microbatch": 1, "per_token": 0, "per_token_squared": 0}),
                  ValueError, r"step_cost\['per_token'\]: 0 is out of range"))
        for fn, args, kind, pattern in cases:
            with self.subTest(fn=fn.__name__, args=args):
                with self.assertRaisesRegex(kind, pattern) as cm:
                    fn(*args)
                _one_line(self, cm.exception)

    def test_the_arithmetic_still_agrees_with_the_planner(self):
        self.assertEqual(accumplan.largest_divisor_at_most(1099511627689, 2 ** 40), 1099511627689)  # a prime, at once
        self.assertEqual(accumplan.largest_divisor_at_most(256, 60, 8), 32)
        self.assertEqual(accumplan.largest_divisor_at_most(7, 4, 2), 0)
        self.assertEqual(accumplan.split_samples(256, 60, "uniform"), [32] * 8)
        self.assertEqual(accumplan.split_samples(2 ** 40, 2 ** 20), [2 ** 20] * 2 ** 20)


class HostileTraining(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.model = torch.nn.Linear(3, 10)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.x = torch.randn(4, 3)

    def window(self, target, plan=None, **kwargs):
        return (plan or make_plan([2, 2])).train_window(self.model, self.opt, (self.x,), target, **kwargs)

    def test_max_grad_norm_is_in_the_cli_range(self):
        y = torch.randint(0, 10, (4,))
        for bad, kind in ((-1, ValueError), (0, ValueError), (float("nan"), ValueError), (float("inf"), ValueError),
                          (1e13, ValueError), ("1", TypeError), (True, TypeError)):
            with self.subTest(bad=bad):
                with self.assertRaisesRegex(kind, "max_grad_norm"):
                    self.window(y, max_grad_norm=bad)
        self.assertTrue(self.window(y, max_grad_norm=1).stepped)

    def test_autocast_takes_the_documented_dtypes_and_names(self):
        y = torch.randint(0, 10, (4,))
        for bad, kind in (("bf17", ValueError), (torch.float32, ValueError), (1, TypeError)):
            with self.subTest(bad=bad):
                with self.assertRaisesRegex(kind, "autocast") as cm:
                    self.window(y, autocast=bad)
                _one_line(self, cm.exception)
        self.assertTrue(self.window(y, autocast="bf16").stepped)
        self.assertTrue(self.window(y, autocast="none").stepped)
        try:  # torch 1.13 cannot autocast to float16 on a CPU: a ValueError naming autocast, or it runs
            self.window(y, autocast="fp16")
        except ValueError as e:
            self.assertIn("autocast 'fp16' is not supported on cpu", str(e))

    def test_cross_entropy_targets_are_classes_of_the_output(self):
        before = [p.detach().clone() for p in self.model.parameters()]
        for target, pattern in ((torch.tensor([1, 2, 10, 3]), r"class 10 \(at flat position 0 of the microbatch\), outside the output's 10 classes \[0, 9\]"),
                                (torch.tensor([1, -1, 2, 3]), r"class -1 "),
                                (torch.tensor([1, 2, 3, 2 ** 40]), r"class 1099511627776 "),
                                (torch.randn(4), r"floating target \(class probabilities\) needs .* got output \[2, 10\] and target \[2\]"),
                                (torch.tensor([True, False, True, False]), r"not bool")):
            with self.subTest(target=target):
                with self.assertRaisesRegex(ValueError, pattern) as cm:
                    self.window(target)
                _one_line(self, cm.exception)
        for p, q in zip(before, self.model.parameters()):  # refused before any step
            self.assertTrue(torch.equal(p, q))
        self.assertTrue(self.window(torch.tensor([1, -100, 2, 3])).stepped)  # ignore_index is no class

    def test_an_empty_window_is_refused(self):
        with self.assertRaisesRegex(ValueError, "holds no samples"):
            make_plan([2, 2]).train_window(self.model, self.opt, (self.x[:0],), torch.zeros(0, dtype=torch.long))
        with self.assertRaisesRegex(ValueError, "holds no samples"):
            list(make_plan([2, 2]).split((self.x[:0],), torch.zeros(0, dtype=torch.long)))


class HostileRaggedData(unittest.TestCase):
    def test_pad_sequences_checks_its_arguments(self):
        seqs = [torch.tensor([1, 2, 3]), torch.tensor([4])]
        cases = (((seqs,), {"ignore_index": 2 ** 63}, ValueError, r"ignore_index is 9223372036854775808"),
                 (([torch.ones(2, 2, dtype=torch.long)],), {}, TypeError, r"sequences\[0\] must be a 1-D tensor, "
                                                                          r"not a tensor of shape \[2, 2\]"),
                 ((["abc"],), {}, TypeError, r"sequences\[0\] must be a 1-D tensor, not str"),
                 (("abc",), {}, TypeError, r"sequences must be a list of 1-D tensors, not str"),
                 (([torch.tensor([1.5, 2.0])],), {}, TypeError, r"sequences\[0\] is a float32 tensor"),
                 (([],), {}, ValueError, r"sequences is empty"),
                 (([torch.tensor([], dtype=torch.long)],), {}, ValueError, r"sequences\[0\] is empty"),
                 ((seqs, [torch.ones(3, 1), torch.ones(1, 1)]), {}, TypeError, r"targets\[0\] must be a 1-D tensor"),
                 ((seqs, [torch.ones(3, dtype=torch.bool), torch.ones(1, dtype=torch.bool)]), {}, TypeError,
                  r"targets\[0\] is a bool tensor"),
                 ((seqs,), {"next_token": "yes"}, TypeError, r"next_token must be True or False"))
        for args, kwargs, kind, pattern in cases:
            with self.subTest(args=args, kwargs=kwargs):
                with self.assertRaisesRegex(kind, pattern) as cm:
                    accumplan.pad_sequences(*args, **kwargs)
                _one_line(self, cm.exception)
        x, y, lengths = accumplan.pad_sequences(seqs, next_token=True, ignore_index=-1)
        self.assertEqual(y.tolist(), [[2, 3, -1], [-1, -1, -1]])

    def test_counts_and_masks_check_their_arguments(self):
        x, y, lengths = accumplan.pad_sequences([torch.tensor([1, 2, 3]), torch.tensor([4])], next_token=True)
        with self.assertRaisesRegex(ValueError, "ignore_index is 1180591620717411303424"):
            accumplan.valid_token_counts(lengths, y, ignore_index=2 ** 70)
        for args, kind, pattern in ((([2 ** 70], 4), ValueError, r"lengths\[0\] is 1180591620717411303424"),
                                    (([2], -1), ValueError, r"padded_length is -1, out of range \[2, "),
                                    (([3], 2), ValueError, r"padded_length is 2, out of range \[3, "),
                                    (([2], 2.0), TypeError, r"padded_length must be an integer"),
                                    ((["2"], 4), TypeError, r"lengths\[0\] must be an integer")):
            with self.subTest(args=args):
                with self.assertRaisesRegex(kind, pattern):
                    accumplan.padding_mask(*args)
        self.assertEqual(accumplan.padding_mask(torch.tensor([1, 3]), 3).tolist(),
                         [[False, True, True], [False, False, False]])
        self.assertEqual(accumplan.padding_mask([], 0).shape, (0, 0))

    def test_loss_sum_range_checks_ignore_index_and_takes_any_integer_target(self):
        with self.assertRaisesRegex(ValueError, "ignore_index is 1180591620717411303424"):
            accumplan.loss_sum(torch.randn(2, 3), torch.tensor([0, 1]), ignore_index=2 ** 70)
        logits = torch.randn(2, 3)
        self.assertTrue(torch.equal(accumplan.loss_sum(logits, torch.tensor([0, 2], dtype=torch.int32)),
                                    accumplan.loss_sum(logits, torch.tensor([0, 2]))))  # was a RuntimeError

    def test_count_units_checks_its_arguments(self):
        y = torch.tensor([[1, -100], [2, 3]])
        self.assertEqual(accumplan.count_units(y, 2, "tokens"), 3)
        for args, kind, pattern in (((y, 2, "token"), ValueError, "normalization is 'token'"),
                                    ((y, 2, "tokens", 2 ** 70), ValueError, "ignore_index is 1180591620717411303424"),
                                    ((y, 2.5, "samples"), TypeError, "samples must be an integer"),
                                    (([1, 2], 2, "tokens"), TypeError, "a target tensor"),
                                    ((None, 2, "tokens"), ValueError, "needs a target")):
            with self.subTest(args=args[1:]):
                with self.assertRaisesRegex(kind, pattern):
                    accumplan.count_units(*args)

    def test_a_packed_plan_still_packs(self):
        plan = packed_plan(2, token_budget=40, max_seq_len=20)
        self.assertEqual(plan.pack([3, 5]), [[1, 0]])


if __name__ == "__main__":
    unittest.main()
