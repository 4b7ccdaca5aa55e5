#!/usr/bin/env python3
"""tokens_bench.py — variable-length sequences: a packed token plan against the sample plans
people run today, on a decoder LM and a long-tailed length distribution (issue 16's benchmark).

What it does: exports a GPT-style decoder (examples/export_models.py's CausalLM, context 1024),
draws sequence lengths from a log-normal clipped to 16..1024 (the first sample is 1024 long, so
every plan must hold the longest), and plans it with `accumplan --batch-file` under a CPU budget:
a token plan. Then four `accumplan run`s of the same windows, same samples per window, same
budget, in their own processes:
  packed   the token plan: each window sorted longest first and cut under the token budget where
           the plan's step cost (fitted from the profile's step times) predicts the least time;
  filled   the same token plan without its step cost: each microbatch filled to the budget (the
           packing before step costs);
  padded   the same plan without its token budget: its sample split (the largest microbatch that
           fits at 1024 tokens), every microbatch padded to 1024 — fixed-shape batches;
  sorted   that sample split on the samples sorted by length within each window, each microbatch
           cut to its own longest (Hugging Face's group_by_length).
The updates are the same in all four (next-token targets, padding ignored, causal attention):
the script reports the largest difference of any window's loss. Truth for memory is each run's
own measured peak (the counting allocator), for speed its valid tokens per second of window time.
What it is not: a GPU benchmark; CPU throughput on 2 cores is what it measures.
"""
import argparse
import copy
import json
import math
import os
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from export_models import CausalLM  # noqa: E402

VOCAB, CONTEXT = 1024, 1024


def lengths_lognormal(n, seed, median=96.0, sigma=0.9, lo=16, hi=CONTEXT):
    g = torch.Generator().manual_seed(seed)
    raw = torch.exp(math.log(median) + sigma * torch.randn(n, generator=g))
    out = [int(min(hi, max(lo, round(float(x))))) for x in raw]
    out[0] = hi  # the longest a plan must hold, in the first window
    return out


def save(obj, path):
    torch.save(obj, path + ".tmp")
    os.replace(path + ".tmp", path)


