#!/usr/bin/env python3
"""Train by an accumplan plan.json in plain PyTorch: only json and torch, no accumplan import.

    python3 examples/python/plain_loop.py --plan plan.json --model m.pt --data data.pt \
        [--steps N] [--device cpu|cuda] [--save out.pt]

--model is a TorchScript file (torch.jit.save); --data is what torch.save([inputs..., target], f)
writes (dim 0 = samples). Under torchrun (WORLD_SIZE > 1) rank r takes samples r, r+W, ... of
every global window of target_batch samples.

Every rule below is one of docs/weighting.md's, read from the plan's fields
(docs/plan-format.md, "Training by the plan without accumplan"):

* a window is target_batch samples over all ranks (per_rank_batch on one rank), or fewer at the
  end of the data; its microbatches are `microbatch_sizes`, and a shorter window is re-split under
  the largest of them (`window_sizes`);
* every microbatch contributes the SUM of its per-unit losses divided by N, the window's units:
  its samples, or its valid tokens (target != setup.ignore_index) for a per-token plan, counted
  before the first backward and summed over the ranks;
* gradients are zeroed at the window start, exchanged once (summed) after the last microbatch,
  clipped once on the combined gradient when setup.max_grad_norm is set, and the optimizer steps
  once; a window whose gradient is not finite is not stepped;
* forwards run under autocast only when setup.amp is bf16 or fp16 (fp16 with a GradScaler whose
  scale changes only at the window boundary);
* the optimizer is setup.optimizer with setup.lr and setup.hyperparameters (`make_optimizer`).

What the plan does not let this loop do: OOM recovery (re-planning below a failed size, the
Python package's plan.train_window and `accumplan run` do it), and packing ragged data under
tokens.token_budget (a packed plan's sample fields describe it padded to tokens.max_seq_len,
which is what this loop runs). A plan whose windows are cut by valid tokens (tokens.target_tokens)
is refused: its windows are not target_batch samples.
"""
import argparse
import contextlib
import inspect
import json
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}  # setup.amp "none": no autocast at all


def read_plan(path):
    """The plan document, with the checks this loop relies on (accumplan.load_plan checks all)."""
    with open(path) as f:
        plan = json.load(f)
    if plan.get("schema") != "accumplan.plan" or not str(plan.get("schema_version", "")).startswith("1."):
        raise SystemExit("%s: not an accumplan plan of schema version 1.x" % path)
    if (plan.get("tokens") or {}).get("target_tokens") is not None:
        raise SystemExit("%s: windows cut by valid tokens (tokens.target_tokens) are not target_batch samples; "
                         "train this plan with accumplan's plan.train_window or `accumplan run`" % path)
    if sum(plan["microbatch_sizes"]) != plan["per_rank_batch"]:
        raise SystemExit("%s: microbatch_sizes do not sum to per_rank_batch" % path)
    return plan


def make_optimizer(params, setup):
    """setup.optimizer with setup.lr, setup.hyperparameters and (schema 1.6) setup.flags
    (nesterov, amsgrad, ... by torch.optim's names); absent ones at torch.optim's defaults
    (LibTorch's, which measured the plan), "momentum" at 0.9 for the optimizer of that name. A
    plan of several parameter groups (setup.param_groups) does not say which parameters form
    each group: build that optimizer yourself, from the groups' values."""
    name = setup["optimizer"]
    if len(setup.get("param_groups") or []) > 1:
        raise ValueError("the plan's optimizer has %d parameter groups (setup.param_groups); build it from their "
                         "values with your own parameter split" % len(setup["param_groups"]))
    # A plan names torch.optim's class in lower case; "momentum" is SGD with momentum
    # (docs/plan-format.md). A plan always records lr.
    cls = next(c for n, c in vars(torch.optim).items()
               if isinstance(c, type) and n.lower() == ("sgd" if name == "momentum" else name))
    hp = dict(setup.get("hyperparameters") or {})
    if "beta1" in hp or "beta2" in hp:
        betas = inspect.signature(cls).parameters["betas"].default
        hp["betas"] = (hp.pop("beta1", betas[0]), hp.pop("beta2", betas[1]))
    if name == "momentum":
        hp.setdefault("momentum", 0.9)
    hp.update(setup.get("flags") or {})
    return cls(params, lr=setup["lr"], **hp)


