#!/usr/bin/env python3
"""examples/python/plan_ragged.py — plan and train a language model on variable-length sequences,
all in Python: accumplan.plan measures the module and gives a token budget, train_window packs
each window of ragged sequences under it.

What it does: builds a small causal decoder (or takes ``--model``, a file of ``torch.save``d
nn.Module), draws ``--sequences`` token sequences of 8 to ``--longest`` tokens (log-normal, as
tokenized text is), plans them for windows of ``--target-batch`` sequences under
``--memory-budget`` on the CPU, saves the plan (``--plan-out``: the file ``accumplan run --plan``,
``export`` and ``report`` read), and trains ``--windows`` windows, printing each window's
microbatches, loss and memory peak against the plan's prediction for what it packed.
What it is not: a data pipeline (bring your own tokenized sequences: a list of 1-D int64 tensors
works the same) nor a GPU script (``--device cuda`` measures the caching allocator instead).

    build/venv/bin/python examples/python/plan_ragged.py --memory-budget 24MiB --windows 3
"""
import argparse
import math
import sys

import torch
import torch.nn as nn

import accumplan


class Decoder(nn.Module):
    """Embedding, one causal self-attention block, a head: next-token logits [B, T, V]."""

    def __init__(self, vocab=256, width=32, heads=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens):
        h = self.emb(tokens)
        t = tokens.shape[1]
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=tokens.device), 1)
        h = h + self.attn(h, h, h, attn_mask=causal, need_weights=False)[0]
        return self.head(h + self.ff(h))


def draw(n, longest, vocab, seed):
    """n sequences, log-normal lengths (median 48) clipped to 8..longest; the first is the longest."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.exp(math.log(48) + 0.8 * torch.randn(n, generator=g))
    lengths = [longest] + [int(min(longest, max(8, round(float(x))))) for x in raw[1:]]
    return [torch.randint(0, vocab, (l,), generator=g) for l in lengths]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a torch.save()d nn.Module taking int64 [B, T] tokens (default: a small decoder)")
    ap.add_argument("--sequences", type=int, default=96)
    ap.add_argument("--longest", type=int, default=256)
    ap.add_argument("--target-batch", type=int, default=32, help="sequences per optimizer step")
    ap.add_argument("--memory-budget", default="24MiB")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--plan-out", help="write the plan here (the CLI's token plan)")
    a = ap.parse_args()
    torch.manual_seed(0)
    model = (torch.load(a.model) if a.model else Decoder()).to(a.device)
    sequences = draw(a.sequences, a.longest, 256, seed=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    # Next-token targets (target None with cross_entropy), packed under a token budget.
    plan = accumplan.plan(model, sequences, None, target_batch=a.target_batch, optimizer=optimizer,
                          memory_budget=a.memory_budget, device=a.device)
    print("plan: token budget %d padded tokens per microbatch (sequences up to %d); %s"
          % (plan.tokens["token_budget"], plan.tokens["max_seq_len"], plan.reason))
    if a.plan_out:
        plan.save(a.plan_out)
    for w in range(a.windows):
        window = sequences[w * plan.per_rank_batch:(w + 1) * plan.per_rank_batch]
        if not window:
            break
        st = plan.train_window(model, optimizer, window, None, measure_memory=True)
        print("window %d: loss %.4f over %d tokens in microbatches %s; peak %.2f MiB (predicted %.2f MiB)"
              % (w + 1, st.loss, st.units, st.microbatch_sizes, st.peak_bytes / 2 ** 20,
                 st.predicted_peak_bytes / 2 ** 20))
    return 0


if __name__ == "__main__":
    sys.exit(main())
