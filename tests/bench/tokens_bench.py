#!/usr/bin/env python3
"""tokens_bench.py — variable-length sequences: a packed token plan against the sample plans
people run today, on two models and two length distributions, repeated and interleaved
(issues 16 and 26).

What it does: for each setting (`--setting decoder|tagger|all`) it exports a model, draws the
sequence lengths (the first sequence is the longest, so every plan must hold it), plans the
ragged data with `accumplan --batch-file` under a CPU budget — a token plan — and runs the same
windows (same sequences per window, same budget) with `accumplan run`, each run in its own
process:
  decoder  a GPT-style decoder (examples/export_models.py's CausalLM, vocab 1024, context 1024,
           width 64, 2 layers, 4 heads, adamw); log-normal lengths, median 96, sigma 0.9, clipped
           16..1024; next-token targets (causal attention, padding needs no mask);
  tagger   a bidirectional token tagger (export_models.py's TokenTagger: TransformerEncoder, vocab
           2048, context 512, width 96, 3 layers, 4 heads, 16 classes, adamw); bimodal lengths,
           70% uniform 8..48 and 30% uniform 192..512; per-token class targets; planned and run
           with `--padding-mask` (attention must not see the padding).
The variants of each setting:
  packed   the token plan: each window sorted longest first and cut under the token budget where
           the time model (the plan's step cost; refitted during the run where the binary does:
           `run --packing time`) predicts the least time;
  filled   the same token plan, each microbatch filled to the token budget (fewest microbatches):
           `accumplan run --packing fill` where the binary has it, else the plan without its
           step cost (the packing before step costs);
  sorted   the same plan without its token budget: its sample split (the largest microbatch that
           fits at the longest length) on the sequences sorted by length within each window, each
           microbatch cut to its own longest (Hugging Face's group_by_length);
  padded   that sample split with every sequence padded to the context (fixed-shape rows; targets
           ignored past each sequence's end). The tagger's padded run has no lengths to build a
           mask from (a fixed-shape file), so TokenTagger derives it from the pad token id 0.
packed, sorted and filled run `--repeats` times round-robin (packed, sorted, filled, packed, ...)
so that drift of the machine hits every variant alike; padded, far slower, runs
`--padded-repeats` times (after the first rounds). Speed is valid tokens per second of window
time, the median over repeats; the headline ratios are ratios of medians. The updates are the
same in all variants: the script reports the largest difference of any window's loss. Truth for
memory is each run's own measured peak (the counting allocator). It also reports the run's time
model where the stats carry it (`time_model`, per-window `predicted_seconds` and
`microbatch_seconds`; "n/a" from a binary without them).
What it is not: a GPU benchmark — CPU throughput on 2 cores is what it measures — nor a test
(it asserts nothing; the targets it prints are the issue's).
"""
import argparse
import copy
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from export_models import CausalLM, TokenTagger  # noqa: E402

MIB = 1024.0 * 1024.0
TARGET_PACKED_VS_SORTED = 1.15
ROUND_ROBIN = ("packed", "sorted", "filled")
VARIANTS = ("packed", "sorted", "filled", "padded")

SETTINGS = {
    "decoder": {
        "vocab": 1024, "context": 1024, "budget": "320MiB", "windows": 12, "padding_mask": False,
        "model": "CausalLM(vocab 1024, context 1024, width 64, 2 layers, 4 heads), adamw",
        "distribution": "log-normal, median 96, sigma 0.9, clipped 16..1024",
        "targets": "next-token targets (causal attention; padding needs no mask)",
    },
    "tagger": {
        "vocab": 2048, "context": 512, "classes": 16, "budget": "256MiB", "windows": 12, "padding_mask": True,
        "model": "TokenTagger(vocab 2048, context 512, width 96, 3 layers, 4 heads, ff 384, 16 classes; "
                 "bidirectional TransformerEncoder, src_key_padding_mask), adamw",
        "distribution": "bimodal: 70% uniform 8..48, 30% uniform 192..512",
        "targets": "per-token class targets (16 classes), run with --padding-mask",
    },
}


