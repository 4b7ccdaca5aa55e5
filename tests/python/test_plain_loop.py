"""examples/python/plain_loop.py — a plan followed in plain PyTorch, with no accumplan import —
trains exactly as plan.train_window does: sample and per-token plans, uneven and short windows,
AdamW from the plan's setup, clipping on the combined gradient."""
import copy
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

import torch

from helpers import ROOT, Classifier, TinyLM, classifier_data, params_of, plan_doc, token_data

import accumplan

EXAMPLE = os.path.join(ROOT, "examples", "python", "plain_loop.py")
_spec = importlib.util.spec_from_file_location("plain_loop", EXAMPLE)
plain = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plain)

ATOL = 1e-6  # every parameter, after every window


def adamw_doc(sizes, max_grad_norm=0.05, **kw):
    """A plan for windows of ``sizes`` that states AdamW and clipping in its setup."""
    doc = plan_doc(sizes, **kw)
    doc["setup"].update(optimizer="adamw", lr=0.01, hyperparameters={"beta2": 0.99, "weight_decay": 0.05},
                        max_grad_norm=max_grad_norm)
    return accumplan.load_plan(doc).to_dict()  # as the C++ writer writes it


def by_train_window(doc, model, inputs, target, windows):
    """The model's parameters after accumplan's plan.train_window over ``windows`` (start, count)."""
    plan = accumplan.load_plan(doc)
    optimizer = plain.make_optimizer(model.parameters(), doc["setup"])
    for s, n in windows:
        plan.train_window(model, optimizer, [x[s:s + n] for x in inputs], target[s:s + n],
                          max_grad_norm=doc["setup"]["max_grad_norm"])
    return params_of(model)


def by_plain_loop(doc, model, inputs, target, windows):
    optimizer = plain.make_optimizer(model.parameters(), doc["setup"])
    for s, n in windows:
        plain.train_window(model, optimizer, doc, [x[s:s + n] for x in inputs], target[s:s + n], torch.device("cpu"))
    return params_of(model)


def by_weighted_means(doc, model, inputs, target, windows):
    """The naive rule for every plan: weight x each microbatch's mean
    loss (sizes as the plain loop cuts them). Right for samples, wrong for tokens."""
    optimizer = plain.make_optimizer(model.parameters(), doc["setup"])
    ii = doc["setup"]["ignore_index"]
    for s, n in windows:
        optimizer.zero_grad(set_to_none=True)
        start = s
        for m in plain.window_sizes(doc, n):
            out = model(*[x[start:start + m] for x in inputs])
            out = out["logits"] if isinstance(out, dict) else out
            mean = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), target[start:start + m].reshape(-1),
                                                     ignore_index=ii)
            (mean * m / n).backward()
            start += m
        torch.nn.utils.clip_grad_norm_(model.parameters(), doc["setup"]["max_grad_norm"])
        optimizer.step()
    return params_of(model)


def max_difference(a, b):
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


class WindowSizes(unittest.TestCase):
    def test_every_window_size_is_split_as_the_plans_reader_splits_it(self):
        for sizes, kw in (([4, 3, 3], {}), ([52, 51, 51, 51, 51], {}), ([6, 6], {"split": "uniform"}),
                          ([5, 5, 5, 5], {"split": "uniform"}), ([6, 6, 4], {"multiple_of": 2}),
                          ([9, 9, 6], {"multiple_of": 3, "split": "uniform"})):
            plan = accumplan.load_plan(plan_doc(sizes, **kw))
            for n in range(1, plan.per_rank_batch + 1):
                with self.subTest(sizes=sizes, samples=n, **kw):
                    self.assertEqual(plain.window_sizes(plan.raw, n), plan.window_sizes(n))

    def test_a_window_larger_than_the_per_rank_batch_is_refused(self):
        with self.assertRaisesRegex(ValueError, "1..10 samples"):
            plain.window_sizes(plan_doc([4, 3, 3]), 11)


