#!/usr/bin/env python3
"""ranks_bench.py — plans for W ranks against `accumplan run` and `train_window` on W gloo processes, the machine loaded.

What it is: for models no test was tuned on (a wide MLP whose gradients outweigh a microbatch's
activations, torchvision's shufflenet_v2_x0_5 at 32x32, and on two ranks a 3.7M-parameter MLP at a
target batch of 1024), Adam, W = 2 and 4, the state sharded and not: `accumplan --model m.pt --world-size W` plans under one CPU budget, then `accumplan run`
trains the plan on W gloo processes under the same budget, --runs times, with one process spinning
on every core. The truth is each rank's steady windows (2 to 4) in its run statistics
(`window_series[].peak_bytes`), against the peak the plan predicts for that rank (its run statistics'
`predicted_peak_bytes`: a sharded plan's `sharding.per_rank_peak_bytes`); a run that ran out of
memory or failed is counted. The same from Python (PY_CASES: tests/bench/ranks_worker.py, a DDP module and a
ZeroRedundancyOptimizer among them, and the optimizer setups that break a naive share: a frozen layer
in the optimizer, a foreign parameter, amsgrad groups). The 3.7M-parameter MLP is also planned from
Python as the CLI runs it (setup "scripted": the same TorchScript module), and the two front ends'
plans of it are set side by side. It prints one row per case and, with --write, regenerates
tests/bench/RANKS.md:

    build/venv/bin/python tests/bench/ranks_bench.py [--runs 3] [--write]

What it is not: a unit test (tests/dist/test_dist_cli.cpp holds the rule on builtin:mlp).
"""
import argparse
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import time

import torch
import torchvision

MLP_3M_BUDGET = "80MiB"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = {  # name: (module, input spec, budget, target batch, world sizes)
    "wide_mlp": (lambda: torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256),
                                             torch.nn.ReLU(), torch.nn.Linear(256, 10)), "float32[B,256]", "12MiB", 64,
                 (2, 4)),
    # 8704KiB binds: 2 ranks need three microbatches, 4 ranks two (unsharded).
    "shufflenet": (lambda: torchvision.models.shufflenet_v2_x0_5(num_classes=10), "float32[B,3,32,32]", "8704KiB", 64,
                   (2, 4)),
    # 3,716,106 parameters: its model states, not its activations, fill most of the budget.
    "mlp_3m": (lambda: torch.nn.Sequential(torch.nn.Linear(784, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 1024),
                                           torch.nn.ReLU(), torch.nn.Linear(1024, 10)), "float32[B,784]", MLP_3M_BUDGET,
               1024, (2,)),
}
STEPS = 4


def input_shape(name):
    """A sample's shape from the model's input spec: "float32[B,3,32,32]" -> (3, 32, 32)."""
    return tuple(int(d) for d in MODELS[name][1].split("[")[1].rstrip("]").split(",")[1:])


