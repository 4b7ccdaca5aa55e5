#!/usr/bin/env python3
"""python_device_check.py — accumplan.plan on a device, judged by a real train_window run of its plan.

What it is: the Python API's step of scripts/gpu-check.sh. It plans a small BatchNorm conv net
(written here: nothing to download) with `accumplan.plan(..., device=DEVICE)` under a budget, then
trains 3 windows of the plan with `accumplan.train_window` under the same budget and compares the
plan's predicted peak with the steady-state peak (windows 2 and 3) of that run: on CUDA the
caching allocator's reserved and allocated peaks (torch.cuda, the budget as the memory fraction),
on the CPU the counting probe (accumplan._probes) plus the weights held before it. It also checks
that planning left the parameters unchanged and that no budget stays set. Then it evaluates one
planned eval microbatch (plan.eval) with plan.evaluate after those windows, the optimizer state
resident, under the same budget, and compares its peak with plan.eval's prediction.
Writes one JSON file
and prints one Markdown table. Exit 1 when a check fails.
What it is not: a unit test, nor the CLI benchmark (gpu_bench.py).

Run: python tests/bench/python_device_check.py --device cuda --out-json python-plan.json
     (--device cpu rehearses it with small sizes)
"""
import argparse
import json
import sys
import time

import torch
import torch.nn as nn

import accumplan


def net(classes=100):
    def block(i, o):
        return nn.Sequential(nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU())
    return nn.Sequential(block(3, 32), block(32, 64), nn.MaxPool2d(2), block(64, 128), nn.MaxPool2d(2),
                         block(128, 128), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, classes))


def steady_peak(plan, model, opt, x, y, device, budget_bytes, windows=3):
    n = plan.per_rank_batch
    idx = torch.arange(n) % x.shape[0]
    X, Y = x.index_select(0, idx), y.index_select(0, idx)  # on the host, as a data set
    peaks, recoveries = [], 0
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget_bytes / total), device)
        try:
            for w in range(windows):
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
                recoveries += accumplan.train_window(plan, model, opt, (X,), Y).oom_recoveries
                torch.cuda.synchronize(device)
                peaks.append(max(torch.cuda.max_memory_reserved(device), torch.cuda.max_memory_allocated(device)))
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0, device)
    else:
        from accumplan import _probes
        held = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
        held += sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
        probe = _probes.CpuCountingProbe(budget_bytes - held)
        try:
            for w in range(windows):
                probe.reset_peak()
                recoveries += accumplan.train_window(plan, model, opt, (X,), Y).oom_recoveries
                peaks.append(probe.peak_bytes() + held)
        finally:
            probe.close()
    return max(peaks[1:]), peaks, recoveries


def eval_peak(plan, model, opt, x, y, device, budget_bytes):
    """plan.evaluate of one eval microbatch (plan.eval) after training, the optimizer state resident
    and the gradients freed, under the same budget: (its peak, OOM re-splits), read as steady_peak
    reads training's."""
    m = plan.eval["micro_batch"]
    idx = torch.arange(m) % x.shape[0]
    X, Y = x.index_select(0, idx), y.index_select(0, idx)
    opt.zero_grad(set_to_none=True)
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget_bytes / total), device)
        try:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            st = plan.evaluate(model, (X,), Y)
            torch.cuda.synchronize(device)
            return max(torch.cuda.max_memory_reserved(device), torch.cuda.max_memory_allocated(device)), st.oom_recoveries
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0, device)
    st = plan.evaluate(model, (X,), Y, measure_memory=True, optimizer=opt)
    return st.peak_bytes, st.oom_recoveries


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out-json", default="python-plan.json")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    gpu = device.type == "cuda"
    budget, target, side = ("1GiB", 1024, 64) if gpu else ("48MiB", 128, 32)
    torch.manual_seed(0)
    model = net().to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.randn(64, 3, side, side), torch.randint(0, 100, (64,))
    before = [p.detach().clone() for p in model.parameters()]
    t0 = time.perf_counter()
    plan = accumplan.plan(model, (x,), y, target_batch=target, optimizer=opt, memory_budget=budget, device=str(device))
    plan_s = time.perf_counter() - t0
    untouched = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    no_budget = True
    if gpu:  # a budget left set would refuse this
        free_bytes = torch.cuda.mem_get_info(device)[0]
        probe = torch.empty(min(free_bytes // 2, 4 * plan.memory["budget_bytes"]), dtype=torch.uint8, device=device)
        del probe
    else:
        torch.empty(4 * plan.memory["budget_bytes"], dtype=torch.uint8).fill_(0)
    steady, peaks, recoveries = steady_peak(plan, model, opt, x, y, device, plan.memory["budget_bytes"])
    pred = plan.memory["predicted_peak_bytes"]
    eval_measured, eval_recoveries = eval_peak(plan, model, opt, x, y, device, plan.memory["budget_bytes"])
    eval_pred = plan.eval["predicted_peak_bytes"]
    result = {"device": str(device), "torch": torch.__version__, "budget": budget, "target_batch": target,
              "microbatch_sizes": plan.microbatch_sizes, "confirmed": plan.confirmed, "probe": plan.profile["probe"],
              "windows": len(plan.profile["trials"]), "plan_seconds": round(plan_s, 2),
              "predicted_peak_bytes": pred, "train_steady_peak_bytes": steady, "train_window_peaks_bytes": peaks,
              "prediction_error": (pred - steady) / steady, "train_oom_recoveries": recoveries,
              "parameters_untouched": untouched, "no_budget_left": no_budget,
              "eval_micro_batch": plan.eval["micro_batch"], "eval_windows": len(plan.eval["trials"]),
              "eval_predicted_peak_bytes": eval_pred, "eval_peak_bytes": eval_measured,
              "eval_prediction_error": (eval_pred - eval_measured) / eval_measured, "eval_oom_recoveries": eval_recoveries}
    with open(args.out_json, "w") as f:
        json.dump(result, f, indent=2)
    mib = 1024.0 * 1024.0
    print("| device | budget, target | microbatches | real windows | predicted peak | train_window steady peak "
          "| predicted vs measured | OOM in training | model untouched |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("| %s | %s, %d | %s | %d | %.1f MiB | %.1f MiB | %+.2f%% | %d | %s |" % (
        device, budget, target, plan.microbatch_sizes, result["windows"], pred / mib, steady / mib,
        100 * result["prediction_error"], recoveries, untouched))
    ok = untouched and recoveries == 0 and abs(result["prediction_error"]) <= 0.01 and steady <= plan.memory["budget_bytes"]
    print()
    print("| eval microbatch (training %d) | eval windows | predicted eval peak | plan.evaluate peak | predicted vs "
          "measured | OOM in evaluation |" % plan.micro_batch)
    print("|---|---|---|---|---|---|")
    print("| %d | %d | %.1f MiB | %.1f MiB | %+.2f%% | %d |" % (
        result["eval_micro_batch"], result["eval_windows"], eval_pred / mib, eval_measured / mib,
        100 * result["eval_prediction_error"], eval_recoveries))
    ok = ok and eval_recoveries == 0 and abs(result["eval_prediction_error"]) <= 0.01
    print("python device check: %s" % ("ok" if ok else "FAILED"), file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
