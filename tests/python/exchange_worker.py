"""One rank of test_exchange.py: joins a gloo group from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT,
plans a model whose gradients outweigh a microbatch's activations for the group's ranks (AdamW,
whole or with its state in a ZeroRedundancyOptimizer), then trains four windows of that plan on
its share and writes each window's measured and predicted peaks to OUT_DIR/rank{r}-{way}.json;
then tries a window with group= a group of its own rank alone (OUT_DIR/rank{r}-alone.json).
"""
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer

import accumplan

TARGET = 32  # global samples per window
BUDGET = 3 * 1024 * 1024


def wide_model():
    """About 0.5 MB of parameters, few activations per sample."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 64),
                               torch.nn.ReLU(), torch.nn.Linear(64, 10))


def optimizer(model, way):
    if way == "zero":
        return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=0.01)
    return torch.optim.AdamW(model.parameters(), lr=0.01)


def main():
    rank, out_dir = int(os.environ["RANK"]), sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    world = dist.get_world_size()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4 * TARGET, 64, generator=g), torch.randint(0, 10, (4 * TARGET,), generator=g)
    for way in ("whole", "zero"):
        model = wide_model()
        opt = optimizer(model, way)
        plan = accumplan.plan(model, (x[:TARGET // world],), y[:TARGET // world], target_batch=TARGET, optimizer=opt,
                              world_size=world, memory_budget=BUDGET, progress=False, eval=False)
        windows = []
        for start in range(0, 4 * TARGET, TARGET):
            xs, ys = x[start:start + TARGET][rank::world], y[start:start + TARGET][rank::world]
            st = plan.train_window(model, opt, (xs,), ys, measure_memory=True)
            windows.append({"peak": st.peak_bytes, "predicted": st.predicted_peak_bytes, "oom": st.oom_recoveries})
        record = {"windows": windows, "exchange": bool(plan.profile.get("gradient_exchange")),
                  "world_size": plan.world_size, "sizes": list(plan.microbatch_sizes),
                  "measured_rank": plan.sharding["measured_rank"] if plan.sharding else 0}
        with open(os.path.join(out_dir, "rank%d-%s.json" % (rank, way)), "w") as f:
            json.dump(record, f)
    # A group of this rank alone under a plan for the group's two ranks: refused, nothing exchanged.
    alone = [dist.new_group([r]) for r in range(world)][rank]
    try:
        plan.train_window(model, opt, (x[:TARGET][rank::world],), y[:TARGET][rank::world], group=alone)
        refused = None
    except ValueError as e:
        refused = str(e)
    with open(os.path.join(out_dir, "rank%d-alone.json" % rank), "w") as f:
        json.dump({"refused": refused}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
