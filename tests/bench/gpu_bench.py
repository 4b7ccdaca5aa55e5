#!/usr/bin/env python3
"""gpu_bench.py — accumplan on a real GPU: its plan, its run and its prediction against the truth,
and against the batch-size finders people use today (Accelerate, Lightning), per model x budget.

What it does, for each model (resnet18, a GPT-style decoder, mobilenet_v3_small) and each memory
budget (default 8GiB and 24GiB):
  a. plans with the accumplan CLI (a subprocess) and reads plan.json: the largest microbatch,
     the split, k, the predicted peak and the real windows its search ran;
  b. trains the plan for 3 windows with `accumplan run` under the same budget and reads the
     measured peaks (allocated, and reserved when the build reports it) and OOM recoveries;
  c. finds the truth with plain PyTorch in this process, not accumplan code: the largest b whose
     window (two microbatches of b, forward + mean loss + backward each, gradients accumulating,
     then optimizer.step() and zero_grad) runs under torch.cuda.set_per_process_memory_fraction;
  d. runs the peers in-process under the same budget on the same window: Accelerate's
     find_executable_batch_size and Lightning's Tuner.scale_batch_size (binsearch);
  e. (GPU only by default) resnet18 at 8GiB with --amp bf16, and planned with --probe cupti and
     --probe cuda-caching-allocator.
Every step is wrapped: an exception is recorded as text and the run goes on. Results are written
(atomically) after every row: --out-json (schema accumplan.gpu_bench 1.0) and --out-md.

What it is not: a throughput benchmark, or a test of accumplan's exactness (tests/ do that).
With --rehearse on the CPU (tiny models) nothing here can enforce a budget in Python, so the
truth and the peers see *simulated* out-of-memory errors above the plan's own size: those figures
are labelled "simulated (rehearsal)" and only prove the plumbing.

Peer APIs, as read from their sources (versions named; the code checks signatures at run time):
  accelerate v1.15.0, src/accelerate/utils/memory.py: find_executable_batch_size(function=None,
    starting_batch_size=128, reduce_batch_size_fn=None); the wrapped function takes batch_size
    as its FIRST argument and is called as wrapper(); on an exception where
    should_reduce_batch_size(e) (a RuntimeError with exactly one arg containing " out of memory."
    — older releases "CUDA out of memory." —, "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory" or the HPU message) it calls
    clear_device_cache(garbage_collection=True) (gc.collect + torch.cuda.empty_cache) and retries
    at reduce_batch_size_fn(): by default int(batch_size * 0.9) (halving before 1.x); other
    exceptions propagate; at 0 it raises RuntimeError("No executable batch size found, ...").
    It returns what the function returns. (The decorator form drops reduce_batch_size_fn, so it
    is called here in function form with the default reducer.)
  lightning 2.x, src/lightning/pytorch/tuner/batch_size_scaling.py + utilities/memory.py:
    Tuner(trainer).scale_batch_size(model, ..., method="fit", mode="power"|"binsearch",
    steps_per_trial=3, init_val=2, max_trials=25, batch_arg_name="batch_size"[, margin=0.05,
    max_val] (2.6: BatchSizeFinder(..., margin=0.05, max_val=8192); margin shrinks a binsearch
    result by int(found * (1 - margin)))) returns the new batch size (None under fast_dev_run).
    Each trial runs the fit loop for steps_per_trial optimizer steps of batch_size (no
    accumulation) with trainer.callbacks = [] (so Callbacks cannot count trials: the module's
    own hooks do). OOM is is_oom_error(e): a RuntimeError with one arg containing "CUDA" and
    "out of memory", the cuDNN message, or "DefaultCPUAllocator: can't allocate memory"; it calls
    garbage_collection_cuda() (gc.collect + empty_cache) around trials. binsearch doubles from
    init_val until an OOM, then bisects; it stops doubling at the dataset's length.

Run (GPU):  python3 tests/bench/gpu_bench.py --accumplan build/accumplan
Rehearsal:  OMP_NUM_THREADS=2 /usr/bin/python3 tests/bench/gpu_bench.py --accumplan build/accumplan \
              --device cpu --rehearse --scratch /tmp/gpu-bench-rehearsal
"""
import argparse
import dataclasses
import datetime
import gc
import importlib
import inspect
import json
import logging
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
import traceback

import torch
import torch.nn.functional as F
import torchvision

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from export_models import CausalLM  # noqa: E402  (the one definition of the decoder)

SCHEMA = "accumplan.gpu_bench"
SCHEMA_VERSION = "1.0"
MIB = 1024 * 1024
SIM_LABEL = "simulated (rehearsal)"
GPU_BUDGETS = "8GiB,24GiB"
# Rehearsal budgets: resnet18 + adam keeps ~171 MiB of weights, gradients and state on the CPU
# counting probe, so 200/256 MiB leave it room for roughly 10..40 samples of 64x64.
REHEARSAL_BUDGETS = "200MiB,256MiB"
ALL_MODELS = "resnet18,gpt_decoder,mobilenet_v3_small"
STEPS = 3
_START = time.perf_counter()


def log(msg):
    print(f"[gpu_bench +{time.perf_counter() - _START:7.1f}s] {msg}", file=sys.stderr, flush=True)


def error_text(exc):
    return f"{type(exc).__name__}: {exc}"


def parse_size_bytes(text):
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]i?B|B)?\s*", text)
    if not m:
        raise ValueError(f"size '{text}': expected e.g. 512MiB, 8GiB, 1.5GB or bytes")
    units = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
             "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
    return int(float(m.group(1)) * units[m.group(2)])