def window_sizes(plan, samples):
    """Microbatch sizes of a window of ``samples`` on this rank: the plan's `microbatch_sizes` for a
    full window; a shorter one in the fewest microbatches of at most the plan's largest, balanced
    (sizes differing by one multiple_of unit at most, larger first) or, for split "uniform", equal
    (the largest divisor of samples, a multiple of the unit, up to that size). multiple_of applies
    only to a window that is a multiple of it."""
    sizes = plan["microbatch_sizes"]
    if samples == plan["per_rank_batch"]:
        return list(sizes)
    if not 1 <= samples < plan["per_rank_batch"]:
        raise ValueError("a window holds 1..%d samples on a rank, not %d" % (plan["per_rank_batch"], samples))
    unit = plan.get("multiple_of") or 1
    unit = unit if samples % unit == 0 else 1
    cap = max(unit, max(sizes) // unit * unit)
    if plan["split"] == "uniform":
        d = max(d for d in range(unit, min(cap, samples) + 1, unit) if samples % d == 0)
        return [d] * (samples // d)
    units, cap_units = samples // unit, cap // unit
    parts = -(-units // cap_units)                          # ceil(units / cap_units)
    q, r = divmod(units, parts)
    return [(q + 1) * unit] * r + [q * unit] * (parts - r)


def by_tokens(setup, target):
    """Whether N counts valid tokens: setup.normalization "tokens", or "auto" with cross-entropy over
    an integer target of more than one dimension ([B,T] targets of [B,T,C] logits)."""
    norm, loss = setup.get("normalization", "auto"), setup.get("loss", "cross_entropy")
    if norm == "auto":
        return loss == "cross_entropy" and target.dim() > 1 and not target.is_floating_point()
    return norm == "tokens"


def loss_sum(out, target, setup, tokens, samples):
    """The SUM over the microbatch's units of the per-unit loss (docs/weighting.md's table)."""
    if isinstance(out, dict):
        out = out["loss"] if setup.get("loss") == "model" else out["logits"]
    elif isinstance(out, (tuple, list)):
        out = out[0]
    loss = setup.get("loss", "cross_entropy")
    if loss == "model":                                   # the forward returned the microbatch's mean
        return out.reshape(()).float() * samples
    if loss == "mse":                                     # a sample's loss: the mean over its elements
        return (out.float() - target.float()).pow(2).reshape(samples, -1).mean(1).sum()
    ii = setup.get("ignore_index", -100)
    per = F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), target.reshape(-1).long(), reduction="none",
                          ignore_index=ii).reshape(target.shape)
    if tokens or per.dim() == 1:
        return per.sum()
    return (per.sum(1) / target.ne(ii).sum(1).clamp_min(1)).sum()  # a sample: the mean over its valid positions


def train_window(model, optimizer, plan, inputs, target, device, scaler=None):
    """One window (this rank's share of it): the plan's microbatches, one optimizer step. Returns the
    window's mean loss, or None when it has no valid token (no step)."""
    setup, world = plan["setup"], dist.get_world_size() if dist.is_initialized() else 1
    n, tokens = target.shape[0], by_tokens(setup, target)
    units = torch.tensor([int(target.ne(setup.get("ignore_index", -100)).sum()) if tokens else n], device=device)
    if world > 1:
        dist.all_reduce(units)                            # N over all ranks, before the first backward
    units = int(units)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer.zero_grad(set_to_none=True)
    if units == 0:
        return None
    dtype = AUTOCAST.get(setup.get("amp", "none"))
    total, start = 0.0, 0
    for m in window_sizes(plan, n) if n else []:
        xs = [x[start:start + m].to(device) for x in inputs]
        y = target[start:start + m].to(device)
        start += m
        with torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext():
            out = model(*xs, y) if setup.get("loss") == "model" else model(*xs)
            s = loss_sum(out, y, setup, tokens, m)
        obj = s / units
        (scaler.scale(obj) if scaler is not None else obj).backward()
        total += float(s)
    if world > 1:                                         # once per window; summed: each rank divided by N
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)
        t = torch.tensor([total], dtype=torch.float64, device=device)
        dist.all_reduce(t)
        total = float(t)
    if scaler is not None:
        scaler.unscale_(optimizer)
    if setup.get("max_grad_norm"):
        norm = torch.nn.utils.clip_grad_norm_(params, setup["max_grad_norm"])   # the combined gradient, once
    else:
        norm = torch.stack([p.grad.norm() for p in params if p.grad is not None]).norm()
    if scaler is not None:
        scaler.step(optimizer)                            # skips a non-finite gradient itself
        scaler.update()                                   # the scale changes at the window boundary only
    elif math.isfinite(float(norm)):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total / units


def grad_scaler():
    """fp16's GradScaler: torch.amp.GradScaler("cuda") on torch 2.3 and later, torch.cuda.amp's before."""
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cuda")
    return torch.cuda.amp.GradScaler()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plan", required=True)
    ap.add_argument("--model", required=True, help="TorchScript file (torch.jit.save)")
    ap.add_argument("--data", required=True, help="torch.save([inputs..., target], f)")
    ap.add_argument("--steps", type=int, default=0, help="optimizer steps (default: one pass over the data)")
    ap.add_argument("--device", help="default: cuda when available, else cpu")
    ap.add_argument("--save", help="write the trained TorchScript module here (rank 0)")
    a = ap.parse_args(argv)

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("nccl" if torch.cuda.is_available() and a.device != "cpu" else "gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))

    plan = read_plan(a.plan)
    if plan["world_size"] != world:
        raise SystemExit("%s is for %d rank(s), this run has %d" % (a.plan, plan["world_size"], world))
    model = torch.jit.load(a.model, map_location=device)
    model.train()
    optimizer = make_optimizer(model.parameters(), plan["setup"])
    scaler = grad_scaler() if plan["setup"].get("amp") == "fp16" else None
    *inputs, target = torch.load(a.data)
    B, steps = plan["target_batch"], 0
    for start in range(0, target.shape[0], B):
        share = [t[start:start + B][rank::world] for t in inputs + [target]]
        loss = train_window(model, optimizer, plan, share[:-1], share[-1], device, scaler)
        print("window %d: loss %s, microbatches %s" % (steps, "skipped (no valid token)" if loss is None else
              "%.4f" % loss, window_sizes(plan, share[-1].shape[0]) if share[-1].shape[0] else []), file=sys.stderr)
        steps += 1
        if steps == a.steps:
            break
    if a.save and rank == 0:
        model.save(a.save)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
