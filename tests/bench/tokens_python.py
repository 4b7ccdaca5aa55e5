#!/usr/bin/env python3
"""tokens_python.py — variable-length settings planned and trained from Python.

What it does: for each setting (`decoder` and `tagger` of tests/bench/tokens_bench.py: a GPT-style
decoder on log-normal lengths with next-token targets, a bidirectional tagger on bimodal lengths
with per-token targets and a padding mask, the same models, lengths, data and budgets; `mixed`: a
4-block decoder on 80% short (16..64) and 20% long (256..512) sequences under 200 MiB, planned on
its first 64 sequences with max_seq_len=512), it
  1. plans the ragged data with `accumplan.plan` on the nn.Module (a list of 1-D token tensors) and,
     for comparison, with the CLI (`accumplan --batch-file`) on the module's TorchScript export;
  2. trains the same windows from the same start in three variants, `--repeats` times round-robin
     in this one process (so drift of the machine hits all alike):
       packed  `plan.train_window` on each window's list of sequences (the default packing="time":
               the plan's C++ packer and step cost under its token budget);
       fill    the same with packing="fill" (each microbatch as full as the token budget allows);
       sorted  the same plan without its token budget: its sample split on each window's sequences
               sorted longest first, each microbatch cut to its own longest (Hugging Face's
               group_by_length), also `train_window`;
     speed is valid tokens per second of window time (median over repeats), memory each window's
     measured peak (`measure_memory=True`: the counting allocator) against
     `WindowStats.predicted_peak_bytes` (packed: the plan's token model on what it packed);
  3. runs the Python plan file with `accumplan run --packing fill` on the TorchScript export and
     the same data from the same start, and compares its trained parameters with a Python run of
     `train_window(..., packing="fill")` (the same microbatches: packing by time cuts where each
     process's own timings say, so two runs may cut differently);
  4. plans the TorchScript export from Python too (`accumplan.plan` on `torch.jit.load`), so the
     token budgets compare on one module, and compares the peaks the Python and CLI plans measured
     at the same (b, T) windows (eager and TorchScript need different memory).
Truth for memory is the counting allocator's peak of the real windows; truth for the update is the
CLI's C++ executor (another code path than train_window).
What it is not: a GPU benchmark (CPU throughput on 2 threads) nor a test (it asserts nothing; it
prints the issue's targets beside the figures).

    build/venv/bin/python tests/bench/tokens_python.py [--setting decoder|tagger|mixed|all] [--repeats 3]
"""
import argparse
import copy
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "examples"))
from export_models import CausalLM, TokenTagger  # noqa: E402
from tokens_bench import SETTINGS, lengths_bimodal, lengths_lognormal, save, write_json  # noqa: E402

import accumplan  # noqa: E402

MIB = 1024.0 * 1024.0
TARGETS = {"packed_vs_sorted": 1.15, "peak_error": 0.01, "budget_vs_cli": 0.02, "update": 1e-6}
VARIANTS = ("packed", "fill", "sorted")
MIXED = {
    "vocab": 1024, "context": 512, "budget": "200MiB", "padding_mask": False, "windows": 8, "batch": 64,
    "sample": 64, "max_seq_len": 512,
    "model": "CausalLM(vocab 1024, context 512, width 64, 4 layers, 4 heads), adamw",
    "distribution": "mixed: 80% uniform 16..64, 20% uniform 256..512; planned on the first 64 with max_seq_len=512",
    "targets": "next-token targets (causal attention; padding needs no mask)",
}
ALL = dict(SETTINGS, mixed=MIXED)


def say(line):
    sys.stderr.write("tokens_python: %s\n" % line)
    sys.stderr.flush()


