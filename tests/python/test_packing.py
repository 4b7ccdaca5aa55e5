"""Packed plans (schema 1.3, ragged data) in the Python reader: the same packing rule as the C++
executor, the window's gradient equal to the unpadded per-token gradient (also after an
out-of-memory at any microbatch), and a TransformerEncoder kept off the padding by the mask."""
import unittest

import torch

from helpers import FailingAt, TinyLM, golden_doc, params_of, plan_doc

import accumplan

VOCAB = 10


def packed_plan(samples, token_budget, max_seq_len, padding_mask=False):
    d = plan_doc([samples], normalization="tokens")
    d["schema_version"] = "1.3"
    d["tokens"] = {"token_budget": token_budget, "max_seq_len": max_seq_len, "longest_sequence_alone": max_seq_len}
    if padding_mask:
        d["setup"]["padding_mask"] = True
    return accumplan.load_plan(d)


def ragged(n, max_len, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_len + 1, (n,), generator=g)
    seqs = [torch.randint(0, VOCAB, (int(l),), generator=g) for l in lengths]
    targets = [torch.randint(0, 5, (int(l),), generator=g) for l in lengths]
    return seqs, targets


def unpadded_reference(model, seqs, targets, mask=False):
    """Mean per-token cross-entropy of the window, one unpadded sequence at a time."""
    model.zero_grad(set_to_none=True)
    total, tokens = 0.0, 0
    for s, t in zip(seqs, targets):
        args = (s.unsqueeze(0),) + ((torch.zeros(1, s.numel(), dtype=torch.bool),) if mask else ())
        out = model(*args)
        logits = out["logits"] if isinstance(out, dict) else out
        total = total + torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), t, reduction="sum")
        tokens += s.numel()
    (total / tokens).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


class Encoder(torch.nn.Module):
    """A real nn.TransformerEncoder taking src_key_padding_mask as its second argument."""

    def __init__(self, seed=3):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = torch.nn.Embedding(VOCAB, 8)
        layer = torch.nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, num_layers=1)
        self.out = torch.nn.Linear(8, 5)

    def forward(self, x, mask=None):
        return self.out(self.encoder(self.emb(x), src_key_padding_mask=mask))