def lengths_lognormal(n, seed, hi, median=96.0, sigma=0.9, lo=16):
    g = torch.Generator().manual_seed(seed)
    raw = torch.exp(math.log(median) + sigma * torch.randn(n, generator=g))
    out = [int(min(hi, max(lo, round(float(x))))) for x in raw]
    out[0] = hi  # the longest a plan must hold, in the first window
    return out


def lengths_bimodal(n, seed, hi, short=(8, 48), long=(192, 512), p_long=0.3):
    g = torch.Generator().manual_seed(seed)
    pick = torch.rand(n, generator=g)
    s = torch.randint(short[0], short[1] + 1, (n,), generator=g)
    lg = torch.randint(long[0], long[1] + 1, (n,), generator=g)
    out = [int(min(hi, (lg[i] if pick[i] < p_long else s[i]))) for i in range(n)]
    out[0] = hi
    return out


def save(obj, path):
    torch.save(obj, path + ".tmp")
    os.replace(path + ".tmp", path)


def write_json(obj, path):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=2)
    os.replace(path + ".tmp", path)


def run(cmd, what):
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        raise SystemExit("%s failed (exit %d): %s" % (what, p.returncode, " ".join(cmd)))
    wall = time.time() - t0
    sys.stderr.write("tokens_bench: %s done in %.1f s\n" % (what, wall))
    return wall


def has_packing_flag(accumplan):
    """Whether `accumplan run` takes --packing fill|time (detected once, from its help text)."""
    p = subprocess.run([accumplan, "run", "--help"], capture_output=True, text=True)
    return "--packing" in (p.stdout + p.stderr)


def fmt(x, spec="%.2f", none="n/a"):
    return none if x is None else spec % x


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def prepare(name, cfg, a, scratch, windows):
    """Model, data files and plans of one setting; returns what the runs need."""
    torch.manual_seed(0)
    vocab, context = cfg["vocab"], cfg["context"]
    n = windows * a.batch
    model_path = os.path.join(scratch, name + ".pt")
    g = torch.Generator().manual_seed(2)
    if name == "decoder":
        model = CausalLM(vocab, context, width=64, layers=2, heads=4)
        lengths = lengths_lognormal(n, 1, context)
        seqs = [torch.randint(0, vocab, (l,), generator=g) for l in lengths]
        targets = None  # next-token targets
    else:
        model = TokenTagger(vocab, context, width=96, layers=3, heads=4, classes=cfg["classes"], pad=0)
        lengths = lengths_bimodal(n, 1, context)
        # Real tokens avoid id 0: the tagger's padded run takes its mask from the pad id.
        seqs = [torch.randint(1, vocab, (l,), generator=g) for l in lengths]
        targets = [torch.randint(0, cfg["classes"], (l,), generator=g) for l in lengths]
    torch.jit.script(model.train()).save(model_path + ".tmp")
    os.replace(model_path + ".tmp", model_path)

    ragged = os.path.join(scratch, name + "-ragged.pt")
    save([seqs, targets], ragged)
    # The same windows, sorted by length within each window (longest first).
    order = []
    for w in range(windows):
        idx = list(range(w * a.batch, (w + 1) * a.batch))
        order += sorted(idx, key=lambda i: -lengths[i])
    sorted_path = os.path.join(scratch, name + "-sorted.pt")
    save([[seqs[i] for i in order], None if targets is None else [targets[i] for i in order]], sorted_path)
    # Fixed shapes: every sequence padded to the context with token 0, targets ignored past its end.
    x = torch.zeros(n, context, dtype=torch.long)
    y = torch.full((n, context), -100, dtype=torch.long)
    for i, s in enumerate(seqs):
        x[i, :len(s)] = s
        if targets is None:
            y[i, :len(s) - 1] = s[1:]
        else:
            y[i, :len(s)] = targets[i]
    padded_path = os.path.join(scratch, name + "-padded.pt")
    save([x, y], padded_path)
    del x, y

    budget = getattr(a, name + "_budget") or cfg["budget"]
    common = ["--device", "cpu", "--memory-budget", budget, "--threads", a.threads, "--progress", "none"]
    plan_path = os.path.join(scratch, name + "-plan.json")
    plan_cmd = [a.accumplan, "--model", model_path, "--batch-file", ragged, "--optimizer", "adamw",
                "--target-batch", str(a.batch), "--out", plan_path] + common
    if cfg["padding_mask"]:
        plan_cmd.append("--padding-mask")
    plan_wall = run(plan_cmd, "%s: plan" % name)
    with open(plan_path) as f:
        plan = json.load(f)
    if "tokens" not in plan:
        raise SystemExit("%s: the plan has no token budget (not a token plan): %s" % (name, plan_path))
    plans = {"packed": plan_path}
    extra = {"packed": [], "sorted": [], "padded": [], "filled": []}
    if a.packing_flag:
        plans["filled"] = plan_path
        extra["packed"] = ["--packing", "time"]
        extra["filled"] = ["--packing", "fill"]
    else:
        filled_plan = copy.deepcopy(plan)
        filled_plan["tokens"].pop("step_cost", None)
        plans["filled"] = os.path.join(scratch, name + "-plan-filled.json")
        write_json(filled_plan, plans["filled"])
    sample_plan = copy.deepcopy(plan)
    sample_plan.pop("tokens")
    plans["sorted"] = os.path.join(scratch, name + "-plan-samples.json")
    write_json(sample_plan, plans["sorted"])
    if cfg["padding_mask"]:
        # A fixed-shape file has no lengths, so accumplan cannot build the mask (it refuses
        # --padding-mask there): the padded run drops it from the setup and the model derives the
        # same mask from its pad token id.
        padded_plan = copy.deepcopy(sample_plan)
        padded_plan.get("setup", {}).pop("padding_mask", None)
        plans["padded"] = os.path.join(scratch, name + "-plan-padded.json")
        write_json(padded_plan, plans["padded"])
    else:
        plans["padded"] = plans["sorted"]
    data = {"packed": ragged, "filled": ragged, "sorted": sorted_path, "padded": padded_path}
    return {"model_path": model_path, "lengths": lengths, "plan": plan, "plans": plans, "data": data,
            "extra": extra, "common": common, "budget": budget, "plan_wall": plan_wall}


