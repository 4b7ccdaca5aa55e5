"""The Python loop and `accumplan run` train the same TorchScript model on the same data with the
same plan (made by `accumplan` itself) and end with the same parameters.

Uses the built executable: $ACCUMPLAN_BIN (scripts/test.sh sets it; then a missing binary is a
failure), else build/accumplan (skipped when absent)."""
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import unittest
import warnings

import torch

from helpers import ROOT, Classifier, FailingAt, classifier_data, make_plan, params_of, token_data

import accumplan

BIN = os.environ.get("ACCUMPLAN_BIN") or os.path.join(ROOT, "build", "accumplan")


class TokenLM(torch.nn.Module):
    """int64[B,6] -> logits [B,6,5] (a plain tensor, which every accumplan release accepts)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.emb = torch.nn.Embedding(10, 6)
        self.out = torch.nn.Linear(6, 5)

    def forward(self, tokens):
        return self.out(torch.tanh(self.emb(tokens)))


class WideClassifier(torch.nn.Module):
    """float32[B,8] -> [B,4], whose activations (194 KiB a sample) outweigh its weights (27 KiB), so
    an enforced budget between 5 and 6 samples fails a first microbatch of 6 and nothing smaller."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.a = torch.nn.Linear(8, 512)
        self.b = torch.nn.Linear(512, 4)

    def forward(self, x):
        h = torch.tanh(self.a(x)).repeat(1, 32)
        return self.b(torch.tanh(h).reshape(h.shape[0], 32, 512).sum(1))


