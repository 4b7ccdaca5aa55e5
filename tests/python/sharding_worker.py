"""One rank of test_sharding.py: joins a gloo group from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT,
checks that the core's partition is ZeroRedundancyOptimizer's and that accumplan.plan recognises
one, then trains the same windows with a ZeroRedundancyOptimizer (AdamW) under a sharded plan two
ways, saving each way's parameters to OUT_DIR/rank{r}-{way}.pt:

  samples  a classifier, a loss per sample, an OOM injected on rank 1 (window 0, its second forward)
  tokens   a token model, a loss per token (ignored targets differing by sample)
"""
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer

from helpers import Classifier, FailingAt, TinyLM, classifier_data, make_plan, params_of, token_data

import accumplan

TARGET = 8
SAMPLES = 21  # windows of 8, 8 and a short 5


def shards(x, y, rank, world):
    for start in range(0, SAMPLES, TARGET):
        yield x[start:start + TARGET][rank::world], y[start:start + TARGET][rank::world]


def zero(model):
    return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=0.05, weight_decay=0.01)


def check_partition(rank, world):
    """This rank's parameters in the ZeroRedundancyOptimizer are those the core assigns it."""
    model = TinyLM()
    opt = zero(model)
    mine = {id(p) for g in opt.optim.param_groups for p in g["params"]}
    numels = [p.numel() for p in model.parameters()]
    core = accumplan._core.shard_optimizer_state([numels], world, [8 * n + 4 for n in numels])["partition"]
    held = [i for i, p in enumerate(model.parameters()) if id(p) in mine]
    assert held == [i for i, r in enumerate(core) if r == rank], (held, core)


def main():
    rank, out_dir = int(os.environ["RANK"]), sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    world = dist.get_world_size()
    check_partition(rank, world)

    x, y = classifier_data(SAMPLES)
    model = Classifier()
    planned = accumplan.plan(model, (x[:TARGET],), y[:TARGET], target_batch=TARGET, optimizer=zero(model),
                             progress=False, eval=False)
    assert planned.world_size == world and planned.sharding["world_size"] == world, planned.sharding

    plan = make_plan([2, 2], world_size=world, sharded=True)
    model = FailingAt(Classifier(), position=1 if rank == 1 else None)
    opt = zero(model)
    recoveries = sum(plan.train_window(model, opt, (xs,), ys).oom_recoveries for xs, ys in shards(x, y, rank, world))
    assert recoveries == 1, recoveries  # every rank re-planned, not only rank 1
    torch.save(params_of(model.inner), os.path.join(out_dir, "rank%d-samples.pt" % rank))

    x, y = token_data(SAMPLES)
    plan = make_plan([2, 2], world_size=world, sharded=True)
    model = TinyLM()
    opt = zero(model)
    units = [plan.train_window(model, opt, (xs,), ys).units for xs, ys in shards(x, y, rank, world)]
    torch.save(params_of(model), os.path.join(out_dir, "rank%d-tokens.pt" % rank))
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as f:
        json.dump({"units": units}, f)
    dist.barrier()  # both ranks done before either tears the group down: a teardown racing the peer's can abort
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
