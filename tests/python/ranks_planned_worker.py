"""One rank of test_ranks.py's planned case: trains the plan OUT_DIR/plan.json (ranks that differ,
made by accumplan.plan_ranks) on its share of each window with plan.train_window under its own
budget (the counting allocator), and writes each window's measured and predicted peak and its
microbatches to OUT_DIR/rank{r}-peaks.json."""
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

from helpers import end_rank, Gated

import accumplan

WINDOWS = 4


def main():
    rank, out = int(os.environ["RANK"]), sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    plan = accumplan.load_plan(os.path.join(out, "plan.json"))
    model = Gated()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(3)
    B = plan.target_batch
    x, y = torch.randn(WINDOWS * B, 16, 32, generator=g), torch.randint(0, 8, (WINDOWS * B,), generator=g)
    rows = []
    for w in range(WINDOWS):
        share = plan.rank_slice(rank, B)
        xs, ys = x[w * B:(w + 1) * B][share], y[w * B:(w + 1) * B][share]
        st = plan.train_window(model, opt, (xs,), ys, measure_memory=True,
                               memory_budget=plan.ranks[rank]["budget_bytes"])
        rows.append({"peak": st.peak_bytes, "predicted": st.predicted_peak_bytes, "sizes": list(st.microbatch_sizes),
                     "oom": st.oom_recoveries})
    with open(os.path.join(out, "rank%d-peaks.json" % rank), "w") as f:
        json.dump(rows, f)
    end_rank()


if __name__ == "__main__":
    main()
