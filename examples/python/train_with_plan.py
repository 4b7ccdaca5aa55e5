#!/usr/bin/env python3
"""Train a TorchScript model following an accumplan plan.json, with the accumplan package.

    python3 examples/python/train_with_plan.py --plan plan.json --model m.pt --data data.pt \
        [--steps N] [--lr X] [--max-grad-norm X] [--save out.pt]

--data is what torch.save([inputs..., target], f) writes (dim 0 = samples). The loop below is the
whole integration: one plan.train_window call per window of plan.per_rank_batch samples, which
splits it into the plan's microbatches, weights every microbatch exactly (samples or valid
tokens), steps once, and recovers from out-of-memory by re-planning and replaying the window.
Under torchrun (WORLD_SIZE > 1) each rank takes samples r, r+W, ... of every global window.
For a loop that imports nothing from accumplan (only json and torch, no OOM recovery), see
plain_loop.py beside this file. Needs torch and the accumplan package (`python3 -m pip install --no-build-isolation .` from the
repository root, in a venv made with --system-site-packages so that it sees the system's torch).
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

import accumplan


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plan", required=True)
    ap.add_argument("--model", required=True, help="TorchScript file (torch.jit.save)")
    ap.add_argument("--data", required=True, help="torch.save([inputs..., target], f)")
    ap.add_argument("--steps", type=int, default=0, help="optimizer steps (default: one pass)")
    ap.add_argument("--lr", type=float, help="default: the plan's setup.lr")
    ap.add_argument("--max-grad-norm", type=float)
    ap.add_argument("--save", help="write the trained TorchScript module here (rank 0)")
    a = ap.parse_args()

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() else torch.device("cpu")

    # ---- the loop a trainer needs (12 lines) ----
    plan = accumplan.load_plan(a.plan, model=a.model)                 # checks schema 1.x and the model's hash
    model = torch.jit.load(a.model, map_location=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=a.lr or plan.setup.get("lr", 0.01))
    *inputs, target = torch.load(a.data)
    B, steps = plan.target_batch, 0                                   # B = the global window
    for start in range(0, target.shape[0], B):
        window = [t[start:start + B][rank::world] for t in inputs + [target]]
        stats = plan.train_window(model, optimizer, window[:-1], window[-1], max_grad_norm=a.max_grad_norm,
                                  on_oom=lambda note: print("re-planned:", note, file=sys.stderr))
        print("window %d: loss %.4f, microbatches %s" % (steps, stats.loss, stats.microbatch_sizes), file=sys.stderr)
        steps += 1
        if steps == a.steps:
            break
    # ----
    if a.save and rank == 0:
        model.save(a.save)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