def spin():
    while True:
        pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(binary, plan, model, budget, world, d, run):
    """Each rank's (exit code, stats or None) of one `accumplan run` on `world` gloo processes."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world),
               OMP_NUM_THREADS="1")
    stats = os.path.join(d, "stats-%d-{rank}.json" % run)
    target = json.load(open(plan))["target_batch"]
    argv = [binary, "run", "--plan", plan, "--model", model, "--steps", str(STEPS), "--synthetic-samples",
            str(target * STEPS), "--threads", "1", "--dist-timeout", "60", "--memory-budget", budget, "--stats", stats]
    procs = [subprocess.Popen(argv, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE) for r in range(world)]
    out = []
    for r, p in enumerate(procs):
        err = p.communicate(timeout=600)[1]
        path = stats.replace("{rank}", str(r))
        st = json.load(open(path)) if p.returncode == 0 and os.path.exists(path) else None
        out.append((p.returncode, st, err.decode(errors="replace").strip().splitlines()[-1:] if p.returncode else []))
    return out


def case(binary, name, d, world, shard, runs):
    make, spec, budget, target, _ = MODELS[name]
    model = os.path.join(d, name + ".pt")
    if not os.path.exists(model):
        torch.manual_seed(0)
        torch.jit.save(torch.jit.script(make()), model)
    plan = os.path.join(d, "%s-%d-%s.json" % (name, world, shard))
    t0 = time.monotonic()
    p = subprocess.run([binary, "--model", model, "--input", spec, "--target", "int64[B]:10", "--optimizer", "adam",
                        "--target-batch", str(target), "--world-size", str(world), "--shard", shard, "--memory-budget",
                        budget, "--device", "cpu", "--threads", "1", "--no-eval", "--out", plan],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return {"case": (name, world, shard), "error": p.stderr.strip().splitlines()[-1]}
    plan_s = time.monotonic() - t0
    doc = json.load(open(plan))
    measured = doc.get("sharding", {}).get("measured_rank", 0)
    misses = {"measured": [], "others": []}
    failed = []
    for run in range(runs):
        for r, (code, st, err) in enumerate(launch(binary, plan, model, budget, world, d, run)):
            if st is None or st["oom_recoveries"]:
                failed.append((run, r, code, err))
                continue
            for w in st["window_series"][1:]:
                miss = (w["peak_bytes"] - st["predicted_peak_bytes"]) / st["predicted_peak_bytes"]
                misses["measured" if r == measured else "others"].append(miss)
    return {"case": (name, world, shard), "sizes": doc["microbatch_sizes"], "predicted": doc["memory"]["predicted_peak_bytes"],
            "budget": budget, "plan_seconds": plan_s, "runs": runs, "failed": failed,
            "measured": [min(misses["measured"], default=0), max(misses["measured"], default=0)],
            "others": [min(misses["others"], default=0), max(misses["others"], default=0)] if misses["others"] else None}


# A DDP module's buckets hold another copy of the gradients.
PY_BUDGETS = {"wide_mlp": "14MiB", "shufflenet": "10MiB", "mlp_3m": MLP_3M_BUDGET}
PY_CASES = [(name, world, way, "plain") for name in MODELS for world in MODELS[name][4] for way in ("whole", "zero", "ddp")] + \
    [("wide_mlp", 2, "zero", setup) for setup in ("frozen", "foreign", "amsgrad")] + \
    [("mlp_3m", 2, way, "scripted") for way in ("whole", "zero")]
# The front ends side by side: (the CLI's case, Python's case of the same TorchScript module).
SAME_MODULE = [(("mlp_3m", 2, "off"), ("mlp_3m", 2, "whole", "scripted")),
               (("mlp_3m", 2, "optimizer"), ("mlp_3m", 2, "zero", "scripted"))]


def launch_python(d, world, args, timeout=600):
    """Each rank's (exit code, last line of its log) of ranks_worker.py with these arguments on `world` gloo processes."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world),
               OMP_NUM_THREADS="1")
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ranks_worker.py")
    procs = [subprocess.Popen([sys.executable, worker, d] + [str(a) for a in args], cwd=os.path.dirname(worker),
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE) for r in range(world)]
    out = []
    for p in procs:
        err = p.communicate(timeout=timeout)[1]
        out.append((p.returncode, err.decode(errors="replace").strip().splitlines()[-1:] if p.returncode else []))
    return out


def python_case(d, name, world, way, setup, runs):
    """accumplan.plan in every rank, then `runs` runs of train_window on the ranks (ranks_worker.py)."""
    out = tempfile.mkdtemp(dir=d)
    budget = PY_BUDGETS[name]
    args = [name, way, setup, budget, MODELS[name][3], STEPS]
    planned = launch_python(out, world, args + ["plan"])
    if any(code for code, _ in planned):
        return {"case": (name, world, way, setup), "error": next(err for code, err in planned if code)}
    doc = json.load(open(os.path.join(out, "plan.json")))
    misses, failed = {"measured": [], "others": []}, []
    for run in range(runs):
        for r, (code, err) in enumerate(launch_python(out, world, args + ["train", run])):
            path = os.path.join(out, "rank%d-%d.json" % (r, run))
            rec = json.load(open(path)) if code == 0 and os.path.exists(path) else None
            if rec is None or any(w["oom"] for w in rec["windows"]) or any(w["peak"] > parse_budget(budget)
                                                                            for w in rec["windows"]):
                failed.append((run, r, code, err))
                continue
            for w in rec["windows"][1:]:
                miss = (w["peak"] - w["predicted"]) / w["predicted"]
                misses["measured" if r == rec["measured_rank"] else "others"].append(miss)
    return {"case": (name, world, way, setup), "sizes": doc["microbatch_sizes"],
            "predicted": doc["memory"]["predicted_peak_bytes"], "budget": budget, "runs": runs, "failed": failed,
            "measured": [min(misses["measured"], default=0), max(misses["measured"], default=0)],
            "others": [min(misses["others"]), max(misses["others"])] if misses["others"] else None}


def parse_budget(text):
    return int(text[:-3]) * {"KiB": 1024, "MiB": 1024 * 1024}[text[-3:]]  # "14MiB", "8704KiB"


