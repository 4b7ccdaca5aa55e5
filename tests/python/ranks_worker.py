"""One rank of test_ranks.py: joins a gloo group and trains windows of a plan whose ranks differ
(rank 0 takes 3 samples of each window of 12 as 2,1; rank 1 takes 9 as 4,4,1), in float64, with
plan.train_window on the rank's own share (plan.rank_slice), per-sample and per-token losses, then
per-token with an out-of-memory injected in rank 1's second forward. Saves each way's parameters to
OUT_DIR/rank{r}-{way}.pt and the re-planned ranks to OUT_DIR/rank{r}-ranks.json."""
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

from helpers import end_rank, Classifier, FailingAt, TinyLM, params_of, ranks_doc, token_data

import accumplan

SAMPLES, TARGET = 17, 12  # a window of 12, then a short one of 5


def windows(x, y, plan, rank):
    for start in range(0, SAMPLES, TARGET):
        xs, ys = x[start:start + TARGET], y[start:start + TARGET]
        share = plan.rank_slice(rank, len(xs))
        yield xs[share], ys[share]


def train(plan, model, data, rank, out, way):
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for x, y in windows(*data, plan, rank):
        plan.train_window(model, opt, (x,), y)
    torch.save(params_of(model.inner if isinstance(model, FailingAt) else model), os.path.join(out, "rank%d-%s.pt" % (rank, way)))


def main():
    rank, out = int(os.environ["RANK"]), sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    g = torch.Generator().manual_seed(5)
    samples = (torch.randn(SAMPLES, 8, generator=g, dtype=torch.float64), torch.randint(0, 4, (SAMPLES,), generator=g))
    sizes = [[2, 1], [4, 4, 1]]
    train(accumplan.load_plan(ranks_doc(sizes)), Classifier().double(), samples, rank, out, "samples")
    tokens = token_data(SAMPLES)
    train(accumplan.load_plan(ranks_doc(sizes, normalization="tokens")), TinyLM().double(), tokens, rank, out, "tokens")
    plan = accumplan.load_plan(ranks_doc(sizes, normalization="tokens"))
    train(plan, FailingAt(TinyLM().double(), position=1 if rank == 1 else None), tokens, rank, out, "oom")
    with open(os.path.join(out, "rank%d-ranks.json" % rank), "w") as f:
        json.dump(plan.ranks, f)
    end_rank()


if __name__ == "__main__":
    main()
