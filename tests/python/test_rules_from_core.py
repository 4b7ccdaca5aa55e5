"""Rules the Python wing asks the C++ core for instead of keeping its own copy (docs/python.md,
"Where to change what"): a step cost's ranges (the plan reader's check_step_cost), the largest
microbatch a plan's memory line fits (MemoryModel::line_largest_fitting), the persistent step's
protocol (PersistentStep, the profiler's). Each test makes the C++ reader or model answer first
and asserts that Python answers the same, or drives the C++ protocol accumplan.plan follows."""
import copy
import json
import unittest

from helpers import golden_doc, in_python_words, plan_doc

import accumplan

TERMS = ("per_microbatch", "per_token", "per_token_squared")
GOOD_COST = {"per_microbatch": 50, "per_token": 1, "per_token_squared": 0}


def packed_doc(step_cost):
    d = plan_doc([8], normalization="tokens")
    d["schema_version"] = "1.4"
    d["tokens"] = {"token_budget": 64, "max_seq_len": 8, "longest_sequence_alone": 8, "step_cost": step_cost}
    return d


def reader_refusal(step_cost):
    """The C++ plan reader's message for a plan carrying ``step_cost``, or None if it reads it."""
    try:
        accumplan.load_plan(packed_doc(step_cost))
    except accumplan.PlanError as e:
        return str(e)
    return None


class StepCostRanges(unittest.TestCase):
    def test_a_term_the_plan_reader_refuses_is_refused_by_pack_by_token_budget_with_its_message(self):
        probed = 0
        for term in TERMS:
            for value in (-1, 0, 1 << 16, (1 << 16) + 1, 1 << 30, (1 << 30) + 1, 1 << 50, (1 << 50) + 1):
                cost = dict(GOOD_COST, **{term: value})
                refusal = reader_refusal(cost)
                with self.subTest(term=term, value=value):
                    if refusal is None:
                        accumplan.pack_by_token_budget([3, 2], 64, cost)  # read by C++: packed by Python
                        continue
                    probed += 1
                    self.assertIn("$.tokens.step_cost.%s: %d is out of range" % (term, value), refusal)
                    with self.assertRaises(ValueError) as cm:
                        accumplan.pack_by_token_budget([3, 2], 64, cost)
                    # The same message, the term named as Python's argument holds it.
                    said = refusal[refusal.index("$.tokens.step_cost."):]
                    self.assertEqual(str(cm.exception),
                                     in_python_words(said.replace("$.tokens.step_cost.%s" % term,
                                                                  "step_cost[%r]" % term)))
        self.assertGreaterEqual(probed, 6)  # each term has a value on each side of its range refused

    def test_a_term_the_plan_reader_accepts_is_accepted(self):
        self.assertIsNone(reader_refusal(GOOD_COST))
        packed = accumplan.pack_by_token_budget([3, 2, 5], 64, GOOD_COST)
        self.assertEqual(sorted(i for g in packed for i in g), [0, 1, 2])


class LargestFitting(unittest.TestCase):
    def test_is_the_c_plus_plus_memory_models_answer_on_the_plans_line(self):
        doc = golden_doc()
        plan = accumplan.load_plan(doc)
        self.assertEqual(plan.largest_fitting(), doc["max_micro_batch"])  # the solver's, under the same line

    def test_a_line_that_fits_no_sample_says_zero_and_a_plan_without_a_line_says_none(self):
        doc = golden_doc()
        intercept = doc["fit"]["intercept_bytes"]
        plan = accumplan.load_plan(plan_doc([8], usable_bytes=int(intercept) - 1))
        self.assertEqual(plan.largest_fitting(), 0)  # the model's "not even b = 1", not a negative size
        flat = copy.deepcopy(doc)
        flat["fit"]["slope_bytes_per_sample"] = 0
        try:
            plan = accumplan.load_plan(flat)
        except accumplan.PlanError:
            return  # the reader refuses a flat line: there is nothing to ask
        self.assertIsNone(plan.largest_fitting())



class PersistentStep(unittest.TestCase):
    def test_the_attempts_and_verdicts_are_the_c_plus_plus_protocols(self):
        window = [accumplan._core.PERSISTENT_WINDOW_SAMPLES]
        step = accumplan._core.PersistentStep(1000)
        self.assertEqual(step.attempt_budget_bytes, 1000)
        self.assertTrue(step.measured(1000, 0.5)["fit"])
        self.assertFalse(step.measured(1001, 0.5)["fit"])
        failed = step.out_of_memory(0.5, "test device")
        self.assertEqual((failed["kind"], failed["fit"], failed["window"]), ("probe", False, window))
        self.assertTrue(step.over_budget)
        self.assertIsNone(step.attempt_budget_bytes)  # the next attempt runs without the budget
        with self.assertRaisesRegex(accumplan._core.InfeasibleError, "test device even without a budget"):
            step.out_of_memory(0.5, "test device")

    def test_without_a_budget_an_out_of_memory_is_infeasible_with_the_profilers_advice(self):
        unbounded = accumplan._core.PersistentStep(None)
        with self.assertRaises(accumplan._core.InfeasibleError) as cm:
            unbounded.out_of_memory(0.5, "cpu")
        self.assertIn("use a smaller model", str(cm.exception))  # the advice the CLI's profiler gives


if __name__ == "__main__":
    unittest.main()
