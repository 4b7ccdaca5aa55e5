#!/usr/bin/env python3
"""heterogeneous_bench.py — ranks that differ: the per-rank plan against the uniform plan the smaller rank allows.

What it is: two gloo ranks on the CPU with different budgets (24 MiB and 64 MiB, enforced by the
counting allocator) and different speeds: each rank one LibTorch thread on a core of its own
(taskset), rank 0's core shared with a process that spins throughout (a shared card: less memory
and less speed). The model is one no test was tuned on (a gated MLP over 32 positions, written
here), AdamW. Each rank plans on its own "device" (`accumplan --memory-budget M --world-size 2` on
its core, the spinner running: its own measurements, confirmations included); `accumplan plan --profile r0.json --profile r1.json --memory-budget 24MiB,64MiB` combines
them into the per-rank plan. The uniform plan is rank 0's own (every rank at the smaller rank's
microbatch and share: what the trainers users run today do). Both are trained by `accumplan run` on
the two ranks, alternately, --pairs times; the truth is each rank's run statistics (window seconds,
steady peaks), which share no code with the planner's prediction. With --write it regenerates
tests/bench/HETEROGENEOUS.md:

    python3 tests/bench/heterogeneous_bench.py [--pairs 3] [--write]

What it is not: the exactness check (tests/dist/test_dist_executor.cpp, "2 ranks that differ":
the update against one process training each whole window, float64, both losses).
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("ACCUMPLAN_BIN", os.path.join(ROOT, "build", "accumplan"))
BUDGETS = ("24MiB", "64MiB")
CORES = ("0", "1")  # rank r's core; a spinner shares rank 0's
TARGET = 256
SPEC = ["--input", "float32[B,32,128]", "--target", "int64[B]:16", "--optimizer", "adamw", "--device", "cpu",
        "--world-size", "2", "--target-batch", str(TARGET), "--progress", "none"]
MODEL = '''
import sys, torch, torch.nn as nn
class Gated(nn.Module):
    def __init__(self, d=128, h=512, c=16):
        super().__init__()
        self.inp = nn.Linear(d, h)
        self.gate = nn.Linear(h, 2 * h)
        self.norm = nn.LayerNorm(h)
        self.mix = nn.Linear(h, h)
        self.head = nn.Linear(h, c)
    def forward(self, x):
        z = torch.tanh(self.inp(x))
        a, b = self.gate(z).chunk(2, dim=-1)
        z = self.norm(z + self.mix(a * torch.sigmoid(b)))
        return self.head(torch.relu(z).mean(dim=1))
torch.manual_seed(7)
torch.jit.script(Gated()).save(sys.argv[1])
'''


def say(*a):
    print(*a, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_python():
    """The interpreter whose torch wrote the build (scripts/torch-env.sh), for the model file."""
    out = subprocess.run(["bash", "-c", ". scripts/torch-env.sh && torch_env_python"], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def run_ranks(plan, model, steps, tag, work):
    """`accumplan run` of `plan` on two gloo ranks (rank r: one thread on CORES[r], BUDGETS[r] enforced);
    returns each rank's run statistics."""
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    procs = []
    for r in (0, 1):
        cmd = ["taskset", "-c", CORES[r], BIN, "run", "--plan", plan, "--model", model, "--threads", "1", "--memory-budget",
               ",".join(BUDGETS), "--steps", str(steps), "--progress", "none",
               "--stats", os.path.join(work, tag + "-r{rank}.json")]
        procs.append(subprocess.Popen(cmd, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=600)
        if p.returncode != 0:
            raise SystemExit("accumplan run failed:\n" + err)
    return [json.load(open(os.path.join(work, "%s-r%d.json" % (tag, r)))) for r in (0, 1)]


def steady_seconds(stats):
    """The median window seconds after the first (which allocates the optimizer state)."""
    return statistics.median(w["seconds"] for w in stats[0]["window_series"][1:])


def plan_ranks(model, work):
    """Each rank's own plan on its own budget and threads, then the per-rank plan from both."""
    own = []
    for r in (0, 1):
        out = os.path.join(work, "r%d.json" % r)
        subprocess.run(["taskset", "-c", CORES[r], BIN, "--model", model, *SPEC, "--threads", "1", "--memory-budget", BUDGETS[r],
                        "--out", out], check=True, stderr=subprocess.DEVNULL)
        own.append(out)
    het = os.path.join(work, "het.json")
    subprocess.run([BIN, "plan", "--profile", own[0], "--profile", own[1], "--world-size", "2", "--target-batch",
                    str(TARGET), "--memory-budget", ",".join(BUDGETS), "--out", het], check=True,
                   stderr=subprocess.DEVNULL)
    return het, own[0]


def peak_rows(name, stats):
    rows = []
    for r, s in enumerate(stats):
        steady = [w["peak_bytes"] for w in s["window_series"][1:]]
        pred = s["predicted_peak_bytes"]
        rows.append("| %s | %d | %s | %s | %s | %d | %+.3f%% to %+.3f%% | %s |" % (
            name, r, BUDGETS[r], CORES[r] + (" (shared)" if r == 0 else ""), s["microbatch_sizes"], pred, 100 * (min(steady) / pred - 1),
            100 * (max(steady) / pred - 1), "yes" if max(steady) <= s["budget_bytes"] else "NO"))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=3, help="alternating runs of each plan")
    ap.add_argument("--steps", type=int, default=8, help="windows per run")
    ap.add_argument("--write", action="store_true", help="regenerate tests/bench/HETEROGENEOUS.md")
    args = ap.parse_args()
    t0 = time.time()
    with tempfile.TemporaryDirectory() as work:
        model, script = os.path.join(work, "gated.pt"), os.path.join(work, "gated.py")
        with open(script, "w") as f:
            f.write(MODEL)  # from a file: torch.jit.script reads the class's source
        subprocess.run([torch_python(), script, model], check=True)
        spinner = subprocess.Popen(["taskset", "-c", CORES[0], sys.executable, "-c", "while True: pass"])
        try:
            het, uniform, seconds, last = measure(model, work, args)
        finally:
            spinner.kill()
        plans = {n: json.load(open(p)) for n, p in (("per-rank", het), ("uniform", uniform))}
    write_results(args, plans, seconds, last, time.time() - t0)


