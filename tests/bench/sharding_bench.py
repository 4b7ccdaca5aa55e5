#!/usr/bin/env python3
"""sharding_bench.py — optimizer state sharded over ranks (ZeRO-1) on 2 and 4 gloo ranks, through
what users run.

What it does, for W in 2 and 4, on the CPU under one budget, with AdamW on a model whose optimizer
state dominates (a tower of eight 512-wide Linear + LayerNorm + GELU blocks, 2.1 M parameters; its
state is twice its weights) that no test was tuned on:
  plan     ``accumplan.plan(..., world_size=W)`` unsharded and with ``shard="optimizer"``: the
           largest microbatch each allows, the state sharding frees per rank, and the gain the
           planner predicts (the freed bytes over the line's bytes per sample);
  train    W processes (gloo, one thread each) train three windows of the sharded plan with a
           ``torch.distributed.optim.ZeroRedundancyOptimizer`` (AdamW) and ``plan.train_window(...,
           measure_memory=True)``: every rank's measured steady peak (windows 2 and 3, the state
           allocated; the counting allocator) against its predicted per-rank peak (the plan's
           prediction for its largest share, less what the rank's own share is smaller by);
  1.1x+1   each rank then runs one window of two microbatches of ceil(1.1 x the plan's largest) + 1
           samples (the second with the gradients resident): its measured peak against the budget
           (it must not fit);
  truth    the largest b whose window [b, b] fits on every rank, bisected by real windows of the
           ranks' own training (ZeroRedundancyOptimizer, then a plain AdamW with the whole state on
           every rank): the true gain of sharding against the predicted one;
  exact    the final parameters of every rank against one process training the same global
           windows as one microbatch each with plain AdamW (max |difference|), in float64 (float32's
           summation order moves Adam's near-zero components; that figure is reported too), for
           this loss per sample and for a loss per token (a token model with ignored targets);
  OOM      one rank (1) raises an out-of-memory error in its second forward: every rank
           re-plans (oom_recoveries), and the parameters still equal one process's.
Truth for memory is the counting allocator's peak in each rank's own training; truth for the update
is a plain single-process AdamW on the whole window. Writes tests/bench/SHARDING.md and sharding.json.
What it is not: a test (it asserts nothing; it prints the targets), nor a GPU benchmark.
Run: build/venv/bin/python tests/bench/sharding_bench.py [--device cuda] [--worlds 2,4] [--width 512]
     [--budget 48MiB] [--per-rank 1024] [--out-dir tests/bench]
"""
import argparse
import datetime
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
import accumplan  # noqa: E402

# What a run measures (the arguments; the ranks read them from job.json): the device, the tower's
# width, the budget and the per-rank window planned for (memory bounds the microbatch below it).
CFG = {"device": "cpu", "width": 512, "budget": "48MiB", "per_rank": 1024}
WINDOWS = 3
LR = 1e-3


class Tower(torch.nn.Module):
    """float32[B,W] -> logits [B,16]: eight Linear(W,W) + LayerNorm + GELU blocks (W: CFG's width)."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        w = CFG["width"]
        self.blocks = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(w, w), torch.nn.LayerNorm(w),
                                                                torch.nn.GELU()) for _ in range(8)])
        self.head = torch.nn.Linear(w, 16)

    def forward(self, x):
        return self.head(self.blocks(x))


class TokenTower(torch.nn.Module):
    """int64[B,T] tokens in [0,64) -> logits [B,T,64]: an embedding and two 256-wide layers."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = torch.nn.Embedding(64, 256)
        self.mid = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 256))
        self.head = torch.nn.Linear(256, 64)

    def forward(self, tokens):
        return self.head(torch.tanh(self.mid(self.emb(tokens))))


def sample_data(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, CFG["width"], generator=g), torch.randint(0, 16, (n,), generator=g)


def token_data(n, t=12, seed=2):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 64, (n, t), generator=g)
    y = torch.randint(0, 64, (n, t), generator=g)
    for i in range(n):
        y[i, t - (i % (t + 1)):] = -100  # a different number of ignored targets per sample
    return x, y


