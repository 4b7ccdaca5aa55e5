#!/usr/bin/env python3
"""gpu_probes.py — adds a GPU run's probe sequences to the set the planner's tests replay.

What it is: the step between a lease and CI. gpu_bench.py's results-gpu.json keeps, per model and
budget, the CLI plan's profile points (allocated and reserved peaks), its persistent memory and the
largest window plain PyTorch fitted in the same run. This script copies every such row that has
all three into a copy of tests/bench/gpu-probes.json (a sequence already there, by its source, is
replaced, not repeated), which tests/planner/test_solver.cpp replays: each must plan within
[0.97, 1.0] of its truth. The write is atomic; a bad input changes nothing.
What it is not: a planner. It reads JSON and writes JSON; the replay is the C++ test's.

Run (after a lease, in the repository root):
    python3 tests/bench/gpu_probes.py RETURNED/results-gpu.json --into tests/bench/gpu-probes.json
scripts/gpu-check.sh runs it into its output folder, so the lease returns gpu-probes.json ready to
copy. --rehearsal-ok accepts a rehearsal's results (CI's plumbing check); never commit those.
"""
import argparse
import json
import os
import sys
import tempfile

SCHEMA = "accumplan-gpu-probes"
VERSION = 1
POINT_FIELDS = ("micro_batch", "peak_bytes", "reserved_peak_bytes")
PERSISTENT_FIELDS = ("weights_bytes", "gradients_bytes", "optimizer_state_bytes")
HERE = os.path.dirname(os.path.abspath(__file__))


def fail(message):
    print("gpu_probes: " + message, file=sys.stderr)
    sys.exit(2)


def load(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        fail("cannot read %s '%s': %s" % (what, path, e))


def sequence_of(row, results):
    """The replayable sequence of one results-gpu.json row, or None with why not."""
    plan, truth = row.get("plan") or {}, row.get("truth") or {}
    points = [p for p in plan.get("points") or [] if p.get("micro_batch") and p.get("peak_bytes")]
    persistent = plan.get("persistent") or {}
    if row.get("status") != "ok" or row.get("kind") != "main":
        return None, "not a planned main row"
    if len({p["micro_batch"] for p in points}) < 2:
        return None, "fewer than two probe sizes"
    if not all(isinstance(persistent.get(k), int) for k in PERSISTENT_FIELDS):
        return None, "no persistent memory in the row (a results-gpu.json older than this script)"
    if not isinstance(truth.get("true_max"), int):
        return None, "no truth"
    source = "%s, %s, %s: %s at %s" % (results.get("device"), results.get("started"), results.get("accumplan"),
                                                 row.get("model"), row.get("budget"))
    return {"source": source, "device": results.get("device"), "model": row.get("model"),
            "budget_bytes": row.get("budget_bytes"),
            "target_batch": row.get("target_batch"), "true_max": truth["true_max"],
            "persistent": {k: persistent[k] for k in PERSISTENT_FIELDS},
            "points": [{k: p.get(k) for k in POINT_FIELDS} for p in points]}, None


def write_atomically(path, doc):
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".gpu-probes-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main():
    ap = argparse.ArgumentParser(description="Add a GPU run's probe sequences to the replayed set.")
    ap.add_argument("results", help="a results-gpu.json from scripts/gpu-check.sh")
    ap.add_argument("--base", default=os.path.join(HERE, "gpu-probes.json"),
                    help="the set to start from (default: tests/bench/gpu-probes.json)")
    ap.add_argument("--into", required=True, help="where to write the set with the run's sequences added")
    ap.add_argument("--rehearsal-ok", action="store_true", help="accept a rehearsal's results (CPU plumbing only)")
    args = ap.parse_args()
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.into))):
        fail("--into '%s': its folder does not exist" % args.into)
    results = load(args.results, "results")
    if results.get("rehearsal") and not args.rehearsal_ok:
        fail("'%s' is a rehearsal's (CPU, simulated out-of-memory): its sequences are not a GPU's; "
             "pass --rehearsal-ok only to check the plumbing" % args.results)
    base = load(args.base, "the base set")
    if base.get("schema") != SCHEMA or base.get("version") != VERSION:
        fail("'%s' is not a %s file of version %d" % (args.base, SCHEMA, VERSION))
    added = []
    for row in results.get("rows") or []:
        seq, why = sequence_of(row, results)
        label = "%s at %s" % (row.get("model"), row.get("budget"))
        if seq is None:
            print("gpu_probes: skipped %s: %s" % (label, why), file=sys.stderr)
            continue
        base["sequences"] = [s for s in base["sequences"] if s.get("source") != seq["source"]] + [seq]
        added.append(label)
    write_atomically(args.into, base)
    print("gpu_probes: %d sequence(s) added (%s); %d in %s" % (len(added), ", ".join(added) or "none",
                                                                 len(base["sequences"]), args.into), file=sys.stderr)


if __name__ == "__main__":
    main()
