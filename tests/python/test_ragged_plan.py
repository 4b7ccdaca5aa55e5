"""accumplan.plan on variable-length data: the CLI's token plan, measured on the user's module.

What it checks: a list of 1-D token tensors (next-token targets), per-token targets with a
padding mask, a padded batch with lengths=, and Hugging Face example dicts all plan a packed plan
(setup.seq_len, inputs with T, a token budget) by the C++ (b, T) grid; packed windows stay within
the budget and near the plan's prediction for what they packed; the plan file runs under
`accumplan run` with the same update as train_window on the same module; an HF dict model is exact
per token; a sample plan on ragged data cuts each microbatch to its own longest; bad arguments are
refused before any window runs. Small models: each plan takes about a second.
What it is not: the throughput comparison with the length-sorted split (tests/bench/tokens_python.py).
"""
import os
import subprocess
import tempfile
import unittest

import torch
import torch.nn as nn
import torch.nn.functional as F

import accumplan
from helpers import ROOT

BIN = os.environ.get("ACCUMPLAN_BIN", os.path.join(ROOT, "build", "accumplan"))


class TinyDecoder(nn.Module):
    """Embedding, one causal self-attention layer, a head: logits [B, T, V]; attention is
    quadratic in T, so the token model has a T^2 term to fit."""

    def __init__(self, vocab=64, width=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.attn = nn.MultiheadAttention(width, 2, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens):
        h = self.emb(tokens)
        t = tokens.shape[1]
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=tokens.device), 1)
        a, _ = self.attn(h, h, h, attn_mask=causal, need_weights=False)
        return self.head(torch.tanh(h + a))


class TinyTagger(nn.Module):
    """Bidirectional attention that must not see the padding: forward(tokens, padding_mask)."""

    def __init__(self, vocab=64, width=16, classes=5):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.attn = nn.MultiheadAttention(width, 2, batch_first=True)
        self.head = nn.Linear(width, classes)
        self.masks_seen = []

    def forward(self, tokens, padding_mask):
        self.masks_seen.append(tuple(padding_mask.shape))
        h = self.emb(tokens)
        a, _ = self.attn(h, h, h, key_padding_mask=padding_mask, need_weights=False)
        return self.head(torch.tanh(h + a))


class Output:
    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits


class HfLM(nn.Module):
    """A Hugging Face-style causal LM: model(input_ids, attention_mask, labels) -> .loss, the MEAN
    over the valid shifted labels."""

    def __init__(self, vocab=64, width=16):
        super().__init__()
        self.emb, self.head = nn.Embedding(vocab, width), nn.Linear(width, vocab)

    def forward(self, input_ids, attention_mask=None, labels=None):
        h = torch.tanh(self.emb(input_ids) * attention_mask.unsqueeze(-1))
        logits = self.head(h)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
        return Output(loss, logits)


