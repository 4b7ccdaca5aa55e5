#!/usr/bin/env python3
"""unseen_model.py — the CLI and the Python API on a model no test or benchmark was tuned on.

What it is: torchvision's shufflenet_v2_x0_5 (64x64 inputs, 10 classes, Adam) under one CPU budget:
  1. `accumplan --model m.pt` plans it from its TorchScript export (the C++ executor's windows);
  2. `accumplan run` trains that plan for 3 windows under the same budget; the truth is the run's
     measured peak (`measured_peak_bytes` in its stats), against the plan's predicted peak;
  3. `accumplan.plan` plans the unscripted module, same budget, optimizer and target; its
     microbatch and predicted peak against the CLI's.
It prints one line per figure and a JSON record (--out). No assertion: a check whose figures a
note quotes, run by hand with the torch environment's interpreter after a build:

    build/venv/bin/python tests/bench/unseen_model.py [--binary build/accumplan] [--budget 96MiB]

What it is not: a unit test, nor a GPU benchmark.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

import torch
import torchvision

import accumplan

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cli(binary, args):
    t0 = time.monotonic()
    p = subprocess.run([binary] + args, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("accumplan %s exited %d:\n%s" % (" ".join(args), p.returncode, p.stderr))
    return time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "accumplan"))
    ap.add_argument("--budget", default="96MiB")
    ap.add_argument("--target", type=int, default=128)
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    model = torchvision.models.shufflenet_v2_x0_5(num_classes=10)
    n = 3 * a.target
    x, y = torch.randn(n, 3, 64, 64), torch.randint(0, 10, (n,))
    common = ["--target-batch", str(a.target), "--device", "cpu", "--memory-budget", a.budget, "--threads", "2"]
    with tempfile.TemporaryDirectory() as d:
        m, data, plan_path, stats_path = (os.path.join(d, f) for f in ("m.pt", "data.pt", "plan.json", "stats.json"))
        torch.jit.save(torch.jit.script(model), m)
        torch.save([x, y], data)
        plan_s = cli(a.binary, ["--model", m, "--input", "float32[B,3,64,64]", "--target", "int64[B]:10",
                                "--optimizer", "adam", "--out", plan_path] + common)
        run_s = cli(a.binary, ["run", "--plan", plan_path, "--model", m, "--data", data, "--memory-budget", a.budget,
                               "--threads", "2", "--stats", stats_path])
        with open(plan_path) as f:
            cli_plan = json.load(f)
        with open(stats_path) as f:
            stats = json.load(f)
    predicted, measured = cli_plan["memory"]["predicted_peak_bytes"], stats["measured_peak_bytes"]
    t0 = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # BatchNorm, warned about once
        py = accumplan.plan(model, (x[:8],), y[:8], target_batch=a.target, memory_budget=a.budget,
                            optimizer=torch.optim.Adam(model.parameters(), lr=1e-3), progress=False)
    py_s = time.monotonic() - t0
    py_pred = py.memory["predicted_peak_bytes"]
    fig = {
        "torch": torch.__version__, "model": "shufflenet_v2_x0_5 64x64", "budget": a.budget, "target": a.target,
        "cli": {"microbatch_sizes": cli_plan["microbatch_sizes"], "predicted_peak_bytes": predicted,
                "plan_seconds": round(plan_s, 1)},
        "run": {"measured_peak_bytes": measured, "oom_recoveries": stats["oom_recoveries"], "seconds": round(run_s, 1),
                "error": (predicted - measured) / measured},
        "python": {"microbatch_sizes": py.microbatch_sizes, "predicted_peak_bytes": py_pred, "seconds": round(py_s, 1),
                   "micro_batch_vs_cli": py.micro_batch / cli_plan["micro_batch"] - 1,
                   "predicted_vs_cli": py_pred / predicted - 1},
    }
    print("torch %s, %s, budget %s, target %d" % (fig["torch"], fig["model"], a.budget, a.target))
    print("CLI plan:    %s, predicted peak %d B (%.1f s)" % (cli_plan["microbatch_sizes"], predicted, plan_s))
    print("accumplan run: measured peak %d B, %+.3f%% from the prediction, %d OOM recoveries (%.1f s)"
          % (measured, 100 * fig["run"]["error"], stats["oom_recoveries"], run_s))
    print("accumplan.plan: %s, predicted peak %d B: microbatch %+.2f%%, predicted peak %+.2f%% against the CLI (%.1f s)"
          % (py.microbatch_sizes, py_pred, 100 * fig["python"]["micro_batch_vs_cli"],
             100 * fig["python"]["predicted_vs_cli"], py_s))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(fig, f, indent=2)


if __name__ == "__main__":
    main()