def measure(model, work, args):
    """Both plans, then each trained alternately --pairs times: (paths, seconds per pair, last stats)."""
    het, uniform = plan_ranks(model, work)
    seconds = {"per-rank": [], "uniform": []}
    last = {}
    for i in range(args.pairs):
        for name, path in (("per-rank", het), ("uniform", uniform)):
            last[name] = run_ranks(path, model, args.steps, "%s-%d" % (name, i), work)
            seconds[name].append(steady_seconds(last[name]))
            say("pair %d %s: %.4f s a window" % (i + 1, name, seconds[name][-1]))
    return het, uniform, seconds, last


def plan_rows(plans):
    rows = ["| plan | rank 0 | rank 1 | predicted window |", "|---|---|---|---|"]
    for name, p in plans.items():
        ranks = p.get("ranks") or [{"per_rank_batch": p["per_rank_batch"], "microbatch_sizes": p["microbatch_sizes"]}] * 2
        rows.append("| %s | %d as %s | %d as %s | %s |" % (
            name, ranks[0]["per_rank_batch"], ranks[0]["microbatch_sizes"], ranks[1]["per_rank_batch"],
            ranks[1]["microbatch_sizes"], "%.1f ms" % (1e3 * p["timing"]["window_seconds"]) if p.get("timing") else "-"))
    return rows


def write_results(args, plans, seconds, last, elapsed):
    ratios = [u / h for u, h in zip(seconds["uniform"], seconds["per-rank"])]
    lines = ["# Ranks that differ: a microbatch and a share per rank, against the uniform plan", "",
             "Generated by `python3 tests/bench/heterogeneous_bench.py --pairs %d --write` (%d windows a run, %.0f s). "
             "Two gloo ranks on a 2-core CPU, one LibTorch thread each on a core of its own: rank 0 with %s, its core "
             "shared with a process spinning throughout (a shared card: less memory, less speed), rank 1 with %s. "
             "Model: a gated MLP over 32 positions of 128 features (d=128, h=512, 16 classes), AdamW, target batch %d. "
             "Each rank planned on its own core and budget (`accumplan --memory-budget M --world-size 2`); the "
             "per-rank plan is `accumplan plan --profile r0.json --profile r1.json --memory-budget %s`; the uniform "
             "plan is rank 0's own: every rank at the smaller rank's microbatch and an equal share, what the trainers "
             "users run do." % (args.pairs, args.steps, elapsed, BUDGETS[0], BUDGETS[1], TARGET, ",".join(BUDGETS)), ""]
    lines += plan_rows(plans)
    lines += ["", "Window seconds (median of windows 2 to %d of each run; rank 0's run statistics), run alternately:"
              % args.steps, "", "| pair | per-rank | uniform | uniform / per-rank |", "|---|---|---|---|"]
    for i, r in enumerate(ratios):
        lines.append("| %d | %.4f | %.4f | %.3fx |" % (i + 1, seconds["per-rank"][i], seconds["uniform"][i], r))
    lines += ["", "Median ratio: **%.3fx**." % statistics.median(ratios), "",
              "Each rank's steady peaks (windows 2 to %d of the last run) against the peak its plan predicts for it:"
              % args.steps, "", "| plan | rank | budget | core | microbatches | predicted peak | measured | under budget |",
              "|---|---|---|---|---|---|---|---|"]
    lines += peak_rows("per-rank", last["per-rank"]) + peak_rows("uniform", last["uniform"])
    lines += ["", "The update of a plan whose ranks differ against one process training each whole window: "
              "tests/dist/test_dist_executor.cpp (\"2 ranks that differ\", float64, per-sample and per-token losses)."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        with open(os.path.join(ROOT, "tests", "bench", "HETEROGENEOUS.md"), "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
