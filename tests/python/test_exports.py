"""`accumplan export` outputs, checked by the real consumer where Debian ships one (torchrun's own
argument parser, torch's DataLoader, a YAML parser for LightningCLI configs) and by each trainer's
documented schema otherwise (DeepSpeed, Accelerate, Hugging Face TrainingArguments).

Uses $ACCUMPLAN_BIN, else the first accumplan built in build/, build-planner-only/."""
import contextlib
import io
import json
import os
import shlex
import subprocess
import tempfile
import unittest

import torch
from torch.distributed.run import get_args_parser

from helpers import ROOT

BIN = os.environ.get("ACCUMPLAN_BIN") or next(
    (p for p in (os.path.join(ROOT, d, "accumplan") for d in ("build", "build-planner-only")) if os.access(p, os.X_OK)),
    os.path.join(ROOT, "build", "accumplan"))
PROFILE = os.path.join(ROOT, "examples", "profiles", "builtin-convnet-cpu.profile.json")

# Documented names (DeepSpeed config-json, accelerate.Accelerator, transformers.TrainingArguments,
# lightning.Trainer / LightningCLI) this exporter may emit.
DEEPSPEED_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"}
ACCELERATOR_KWARGS = {"gradient_accumulation_steps"}
TRAINING_ARGUMENTS = {"per_device_train_batch_size", "gradient_accumulation_steps"}
LIGHTNING_CLI_SECTIONS = {"trainer", "model", "data", "seed_everything", "ckpt_path", "optimizer", "lr_scheduler"}
LIGHTNING_TRAINER_ARGS = {"accumulate_grad_batches", "devices", "num_nodes"}


