"""Shared fixtures of the Python tests: plan documents, tiny models, the full-batch reference.

The tests import the INSTALLED package (`python3 -m pip install --no-build-isolation .`, as
scripts/test.sh does in build/venv): python/ is not put on sys.path, so what is tested is what pip
installed, compiled core included. An import from the source tree stops with the install line."""
import copy
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
import torch  # noqa: E402

import accumplan  # noqa: E402

GOLDEN_PLAN = os.path.join(ROOT, "tests", "golden", "plan.json")


def golden_doc():
    with open(GOLDEN_PLAN) as f:
        return json.load(f)


def plan_doc(sizes, world_size=1, split="balanced", multiple_of=None, loss="cross_entropy",
             normalization="auto", version="1.1", usable_bytes=None, intercept=None, slope=None, sharded=False):
    """A plan.json document for one window of `sizes` per rank (the golden plan's other fields);
    ``sharded``: its optimizer state sharded over the ranks (1.9), rank 0's share the largest."""
    d = golden_doc()
    d.pop("checkpoint", None)  # the golden plan checkpoints blocks.1 and blocks.3, which the test models lack
    d.pop("checkpoint_choice", None)  # and names that set as chosen
    T = sum(sizes)
    d["target_batch"] = T * world_size
    d["world_size"] = world_size
    d["per_rank_batch"] = T
    d["microbatch_sizes"] = list(sizes)
    d["weights"] = [n / T for n in sizes]
    d["micro_batch"] = max(sizes)
    d["accumulation_steps"] = len(sizes)
    d["max_micro_batch"] = max(sizes)
    d["split"] = split
    d["multiple_of"] = multiple_of
    # The equal-microbatch alternative the C++ reader checks against the batch (solver.h set_window).
    if T <= 1 << 40:  # larger batches are hostile documents, refused before the uniform field
        u = (accumplan.largest_divisor_at_most(T, max(sizes), multiple_of or 1) or
             accumplan.largest_divisor_at_most(T, max(sizes)))
        d["uniform"] = {"micro_batch": u, "accumulation_steps": T // u}
    d["setup"]["loss"] = loss
    d["setup"]["normalization"] = normalization
    if usable_bytes is not None:
        d["memory"]["usable_bytes"] = usable_bytes
    if intercept is not None:
        d["fit"]["intercept_bytes"] = intercept
    if slope is not None:
        d["fit"]["slope_bytes_per_sample"] = slope
    if sharded:
        d["sharding"] = {"optimizer": True, "world_size": world_size, "measured_rank": 0, "unsharded_micro_batch": None,
                         "per_rank_state_bytes": [1000] + [900] * (world_size - 1)}
        # The windows held that share (the golden plan has its profile nested: 1.1 and later).
        d["profile"]["sharding"] = {k: v for k, v in d["sharding"].items() if k != "unsharded_micro_batch"}
        version = "1.9"
    return as_version(d, version)


def ranks_doc(rank_sizes, budgets=(24 << 20, 64 << 20), loss="cross_entropy", normalization="auto"):
    """A 1.13 plan.json document whose ranks differ: rank r takes sum(rank_sizes[r]) of each window,
    split as rank_sizes[r] under budgets[r]; the window fields are rank 0's."""
    d = plan_doc(rank_sizes[0], world_size=len(rank_sizes), loss=loss, normalization=normalization, version="1.13")
    d["target_batch"] = sum(sum(s) for s in rank_sizes)
    d["ranks"] = [{"rank": r, "budget_bytes": budgets[r], "per_rank_batch": sum(s), "max_micro_batch": max(s),
                   "microbatch_sizes": list(s), "predicted_peak_bytes": d["memory"]["predicted_peak_bytes"],
                   "window_seconds": None} for r, s in enumerate(rank_sizes)]
    return d


def as_version(d, version):
    """The plan document in the 1.0 layout (profile_points, trials at the top) or the 1.1 layout
    (the profile nested as "profile"), whichever layout the golden file has today."""
    d = copy.deepcopy(d)
    d["schema_version"] = version
    if version.startswith(("1.0", "1.1")) and "margin_bytes" in d["memory"]:
        # 1.0 and 1.1 stated the margin as a fraction of the budget, not in bytes
        m = d["memory"]
        m.pop("margin", None)
        m["headroom"] = m.pop("margin_bytes") / m["budget_bytes"]
    if version.startswith("1.1") and "profile" not in d:
        profile = {k: copy.deepcopy(d[k]) for k in ("device", "model", "setup", "libtorch_version")}
        profile["persistent"] = {k: d["memory"][k] for k in ("weights_bytes", "gradients_bytes", "optimizer_state_bytes")}
        profile["points"] = d.pop("profile_points")
        profile["trials"] = d.pop("trials", [])
        d["profile"] = profile
    elif version.startswith("1.0") and "profile" in d:
        profile = d.pop("profile")
        d["profile_points"] = profile["points"]
        d["trials"] = profile.get("trials", [])
    return d


def make_plan(sizes, **kw):
    return accumplan.load_plan(plan_doc(sizes, **kw))


def reseed(module, seed, scale):
    """Deterministic parameters, whatever torch's global RNG did before."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)
    return module


class Classifier(torch.nn.Module):
    """float32[B,8] -> logits [B,4]."""

    def __init__(self, seed=0):
        super().__init__()
        self.l1 = torch.nn.Linear(8, 16)
        self.l2 = torch.nn.Linear(16, 4)
        reseed(self, seed, 0.3)

    def forward(self, x):
        return self.l2(torch.tanh(self.l1(x)))


class TinyLM(torch.nn.Module):
    """int64[B,T] tokens in [0,10) -> logits [B,T,5]; returns a dict, as Hugging Face models do."""

    def __init__(self, seed=0):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 6)
        self.out = torch.nn.Linear(6, 5)
        reseed(self, seed, 0.5)

    def forward(self, tokens):
        return {"logits": self.out(torch.tanh(self.emb(tokens)))}


def classifier_data(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g)


def token_data(n, t=6, seed=2, ignore_index=-100):
    """Tokens and targets with a different number of ignored positions per sample (some none)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 10, (n, t), generator=g)
    y = torch.randint(0, 5, (n, t), generator=g)
    for i in range(n):
        y[i, t - (i % (t + 1)):] = ignore_index  # sample i ignores its last i % (t+1) positions
    return x, y