class WideTokenLM(torch.nn.Module):
    """int64[B,6] -> logits [B,6,5], activations well above its weights, per-token targets."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(6)
        self.emb = torch.nn.Embedding(10, 64)
        self.out = torch.nn.Linear(2048, 5)

    def forward(self, tokens):
        h = torch.tanh(self.emb(tokens)).repeat(1, 1, 32)
        return self.out(torch.tanh(h))


def run(args, **kw):
    p = subprocess.run([BIN] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300, **kw)
    if p.returncode != 0:
        raise AssertionError("accumplan %s exited %d:\n%s" % (" ".join(args), p.returncode, p.stderr.decode()))
    return p


@unittest.skipUnless(os.access(BIN, os.X_OK) or "ACCUMPLAN_BIN" in os.environ,
                     "no accumplan binary at %s (build it, or set ACCUMPLAN_BIN)" % BIN)
class SameAsAccumplanRun(unittest.TestCase):
    def compare(self, model, x, y, specs, steps):
        with tempfile.TemporaryDirectory() as d:
            m, data, plan_path, out = (os.path.join(d, n) for n in ("m.pt", "data.pt", "plan.json", "out.pt"))
            torch.jit.save(torch.jit.script(model), m)
            torch.save([x, y], data)
            run(["--model", m, "--target-batch", "16", *specs, "--device", "cpu", "--memory-budget", "256MiB",
                 "--optimizer", "sgd", "--lr", "0.5", "--max-micro-batch", "6", "--threads", "1", "--out", plan_path])
            plan = accumplan.load_plan(plan_path, model=m)
            self.assertEqual(plan.microbatch_sizes, [6, 5, 5])  # uneven, from the real planner
            run(["run", "--plan", plan_path, "--model", m, "--data", data, "--steps", str(steps), "--save", out,
                 "--threads", "1"] if self._threads_flag() else
                ["run", "--plan", plan_path, "--model", m, "--data", data, "--steps", str(steps), "--save", out])

            ours = torch.jit.load(m)
            opt = torch.optim.SGD(ours.parameters(), lr=plan.setup["lr"])
            n = x.shape[0]
            windows = 0
            for s in range(0, n, plan.per_rank_batch):
                if windows == steps:
                    break
                plan.train_window(ours, opt, (x[s:s + plan.per_rank_batch],), y[s:s + plan.per_rank_batch])
                windows += 1
            theirs = torch.jit.load(out)
            got, want = params_of(ours), params_of(theirs)
            self.assertEqual(len(got), len(want))
            moved = False
            for g, w, w0 in zip(got, want, params_of(torch.jit.load(m))):
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
                moved = moved or not torch.allclose(w, w0)
            self.assertTrue(moved, "accumplan run did not change the parameters")

    def _threads_flag(self):
        if not hasattr(SameAsAccumplanRun, "_has_threads"):
            p = subprocess.run([BIN, "run", "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            SameAsAccumplanRun._has_threads = b"--threads" in p.stdout
        return SameAsAccumplanRun._has_threads

    def test_classifier_uneven_microbatches_and_a_short_last_window(self):
        x, y = classifier_data(40)  # windows of 16, 16 and a short 8
        self.compare(Classifier(), x, y, ["--input", "float32[B,8]", "--target", "int64[B]:4"], steps=3)

    def test_the_exported_torchrun_line_trains_two_ranks_like_one_process(self):
        # `accumplan export --to torchrun` as pasted (plus --data/--steps/--save and a free port),
        # launched by torchrun: 2 gloo ranks of accumplan run.
        with tempfile.TemporaryDirectory() as d:
            m, data, plan_path, out = (os.path.join(d, n) for n in ("m.pt", "data.pt", "plan.json", "out.pt"))
            torch.jit.save(torch.jit.script(Classifier()), m)
            x, y = classifier_data(32)
            torch.save([x, y], data)
            run(["--model", m, "--target-batch", "16", "--world-size", "2", "--input", "float32[B,8]", "--target",
                 "int64[B]:4", "--device", "cpu", "--memory-budget", "256MiB", "--optimizer", "sgd", "--lr", "0.5",
                 "--max-micro-batch", "3", "--threads", "1", "--out", plan_path])
            line = [l for l in run(["export", "--plan", plan_path, "--to", "torchrun", "--binary", BIN]).stdout.decode()
                    .splitlines() if l and not l.startswith("#")]
            self.assertEqual(len(line), 1)
            argv = shlex.split(line[0])
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            # `torchrun` is the launcher of the torch under test (python -m torch.distributed.run), not
            # whichever one PATH finds first.
            self.assertEqual(argv[0], "torchrun")
            argv = [sys.executable, "-m", "torch.distributed.run", "--master_port=%d" % port] + argv[1:] + \
                ["--data", data, "--steps", "2", "--save", out]
            p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
            self.assertEqual(p.returncode, 0, p.stdout.decode())

            ref = torch.jit.load(m)
            opt = torch.optim.SGD(ref.parameters(), lr=0.5)
            plan = make_plan([6, 5, 5])  # one process, the same global windows of 16
            for s in (0, 16):
                plan.train_window(ref, opt, (x[s:s + 16],), y[s:s + 16])
            for g, w in zip(params_of(torch.jit.load(out)), params_of(ref)):
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)

    def test_a_batchnorm1d_model_is_planned_by_the_cli_and_from_python(self):
        # BatchNorm1d in training mode refuses a batch of one: the persistent step (the first
        # window either tool runs) is two samples, the same in both (kPersistentWindowSamples).
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 10))
        with tempfile.TemporaryDirectory() as d:
            m, out = os.path.join(d, "bn1d.pt"), os.path.join(d, "plan.json")
            torch.jit.save(torch.jit.script(model), m)
            run(["--model", m, "--target-batch", "64", "--input", "float32[B,16]", "--target", "int64[B]:10",
                 "--device", "cpu", "--memory-budget", "64MiB", "--out", out, "--progress", "none"])
            cli = accumplan.load_plan(out)
        x, y = torch.randn(8, 16), torch.randint(0, 10, (8,))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # BatchNorm1d is batch-dependent, and said so
            py = accumplan.plan(model, (x,), y, target_batch=64, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                memory_budget="64MiB", progress=False)
        for plan in (cli, py):
            self.assertEqual(plan.profile["trials"][0]["window"], [accumplan._core.PERSISTENT_WINDOW_SAMPLES])
            self.assertEqual(sum(plan.microbatch_sizes), 64)
            self.assertEqual(plan.model["batch_dependent_layers"], ["1 (BatchNorm1d)"])

    def test_the_cli_and_python_plan_the_same_two_rank_window_alike(self):
        # One TorchScript module whose gradients and Adam state weigh about as much as its
        # microbatches, planned for two ranks by both front ends under one budget, whole and sharded:
        # the same window, and every rank's predicted peak within 2% of the other front end's. (The
        # same module run eager keeps fewer activations than TorchScript's optimizing executor runs
        # it with, 10,245 bytes a sample against 17,448 here: Python plans the module it is given.)
        torch.manual_seed(0)
        eager = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256),
                                    torch.nn.ReLU(), torch.nn.Linear(256, 10))
        x, y = torch.randn(16, 256), torch.randint(0, 10, (16,))
        with tempfile.TemporaryDirectory() as d:
            m = os.path.join(d, "mlp.pt")
            torch.jit.save(torch.jit.script(eager), m)
            model = torch.jit.load(m)
            for shard in ("off", "optimizer"):
                with self.subTest(shard=shard):
                    out = os.path.join(d, "plan-%s.json" % shard)
                    run(["--model", m, "--target-batch", "2048", "--world-size", "2", "--shard", shard, "--input",
                         "float32[B,256]", "--target", "int64[B]:10", "--optimizer", "adam", "--device", "cpu",
                         "--memory-budget", "20MiB", "--threads", "1", "--no-eval", "--out", out, "--progress", "none"])
                    cli = accumplan.load_plan(out)
                    py = accumplan.plan(model, (x,), y, target_batch=2048, world_size=2, shard=shard,
                                        optimizer=torch.optim.Adam(model.parameters()), memory_budget="20MiB",
                                        progress=False, eval=False)
                    self.assertGreater(cli.accumulation_steps, 1)  # the budget binds
                    self.assertLessEqual(abs(py.max_micro_batch - cli.max_micro_batch), 0.02 * cli.max_micro_batch,
                                         (py.microbatch_sizes, cli.microbatch_sizes))
                    for r in range(2):
                        ours, theirs = (accumplan._core.predicted_peak_of_rank(p._core, r) for p in (py, cli))
                        self.assertLessEqual(abs(ours - theirs), 0.02 * theirs, "rank %d: %d vs %d" % (r, ours, theirs))

    def test_an_out_of_memory_replayed_by_accumplan_run_and_by_train_window_updates_bit_for_bit_alike(self):
        # One window algorithm: `accumplan run` under an enforced budget between the peaks at 5 and 6
        # samples runs out of memory in window 0's first microbatch of 6; train_window gets the same
        # out-of-memory injected there. Both re-plan alike, replay, and end with identical parameters.
        cases = (("samples", WideClassifier(), classifier_data(48), ["--input", "float32[B,8]", "--target", "int64[B]:4"]),
                 ("tokens", WideTokenLM(), token_data(48), ["--input", "int64[B,6]:10", "--target", "int64[B,6]:5"]))
        for name, model, (x, y), specs in cases:
            with self.subTest(loss=name), tempfile.TemporaryDirectory() as d:
                m, data, plan_path, out = (os.path.join(d, n) for n in ("m.pt", "data.pt", "plan.json", "out.pt"))
                torch.jit.save(torch.jit.script(model), m)
                torch.save([x, y], data)
                run(["--model", m, "--target-batch", "16", *specs, "--device", "cpu", "--memory-budget", "256MiB",
                     "--optimizer", "sgd", "--lr", "0.05", "--max-micro-batch", "6", "--threads", "1", "--out", plan_path,
                     "--progress", "none"])
                plan = accumplan.load_plan(plan_path, model=m)
                self.assertEqual(plan.microbatch_sizes, [6, 5, 5])
                budget = int(plan.fit["intercept_bytes"] + 5.5 * plan.fit["slope_bytes_per_sample"])
                said = run(["run", "--plan", plan_path, "--model", m, "--data", data, "--steps", "3", "--save", out,
                            "--threads", "1", "--memory-budget", str(budget), "--progress", "none"]).stderr.decode()
                self.assertEqual(said.count("out of memory in window 0 at microbatch 1 of 3 (size 6)"), 1, said)
                self.assertEqual(said.count("out of memory"), 1, said)

                ours = torch.jit.load(m)
                opt = torch.optim.SGD(ours.parameters(), lr=plan.setup["lr"])
                failing = FailingAt(ours, position=0)
                notes = []
                threads = torch.get_num_threads()
                torch.set_num_threads(1)  # as `--threads 1`: a kernel split over two threads may round otherwise
                try:
                    for s in range(0, 48, 16):
                        stats = plan.train_window(failing, opt, (x[s:s + 16],), y[s:s + 16], on_oom=notes.append)
                finally:
                    torch.set_num_threads(threads)
                self.assertEqual(len(notes), 1)
                self.assertIn("out of memory in window 0 at microbatch 1 of 3 (size 6)", notes[0])
                self.assertEqual(stats.microbatch_sizes, plan.microbatch_sizes)
                self.assertLess(max(plan.microbatch_sizes), 6)
                theirs = params_of(torch.jit.load(out))
                for g, w, w0 in zip(params_of(ours), theirs, params_of(torch.jit.load(m))):
                    self.assertTrue(torch.equal(g, w), "%s: max |difference| %g" % (name, (g - w).abs().max()))
                    self.assertFalse(torch.equal(w, w0))

    def test_token_model_weighted_by_valid_tokens(self):
        x, y = token_data(40)  # ignored positions differ per microbatch
        self.compare(TokenLM(), x, y, ["--input", "int64[B,6]:10", "--target", "int64[B,6]:5"], steps=3)


if __name__ == "__main__":
    unittest.main()
