"""tests/python/run_tests.py — runs the Python suite's test modules in JOBS worker processes.

What it is: the runner scripts/test.sh uses. `python -m unittest discover` runs the
~23 modules one after the other on one core; here each of JOBS workers (default 2) imports torch
once and takes the next module from a queue, largest file first so the long ones do not end up
last. Every module's unittest output is printed whole when it ends, so lines never interleave;
the summary says how many tests ran, and the exit status is 1 when any failed.
What it is not: a test discovery of its own. The modules are tests/python/test_*.py, as
`unittest discover -s tests/python -t tests/python` finds them, and each is loaded by unittest.

    python tests/python/run_tests.py [-j JOBS] [MODULE ...]
"""
import argparse
import io
import json
import os
import selectors
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))


def worker():
    """Reads module names on stdin, one per line; answers each with one JSON line on stdout."""
    sys.path.insert(0, HERE)
    answers = sys.stdout
    sys.stdout = sys.stderr  # a test's print must not break the protocol
    for line in sys.stdin:
        name = line.strip()
        stream = io.StringIO()
        start = time.monotonic()
        try:
            suite = unittest.defaultTestLoader.loadTestsFromName(name)
            result = unittest.TextTestRunner(stream=stream, verbosity=1).run(suite)
            counts = {"ran": result.testsRun, "failed": len(result.failures) + len(result.errors),
                      "skipped": len(result.skipped)}
        except Exception as e:  # noqa: BLE001 - a module that does not import is a failure
            stream.write("%s: %s: %s\n" % (name, type(e).__name__, e))
            counts = {"ran": 0, "failed": 1, "skipped": 0}
        counts.update(module=name, seconds=time.monotonic() - start, output=stream.getvalue())
        answers.write(json.dumps(counts) + "\n")
        answers.flush()


def modules(names):
    if names:
        return names
    files = [f for f in os.listdir(HERE) if f.startswith("test_") and f.endswith(".py")]
    files.sort(key=lambda f: -os.path.getsize(os.path.join(HERE, f)))
    return [f[:-3] for f in files]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-j", "--jobs", type=int, default=int(os.environ.get("JOBS", "2")))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("module", nargs="*")
    args = parser.parse_args()
    if args.worker:
        return worker()
    queue = modules(args.module)
    start = time.monotonic()
    selector = selectors.DefaultSelector()
    for _ in range(max(1, min(args.jobs, len(queue)))):
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, bufsize=1)
        selector.register(proc.stdout, selectors.EVENT_READ, proc)
    total = {"ran": 0, "failed": 0, "skipped": 0}
    busy = 0
    for key in list(selector.get_map().values()):
        if queue:
            key.data.stdin.write(queue.pop(0) + "\n")
            busy += 1
    while busy:
        for key, _ in selector.select():
            proc, line = key.data, key.fileobj.readline()
            busy -= 1
            if not line:
                print("run_tests: a worker died (exit %s)" % proc.wait(), file=sys.stderr)
                selector.unregister(key.fileobj)
                total["failed"] += 1
                continue
            answer = json.loads(line)
            for k in total:
                total[k] += answer[k]
            print("%-28s %3d tests %6.1f s %s" % (answer["module"], answer["ran"], answer["seconds"],
                                                 "FAILED" if answer["failed"] else "ok"), flush=True)
            if answer["failed"]:
                print(answer["output"], flush=True)
            if queue:
                proc.stdin.write(queue.pop(0) + "\n")
                busy += 1
    for key in list(selector.get_map().values()):
        key.data.stdin.close()
        key.data.wait()
    print("Ran %d tests in %.1f s (%d skipped): %s" % (total["ran"], time.monotonic() - start, total["skipped"],
                                                      "FAILED (%d)" % total["failed"] if total["failed"] else "OK"))
    return 1 if total["failed"] or queue else 0


if __name__ == "__main__":
    sys.exit(main())
