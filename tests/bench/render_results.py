#!/usr/bin/python3
"""tests/bench/render_results.py — results.json from the harness → RESULTS.md tables.

What it is: formatting only; every number comes from the JSON. Headline figures (mean and max
prediction error, minimum utilisation, accumplan's search cost as ratios to each peer) are
computed here from the rows.
Usage: render_results.py results.json RESULTS.md
"""
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys


def mib(b):
    return f"{b / 2**20:.0f}"


def margin(a):
    m = a.get("margin")
    if not m:
        return "n/a"
    parts = [f"{a['margin_bytes'] / 2**10:.0f} KiB"]
    if m.get("measured"):
        parts.append("measured")
    return " ".join(parts)


def windows(a):
    """Trial windows in order: 'b' for a window [b, b], '[T]' for one microbatch, '!' when it failed."""
    out = []
    for t in a.get("trial_sizes", []):
        w = t["window"]
        s = f"[{w[0]}]" if len(w) == 1 else str(w[0])
        out.append(s + ("" if t["fit"] else "!"))
    return ",".join(out)


def long_run(x):
    lr = x.get("long_run")
    if not lr:
        return "n/a"
    return f"{lr['windows']} × {lr['microbatch_sizes']} / {lr['oom_recoveries']}"


def machine_facts():
    """The short commit of HEAD and the CPU's model name, each "unknown" when it cannot be read."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = "unknown"
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return commit, cpu


def header_lines(r, rows):
    """The title, the machine, the run's settings and its notes, and the paragraph saying what is measured."""
    commit, cpu = machine_facts()
    out = []
    out.append("# accumplan benchmark results\n")
    out.append(f"- machine: {platform.machine()}, {os.cpu_count()} cores ({cpu}), OMP threads {r['threads']}")
    out.append(f"- date: {datetime.date.today().isoformat()}, commit {commit}, build: {r['build']}")
    capped = sorted({(x["model"], x["target_batch"]) for x in rows if x.get("target_batch", r["target_batch"]) != r["target_batch"]})
    caps = "".join(f"; {m} capped at {t}" for m, t in capped)
    out.append(f"- per-rank target batch (caps every search) {r['target_batch']}{caps}; accumplan headroom {r['headroom']}; wall {r['wall_seconds']:.0f} s")
    out.append("- reproduce: `bash scripts/bench.sh` (exports the models with Debian's PyTorch, builds, runs, renders this file)")
    for note in r.get("notes", []):  # set by hand when rows of one file come from more than one run
        out.append(f"- note: {note}")
    out.append("")
    out.append("Every trial of every strategy is the same real work on the CPU device with the budget enforced by the")
    out.append("counting allocator: an executor window of two accumulated microbatches and its optimizer step, the")
    out.append("window `accumplan run` trains with. *Trials* count those; *steps* count each peer's own steps (Lightning")
    out.append("runs 3 per trial, the others 1). Prediction error is (predicted − run peak) / run peak, where the run")
    out.append("peak is what `accumplan run` of the plan reached under the same budget, in its own process (positive =")
    out.append("conservative); utilisation is the largest microbatch the plan allows (`max_micro_batch`, what the")
    out.append("search found) over the true largest that fits; *split* is the balanced split's largest microbatch over")
    out.append("the true largest (the plan uses the fewest microbatches, k = ceil(T / max), split evenly: 512 samples")
    out.append("with a maximum of 46 are 12 microbatches of 43 rather than 11 of 46 and one of 6); *k / best k*")
    out.append("compares the plan's accumulation count with ceil(T / true max). The long run trains the plan's")
    out.append("largest microbatch for 50 windows (each two microbatches of it, then the optimizer step) with")
    out.append("`accumplan run` under the same budget: windows × sizes / OOM recoveries.\n")
    return out


