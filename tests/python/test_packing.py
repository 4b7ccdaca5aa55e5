"""Packed plans (schema 1.3, ragged data) in the Python reader: the same packing rule as the C++
executor, the window's gradient equal to the unpadded per-token gradient (also after an
out-of-memory at any microbatch), and a TransformerEncoder kept off the padding by the mask.
Token windows (schema 1.4, tokens.target_tokens): the window rule against the cases the C++ side
checks too (token_windows_cases.json), windows of any number of samples, and pad_sequences
keeping the targets' dtype. Not here: two ranks (test_dist_validation.py)."""
import json
import os
import unittest

import torch

from helpers import HERE, FailingAt, TinyLM, golden_doc, params_of, plan_doc

import accumplan

VOCAB = 10


CASES = os.path.join(HERE, "token_windows_cases.json")


def packed_doc(samples, token_budget, max_seq_len, padding_mask=False, target_tokens=None, world_size=1,
               step_cost=None):
    d = plan_doc([samples], world_size=world_size, normalization="tokens")
    d["schema_version"] = "1.3" if target_tokens is None and step_cost is None else "1.4"
    d["tokens"] = {"token_budget": token_budget, "max_seq_len": max_seq_len, "longest_sequence_alone": max_seq_len}
    if target_tokens is not None:
        d["tokens"]["target_tokens"] = target_tokens
    if step_cost is not None:
        d["tokens"]["step_cost"] = step_cost
    if padding_mask:
        d["setup"]["padding_mask"] = True
    return d


def packed_plan(*args, **kwargs):
    return accumplan.load_plan(packed_doc(*args, **kwargs))


def grads_seen_by_step(plan, model, *args, **kwargs):
    """The gradient the optimizer step saw (lr 0), and the window's stats."""
    grads = {}
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    orig_step = opt.step

    def step(*a, **k):
        for i, p in enumerate(model.parameters()):
            grads[i] = p.grad.clone()
        return orig_step(*a, **k)

    opt.step = step
    stats = plan.train_window(model, opt, *args, **kwargs)
    return [grads[i] for i in range(len(grads))], stats


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
        tokens += int(t.ne(-100).sum())  # the valid tokens (ignore_index -100 is the default)
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


PACKING_CASES = os.path.join(HERE, "packing_cases.json")