def one_run(name, variant, repeat, prep, a, scratch):
    stats_path = os.path.join(scratch, "%s-stats-%s-%d.json" % (name, variant, repeat))
    wall = run([a.accumplan, "run", "--model", prep["model_path"], "--plan", prep["plans"][variant],
                "--data", prep["data"][variant], "--stats", stats_path] + prep["extra"][variant] + prep["common"],
               "%s: run %s (repeat %d)" % (name, variant, repeat))
    with open(stats_path) as f:
        st = json.load(f)
    series = st["window_series"]
    seconds = sum(w["seconds"] for w in series)
    tokens = sum(w["valid_tokens"] for w in series)
    # The time model's prediction of each window against its measured microbatches (new stats;
    # absent from older binaries): over the windows that carry a prediction.
    pred = [(w.get("predicted_seconds"), w.get("microbatch_seconds")) for w in series]
    pred = [(p, m) for p, m in pred if p is not None and m is not None]
    tm = st.get("time_model")
    return {
        "repeat": repeat,
        "windows": len(series),
        "valid_tokens": tokens,
        "window_seconds": seconds,
        "seconds_per_window": seconds / len(series),
        "wall_seconds": wall,
        "tokens_per_second": tokens / seconds,
        "measured_peak_bytes": st.get("measured_peak_bytes"),
        # The plan's memory model on the microbatches this run packed (stats 1.5): the prediction
        # of what ran. The plan's own predicted peak is the worst its token budget allows.
        "packed_predicted_peak_bytes": st.get("packed_predicted_peak_bytes"),
        "budget_bytes": st.get("budget_bytes"),
        "oom_recoveries": st.get("oom_recoveries", 0),
        "mean_microbatches": sum(len(w["microbatch_sizes"]) for w in series) / len(series),
        "losses": [w["loss"] for w in series],
        "time_model": tm,
        "predicted_windows": len(pred),
        "predicted_seconds": sum(p for p, _ in pred) if pred else None,
        "microbatch_seconds": sum(m for _, m in pred) if pred else None,
    }


