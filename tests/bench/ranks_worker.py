"""ranks_worker.py — one rank of ranks_bench.py's Python rows: joins a gloo group from RANK/WORLD_SIZE/
MASTER_ADDR/MASTER_PORT and, for one model and one way of training it on the group's ranks (a plain
module or a DDP one with AdamW, or AdamW in a ZeroRedundancyOptimizer; `setup` adds a frozen layer
in the optimizer, a parameter the model does not hold, or amsgrad groups; "scripted" trains the
TorchScript module the CLI runs):

  plan   accumplan.plan of the model as it will train, for the group's ranks, under the budget; rank
         0 saves it to OUT/plan.json
  train  `steps` windows of that plan (tests/python/helpers.py probed_windows: the cpu-counting
         probe installed before the model exists counts all the process allocates and none of
         accumplan's figures), each window's peak (its data made before the probe) against the
         plan's prediction for this rank, written to OUT/rank{r}-{run}.json

    python ranks_worker.py OUT MODEL WAY SETUP BUDGET TARGET STEPS plan|train [RUN]
"""
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer

import accumplan
from ranks_bench import MODELS, input_shape

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
from helpers import probed_windows  # noqa: E402 - the tests' truth: a probe installed before the model


class WithFrozen(torch.nn.Module):
    """The model, beside a frozen layer its forward never uses (whose parameters an optimizer may still hold)."""

    def __init__(self, body):
        super().__init__()
        self.body, self.frozen = body, torch.nn.Linear(128, 128).requires_grad_(False)

    def forward(self, x):
        return self.body(x)


def build(name, way, setup):
    """(the module train_window is given, its optimizer) for this way and setup, seeded alike on every rank."""
    torch.manual_seed(0)
    model = MODELS[name][0]()
    if setup == "scripted":
        model = torch.jit.script(model)
    params = list(model.parameters())
    if setup == "frozen":  # a frozen layer whose parameters the optimizer still holds
        model = WithFrozen(model)
        params = list(model.parameters())
    elif setup == "foreign":  # a parameter the optimizer holds and the model does not
        params.append(torch.nn.Parameter(torch.zeros(128, 128)))
    module = torch.nn.parallel.DistributedDataParallel(model) if way == "ddp" else model
    if setup == "amsgrad":  # two groups of other settings: the state differs per group
        groups = [{"params": params[:len(params) // 2], "amsgrad": True},
                  {"params": params[len(params) // 2:], "amsgrad": False}]
    else:
        groups = [{"params": params}]
    if way == "zero":
        return module, ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, lr=0.01)
    return module, torch.optim.AdamW(groups, lr=0.01)


def main():
    out, name, way, setup, budget, target, steps, mode = sys.argv[1:9]
    target, steps, rank = int(target), int(steps), int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    world = dist.get_world_size()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(target * steps, *input_shape(name), generator=g)
    y = torch.randint(0, 10, (target * steps,), generator=g)
    if mode == "plan":
        module, opt = build(name, way, setup)
        plan = accumplan.plan(module, (x[:target // world],), y[:target // world], target_batch=target, optimizer=opt,
                              world_size=world, memory_budget=budget, progress=False, eval=False)
        if rank == 0:
            plan.save(os.path.join(out, "plan.json"))
    else:
        windows = [(x[s:s + target][rank::world].clone(), y[s:s + target][rank::world].clone())
                   for s in range(0, target * steps, target)]
        rec, plan = probed_windows(lambda: build(name, way, setup), os.path.join(out, "plan.json"), windows)
        with open(os.path.join(out, "rank%d-%s.json" % (rank, sys.argv[9])), "w") as f:
            json.dump({"windows": rec, "sizes": list(plan.microbatch_sizes),
                       "measured_rank": plan.sharding["measured_rank"] if plan.sharding else 0}, f)
    dist.barrier()  # every rank done before any tears the group down
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