def adamw(params):
    return torch.optim.AdamW(params, lr=LR, weight_decay=0.01)


def windows(x, y, global_window, rank=0, world=1):
    for s in range(0, x.shape[0], global_window):
        yield x[s:s + global_window][rank::world], y[s:s + global_window][rank::world]


_HELD = []


def largest_fitting(plan, model, opt, x, y, budget_bytes):
    """The truth: the largest b whose window of two microbatches of b (the second with the
    gradients resident) peaks within the budget on every rank, bisected by real windows of this
    rank's training (the counting allocator's peak, the highest over the ranks)."""
    def fits(b):
        st = with_sizes(plan, [b, b]).train_window(model, opt, (x[:2 * b],), y[:2 * b], measure_memory=True,
                                                   oom_recovery=False)
        peak = torch.tensor([st.peak_bytes], dtype=torch.int64)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        _HELD.append(peak)  # never freed on gloo's thread
        return int(peak) <= budget_bytes
    fits(plan.max_micro_batch)  # the first window allocates the optimizer state
    lo, hi = 1, 2 * plan.max_micro_batch  # lo fits, hi does not (checked)
    if fits(hi):
        return hi
    if not fits(lo):
        return 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def with_sizes(plan, sizes, single_process=False):
    """The plan with one window of these microbatch sizes per rank; ``single_process``: for one
    process with a plain optimizer (world size 1, not sharded)."""
    d = plan.to_dict()
    if single_process:
        d["world_size"] = 1
        d.pop("sharding")
    T = sum(sizes)
    u = accumplan.largest_divisor_at_most(T, max(sizes))
    d.update(target_batch=T * d["world_size"], per_rank_batch=T, microbatch_sizes=list(sizes),
             weights=[n / T for n in sizes], micro_batch=max(sizes), accumulation_steps=len(sizes),
             max_micro_batch=max(sizes), uniform={"micro_batch": u, "accumulation_steps": T // u})
    return accumplan.load_plan(d)


# ---- one rank ---------------------------------------------------------------------------------

def rank_main(out_dir):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    world = dist.get_world_size()
    with open(os.path.join(out_dir, "job.json")) as f:
        job = json.load(f)
    CFG.update(job["cfg"])
    dev = torch.device(CFG["device"])
    if dev.type == "cuda":
        torch.cuda.set_device(dev)  # every rank on the one device: each its own caching allocator
    on = lambda *ts: tuple(t.to(dev) for t in ts)  # noqa: E731
    save = lambda m, way: torch.save([p.detach().cpu() for p in m.parameters()],  # noqa: E731
                                     os.path.join(out_dir, "rank%d-%s.pt" % (rank, way)))
    zero = lambda m: ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.AdamW,  # noqa: E731
                                             lr=LR, weight_decay=0.01)
    result = {"rank": rank}
    plan = accumplan.load_plan(job["plan"])
    model = Tower().to(dev)
    opt = zero(model)
    x, y = on(*sample_data(job["samples"]))
    result["windows"] = []
    for xs, ys in windows(x, y, plan.target_batch, rank, world):
        st = plan.train_window(model, opt, (xs,), ys, measure_memory=True)
        result["windows"].append({"sizes": list(st.microbatch_sizes), "peak_bytes": st.peak_bytes,
                                  "predicted_peak_bytes": st.predicted_peak_bytes})
    save(model, "float32")
    big = with_sizes(plan, [job["big"]] * 2)  # the second microbatch is a steady one: gradients resident
    st = big.train_window(model, opt, (x[:2 * job["big"]],), y[:2 * job["big"]], measure_memory=True,
                          oom_recovery=False)
    result["big_peak_bytes"] = st.peak_bytes
    budget = plan.memory["budget_bytes"]
    result["true_sharded"] = largest_fitting(plan, model, opt, x, y, budget)
    whole = accumplan.load_plan(job["unsharded_plan"])
    model = Tower().to(dev)
    result["true_unsharded"] = largest_fitting(whole, model, adamw(model.parameters()), x, y, budget)

    # float64 from here: the update's exactness without float32's summation order in the way
    model = Tower().double().to(dev)
    opt = zero(model)
    for xs, ys in windows(x.double(), y, plan.target_batch, rank, world):
        plan.train_window(model, opt, (xs,), ys)
    save(model, "samples")

    plan = with_sizes(accumplan.load_plan(job["token_plan"]), job["token_sizes"])
    model = TokenTower().double().to(dev)
    opt = zero(model)
    x, y = on(*token_data(job["token_samples"]))
    for xs, ys in windows(x, y, plan.target_batch, rank, world):
        plan.train_window(model, opt, (xs,), ys)
    save(model, "tokens")

    plan = accumplan.load_plan(job["plan"])
    model = Tower().double().to(dev)
    failing = rank == 1
    forward = model.forward
    calls = [0]

    def flaky(inp):
        calls[0] += 1
        if failing and calls[0] == 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 MiB (injected by sharding_bench)")
        return forward(inp)
    model.forward = flaky
    opt = zero(model)
    x, y = on(*sample_data(job["samples"]))
    result["oom_recoveries"] = sum(plan.train_window(model, opt, (xs,), ys).oom_recoveries
                                   for xs, ys in windows(x.double(), y, plan.target_batch, rank, world))
    save(model, "oom")
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


def run_ranks(out_dir, world):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank-of", out_dir],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT) for r in range(world)]
    logs = [p.communicate(timeout=1200)[0].decode(errors="replace") for p in procs]
    for r, p in enumerate(procs):
        if p.returncode != 0:
            raise SystemExit("rank %d of %d failed:\n%s" % (r, world, logs[r]))


# ---- the parent -------------------------------------------------------------------------------

def reference(model, x, y, global_window):
    """One process, one microbatch per global window, plain AdamW."""
    opt = adamw(model.parameters())
    plan = with_sizes(accumplan.load_plan(REF_PLAN[0]), [global_window], single_process=True)
    for xs, ys in windows(x, y, global_window):
        plan.train_window(model, opt, (xs,), ys)
    return [p.detach() for p in model.parameters()]


REF_PLAN = [None]


def max_diff(out_dir, world, way, want):
    worst = 0.0
    for r in range(world):
        got = torch.load(os.path.join(out_dir, "rank%d-%s.pt" % (r, way)), map_location="cpu")
        worst = max(worst, max(float((g - w).abs().max()) for g, w in zip(got, want)))
    return worst


def bench(world):
    t0 = time.perf_counter()
    dev = torch.device(CFG["device"])
    x, y = (t.to(dev) for t in sample_data(64))
    common = dict(target_batch=world * CFG["per_rank"], memory_budget=CFG["budget"], world_size=world, progress=False,
                  eval=False)
    model = Tower().to(dev)
    unsharded = accumplan.plan(model, (x,), y, optimizer=adamw(model.parameters()), shard="off", **common)
    sharded = accumplan.plan(model, (x,), y, optimizer=adamw(model.parameters()), shard="optimizer", **common)
    tx, ty = (t.to(dev) for t in token_data(64))
    token_model = TokenTower().to(dev)
    token_plan = accumplan.plan(token_model, (tx,), ty, optimizer=adamw(token_model.parameters()), shard="optimizer",
                                target_batch=world * 8, world_size=world, progress=False, eval=False)  # its windows are set
    s = sharded.sharding
    shares = s["per_rank_state_bytes"]
    freed = sum(shares) - shares[s["measured_rank"]]
    big = math.ceil(1.1 * sharded.max_micro_batch) + 1
    samples = 3 * sharded.target_batch  # three full windows: the second and third are steady
    token_sizes = [3, 3, 2]
    token_samples = int(2.5 * world * sum(token_sizes))  # the last window short
    with tempfile.TemporaryDirectory() as out:
        with open(os.path.join(out, "job.json"), "w") as f:
            json.dump({"cfg": CFG, "plan": sharded.to_dict(), "unsharded_plan": unsharded.to_dict(), "token_plan": token_plan.to_dict(), "big": big,
                       "samples": samples, "token_samples": token_samples, "token_sizes": token_sizes}, f)
        run_ranks(out, world)
        ranks = []
        for r in range(world):
            with open(os.path.join(out, "rank%d.json" % r)) as f:
                ranks.append(json.load(f))
        REF_PLAN[0] = sharded.to_dict()
        xs, ys = sample_data(samples)
        exact_float32 = max_diff(out, world, "float32", reference(Tower(), xs, ys, sharded.target_batch))
        want = reference(Tower().double(), xs.double(), ys, sharded.target_batch)
        exact_samples = max_diff(out, world, "samples", want)
        exact_oom = max_diff(out, world, "oom", want)
        REF_PLAN[0] = token_plan.to_dict()
        xt, yt = token_data(token_samples)
        exact_tokens = max_diff(out, world, "tokens", reference(TokenTower().double(), xt, yt, world * sum(token_sizes)))
    budget = sharded.memory["budget_bytes"]
    rows = []
    for rk in ranks:
        less = shares[s["measured_rank"]] - shares[rk["rank"]]
        for i, w in enumerate(rk["windows"][1:], start=2):  # steady: the state exists
            predicted = w["predicted_peak_bytes"] - less
            rows.append({"rank": rk["rank"], "window": i, "sizes": w["sizes"], "measured_peak_bytes": w["peak_bytes"],
                         "predicted_peak_bytes": predicted,
                         "error": (w["peak_bytes"] - predicted) / predicted})
    return {
        "world_size": world, "budget_bytes": budget, "seconds": time.perf_counter() - t0,
        "unsharded": {"max_micro_batch": unsharded.max_micro_batch, "microbatch_sizes": unsharded.microbatch_sizes,
                      "optimizer_state_bytes": unsharded.memory["optimizer_state_bytes"]},
        "sharded": {"max_micro_batch": sharded.max_micro_batch, "microbatch_sizes": sharded.microbatch_sizes,
                    "per_rank_state_bytes": shares, "measured_rank": s["measured_rank"],
                    "unsharded_micro_batch": s["unsharded_micro_batch"], "freed_bytes": freed,
                    "slope_bytes_per_sample": sharded.fit["slope_bytes_per_sample"],
                    "predicted_gain": freed / sharded.fit["slope_bytes_per_sample"]},
        "rows": rows,
        "big": {"micro_batch": big, "peak_bytes": [rk["big_peak_bytes"] for rk in ranks]},
        "truth": {"unsharded": ranks[0]["true_unsharded"], "sharded": ranks[0]["true_sharded"]},
        "exact": {"samples": exact_samples, "tokens": exact_tokens, "oom": exact_oom, "float32": exact_float32},
        "oom_recoveries": [rk["oom_recoveries"] for rk in ranks],
        "token_plan": {"microbatch_sizes": token_sizes, "per_rank_state_bytes":
                       token_plan.sharding["per_rank_state_bytes"]},
    }


def mib(b):
    return "%.2f MiB" % (b / 2 ** 20)


def report(results):
    out = ["# Optimizer state sharded over gloo ranks (ZeRO-1)", "",
           "Generated by `build/venv/bin/python tests/bench/sharding_bench.py` (torch %s, device %s: %s). Model: a tower of eight Linear(%d,%d) + LayerNorm + GELU blocks and a 16-class "
           "head (%d parameters), AdamW (its state is twice the weights), budget %s, %d samples per rank per "
           "window. Each rank trains with `torch.distributed.optim.ZeroRedundancyOptimizer(optimizer_class="
           "torch.optim.AdamW)` (gloo) and `plan.train_window(..., measure_memory=True)`."
           % (torch.__version__, CFG["device"], "the caching allocator's allocated peaks, every rank on the one GPU"
              if CFG["device"].startswith("cuda") else "the counting allocator", CFG["width"], CFG["width"], sum(p.numel() for p in Tower().parameters()),
              CFG["budget"], CFG["per_rank"]), ""]
    for r in results:
        u, s = r["unsharded"], r["sharded"]
        out += ["## %d ranks" % r["world_size"], "",
                "| | unsharded | sharded |", "|---|---|---|",
                "| largest microbatch (max_micro_batch) | %d | %d |" % (u["max_micro_batch"], s["max_micro_batch"]),
                "| window per rank | %s | %s |" % (u["microbatch_sizes"], s["microbatch_sizes"]),
                "| optimizer state per rank | %s | %s (largest share, rank %d) |" % (
                    mib(u["optimizer_state_bytes"]), mib(max(s["per_rank_state_bytes"])), s["measured_rank"]),
                "| truth: the largest b whose window [b, b] fits on every rank, bisected by real windows | %d | %d |" % (
                    r["truth"]["unsharded"], r["truth"]["sharded"]), "",
                "Gain: planned %d samples (%d -> %d), true %d (%d -> %d), predicted from the state sharding frees "
                "%.1f (its bytes over the line's bytes per sample)." % (
                    s["max_micro_batch"] - u["max_micro_batch"], u["max_micro_batch"], s["max_micro_batch"],
                    r["truth"]["sharded"] - r["truth"]["unsharded"], r["truth"]["unsharded"], r["truth"]["sharded"],
                    s["predicted_gain"]), "",
                "Shares per rank: %s; freed on the largest: %s = %.1f samples at %.0f bytes per sample (the "
                "predicted gain); measured gain %d samples; the sharded plan's own line puts the unsharded "
                "microbatch at %s." % (", ".join(mib(b) for b in s["per_rank_state_bytes"]), mib(s["freed_bytes"]),
                                       s["predicted_gain"], s["slope_bytes_per_sample"],
                                       s["max_micro_batch"] - u["max_micro_batch"], s["unsharded_micro_batch"]), "",
                "| rank | window | microbatches | measured steady peak | predicted | error |", "|---|---|---|---|---|---|"]
        for row in r["rows"]:
            out.append("| %d | %d | %s | %d | %d | %+.3f%% |" % (row["rank"], row["window"], row["sizes"],
                                                               row["measured_peak_bytes"], row["predicted_peak_bytes"],
                                                               100 * row["error"]))
        out += ["", "1.1x + 1 of the largest planned microbatch = %d samples, a window of two such microbatches (the second with the gradients "
                "resident): measured peaks %s against the %s budget (%s)." % (
            r["big"]["micro_batch"], ", ".join(mib(b) for b in r["big"]["peak_bytes"]), mib(r["budget_bytes"]),
            "none fits" if all(b > r["budget_bytes"] for b in r["big"]["peak_bytes"]) else "SOME FIT"), "",
            "Parameters after the windows against one process training each global window as one microbatch "
            "with plain AdamW (max |difference| over every parameter of every rank), in float64: loss per sample "
            "%.2e, loss per token %.2e (windows %s per rank, the last short), with an OOM injected in rank 1's "
            "second forward %.2e (oom_recoveries per rank %s). The float32 run above: %.2e (Adam divides each "
            "gradient by its own magnitude, so float32 summation order moves near-zero components by up to "
            "a step)." % (r["exact"]["samples"], r["exact"]["tokens"], r["token_plan"]["microbatch_sizes"],
                          r["exact"]["oom"], r["oom_recoveries"], r["exact"]["float32"]), "",
            "%.0f s for this row." % r["seconds"], ""]
    return "\n".join(out)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--rank-of":
        torch.set_num_threads(1)
        return rank_main(sys.argv[2])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu, or cuda: every rank on the one GPU, gloo")
    ap.add_argument("--worlds", default="2,4", help="the world sizes, one row each")
    ap.add_argument("--width", type=int, default=CFG["width"], help="the tower's width")
    ap.add_argument("--budget", default=CFG["budget"])
    ap.add_argument("--per-rank", type=int, default=CFG["per_rank"], help="the per-rank window planned for")
    ap.add_argument("--out-dir", default=HERE, help="where SHARDING.md and sharding.json go")
    a = ap.parse_args()
    CFG.update(device=a.device, width=a.width, budget=a.budget, per_rank=a.per_rank)
    torch.set_num_threads(1)
    results = []
    for world in (int(w) for w in a.worlds.split(",")):
        results.append(bench(world))
        print(json.dumps(results[-1])[:2000], file=sys.stderr, flush=True)
    with open(os.path.join(a.out_dir, "SHARDING.md"), "w") as f:
        f.write(report(results))
    with open(os.path.join(a.out_dir, "sharding.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