def data(name, cfg, a):
    """The setting's model (seeded as tokens_bench.py's), sequences and per-token targets."""
    torch.manual_seed(0)
    n = a.windows * a.batch
    g = torch.Generator().manual_seed(2)
    if name in ("decoder", "mixed"):
        if name == "decoder":
            model = CausalLM(cfg["vocab"], cfg["context"], width=64, layers=2, heads=4)
            lengths = lengths_lognormal(n, 1, cfg["context"])
        else:
            model = CausalLM(cfg["vocab"], cfg["context"], width=64, layers=4, heads=4)
            lengths = lengths_bimodal(n, 1, cfg["context"], short=(16, 64), long=(256, 512), p_long=0.2)
            lengths[0], lengths[70] = 300, 512  # the sample need not hold max_seq_len; a later window does
        seqs = [torch.randint(0, cfg["vocab"], (l,), generator=g) for l in lengths]
        return model.train(), seqs, None
    model = TokenTagger(cfg["vocab"], cfg["context"], width=96, layers=3, heads=4, classes=cfg["classes"], pad=0)
    lengths = lengths_bimodal(n, 1, cfg["context"])
    seqs = [torch.randint(1, cfg["vocab"], (l,), generator=g) for l in lengths]
    targets = [torch.randint(0, cfg["classes"], (l,), generator=g) for l in lengths]
    return model.train(), seqs, targets


def window(seqs, targets, w, batch, order=None):
    idx = list(range(w * batch, (w + 1) * batch))
    if order == "sorted":
        idx.sort(key=lambda i: -seqs[i].numel())
    return [seqs[i] for i in idx], (None if targets is None else [targets[i] for i in idx])


def train_run(plan, start, seqs, targets, a, order, packing="time"):
    """Every window once from `start` (a model and a fresh AdamW) with a fresh copy of the plan (its
    step-time fit starts from the plan's, as each `accumplan run` process does): per-window stats."""
    plan = accumplan.load_plan(plan.raw)
    model = copy.deepcopy(start)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    out = []
    for w in range(a.windows):
        x, y = window(seqs, targets, w, a.batch, order)
        st = plan.train_window(model, opt, x, y, measure_memory=True, packing=packing)
        out.append({"seconds": st.seconds, "valid_tokens": st.units, "loss": st.loss,
                    "microbatches": len(st.microbatch_sizes), "peak_bytes": st.peak_bytes,
                    "predicted_peak_bytes": st.predicted_peak_bytes, "oom_recoveries": st.oom_recoveries})
    return out, model


def summary(windows):
    seconds = sum(w["seconds"] for w in windows)
    tokens = sum(w["valid_tokens"] for w in windows)
    return {"tokens_per_second": tokens / seconds, "window_seconds": seconds, "valid_tokens": tokens,
            "mean_microbatches": statistics.mean(w["microbatches"] for w in windows),
            "peak_bytes": max(w["peak_bytes"] for w in windows),
            # The run's peak against the prediction for what it packed, as `accumplan run` reports
            # them (measured_peak_bytes, packed_predicted_peak_bytes: the highest of each).
            "predicted_peak_bytes": max((w["predicted_peak_bytes"] or 0) for w in windows) or None,
            "window_peaks": [[w["peak_bytes"], w["predicted_peak_bytes"]] for w in windows],
            # Every window after a run's first (the first runs before the optimizer's state exists
            # and the step-time fit has microbatches of its own).
            "later_peak_errors": [(w["predicted_peak_bytes"] - w["peak_bytes"]) / w["peak_bytes"]
                                  for w in windows[1:] if w["predicted_peak_bytes"]],
            "oom_recoveries": sum(w["oom_recoveries"] for w in windows),
            "peak_errors": [(w["predicted_peak_bytes"] - w["peak_bytes"]) / w["peak_bytes"]
                            for w in windows if w["predicted_peak_bytes"]],
            "losses": [w["loss"] for w in windows]}


def run(cmd, what):
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        raise SystemExit("%s failed (exit %d): %s" % (what, p.returncode, " ".join(cmd)))
    say("%s done in %.1f s" % (what, time.time() - t0))
    return time.time() - t0


