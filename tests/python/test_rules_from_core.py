"""Rules the Python wing asks the C++ core for instead of keeping its own copy (docs/python.md,
"Where to change what"): a step cost's ranges (the plan reader's check_step_cost), the largest
microbatch a plan's memory line fits (MemoryModel::line_largest_fitting), the persistent step's
protocol (PersistentStep, the profiler's). Each test makes the C++ reader or model answer first
and asserts that Python answers the same, or drives the C++ protocol accumplan.plan follows."""
import copy
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
        self.assertTrue(step.measured(1000, 0.5).fit)
        self.assertFalse(step.measured(1001, 0.5).fit)
        failed = step.out_of_memory(0.5, "test device")
        self.assertEqual((failed.kind, failed.fit, failed.window), ("probe", False, window))
        self.assertTrue(step.over_budget)
        self.assertIsNone(step.attempt_budget_bytes)  # the next attempt runs without the budget
        with self.assertRaisesRegex(accumplan._core.InfeasibleError, "test device even without a budget"):
            step.out_of_memory(0.5, "test device")

    def test_without_a_budget_an_out_of_memory_is_infeasible_with_the_profilers_advice(self):
        unbounded = accumplan._core.PersistentStep(None)
        with self.assertRaises(accumplan._core.InfeasibleError) as cm:
            unbounded.out_of_memory(0.5, "cpu")
        self.assertIn("use a smaller model", str(cm.exception))  # the advice the CLI's profiler gives


class ConstantsFromTheCore(unittest.TestCase):
    """Python holds no copy of a planner constant: each is the core's, and none is written again."""

    CORE_INTS = ("MAX_SAMPLES", "MAX_ACCUMULATION_STEPS", "MAX_WORLD_SIZE", "MAX_BYTES", "MAX_TARGET_TOKENS",
                 "INT32_MIN", "INT32_MAX")
    CORE_NAMES = ("SPLITS", "STEP_COST_TERMS", "LOSSES", "PACKINGS", "EXPORT_TARGETS")
    # Python's own bounds that happen to equal a core value: (module, value) and why.
    OWN = {("files", 1 << 20): "MAX_JSON_VALUES and the read chunk bound a dict and a read, not a plan"}

    def test_each_constant_python_uses_is_the_cores(self):
        from accumplan import _args, files, losses, plans, runner, splits
        core = accumplan._core
        for ours, theirs in ((_args.MAX_COUNT, core.MAX_SAMPLES), (_args.INT32_MIN, core.INT32_MIN),
                             (_args.INT32_MAX, core.INT32_MAX), (splits.SPLITS, core.SPLITS),
                             (splits.MAX_ACCUMULATION_STEPS, core.MAX_ACCUMULATION_STEPS),
                             (splits.STEP_COST_TERMS, core.STEP_COST_TERMS), (losses.LOSSES, core.LOSSES),
                             (files.MAX_JSON_DEPTH, core.MAX_JSON_DEPTH), (plans.SCHEMA_VERSION, core.SCHEMA_VERSION),
                             (runner.PERSISTENT_WINDOW, core.PERSISTENT_WINDOW_SAMPLES)):
            self.assertEqual(ours, theirs)
        self.assertEqual(core.MAX_SAMPLES, 1 << 40)  # the values the docs state
        self.assertEqual(core.MAX_ACCUMULATION_STEPS, 1 << 20)
        self.assertEqual(core.documented_range("max_grad_norm")[:3], (0.0, 1e12, True))

    def test_no_module_writes_a_core_constant_as_a_literal(self):
        import ast
        import os
        core = accumplan._core
        ints = {getattr(core, n) for n in self.CORE_INTS}
        names = {tuple(getattr(core, n)) for n in self.CORE_NAMES}
        directory = os.path.dirname(accumplan.__file__)
        found = []
        for file in sorted(f for f in os.listdir(directory) if f.endswith(".py")):
            with open(os.path.join(directory, file), encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                value = _literal(node)
                if (value in ints and (file[:-3], value) not in self.OWN) or \
                        (isinstance(value, tuple) and value in names):
                    found.append("%s:%d %r" % (file, node.lineno, value))
        self.assertEqual(found, [])


def _literal(node):
    """The value of an expression of literals only (1 << 40, -(2 ** 31), ("a", "b")); None otherwise."""
    import ast
    if not isinstance(node, (ast.Constant, ast.BinOp, ast.UnaryOp, ast.Tuple)):
        return None
    if not all(isinstance(n, (ast.Constant, ast.BinOp, ast.UnaryOp, ast.Tuple, ast.operator, ast.unaryop,
                              ast.expr_context)) for n in ast.walk(node)):
        return None
    try:
        return eval(compile(ast.Expression(node), "<literal>", "eval"), {"__builtins__": {}})  # noqa: S307
    except Exception:  # noqa: BLE001 - 1 / 0, a string times a huge count: no constant
        return None


if __name__ == "__main__":
    unittest.main()