def accumplan(*args, check=True):
    p = subprocess.run([BIN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    if check and p.returncode != 0:
        raise AssertionError("accumplan %s exited %d: %s" % (" ".join(args), p.returncode, p.stderr.decode()))
    return p


def code_lines(text):
    return [l for l in text.splitlines() if l.strip() and not l.lstrip().startswith("#")]


@unittest.skipUnless(os.access(BIN, os.X_OK) or "ACCUMPLAN_BIN" in os.environ, "no accumplan binary at %s" % BIN)
class Exports(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.plans = {}
        for name, args in (("uneven", ["--target-batch", "256", "--max-micro-batch", "60"]),  # 52,51,51,51,51
                           ("w2", ["--target-batch", "256", "--world-size", "2", "--max-micro-batch", "48"]),
                           ("p251", ["--target-batch", "251", "--max-micro-batch", "36"])):
            path = os.path.join(cls.tmp.name, name + ".json")
            accumplan("plan", "--profile", PROFILE, "--memory-budget", "1GiB", "--out", path, *args)
            cls.plans[name] = path

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def export(self, plan, to, *extra):
        return accumplan("export", "--plan", self.plans[plan], "--to", to, *extra).stdout.decode()

    def plan_json(self, plan):
        with open(self.plans[plan]) as f:
            return json.load(f)

    def test_torchrun_line_parses_with_this_torchs_own_parser(self):
        text = self.export("w2", "torchrun")
        lines = code_lines(text)
        self.assertEqual(len(lines), 1, text)
        argv = shlex.split(lines[0])
        self.assertEqual(argv[0], "torchrun")
        args = get_args_parser().parse_args(argv[1:])  # SystemExit on a spelling this torch rejects
        self.assertEqual((args.nnodes, args.nproc_per_node, args.no_python), ("1", "2", True))
        self.assertEqual(args.training_script, "accumplan")
        self.assertEqual(args.training_script_args[:3], ["run", "--plan", self.plans["w2"]])
        if int(torch.__version__.split(".")[0]) < 2:
            with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
                # what the export used to print: 1.13 rejects it
                get_args_parser().parse_args(["--nproc-per-node=2", "--no-python", "accumplan"])

    def test_deepspeed_config_satisfies_deepspeeds_batch_rule(self):
        plan = self.plan_json("w2")
        ds = json.loads(self.export("w2", "deepspeed"))
        self.assertLessEqual(set(ds) - {"accumplan"}, DEEPSPEED_KEYS)
        # DeepSpeed asserts train_batch_size == micro x accumulation x world size
        self.assertEqual(ds["train_batch_size"],
                         ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * plan["world_size"])
        self.assertEqual(ds["train_batch_size"], 256)

    def test_accelerate_kwargs_dataloader_and_launch_line(self):
        plan = self.plan_json("uneven")
        self.assertEqual(plan["microbatch_sizes"], [52, 51, 51, 51, 51])  # uniform: 8 x 32
        cfg = json.loads(self.export("uneven", "accelerate"))
        self.assertLessEqual(set(cfg["Accelerator"]), ACCELERATOR_KWARGS)
        loader = torch.utils.data.DataLoader(list(range(1000)), **cfg["DataLoader"])  # the real consumer
        self.assertEqual(len(next(iter(loader))), plan["uniform"]["micro_batch"])
        launch = shlex.split(cfg["launch"])
        self.assertEqual(launch[:2], ["accelerate", "launch"])
        procs = int(launch[launch.index("--num_processes") + 1])
        self.assertEqual(procs * cfg["Accelerator"]["gradient_accumulation_steps"] * cfg["DataLoader"]["batch_size"], 256)
        self.assertTrue(cfg["accumplan"]["departs_from_plan"])  # 8 x 32, not 52,51,51,51,51
        self.assertIn("[52,51,51,51,51]", cfg["accumplan"]["note"])

    def test_hf_training_arguments_and_launch(self):
        cfg = json.loads(self.export("w2", "hf"))
        self.assertLessEqual(set(cfg["TrainingArguments"]), TRAINING_ARGUMENTS)
        launch = get_args_parser().parse_args(shlex.split(cfg["launch"])[1:])
        ta = cfg["TrainingArguments"]
        self.assertEqual(ta["per_device_train_batch_size"] * ta["gradient_accumulation_steps"] *
                         int(launch.nproc_per_node), 256)

    def test_lightning_cli_config(self):
        import yaml
        text = self.export("uneven", "lightning")
        cfg = yaml.safe_load(text)
        self.assertLessEqual(set(cfg), LIGHTNING_CLI_SECTIONS)  # no "dataloader": LightningCLI rejects it
        self.assertLessEqual(set(cfg["trainer"]), LIGHTNING_TRAINER_ARGS)
        t = cfg["trainer"]
        self.assertEqual(t["accumulate_grad_batches"] * t["devices"] * t["num_nodes"] * cfg["data"]["batch_size"], 256)
        self.assertIn("# NOTE: lightning needs equal microbatches", text)  # said inside the file

    def test_a_much_slower_uniform_split_exits_2_unless_allowed(self):
        self.assertEqual(self.plan_json("p251")["microbatch_sizes"], [36] * 6 + [35])
        for to in ("deepspeed", "hf", "accelerate", "lightning"):
            p = accumplan("export", "--plan", self.plans["p251"], "--to", to, check=False)
            self.assertEqual(p.returncode, 2, to)
            self.assertEqual(p.stdout, b"")
            self.assertIn("252 (7 x 36) or 245 (7 x 35)", p.stderr.decode())
        ds = json.loads(self.export("p251", "deepspeed", "--allow-slow"))
        self.assertEqual(ds["gradient_accumulation_steps"], 251)
        self.assertTrue(ds["accumplan"]["departs_from_plan"])
        self.assertGreater(ds["accumplan"]["predicted_slowdown"], 1.25)
        # torchrun launches accumplan, which runs the balanced plan itself: nothing to refuse
        self.assertEqual(accumplan("export", "--plan", self.plans["p251"], "--to", "torchrun").returncode, 0)


if __name__ == "__main__":
    unittest.main()