class Packing(unittest.TestCase):
    def test_the_packing_rule_is_the_executors(self):
        # Longest first, ties in index order, floor(budget / longest) per microbatch
        # (tests/planner/test_token_model.cpp checks the same case in C++).
        self.assertEqual(accumplan.pack_by_token_budget([5, 7, 5, 7, 3], 14), [[1, 3], [0, 2], [4]])
        with self.assertRaisesRegex(accumplan.PlanError, "sequence 1 has 101 tokens, more than the token budget of 100"):
            accumplan.pack_by_token_budget([16, 101], 100)

    def test_packed_plans_read_and_sample_plans_carry_no_budget(self):
        self.assertIsNone(accumplan.load_plan(golden_doc()).tokens)
        plan = packed_plan(13, 40, 20, padding_mask=True)
        self.assertEqual(plan.tokens["token_budget"], 40)
        self.assertTrue(plan.padding_mask)
        self.assertEqual(plan.to_dict()["tokens"]["max_seq_len"], 20)
        d = plan.to_dict()
        d["tokens"]["max_seq_len"] = 41
        with self.assertRaisesRegex(accumplan.PlanError, "must hold at least one sequence of max_seq_len 41"):
            accumplan.load_plan(d)

    def test_the_window_gradient_equals_the_unpadded_per_token_gradient(self):
        seqs, targets = ragged(13, 20, 5)
        x, y, lengths = accumplan.pad_sequences(seqs, targets)
        model = TinyLM()
        plan = packed_plan(13, 40, 20)
        seen = []
        wrapped = FailingAt(model)
        stats = plan.train_window(wrapped, torch.optim.SGD(model.parameters(), lr=0.0), (x,), y, lengths=lengths)
        self.assertEqual(stats.units, int(lengths.sum()))
        self.assertEqual(sum(stats.microbatch_sizes), 13)
        groups = accumplan.pack_by_token_budget(lengths.tolist(), 40)
        self.assertEqual(stats.microbatch_sizes, [len(g) for g in groups])
        # Each microbatch is cut to its own longest sequence, within the budget.
        for g, size in zip(groups, wrapped.sizes):
            seen.append(size)
        self.assertEqual(seen, [len(g) for g in groups])
        want = unpadded_reference(TinyLM(), seqs, targets)
        # lr 0: the parameters are unchanged; compare the gradient the step saw through a hook.
        model2 = TinyLM()
        grads = {}
        opt = torch.optim.SGD(model2.parameters(), lr=0.0)
        orig_step = opt.step

        def step(*a, **k):
            for i, p in enumerate(model2.parameters()):
                grads[i] = p.grad.clone()
            return orig_step(*a, **k)

        opt.step = step
        plan.train_window(model2, opt, (x,), y, lengths=lengths)
        for i, w in enumerate(want):
            torch.testing.assert_close(grads[i], w, rtol=1e-5, atol=1e-7)

    def test_an_oom_at_any_microbatch_repacks_below_it_and_gives_the_same_update(self):
        seqs, targets = ragged(17, 24, 7)
        x, y, lengths = accumplan.pad_sequences(seqs, targets)
        groups = accumplan.pack_by_token_budget(lengths.tolist(), 60)
        ref = TinyLM()
        packed_plan(17, 60, 24).train_window(ref, torch.optim.SGD(ref.parameters(), lr=0.5), (x,), y, lengths=lengths)
        for position, g in enumerate(groups):
            with self.subTest(position=position):
                plan = packed_plan(17, 60, 24)
                model = FailingAt(TinyLM(), position=position)
                notes = []
                stats = plan.train_window(model, torch.optim.SGD(model.parameters(), lr=0.5), (x,), y,
                                          lengths=lengths, on_oom=notes.append)
                failing = len(g) * max(int(lengths[i]) for i in g)
                self.assertEqual(stats.oom_recoveries, 1)
                self.assertEqual(plan.tokens["token_budget"], min(60, failing - 1))
                self.assertIn("%d padded tokens" % failing, notes[0])
                self.assertEqual(sum(model.sizes[position + 1:]), 17)  # the replay: every sequence once
                for got, want in zip(params_of(model.inner), params_of(ref)):
                    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)

    def test_a_sequence_the_plan_was_not_made_for_is_refused(self):
        seqs, targets = ragged(6, 10, 9)
        x, y, lengths = accumplan.pad_sequences(seqs, targets)
        model = TinyLM()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with self.assertRaisesRegex(accumplan.PlanError, "longer than the %d tokens" % (int(lengths.max()) - 1)):
            packed_plan(6, 100, int(lengths.max()) - 1).train_window(model, opt, (x,), y, lengths=lengths)
        with self.assertRaisesRegex(ValueError, "pass lengths="):
            packed_plan(6, 100, 10).train_window(model, opt, (x,), y)

    def test_next_token_targets_shift_the_inputs(self):
        x, y, lengths = accumplan.pad_sequences([torch.tensor([1, 2, 3]), torch.tensor([4])], next_token=True)
        self.assertEqual(x.tolist(), [[1, 2, 3], [4, 0, 0]])
        self.assertEqual(y.tolist(), [[2, 3, -100], [-100, -100, -100]])
        self.assertEqual(lengths.tolist(), [3, 1])

    def test_a_transformer_encoder_with_the_padding_mask_matches_the_unpadded_gradient(self):
        seqs, targets = ragged(9, 12, 11)
        x, y, lengths = accumplan.pad_sequences(seqs, targets)
        want = unpadded_reference(Encoder(), seqs, targets, mask=True)
        for masked in (True, False):
            model = Encoder()
            grads = {}
            opt = torch.optim.SGD(model.parameters(), lr=0.0)
            orig_step = opt.step

            def step(*a, **k):
                for i, p in enumerate(model.parameters()):
                    grads[i] = p.grad.clone()
                return orig_step(*a, **k)

            opt.step = step
            packed_plan(9, 30, 12, padding_mask=masked).train_window(model, opt, (x,), y, lengths=lengths)
            worst = max(float(((grads[i] - w).abs().max() / w.abs().max().clamp_min(1e-12))) for i, w in enumerate(want))
            if masked:
                self.assertLess(worst, 1e-5)
            else:
                self.assertGreater(worst, 1e-3)  # without the mask, valid tokens attend to padding


if __name__ == "__main__":
    unittest.main()
