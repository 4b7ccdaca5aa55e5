"""One rank of test_dist.py: joins a gloo group from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT and
trains the same windows three ways, saving each way's parameters to OUT_DIR/rank{r}-{way}.pt.

  plain   an nn.Module and plan.train_window, with an OOM injected on rank 1 (window 0, round 2)
  ddp     a DistributedDataParallel module and plan.train_window
  split   a DDP module and the low-level plan.split loop (no_sync for all but the last microbatch)
"""
import datetime
import os
import sys

import torch
import torch.distributed as dist

from helpers import FailingAt, TinyLM, make_plan, params_of, token_data

import accumplan

TARGET, WORLD = 8, 2
SAMPLES = 21  # windows of 8, 8 and a short 5 (3 on rank 0, 2 on rank 1)


def shards(rank):
    x, y = token_data(SAMPLES)
    for start in range(0, SAMPLES, TARGET):
        xs, ys = x[start:start + TARGET], y[start:start + TARGET]
        yield xs[rank::WORLD], ys[rank::WORLD]


def main():
    rank = int(os.environ["RANK"])
    out_dir = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    assert dist.get_world_size() == WORLD

    plan = make_plan([2, 2], world_size=WORLD)
    model = FailingAt(TinyLM(), position=1 if rank == 1 else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    recoveries = 0
    for x, y in shards(rank):
        recoveries += plan.train_window(model, opt, (x,), y).oom_recoveries
    assert recoveries == 1, recoveries  # every rank re-planned, not only rank 1
    assert max(plan.microbatch_sizes) < 2, plan.microbatch_sizes
    torch.save(params_of(model.inner), os.path.join(out_dir, "rank%d-plain.pt" % rank))

    plan = make_plan([2, 2], world_size=WORLD)
    ddp = torch.nn.parallel.DistributedDataParallel(TinyLM())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    for x, y in shards(rank):
        plan.train_window(ddp, opt, (x,), y)
    torch.save(params_of(ddp.module), os.path.join(out_dir, "rank%d-ddp.pt" % rank))

    ddp = torch.nn.parallel.DistributedDataParallel(TinyLM())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    for x, y in shards(rank):
        for (inputs, target), scale in plan.split((x,), y, model=ddp):
            out, _ = accumplan.model_output(ddp(*inputs))
            (scale * accumplan.loss_sum(out, target, "cross_entropy", "tokens")).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.save(params_of(ddp.module), os.path.join(out_dir, "rank%d-split.pt" % rank))
    dist.barrier()  # both ranks done before either tears the group down: a teardown racing the peer's can abort
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