class Training(unittest.TestCase):
    WINDOWS = ((0, 10), (10, 10), (20, 5))  # [4,3,3], [4,3,3], then a short window: [3,2]

    def check(self, make_model, inputs, target, doc, wrong_rule_differs):
        ref = by_train_window(doc, make_model(), inputs, target, self.WINDOWS)
        got = by_plain_loop(doc, make_model(), inputs, target, self.WINDOWS)
        for g, r in zip(got, ref):
            torch.testing.assert_close(g, r, rtol=0, atol=ATOL)
        moved = max_difference(ref, params_of(make_model()))
        self.assertGreater(moved, 100 * ATOL, "the windows must move the parameters for the comparison to mean anything")
        wrong = max_difference(by_weighted_means(doc, make_model(), inputs, target, self.WINDOWS), ref)
        if wrong_rule_differs:
            self.assertGreater(wrong, 100 * ATOL)
        else:
            self.assertLess(wrong, ATOL)

    def test_a_sample_plan_trains_as_train_window(self):
        x, y = classifier_data(25)
        doc = adamw_doc([4, 3, 3])
        self.assertEqual(plain.window_sizes(doc, 5), [3, 2])
        self.check(Classifier, (x,), y, doc, wrong_rule_differs=False)
        unclipped = dict(doc, setup=dict(doc["setup"], max_grad_norm=None))
        self.assertGreater(max_difference(by_plain_loop(unclipped, Classifier(), (x,), y, self.WINDOWS),
                                          by_plain_loop(doc, Classifier(), (x,), y, self.WINDOWS)), 100 * ATOL,
                           "setup.max_grad_norm must clip these windows")

    def test_a_per_token_plan_with_padding_trains_as_train_window(self):
        x, y = token_data(25)  # [25,6] tokens, [25,6] targets with -100 padding of 0..6 positions
        self.assertTrue(bool((y == -100).any()) and bool((y != -100).any()))
        doc = adamw_doc([4, 3, 3])
        self.assertTrue(plain.by_tokens(doc["setup"], y))
        self.check(TinyLM, (x,), y, doc, wrong_rule_differs=True)

    def test_another_ignore_index_from_the_setup_is_the_padding(self):
        x, y = token_data(25, ignore_index=7)
        doc = adamw_doc([4, 3, 3])
        doc["setup"]["ignore_index"] = 7
        ref = by_train_window(doc, TinyLM(), (x,), y, self.WINDOWS)
        got = by_plain_loop(doc, TinyLM(), (x,), y, self.WINDOWS)
        for g, r in zip(got, ref):
            torch.testing.assert_close(g, r, rtol=0, atol=ATOL)

    def test_a_bf16_plan_runs_its_forwards_under_bf16_autocast_as_train_window_does(self):
        x, y = token_data(25)
        doc = adamw_doc([4, 3, 3])
        doc["setup"]["amp"] = "bf16"
        plan = accumplan.load_plan(doc)
        ref_model, got_model = TinyLM(), TinyLM()
        ref_opt, got_opt = (plain.make_optimizer(m.parameters(), doc["setup"]) for m in (ref_model, got_model))
        for s, n in self.WINDOWS:
            plan.train_window(ref_model, ref_opt, (x[s:s + n],), y[s:s + n], autocast=torch.bfloat16,
                              max_grad_norm=doc["setup"]["max_grad_norm"])
            plain.train_window(got_model, got_opt, doc, [x[s:s + n]], y[s:s + n], torch.device("cpu"))
        for g, r in zip(params_of(got_model), params_of(ref_model)):
            torch.testing.assert_close(g, r, rtol=0, atol=ATOL)
        float32 = by_plain_loop(dict(doc, setup=dict(doc["setup"], amp="none")), TinyLM(), (x,), y, self.WINDOWS)
        self.assertGreater(max_difference(float32, params_of(got_model)), 100 * ATOL,
                           "bf16 forwards must differ from float32 ones for this test to see autocast")

    def test_a_window_without_valid_tokens_takes_no_step(self):
        model = TinyLM()
        before = params_of(model)
        doc = adamw_doc([4, 3, 3])
        x, _ = token_data(10)
        y = torch.full((10, 6), -100)
        loss = plain.train_window(model, plain.make_optimizer(model.parameters(), doc["setup"]), doc, [x], y,
                                  torch.device("cpu"))
        self.assertIsNone(loss)
        self.assertEqual(max_difference(before, params_of(model)), 0.0)


