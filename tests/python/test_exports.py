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
# Measured for two ranks (`accumplan profile --world-size 2`): its windows made a rank's gradient exchange.
PROFILE_2_RANKS = os.path.join(ROOT, "examples", "profiles", "builtin-convnet-cpu-2-ranks.profile.json")

# The names each trainer accepts, as facts read from its own source (none of these tools is in
# Debian, so the field lists stand in for their config classes; the version or commit read is
# beside each). The exports may use only these.
# DeepSpeed (deepspeedai/DeepSpeed master, runtime/config.py @029f12b, precision_config.py
# @0ac4684, engine.py @007cca6): top-level keys; bf16/fp16 fields; optimizer types lowercased when
# in DEEPSPEED_OPTIMIZERS, else getattr(torch.optim, type) (case-sensitive); Adam/AdamW params.
DEEPSPEED_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                  "bf16", "fp16", "gradient_clipping", "optimizer"}
DEEPSPEED_BF16 = {"enabled", "immediate_grad_update", "check_grad_overflow"}
DEEPSPEED_FP16 = {"enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                  "consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads"}
DEEPSPEED_OPTIMIZERS = {"adagrad", "adam", "adamw", "lamb", "onebitadam", "onebitlamb", "zerooneadam", "muadam",
                        "muadamw", "musgd", "lion", "muon"}
DEEPSPEED_ADAM_SWITCHES = {"torch_adam", "adam_w_mode"}
# accelerate 1.x: Accelerator.__init__ keyword arguments (accelerator.py); `accelerate launch
# --config_file` fields: BaseConfig + ClusterConfig (commands/config/config_args.py @002dd35),
# unknown keys refused, only distributed_type required.
ACCELERATOR_KWARGS = {"gradient_accumulation_steps", "mixed_precision", "cpu"}
ACCELERATE_MIXED_PRECISION = {"no", "fp16", "bf16", "fp8"}
ACCELERATE_CONFIG_FIELDS = {"compute_environment", "distributed_type", "mixed_precision", "use_cpu", "debug",
                            "num_processes", "machine_rank", "num_machines", "gpu_ids", "main_process_ip",
                            "main_process_port", "rdzv_backend", "same_network", "main_training_function",
                            "enable_cpu_affinity", "downcast_bf16"}
ACCELERATE_DISTRIBUTED_TYPES = {"NO", "MULTI_CPU", "MULTI_GPU", "DEEPSPEED"}
# transformers TrainingArguments (src/transformers/training_args.py @00349ae, 5.x; the same names
# in 4.46+), and OptimizerNames values for torch's optimizers.
TRAINING_ARGUMENTS = {"per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps", "bf16", "fp16", "max_grad_norm",
                      "learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "optim", "use_cpu",
                      "average_tokens_across_devices", "gradient_checkpointing", "gradient_checkpointing_kwargs"}
HF_OPTIM_NAMES = {"adamw_torch", "adamw_torch_fused", "sgd", "adagrad", "rmsprop"}
# lightning 2.x: LightningCLI sections (cli.py @0214810) and Trainer arguments (the stable docs'
# signature); precision strings (_PRECISION_INPUT_STR).
LIGHTNING_CLI_SECTIONS = {"trainer", "model", "data", "seed_everything", "ckpt_path", "optimizer", "lr_scheduler"}
LIGHTNING_TRAINER_ARGS = {"accelerator", "devices", "num_nodes", "precision", "accumulate_grad_batches",
                          "gradient_clip_val", "gradient_clip_algorithm"}
LIGHTNING_PRECISION = {"transformer-engine", "transformer-engine-float16", "16-true", "16-mixed", "bf16-true",
                       "bf16-mixed", "32-true", "64-true"}


def with_eval_batch(plan_path, out_path, micro_batch):
    """The plan with an evaluation batch (schema 1.7) of ``micro_batch``, as the main job plans one."""
    with open(plan_path) as f:
        doc = json.load(f)
    doc["eval"] = {"micro_batch": micro_batch, "predicted_peak_bytes": 1 << 29, "intercept_bytes": 1e8,
                   "slope_bytes_per_sample": 1e6, "keep_outputs": False,
                   "resident": {"weights_bytes": 1 << 20, "optimizer_state_bytes": 1 << 21}, "confirmed": True,
                   "trials": [{"kind": "eval", "micro_batch": micro_batch, "fit": True, "peak_bytes": 1 << 29,
                               "seconds": 0.5, "window": [micro_batch]}]}
    with open(out_path, "w") as f:
        json.dump(doc, f)
    return out_path


def bf16_adamw_clipped(plan_path, out_path):
    """A plan every export must carry: bf16, AdamW lr 3e-4 weight decay 0.01, clipped at 1.0, per-token
    cross-entropy, 2 ranks on CUDA — the profile's plan with its setup edited as those flags would."""
    with open(plan_path) as f:
        doc = json.load(f)
    doc["setup"].update({"amp": "bf16", "optimizer": "adamw", "lr": 3e-4, "hyperparameters": {"weight_decay": 0.01},
                         "max_grad_norm": 1.0, "loss": "cross_entropy", "target": "int64[B,128]:50257"})
    doc["device"]["type"] = "cuda"
    with open(out_path, "w") as f:
        json.dump(doc, f)
    return out_path


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
        for name, profile, args in (
                ("uneven", PROFILE, ["--target-batch", "256", "--max-micro-batch", "60"]),  # 52,51,51,51,51
                ("w2", PROFILE_2_RANKS, ["--target-batch", "256", "--world-size", "2", "--max-micro-batch", "48"]),
                ("p251", PROFILE, ["--target-batch", "251", "--max-micro-batch", "36"])):
            path = os.path.join(cls.tmp.name, name + ".json")
            accumplan("plan", "--profile", profile, "--memory-budget", "1GiB", "--out", path, *args)
            cls.plans[name] = path
        cls.plans["bf16"] = bf16_adamw_clipped(cls.plans["w2"], os.path.join(cls.tmp.name, "bf16.json"))
        cls.plans["eval"] = with_eval_batch(cls.plans["w2"], os.path.join(cls.tmp.name, "eval.json"), 160)

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
                # what an export must not print: 1.13 rejects it
                get_args_parser().parse_args(["--nproc-per-node=2", "--no-python", "accumplan"])

    def test_deepspeed_config_satisfies_deepspeeds_batch_rule(self):
        plan = self.plan_json("w2")
        ds = json.loads(self.export("w2", "deepspeed"))
        self.assertLessEqual(set(ds) - {"accumplan"}, DEEPSPEED_KEYS)
        # DeepSpeed asserts train_batch_size == micro x accumulation x world size
        self.assertEqual(ds["train_batch_size"],
                         ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * plan["world_size"])
        self.assertEqual(ds["train_batch_size"], 256)

    def test_deepspeed_carries_precision_clipping_and_a_buildable_optimizer(self):
        ds = json.loads(self.export("bf16", "deepspeed"))
        self.assertLessEqual(set(ds) - {"accumplan"}, DEEPSPEED_KEYS)
        self.assertLessEqual(set(ds["bf16"]), DEEPSPEED_BF16)
        self.assertEqual((ds["bf16"]["enabled"], ds["gradient_clipping"]), (True, 1.0))
        opt = ds["optimizer"]
        self.assertIn(opt["type"].lower(), DEEPSPEED_OPTIMIZERS)
        # With torch_adam DeepSpeed builds torch.optim's class from the same params: build it here.
        params = {k: v for k, v in opt["params"].items() if k not in DEEPSPEED_ADAM_SWITCHES}
        built = getattr(torch.optim, opt["type"])([torch.nn.Parameter(torch.zeros(2))], **params)
        self.assertEqual(built.defaults["weight_decay"], 0.01)
        self.assertIn("valid tokens over all ranks", " ".join(ds["accumplan"]["notes"]))

    def test_accelerate_kwargs_dataloader_optimizer_and_launch_line(self):
        plan = self.plan_json("uneven")
        self.assertEqual(plan["microbatch_sizes"], [52, 51, 51, 51, 51])  # uniform: 8 x 32
        cfg = json.loads(self.export("uneven", "accelerate"))
        self.assertLessEqual(set(cfg["Accelerator"]), ACCELERATOR_KWARGS)
        self.assertIn(cfg["Accelerator"]["mixed_precision"], ACCELERATE_MIXED_PRECISION)
        loader = torch.utils.data.DataLoader(list(range(1000)), **cfg["DataLoader"])  # the real consumer
        self.assertEqual(len(next(iter(loader))), plan["uniform"]["micro_batch"])
        module, cls = cfg["optimizer"]["class"].rsplit(".", 1)
        self.assertEqual(module, "torch.optim")
        getattr(torch.optim, cls)([torch.nn.Parameter(torch.zeros(2))], **cfg["optimizer"]["kwargs"])
        self.assertEqual(shlex.split(cfg["launch"])[:4], ["accelerate", "launch", "--config_file", "accelerate_config.yaml"])
        self.assertTrue(cfg["accumplan"]["departs_from_plan"])  # 8 x 32, not 52,51,51,51,51
        self.assertIn("[52,51,51,51,51]", cfg["accumplan"]["note"])

    def test_accelerate_config_file_has_only_accelerates_fields(self):
        import yaml
        for name, procs, distributed, precision in (("w2", 2, "MULTI_CPU", "no"), ("uneven", 1, "NO", "no"),
                                                    ("bf16", 2, "MULTI_GPU", "bf16")):
            cfg = yaml.safe_load(self.export(name, "accelerate-config"))
            self.assertLessEqual(set(cfg), ACCELERATE_CONFIG_FIELDS, name)
            self.assertEqual(cfg["distributed_type"], distributed)  # a string: 'NO' is quoted, not false
            self.assertIn(cfg["distributed_type"], ACCELERATE_DISTRIBUTED_TYPES)
            self.assertEqual((cfg["num_processes"], cfg["mixed_precision"]), (procs, precision))

    def test_hf_training_arguments_and_launch(self):
        cfg = json.loads(self.export("w2", "hf"))
        self.assertLessEqual(set(cfg["TrainingArguments"]), TRAINING_ARGUMENTS)
        launch = get_args_parser().parse_args(shlex.split(cfg["launch"])[1:])
        ta = cfg["TrainingArguments"]
        self.assertEqual(ta["per_device_train_batch_size"] * ta["gradient_accumulation_steps"] *
                         int(launch.nproc_per_node), 256)

    def test_hf_carries_precision_clipping_optimizer_and_token_averaging(self):
        cfg = json.loads(self.export("bf16", "hf"))
        ta = cfg["TrainingArguments"]
        self.assertLessEqual(set(ta), TRAINING_ARGUMENTS)
        self.assertIn(ta["optim"], HF_OPTIM_NAMES)
        self.assertEqual((ta["bf16"], ta["fp16"], ta["max_grad_norm"], ta["learning_rate"], ta["weight_decay"]),
                         (True, False, 1.0, 3e-4, 0.01))
        self.assertTrue(ta["average_tokens_across_devices"])
        opt = getattr(torch.optim, cfg["optimizer"]["class"].rsplit(".", 1)[1])(
            [torch.nn.Parameter(torch.zeros(2))], **cfg["optimizer"]["kwargs"])
        self.assertEqual(tuple(opt.defaults["betas"]), (ta["adam_beta1"], ta["adam_beta2"]))

    def test_the_eval_batch_in_each_tools_own_terms(self):
        import yaml
        ta = json.loads(self.export("eval", "hf"))["TrainingArguments"]
        self.assertLessEqual(set(ta), TRAINING_ARGUMENTS)
        self.assertEqual(ta["per_device_eval_batch_size"], 160)
        self.assertNotIn("per_device_eval_batch_size", json.loads(self.export("w2", "hf"))["TrainingArguments"])
        ds = json.loads(self.export("eval", "deepspeed"))
        self.assertLessEqual(set(ds) - {"accumplan"}, DEEPSPEED_KEYS)  # no key of DeepSpeed's own: a note
        self.assertEqual(ds["accumplan"]["eval_micro_batch"], 160)
        self.assertTrue(any("evaluate in microbatches of 160" in n for n in ds["accumplan"]["notes"]))
        acc = json.loads(self.export("eval", "accelerate"))
        self.assertEqual(acc["EvalDataLoader"], {"batch_size": 160})
        self.assertLessEqual(set(acc["Accelerator"]), ACCELERATOR_KWARGS)
        cfg = yaml.safe_load(self.export("eval", "lightning", "--lightning-datamodule", "my_project.data.TextDataModule"))
        self.assertLessEqual(set(cfg), LIGHTNING_CLI_SECTIONS)
        self.assertEqual(cfg["data"]["init_args"], {"batch_size": ta["per_device_train_batch_size"], "eval_batch_size": 160})

    def test_lightning_cli_config(self):
        import yaml
        text = self.export("uneven", "lightning")
        cfg = yaml.safe_load(text)
        self.assertLessEqual(set(cfg), LIGHTNING_CLI_SECTIONS)  # no "dataloader": LightningCLI rejects it
        self.assertLessEqual(set(cfg["trainer"]), LIGHTNING_TRAINER_ARGS)
        t = cfg["trainer"]
        self.assertEqual(t["accumulate_grad_batches"] * t["devices"] * t["num_nodes"] * cfg["data"]["batch_size"], 256)
        self.assertIn("# NOTE: lightning needs equal microbatches", text)  # said inside the file

    def test_lightning_carries_precision_clipping_optimizer_and_a_data_module(self):
        import yaml
        cfg = yaml.safe_load(self.export("bf16", "lightning", "--lightning-datamodule", "my_project.data.TextDataModule"))
        self.assertLessEqual(set(cfg), LIGHTNING_CLI_SECTIONS)
        t = cfg["trainer"]
        self.assertLessEqual(set(t), LIGHTNING_TRAINER_ARGS)
        self.assertIn(t["precision"], LIGHTNING_PRECISION)
        self.assertEqual((t["precision"], t["accelerator"], t["gradient_clip_val"], t["gradient_clip_algorithm"]),
                         ("bf16-mixed", "gpu", 1.0, "norm"))
        micro = self.plan_json("w2")["uniform"]["micro_batch"]
        self.assertEqual(cfg["data"], {"class_path": "my_project.data.TextDataModule", "init_args": {"batch_size": micro}})
        # LightningCLI instantiates optimizer.class_path with init_args over the module's parameters.
        cls = cfg["optimizer"]["class_path"].rsplit(".", 1)[1]
        args = cfg["optimizer"]["init_args"]
        self.assertIsInstance(args["eps"], float)  # 1.0e-08: YAML 1.1 reads a bare 1e-08 as a string
        getattr(torch.optim, cls)([torch.nn.Parameter(torch.zeros(2))], **args)

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


# ---- Every optimizer value reaches the export, or the export is refused naming it ------

def _tiny():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _optimizers():
    """name -> (model, optimizer): the three the issue reports."""
    a, b, c = _tiny(), _tiny(), _tiny()
    return {
        "nesterov": (a, torch.optim.SGD(a.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-4)),
        "amsgrad": (b, torch.optim.AdamW(b.parameters(), lr=1e-3, amsgrad=True, weight_decay=0.05)),
        "groups": (c, torch.optim.SGD([{"params": c[0].parameters()}, {"params": c[2].parameters(), "lr": 0.1}],
                                      lr=0.01)),
    }


def rebuilt_optimizer(to, text, params):
    """torch.optim's optimizer as the trainer builds it from the export's text; None for the exports
    that carry no optimizer (torchrun runs the plan file itself; accelerate-config is launch settings)."""
    import yaml
    if to in ("torchrun", "accelerate-config"):
        return None
    if to == "lightning":
        opt = yaml.safe_load(text)["optimizer"]
        return getattr(torch.optim, opt["class_path"].rsplit(".", 1)[1])(params, **opt["init_args"])
    cfg = json.loads(text)
    if to == "deepspeed":  # DeepSpeed's torch_adam path: torch.optim.Adam or AdamW (adam_w_mode) with the rest
        kwargs = {k: v for k, v in cfg["optimizer"]["params"].items() if k not in DEEPSPEED_ADAM_SWITCHES}
        name = cfg["optimizer"]["type"]
        if name in ("Adam", "AdamW"):
            name = "AdamW" if cfg["optimizer"]["params"]["adam_w_mode"] else "Adam"
        return getattr(torch.optim, name)(params, **kwargs)
    return getattr(torch.optim, cfg["optimizer"]["class"].rsplit(".", 1)[1])(params, **cfg["optimizer"]["kwargs"])


def settings(group):
    return {k: (tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in group.items() if k != "params"}


@unittest.skipUnless(os.access(BIN, os.X_OK) or "ACCUMPLAN_BIN" in os.environ, "no accumplan binary at %s" % BIN)
class OptimizerExports(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import warnings
        import accumplan
        cls.tmp = tempfile.TemporaryDirectory()
        cls.cases = {}
        for name, (model, opt) in _optimizers().items():
            x, y = torch.randn(64, 8), torch.randint(0, 4, (64,))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                plan = accumplan.plan(model, (x,), y, target_batch=64, optimizer=opt, memory_budget=1 << 22,
                                      progress=False)
            path = os.path.join(cls.tmp.name, name + ".json")
            plan.save(path)
            cls.cases[name] = (model, opt, plan, path)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_the_plan_records_every_group_and_flag_and_a_round_trip_keeps_them(self):
        import accumplan
        for name, (model, opt, plan, path) in self.cases.items():
            back = accumplan.load_plan(path)
            self.assertEqual(back.schema_version, accumplan._core.SCHEMA_VERSION)
            self.assertEqual(back.setup, plan.setup, name)  # save -> load: the same setup, groups and flags
            groups = back.setup.get("param_groups", [back.setup])
            self.assertEqual(len(groups), len(opt.param_groups), name)
            for recorded, group in zip(groups, opt.param_groups):
                self.assertEqual(recorded["lr"], group["lr"], name)
                for flag in ("nesterov", "amsgrad"):
                    if group.get(flag):
                        self.assertIs(recorded["flags"][flag], True, name)
                if "parameter_count" in recorded:
                    self.assertEqual(recorded["parameter_count"], sum(p.numel() for p in group["params"]))
        self.assertEqual([g["lr"] for g in self.cases["groups"][2].setup["param_groups"]], [0.01, 0.1])
        self.assertNotIn("param_groups", self.cases["nesterov"][2].setup)  # one group: the 1.5 fields and flags

    def test_each_export_rebuilds_the_same_param_groups_or_refuses_naming_the_value(self):
        import accumplan
        carried = set()
        for name, (model, opt, plan, path) in self.cases.items():
            for to in ("deepspeed", "accelerate", "hf", "lightning", "torchrun", "accelerate-config"):
                with self.subTest(plan=name, to=to):
                    try:
                        text = plan.export(to)
                    except accumplan.PlanError as e:
                        self.assertEqual(name, "groups", str(e))  # only the groups cannot be carried
                        self.assertIn("2 parameter groups (lr 0.01, 0.1)", str(e))
                        self.assertEqual(len(str(e).splitlines()), 1)
                        if to != "torchrun":
                            self.assertIn("allow_lossy=True", str(e))  # Python's argument, not the CLI option
                        continue
                    built = rebuilt_optimizer(to, text, list(model.parameters()))
                    if built is None:
                        continue
                    self.assertEqual([settings(g) for g in built.param_groups],
                                     [settings(g) for g in opt.param_groups])
                    carried.add((name, to))
        self.assertEqual({n for n, _ in carried}, {"nesterov", "amsgrad"})  # four trainers each

    def test_allow_lossy_writes_the_first_group_and_names_the_loss_inside_the_file(self):
        model, opt, plan, path = self.cases["groups"]
        for to in ("deepspeed", "accelerate", "hf", "lightning"):
            with self.subTest(to=to):
                text = plan.export(to, allow_lossy=True)
                self.assertIn("2 parameter groups (lr 0.01, 0.1)", text)
                built = rebuilt_optimizer(to, text, list(model.parameters()))
                self.assertEqual(built.param_groups[0]["lr"], 0.01)
                if to == "lightning":
                    self.assertIn("# LOSSY: ", text)
                else:
                    self.assertIn("2 parameter groups", " ".join(json.loads(text)["accumplan"]["lossy"]))

    def test_the_cli_refuses_before_writing_and_writes_with_allow_lossy(self):
        path = self.cases["groups"][3]
        out = os.path.join(self.tmp.name, "hf.json")
        p = accumplan("export", "--plan", path, "--to", "hf", "--out", out, check=False)
        self.assertEqual(p.returncode, 2)
        err = p.stderr.decode()
        self.assertIn("cannot carry 2 parameter groups (lr 0.01, 0.1)", err)
        self.assertIn("--allow-lossy", err)
        self.assertFalse(os.path.exists(out))  # refused before anything was written
        p = accumplan("export", "--plan", path, "--to", "hf", "--out", out, "--allow-lossy")
        with open(out) as f:
            self.assertIn("2 parameter groups (lr 0.01, 0.1)", " ".join(json.load(f)["accumplan"]["lossy"]))
        self.assertIn("lossy:", p.stderr.decode())
        # The nesterov plan's file, exported by the CLI, builds the same optimizer as the user's.
        model, opt, _, nesterov = self.cases["nesterov"]
        import yaml
        init = yaml.safe_load(accumplan("export", "--plan", nesterov, "--to", "lightning").stdout)["optimizer"]
        self.assertIs(init["init_args"]["nesterov"], True)


if __name__ == "__main__":
    unittest.main()