def summarize(runs):
    tps = [r["tokens_per_second"] for r in runs]
    peaks = [r["measured_peak_bytes"] for r in runs if r["measured_peak_bytes"] is not None]
    return {
        "repeats": len(runs),
        "median_tokens_per_second": median(tps),
        "tokens_per_second_repeats": tps,
        "median_seconds_per_window": median([r["seconds_per_window"] for r in runs]),
        "mean_microbatches": sum(r["mean_microbatches"] for r in runs) / len(runs),
        "measured_peak_bytes": max(peaks) if peaks else None,
        "oom_recoveries": sum(r["oom_recoveries"] for r in runs),
        "runs": runs,
    }


def ratio(results, a_name, b_name):
    if a_name not in results or b_name not in results:
        return None
    return results[a_name]["median_tokens_per_second"] / results[b_name]["median_tokens_per_second"]


def bench_setting(name, a):
    cfg = SETTINGS[name]
    windows = a.windows or cfg["windows"]
    scratch = os.path.join(a.scratch, name)
    os.makedirs(scratch, exist_ok=True)
    t0 = time.time()
    prep = prepare(name, cfg, a, scratch, windows)
    plan, lengths = prep["plan"], prep["lengths"]

    runs = {v: [] for v in VARIANTS}
    order = []
    for r in range(1, a.repeats + 1):
        for v in ROUND_ROBIN:
            runs[v].append(one_run(name, v, r, prep, a, scratch))
            order.append("%s#%d" % (v, r))
        if r <= a.padded_repeats:
            runs["padded"].append(one_run(name, "padded", r, prep, a, scratch))
            order.append("padded#%d" % r)
    for r in range(a.repeats + 1, a.padded_repeats + 1):  # more padded repeats than rounds
        runs["padded"].append(one_run(name, "padded", r, prep, a, scratch))
        order.append("padded#%d" % r)
    results = {v: summarize(rs) for v, rs in runs.items() if rs}

    reference = results["packed"]["runs"][0]["losses"]
    max_diff = 0.0
    for v, res in results.items():
        for rr in res["runs"]:
            # The same windows in every run: a different count, or a loss that is not finite
            # (null in the stats), is a failed comparison, not a small difference.
            if len(rr["losses"]) != len(reference) or None in rr["losses"] or None in reference:
                raise SystemExit("%s: run %s (repeat %d) has losses %s, the first packed run %s"
                                 % (name, v, rr["repeat"], rr["losses"], reference))
            max_diff = max([max_diff] + [abs(p - q) for p, q in zip(reference, rr["losses"])])

    packed = results["packed"]
    predicted = plan["memory"]["predicted_peak_bytes"]
    measured = packed["measured_peak_bytes"]
    tms = [rr["time_model"] or {} for rr in packed["runs"]]
    pw = [(rr["predicted_seconds"], rr["microbatch_seconds"]) for rr in packed["runs"]
          if rr["predicted_seconds"] is not None and rr["microbatch_seconds"]]
    window_errors = [(p - m) / m for p, m in pw]
    # Each packed run's measured peak against the prediction for what it packed (positive:
    # conservative), and against the budget.
    peak_errors = [(rr["packed_predicted_peak_bytes"] - rr["measured_peak_bytes"]) / rr["measured_peak_bytes"]
                   for rr in packed["runs"] if rr.get("packed_predicted_peak_bytes") and rr["measured_peak_bytes"]]
    within_budget = all(rr["measured_peak_bytes"] is not None and rr["budget_bytes"] is not None and
                        rr["measured_peak_bytes"] <= rr["budget_bytes"] for rr in packed["runs"])
    time_model = {
        "median_abs_error": median([t.get("median_abs_error") for t in tms]),
        "p90_abs_error": median([t.get("p90_abs_error") for t in tms]),
        "microbatches": median([t.get("microbatches") for t in tms]),
        "refits": median([t.get("refits") for t in tms]),
        "final_cost": tms[-1].get("final_cost"),  # the cost the last packed run ended with
        "per_repeat": [t or None for t in tms],
        "predicted_window_seconds": median([p for p, _ in pw]),
        "measured_window_seconds": median([m for _, m in pw]),
        "window_time_error": median(window_errors),
        "window_time_error_repeats": window_errors,
        "predicted_windows": median([rr["predicted_windows"] for rr in packed["runs"]]),
    }
    notes = []
    if name == "tagger" and "padded" in results:
        notes.append("padded: a fixed-shape file carries no lengths, so accumplan cannot pass the padding mask "
                     "(it refuses --padding-mask there); that run's plan drops setup.padding_mask and TokenTagger "
                     "derives the same mask from the pad token id 0 (real tokens are 1..%d)" % (cfg["vocab"] - 1))
    if "padded" not in results:
        notes.append("padded: not run (--padded-repeats 0)")
    notes.append("filled: %s" % ("`accumplan run --packing fill` on the same plan" if a.packing_flag else
                                 "the plan without its step cost (this binary has no `run --packing`)"))
    n = len(lengths)
    return {
        "name": name,
        "model": cfg["model"],
        "lengths": {"distribution": cfg["distribution"], "mean": sum(lengths) / n, "max": max(lengths),
                    "min": min(lengths)},
        "targets": cfg["targets"],
        "padding_mask": cfg["padding_mask"],
        "windows": windows, "batch": a.batch, "budget": prep["budget"],
        "plan": {"token_budget": plan["tokens"]["token_budget"], "max_seq_len": plan["tokens"]["max_seq_len"],
                 "step_cost": plan["tokens"].get("step_cost"),
                 "padded_micro_batch": plan["max_micro_batch"], "padded_microbatches": plan["accumulation_steps"],
                 "predicted_peak_bytes": predicted, "confirmed": plan.get("confirmed"),
                 "planning_seconds": prep["plan_wall"]},
        "order": order,
        "variants": results,
        "packed_vs_sorted_tokens_per_second": ratio(results, "packed", "sorted"),
        "packed_vs_filled_tokens_per_second": ratio(results, "packed", "filled"),
        "packed_vs_padded_tokens_per_second": ratio(results, "packed", "padded"),
        "packed_prediction_error": None if measured is None else (predicted - measured) / measured,
        "packed_run_prediction_errors": peak_errors,
        "packed_within_budget": within_budget,
        "time_model": time_model,
        "max_loss_difference": max_diff,
        "oom_recoveries": {v: res["oom_recoveries"] for v, res in results.items()},
        "notes": notes,
        "seconds": time.time() - t0,
    }


