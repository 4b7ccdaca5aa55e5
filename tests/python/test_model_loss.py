"""loss="model": a model that returns its own MEAN loss (a Hugging Face model given labels) is
weighted by its valid tokens when its labels are per token, so an accumulated window equals the
full-batch per-token step: shifted labels (a causal LM), -100 padding, unequal valid tokens per
microbatch, num_items_in_batch, and the words Python users read (argument names, their own line)."""
import unittest
import warnings

import torch
import torch.nn.functional as F

from helpers import make_plan, params_of, reseed

import accumplan

VOCAB, T = 11, 7


def _causal_loss(logits, labels, num_items_in_batch=None):
    """Hugging Face's ForCausalLMLoss: logits[:, :-1] predict labels[:, 1:]; -100 ignored; the
    mean over valid tokens, or the SUM / num_items_in_batch when that is given."""
    flat_logits = logits[:, :-1].reshape(-1, logits.shape[-1]).float()
    flat_labels = labels[:, 1:].reshape(-1)
    if num_items_in_batch is None:
        return F.cross_entropy(flat_logits, flat_labels, ignore_index=-100)
    return F.cross_entropy(flat_logits, flat_labels, ignore_index=-100, reduction="sum") / num_items_in_batch


class TinyForCausalLM(torch.nn.Module):
    """A Hugging Face-style causal LM: model(input_ids=..., attention_mask=..., labels=...) returns
    {"loss": mean over the valid shifted tokens, "logits": [B,T,V]}. Detected by its class name."""

    def __init__(self, seed=0):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 8)
        self.mix = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, VOCAB)
        reseed(self, seed, 0.5)

    def logits(self, input_ids):
        h = torch.tanh(self.emb(input_ids))
        h = h + torch.tanh(self.mix(h.cumsum(1) / torch.arange(1, h.shape[1] + 1).view(1, -1, 1)))  # causal mixing
        return self.out(h)

    def forward(self, input_ids, attention_mask=None, labels=None):
        logits = self.logits(input_ids)
        return {"loss": None if labels is None else _causal_loss(logits, labels), "logits": logits}


class TinyNumItemsForCausalLM(TinyForCausalLM):
    """As transformers >= 4.46: a forward that takes num_items_in_batch divides its loss SUM by it."""

    seen = []

    def forward(self, input_ids, attention_mask=None, labels=None, num_items_in_batch=None):
        TinyNumItemsForCausalLM.seen.append(num_items_in_batch)
        logits = self.logits(input_ids)
        return {"loss": _causal_loss(logits, labels, num_items_in_batch), "logits": logits}


class Tagger(TinyForCausalLM):
    """A model whose own loss does not shift (a token classifier): the mean over labels != -100."""

    def forward(self, input_ids, attention_mask=None, labels=None):
        logits = self.logits(input_ids)
        return F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)


class PositionalTagger(Tagger):
    """The same loss, its labels taken as the last positional argument (train_window's tuple way)."""

    def forward(self, input_ids, labels):
        return super().forward(input_ids, labels=labels)


