"""OOM recovery in plan.train_window: an out-of-memory error injected at every microbatch position
gives the same update as no error; the plan is re-split below the failing size."""
import unittest

import torch

from helpers import Classifier, FailingAt, TinyLM, classifier_data, make_plan, params_of, token_data

import accumplan


class OomRecovery(unittest.TestCase):
    def reference(self, sizes, make_model, data, window):
        model = make_model()
        x, y = data(window)
        make_plan(sizes).train_window(model, torch.optim.SGD(model.parameters(), lr=0.5), (x,), y)
        return params_of(model)

    def test_an_oom_at_each_microbatch_position_gives_the_same_update(self):
        for sizes, make_model, data in (([7, 7, 6, 6], Classifier, classifier_data),
                                        ([4, 3, 3], TinyLM, token_data)):
            window = sum(sizes)
            want = self.reference(sizes, make_model, data, window)
            for position in range(len(sizes)):
                for kind in ("cuda", "message"):
                    with self.subTest(sizes=sizes, position=position, kind=kind):
                        plan = make_plan(sizes)
                        model = FailingAt(make_model(), position=position, kind=kind)
                        x, y = data(window)
                        notes = []
                        stats = plan.train_window(model, torch.optim.SGD(model.parameters(), lr=0.5), (x,), y,
                                                  on_oom=notes.append)
                        self.assertEqual(stats.oom_recoveries, 1)
                        self.assertEqual(len(notes), 1)
                        failing = sizes[position]
                        self.assertLess(max(plan.microbatch_sizes), failing)
                        self.assertEqual(sum(plan.microbatch_sizes), window)
                        # replayed from the first sample: every sample of the window, once, after the failure
                        self.assertEqual(sum(model.sizes[position + 1:]), window)
                        for got, w in zip(params_of(model.inner), want):
                            torch.testing.assert_close(got, w, rtol=1e-5, atol=1e-6)

    def test_repeated_ooms_shrink_until_it_fits_then_later_windows_keep_the_new_plan(self):
        plan = make_plan([7, 7, 6, 6])
        model = FailingAt(Classifier(), over=3)
        x, y = classifier_data(52)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        stats = plan.train_window(model, opt, (x[:26],), y[:26])
        self.assertGreaterEqual(stats.oom_recoveries, 1)
        self.assertLessEqual(max(plan.microbatch_sizes), 3)
        stats = plan.train_window(model, opt, (x[26:],), y[26:])
        self.assertEqual(stats.oom_recoveries, 0)
        ref = Classifier()
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
        for s in (0, 26):
            make_plan([26]).train_window(ref, ref_opt, (x[s:s + 26],), y[s:s + 26])
        for got, w in zip(params_of(model.inner), params_of(ref)):
            torch.testing.assert_close(got, w, rtol=1e-5, atol=1e-6)

    def test_out_of_memory_with_one_sample_is_an_error_and_other_errors_pass_through(self):
        plan = make_plan([2, 2])
        model = FailingAt(Classifier(), over=0)
        x, y = classifier_data(4)
        with self.assertRaisesRegex(accumplan.OutOfMemoryAtOne, "with a single sample"):
            plan.train_window(model, torch.optim.SGD(model.parameters(), lr=0.5), (x,), y)
        self.assertTrue(all(p.grad is None for p in model.parameters()))

        class Broken(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.l = torch.nn.Linear(8, 4)

            def forward(self, x):
                raise RuntimeError("shape mismatch, not a memory problem")

        m = Broken()  # not out-of-memory: one PlanError line naming the forward, the original chained
        with self.assertRaisesRegex(accumplan.PlanError, r"^the model's forward on a microbatch of 2 samples "
                                    r"\(inputs float32\[2, 8\]\) failed: RuntimeError: shape mismatch") as caught:
            make_plan([2, 2]).train_window(m, torch.optim.SGD(m.parameters(), lr=0.5), (x,), y)
        self.assertIsInstance(caught.exception.__cause__, RuntimeError)
        # recovery off: the out-of-memory is an error naming the microbatch
        model = FailingAt(Classifier(), position=0)
        with self.assertRaises(RuntimeError):
            make_plan([2, 2]).train_window(model, torch.optim.SGD(model.parameters(), lr=0.5), (x,), y,
                                           oom_recovery=False)


class EnforcedCpuBudget(unittest.TestCase):
    """train_window(memory_budget=) on the CPU: the counting allocator enforces it as a GPU does."""

    def model(self):
        torch.manual_seed(0)
        # Activations weigh most: a smaller microbatch peaks lower with the gradients resident.
        return torch.nn.Sequential(torch.nn.Linear(8, 2048), torch.nn.Tanh(), torch.nn.Linear(2048, 4))

    def window(self, sizes, **kw):
        model = self.model()
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        torch.manual_seed(1)
        x, y = torch.randn(26, 8), torch.randint(0, 4, (26,))
        plan = make_plan(sizes)
        return plan, plan.train_window(model, opt, (x,), y, **kw), params_of(model)

    def test_a_window_past_the_budget_runs_out_of_memory_and_is_recovered_exactly(self):
        _, whole, want = self.window([26], measure_memory=True)
        _, small, _ = self.window([7, 7, 6, 6], measure_memory=True)
        self.assertLess(small.peak_bytes, whole.peak_bytes)
        budget = (small.peak_bytes + whole.peak_bytes) // 2
        plan, st, got = self.window([26], memory_budget=budget)
        self.assertGreaterEqual(st.oom_recoveries, 1)
        self.assertTrue(plan.replans)
        self.assertLess(max(plan.microbatch_sizes), 26)
        self.assertLessEqual(st.peak_bytes, budget)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
        _, st, _ = self.window([26], memory_budget=whole.peak_bytes)  # at its own peak: it fits
        self.assertEqual(st.oom_recoveries, 0)

    def test_an_evaluation_past_the_budget_is_re_split_with_the_same_mean_loss(self):
        model, plan = self.model(), make_plan([26])
        torch.manual_seed(1)
        x, y = torch.randn(26, 8), torch.randint(0, 4, (26,))
        whole = plan.evaluate(model, (x,), y, measure_memory=True)
        half = plan.evaluate(model, (x[:13],), y[:13], measure_memory=True)
        self.assertLess(half.peak_bytes, whole.peak_bytes)
        st = plan.evaluate(model, (x,), y, memory_budget=(half.peak_bytes + whole.peak_bytes) // 2)
        self.assertGreaterEqual(st.oom_recoveries, 1)
        self.assertLess(max(st.microbatch_sizes), 26)
        self.assertAlmostEqual(st.loss, whole.loss, places=6)

    def test_its_out_of_memory_reads_as_the_cpu_allocators_to_code_that_matches_the_text(self):
        from accumplan.meters import CpuMeter
        meter = CpuMeter(0)
        try:
            meter.limit(1 << 20)
            with self.assertRaises(torch.OutOfMemoryError) as caught:
                torch.empty(1 << 22, dtype=torch.uint8)
        finally:
            meter.close()
        (text,) = caught.exception.args  # one argument, as both peers require
        self.assertIn(" out of memory.", text)  # Accelerate's should_reduce_batch_size
        self.assertIn("DefaultCPUAllocator: can't allocate memory", text)  # Lightning's is_out_of_cpu_memory
        self.assertIsNone(accumplan._core.failed_host_allocation_bytes(text))  # not the machine running out

    def test_a_bad_budget_is_refused_naming_it_and_the_allocator_goes_with_it(self):
        for bad in ("12XB", -1, 1.5):
            with self.subTest(bad=bad), self.assertRaisesRegex((TypeError, ValueError), "memory_budget"):
                self.window([26], memory_budget=bad)
        with self.assertRaisesRegex(ValueError, "memory_budget .*drop measure_memory=False"):
            self.window([26], memory_budget=1 << 30, measure_memory=False)
        _, st, _ = self.window([26])  # nothing installed is left behind: an unmeasured window
        self.assertIsNone(st.peak_bytes)


if __name__ == "__main__":
    unittest.main()