def full_batch_grads(model, x, y, tokens=False, ignore_index=-100):
    """The gradient of the whole window's mean loss, computed in one batch: the reference."""
    model.zero_grad(set_to_none=True)
    out = model(x)
    out = out["logits"] if isinstance(out, dict) else out
    if tokens:
        loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1),
                                                 ignore_index=ignore_index)  # mean over valid tokens
    else:
        loss = torch.nn.functional.cross_entropy(out, y)
    loss.backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


def params_of(model):
    return [p.detach().clone() for p in model.parameters()]


def oom_error(kind):
    if kind == "cuda" and hasattr(torch.cuda, "OutOfMemoryError"):
        return torch.cuda.OutOfMemoryError("Tried to allocate 2.00 MiB (injected; recognised by its type)")
    return RuntimeError("CUDA out of memory. Tried to allocate 2.00 MiB (injected, message only)")


class Gated(torch.nn.Module):
    """float32[B,16,32] -> logits [B,8]: a gated MLP over 16 positions, pooled."""

    def __init__(self, seed=0):
        super().__init__()
        self.inp = torch.nn.Linear(32, 96)
        self.gate = torch.nn.Linear(96, 192)
        self.norm = torch.nn.LayerNorm(96)
        self.head = torch.nn.Linear(96, 8)
        reseed(self, seed, 0.2)

    def forward(self, x):
        z = torch.tanh(self.inp(x))
        a, b = self.gate(z).chunk(2, dim=-1)
        return self.head(self.norm(z + a * torch.sigmoid(b)).mean(dim=1))