def setting_lines(s, packing_flag):
    p = s["plan"]
    res = s["variants"]
    packed = res["packed"]
    cost = p["step_cost"]
    ctx = SETTINGS[s["name"]]["context"]
    lines = [
        "## %s" % s["name"],
        "",
        "- model: %s" % s["model"],
        "- data: %d windows x %d sequences, lengths %s (mean %.0f tokens); %s"
        % (s["windows"], s["batch"], s["lengths"]["distribution"], s["lengths"]["mean"], s["targets"]),
        "- budget %s for planning and every run; plan: token budget %d padded tokens (sequences up to %d, "
        "%.1f of the longest); as samples: microbatches of up to %d sequences, %d per window; predicted peak "
        "%.1f MiB; planning took %.0f s"
        % (s["budget"], p["token_budget"], p["max_seq_len"], p["token_budget"] / float(p["max_seq_len"]),
           p["padded_micro_batch"], p["padded_microbatches"], p["predicted_peak_bytes"] / MIB,
           p["planning_seconds"]),
        "",
        "| variant | median valid tokens/s | repeats (tokens/s) | vs sorted | microbatches per window "
        "| measured peak MiB | OOM recoveries |",
        "|---|---|---|---|---|---|---|",
    ]
    desc = {
        "packed": "packed (token plan, %s)" % (
            "`run --packing time`: cut where the time model predicts least" if packing_flag else
            "cut by its step cost" if cost else "no step cost from the profile: filled"),
        "sorted": "sample split, sorted by length, cut to own longest",
        "filled": "packed, each microbatch filled to the token budget",
        "padded": "sample split, padded to %d" % ctx,
    }
    sorted_tps = res["sorted"]["median_tokens_per_second"] if "sorted" in res else None
    for v in ("packed", "sorted", "filled", "padded"):
        if v not in res:
            continue
        r = res[v]
        lines.append("| %s | %.0f | %s | %s | %.1f | %s | %d |" % (
            desc[v], r["median_tokens_per_second"], ", ".join("%.0f" % t for t in r["tokens_per_second_repeats"]),
            fmt(r["median_tokens_per_second"] / sorted_tps if sorted_tps else None), r["mean_microbatches"],
            fmt(None if r["measured_peak_bytes"] is None else r["measured_peak_bytes"] / MIB, "%.1f"),
            r["oom_recoveries"]))
    ps = s["packed_vs_sorted_tokens_per_second"]
    tm = s["time_model"]
    fc = tm.get("final_cost")
    pct = lambda x: fmt(None if x is None else 100 * x, "%.1f%%")  # noqa: E731
    lines += [
        "",
        "- packed / sorted tokens per second (ratio of medians): **%s** (the issue's target: >= %.2f, %s); "
        "packed / filled: %s; packed / padded: %s"
        % (fmt(ps), TARGET_PACKED_VS_SORTED, "n/a" if ps is None else ("met" if ps >= TARGET_PACKED_VS_SORTED
                                                                        else "not met"),
           fmt(s["packed_vs_filled_tokens_per_second"]), fmt(s["packed_vs_padded_tokens_per_second"])),
        "- the plan's step cost (from the profile's step times): %s"
        % ("a microbatch costs as much as %.0f padded tokens; per token and token of length %.4f"
           % (cost["per_microbatch"] / cost["per_token"], cost["per_token_squared"] / cost["per_token"])
           if cost else "none (%s)" % ("the run's time model starts without one" if packing_flag
                                       else "each microbatch filled")),
        "- packed run's time model: per-microbatch relative error of the predicted seconds, median %s, p90 %s "
        "(%s microbatches, %s refits; medians over repeats)%s"
        % (pct(tm["median_abs_error"]), pct(tm["p90_abs_error"]), fmt(tm["microbatches"], "%.0f"),
           fmt(tm["refits"], "%.0f"),
           "; the cost it ended with: a microbatch costs as much as %.0f padded tokens"
           % (fc["per_microbatch"] / float(fc["per_token"])) if fc and fc.get("per_token") else ""),
        "- packed run's window time: predicted %s s vs measured %s s over %s windows: error %s (median over "
        "repeats; all: %s)"
        % (fmt(tm["predicted_window_seconds"], "%.1f"), fmt(tm["measured_window_seconds"], "%.1f"),
           fmt(tm["predicted_windows"], "%.0f"),
           fmt(None if tm["window_time_error"] is None else 100 * tm["window_time_error"], "%+.1f%%"),
           ", ".join("%+.1f%%" % (100 * e) for e in tm["window_time_error_repeats"]) or "n/a"),
        "- packed runs' peak against the plan's memory model on the microbatches each run packed "
        "(`packed_predicted_peak_bytes`; positive = conservative; target within 1%%): %s; within the budget: %s"
        % (", ".join("%+.2f%%" % (100 * e) for e in s["packed_run_prediction_errors"]) or "n/a",
           "yes" if s["packed_within_budget"] else "NO"),
        "- the plan's predicted peak, the worst its token budget allows (%.1f MiB), against the highest packed "
        "run's measured peak (%s MiB): %s"
        % (p["predicted_peak_bytes"] / MIB,
           fmt(None if packed["measured_peak_bytes"] is None else packed["measured_peak_bytes"] / MIB, "%.1f"),
           fmt(None if s["packed_prediction_error"] is None else 100 * s["packed_prediction_error"], "%+.2f%%")),
        "- OOM recoveries (target 0): %s"
        % ", ".join("%s %d" % (v, n) for v, n in s["oom_recoveries"].items()),
        "- identical updates: the largest difference of a window's loss between any two runs is %.2e"
        % s["max_loss_difference"],
        "- run order: %s" % " ".join(s["order"]),
    ]
    lines += ["- note: %s" % n for n in s["notes"]]
    lines.append("")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setting", choices=("decoder", "tagger", "all"), default="all")
    ap.add_argument("--accumplan", default=os.path.join(ROOT, "build", "accumplan"))
    ap.add_argument("--scratch", default=os.path.join(ROOT, "build", "tokens-bench"))
    ap.add_argument("--out", default=os.path.join(HERE, "tokens.json"))
    ap.add_argument("--md", default=os.path.join(HERE, "TOKENS.md"))
    ap.add_argument("--windows", type=int, default=None,
                    help="windows per setting (default: decoder %d, tagger %d)"
                    % (SETTINGS["decoder"]["windows"], SETTINGS["tagger"]["windows"]))
    ap.add_argument("--repeats", type=int, default=3, help="rounds of packed, sorted, filled (round-robin)")
    ap.add_argument("--padded-repeats", type=int, default=1, help="runs of the (slow) padded variant per setting")
    ap.add_argument("--batch", type=int, default=32, help="sequences per window (the target batch)")
    ap.add_argument("--decoder-budget", default=None,
                    help="the decoder's CPU memory budget (default %s)" % SETTINGS["decoder"]["budget"])
    ap.add_argument("--tagger-budget", default=None,
                    help="the tagger's CPU memory budget (default %s)" % SETTINGS["tagger"]["budget"])
    ap.add_argument("--threads", default="2")
    a = ap.parse_args()
    if a.repeats < 1 or a.padded_repeats < 0 or (a.windows is not None and a.windows < 1):
        ap.error("--repeats and --windows need at least 1, --padded-repeats at least 0")
    os.makedirs(a.scratch, exist_ok=True)
    a.packing_flag = has_packing_flag(a.accumplan)
    sys.stderr.write("tokens_bench: filled variant via %s\n"
                     % ("`run --packing fill`" if a.packing_flag else "the plan without its step cost"))

    names = ("decoder", "tagger") if a.setting == "all" else (a.setting,)
    t0 = time.time()
    settings = []
    for name in names:
        s = bench_setting(name, a)
        write_json(s, os.path.join(a.scratch, "setting-%s.json" % name))  # kept if a later setting fails
        settings.append(s)
    command = " ".join(["/usr/bin/python3", "tests/bench/tokens_bench.py"] + [shlex.quote(x) for x in sys.argv[1:]])
    out = {
        "schema": "accumplan.tokens_bench", "schema_version": "2.0",
        "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "threads": a.threads,
        "repeats": a.repeats, "padded_repeats": a.padded_repeats,
        "filled_via": "run --packing fill" if a.packing_flag else "plan without tokens.step_cost",
        "command": command, "seconds": time.time() - t0,
        "settings": settings,
    }
    write_json(out, a.out)

    lines = [
        "# Variable-length sequences: packed token plan vs sample plans",
        "",
        "- date %s, torch %s, %s CPU threads; %d interleaved repeats of packed, sorted, filled and %d of padded "
        "per setting; the whole run took %.0f min"
        % (out["date"], out["torch"], a.threads, a.repeats, a.padded_repeats, out["seconds"] / 60.0),
        "- reproduce: `%s` (after building `accumplan`)" % command,
        "- speed is valid tokens per second of window time, the median over repeats; ratios are ratios of "
        "medians; every variant runs the same windows under the same budget in its own process",
        "",
    ]
    for s in settings:
        lines += setting_lines(s, a.packing_flag)
    with open(a.md + ".tmp", "w") as f:
        f.write("\n".join(lines))
    os.replace(a.md + ".tmp", a.md)
    sys.stderr.write("wrote %s and %s (%.0f s)\n" % (a.out, a.md, out["seconds"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