# ---------------------------------------------------------------- models, data, loss, optimizer

@dataclasses.dataclass
class ModelSpec:
    name: str
    kind: str              # "image" or "tokens"
    build_args: tuple      # image: (classes, side); tokens: (vocab, context, width, layers, heads)
    optimizer: str         # accumplan --optimizer name
    target_batch: int

    @property
    def classes(self):
        return self.build_args[0]

    def build(self):
        torch.manual_seed(0)
        if self.kind == "tokens":
            return CausalLM(*self.build_args)
        factory = getattr(torchvision.models, self.name)
        return factory(weights=None, num_classes=self.classes)

    def input_specs(self):
        if self.kind == "tokens":
            vocab, context = self.build_args[:2]
            return [f"int64[B,{context}]:{vocab}"], f"int64[B,{context}]:{vocab}"
        side = self.build_args[1]
        return [f"float32[B,3,{side},{side}]"], f"int64[B]:{self.classes}"

    def make_batch(self, b, device):
        if self.kind == "tokens":
            vocab, context = self.build_args[:2]
            x = torch.randint(0, vocab, (b, context), device=device)
            return x, torch.roll(x, -1, dims=1)  # next-token targets
        side = self.build_args[1]
        x = torch.randn(b, 3, side, side, device=device)
        return x, torch.randint(0, self.classes, (b,), device=device)

    def loss(self, out, y):
        if self.kind == "tokens":
            return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        return F.cross_entropy(out, y)


def make_optimizer(name, params):
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-3)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
    if name == "momentum":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    return torch.optim.SGD(params, lr=0.01)


def model_specs(rehearse, has_momentum, target_override):
    sgd = "momentum" if has_momentum else "sgd"
    if rehearse:
        # 64x64, not 32x32: at 32x32 resnet18's last BatchNorm sees 1x1 maps, and accumplan's
        # b=1 probe fails with "Expected more than 1 value per channel when training".
        specs = [ModelSpec("resnet18", "image", (10, 64), "adam", 64),
                 ModelSpec("gpt_decoder", "tokens", (512, 32, 64, 2, 4), "adamw", 64),
                 ModelSpec("mobilenet_v3_small", "image", (10, 64), sgd, 64)]
    else:
        specs = [ModelSpec("resnet18", "image", (1000, 224), "adam", 1024),
                 ModelSpec("gpt_decoder", "tokens", (50257, 512, 768, 6, 12), "adamw", 256),
                 ModelSpec("mobilenet_v3_small", "image", (1000, 224), sgd, 1024)]
    if target_override:
        for s in specs:
            s.target_batch = target_override
    return {s.name: s for s in specs}


# ---------------------------------------------------------------- the training window and OOMs

# Failures that mean "does not fit": out of memory, and the two allocation failures both peers
# also treat that way (accelerate: the cuDNN one; lightning: is_cudnn_snafu).
MEMORY_FAILURES = ("out of memory", "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.", "CUBLAS_STATUS_ALLOC_FAILED",
                   "DefaultCPUAllocator: can't allocate memory")


def is_oom(exc):
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)  # torch >= 1.13
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in MEMORY_FAILURES)


def simulated_oom(b, limit):
    # "CUDA out of memory." is what accelerate's should_reduce_batch_size (" out of memory.")
    # and lightning's is_cuda_out_of_memory ("CUDA" and "out of memory") both recognise.
    return RuntimeError(f"CUDA out of memory. ({SIM_LABEL}: simulated above b={limit}, asked b={b})")


def free_device_memory(device):
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def make_window(spec, model, opt, device, sim_limit):
    """One window at b: two microbatches of b (forward, mean loss, backward; the gradients
    accumulate), one optimizer step, zero_grad(set_to_none=True). Raises on OOM, leaving no
    reference to the window's tensors behind (the traceback is cut at this frame)."""
    def window(b):
        held = {}
        try:
            if sim_limit is not None and b > sim_limit:
                held["batch"] = spec.make_batch(b, device)
                raise simulated_oom(b, sim_limit)
            for _ in range(2):
                held["x"], held["y"] = spec.make_batch(b, device)
                held["loss"] = spec.loss(model(held["x"]), held["y"]) / 2
                held["loss"].backward()
                held.clear()
            opt.step()
            opt.zero_grad(set_to_none=True)
        except BaseException as exc:
            held.clear()
            opt.zero_grad(set_to_none=True)
            raise exc.with_traceback(None)  # drops the model frames that hold activations
    return window


class BudgetScope:
    """On CUDA: the budget as this process's memory fraction (cache emptied); 1.0 again on exit."""

    def __init__(self, device, budget_bytes):
        self.device, self.budget_bytes, self.fraction = device, budget_bytes, None

    def __enter__(self):
        if self.device.startswith("cuda"):
            total = torch.cuda.get_device_properties(0).total_memory
            self.fraction = min(1.0, self.budget_bytes / total)
            free_device_memory(self.device)
            torch.cuda.set_per_process_memory_fraction(self.fraction, 0)
        return self

    def __exit__(self, *exc):
        free_device_memory(self.device)
        if self.device.startswith("cuda"):
            torch.cuda.set_per_process_memory_fraction(1.0, 0)
        return False


def fresh_model(spec, device):
    model = spec.build().to(device).train()
    return model, make_optimizer(spec.optimizer, model.parameters())


# ---------------------------------------------------------------- c. the truth