def headline_lines(r, rows):
    """The headline: prediction error, utilisation, split, long runs, trials and the headroom-0 plans."""
    out = []
    errors = [x["truth"]["prediction_error_percent"] for x in rows if x["truth"]["prediction_error_percent"] is not None]
    utils = [x["truth"]["utilisation"] for x in rows]
    out.append("## Headline\n")
    if errors:
        out.append(f"- prediction error at the planned microbatch: mean {statistics.mean(abs(e) for e in errors):.2f}%, "
                   f"max {max(abs(e) for e in errors):.2f}% (signed range {min(errors):+.2f}% .. {max(errors):+.2f}%)")
    out.append(f"- utilisation (the plan's largest microbatch / the true largest): min {min(utils):.2f}, mean {statistics.mean(utils):.2f} "
               f"with --headroom {r['headroom']}")
    split = [x["truth"]["utilisation_split"] for x in rows if "utilisation_split" in x["truth"]]
    if split:
        best = sum(1 for x in rows if x["accumplan"].get("accumulation_steps") == x["truth"].get("best_accumulation_steps"))
        out.append(f"- the balanced split's largest microbatch over the true largest: min {min(split):.2f}, mean "
                   f"{statistics.mean(split):.2f}; the plan's accumulation count is the fewest possible in {best} of {len(rows)} rows")
    lrs = [x["long_run"] for x in rows if x.get("long_run")]
    if lrs:
        out.append(f"- long runs: {sum(l['oom_recoveries'] for l in lrs)} OOM recoveries in {sum(l['windows'] for l in lrs)} "
                   f"windows of {len(lrs)} plans' largest microbatch")
    trials = [x["accumplan"]["trials"] for x in rows]
    failed = [x["accumplan"]["ooms"] for x in rows]
    out.append(f"- accumplan's trials per plan: mean {statistics.mean(trials):.2f}, max {max(trials)}; failed trials per "
               f"row: max {max(failed)}, total {sum(failed)}")
    u0 = [x["truth"].get("utilisation_headroom0") for x in rows if "utilisation_headroom0" in x["truth"]]
    if u0:
        extra = sum(x["accumplan_headroom0"]["extra_trials"] for x in rows)
        o0 = sum(x["accumplan_headroom0"]["ooms"] for x in rows)
        out.append(f"- the same profiles planned with headroom 0: utilisation min {min(u0):.2f}, mean {statistics.mean(u0):.2f}, "
                   f"confirmed by {extra} extra trials ({o0} of them OOM)")
    return out


def peer_ratio_lines(rows):
    """The headline's table of accumplan's search cost as ratios to each peer's, summed over the rows."""
    peers = [p["strategy"] for p in rows[0]["peers"]]
    out = []
    out.append("- accumplan's search cost relative to each peer (sum over all rows; < 1 means accumplan is cheaper):\n")
    out.append("| peer | trials ratio | seconds ratio | OOMs hit by peer | rows where the peer found a larger microbatch |")
    out.append("|---|---|---|---|---|")
    a_trials = sum(x["accumplan"]["trials"] for x in rows)
    a_secs = sum(x["accumplan"]["seconds"] for x in rows)
    for name in peers:
        ps = [next(p for p in x["peers"] if p["strategy"] == name) for x in rows]
        larger = sum(1 for x, p in zip(rows, ps) if p["micro_batch"] > x["accumplan"]["max_micro_batch"])
        out.append(f"| {name} | {a_trials / max(1, sum(p['trials'] for p in ps)):.2f} | "
                   f"{a_secs / max(1e-9, sum(p['seconds'] for p in ps)):.2f} | {sum(p['ooms'] for p in ps)} | {larger} |")
    out.append("")
    return out