def cli_side(name, cfg, a, start, seqs, targets, py_plan, scratch):
    """The CLI's token plan of the TorchScript export, and the CLI's run of the Python plan."""
    model_path = os.path.join(scratch, name + ".pt")
    torch.jit.script(copy.deepcopy(start)).save(model_path)
    ragged = os.path.join(scratch, name + "-ragged.pt")
    save([seqs, targets], ragged)
    common = ["--device", "cpu", "--memory-budget", cfg["budget"], "--threads", str(a.threads), "--progress", "none"]
    cli_plan = os.path.join(scratch, name + "-cli-plan.json")
    cmd = [a.accumplan, "--model", model_path, "--batch-file", ragged, "--optimizer", "adamw", "--lr", "1e-3",
           "--target-batch", str(a.batch), "--out", cli_plan] + common
    run(cmd + (["--padding-mask"] if cfg["padding_mask"] else []), "%s: CLI plan" % name)
    with open(cli_plan) as f:
        cli = json.load(f)
    plan_path = os.path.join(scratch, name + "-python-plan.json")
    py_plan.save(plan_path)
    trained = os.path.join(scratch, name + "-cli-trained.pt")
    run([a.accumplan, "run", "--model", model_path, "--plan", plan_path, "--data", ragged, "--save", trained,
         "--packing", "fill", "--stats", os.path.join(scratch, name + "-cli-stats.json")] + common,
        "%s: CLI run of the Python plan" % name)
    scripted = torch.jit.load(model_path)
    t0 = time.time()
    py_scripted = accumplan.plan(scripted, seqs, targets, target_batch=a.batch,
                                 optimizer=torch.optim.AdamW(scripted.parameters(), lr=1e-3),
                                 memory_budget=cfg["budget"], device="cpu", padding_mask=cfg["padding_mask"],
                                 progress=False)
    say("%s: Python plan of the TorchScript export in %.1f s" % (name, time.time() - t0))
    return cli, dict(torch.jit.load(trained).named_parameters()), py_scripted


def same_windows(py_plan, cli):
    """Peaks the two plans measured at the same (b, T) windows: Python's / the CLI's."""
    def points(doc):
        return {(p["micro_batch"], p["seq_len"]): p["peak_bytes"] for p in doc["profile"]["points"]}
    py, c = points(py_plan.raw), points(cli)
    return {"%dx%d" % k: py[k] / c[k] for k in sorted(set(py) & set(c))}