def try_window(window, b, device):
    """Runs one window at b; returns (fits, peaks) or (False, the OOM's first line)."""
    cuda = device.startswith("cuda")
    if cuda:
        free_device_memory(device)
        torch.cuda.reset_peak_memory_stats()
    oom_message = None
    try:
        window(b)
    except Exception as exc:  # noqa: BLE001 — an OOM is an answer; anything else propagates
        if not is_oom(exc):
            raise
        oom_message = str(exc).splitlines()[0][:200]
    if oom_message is not None:  # outside the except: the exception and its frames are gone
        free_device_memory(device)
        return False, oom_message
    if not cuda:
        return True, {}
    return True, {"allocated_peak_bytes": torch.cuda.max_memory_allocated(),
                  "reserved_peak_bytes": torch.cuda.max_memory_reserved()}


def search_true_max(window, start, cap, device):
    """Doubles from start until a failure, then bisects; below start by halving. Capped at cap."""
    lo, hi, b, trials, peaks = 0, None, max(1, min(start, cap)), [], {}
    while True:
        fits, info = try_window(window, b, device)
        trials.append({"b": b, "fits": fits, **(info if fits else {"error": info})})
        if fits:
            lo, peaks = b, info
            if b >= cap or (hi is not None and hi - lo <= 1):
                break
            b = min(2 * b, cap) if hi is None else (lo + hi) // 2
        else:
            hi = b
            if hi <= 1 or (lo and hi - lo <= 1):
                break
            b = b // 2 if lo == 0 else (lo + hi) // 2
    return lo, trials, peaks


def measure_truth(spec, device, budget_bytes, start, sim_limit):
    t0 = time.perf_counter()
    with BudgetScope(device, budget_bytes) as scope:
        model, opt = fresh_model(spec, device)
        window = make_window(spec, model, opt, device, sim_limit)
        true_max, trials, peaks = search_true_max(window, start, spec.target_batch, device)
        del model, opt, window
    out = {"status": "ok", "true_max": true_max or None, "trials": len(trials), "trial_log": trials,
           "seconds": round(time.perf_counter() - t0, 3), "start": start,
           "capped_at_target": true_max == spec.target_batch, "memory_fraction": scope.fraction,
           "allocated_peak_bytes_at_true_max": peaks.get("allocated_peak_bytes"),
           "reserved_peak_bytes_at_true_max": peaks.get("reserved_peak_bytes")}
    if sim_limit is not None:
        out.update({"simulated": True, "label": SIM_LABEL, "simulated_limit": sim_limit})
    return out


# ---------------------------------------------------------------- d. peers

def module_version(name):
    try:
        return importlib.import_module(name).__version__
    except Exception:  # noqa: BLE001
        return None


def run_accelerate(spec, device, budget_bytes, sim_limit):
    try:
        from accelerate.utils import find_executable_batch_size
    except ImportError:
        return {"status": "not installed"}
    calls = []
    t0 = time.perf_counter()
    with BudgetScope(device, budget_bytes):
        model, opt = fresh_model(spec, device)
        window = make_window(spec, model, opt, device, sim_limit)

        def one_window(batch_size):  # accelerate passes the batch size as the first argument
            calls.append(batch_size)
            window(batch_size)
            return batch_size

        found = find_executable_batch_size(one_window, starting_batch_size=spec.target_batch)()
        del model, opt, window
    out = {"status": "ok", "version": module_version("accelerate"), "found": found,
           "trials": len(calls), "ooms": len(calls) - 1, "tried": calls,
           "seconds": round(time.perf_counter() - t0, 3), "starting_batch_size": spec.target_batch}
    if sim_limit is not None:
        out.update({"simulated": True, "label": SIM_LABEL})
    return out


class SyntheticSet(torch.utils.data.Dataset):
    """length samples cycling over a small pool (CPU tensors; Lightning moves them)."""

    def __init__(self, spec, length, pool=64):
        self.x, self.y = spec.make_batch(min(pool, length), "cpu")
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        j = i % self.x.shape[0]
        return self.x[j], self.y[j]


def lightning_module_class(pl):
    class BenchModule(pl.LightningModule):
        def __init__(self, spec, batch_size, sim_limit, length):
            super().__init__()
            self.net = spec.build()
            self.batch_size = batch_size
            self.bench_spec, self.sim_limit = spec, sim_limit
            self.dataset = SyntheticSet(spec, length)
            self.events = []  # ("start"|"end", batch_size) per training step

        def train_dataloader(self):
            return torch.utils.data.DataLoader(self.dataset, batch_size=self.batch_size, shuffle=False)

        def training_step(self, batch, batch_idx):
            self.events.append(("start", self.batch_size))
            x, y = batch
            if self.sim_limit is not None and x.shape[0] > self.sim_limit:
                raise simulated_oom(x.shape[0], self.sim_limit)
            return self.bench_spec.loss(self.net(x), y)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            self.events.append(("end", self.batch_size))

        def configure_optimizers(self):
            return make_optimizer(self.bench_spec.optimizer, self.net.parameters())
    return BenchModule


def import_lightning():
    for pkg in ("lightning.pytorch", "pytorch_lightning"):
        try:
            pl = importlib.import_module(pkg)
            return pkg, pl, importlib.import_module(pkg + ".tuner").Tuner
        except ImportError:
            continue
    return None, None, None


def lightning_trials(events):
    """Groups step events into trials (consecutive steps at one size: Lightning never runs two
    trials in a row at the same size); a trial whose started steps did not all end failed."""
    trials = []
    for what, size in events:
        if what == "start" and (not trials or trials[-1]["b"] != size):
            trials.append({"b": size, "started": 0, "ended": 0})
        if trials:
            trials[-1]["started" if what == "start" else "ended"] += 1
    for t in trials:
        t["fits"] = t["started"] == t["ended"]
    return trials