def sequences(n, longest, seed, vocab=64, low=4):
    g = torch.Generator().manual_seed(seed)
    lengths = [longest] + [int(x) for x in torch.randint(low, longest // 2, (n - 1,), generator=g)]
    return [torch.randint(1, vocab, (l,), generator=g) for l in lengths]


def params_of(model):
    return [p.detach().clone() for p in model.parameters()]


class RaggedPlan(unittest.TestCase):
    def plan(self, model, data, target, **kw):
        torch.manual_seed(0)
        opt = kw.pop("optimizer", None) or torch.optim.AdamW(model.parameters(), lr=1e-3)
        kw.setdefault("memory_budget", "24MiB")
        p = accumplan.plan(model, data, target, target_batch=kw.pop("target_batch", 24), optimizer=opt,
                           device="cpu", progress=False, **kw)
        return p, opt

    def test_a_list_of_sequences_plans_the_clis_token_plan(self):
        torch.manual_seed(0)
        model = TinyDecoder()
        seqs = sequences(24, 96, 1)
        p, _ = self.plan(model, seqs, None)
        self.assertIsNotNone(p.tokens, "a list of sequences gives a packed plan")
        lengths = [s.numel() for s in seqs]
        self.assertEqual(p.setup["seq_len"], "%d..%d" % (min(lengths), max(lengths)))
        self.assertEqual(p.setup["inputs"], ["int64[B,T]:64"])
        self.assertEqual(p.setup["target"], "int64[B,T]:64")
        self.assertEqual(p.tokens["max_seq_len"], 96)
        grid = {(t["micro_batch"], t.get("seq_len")) for t in p.profile["trials"] if t["kind"] == "probe"}
        self.assertTrue({(1, 24), (1, 48), (1, 96), (2, 24), (2, 48), (2, 96)} <= grid, grid)
        # Confirmed: a real window at the longest length holding the token budget's sequences fit.
        self.assertTrue(p.confirmed, p.reason)
        b = p.tokens["token_budget"] // 96
        self.assertTrue(any(t["fit"] and t.get("seq_len") == 96 and t["micro_batch"] >= b for t in p.profile["trials"]))

    def test_packed_windows_fit_the_budget_near_the_prediction_for_what_they_packed(self):
        model = TinyDecoder()
        seqs = sequences(24, 96, 2)
        # The budget from what this machine measures: room for about half the window's longest sequences.
        m = self.plan(model, seqs, None)[0].memory
        half = (m["weights_bytes"] + m["gradients_bytes"] + m["optimizer_state_bytes"] + m["activation_fixed_bytes"]
                + 12 * m["activation_bytes_per_sample"])
        p, opt = self.plan(model, seqs, None, memory_budget=int(half))
        self.assertLess(p.tokens["token_budget"], 24 * 96, "the budget must make the plan pack")
        budget = p.memory["budget_bytes"]
        for w in range(3):
            st = p.train_window(model, opt, sequences(24, 96, 10 + w), None, measure_memory=True)
            self.assertEqual(st.oom_recoveries, 0)
            self.assertGreater(len(st.microbatch_sizes), 1)
            self.assertLessEqual(st.peak_bytes, budget)
            # A model this small peaks at 0.5-0.8 MB, where the fit's residuals (13 KB here) are a few
            # percent; the benchmark holds real-size models to 1% (tests/bench/tokens_python.py).
            self.assertLess(abs(st.peak_bytes - st.predicted_peak_bytes) / st.predicted_peak_bytes, 0.10,
                            (st.peak_bytes, st.predicted_peak_bytes))

    def test_max_seq_len_plans_for_sequences_longer_than_the_samples(self):
        model = TinyDecoder()
        seqs = sequences(24, 90, 3)  # the sample's longest: 90 tokens
        p, opt = self.plan(model, seqs, None, memory_budget="3MiB", max_seq_len=128)
        self.assertEqual(p.tokens["max_seq_len"], 128)
        self.assertEqual(p.setup["seq_len"], "%d..128" % min(s.numel() for s in seqs))
        self.assertTrue(any(t.get("seq_len") == 128 for t in p.profile["trials"]), "the grid measured at 128")
        budget = p.memory["budget_bytes"]
        for w in range(2):  # windows holding 128-token sequences: trained, not refused, within the budget
            st = p.train_window(model, opt, sequences(24, 128, 20 + w), None, measure_memory=True)
            self.assertEqual(st.oom_recoveries, 0)
            self.assertLessEqual(st.peak_bytes, budget)
        with self.assertRaisesRegex(ValueError, r"holds a sequence of 129 tokens, longer than the 128 tokens .* plan "
                                                r"again with a longer max_seq_len$"):
            p.train_window(model, opt, sequences(24, 129, 30), None)
        with self.assertRaisesRegex(ValueError, r"^max_seq_len=64 is shorter than the longest sequence given \(90 tokens\)"):
            self.plan(model, seqs, None, max_seq_len=64)
        with self.assertRaisesRegex(ValueError, r"^max_seq_len=128 is for variable-length data"):
            self.plan(model, (torch.ones(4, 8, dtype=torch.long),), torch.ones(4, 8, dtype=torch.long), max_seq_len=128)

    def test_a_padded_batch_with_lengths_plans_the_same_token_budget_as_the_list(self):
        seqs = sequences(16, 64, 3)
        p1, _ = self.plan(TinyDecoder(), seqs, None)
        x, y, lengths = accumplan.pad_sequences(seqs, next_token=True)
        p2, _ = self.plan(TinyDecoder(), (x,), y, lengths=lengths)
        self.assertEqual(p1.tokens["token_budget"], p2.tokens["token_budget"])
        self.assertEqual(p1.setup["seq_len"], p2.setup["seq_len"])

    @unittest.skipUnless(os.path.exists(BIN), "needs the accumplan binary")
    def test_the_saved_plan_runs_under_the_cli_with_train_windows_update(self):
        torch.manual_seed(0)
        model = TinyDecoder()
        start = {k: v.clone() for k, v in model.state_dict().items()}
        seqs = sequences(24, 96, 4)
        p, _ = self.plan(model, seqs, None, memory_budget="3MiB", optimizer=torch.optim.SGD(model.parameters(), lr=0.5))
        with tempfile.TemporaryDirectory() as d:
            plan_path, model_path, data_path, out = (os.path.join(d, f) for f in ("p.json", "m.pt", "d.pt", "o.pt"))
            p.save(plan_path)
            torch.jit.script(model).save(model_path)
            torch.save([seqs, None], data_path)
            r = subprocess.run([BIN, "run", "--model", model_path, "--plan", plan_path, "--data", data_path,
                                "--device", "cpu", "--memory-budget", "3MiB", "--save", out, "--progress", "none"],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            cli = dict(torch.jit.load(out).named_parameters())
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        st = p.train_window(model, opt, seqs, None)
        self.assertGreater(len(st.microbatch_sizes), 1)
        for name, q in model.named_parameters():
            self.assertFalse(torch.equal(q.detach(), start[name]), name)
            self.assertLess(float((q.detach() - cli[name].detach()).abs().max()), 1e-6, name)

    def test_per_token_targets_with_a_padding_mask(self):
        model = TinyTagger()
        seqs = sequences(16, 64, 5)
        g = torch.Generator().manual_seed(6)
        targets = [torch.randint(0, 5, (s.numel(),), generator=g) for s in seqs]
        p, opt = self.plan(model, seqs, targets, padding_mask=True)
        self.assertTrue(p.padding_mask)
        self.assertEqual(p.setup["target"], "int64[B,T]:5")
        model.masks_seen.clear()
        st = p.train_window(model, opt, seqs, targets)
        self.assertEqual(st.units, sum(s.numel() for s in seqs))
        self.assertEqual(len(model.masks_seen), len(st.microbatch_sizes))

    def test_a_hugging_face_dict_model_is_exact_per_token(self):
        torch.manual_seed(0)
        model = HfLM()
        g = torch.Generator().manual_seed(7)
        examples = []
        for n in [40] + [int(x) for x in torch.randint(3, 30, (15,), generator=g)]:
            ids = torch.randint(1, 64, (n,), generator=g)
            examples.append({"input_ids": ids, "attention_mask": torch.ones(n, dtype=torch.long), "labels": ids.clone()})
        # 400 KiB: a token budget of about 450 padded tokens, under the 640 of one microbatch of all
        # 16 sequences (padded to 40), so memory splits the window whatever the step times say;
        # under 2 MiB (960) the split was left to the fitted packing cost, and a CI run packed one.
        p, _ = self.plan(model, examples, None, loss="model", shift_labels=True, memory_budget="400KiB",
                         optimizer=torch.optim.SGD(model.parameters(), lr=0.5))
        self.assertIsNotNone(p.tokens)
        self.assertEqual(p.normalization, "tokens")
        # The reference: one forward over the whole padded window, the mean over every valid
        # shifted label (the window's per-token mean), one SGD step.
        ref = HfLM()
        ref.load_state_dict(model.state_dict())
        batch, _, _ = accumplan.pad_sequences(examples)
        out = ref(**batch)
        out.loss.backward()
        with torch.no_grad():
            for q in ref.parameters():
                q -= 0.5 * q.grad
        st = p.train_window(model, torch.optim.SGD(model.parameters(), lr=0.5), examples, None, shift_labels=True)
        self.assertGreater(len(st.microbatch_sizes), 1, "the window must be packed into several microbatches")
        self.assertEqual(st.units, sum(e["input_ids"].numel() - 1 for e in examples))
        for a, b in zip(model.parameters(), ref.parameters()):
            self.assertLess(float((a.detach() - b.detach()).abs().max()), 1e-6)

    def test_a_sample_plan_on_ragged_data_cuts_each_microbatch_to_its_own_longest(self):
        shapes = []

        class Recorder(TinyDecoder):
            def forward(self, tokens):
                shapes.append(tuple(tokens.shape))
                return super().forward(tokens)

        model = Recorder()
        seqs = sequences(8, 32, 8)
        p, opt = self.plan(model, seqs, None)
        sample_plan = accumplan.load_plan({k: v for k, v in p.raw.items() if k != "tokens"})
        sample_plan.replan_below(3)  # microbatches of at most 2
        order = sorted(range(8), key=lambda i: -seqs[i].numel())
        shapes.clear()
        sample_plan.train_window(model, opt, [seqs[i] for i in order], None)
        lengths = [seqs[i].numel() for i in order]
        self.assertEqual(shapes, [(2, max(lengths[j:j + 2])) for j in range(0, 8, 2)])
        # A window whose sequences share one length is still a list of sequences under this plan.
        shapes.clear()
        sample_plan.train_window(model, opt, [seqs[0][:16] for _ in range(4)], None)
        self.assertEqual(shapes, [(2, 16), (2, 16)])

    def test_packing_by_time_learns_from_the_windows_it_timed_and_fill_does_not(self):
        model = TinyDecoder()
        seqs = sequences(24, 96, 11)
        p, opt = self.plan(model, seqs, None, memory_budget="3MiB")
        lengths = [s.numel() for s in seqs]
        self.assertEqual(p.pack(lengths, "fill"), accumplan.pack_by_token_budget(lengths, p.tokens["token_budget"]))
        self.assertEqual(p.packing_cost(), p.step_cost, "before any window the plan's own cost")
        p.train_window(model, opt, seqs, None, packing="fill")
        self.assertEqual(p.window_loop.held, 0, "a filled window is not timed")
        runs = [len(p.train_window(model, opt, sequences(24, 96, 20 + w), None).microbatch_sizes) for w in range(3)]
        self.assertEqual(p.window_loop.held, sum(runs), "every packed microbatch timed on the CPU")
        if p.window_loop.refits:  # the fit needs 4 microbatches at 3 shapes: then it is what packing cuts by
            cost = p.packing_cost()
            self.assertEqual(p.pack(lengths), accumplan.pack_by_token_budget(lengths, p.tokens["token_budget"], cost))
        # A bad timing is refused before it reaches the fit (one NaN would spoil the 512 it keeps).
        with self.assertRaisesRegex(ValueError, r"^timed\[1\]\[2\]"):
            p.observe_packed_window([(1, 16, 0.01), (2, 16, float("nan"))])
        with self.assertRaisesRegex(TypeError, r"^timed\[0\] must be \(sequences, padded length, seconds\)"):
            p.observe_packed_window([(1, 16)])
        with self.assertRaisesRegex(ValueError, "^packing is .tight.; use one of time, fill"):
            p.train_window(model, opt, seqs, None, packing="tight")

    def test_target_tokens_plans_windows_of_valid_tokens_as_the_cli(self):
        model = TinyDecoder()
        seqs = sequences(24, 96, 12)
        p, opt = self.plan(model, seqs, None, target_batch=None, target_tokens=600, memory_budget="3MiB")
        self.assertEqual(p.target_tokens, 600)
        x, y, lengths = accumplan.pad_sequences(seqs, next_token=True)
        valid = accumplan.valid_token_counts(lengths, y)
        windows = accumplan.token_windows(valid, p.target_tokens)
        self.assertGreater(len(windows), 1)
        for start, count in windows:
            st = p.train_window(model, opt, seqs[start:start + count], None)
            self.assertEqual(st.units, sum(valid[start:start + count]))
        with self.assertRaisesRegex(TypeError, "^give target_batch .* or, for variable-length data, target_tokens"):
            accumplan.plan(model, seqs, None, optimizer=opt, device="cpu", progress=False)
        with self.assertRaisesRegex(TypeError, ", not both$"):
            accumplan.plan(model, seqs, None, target_batch=8, target_tokens=600, optimizer=opt, progress=False)
        with self.assertRaisesRegex(ValueError, "^target_tokens=600 counts the tokens of variable-length data"):
            accumplan.plan(model, (torch.zeros(4, 8, dtype=torch.long),), torch.zeros(4, 8, dtype=torch.long),
                           target_tokens=600, optimizer=opt, progress=False)
        with self.assertRaisesRegex(ValueError, "target_tokens"):
            accumplan.plan(model, seqs, None, target_tokens=1 << 55, optimizer=opt, progress=False)

    def test_pad_sequences_collates_example_dicts(self):
        ex = [{"input_ids": torch.tensor([5, 6, 7]), "attention_mask": torch.ones(3, dtype=torch.long),
               "labels": torch.tensor([5, 6, 7])},
              {"input_ids": torch.tensor([8]), "attention_mask": torch.ones(1, dtype=torch.long),
               "labels": torch.tensor([8])}]
        batch, target, lengths = accumplan.pad_sequences(ex)
        self.assertIsNone(target)
        self.assertEqual(lengths.tolist(), [3, 1])
        self.assertEqual(batch["input_ids"].tolist(), [[5, 6, 7], [8, 0, 0]])
        self.assertEqual(batch["attention_mask"].tolist(), [[1, 1, 1], [1, 0, 0]])
        self.assertEqual(batch["labels"].tolist(), [[5, 6, 7], [8, -100, -100]])
        with self.assertRaisesRegex(ValueError, r"sequences\[1\]\['labels'\] has 2 entries"):
            accumplan.pad_sequences([ex[0], dict(ex[1], labels=torch.tensor([1, 2]))])

    def test_bad_ragged_arguments_are_refused_before_any_window(self):
        model = TinyDecoder()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        seqs = sequences(6, 16, 9)
        before = params_of(model)

        def plan(*a, **kw):
            return accumplan.plan(model, *a, target_batch=6, optimizer=opt, device="cpu", progress=False, **kw)
        with self.assertRaisesRegex(ValueError, "^padding_mask=True needs variable-length data"):
            plan((torch.zeros(4, 8, dtype=torch.long),), torch.zeros(4, 8, dtype=torch.long), padding_mask=True)
        with self.assertRaisesRegex(ValueError, "^lengths= goes with a padded batch"):
            plan(seqs, None, lengths=[s.numel() for s in seqs])
        with self.assertRaisesRegex(ValueError, r"^lengths has 5 entries for a window of 6 samples"):
            x, y, lengths = accumplan.pad_sequences(seqs, next_token=True)
            plan((x,), y, lengths=lengths[:5])
        with self.assertRaisesRegex(ValueError, "^target 2 has"):
            plan(seqs, [torch.zeros(s.numel() + (i == 2), dtype=torch.long) for i, s in enumerate(seqs)])
        with self.assertRaisesRegex(TypeError, "^padding_mask must be"):
            plan(seqs, None, padding_mask="yes")
        for a, b in zip(before, model.parameters()):
            self.assertTrue(torch.equal(a, b.detach()))


if __name__ == "__main__":
    unittest.main()