def short_windows(name, cfg, start, sample_seqs, sample_targets):
    """Windows of only the setting's shortest sequences at the whole token budget (and at half
    of it), each one microbatch, measured against the prediction: a plan of the same sample at a
    batch large enough to hold that many sequences in one window."""
    model = copy.deepcopy(start)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    plan = accumplan.plan(model, sample_seqs, sample_targets, target_batch=4096, optimizer=opt,
                          memory_budget=cfg["budget"], device="cpu", padding_mask=cfg["padding_mask"],
                          max_seq_len=cfg.get("max_seq_len"), progress=False)
    tokens = plan.tokens["token_budget"]
    g = torch.Generator().manual_seed(5)

    def one_window(b, t):
        x = [torch.randint(1, cfg["vocab"], (t,), generator=g) for _ in range(b)]
        y = None if sample_targets is None else [torch.randint(0, cfg["classes"], (t,), generator=g) for _ in range(b)]
        return plan.train_window(model, opt, x, y, measure_memory=True, packing="fill")

    one_window(max(1, tokens // 128), 128)  # the optimizer's state exists from here on
    shortest = min(s.numel() for s in sample_seqs)
    rows = []
    for t in (shortest, 2 * shortest):
        for b in (tokens // t, tokens // (2 * t)):
            st = one_window(b, t)
            rows.append({"micro_batch": b, "seq_len": t, "peak_bytes": st.peak_bytes,
                         "predicted_peak_bytes": st.predicted_peak_bytes, "microbatches": len(st.microbatch_sizes)})
    say("%s: short windows: %s" % (name, ", ".join("%dx%d %+.2f%%" % (r["micro_batch"], r["seq_len"], 100 * (
        r["predicted_peak_bytes"] - r["peak_bytes"]) / r["peak_bytes"]) for r in rows)))
    return {"token_budget": tokens, "rows": rows}


def bench_setting(name, a):
    cfg = ALL[name]
    a = argparse.Namespace(**dict(vars(a), windows=a.windows or cfg.get("windows", 12), batch=a.batch or cfg.get("batch", 32)))
    scratch = os.path.join(a.scratch, name)
    os.makedirs(scratch, exist_ok=True)
    start, seqs, targets = data(name, cfg, a)
    planning = copy.deepcopy(start)
    sample = cfg.get("sample", len(seqs))
    t0 = time.time()
    plan = accumplan.plan(planning, seqs[:sample], None if targets is None else targets[:sample], target_batch=a.batch,
                          optimizer=torch.optim.AdamW(planning.parameters(), lr=1e-3), memory_budget=cfg["budget"],
                          device="cpu", padding_mask=cfg["padding_mask"], max_seq_len=cfg.get("max_seq_len"),
                          progress=False)
    plan_seconds = time.time() - t0
    say("%s: planned in %.1f s: %s, token budget %s" % (name, plan_seconds, plan, plan.tokens["token_budget"]))
    short = short_windows(name, cfg, start, seqs[:sample], None if targets is None else targets[:sample])
    sample_plan = accumplan.load_plan({k: v for k, v in plan.raw.items() if k != "tokens"})
    runs = {v: [] for v in VARIANTS}
    for r in range(a.repeats):
        for variant in VARIANTS:
            windows, _ = train_run(sample_plan if variant == "sorted" else plan, start, seqs, targets, a,
                                   "sorted" if variant == "sorted" else None,
                                   packing="fill" if variant == "fill" else "time")
            s = summary(windows)
            s["microbatches_per_window"] = [w["microbatches"] for w in windows]
            runs[variant].append(s)
            say("%s: %s #%d: %.0f valid tokens/s, %.1f microbatches per window, peak %.1f MiB"
                % (name, variant, r + 1, s["tokens_per_second"], s["mean_microbatches"], s["peak_bytes"] / MIB))
    cli, cli_params, py_scripted = cli_side(name, cfg, a, start, seqs, targets, plan, scratch)
    _, filled = train_run(plan, start, seqs, targets, a, None, packing="fill")
    update = max(float((p.detach() - cli_params[k].detach()).abs().max()) for k, p in filled.named_parameters())
    med = {v: statistics.median(x["tokens_per_second"] for x in runs[v]) for v in runs}
    errors = [e for x in runs["packed"] for e in x["peak_errors"]]
    later = {v: [e for x in runs[v] for e in x["later_peak_errors"]] for v in ("packed", "fill")}
    run_errors = [(x["predicted_peak_bytes"] - x["peak_bytes"]) / x["peak_bytes"] for x in runs["packed"]]
    return {
        "setting": name, "model": cfg["model"], "distribution": cfg["distribution"], "targets": cfg["targets"],
        "budget": cfg["budget"], "windows": a.windows, "batch": a.batch, "plan_seconds": plan_seconds,
        "python_token_budget": plan.tokens["token_budget"], "cli_token_budget": cli["tokens"]["token_budget"],
        "python_torchscript_token_budget": py_scripted.tokens["token_budget"],
        "peak_ratio_same_windows": same_windows(plan, cli),
        "torchscript_peak_ratio_same_windows": same_windows(py_scripted, cli),
        "python_max_micro_batch": plan.max_micro_batch, "cli_max_micro_batch": cli["max_micro_batch"],
        "python_predicted_peak_bytes": plan.memory["predicted_peak_bytes"],
        "cli_predicted_peak_bytes": cli["memory"]["predicted_peak_bytes"],
        "budget_bytes": plan.memory["budget_bytes"],
        "median_tokens_per_second": med, "packed_vs_sorted": med["packed"] / med["sorted"],
        "packed_vs_fill": med["packed"] / med["fill"],
        "short_windows": short,
        "later_peak_errors": later,
        "over_budget_windows": {v: sum(p > plan.memory["budget_bytes"] for x in runs[v] for p, _ in x["window_peaks"])
                                for v in runs},
        "packed_peak_error_max_abs": max(abs(e) for e in errors) if errors else None,
        "packed_run_peak_errors": run_errors,
        "packed_peak_errors": errors,
        "max_peak_bytes": {v: max(x["peak_bytes"] for x in runs[v]) for v in runs},
        "oom_recoveries": {v: sum(x["oom_recoveries"] for x in runs[v]) for v in runs},
        "max_param_difference_vs_cli": update,
        "runs": runs,
    }


def runs_of(s, variant):
    return ", ".join("%.0f" % x["tokens_per_second"] for x in s["runs"][variant])


def error_range(errors):
    if not errors:
        return "none predicted"
    return "%d of %d within 1%%, from %+.2f%% to %+.2f%%" % (sum(abs(e) <= 0.01 for e in errors), len(errors),
                                                           100 * min(errors), 100 * max(errors))


def lines_of(s):
    budget_gap = (s["python_token_budget"] - s["cli_token_budget"]) / s["cli_token_budget"]
    med = s["median_tokens_per_second"]
    return [
        "## %s" % s["setting"], "",
        "- model: %s; data: %d windows x %d sequences, %s; %s" % (s["model"], s["windows"], s["batch"],
                                                              s["distribution"], s["targets"]),
        "- budget %s; planned from Python in %.0f s" % (s["budget"], s["plan_seconds"]), "",
        "| | Python (`accumplan.plan` on the nn.Module) | CLI (`accumplan --batch-file` on the TorchScript export) |",
        "|---|---|---|",
        "| token budget (padded tokens) | %d | %d |" % (s["python_token_budget"], s["cli_token_budget"]),
        "| sample split at the longest length | %d | %d |" % (s["python_max_micro_batch"], s["cli_max_micro_batch"]),
        "| predicted peak MiB | %.1f | %.1f |" % (s["python_predicted_peak_bytes"] / MIB,
                                                 s["cli_predicted_peak_bytes"] / MIB),
        "",
        "| token budget, `accumplan.plan` on the TorchScript export | %d | |" % s["python_torchscript_token_budget"],
        "",
        "- token budget on one module (the TorchScript export), Python vs CLI: %+.2f%% (target: within 2%%)"
        % (100 * (s["python_torchscript_token_budget"] - s["cli_token_budget"]) / s["cli_token_budget"]),
        "- token budget, Python on the nn.Module vs CLI on its export: %+.2f%%; the peaks each measured at the same "
        "(b x T) windows, Python's / the CLI's: %s (on the export from Python: %s)"
        % (100 * budget_gap, ", ".join("%s %.3f" % kv for kv in s["peak_ratio_same_windows"].items()) or "none in common",
           ", ".join("%s %.3f" % kv for kv in s["torchscript_peak_ratio_same_windows"].items())),
        "- valid tokens/s, median of %d: packed (packing=\"time\", the default) %.0f (%s), fill %.0f (%s), sorted %.0f "
        "(%s); packed / sorted **%.2f** (target >= %.2f), packed / fill **%.2f** (target >= 1)"
        % (len(s["runs"]["packed"]), med["packed"], runs_of(s, "packed"), med["fill"], runs_of(s, "fill"),
           med["sorted"], runs_of(s, "sorted"), s["packed_vs_sorted"], TARGETS["packed_vs_sorted"], s["packed_vs_fill"]),
        "- microbatches per window: packed %.1f (first repeat, by window: %s), fill %.1f, sorted %.1f"
        % (s["runs"]["packed"][0]["mean_microbatches"],
           " ".join(map(str, s["runs"]["packed"][0]["microbatches_per_window"])),
           s["runs"]["fill"][0]["mean_microbatches"], s["runs"]["sorted"][0]["mean_microbatches"]),
        "- every window after each run's first, measured peak against the prediction for what was packed (target "
        "within 1%%): packed %s; fill %s; windows over the %.1f MiB budget: packed %d, fill %d, sorted %d"
        % (error_range(s["later_peak_errors"]["packed"]), error_range(s["later_peak_errors"]["fill"]),
           s["budget_bytes"] / MIB, s["over_budget_windows"]["packed"], s["over_budget_windows"]["fill"],
           s["over_budget_windows"]["sorted"]),
        "- each packed run's peak against the plan's prediction for what it packed (the highest of each over its "
        "windows, as `accumplan run` reports them; positive = conservative; target within 1%%): %s; highest peak "
        "%.1f MiB of the %.1f MiB budget; sorted's highest %.1f MiB"
        % (", ".join("%+.2f%%" % (100 * e) for e in s["packed_run_peak_errors"]), s["max_peak_bytes"]["packed"] / MIB,
           s["budget_bytes"] / MIB, s["max_peak_bytes"]["sorted"] / MIB),
        "- window by window (%d windows): within 1%% in %d; largest error %.2f%% (%s)"
        % (len(s["packed_peak_errors"]), sum(abs(e) <= 0.01 for e in s["packed_peak_errors"]),
           100 * s["packed_peak_error_max_abs"], "; ".join(
               "%.1f MiB measured, %.1f predicted" % (m / MIB, p / MIB) for x in s["runs"]["packed"]
               for m, p in x["window_peaks"] if p and abs(p - m) > 0.01 * m)),
        "- windows of only the shortest sequences (one microbatch each, planned on the same sample at a batch that "
        "holds them; token budget %d), measured peak against the prediction (target within 2%%): %s"
        % (s["short_windows"]["token_budget"], ", ".join(
            "%d x %d tokens %.1f MiB measured, %.1f predicted (%+.2f%%)"
            % (r["micro_batch"], r["seq_len"], r["peak_bytes"] / MIB, r["predicted_peak_bytes"] / MIB,
               100 * (r["predicted_peak_bytes"] - r["peak_bytes"]) / r["peak_bytes"]) for r in s["short_windows"]["rows"])),
        "- OOM recoveries: packed %d, fill %d, sorted %d (target 0)"
        % (s["oom_recoveries"]["packed"], s["oom_recoveries"]["fill"], s["oom_recoveries"]["sorted"]),
        "- `accumplan run --packing fill` of the Python plan on the TorchScript export against `train_window(..., "
        "packing=\"fill\")` on the nn.Module, same data and start, after all %d windows: largest parameter "
        "difference %.2e (target 1e-6)"
        % (s["windows"], s["max_param_difference_vs_cli"]),
        "",
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setting", choices=("decoder", "tagger", "mixed", "all"), default="all")
    ap.add_argument("--accumplan", default=os.path.join(ROOT, "build", "accumplan"))
    ap.add_argument("--scratch", default=os.path.join(ROOT, "build", "tokens-python"))
    ap.add_argument("--out", default=os.path.join(HERE, "tokens_python.json"))
    ap.add_argument("--md", default=os.path.join(HERE, "TOKENS_PYTHON.md"))
    ap.add_argument("--windows", type=int, help="windows per setting (default: the setting's, 12 or 8)")
    ap.add_argument("--batch", type=int, help="sequences per window (default: the setting's, 32 or 64)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    t0 = time.time()
    names = ("mixed", "tagger", "decoder") if a.setting == "all" else (a.setting,)
    settings = [bench_setting(n, a) for n in names]
    command = " ".join(["build/venv/bin/python", "tests/bench/tokens_python.py"] + [shlex.quote(x) for x in sys.argv[1:]])
    out = {"schema": "accumplan.tokens_python", "schema_version": "1.0", "date": time.strftime("%Y-%m-%d"),
           "torch": torch.__version__, "threads": a.threads, "repeats": a.repeats, "command": command,
           "seconds": time.time() - t0, "settings": settings}
    write_json(out, a.out)
    lines = ["# Variable-length sequences planned and packed from Python", "",
             "- date %s, torch %s, %d CPU threads, %d interleaved repeats of packed, fill and sorted per setting in one "
             "process; the whole run took %.0f min" % (out["date"], out["torch"], a.threads, a.repeats,
                                                       out["seconds"] / 60),
             "- reproduce: `%s` (after building `accumplan` and installing the package)" % command,
             "- speed is valid tokens per second of window time (`WindowStats.seconds`), the median over repeats", ""]
    for s in settings:
        lines += lines_of(s)
    with open(a.md + ".tmp", "w") as f:
        f.write("\n".join(lines))
    os.replace(a.md + ".tmp", a.md)
    say("wrote %s and %s (%.0f s)" % (a.out, a.md, out["seconds"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