def run_lightning(spec, device, budget_bytes, sim_limit, scratch):
    pkg, pl, tuner_cls = import_lightning()
    if pl is None:
        return {"status": "not installed"}
    logging.getLogger(pkg).setLevel(logging.WARNING)
    params = inspect.signature(tuner_cls.scale_batch_size).parameters
    kwargs = {"mode": "binsearch", "init_val": 2, "max_trials": 25, "steps_per_trial": STEPS}
    if "max_val" in params:
        kwargs["max_val"] = spec.target_batch
    margin = params["margin"].default if "margin" in params else None
    t0 = time.perf_counter()
    with BudgetScope(device, budget_bytes):
        lm = lightning_module_class(pl)(spec, 2, sim_limit, 4 * spec.target_batch)
        trainer = pl.Trainer(accelerator="gpu" if device.startswith("cuda") else "cpu", devices=1,
                             max_epochs=1, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False,
                             log_every_n_steps=1, default_root_dir=os.path.join(scratch, "lightning"))
        found = tuner_cls(trainer).scale_batch_size(lm, **kwargs)
        trials = lightning_trials(lm.events)
        del lm, trainer
    sizes_ok = [t["b"] for t in trials if t["fits"]]
    out = {"status": "ok", "package": pkg, "version": getattr(pl, "__version__", None),
           "found": found, "found_capped": min(found, spec.target_batch) if found else found,
           "largest_success": max(sizes_ok) if sizes_ok else None, "trials": len(trials),
           "ooms": sum(not t["fits"] for t in trials), "trial_log": trials, "kwargs": kwargs,
           "margin": margin, "seconds": round(time.perf_counter() - t0, 3)}
    if sim_limit is not None:
        out.update({"simulated": True, "label": SIM_LABEL})
    return out


# ---------------------------------------------------------------- a./b. accumplan subprocesses

def run_cli(argv, timeout_seconds):
    t0 = time.perf_counter()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_seconds)
        rc, err = p.returncode, p.stderr or ""
    except subprocess.TimeoutExpired as exc:
        rc, err = "timeout", exc.stderr or ""
        err = err.decode(errors="replace") if isinstance(err, bytes) else err
    except OSError as exc:
        rc, err = "oserror", error_text(exc)
    out = {"command": shlex.join(argv), "exit_code": rc, "seconds": round(time.perf_counter() - t0, 3)}
    if rc != 0:
        out["stderr_tail"] = err[-2000:]
    windows = [ln.strip() for ln in err.splitlines() if "real windows run" in ln]
    if windows:
        out["summary_line"] = windows[-1]
    return out


def plan_summary(plan):
    prof = plan.get("profile") or {}
    trials = prof.get("trials", plan.get("trials")) or []  # 1.1+: profile.trials; 1.0: trials
    mem = plan.get("memory") or {}
    kinds = {}
    for t in trials:
        kinds[t.get("kind", "?")] = kinds.get(t.get("kind", "?"), 0) + 1
    return {"max_micro_batch": plan.get("max_micro_batch"), "micro_batch": plan.get("micro_batch"),
            "microbatch_sizes": plan.get("microbatch_sizes"),
            "accumulation_steps": plan.get("accumulation_steps"),
            "predicted_peak_bytes": mem.get("predicted_peak_bytes"),
            "margin_bytes": mem.get("margin_bytes"), "budget_bytes": mem.get("budget_bytes"),
            "confirmed": plan.get("confirmed"), "confirmed_peak_bytes": plan.get("confirmed_peak_bytes"),
            "trials": len(trials), "trials_by_kind": kinds,
            "trials_not_fit": sum(1 for t in trials if t.get("fit") is False),
            "probe": prof.get("probe"), "plan_schema_version": plan.get("schema_version"),
            "reason": plan.get("reason"), "margin": mem.get("margin"),
            "persistent": prof.get("persistent"),  # with the points: what tests/bench/gpu_probes.py replays
            # Each probe's allocated and reserved peaks: the first H200 run's plans kept a 5.2 GiB
            # margin, and the allocator part of it is the largest reserved-minus-allocated probe.
            "points": [{k: p.get(k) for k in ("micro_batch", "peak_bytes", "reserved_peak_bytes", "steady_peak_bytes",
                                              "first_microbatch_peak_bytes", "step_seconds")}
                       for p in prof.get("points") or []]}


def accumplan_plan(ctx, spec, model_path, budget, out_dir, extra=()):
    inputs, target = spec.input_specs()
    plan_path = os.path.join(out_dir, "plan.json")
    argv = [ctx.bin, "--progress", "none", "--model", model_path, "--target-batch", str(spec.target_batch)]
    for spec_text in inputs:
        argv += ["--input", spec_text]
    argv += ["--target", target, "--loss", "cross_entropy", "--optimizer", spec.optimizer,
             "--device", ctx.device, "--memory-budget", budget, *extra, "--out", plan_path]
    if os.path.exists(plan_path):
        os.remove(plan_path)
    res = run_cli(argv, cli_timeout_seconds(ctx))
    res["plan_path"] = plan_path
    if res["exit_code"] == 0:
        with open(plan_path) as f:
            res.update(plan_summary(json.load(f)))
        res["status"] = "ok"
    else:
        res["status"] = "error"
    return res


