"""One rank of test_exchange.py's DDP case: joins a gloo group from RANK/WORLD_SIZE/MASTER_ADDR/
MASTER_PORT and, for a DistributedDataParallel-wrapped model whose gradients outweigh a microbatch's
activations (AdamW):

  plan   accumplan.plan of the DDP module for the group's ranks, saved to OUT_DIR/plan.json (rank 0)
  train  with the cpu-counting probe installed before the model exists, so that it counts all the
         process allocates (the reducer's buckets included) and none of accumplan's figures: four
         windows of that plan, each window's peak against the plan's prediction for this rank,
         written to OUT_DIR/rank{r}-ddp.json
"""
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

import accumplan
from exchange_worker import TARGET, wide_model
from helpers import probed_windows

BUDGET = 4 * 1024 * 1024  # the reducer's buckets hold another copy of the gradients


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(4 * TARGET, 64, generator=g), torch.randint(0, 10, (4 * TARGET,), generator=g)


def wrapped():
    ddp = torch.nn.parallel.DistributedDataParallel(wide_model())
    return ddp, torch.optim.AdamW(ddp.parameters(), lr=0.01)


def main():
    rank, mode, out_dir = int(os.environ["RANK"]), sys.argv[2], sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    world = dist.get_world_size()
    x, y = data()
    if mode == "plan":
        ddp, opt = wrapped()
        plan = accumplan.plan(ddp, (x[:TARGET // world],), y[:TARGET // world], target_batch=TARGET, optimizer=opt,
                              world_size=world, memory_budget=BUDGET, progress=False, eval=False)
        if rank == 0:
            plan.save(os.path.join(out_dir, "plan.json"))
    else:
        windows = [(x[s:s + TARGET][rank::world].clone(), y[s:s + TARGET][rank::world].clone())
                   for s in range(0, 4 * TARGET, TARGET)]
        peaks, plan = probed_windows(wrapped, os.path.join(out_dir, "plan.json"), windows)
        with open(os.path.join(out_dir, "rank%d-ddp.json" % rank), "w") as f:
            json.dump({"windows": peaks, "sizes": list(plan.microbatch_sizes)}, f)
    dist.barrier()  # both ranks done before either tears the group down: a teardown racing the peer's can abort
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