def prediction_lines(rows):
    """The table of every row's plan, prediction, run peak, utilisation, long run and search cost."""
    out = []
    out.append("## Prediction and utilisation\n")
    out.append("| model | budget MiB | persistent MiB | windows run | planned (max) | true max | k / best k | margin | predicted MiB | run peak MiB | error % | run OOMs | utilisation | split | long run | trials | seconds |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for x in rows:
        a, t = x["accumplan"], x["truth"]
        err = t["prediction_error_percent"]
        out.append(f"| {x['model']} | {mib(x['budget_bytes'])} | {mib(x['persistent_bytes'])} | {windows(a)} | "
                   f"{a['micro_batch']} ({a['max_micro_batch']}) | {t['max_micro_batch']} | {a.get('accumulation_steps', 'n/a')} / {t.get('best_accumulation_steps', 'n/a')} | "
                   f"{margin(a)} | {mib(a['predicted_peak_bytes'])} | "
                   f"{mib(t['run_peak_bytes'])} | {'n/a' if err is None else f'{err:+.2f}'} | {x['run']['oom_recoveries']} | {t['utilisation']:.2f} | "
                   f"{t.get('utilisation_split', float('nan')):.2f} | {long_run(x)} | {a['trials']} | {a['seconds']:.1f} |")
    out.append("")
    return out


def search_cost_lines(r, rows):
    """The table of each row's search by accumplan and by every peer, then the rows that failed."""
    peers = [p["strategy"] for p in rows[0]["peers"]]
    out = []
    out.append("## Search cost against the peers\n")
    out.append("Each cell: microbatch found / trials / OOMs / seconds.\n")
    out.append("| model | budget MiB | true max | accumplan | " + " | ".join(peers) + " |")
    out.append("|---|---|---|---|" + "---|" * len(peers))
    for x in rows:
        a = x["accumplan"]
        cells = [f"{a['max_micro_batch']} / {a['trials']} / {a['ooms']} / {a['seconds']:.1f}"]
        for p in x["peers"]:
            cells.append(f"{p['micro_batch']} / {p['trials']} / {p['ooms']} / {p['seconds']:.1f}")
        out.append(f"| {x['model']} | {mib(x['budget_bytes'])} | {x['truth']['max_micro_batch']} | " + " | ".join(cells) + " |")
    out.append("")
    out.append("accumplan's OOMs are its trials that did not fit (a probe size over the budget, or a confirmation that")
    out.append("failed and was bisected); every trial is listed in `results.json`.\n")
    if r.get("failures"):
        out.append("## Rows that failed\n")
        for f in r["failures"]:
            out.append(f"- {f['model']} @ {f['budget']}: {f['error']}")
        out.append("")
    return out


def overhead_lines(r):
    """The table of Executor::step's time against a hand-written accumulation loop."""
    out = []
    out.append("## Executor overhead\n")
    out.append("Executor::step against a hand-written LibTorch accumulation loop on identical model copies and windows")
    out.append("(4 microbatches of 4), interleaved ABBA per round; ratio = executor / hand loop.\n")
    out.append("| model | rounds | ratio median | min | max | executor s/window (median) | hand loop s/window (median) |")
    out.append("|---|---|---|---|---|---|---|")
    for o in r["overhead"]:
        out.append(f"| {o['model']} | {o['rounds']} | {o['ratio_median']:.3f} | {o['ratio_min']:.3f} | {o['ratio_max']:.3f} | "
                   f"{statistics.median(o['executor_seconds']):.3f} | {statistics.median(o['hand_loop_seconds']):.3f} |")
    out.append("")
    return out


def main(src, dst):
    """Reads the harness's JSON at `src` and writes the Markdown tables to `dst` (through dst.tmp)."""
    r = json.load(open(src))
    rows = r["rows"]
    out = header_lines(r, rows)
    out += headline_lines(r, rows)
    out += peer_ratio_lines(rows)
    out += prediction_lines(rows)
    out += search_cost_lines(r, rows)
    out += overhead_lines(r)
    open(dst + ".tmp", "w").write("\n".join(out) + "\n")
    os.replace(dst + ".tmp", dst)

if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