def cli_timeout_seconds(ctx):
    """--subprocess-timeout, shortened near the deadline (30 s past it at most, 30 s at least): the
    caller (gpu-check.sh) leaves the benchmark that much slack before its own command limit."""
    left_seconds = ctx.deadline_seconds + 30 - (time.perf_counter() - _START)
    return min(ctx.subprocess_timeout, max(30.0, left_seconds))


def prediction_error(predicted, measured):
    if predicted is None or not measured:
        return None
    return round((predicted - measured) / measured, 5)


def accumplan_run(ctx, model_path, plan_path, budget, predicted_bytes):
    stats_path = os.path.join(os.path.dirname(plan_path), "run.json")
    argv = [ctx.bin, "run", "--plan", plan_path, "--model", model_path, "--steps", str(STEPS),
            "--memory-budget", budget, "--progress", "none", "--stats", stats_path]
    if os.path.exists(stats_path):
        os.remove(stats_path)
    res = run_cli(argv, cli_timeout_seconds(ctx))
    if res["exit_code"] != 0:
        res["status"] = "error"
        return res
    with open(stats_path) as f:
        st = json.load(f)
    predicted = st.get("predicted_peak_bytes", predicted_bytes)
    alloc, reserved = st.get("measured_peak_bytes"), st.get("measured_reserved_peak_bytes")
    res.update({"status": "ok", "stats_path": stats_path, "windows": st.get("windows"),
                "microbatch_sizes": st.get("microbatch_sizes"), "oom_recoveries": st.get("oom_recoveries"),
                "measured_peak_bytes": alloc, "measured_reserved_peak_bytes": reserved,
                "predicted_peak_bytes": predicted, "probe": st.get("probe"),
                "mean_window_seconds": st.get("mean_window_seconds"),
                "error_allocated": prediction_error(predicted, alloc),
                "error_reserved": prediction_error(predicted, reserved)})
    return res


# ---------------------------------------------------------------- rows

@dataclasses.dataclass
class Context:
    bin: str
    device: str
    simulate: bool
    scratch: str
    subprocess_timeout: float
    results: dict
    out_json: str
    out_md: str


    deadline_seconds: float


def step(ctx, where, fn):
    """Returns fn(); an exception becomes {"status": "error", ...} plus an entry in errors."""
    log(f"{where} ...")
    try:
        res = fn()
    except Exception as exc:  # noqa: BLE001 — never die
        res = {"status": "error", "error": error_text(exc)}
        ctx.results["errors"].append({"where": where, "error": error_text(exc),
                                      "traceback": traceback.format_exc()[-3000:]})
        free_device_memory(ctx.device)
    if res.get("status") == "error" and "error" not in res:  # a CLI failure: exit code and stderr
        ctx.results["errors"].append({"where": where, "error": f"exit code {res.get('exit_code')}: "
                                      + (res.get("stderr_tail") or "").strip()[-800:]})
    log(f"{where}: {res.get('status', 'ok')}")
    return res


def new_row(spec, budget, kind):
    return {"model": spec.name, "budget": budget, "budget_bytes": parse_size_bytes(budget),
            "kind": kind, "target_batch": spec.target_batch, "status": "ok"}


def row_where(row, key):
    return f"{row['model']}/{row['budget']}/{row['kind']}/{key}"


def plan_and_run(ctx, row, spec, model_path, out_dir, flags=(), with_run=True):
    budget = row["budget"]
    if model_path is None:
        row["plan"] = {"status": "error", "error": "the model was not exported (see errors)"}
        return row["plan"]
    row["plan"] = plan = step(ctx, row_where(row, "plan"),
                              lambda: accumplan_plan(ctx, spec, model_path, budget, out_dir, flags))
    if with_run and plan.get("status") == "ok":
        row["run"] = step(ctx, row_where(row, "run"),
                          lambda: accumplan_run(ctx, model_path, plan["plan_path"], budget,
                                                plan.get("predicted_peak_bytes")))
    return plan


def main_row(ctx, spec, model_path, budget):
    row = new_row(spec, budget, "main")
    out_dir = os.path.join(ctx.scratch, spec.name, budget)
    os.makedirs(out_dir, exist_ok=True)
    plan = plan_and_run(ctx, row, spec, model_path, out_dir)
    plan_max = plan.get("max_micro_batch") if plan.get("status") == "ok" else None
    if plan.get("budget_bytes") not in (None, row["budget_bytes"]):
        # The truth and the peers run under this script's reading of the budget: it must be the
        # budget accumplan planned for, or the row compares different machines.
        ctx.results["errors"].append({"where": row_where(row, "budget"), "error":
                                      f"accumplan read {budget} as {plan['budget_bytes']} bytes, this script as "
                                      f"{row['budget_bytes']}"})
    sim_limit = (plan_max or 8) if ctx.simulate else None
    start = min(plan_max or 1, spec.target_batch)
    if past_deadline(ctx):  # the plan and run are kept; the searches would run past the command's limit
        row["truth"] = {"status": "skipped: time limit"}
        row["peers"] = {"accelerate": {"status": "skipped: time limit"}, "lightning": {"status": "skipped: time limit"}}
        return row
    row["truth"] = truth = step(ctx, row_where(row, "truth"), lambda: measure_truth(
        spec, ctx.device, row["budget_bytes"], start, sim_limit))
    if plan_max and truth.get("true_max"):
        row["utilisation"] = round(min(plan_max, spec.target_batch) / truth["true_max"], 4)
        if ctx.simulate:
            row["utilisation_label"] = SIM_LABEL
    row["peers"] = {}
    for peer, run_peer in (("accelerate", lambda: run_accelerate(spec, ctx.device, row["budget_bytes"], sim_limit)),
                           ("lightning", lambda: run_lightning(spec, ctx.device, row["budget_bytes"], sim_limit,
                                                               out_dir))):
        row["peers"][peer] = ({"status": "skipped: time limit"} if past_deadline(ctx)
                              else step(ctx, row_where(row, peer), run_peer))
    return row


