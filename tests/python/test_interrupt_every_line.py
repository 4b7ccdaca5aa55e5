"""An interrupt (SIGINT, as Ctrl-C sends it) delivered at every line of accumplan.plan's restore
path leaves the model, the optimizer and the RNGs bitwise as they were and no counting allocator
installed.

How: a recording run traces (sys.settrace) every line executed from plan()'s call of the
put-back onwards, in accumplan's own files (the restore path: closing the meter, restoring the
snapshot, removing the handler). Then one plan() per distinct line of it, each sending SIGINT to
this process the first time that line is reached; every run must end in KeyboardInterrupt with the
state as before, and a plan() after all of them must work (a leftover counting allocator makes it
fail with "a cpu-counting memory probe is already installed").
"""
import inspect
import os
import signal
import sys
import unittest



import accumplan
from accumplan import measure

from test_plan_restores import LeavesNothingBehind, setup, state_of

PACKAGE_DIR = os.path.dirname(os.path.abspath(accumplan.__file__))


def put_back_line():
    """The line of accumplan.plan's measuring (measure._measured_plan) that calls the put-back (read
    from its source, not from the guard)."""
    lines, first = inspect.getsourcelines(measure._measured_plan)
    hits = [first + i for i, text in enumerate(lines) if "put_back(" in text and not text.strip().startswith("#")]
    assert len(hits) == 1, hits
    return hits[0]


class Tracer:
    """Arms when accumplan.plan's measuring (measure._measured_plan) reaches its put-back line; then,
    in accumplan's files, records each distinct (file, line) executed, or sends SIGINT at the first
    execution of ``target``."""

    def __init__(self, target=None):
        self.line = put_back_line()
        self.target, self.armed, self.seen, self.fired = target, False, [], False

    def __call__(self, frame, event, arg):
        code = frame.f_code
        if code in (measure.plan.__code__, measure._measured_plan.__code__) or (
                self.armed and code.co_filename.startswith(PACKAGE_DIR)):
            return self.local
        return None

    def local(self, frame, event, arg):
        if event != "line":
            return self.local
        if frame.f_code is measure._measured_plan.__code__ and frame.f_lineno == self.line:
            self.armed = True
        if self.armed:
            key = (frame.f_code.co_filename, frame.f_lineno)
            if key not in self.seen:
                self.seen.append(key)
                if key == self.target and not self.fired:
                    self.fired = True
                    os.kill(os.getpid(), signal.SIGINT)
        return self.local


def traced(tracer, fn):
    sys.settrace(tracer)
    try:
        return fn()
    finally:
        sys.settrace(None)


class InterruptAtEveryLine(LeavesNothingBehind):
    def run_plan(self, model, opt, x, y):
        # target_batch 2: the smallest search (two probe sizes and a confirmation), so each of the
        # runs below costs a fraction of a second.
        return accumplan.plan(model, (x,), y, target_batch=2, optimizer=opt, memory_budget="64MiB", progress=False)

    def test_an_interrupt_at_any_line_of_the_put_back_leaves_nothing_changed(self):
        model, opt, extra, x, y = setup()
        recording = Tracer()
        traced(recording, lambda: self.run_plan(model, opt, x, y))
        path = recording.seen
        self.assertGreater(len(path), 20, "the restore path was not traced: %s" % path)
        self.assertTrue(any(f.endswith("snapshot.py") for f, _ in path), path)
        for target in path:
            with self.subTest(line="%s:%d" % (os.path.basename(target[0]), target[1])):
                model, opt, extra, x, y = setup()
                before = state_of(model, opt, extra)
                tracer = Tracer(target)
                with self.assertRaises(KeyboardInterrupt):
                    traced(tracer, lambda: self.run_plan(model, opt, x, y))
                self.assertTrue(tracer.fired)
                self.assertSameState(before, state_of(model, opt, extra))
                self.assertIs(signal.getsignal(signal.SIGINT), signal.default_int_handler)
        model, opt, extra, x, y = setup()
        self.run_plan(model, opt, x, y)  # no probe left installed by any of the runs


class InterruptAtEveryLineCheckpointed(InterruptAtEveryLine):
    """The same with a checkpoint set searched with: l1 wrapped for the whole search, so
    the put-back also removes the wrap (RestoreGuard.also_undo), and an interrupt at any of its
    lines must leave no wrapped forward (state_of's own_forwards) and nothing else changed."""

    def run_plan(self, model, opt, x, y):
        return accumplan.plan(model, (x,), y, target_batch=2, optimizer=opt, memory_budget="64MiB", progress=False,
                              checkpointing=["l1"])


if __name__ == "__main__":
    unittest.main()
