"""One rank of test_dist_validation.py: joins a gloo group from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT,
hands rank 1 a bad share of a window in several ways (and a forward that fails), and records what
each rank raised in OUT_DIR/rank{r}.json; then trains token windows (schema 1.4, target_tokens) whose shares exceed
the per-rank batch on rank 0 and are empty on rank 1, saving the parameters to OUT_DIR/rank{r}-tokens.pt.

Not a test by itself: test_dist_validation.py launches two of these and checks the files. A rank
that hangs in a collective ends at the group's timeout (TIMEOUT_S below) with a RuntimeError, which
is recorded as unexpected.
"""
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

from helpers import TinyLM, make_plan, params_of, token_data
from test_packing import packed_plan

import accumplan

WORLD = 2
TIMEOUT_S = 20
TOKEN_LENGTHS = [3, 3, 3, 3, 3, 15, 2]  # every target valid; at 15 tokens: windows (0,5), (5,1), (6,1)
TARGET_TOKENS = 15


def token_window_data():
    g = torch.Generator().manual_seed(21)
    seqs = [torch.randint(0, 10, (n,), generator=g) for n in TOKEN_LENGTHS]
    targets = [torch.randint(0, 5, (n,), generator=g) for n in TOKEN_LENGTHS]
    return seqs, targets


def token_plan(world_size):
    # per-rank batch 2: a window of 5 gives rank 0 three sequences, one of 1 gives rank 1 none
    return packed_plan(2, 30, 15, target_tokens=TARGET_TOKENS, world_size=world_size)


class FailingForward(torch.nn.Module):
    """The model, whose forward raises on the rank where ``fails``."""

    def __init__(self, model, fails):
        super().__init__()
        self.model, self.fails = model, fails

    def forward(self, x):
        if self.fails:
            raise RuntimeError("this rank's forward failed")
        return self.model(x)


def outcome(fn, with_type=False):
    try:
        fn()
    except ValueError as e:
        return "%s: %s" % (type(e).__name__, e) if with_type else str(e)
    except Exception as e:  # noqa: BLE001 - recorded, the test says what was wrong
        return "UNEXPECTED %s: %s" % (type(e).__name__, e)
    return "NO ERROR"


def main():
    rank = int(os.environ["RANK"])
    out_dir = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    assert dist.get_world_size() == WORLD
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    seqs, targets = token_window_data()
    x, y, lengths = accumplan.pad_sequences(seqs[:4], targets[:4])
    xs, ys, ls = x[rank::WORLD], y[rank::WORLD], lengths[rank::WORLD]  # 2 sequences per rank
    packed = packed_plan(2, 30, 15, world_size=WORLD)
    got = {}
    got["lengths_count"] = outcome(lambda: packed.train_window(
        model, opt, (xs,), ys, lengths=ls[:1] if rank == 1 else ls))
    got["lengths_missing"] = outcome(lambda: packed.train_window(
        model, opt, (xs,), ys, lengths=None if rank == 1 else ls))
    tx, ty = token_data(5)
    samples = make_plan([2], world_size=WORLD)  # per-rank batch 2; rank 1 is handed 3
    got["samples_over_batch"] = outcome(lambda: samples.train_window(
        model, opt, (tx[2:] if rank == 1 else tx[:2],), ty[2:] if rank == 1 else ty[:2]))
    got["split_mismatch"] = outcome(lambda: list(samples.split(
        (tx[:2],), ty[:1] if rank == 1 else ty[:2])))
    failing = FailingForward(model, rank == 1)
    got["forward_fails"] = outcome(lambda: samples.train_window(failing, opt, (tx[:2],), ty[:2]), with_type=True)
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as f:
        json.dump(got, f, indent=1)

    # The group is still in step: train the token windows, shared strided.
    plan = token_plan(WORLD)
    x, y, lengths = accumplan.pad_sequences(seqs, targets)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    shares = []
    for start, count in accumplan.token_windows(accumplan.valid_token_counts(lengths, y), plan.target_tokens):
        w = slice(start, start + count)
        stats = plan.train_window(model, opt, (x[w][rank::WORLD],), y[w][rank::WORLD], lengths=lengths[w][rank::WORLD])
        assert stats.stepped and stats.samples == count, stats
        shares.append(stats.local_samples)
    torch.save({"params": params_of(model), "shares": shares}, os.path.join(out_dir, "rank%d-tokens.pt" % rank))
    dist.barrier()  # both ranks done before either tears the group down: a teardown racing the peer's can abort
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