def extra_rows(ctx, spec, model_path, budget, main):
    """resnet18 at one budget with --amp bf16 (plan + run), and planned with each CUDA probe."""
    truth_max = ((main or {}).get("truth") or {}).get("true_max")
    variants = [("amp_bf16", ["--amp", "bf16"], True),
                ("probe_cupti", ["--probe", "cupti"], False),
                ("probe_cuda_caching_allocator", ["--probe", "cuda-caching-allocator"], False)]
    for kind, flags, with_run in variants:
        row = new_row(spec, budget, kind)
        if skip_for_time(ctx, row):
            continue
        out_dir = os.path.join(ctx.scratch, spec.name, budget, kind)
        os.makedirs(out_dir, exist_ok=True)
        plan = plan_and_run(ctx, row, spec, model_path, out_dir, flags, with_run)
        main_plan = (main or {}).get("plan") or {}
        row["main_plan_max"] = main_plan.get("max_micro_batch")
        row["main_predicted_peak_bytes"] = main_plan.get("predicted_peak_bytes")
        if plan.get("max_micro_batch") and truth_max and kind.startswith("probe"):  # same fp32 setup
            row["utilisation_vs_fp32_truth"] = round(plan["max_micro_batch"] / truth_max, 4)
        finish_row(ctx, row)


def past_deadline(ctx):
    return time.perf_counter() - _START > ctx.deadline_seconds


def skip_for_time(ctx, row):
    if not past_deadline(ctx):
        return False
    row["status"] = "skipped: time limit"
    log(f"{row['model']}/{row['budget']}/{row['kind']}: skipped (time limit)")
    ctx.results["rows"].append(row)
    write_outputs(ctx)
    return True


def finish_row(ctx, row):
    parts = [row.get(k) for k in ("plan", "run", "truth")] + list((row.get("peers") or {}).values())
    if any(isinstance(p, dict) and p.get("status") == "error" for p in parts):
        row["status"] = "partial"
    ctx.results["rows"].append(row)
    write_outputs(ctx)


def export_model(ctx, spec):
    path = os.path.join(ctx.scratch, spec.name + ".pt")
    tmp = path + ".tmp"
    scripted = torch.jit.script(spec.build().train())
    scripted.save(tmp)
    os.replace(tmp, path)
    return {"status": "ok", "path": path, "parameters": sum(p.numel() for p in scripted.parameters())}


# ---------------------------------------------------------------- outputs

def write_atomic(path, text):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_outputs(ctx):
    ctx.results["wall_seconds"] = round(time.perf_counter() - _START, 2)
    try:
        write_atomic(ctx.out_json, json.dumps(ctx.results, indent=2, default=str) + "\n")
    except Exception as exc:  # noqa: BLE001
        log(f"could not write {ctx.out_json}: {error_text(exc)}")
    try:
        write_atomic(ctx.out_md, render_markdown(ctx.results))
    except Exception as exc:  # noqa: BLE001
        log(f"could not write {ctx.out_md}: {error_text(exc)}")
        write_atomic(ctx.out_md, f"# gpu_bench\n\nrendering failed: {error_text(exc)}\n")


def mib(n):
    return "—" if n is None else f"{n / MIB:,.1f}"


def pct(x):
    return "—" if x is None else f"{100 * x:+.1f}%"


def val(x, simulated=False):
    if x is None:
        return "—"
    return f"{x} ({SIM_LABEL})" if simulated else str(x)


def peer_cell(p):
    if not p:
        return "—"
    if p.get("status") != "ok":
        return p.get("status", "?") if p.get("status") != "error" else "error"
    found = p.get("found_capped", p.get("found"))
    cell = f"{found} / {p.get('trials')} / {p.get('ooms')} / {p.get('seconds'):.1f}"
    return f"{cell} ({SIM_LABEL})" if p.get("simulated") else cell


def main_table_lines(rows):
    lines = ["| model | budget | accumplan max | true max | utilisation | k | predicted MiB | "
             "run allocated peak MiB | run reserved peak MiB | error % (allocated) | error % (reserved) | "
             "trials | seconds | truth trials / s | accelerate found / trials / OOMs / s | "
             "lightning found / trials / OOMs / s |",
             "|" + "---|" * 16]
    for r in (r for r in rows if r["kind"] == "main"):
        if r["status"].startswith("skipped"):
            lines.append(f"| {r['model']} | {r['budget']} | {r['status']} |" + " |" * 13)
            continue
        pl, run, tr = r.get("plan") or {}, r.get("run") or {}, r.get("truth") or {}
        sim = bool(tr.get("simulated"))
        peers = r.get("peers") or {}
        truth_cell = "—" if tr.get("seconds") is None else f"{tr.get('trials')} / {tr['seconds']:.1f}"
        lines.append("| " + " | ".join([
            r["model"], r["budget"], val(pl.get("max_micro_batch")) if pl.get("status") == "ok" else "error",
            val(tr.get("true_max"), sim) if tr.get("status") != "error" else "error",
            val(r.get("utilisation"), sim), val(pl.get("accumulation_steps")),
            mib(pl.get("predicted_peak_bytes")), mib(run.get("measured_peak_bytes")),
            mib(run.get("measured_reserved_peak_bytes")), pct(run.get("error_allocated")),
            pct(run.get("error_reserved")), val(pl.get("trials")), val(pl.get("seconds")),
            truth_cell if not sim else f"{truth_cell} ({SIM_LABEL})",
            peer_cell(peers.get("accelerate")), peer_cell(peers.get("lightning"))]) + " |")
    return lines