def row(c):
    """One table row: the case's key columns, then budget, plan, predicted peak, the ranks' misses, the failures."""
    keys = "".join(" %s |" % k for k in c["case"])
    if "error" in c:
        return "|%s planning refused: %s ||||||" % (keys, c["error"])
    pct = lambda lo_hi: "%+.3f%% to %+.3f%%" % (100 * lo_hi[0], 100 * lo_hi[1])  # noqa: E731
    return "|%s %s | %s | %s | %s | %s | %d of %d |" % (
        keys, c["budget"], c["sizes"], c["predicted"], pct(c["measured"]), pct(c["others"]) if c["others"] else "-",
        len(c["failed"]), c["runs"] * c["case"][1])


def side_by_side(results):
    """The front ends' plans of one TorchScript module, one row per SAME_MODULE pair."""
    lines = ["| model | W | --shard / way | CLI plan | Python plan | CLI predicted peak | Python predicted peak | "
             "difference |", "|---|---|---|---|---|---|---|---|"]
    for cli, py in SAME_MODULE:
        a, b = results.get(cli, {}), results.get(py, {})
        if "predicted" not in a or "predicted" not in b:
            lines.append("| %s | %d | %s / %s | planning refused ||||||" % (cli[0], cli[1], cli[2], py[2]))
            continue
        lines.append("| %s | %d | %s / %s | %s | %s | %d | %d | %+.2f%% |" % (
            cli[0], cli[1], cli[2], py[2], a["sizes"], b["sizes"], a["predicted"], b["predicted"],
            100 * (b["predicted"] - a["predicted"]) / a["predicted"]))
    return lines


def run_all(binary, runs):
    """Every case's result, keyed by its case tuple, CLI cases first; each row printed as it ends."""
    results = {}
    with tempfile.TemporaryDirectory() as d:
        for name in MODELS:
            for world in MODELS[name][4]:
                for shard in ("off", "optimizer"):
                    results[(name, world, shard)] = case(binary, name, d, world, shard, runs)
                    print(row(results[(name, world, shard)]), file=sys.stderr, flush=True)
        for name, world, way, setup in PY_CASES:
            results[(name, world, way, setup)] = python_case(d, name, world, way, setup, runs)
            print(row(results[(name, world, way, setup)]), file=sys.stderr, flush=True)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "accumplan"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--write", action="store_true", help="regenerate tests/bench/RANKS.md")
    a = ap.parse_args()
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(os.cpu_count() or 1)]
    for s in spinners:
        s.start()
    try:
        results = run_all(a.binary, a.runs)
    finally:
        for s in spinners:
            s.terminate()
    rows = [row(c) for k, c in results.items() if len(k) == 3]
    py_rows = [row(c) for k, c in results.items() if len(k) == 4]
    columns = "budget | plan | predicted peak | measured rank's steady windows | other ranks' | rank runs out of memory or failed |"
    table = ["| model | W | --shard | " + columns, "|---|---|---|---|---|---|---|---|---|"] + rows
    py_table = ["| model | W | way | optimizer setup | " + columns, "|---|---|---|---|---|---|---|---|---|---|"] + py_rows
    text = ("# Plans for W ranks against `accumplan run` and `train_window` on W gloo ranks, the machine loaded\n\n"
            "`python tests/bench/ranks_bench.py --runs %d --write` (Adam, target batch %s, %d windows a run, one process "
            "spinning on each of the %d cores). Each rank's steady windows (2 to %d) against the peak the plan predicts for "
            "that rank (a sharded plan's `sharding.per_rank_peak_bytes`; the column shows the largest).\n\n"
            % (a.runs, ", ".join("%d (%s)" % (m[3], n) for n, m in MODELS.items()), STEPS, os.cpu_count() or 1, STEPS)
            ) + "\n".join(table) + "\n"
    text += ("\n## From Python\n\n`accumplan.plan` of the module as it trains (a plain module, a DDP one, or AdamW in a "
             "ZeroRedundancyOptimizer; frozen: a frozen layer in the optimizer, foreign: a parameter the model does not "
             "hold, amsgrad: two groups, one with amsgrad; scripted: the TorchScript module the CLI runs) in every rank, "
             "then `train_window` on the ranks (tests/bench/ranks_worker.py). The truth is the cpu-counting probe "
             "installed before the model exists, so it counts what the process allocates, a DDP reducer's buckets "
             "included, and none of accumplan's figures; a window over the budget counts as failed.\n\n"
             ) + "\n".join(py_table) + "\n"
    text += ("\n## The two front ends, one module\n\nThe CLI's plan of the exported module against `accumplan.plan` "
             "of the same TorchScript module in Python, from the rows above. The `plain` rows of mlp_3m plan "
             "the eager module, which keeps fewer activations than TorchScript's executor keeps for its export, so "
             "their plans differ from the CLI's: each front end plans the module it runs.\n\n") + "\n".join(side_by_side(results)) + "\n"
    print(text)
    if a.write:
        with open(os.path.join(ROOT, "tests", "bench", "RANKS.md"), "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