class Packing(unittest.TestCase):
    def test_the_packing_rule_agrees_with_the_cpp_one_on_the_shared_cases(self):
        # tests/planner/test_token_model.cpp reads the same file; the first case is worked by hand.
        with open(PACKING_CASES) as f:
            cases = json.load(f)["cases"]
        self.assertGreaterEqual(len(cases), 8)
        for c in cases:
            with self.subTest(note=c["note"]):
                self.assertEqual(accumplan.pack_by_token_budget(c["lengths"], c["token_budget"], c["step_cost"]),
                                 c["groups"])

    def test_a_plans_step_cost_is_read_validated_written_and_packs(self):
        d = packed_doc(6, 400, 100)
        d["tokens"]["step_cost"] = {"per_microbatch": 50, "per_token": 1, "per_token_squared": 0}
        plan = accumplan.load_plan(d)
        self.assertEqual(plan.step_cost["per_microbatch"], 50)
        self.assertEqual(plan.pack([100, 90, 10, 10, 10, 10]), [[0, 1], [2, 3, 4, 5]])  # the fill would be 4 + 2
        self.assertEqual(plan.to_dict()["tokens"]["step_cost"], d["tokens"]["step_cost"])
        self.assertEqual(packed_plan(6, 400, 100).pack([100, 90, 10, 10, 10, 10]), [[0, 1, 2, 3], [4, 5]])
        d["tokens"]["step_cost"]["per_token"] = 0
        with self.assertRaisesRegex(accumplan.PlanError, r"\$\.tokens\.step_cost\.per_token: 0 is out of range; expected an integer in \[1, 65536\]"):
            accumplan.load_plan(d)

    def test_a_step_costs_seconds_are_read_checked_and_written_back(self):
        # 1.5: token_seconds turns the cost's units back into seconds (accumplan/step_time.h).
        d = packed_doc(6, 400, 100)
        d["schema_version"] = "1.5"
        d["tokens"]["step_cost"] = {"per_microbatch": 50, "per_token": 65536, "per_token_squared": 0,
                                    "token_seconds": 2.5e-4}
        plan = accumplan.load_plan(d)
        self.assertEqual(plan.step_cost["token_seconds"], 2.5e-4)
        self.assertEqual(plan.to_dict()["tokens"]["step_cost"], d["tokens"]["step_cost"])
        for bad, pattern in ((-1.0, r"token_seconds: -1.0 is out of range"), ("fast", r"token_seconds: expected a number, found string")):
            d["tokens"]["step_cost"]["token_seconds"] = bad
            with self.subTest(token_seconds=bad), self.assertRaisesRegex(accumplan.PlanError, pattern):
                accumplan.load_plan(d)

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
        # lr 0: the parameters are unchanged; compare the gradient the step saw.
        grads, _ = grads_seen_by_step(plan, TinyLM(), (x,), y, lengths=lengths)
        for got, w in zip(grads, want):
            torch.testing.assert_close(got, w, rtol=1e-5, atol=1e-7)

    def test_an_oom_at_any_microbatch_repacks_below_it_and_gives_the_same_update(self):
        # Filled to the budget, and cut by a step cost (a microbatch worth 3 padded tokens).
        for cost in (None, {"per_microbatch": 3, "per_token": 1, "per_token_squared": 0}):
            with self.subTest(step_cost=cost):
                self._oom_at_any_microbatch(cost)

    def _oom_at_any_microbatch(self, cost):
        seqs, targets = ragged(17, 24, 7)
        x, y, lengths = accumplan.pad_sequences(seqs, targets)
        groups = accumplan.pack_by_token_budget(lengths.tolist(), 60, cost)
        ref = TinyLM()
        packed_plan(17, 60, 24, step_cost=cost).train_window(ref, torch.optim.SGD(ref.parameters(), lr=0.5), (x,), y,
                                                             lengths=lengths)
        for position, g in enumerate(groups):
            with self.subTest(position=position):
                plan = packed_plan(17, 60, 24, step_cost=cost)
                model = FailingAt(TinyLM(), position=position)
                notes = []
                failing = len(g) * max(int(lengths[i]) for i in g)
                if min(60, failing - 1) < int(lengths.max()):
                    # A microbatch smaller than the window's longest sequence ran out of memory: no
                    # budget below it holds that sequence, so this is the end, said as such.
                    with self.assertRaisesRegex(accumplan.OutOfMemoryAtOne, "cannot hold this window's longest"):
                        plan.train_window(model, torch.optim.SGD(model.parameters(), lr=0.5), (x,), y,
                                          lengths=lengths, on_oom=notes.append)
                    continue
                stats = plan.train_window(model, torch.optim.SGD(model.parameters(), lr=0.5), (x,), y,
                                          lengths=lengths, on_oom=notes.append)
                self.assertEqual(stats.oom_recoveries, 1)
                self.assertEqual(plan.tokens["token_budget"], min(60, failing - 1))
                # The sample fields follow the new budget (the C++ repack_below does the same).
                per = max(1, plan.tokens["token_budget"] // plan.tokens["max_seq_len"])
                self.assertEqual(plan.microbatch_sizes, accumplan.split_samples(17, per))
                self.assertEqual(plan.to_dict()["max_micro_batch"], per)
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
        with self.assertRaisesRegex(ValueError, "a padded batch with lengths="):
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
            grads, _ = grads_seen_by_step(packed_plan(9, 30, 12, padding_mask=masked), Encoder(), (x,), y,
                                          lengths=lengths)
            worst = max(float(((grads[i] - w).abs().max() / w.abs().max().clamp_min(1e-12))) for i, w in enumerate(want))
            if masked:
                self.assertLess(worst, 1e-5)
            else:
                self.assertGreater(worst, 1e-3)  # without the mask, valid tokens attend to padding


class TokenWindows(unittest.TestCase):
    def test_the_window_rule(self):
        self.assertEqual(accumplan.token_windows([5, 5, 5, 5, 5], 10), [(0, 2), (2, 2), (4, 1)])
        self.assertEqual(accumplan.token_windows([12, 1, 1], 10), [(0, 1), (1, 2)])
        self.assertEqual(accumplan.token_windows([0, 0, 3], 2), [(0, 3)])
        self.assertEqual(accumplan.token_windows([], 10), [])
        self.assertEqual(accumplan.token_windows(torch.tensor([3, 4]).tolist(), 3), [(0, 1), (1, 1)])

    def test_every_shared_case(self):
        # The same file is read by the C++ token_windows test: the two sides keep one rule.
        with open(CASES) as f:
            cases = json.load(f)["cases"]
        self.assertGreaterEqual(len(cases), 8)
        for case in cases:
            with self.subTest(case=case):
                got = accumplan.token_windows(case["valid_tokens"], case["target_tokens"])
                self.assertEqual([list(w) for w in got], case["windows"])
                # a partition of 0..n-1 in order, every window non-empty
                self.assertEqual([i for s, c in got for i in range(s, s + c)], list(range(len(case["valid_tokens"]))))
                self.assertTrue(all(c >= 1 for _, c in got))
                # every window but the last reaches the target
                for s, c in got[:-1]:
                    self.assertGreaterEqual(sum(case["valid_tokens"][s:s + c]), case["target_tokens"])

    def test_bad_arguments_are_named(self):
        with self.assertRaisesRegex(ValueError, "target_tokens must be an integer >= 1, got 0"):
            accumplan.token_windows([1, 2], 0)
        with self.assertRaisesRegex(ValueError, "target_tokens must be an integer >= 1, got 2.5"):
            accumplan.token_windows([1, 2], 2.5)
        with self.assertRaisesRegex(ValueError, r"valid_tokens\[2\] must be an integer >= 0.*got -1"):
            accumplan.token_windows([1, 2, -1], 3)
        with self.assertRaisesRegex(ValueError, r"valid_tokens\[1\] must be an integer >= 0.*got 1.5"):
            accumplan.token_windows([1, 1.5], 3)
        with self.assertRaisesRegex(ValueError, r"valid_tokens\[0\].*got True"):
            accumplan.token_windows([True], 3)

    def test_valid_token_counts(self):
        seqs = [torch.tensor([1, 2, 3]), torch.tensor([4]), torch.tensor([5, 6])]
        x, y, lengths = accumplan.pad_sequences(seqs, next_token=True)
        self.assertEqual(accumplan.valid_token_counts(lengths, y), [2, 0, 1])  # length - 1
        # no target: the next-token targets train_window makes for cross_entropy, as y above
        self.assertEqual(accumplan.valid_token_counts(lengths), [2, 0, 1])
        self.assertEqual(accumplan.valid_token_counts([3, 1, 2], None, loss="mse"), [3, 1, 2])
        with self.assertRaisesRegex(ValueError, r"^loss .*'bce'"):
            accumplan.valid_token_counts(lengths, loss="bce")
        targets = [torch.tensor([0, -100, 1]), torch.tensor([-100]), torch.tensor([2, 3])]
        _, y, lengths = accumplan.pad_sequences(seqs, targets)
        self.assertEqual(accumplan.valid_token_counts(lengths, y), [2, 0, 2])
        _, y0, _ = accumplan.pad_sequences(seqs, targets, ignore_index=0)  # padded with the ignore_index counted by
        self.assertEqual(accumplan.valid_token_counts(lengths, y0, ignore_index=0), [2, 1, 2])
        # float per-token targets (mse) and one target per sequence count every token, as the C++ executor
        _, yf, _ = accumplan.pad_sequences(seqs, [t.float() for t in targets])
        self.assertEqual(accumplan.valid_token_counts(lengths, yf), [3, 1, 2])
        self.assertEqual(accumplan.valid_token_counts(lengths, torch.tensor([0, 1, 2])), [3, 1, 2])
        with self.assertRaisesRegex(ValueError, "the target has 3 sequences .* lengths has 2 entries"):
            accumplan.valid_token_counts([3, 1], y)

    def test_target_tokens_is_read_checked_and_written_back(self):
        self.assertIsNone(packed_plan(4, 40, 20).target_tokens)
        self.assertIsNone(accumplan.load_plan(golden_doc()).target_tokens)
        plan = packed_plan(4, 40, 20, target_tokens=64)
        self.assertEqual((plan.schema_version, plan.target_tokens), ("1.4", 64))
        self.assertEqual(plan.to_dict()["tokens"]["target_tokens"], 64)
        self.assertEqual(accumplan.load_plan(plan.to_dict()).target_tokens, 64)
        for bad, message in ((0, r"\$\.tokens\.target_tokens: 0 is out of range; expected a number in \[1, "),
                             (-3, r"\$\.tokens\.target_tokens: -3 is out of range"),
                             (2.5, r"\$\.tokens\.target_tokens: expected an integer, found number"),
                             (True, r"\$\.tokens\.target_tokens: expected an integer, found boolean"),
                             ("64", r"\$\.tokens\.target_tokens: expected an integer, found string")):
            with self.subTest(bad=bad), self.assertRaisesRegex(accumplan.PlanError, message):
                accumplan.load_plan(packed_doc(4, 40, 20, target_tokens=bad))

    def test_only_token_windows_exceed_the_per_rank_batch(self):
        # balanced under the plan's largest microbatch, 4
        self.assertEqual(packed_plan(4, 40, 20, target_tokens=30).window_sizes(9), [3, 3, 3])
        with self.assertRaisesRegex(ValueError, "a window holds 1..4 samples"):
            packed_plan(4, 40, 20).window_sizes(9)
        seqs, targets = ragged(6, 8, 3)
        x, y, lengths = accumplan.pad_sequences(seqs, targets)
        with self.assertRaisesRegex(ValueError, r"a window holds 1..4 samples \(the plan.s per-rank batch\); got 6"):
            packed_plan(4, 40, 8).train_window(TinyLM(), torch.optim.SGD(TinyLM().parameters(), lr=0.1), (x,), y,
                                               lengths=lengths)
        stats = packed_plan(4, 40, 8, target_tokens=10).train_window(
            TinyLM(), torch.optim.SGD(TinyLM().parameters(), lr=0.1), (x,), y, lengths=lengths)
        self.assertEqual((stats.samples, stats.units, stats.stepped), (6, int(lengths.sum()), True))
        # the low-level split takes such a window too
        plan = packed_plan(4, 40, 8, target_tokens=10)
        self.assertEqual(sum(t.shape[0] for (inputs, _), _ in plan.split((x,), y) for t in inputs), 6)

    def test_token_windows_give_the_unpadded_per_token_gradient(self):
        seqs, targets = ragged(23, 12, 13)
        g = torch.Generator().manual_seed(14)
        for t in targets:  # about one target in five ignored: valid tokens != lengths
            t[torch.rand(t.shape, generator=g) < 0.2] = -100
        targets[4][:] = -100  # a sequence without a valid token
        x, y, lengths = accumplan.pad_sequences(seqs, targets)
        valid = accumplan.valid_token_counts(lengths, y)
        self.assertNotEqual(valid, lengths.tolist())
        plan = packed_plan(4, 40, 12, target_tokens=30)
        windows = accumplan.token_windows(valid, plan.target_tokens)
        self.assertGreater(max(c for _, c in windows), plan.per_rank_batch)  # windows the sample plan would refuse
        self.assertEqual(sum(c for _, c in windows), 23)
        for start, count in windows:
            with self.subTest(window=(start, count)):
                w = slice(start, start + count)
                got, stats = grads_seen_by_step(plan, TinyLM(), (x[w],), y[w], lengths=lengths[w])
                self.assertEqual((stats.samples, stats.stepped), (count, True))
                self.assertEqual(stats.units, sum(valid[w]))
                self.assertEqual(len(got), len(list(TinyLM().parameters())))
                self.assertEqual(sum(stats.microbatch_sizes), count)
                want = unpadded_reference(TinyLM(), seqs[w], targets[w])
                for a, b in zip(got, want):
                    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


class PadSequencesDtype(unittest.TestCase):
    def test_targets_keep_their_dtype(self):
        seqs = [torch.tensor([1, 2, 3]), torch.tensor([4])]
        for dtype in (torch.float32, torch.float64, torch.int32, torch.int64):
            with self.subTest(dtype=dtype):
                targets = [torch.tensor([1, 2, 3], dtype=dtype), torch.tensor([4], dtype=dtype)]
                _, y, _ = accumplan.pad_sequences(seqs, targets)
                self.assertEqual(y.dtype, dtype)
                self.assertEqual(y.tolist(), [[1, 2, 3], [4, -100, -100]])
        _, y, _ = accumplan.pad_sequences(seqs, [torch.tensor([0.5, 1.5, 2.5]), torch.tensor([-1.25])])
        self.assertEqual(y.tolist(), [[0.5, 1.5, 2.5], [-1.25, -100.0, -100.0]])  # mse values kept, not truncated
        _, y, _ = accumplan.pad_sequences(seqs, next_token=True)
        self.assertEqual(y.dtype, torch.int64)

    def test_mixed_or_unpaddable_dtypes_are_refused(self):
        seqs = [torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([4])]
        with self.assertRaisesRegex(ValueError, "target 2 is torch.float32 but target 0 is torch.int64"):
            accumplan.pad_sequences(seqs, [torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([4.0])])
        with self.assertRaisesRegex(ValueError, "torch.uint8, which cannot hold the padding ignore_index -100"):
            accumplan.pad_sequences(seqs, [t.to(torch.uint8) for t in seqs])
        _, y, _ = accumplan.pad_sequences(seqs, [t.to(torch.uint8) for t in seqs], ignore_index=255)
        self.assertEqual((y.dtype, y[1].tolist()), (torch.uint8, [3, 255]))


if __name__ == "__main__":
    unittest.main()