def failure_text(part):
    text = part.get("error") or (part.get("stderr_tail") or "").strip() or f"exit code {part.get('exit_code')}"
    return text.strip().splitlines()[-1][:200]


def extra_table_lines(rows):
    extras = [r for r in rows if r["kind"] != "main"]
    if not extras:
        return ["(no extra rows: they run on the GPU by default; `--extras on` forces them)"]
    lines = ["| variant | model | budget | plan max | k | predicted MiB | fp32 plan max | fp32 predicted MiB | "
             "run allocated peak MiB | run reserved peak MiB | error % (allocated) | error % (reserved) | "
             "OOM recoveries | trials | seconds | utilisation vs fp32 truth | status |", "|" + "---|" * 17]
    for r in extras:
        pl, run = r.get("plan") or {}, r.get("run") or {}
        status = r["status"] if pl.get("status") != "error" else "plan failed: " + failure_text(pl)
        lines.append("| " + " | ".join(str(c) for c in [
            r["kind"], r["model"], r["budget"], val(pl.get("max_micro_batch")), val(pl.get("accumulation_steps")),
            mib(pl.get("predicted_peak_bytes")), val(r.get("main_plan_max")), mib(r.get("main_predicted_peak_bytes")),
            mib(run.get("measured_peak_bytes")), mib(run.get("measured_reserved_peak_bytes")),
            pct(run.get("error_allocated")), pct(run.get("error_reserved")), val(run.get("oom_recoveries")),
            val(pl.get("trials")), val(pl.get("seconds")), val(r.get("utilisation_vs_fp32_truth")),
            status.replace("|", "/")]) + " |")
    return lines


def header_lines(res):
    if res["rehearsal"]:
        lines = ["# accumplan GPU benchmark — REHEARSAL (plumbing only, not results)", "",
                 "**This is a CPU rehearsal: every figure below is plumbing-only. Tiny models; the "
                 "out-of-memory errors the truth search and the peers see are simulated "
                 f"(\"{SIM_LABEL}\") above the plan's own size, so \"true max\" equals the plan by "
                 "construction. Do not read any number here as a measurement.**", ""]
    else:
        lines = [f"# accumplan GPU benchmark — real run on {res['device']}", ""]
    v = res["versions"]
    lines += [f"- device: {res['device']} (`--device {res['device_arg']}`)",
              f"- accumplan: {res['accumplan']}",
              f"- torch {v['torch']}, torchvision {v['torchvision']}, accelerate {v['accelerate'] or 'not installed'}, "
              f"lightning {v['lightning'] or 'not installed'}, Python {v['python']}",
              f"- started {res['started']}, wall {res['wall_seconds']} s (time limit {res['time_limit_seconds']} s)",
              f"- budgets {', '.join(res['budgets'])}; models {', '.join(res['models'])}",
              f"- reproduce: `{res['command']}`", ""]
    return lines


NOTES = [
    "Notes:",
    "- accumplan max = plan.json `max_micro_batch`; k = `accumulation_steps`; predicted = "
    "`memory.predicted_peak_bytes` (at the plan's largest microbatch); trials = the real windows its "
    "search ran (`profile.trials`); seconds = the planning subprocess's wall time.",
    f"- run = `accumplan run --steps {STEPS}` under the same `--memory-budget`; error = (predicted − measured) / "
    "measured, allocated (`measured_peak_bytes`) and, where the build reports it, reserved "
    "(`measured_reserved_peak_bytes`).",
    "- true max = this script's plain PyTorch window (two microbatches of b, forward + mean loss + backward "
    "each, gradients accumulating, then optimizer.step() and zero_grad(set_to_none=True)) under "
    "torch.cuda.set_per_process_memory_fraction(budget / total); doubling from accumplan's max, then "
    "bisection; capped at the target batch. The window's batch lives on the device (accumplan does not "
    "count its data). Utilisation = accumplan max / true max.",
    "- accelerate: find_executable_batch_size over the same window, starting at the target batch, its "
    "default reducer (×0.9 per OOM in 1.x); found = the size whose window ran.",
    "- lightning: Tuner.scale_batch_size(mode=\"binsearch\", init_val=2, max_trials=25, steps_per_trial=3"
    "[, max_val=target]); its window is ONE optimizer step of batch_size with no accumulation (no gradient "
    "resident during the forward), 3 steps per trial, so it may fit more than the two-microbatch window; "
    "found is after its default margin (2.6: 5% off a binsearch result) and capped at the target; "
    "`largest_success` in the JSON is the largest size whose trial ran.",
]


def render_markdown(res):
    lines = header_lines(res) + ["## Model × budget", ""] + main_table_lines(res["rows"]) + [""] + NOTES
    lines += ["", "## resnet18: bf16 and the CUDA probes", ""] + extra_table_lines(res["rows"])
    lines += ["", f"## Errors ({len(res['errors'])})", ""]
    for e in res["errors"] or []:
        lines.append(f"- `{e['where']}`: {e['error'][:1500]}".replace("\n", " "))
    if not res["errors"]:
        lines.append("none")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- main