def run(cmd, what):
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        raise SystemExit("%s failed (exit %d): %s" % (what, p.returncode, " ".join(cmd)))
    sys.stderr.write("tokens_bench: %s done in %.1f s\n" % (what, time.time() - t0))
    return p


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--accumplan", default=os.path.join(ROOT, "build", "accumplan"))
    ap.add_argument("--scratch", default=os.path.join(ROOT, "build", "tokens-bench"))
    ap.add_argument("--out", default=os.path.join(HERE, "tokens.json"))
    ap.add_argument("--md", default=os.path.join(HERE, "TOKENS.md"))
    ap.add_argument("--windows", type=int, default=50)
    ap.add_argument("--batch", type=int, default=32, help="sequences per window (the target batch)")
    ap.add_argument("--budget", default="320MiB", help="the CPU memory budget of every step")
    ap.add_argument("--threads", default="2")
    a = ap.parse_args()
    os.makedirs(a.scratch, exist_ok=True)
    torch.manual_seed(0)

    model_path = os.path.join(a.scratch, "decoder.pt")
    torch.jit.script(CausalLM(VOCAB, CONTEXT, width=64, layers=2, heads=4)).save(model_path)

    n = a.windows * a.batch
    lengths = lengths_lognormal(n, 1)
    g = torch.Generator().manual_seed(2)
    seqs = [torch.randint(0, VOCAB, (l,), generator=g) for l in lengths]
    ragged = os.path.join(a.scratch, "ragged.pt")
    save([seqs, None], ragged)  # None: next-token targets
    # The same windows, sorted by length within each window.
    order = []
    for w in range(a.windows):
        idx = list(range(w * a.batch, (w + 1) * a.batch))
        order += sorted(idx, key=lambda i: -lengths[i])
    sorted_path = os.path.join(a.scratch, "sorted.pt")
    save([[seqs[i] for i in order], None], sorted_path)
    # Fixed shapes: every sequence padded to 1024, targets ignored past each sequence's end.
    x = torch.zeros(n, CONTEXT, dtype=torch.long)
    y = torch.full((n, CONTEXT), -100, dtype=torch.long)
    for i, s in enumerate(seqs):
        x[i, :len(s)] = s
        y[i, :len(s) - 1] = s[1:]
    padded_path = os.path.join(a.scratch, "padded.pt")
    save([x, y], padded_path)

    common = ["--device", "cpu", "--memory-budget", a.budget, "--threads", a.threads, "--progress", "none"]
    plan_path = os.path.join(a.scratch, "plan.json")
    run([a.accumplan, "--model", model_path, "--batch-file", ragged, "--optimizer", "adamw", "--target-batch",
         str(a.batch), "--out", plan_path] + common, "plan")
    with open(plan_path) as f:
        plan = json.load(f)
    filled_plan = copy.deepcopy(plan)
    filled_plan["tokens"].pop("step_cost", None)
    filled_plan_path = os.path.join(a.scratch, "plan-filled.json")
    with open(filled_plan_path, "w") as f:
        json.dump(filled_plan, f, indent=2)
    padded_plan = copy.deepcopy(plan)
    padded_plan.pop("tokens")
    padded_plan_path = os.path.join(a.scratch, "plan-padded.json")
    with open(padded_plan_path, "w") as f:
        json.dump(padded_plan, f, indent=2)

    results = {}
    for name, plan_file, data in (("packed", plan_path, ragged), ("filled", filled_plan_path, ragged),
                                  ("sorted", padded_plan_path, sorted_path),
                                  ("padded", padded_plan_path, padded_path)):
        stats_path = os.path.join(a.scratch, "stats-%s.json" % name)
        run([a.accumplan, "run", "--model", model_path, "--plan", plan_file, "--data", data, "--stats", stats_path]
            + common, "run " + name)
        with open(stats_path) as f:
            st = json.load(f)
        series = st["window_series"]
        seconds = sum(w["seconds"] for w in series)
        tokens = sum(w["valid_tokens"] for w in series)
        results[name] = {
            "windows": len(series),
            "valid_tokens": tokens,
            "window_seconds": seconds,
            "tokens_per_second": tokens / seconds,
            "measured_peak_bytes": st["measured_peak_bytes"],
            "oom_recoveries": st["oom_recoveries"],
            "mean_microbatches": sum(len(w["microbatch_sizes"]) for w in series) / len(series),
            "losses": [w["loss"] for w in series],
        }
    packed = results["packed"]
    predicted = plan["memory"]["predicted_peak_bytes"]
    out = {
        "schema": "accumplan.tokens_bench", "schema_version": "1.0",
        "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "threads": a.threads,
        "model": "CausalLM(vocab %d, context %d, width 64, 2 layers, 4 heads), adamw" % (VOCAB, CONTEXT),
        "lengths": {"distribution": "log-normal, median 96, sigma 0.9, clipped 16..1024", "mean": sum(lengths) / n,
                    "max": max(lengths), "min": min(lengths)},
        "windows": a.windows, "batch": a.batch, "budget": a.budget,
        "plan": {"token_budget": plan["tokens"]["token_budget"], "max_seq_len": plan["tokens"]["max_seq_len"],
                 "step_cost": plan["tokens"].get("step_cost"),
                 "padded_micro_batch": plan["max_micro_batch"], "padded_microbatches": plan["accumulation_steps"],
                 "predicted_peak_bytes": predicted, "confirmed": plan["confirmed"]},
        "runs": results,
        "packed_vs_padded_tokens_per_second": packed["tokens_per_second"] / results["padded"]["tokens_per_second"],
        "packed_vs_sorted_tokens_per_second": packed["tokens_per_second"] / results["sorted"]["tokens_per_second"],
        "packed_vs_filled_tokens_per_second": packed["tokens_per_second"] / results["filled"]["tokens_per_second"],
        "packed_prediction_error": (predicted - packed["measured_peak_bytes"]) / packed["measured_peak_bytes"],
        "max_loss_difference": max(abs(p - q) for name in ("filled", "sorted", "padded")
                                   for p, q in zip(packed["losses"], results[name]["losses"])),
    }
    with open(a.out + ".tmp", "w") as f:
        json.dump(out, f, indent=2)
    os.replace(a.out + ".tmp", a.out)

    mib = 1024.0 * 1024.0
    lines = [
        "# Variable-length sequences: packed token plan vs sample plans",
        "",
        "- date %s, torch %s, %s CPU threads; reproduce: `/usr/bin/python3 tests/bench/tokens_bench.py` "
        "(after building `accumplan`)" % (out["date"], out["torch"], a.threads),
        "- model: %s" % out["model"],
        "- data: %d windows x %d sequences, lengths %s (mean %.0f tokens); next-token targets"
        % (a.windows, a.batch, out["lengths"]["distribution"], out["lengths"]["mean"]),
        "- budget %s for planning and every run; plan: token budget %d padded tokens (sequences up to %d); "
        "the same plan as samples: microbatches of up to %d sequences padded to %d, %d per window"
        % (a.budget, out["plan"]["token_budget"], out["plan"]["max_seq_len"], out["plan"]["padded_micro_batch"],
           out["plan"]["max_seq_len"], out["plan"]["padded_microbatches"]),
        "",
        "| run | valid tokens/s | vs packed | microbatches per window | measured peak MiB | OOM recoveries |",
        "|---|---|---|---|---|---|",
    ]
    cost = out["plan"]["step_cost"]
    for name, desc in (("packed", "packed (token plan, %s)" % ("cut by its step cost" if cost else
                                                               "no step cost from the profile: filled")),
                       ("filled", "packed, each microbatch filled to the budget (no step cost)"),
                       ("sorted", "sample split, sorted by length, cut to own longest"),
                       ("padded", "sample split, padded to 1024")):
        r = results[name]
        lines.append("| %s | %.0f | %.2f | %.1f | %.1f | %d |" % (
            desc, r["tokens_per_second"], r["tokens_per_second"] / packed["tokens_per_second"], r["mean_microbatches"],
            r["measured_peak_bytes"] / mib, r["oom_recoveries"]))
    lines += [
        "",
        "- packed / padded tokens per second: **%.2f**; packed / sorted: %.2f; packed / filled: %.2f"
        % (out["packed_vs_padded_tokens_per_second"], out["packed_vs_sorted_tokens_per_second"],
           out["packed_vs_filled_tokens_per_second"]),
        "- the plan's step cost (from the profile's step times): %s"
        % ("a microbatch costs as much as %.0f padded tokens; per token and token of length %.4f"
           % (cost["per_microbatch"] / cost["per_token"], cost["per_token_squared"] / cost["per_token"])
           if cost else "none (each microbatch filled)"),
        "- packed run: predicted peak %.1f MiB vs measured %.1f MiB: error %+.2f%% (positive = conservative)"
        % (predicted / mib, packed["measured_peak_bytes"] / mib, 100 * out["packed_prediction_error"]),
        "- identical updates: the largest difference of a window's loss between the runs is %.2e"
        % out["max_loss_difference"],
        "",
    ]
    with open(a.md + ".tmp", "w") as f:
        f.write("\n".join(lines))
    os.replace(a.md + ".tmp", a.md)
    sys.stderr.write("wrote %s and %s\n" % (a.out, a.md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
