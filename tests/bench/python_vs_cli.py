#!/usr/bin/env python3
"""python_vs_cli.py — accumplan.plan on unscripted nn.Modules against the CLI on their TorchScript
exports, and each Python plan against a real train_window run of it.

What it is: for torchvision resnet18 and mobilenet_v3_small at 64x64 and a GPT-style decoder
(written here), under one CPU budget, optimizer and target per model:
  1. `accumplan --model <traced>.pt ...` (the CLI's main job: the C++ executor's windows);
  2. `accumplan.plan(model, ...)` on the same module, unscripted (train_window's windows);
  3. the Python plan trained for 3 windows by `accumplan.train_window` under the same budget
     (the cpu-counting probe installed with it, as a GPU enforces its capacity), its steady-state
     peak (windows 2 and 3) read by that probe plus the weights the model held before it.
Where the CLI and Python disagree, the cause is looked for outside accumplan: one forward, loss
sum and backward of the module and of its TorchScript export in plain PyTorch (no accumplan step),
at the CLI's microbatch, their peaks read by the counting probe; and the export itself is planned
from Python (accumplan.plan takes any nn.Module, a ScriptModule too), so that both tools measure
the same program. It prints Markdown tables and writes them with the figures to
tests/bench/PYTHON.md and python_vs_cli.json. The truth for a prediction is the training run, not
the planning windows.
What it is not: a unit test (no assertion; ~10 minutes on 2 cores), nor a GPU benchmark.

Run: build/venv/bin/python tests/bench/python_vs_cli.py [--binary build/accumplan] [--only NAME]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn

import accumplan
from accumplan import _probes

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


class Decoder(nn.Module):
    """A GPT-style decoder: token and position embeddings, pre-norm causal self-attention blocks,
    a tied-free output head over the vocabulary."""

    def __init__(self, vocab=2000, d=128, layers=4, heads=4, seq=64):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True,
                                                               norm_first=True) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1))

    def forward(self, ids):
        t = ids.shape[1]
        h = self.tok(ids) + self.pos[:t]
        for b in self.blocks:
            h = b(h, src_mask=self.mask[:t, :t])
        return self.head(self.norm(h))


def models():
    import torchvision
    g = torch.Generator().manual_seed(0)
    img = torch.randn(16, 3, 64, 64, generator=g)
    cls = torch.randint(0, 1000, (16,), generator=g)
    ids = torch.randint(0, 2000, (16, 64), generator=g)
    return [
        ("resnet18", lambda: torchvision.models.resnet18(), img, cls, "momentum", "256MiB", 256,
         ["--input", "float32[B,3,64,64]", "--target", "int64[B]:1000"]),
        ("mobilenet_v3_small", lambda: torchvision.models.mobilenet_v3_small(), img, cls, "momentum", "96MiB", 256,
         ["--input", "float32[B,3,64,64]", "--target", "int64[B]:1000"]),
        ("gpt_decoder", lambda: Decoder(), ids, ids.roll(-1, 1), "adam", "160MiB", 256,
         ["--input", "int64[B,64]:2000", "--target", "int64[B,64]:2000"]),
    ]


READING = """Reading it: both tools run the same search (accumplan/search.h) on different executors, the
CLI on the TorchScript export, Python on the module as it is. Where the two programs need the same
memory (the second table: resnet18 and mobilenet_v3_small, equal to the byte), the plans are the
same size after the same number of real windows. The decoder's TorchScript export needs 25% more
memory than the module in plain PyTorch, outside any accumplan code, and the same memory as the
module when the graph executor's optimizations are off (last column: LibTorch's default, which
`accumplan` and `accumplan run` use, keeps more tensors for backward in its optimized graph). So
each tool plans what its program fits: 37 samples for the module, 32 for the export; planned from
Python, the export gets the CLI's 32 after the same 6 windows. Each Python plan's predicted peak equals the steady-state
peak of 3 windows of train_window training that plan under the same budget, to the byte here
(these runs are deterministic on the CPU), with no out-of-memory."""


def optimizer_of(name, model):
    if name == "momentum":
        return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return torch.optim.Adam(model.parameters(), lr=1e-3)


def cli_plan(binary, name, make, x, optimizer, budget, target, specs, work):
    torch.manual_seed(0)
    model = make().train()
    path = os.path.join(work, name + ".pt")
    torch.jit.trace(model, x[:2], check_trace=False).save(path)
    out = os.path.join(work, name + ".cli.json")
    t0 = time.perf_counter()
    subprocess.run([binary, "--model", path, "--target-batch", str(target), "--memory-budget", budget, "--device",
                    "cpu", "--optimizer", optimizer, "--out", out, "--progress", "none"] + specs,
                   check=True, stderr=subprocess.DEVNULL)
    return accumplan.load_plan(out), time.perf_counter() - t0, path


def python_plan(make, x, y, optimizer, budget, target):
    torch.manual_seed(0)
    model = make().train()
    opt = optimizer_of(optimizer, model)
    t0 = time.perf_counter()
    plan = accumplan.plan(model, (x,), y, target_batch=target, optimizer=opt, memory_budget=budget, progress=False)
    return plan, time.perf_counter() - t0, model, opt


def train_peak(plan, model, opt, x, y, budget_bytes, windows=3):
    """The steady-state peak of `windows` train_window calls of the plan under the budget."""
    n = plan.per_rank_batch
    idx = torch.arange(n) % x.shape[0]
    X, Y = x.index_select(0, idx), y.index_select(0, idx)  # the data set, outside the budget
    held = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    held += sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
                if isinstance(v, torch.Tensor))
    probe = _probes.CpuCountingProbe(budget_bytes - held)
    recoveries, peaks = 0, []
    try:
        for w in range(windows):
            probe.reset_peak()
            st = accumplan.train_window(plan, model, opt, (X,), Y, loss="cross_entropy")
            recoveries += st.oom_recoveries
            peaks.append(probe.peak_bytes() + held)
    finally:
        probe.close()
    return max(peaks[1:]), peaks, recoveries


def plain_peak(module, params, x, y, b, repeats=3):
    """The peak bytes above what was held before, of one forward + cross-entropy sum + backward at
    b samples in plain PyTorch (the third of `repeats`, gradients dropped between)."""
    idx = torch.arange(b) % x.shape[0]
    X, Y = x.index_select(0, idx), y.index_select(0, idx)
    probe = _probes.CpuCountingProbe()
    try:
        for _ in range(repeats):
            probe.reset_peak()
            base = probe.current_bytes()
            out = module(X)
            loss = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), Y.reshape(-1), reduction="sum")
            loss.backward()
            for p in params:
                p.grad = None
            del out, loss
            peak = probe.peak_bytes() - base
    finally:
        probe.close()
    return peak


def row(name, cli, cli_s, py, py_s, model, opt, x, y, optimizer, budget, target):
    steady, peaks, recoveries = train_peak(py, model, opt, x, y, py.memory["budget_bytes"])
    pred = py.memory["predicted_peak_bytes"]
    return {
        "model": name, "optimizer": optimizer, "budget": budget, "target_batch": target,
        "cli_micro_batch": cli.micro_batch, "python_micro_batch": py.micro_batch,
        "cli_windows": len(cli.profile["trials"]), "python_windows": len(py.profile["trials"]),
        "cli_seconds": round(cli_s, 1), "python_seconds": round(py_s, 1),
        "python_predicted_peak_bytes": pred, "train_steady_peak_bytes": steady,
        "train_window_peaks_bytes": peaks, "train_oom_recoveries": recoveries,
        "prediction_error": (pred - steady) / steady,
        "cli_predicted_peak_bytes": cli.memory["predicted_peak_bytes"],
        "python_sizes": py.microbatch_sizes, "cli_sizes": cli.microbatch_sizes,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "accumplan"))
    ap.add_argument("--only", default=None)
    ap.add_argument("--out", default=HERE)
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    rows, plain = [], []
    with tempfile.TemporaryDirectory() as work:
        for name, make, x, y, optimizer, budget, target, specs in models():
            if args.only and name != args.only:
                continue
            print("%s: CLI ..." % name, file=sys.stderr, flush=True)
            cli, cli_s, exported = cli_plan(args.binary, name, make, x, optimizer, budget, target, specs, work)
            print("%s: accumplan.plan and 3 windows of train_window ..." % name, file=sys.stderr, flush=True)
            py, py_s, model, opt = python_plan(make, x, y, optimizer, budget, target)
            rows.append(row(name, cli, cli_s, py, py_s, model, opt, x, y, optimizer, budget, target))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            torch.manual_seed(0)
            eager = make().train()
            traced = torch.jit.load(exported)
            traced.train()
            b = cli.micro_batch
            optimized = plain_peak(traced, list(traced.parameters()), x, y, b)
            # The export without the graph executor's optimizations, loaded afresh: a module's
            # executor keeps what it ran first, so each setting gets its own copy.
            traced = torch.jit.load(exported)
            traced.train()
            with torch.jit.optimized_execution(False):
                unoptimized = plain_peak(traced, list(traced.parameters()), x, y, b)
            plain.append({"model": name, "micro_batch": b,
                          "eager_peak_bytes": plain_peak(eager, list(eager.parameters()), x, y, b),
                          "torchscript_peak_bytes": optimized, "torchscript_unoptimized_peak_bytes": unoptimized})
            print(json.dumps(plain[-1]), file=sys.stderr, flush=True)
            gap = plain[-1]["torchscript_peak_bytes"] / plain[-1]["eager_peak_bytes"] - 1
            if abs(gap) > 0.02:
                # The two tools ran different programs: plan the export from Python too.
                print("%s: accumplan.plan on the TorchScript export ..." % name, file=sys.stderr, flush=True)
                py, py_s, model, opt = python_plan(lambda: torch.jit.load(exported), x, y, optimizer, budget, target)
                rows.append(row(name + " (TorchScript export, from Python)", cli, cli_s, py, py_s, model, opt, x, y,
                                optimizer, budget, target))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    lines = ["| model | optimizer, budget, target | largest microbatch CLI / Python | real windows CLI / Python "
             "| Python predicted peak | train_window steady peak (3 windows) | predicted vs measured | OOM in training |",
             "|---|---|---|---|---|---|---|---|"]
    mib = 1024.0 * 1024.0
    for r in rows:
        lines.append("| %s | %s, %s, %d | %d / %d | %d / %d | %.1f MiB | %.1f MiB | %+.2f%% | %d |" % (
            r["model"], r["optimizer"], r["budget"], r["target_batch"], r["cli_micro_batch"], r["python_micro_batch"],
            r["cli_windows"], r["python_windows"], r["python_predicted_peak_bytes"] / mib,
            r["train_steady_peak_bytes"] / mib, 100 * r["prediction_error"], r["train_oom_recoveries"]))
    lines += ["", "One forward, loss sum and backward in plain PyTorch (no accumplan code in the step), at the CLI's "
              "microbatch; peak above what was held before:", "",
              "| model | microbatch | eager nn.Module | its TorchScript export (the CLI's model) | export / eager "
              "| the export under torch.jit.optimized_execution(False) |",
              "|---|---|---|---|---|---|"]
    for r in plain:
        lines.append("| %s | %d | %.1f MiB | %.1f MiB | %+.1f%% | %.1f MiB |" % (
            r["model"], r["micro_batch"], r["eager_peak_bytes"] / mib, r["torchscript_peak_bytes"] / mib,
            100 * (r["torchscript_peak_bytes"] / r["eager_peak_bytes"] - 1),
            r["torchscript_unoptimized_peak_bytes"] / mib))
    table = "\n".join(lines)
    print(table)
    if not args.only:
        with open(os.path.join(args.out, "python_vs_cli.json"), "w") as f:
            json.dump({"torch": torch.__version__, "rows": rows, "plain_pytorch": plain}, f, indent=2)
        with open(os.path.join(args.out, "PYTHON.md"), "w") as f:
            f.write("# accumplan.plan (Python, unscripted module) against the CLI (TorchScript export)\n\n"
                    "Written by `tests/bench/python_vs_cli.py` (torch %s, CPU, counting allocator; %s).\n\n%s\n\n%s\n"
                    % (torch.__version__, time.strftime("%Y-%m-%d"), table, READING))


if __name__ == "__main__":
    main()