def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--accumplan", required=True, help="the accumplan binary")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--budgets", help=f"comma list (default {GPU_BUDGETS}; rehearsal {REHEARSAL_BUDGETS})")
    ap.add_argument("--models", default=ALL_MODELS, help=f"comma list of {ALL_MODELS}")
    ap.add_argument("--scratch", help="working folder (default: a new temporary folder)")
    ap.add_argument("--rehearse", action="store_true", help="tiny models and budgets, for a CPU rehearsal")
    ap.add_argument("--time-limit", type=float, default=360.0,
                    help="seconds; rows not started by then are recorded as skipped")
    ap.add_argument("--target-batch", type=int, help="override every model's target batch")
    ap.add_argument("--extras", choices=["auto", "on", "off"], default="auto",
                    help="resnet18 bf16 / probe rows: auto = on CUDA without --rehearse")
    ap.add_argument("--subprocess-timeout", type=float, default=300.0, help="seconds per accumplan call")
    ap.add_argument("--out-json", help="default <scratch>/results-gpu.json")
    ap.add_argument("--out-md", help="default <scratch>/RESULTS-gpu.md")
    return ap.parse_args(argv)


def cli_text(binary, *args):
    try:
        p = subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)
        return (p.stdout + p.stderr).strip()
    except Exception as exc:  # noqa: BLE001
        return f"unavailable ({error_text(exc)})"


def start_results(args, device_name, budgets, models):
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "rehearsal": bool(args.rehearse),
            "simulated_ooms": args.device == "cpu", "device": device_name, "device_arg": args.device,
            "torch": torch.__version__, "accumplan": cli_text(args.accumplan, "--version"),
            "versions": {"torch": torch.__version__, "torchvision": torchvision.__version__,
                         "accelerate": module_version("accelerate"),
                         "lightning": module_version("lightning") or module_version("pytorch_lightning"),
                         "python": platform.python_version()},
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "wall_seconds": 0.0, "time_limit_seconds": args.time_limit, "budgets": budgets,
            "models": models, "command": shlex.join([sys.executable, *sys.argv]), "rows": [],
            "errors": []}


def make_context(args):
    scratch = os.path.abspath(args.scratch or tempfile.mkdtemp(prefix="gpu-bench-"))
    os.makedirs(scratch, exist_ok=True)
    budgets = [b.strip() for b in (args.budgets or (REHEARSAL_BUDGETS if args.rehearse else GPU_BUDGETS)).split(",")]
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    cuda = args.device == "cuda" and torch.cuda.is_available()
    device_name = torch.cuda.get_device_name(0) if cuda else "cpu"
    results = start_results(args, device_name, budgets, models)
    return Context(bin=os.path.abspath(args.accumplan), device=args.device, simulate=args.device == "cpu",
                   scratch=scratch, subprocess_timeout=args.subprocess_timeout, results=results,
                   out_json=args.out_json or os.path.join(scratch, "results-gpu.json"),
                   out_md=args.out_md or os.path.join(scratch, "RESULTS-gpu.md"),
                   deadline_seconds=args.time_limit)


def run_all(ctx, args):
    specs = model_specs(args.rehearse, "momentum" in cli_text(ctx.bin, "--help"), args.target_batch)
    budgets, mains = ctx.results["budgets"], {}
    extras = args.extras == "on" or (args.extras == "auto" and ctx.device == "cuda" and not args.rehearse)
    extras_budget = "8GiB" if "8GiB" in budgets else budgets[0]
    for name in ctx.results["models"]:
        spec = specs.get(name)
        if spec is None:
            ctx.results["errors"].append({"where": name, "error": f"unknown model (known: {ALL_MODELS})"})
            continue
        if time.perf_counter() - _START > ctx.deadline_seconds:
            exported = {"status": "skipped: time limit"}
        else:
            exported = step(ctx, f"{name}/export", lambda: export_model(ctx, spec))
        path = exported.get("path")
        for budget in budgets:
            row = new_row(spec, budget, "main")
            if skip_for_time(ctx, row):
                continue
            row = main_row(ctx, spec, path, budget)
            row["export"] = exported
            mains[(name, budget)] = row
            finish_row(ctx, row)
            # The bf16 and CUDA-probe rows right after their main row, not last: they are the only
            # check of those paths, and the later rows are the first a short lease skips.
            if extras and name == "resnet18" and budget == extras_budget:
                extra_rows(ctx, spec, path, budget, row)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        ctx = make_context(args)
    except Exception as exc:  # noqa: BLE001 — say why in the outputs the caller collects
        text = f"gpu_bench could not start: {error_text(exc)}\n"
        for path in (args.out_json, args.out_md):
            if path:
                write_atomic(path, json.dumps({"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "errors": [text]})
                             + "\n" if path.endswith(".json") else text)
        log(text.strip())
        return 1
    log(f"device {ctx.results['device']}, accumplan {ctx.results['accumplan']}, scratch {ctx.scratch}")
    if args.device == "cuda" and not torch.cuda.is_available():
        ctx.results["errors"].append({"where": "setup", "error": "--device cuda but torch.cuda is not available"})
    else:
        try:
            run_all(ctx, args)
        except BaseException as exc:  # noqa: BLE001 — still write what we have
            ctx.results["errors"].append({"where": "run_all", "error": error_text(exc),
                                          "traceback": traceback.format_exc()[-3000:]})
    write_outputs(ctx)
    log(f"wrote {ctx.out_json} and {ctx.out_md}; {len(ctx.results['errors'])} error(s)")
    peer_errors = [e for e in ctx.results["errors"] if e["where"].endswith(("/accelerate", "/lightning"))]
    return 0 if len(ctx.results["errors"]) == len(peer_errors) else 1


if __name__ == "__main__":
    sys.exit(main())