def lm_batch(n, seed=3, padded=lambda i: i % 5):
    """input_ids [n,T] and labels with -100 padding: sample i keeps T - padded(i) tokens, so the
    microbatches of a [4,3,3] window hold different numbers of valid tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (n, T), generator=g)
    labels = ids.clone()
    mask = torch.ones(n, T, dtype=torch.long)
    for i in range(n):
        labels[i, T - padded(i):] = -100
        mask[i, T - padded(i):] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def dist_batch():
    """The two-rank window: rank 0's half (samples 0-4) keeps more tokens than rank 1's (5-9)."""
    return lm_batch(10, seed=5, padded=lambda i: 0 if i < 5 else 1 + i % 4)


def full_batch_step(model, opt, batch, shift=True):
    """The reference: one forward over the whole window, the per-token mean, one step."""
    opt.zero_grad(set_to_none=True)
    logits = model.logits(batch["input_ids"])
    if shift:
        loss = _causal_loss(logits, batch["labels"])
    else:
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch["labels"].reshape(-1), ignore_index=-100)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss)


def adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)


class ModelLossPerToken(unittest.TestCase):
    def assertSameParams(self, got, want, tol=1e-6):
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=0, atol=tol)

    def train_both(self, cls, **kw):
        batch = lm_batch(10)
        ref, acc = cls(), cls()
        full_batch_step(ref, adamw(ref), batch, shift=not issubclass(cls, Tagger))
        plan = make_plan([4, 3, 3], loss="model")
        st = plan.train_window(acc, adamw(acc), batch, **kw)
        return st, params_of(acc), params_of(ref), batch

    def test_a_causal_lm_window_equals_the_full_batch_per_token_step(self):
        st, got, want, batch = self.train_both(TinyForCausalLM)
        self.assertEqual(st.microbatch_sizes, [4, 3, 3])
        self.assertEqual(st.normalization, "tokens")
        self.assertEqual(st.units, int(batch["labels"][:, 1:].ne(-100).sum()))  # shifted: T-1 positions each
        self.assertSameParams(got, want)

    def test_weighting_by_samples_would_change_the_update(self):
        # What train_window did before: each microbatch's mean weighted by its samples. The test above
        # can fail: this way is measurably off the full-batch step.
        st, got, want, _ = self.train_both(TinyForCausalLM, normalization="samples")
        self.assertEqual(st.normalization, "samples")
        worst = max(float((g - w).abs().max()) for g, w in zip(got, want))
        self.assertGreater(worst, 1e-4)

    def test_counting_unshifted_labels_would_change_the_update(self):
        st, got, want, _ = self.train_both(TinyForCausalLM, shift_labels=False)
        worst = max(float((g - w).abs().max()) for g, w in zip(got, want))
        self.assertGreater(worst, 1e-5)

    def test_a_model_taking_num_items_in_batch_is_passed_the_windows_tokens(self):
        TinyNumItemsForCausalLM.seen = []
        st, got, want, batch = self.train_both(TinyNumItemsForCausalLM)
        self.assertEqual(st.units, int(batch["labels"][:, 1:].ne(-100).sum()))
        self.assertEqual(TinyNumItemsForCausalLM.seen, [st.units] * 3)  # every microbatch, the window's count
        self.assertSameParams(got, want)

    def test_a_model_that_does_not_shift_counts_every_label(self):
        st, got, want, batch = self.train_both(Tagger)
        self.assertFalse(accumplan.causal_shift(Tagger()))
        self.assertEqual(st.units, int(batch["labels"].ne(-100).sum()))
        self.assertSameParams(got, want)

    def test_tuple_inputs_pass_the_labels_last(self):
        batch = lm_batch(10)
        ref, acc = PositionalTagger(), PositionalTagger()
        full_batch_step(ref, adamw(ref), batch, shift=False)
        st = make_plan([4, 3, 3], loss="model").train_window(acc, adamw(acc), (batch["input_ids"],), batch["labels"])
        self.assertEqual(st.normalization, "tokens")
        self.assertSameParams(params_of(acc), params_of(ref))

    def test_the_own_loop_split_weights_by_tokens_too(self):
        batch = lm_batch(10)
        ref, acc = TinyForCausalLM(), TinyForCausalLM()
        full_batch_step(ref, adamw(ref), batch)
        opt = adamw(acc)
        plan = make_plan([4, 3, 3], loss="model")
        for (inputs, _), scale in plan.split(batch, model=acc):
            out = acc(**inputs)
            (scale * accumplan.loss_sum(out["loss"], inputs["labels"], "model", "tokens", shift_labels=True)).backward()
        opt.step()
        self.assertSameParams(params_of(acc), params_of(ref))

    def test_shift_labels_must_be_a_bool(self):
        with self.assertRaisesRegex(TypeError, "shift_labels must be True, False or None"):
            make_plan([4, 3, 3], loss="model").train_window(TinyForCausalLM(), adamw(TinyForCausalLM()), lm_batch(10),
                                                             shift_labels="yes")


class TwoRanks(unittest.TestCase):
    def test_two_gloo_ranks_with_unequal_tokens_equal_the_full_batch_step(self):
        import os
        import tempfile
        from helpers import DIST_TIMEOUT_S, run_two_gloo_ranks
        batch = dist_batch()
        ref = TinyForCausalLM()
        full_batch_step(ref, adamw(ref), batch)
        want = params_of(ref)
        with tempfile.TemporaryDirectory() as out:
            codes, logs = run_two_gloo_ranks("dist_model_loss_worker.py", out)
            for r in range(2):
                self.assertEqual(codes[r], 0, "rank %d failed (None: killed after %d s):\n%s"
                                 % (r, DIST_TIMEOUT_S, logs[r]))
                got = torch.load(os.path.join(out, "rank%d.pt" % r))
                units = torch.load(os.path.join(out, "rank%d-units.pt" % r))
                self.assertEqual(units, int(batch["labels"][:, 1:].ne(-100).sum()))  # global, both halves
                for g, w in zip(got, want):
                    torch.testing.assert_close(g, w, rtol=0, atol=1e-6)


class MemoryOfAWindow(unittest.TestCase):
    def test_cpu_peak_is_measured_only_when_asked(self):
        batch = lm_batch(10)
        model = TinyForCausalLM()
        opt = adamw(model)
        plan = make_plan([4, 3, 3], loss="model")
        self.assertIsNone(plan.train_window(model, opt, batch).peak_bytes)
        st = plan.train_window(model, opt, batch, measure_memory=True)
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        # weights, AdamW's two moments, the gradients and some activations: more than 4x the weights
        self.assertGreater(st.peak_bytes, 4 * weights)
        self.assertEqual(st.predicted_peak_bytes, plan.memory["predicted_peak_bytes"])
        with self.assertRaisesRegex(TypeError, "measure_memory must be True, False or None"):
            plan.train_window(model, opt, batch, measure_memory="yes")


    def test_steady_windows_of_a_resnet18_plan_peak_at_its_prediction(self):
        # The prediction against what it predicts: accumplan.plan's predicted peak against the
        # peaks train_window measures on windows of that plan (CPU, the counting allocator).
        import torchvision
        torch.manual_seed(0)
        model = torchvision.models.resnet18(num_classes=10)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
        # The budget from what this machine measures (a CPU's kernels set the fixed cost): room for
        # about 40 samples a microbatch, well short of one window of 192, so the plan accumulates.
        roomy = accumplan.plan(model, (x,), y, target_batch=192, optimizer=opt, memory_budget="1GiB", progress=False)
        m = roomy.memory
        budget = (m["weights_bytes"] + m["gradients_bytes"] + m["optimizer_state_bytes"] + m["activation_fixed_bytes"]
                  + 40 * m["activation_bytes_per_sample"])
        plan = accumplan.plan(model, (x,), y, target_batch=192, optimizer=opt, memory_budget=int(budget), progress=False)
        X, Y = x.repeat(24, 1, 1, 1), y.repeat(24)  # one window of the plan's per-rank batch
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # BatchNorm, warned about once per model
            peaks = [plan.train_window(model, opt, (X,), Y, measure_memory=True) for _ in range(3)]
        self.assertEqual(sum(st.oom_recoveries for st in peaks), 0)
        self.assertGreater(plan.accumulation_steps, 1)
        for st in peaks[1:]:  # the first window builds the momentum buffers
            self.assertLess(abs(st.peak_bytes - st.predicted_peak_bytes), 0.01 * st.predicted_peak_bytes,
                            "window peak %d B against %d B predicted" % (st.peak_bytes, st.predicted_peak_bytes))


class PythonWords(unittest.TestCase):
    def test_a_refusal_names_the_python_argument(self):
        model = TinyForCausalLM()
        with self.assertRaises(ValueError) as cm:
            accumplan.plan(model, lm_batch(4), loss="model", target_batch=10, world_size=3, optimizer=adamw(model),
                           progress=False)
        self.assertIn("world_size", str(cm.exception))
        self.assertNotIn("--", str(cm.exception))

    def test_the_batch_dependent_warning_points_at_the_callers_line(self):
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            make_plan([4, 4]).train_window(model, opt, (x,), y)
        ours = [w for w in caught if "batch-dependent" in str(w.message)]
        self.assertEqual(len(ours), 1)
        self.assertEqual(ours[0].filename, __file__)


if __name__ == "__main__":
    unittest.main()
