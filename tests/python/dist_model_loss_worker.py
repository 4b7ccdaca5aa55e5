"""One rank of test_model_loss.py's two-rank case: joins a gloo group from RANK/WORLD_SIZE/
MASTER_ADDR/MASTER_PORT, trains its half of one window of a causal LM with loss="model" (plan
[3,2] per rank), and saves its parameters and the window's units to OUT_DIR/rank{r}*.pt."""
import datetime
import os
import sys

import torch
import torch.distributed as dist

from helpers import make_plan, params_of
from test_model_loss import TinyForCausalLM, adamw, dist_batch


def main():
    rank = int(os.environ["RANK"])
    out_dir = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    batch = dist_batch()
    half = {k: v[5 * rank:5 * rank + 5] for k, v in batch.items()}
    model = TinyForCausalLM()
    plan = make_plan([3, 2], world_size=2, loss="model")
    st = plan.train_window(model, adamw(model), half)
    assert st.normalization == "tokens" and st.microbatch_sizes == [3, 2], st
    torch.save(params_of(model), os.path.join(out_dir, "rank%d.pt" % rank))
    torch.save(st.units, os.path.join(out_dir, "rank%d-units.pt" % rank))
    dist.barrier()  # both ranks done before either tears the group down: a teardown racing the peer's can abort
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