class FailingAt(torch.nn.Module):
    """Wraps a model; the forward call number `position` (0-based) raises an out-of-memory error,
    once. Optionally every call with more than `over` samples raises too (a real memory bound)."""

    def __init__(self, inner, position=None, over=None, kind="cuda"):
        super().__init__()
        self.inner, self.position, self.over, self.kind = inner, position, over, kind
        self.calls, self.sizes = 0, []

    def forward(self, x):
        i = self.calls
        self.calls += 1
        self.sizes.append(x.shape[0])
        if i == self.position or (self.over is not None and x.shape[0] > self.over):
            # allocate something first, as a real OOM happens mid-forward
            _ = self.inner(x)
            raise oom_error(self.kind)
        return self.inner(x)


DIST_TIMEOUT_S = 120  # watchdog: a hung collective fails the test instead of the suite


def end_rank():
    """The end of a gloo worker whose outputs are written: both ranks meet before either tears the
    group down (a teardown racing the peer's can abort), then the process ends here. Left to the
    interpreter's exit, torch's own teardown aborted 1 run in about 30 on a loaded machine
    ("terminate called without an active exception", after destroy_process_group returned)."""
    import torch.distributed as dist
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def run_two_gloo_ranks(worker_script, out, *args, world=2):
    """Runs ``worker_script out args...`` as ranks 0 .. world-1 (two by default) of a gloo group on
    127.0.0.1 (one thread each); returns (return codes, logs). A rank still running after
    DIST_TIMEOUT_S is killed and its return code is None, so a hung collective fails the caller's
    test rather than the suite."""
    import socket
    import subprocess
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, worker_script), out] + list(args), cwd=HERE,
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for r in range(world)]
    logs, killed = [""] * world, [False] * world
    try:
        for r, p in enumerate(procs):
            logs[r] = p.communicate(timeout=DIST_TIMEOUT_S)[0].decode(errors="replace")
    except subprocess.TimeoutExpired:
        pass
    finally:
        for r, p in enumerate(procs):
            if p.poll() is None:
                killed[r] = True
                p.kill()
                p.wait()
    return [None if killed[r] else p.returncode for r, p in enumerate(procs)], logs


def probed_windows(build, plan_path, windows):
    """(each window's {peak, predicted, oom}, the plan): the windows of the plan at plan_path trained
    by train_window on what build() returns (module, optimizer), each peak read from the cpu-counting
    probe installed before build() runs, so it counts all the process allocates (a DDP reducer's
    buckets, an optimizer's own parameters) and none of accumplan's figures; `predicted` is the
    plan's for this rank."""
    from accumplan import _probes
    probe = _probes.CpuCountingProbe()
    try:
        module, opt = build()
        plan = accumplan.load_plan(plan_path)
        rec = []
        for xs, ys in windows:
            probe.reset_peak()
            st = plan.train_window(module, opt, (xs,), ys, measure_memory=False)
            rec.append({"peak": probe.peak_bytes(), "predicted": st.predicted_peak_bytes, "oom": st.oom_recoveries})
    finally:
        probe.close()
    return rec, plan


def in_python_words(cli_message):
    """A message of the CLI as the core words it for a Python caller, for comparing the two:
    each --option by the core's own table (_core.option_name), advice to plan again as
    accumplan.plan(..., name=...)."""
    import re
    name = accumplan._core.option_name
    text = re.sub(r"`accumplan (?:plan|profile)((?: --[a-z-]+)*)`",
                  lambda m: "accumplan.plan(...%s)" % "".join(", %s=..." % name("--" + o)
                                                             for o in re.findall(r"--([a-z-]+)", m.group(1))),
                  cli_message)
    return re.sub(r"(?<![\w-])--[a-z][a-z0-9-]*", lambda m: name(m.group(0)), text)