class Optimizer(unittest.TestCase):
    def test_the_optimizer_accumplan_plan_records_is_the_one_the_loop_builds(self):
        # What accumplan.plan records for a torch optimizer, read back by the plain loop: the same
        # param_groups values (flags of schema 1.6 included).
        x, y = classifier_data(8)
        for make in (lambda p: torch.optim.AdamW(p, lr=0.01, betas=(0.9, 0.99), weight_decay=0.05, amsgrad=True),
                     lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.5, nesterov=True),
                     lambda p: torch.optim.RMSprop(p, lr=0.001, alpha=0.9, momentum=0.2, centered=True),
                     lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.01)):
            model = Classifier()
            original = make(model.parameters())
            with self.subTest(optimizer=type(original).__name__):
                plan = accumplan.plan(model, (x,), y, target_batch=8, optimizer=original, progress=False)
                rebuilt = plain.make_optimizer(Classifier().parameters(), plan.setup)
                self.assertIs(type(rebuilt), type(original))
                want = {k: v for k, v in original.param_groups[0].items() if k != "params"}
                got = {k: v for k, v in rebuilt.param_groups[0].items() if k != "params"}
                self.assertEqual(got, want)

    def test_several_parameter_groups_are_refused_in_one_line(self):
        with self.assertRaisesRegex(ValueError, "2 parameter groups"):
            plain.make_optimizer(Classifier().parameters(),
                                 {"optimizer": "sgd", "lr": 0.1, "param_groups": [{"lr": 0.1}, {"lr": 0.01}]})


class Script(unittest.TestCase):
    def test_the_script_trains_as_train_window_without_importing_accumplan(self):
        with tempfile.TemporaryDirectory() as d:
            m, data, plan_path, out = (os.path.join(d, n) for n in ("m.pt", "data.pt", "plan.json", "out.pt"))
            torch.jit.save(torch.jit.script(TinyLM()), m)
            x, y = token_data(25)
            torch.save([x, y], data)
            doc = adamw_doc([4, 3, 3])
            with open(plan_path, "w") as f:
                json.dump(doc, f)
            # An `accumplan` that cannot be imported comes first on the path: the script must not need it.
            poison = os.path.join(d, "poison", "accumplan")
            os.makedirs(poison)
            with open(os.path.join(poison, "__init__.py"), "w") as f:
                f.write("raise ImportError('plain_loop.py imported accumplan')\n")
            env = dict(os.environ, WORLD_SIZE="1", PYTHONPATH=os.path.dirname(poison), OMP_NUM_THREADS="1")
            p = subprocess.run([sys.executable, EXAMPLE, "--plan", plan_path, "--model", m, "--data", data,
                                "--device", "cpu", "--save", out], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               timeout=120, env=env)
            log = p.stdout.decode()
            self.assertEqual(p.returncode, 0, log)
            self.assertIn("window 2: loss", log)
            self.assertIn("microbatches [3, 2]", log)
            ref = by_train_window(doc, torch.jit.load(m), (x,), y, Training.WINDOWS)
            for g, r in zip(params_of(torch.jit.load(out)), ref):
                torch.testing.assert_close(g, r, rtol=0, atol=ATOL)

    def test_two_gloo_ranks_train_as_one_process_over_the_global_window(self):
        import socket
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = str(sock.getsockname()[1])
        with tempfile.TemporaryDirectory() as d:
            m, data, plan_path, out = (os.path.join(d, n) for n in ("m.pt", "data.pt", "plan.json", "out.pt"))
            torch.jit.save(torch.jit.script(TinyLM()), m)
            x, y = token_data(25)
            torch.save([x, y], data)
            doc = adamw_doc([4, 3, 3], world_size=2)  # global windows of 20, then 5: 3 and 2 samples per rank
            with open(plan_path, "w") as f:
                json.dump(doc, f)
            env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS="1")
            procs = [subprocess.Popen([sys.executable, EXAMPLE, "--plan", plan_path, "--model", m, "--data", data,
                                       "--device", "cpu", "--save", out], stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
                     for r in (0, 1)]
            try:
                logs = [p.communicate(timeout=120)[0].decode() for p in procs]
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            self.assertEqual([p.returncode for p in procs], [0, 0], "\n".join(logs))
            # The same objective in one process: the mean over each global window of 20 (then 5).
            one = adamw_doc([7, 7, 6])
            ref = by_train_window(one, torch.jit.load(m), (x,), y, ((0, 20), (20, 5)))
            for g, r in zip(params_of(torch.jit.load(out)), ref):
                torch.testing.assert_close(g, r, rtol=0, atol=ATOL)

    def test_a_plan_with_windows_of_tokens_is_refused(self):
        doc = copy.deepcopy(plan_doc([4, 3, 3]))
        doc["tokens"] = {"token_budget": 64, "max_seq_len": 8, "longest_sequence_alone": 8, "target_tokens": 40}
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "plan.json")
            with open(path, "w") as f:
                json.dump(doc, f)
            with self.assertRaisesRegex(SystemExit, "target_tokens"):
                plain.read_plan(path)


if __name__ == "__main__":
    unittest.main()
