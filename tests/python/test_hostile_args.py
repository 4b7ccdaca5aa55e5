"""Hostile arguments to the public functions: each raises TypeError or ValueError (or
PlanError) with a message naming the argument; never torch's RuntimeError, an OverflowError from a
2**70, or a float tensor of lengths silently truncated."""
import unittest

import torch

from helpers import make_plan
from test_packing import packed_plan

import accumplan


class HostileArguments(unittest.TestCase):
    def test_replan_below_takes_a_microbatch_size(self):
        for bad, kind in ((2 ** 70, ValueError), (0, ValueError), (-3, ValueError), (2.5, TypeError),
                          ("4", TypeError), (True, TypeError), (None, TypeError), (torch.tensor(2.0), TypeError)):
            with self.subTest(bad=bad):
                with self.assertRaisesRegex(kind, "failing_micro_batch"):
                    make_plan([4, 4]).replan_below(bad)
        plan = make_plan([4, 4])
        plan.replan_below(torch.tensor(4))  # a 0-dim integer tensor is an integer
        self.assertTrue(max(plan.microbatch_sizes) <= 3)

    def test_repack_below_takes_token_counts(self):
        plan = packed_plan(4, token_budget=40, max_seq_len=20)
        with self.assertRaisesRegex(ValueError, "failing_tokens is 1180591620717411303424"):
            plan.repack_below(2 ** 70, 5)
        with self.assertRaisesRegex(TypeError, "longest_sequence must be an integer, not float"):
            plan.repack_below(30, 5.0)

    def test_lengths_must_be_integers(self):
        plan = packed_plan(3, token_budget=40, max_seq_len=20)
        for bad, kind, text in ((torch.tensor([3.0, 4.0, 5.0]), TypeError, "lengths must be a 1-D integer tensor"),
                                (["3", "4", "5"], TypeError, r"lengths\[0\] must be an integer, not str"),
                                ("345", TypeError, "lengths must be a 1-D integer tensor or a list of integers, not str"),
                                ([3, 0, 5], ValueError, r"lengths\[1\] is 0, out of range \[1, "),
                                ([3, 2 ** 40, 5], ValueError, r"lengths\[1\] is 1099511627776"),
                                (torch.ones(3, 1, dtype=torch.long), TypeError, "shape \\[3, 1\\]"),
                                (5, TypeError, "not int")):
            with self.subTest(bad=bad):
                with self.assertRaisesRegex(kind, text):
                    plan.pack(bad)
        with self.assertRaisesRegex(TypeError, r"lengths\[2\] must be an integer, not float"):
            accumplan.valid_token_counts([3, 4, 5.5])

    def test_ignore_index_is_range_checked_like_the_plan_reader(self):
        plan = make_plan([2, 2])
        model = torch.nn.Linear(3, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(4, 3), torch.randint(0, 4, (4,))
        for bad, kind in ((2 ** 63, ValueError), (2 ** 31, ValueError), (-(2 ** 31) - 1, ValueError),
                          (1.5, TypeError), ("-100", TypeError)):
            with self.subTest(bad=bad):
                with self.assertRaisesRegex(kind, "ignore_index"):
                    plan.train_window(model, opt, (x,), y, ignore_index=bad)
                with self.assertRaisesRegex(kind, "ignore_index"):
                    list(plan.split((x,), y, ignore_index=bad))


if __name__ == "__main__":
    unittest.main()
