#!/usr/bin/env python3
"""hostile-campaign.py — a reproducible hostile-input campaign against accumplan's error contract.

WHAT IT IS
  A generator of several hundred (>= 520) hostile cases, run against a built `accumplan` binary and
  the Python package (python/accumplan), in 10 classes:
    1 outputs     --out/--report/--trace/--stats/--plan-out/--save/--json: missing or file-component
                  directories, onto a directory, '', trailing '/', two outputs on one file, an output
                  that is an input (also through ./, symlink, hard link), two outputs on stdout,
                  given twice, over-long names, unwritable directories (skipped as root), and
                  pre-existing outputs that must stay byte-identical after a refusal.
    2 one-line    control characters (\\n \\r \\t ESC BEL DEL ...) inside every choice/size/spec/path
                  option value, and inside plan JSON string fields.
    3 host-data   ragged torch.save files whose padded size is huge, --seq-len up to 2^32,
                  --seq-len-file with huge/odd lengths, huge target batches and synthetic data sets,
                  10^5 views into one storage, ACCUMPLAN_MAX_HOST_DATA. Memory is measured (wait4's
                  ru_maxrss per case); > 4 GiB is a failure.
    4 storage     hand-crafted torch.save zip archives (own pickler + zipfile): short records,
                  missing records, shapes/offsets/strides beyond the storage, numel 2^40 / 2^62 / -1,
                  garbage pickles, forbidden globals, legacy format, zip bomb, empty file, directory,
                  FIFO (must not block), /dev/zero, /dev/null; as --batch-file, run/verify --data, --model.
    5 later       values accepted by a parser but refused later: --ignore-index out of range, class or
                  token ids out of range, targets all ignore_index, ragged sequences longer than
                  --seq-len, mixed dtypes; the main job must refuse these BEFORE measuring (one line).
    6 non-utf8    non-UTF-8 bytes in paths (inputs and outputs) and in option values and plan fields.
    7 report      plans/profiles/stats with control characters, markup and XML-invalid characters in
                  strings (the HTML/SVG written must parse with xml.etree and hold no raw control
                  character), stats with negative/huge/empty/mismatched values.
    8 python      accumplan.load_plan / Plan / replan_below / train_window / window_sizes / pack and
                  helpers with hostile arguments, one subprocess per case.
    9 python-plan accumplan.plan and train_window on hostile arguments (inputs, targets, devices,
                  optimizers, schedulers, loss functions, models whose forward misbehaves, host
                  memory) and on small legal plans (target batches 1-3, lr 0, bf16, hooks, tied
                  weights, reparametrisations) that must plan; messages must name the Python
                  argument, never a CLI option; a failed call leaves the weights as they were.
   10 knobs       what the knobs added: checkpointing's arguments, TorchScript, a second wrap, a
                  recomputed BatchNorm (its statistics must move once) and Ctrl-C in a recompute
                  (KeyboardInterrupt); the eval batch's arguments; ragged items (meta, sparse, empty,
                  float, mixed) and padding past the host-data limit; dict batches with flags and
                  model losses that are not tensors; exports of plan text holding newlines, ESC and
                  NUL (nothing may leave its comment; the CLI and Python); tampered checkpoint and
                  eval fields, refused by both readers.

WHAT IT IS NOT
  Not a test of plan quality, measurement accuracy or OOM recovery; not a fuzzer (every case is a
  fixed, named input; the only randomness is a seeded choice of where a payload goes). It never
  edits the repository: everything it writes is under --work (default /tmp/hostile-campaign).

HOW TO RUN
  cp build/accumplan /tmp/hostile-bin/accumplan      # run against a copy, not a binary being relinked
  build/venv/bin/python scripts/hostile-campaign.py --bin /tmp/hostile-bin/accumplan \\
      [--only CLASS[,CLASS]] [--sample N] [--jobs N<=2] [--json out.json] [--timeout S] [--list]
  CLASS is a class name or number (outputs|1, one-line|2, host-data|3, storage|4, later|5,
  non-utf8|6, report|7, python|8, python-plan|9, knobs|10). Needs a Python with torch (1.13 works) and the accumplan package
  installed (build/venv, as scripts/test.sh makes it: `pip install --no-build-isolation .`) to craft the
  torch.save fixtures and run the Python cases. Children run with OMP_NUM_THREADS=1,
  ACCUMPLAN_MAX_HOST_DATA=1GiB (the documented host-data limit, set below the 4 GiB memory bound),
  stdin /dev/null, their own session (killed as a group on timeout) and an 8 GiB address-space limit.

THE CONTRACT CHECKED
  expect=refuse (most cases): exit status 2; stderr exactly one line ending in '\\n' with no other
    newline and no raw control character; it names the option or value (one of the case's needles,
    case-insensitive); stdout empty; no signal, no hang (timeout), no "internal error"/traceback;
    the case's scratch directory (names, types, sizes, mtimes, SHA-256) unchanged: nothing created,
    deleted or changed (pre-existing outputs stay byte-identical), no *.tmp left.
  expect=ok-or-refuse: either the refusal above, or exit 0 with a well-formed result (the case's
    validator: JSON parses, report parses as XML and holds no raw control character, ...), only
    the case's declared outputs created/changed, no *.tmp left.
  expect=ok: exit 0 with a well-formed result (used for sanity controls).
  Python cases (expect=raise / ok-or-raise): the call raises accumplan.PlanError (or a subclass),
    or exactly ValueError or TypeError, with a one-line message naming the argument; any other
    exception type (OverflowError, RuntimeError, IndexError, UnicodeDecodeError, json's
    JSONDecodeError, RecursionError, MemoryError, KeyError, AttributeError, ...), a crash or a hang
    is a failure. A case may list extra allowed types (OutOfMemoryAtOne for replan_below(1)). The
    message holds no CLI option (--target-batch) outside a quoted command (`accumplan profile
    --seq-len 512`): a Python caller is told the argument's name.
  Every case: max RSS of the child <= 4 GiB.

OUTPUT
  A table by class (cases, passed, skipped, failures by kind) and every failing case with its
  (shortened) command and the first 200 characters of stderr. Exit status 0 when nothing failed,
  1 otherwise. --json writes every case's result.
"""

import argparse
import collections
import concurrent.futures
import hashlib
import io
import json
import os
import pickle
import random
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLASSES = ["outputs", "one-line", "host-data", "storage", "later", "non-utf8", "report", "python", "python-plan",
           "knobs"]
GiB = 1 << 30
RSS_LIMIT = 4 * GiB
CLI_OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
AS_LIMIT = 8 * GiB
SEED = 20240601
SAMPLE_PER_CLASS = 4  # --sample N draws N cases, then tops up every class to at least this many

BIN = None      # set in main()
FIX = None      # fixtures directory
WORK = None

# --------------------------------------------------------------------------------------------------
# cases


class Case:
    def __init__(self, cls, name, argv=None, py=None, expect="refuse", files=None, names=(), validate=None,
                 outputs=(), timeout=None, env=None, heavy=False, skip=None, allow=()):
        self.cls, self.name = cls, name
        self.argv, self.py = argv, py
        self.expect = expect
        self.files = files or {}
        self.names = tuple(names)
        self.validate = validate
        self.outputs = tuple(outputs)
        self.timeout = timeout
        self.env = env or {}
        self.heavy = heavy
        self.skip = skip
        self.allow = tuple(allow)
        self.id = None


CASES = []


def add(*a, **k):
    c = Case(*a, **k)
    CASES.append(c)
    return c


def fx(name):
    return os.path.join(FIX, name)


def with_opt(argv, opt, value):
    """argv with option `opt` set to `value`: replaces the value of an `opt` already there (so the
    case tests the value, not `opt` given twice), else appends `opt value`."""
    argv = list(argv)
    if opt in argv:
        argv[argv.index(opt) + 1] = value
        return argv
    return argv + [opt, value]


def main_cmd(*extra, model="builtin:mlp", budget="64MiB", tb="8"):
    base = [BIN, "--model", model, "--target-batch", tb, "--memory-budget", budget, "--device", "cpu",
            "--threads", "1", "--progress", "none"]
    return base + list(extra)


def profile_cmd(*extra):
    return [BIN, "profile", "--model", "builtin:mlp", "--target-batch", "8", "--memory-budget", "64MiB",
            "--device", "cpu", "--threads", "1", "--progress", "none"] + list(extra)


def plan_cmd(*extra, profile=None):
    return [BIN, "plan", "--profile", profile or fx("profile.json"), "--target-batch", "64",
            "--memory-budget", "256MiB"] + list(extra)


def export_cmd(*extra, plan=None, to="deepspeed"):
    return [BIN, "export", "--plan", plan or fx("plan.json"), "--to", to] + list(extra)


def report_cmd(inp=None, *extra):
    return [BIN, "report", inp or fx("plan.json")] + list(extra)


def run_cmd(*extra, plan=None, model="builtin:mlp"):
    return [BIN, "run", "--plan", plan or fx("mlp.plan.json"), "--model", model, "--threads", "1",
            "--progress", "none", "--steps", "1"] + list(extra)


def verify_cmd(*extra, plan=None):
    return [BIN, "verify", "--plan", plan or fx("mlp.plan.json"), "--model", "builtin:mlp", "--threads", "1"] + list(extra)


# --------------------------------------------------------------------------------------------------
# validators (for cases that may succeed): take (case_dir, stdout_bytes) and return None or a problem


def _ctrl_free(data, what):
    for i, ch in enumerate(data):
        if ch < 32 and ch not in (9, 10, 13) or ch == 127:
            return "%s holds raw control byte 0x%02x at %d" % (what, ch, i)
    return None


def v_json_stdout(d, out):
    try:
        json.loads(out.decode("utf-8"))
    except Exception as e:  # noqa: BLE001
        return "stdout is not JSON: %s" % str(e)[:80]
    return None


def v_nonempty_stdout(d, out):
    return None if out.strip() else "stdout is empty"


def v_json_file(name):
    def v(d, out):
        p = os.path.join(d, name) if isinstance(name, str) else os.path.join(os.fsencode(d), name)
        try:
            with open(p, "rb") as f:
                json.loads(f.read().decode("utf-8"))
        except Exception as e:  # noqa: BLE001
            return "%r is not JSON: %s" % (name, str(e)[:80])
        return None
    return v


def check_report_bytes(data, what):
    prob = _ctrl_free(data, what)
    if prob:
        return prob
    try:
        ET.fromstring(data)
    except Exception as e:  # noqa: BLE001
        return "%s is not well-formed XML: %s" % (what, str(e)[:100])
    return None


def v_report_file(name):
    def v(d, out):
        p = os.path.join(os.fsencode(d), os.fsencode(name))
        try:
            with open(p, "rb") as f:
                data = f.read()
        except OSError as e:
            return "report %r not written: %s" % (name, e)
        return check_report_bytes(data, "report %r" % name)
    return v


def v_report_stdout(d, out):
    return check_report_bytes(out, "report on stdout")


def v_not_verbatim(payload, also_json=False):
    raw = payload.encode("utf-8", "surrogateescape") if isinstance(payload, str) else payload

    def v(d, out):
        if raw in out:
            return "the raw value %r appears unescaped in the output" % raw[:40]
        if also_json:
            return v_json_stdout(d, out)
        return None
    return v


# --------------------------------------------------------------------------------------------------
# fixtures


def run_quiet(argv, cwd, env=None):
    r = subprocess.run(argv, cwd=cwd, env=env or child_env(), stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    if r.returncode != 0:
        raise SystemExit("fixture command failed (%d): %s\n%s" % (r.returncode, " ".join(map(str, argv)),
                                                                    r.stderr.decode(errors="replace")[-2000:]))
    return r.stdout


HOST_DATA_LIMIT = "1GiB"


def child_env(extra=None):
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "NO_COLOR": "1",
                "PYTHONDONTWRITEBYTECODE": "1"})
    # The documented host-data limit (16 GiB, or half the machine's memory) is above this campaign's
    # 4 GiB memory bound: children run under a 1 GiB limit, so the bound checks that the limit holds.
    env["ACCUMPLAN_MAX_HOST_DATA"] = HOST_DATA_LIMIT
    if extra:
        env.update(extra)
    return env


class _Stor:
    def __init__(self, key, numel, cls="FloatStorage"):
        self.key, self.numel, self.cls = key, numel, cls


class _T:
    def __init__(self, stor, offset, size, stride):
        self.stor, self.offset, self.size, self.stride = stor, offset, size, stride

    def __reduce__(self):
        import torch
        return (torch._utils._rebuild_tensor_v2,
                (self.stor, self.offset, tuple(self.size), tuple(self.stride), False, collections.OrderedDict()))


def crafted_pickle(obj):
    import torch

    class P(pickle.Pickler):
        def persistent_id(self, o):
            if isinstance(o, _Stor):
                return ("storage", getattr(torch, o.cls), o.key, "cpu", o.numel)
            return None
    buf = io.BytesIO()
    P(buf, protocol=2).dump(obj)
    return buf.getvalue()


def write_archive(path, pkl, records, version=b"3\n", prefix="archive", extra=None):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(prefix + "/data.pkl", pkl)
        for key, data in records.items():
            z.writestr(prefix + "/data/" + key, data)
        if version is not None:
            z.writestr(prefix + "/version", version)
        for k, v in (extra or {}).items():
            z.writestr(k, v)


def build_fixtures(fix, skip_bomb=False):
    """Writes every shared fixture into `fix`, in a fixed order from seeded generators."""
    import torch
    torch.manual_seed(SEED)
    g = torch.Generator().manual_seed(SEED)
    os.makedirs(fix, exist_ok=True)
    build_base_fixtures(fix, g)
    build_host_data_fixtures(g)
    build_storage_fixtures(skip_bomb)
    build_later_fixtures(g)

    # python-side: a token-plan model
    return True


def build_base_fixtures(fix, g):
    """The profile, the plans and stats the binary writes, an mlp batch, ragged tokens and a model file."""
    import torch
    shutil.copy(os.path.join(ROOT, "examples/profiles/builtin-convnet-cpu.profile.json"), fx("profile.json"))
    run_quiet(plan_cmd("--out", fx("plan.json")), fix)
    run_quiet(main_cmd("--out", fx("mlp.plan.json")), fix)
    run_quiet(with_opt(run_cmd("--stats", fx("mlp.stats.json")), "--steps", "2"), fix)
    # flat mlp data: float32 [n,64], int64 [n] in [0,10)
    torch.save([torch.randn(16, 64, generator=g), torch.randint(0, 10, (16,), generator=g)], fx("mlp.batch.pt"))
    # ragged token data for builtin:tinylm (vocabulary 1000)
    seqs = [torch.randint(0, 1000, (n,), generator=g) for n in [5, 9, 12, 7, 16, 3, 11, 8]]
    torch.save([seqs, None], fx("ragged.pt"))
    run_quiet(main_cmd("--batch-file", fx("ragged.pt"), "--out", fx("tl.plan.json"), model="builtin:tinylm",
                       budget="256MiB"), fix)
    with open(fx("seqlens.txt"), "w") as f:
        f.write("5 9 12\n7 16\n")
    # a TorchScript model file for path cases
    m = torch.jit.script(torch.nn.Linear(64, 10))
    m.save(fx("linear.pt"))


def build_host_data_fixtures(g):
    """Class 3's files: ragged data whose padding is huge, many views into one storage, odd length files."""
    import torch

    def ragged(name, long_len, n_short, short_len=4, targets=None):
        ss = [torch.zeros(short_len, dtype=torch.long) for _ in range(n_short)]
        ss.insert(n_short // 2, torch.zeros(long_len, dtype=torch.long))
        torch.save([ss, targets], fx(name))
    ragged("h_pad_320g.pt", 1 << 22, 10000)           # padded 10001 x 4Mi x 8 B = 320 GiB
    ragged("h_pad_64g.pt", 1 << 20, 8192)             # 64 GiB
    ragged("h_pad_17g.pt", 1 << 18, 8704)             # 17 GiB: just over 16 GiB
    ragged("h_pad_2g.pt", 1 << 16, 4096)              # 2 GiB: under the limit
    ragged("h_pad_few.pt", 1 << 20, 2)                # 3 x 1Mi x 8 = 24 MiB: fine
    base = torch.zeros(1 << 20, dtype=torch.long)
    views = [base[i:i + 16] for i in range(100000)]
    torch.save([views, None], fx("h_views16.pt"))      # 10^5 views of 16 tokens into one 8 MiB storage
    views = [base[i:] for i in range(0, 100000)]
    torch.save([views, None], fx("h_viewslong.pt"))    # 10^5 views, each up to 1Mi tokens: 800 GiB padded
    bigx = torch.randn(1 << 21, 64)
    torch.save([bigx[:16], torch.randint(0, 10, (16,), generator=g)], fx("h_flat_view.pt"))  # 512 MiB storage, 16 rows
    x = torch.randn(64)
    torch.save([[x[:] for _ in range(100000)][0:1][0].expand(100000, 64), torch.zeros(100000, dtype=torch.long)],
               fx("h_expand.pt"))                     # stride-0 input of 10^5 samples
    torch.save([torch.randn(4, 64), torch.randint(0, 10, (4,), generator=g)], fx("h_small.pt"))
    build_seq_len_files()


def build_seq_len_files():
    """Class 3's --seq-len-file inputs: huge, many, over-long, non-integer, negative, empty and NUL lengths."""
    with open(fx("h_lens_huge.txt"), "w") as f:
        f.write("16\n2147483648\n")
    with open(fx("h_lens_max.txt"), "w") as f:
        f.write("16 2147483647\n")
    with open(fx("h_lens_many.txt"), "w") as f:
        rnd = random.Random(SEED)
        for _ in range(200000):
            f.write("%d\n" % rnd.randint(1, 32))
    with open(fx("h_lens_digits.txt"), "w") as f:
        f.write("9" * 2000000 + "\n")
    with open(fx("h_lens_float.txt"), "w") as f:
        f.write("16 1e9 32\n")
    with open(fx("h_lens_neg.txt"), "w") as f:
        f.write("16 -5 32\n")
    with open(fx("h_lens_zero.txt"), "w") as f:
        f.write("0\n")
    with open(fx("h_lens_empty.txt"), "w") as f:
        f.write("")
    with open(fx("h_lens_text.txt"), "w") as f:
        f.write("16 abc 32\n")
    with open(fx("h_lens_nul.txt"), "wb") as f:
        f.write(b"16\x0032\n")
    with open(fx("h_lens_u64.txt"), "w") as f:
        f.write("18446744073709551617\n")


def build_storage_fixtures(skip_bomb):
    """Class 4's files: crafted archives first, then the files that are no archive, then the zip bomb."""
    build_storage_archives()
    build_storage_non_archives()
    if not skip_bomb:
        build_zip_bomb()


def build_storage_archives():
    """Class 4's hand-crafted torch.save archives: short, missing or mismatched records and bad pickles."""
    fl = lambda n: bytes(4 * n)  # noqa: E731
    tgt = _T(_Stor("1", 16, "LongStorage"), 0, [16], [1])
    tgt_rec = bytes(8 * 16)

    def flat(name, x_tensor, records, **kw):
        write_archive(fx(name), crafted_pickle([x_tensor, tgt]), dict(records, **{"1": tgt_rec}), **kw)

    s = _Stor("0", 16 * 64)
    flat("s_ok.pt", _T(s, 0, [16, 64], [64, 1]), {"0": fl(16 * 64)})                  # a valid control
    flat("s_short0.pt", _T(s, 0, [16, 64], [64, 1]), {"0": b""})
    flat("s_short1.pt", _T(s, 0, [16, 64], [64, 1]), {"0": b"\0"})
    flat("s_shorthalf.pt", _T(s, 0, [16, 64], [64, 1]), {"0": fl(8 * 64)})
    flat("s_shortbyte.pt", _T(s, 0, [16, 64], [64, 1]), {"0": fl(16 * 64)[:-1]})
    s40 = _Stor("0", 10)
    flat("s_shape_over.pt", _T(s40, 0, [16, 64], [64, 1]), {"0": fl(10)})            # shape >> storage, record ok
    flat("s_offset_over.pt", _T(_Stor("0", 16 * 64), 10 ** 6, [16, 64], [64, 1]), {"0": fl(16 * 64)})
    flat("s_stride_over.pt", _T(_Stor("0", 16 * 64), 0, [16, 64], [1 << 40, 1]), {"0": fl(16 * 64)})
    flat("s_stride_neg.pt", _T(_Stor("0", 16 * 64), 0, [16, 64], [-64, 1]), {"0": fl(16 * 64)})
    flat("s_stride0_huge.pt", _T(_Stor("0", 64), 0, [1 << 40, 64], [0, 1]), {"0": fl(64)})
    flat("s_shape_overflow.pt", _T(_Stor("0", 64), 0, [1 << 62, 1 << 4], [1, 1]), {"0": fl(64)})
    flat("s_shape_neg.pt", _T(_Stor("0", 64), 0, [-16, 64], [64, 1]), {"0": fl(64)})
    flat("s_numel_2p40.pt", _T(_Stor("0", 1 << 40), 0, [16, 64], [64, 1]), {"0": fl(10)})
    flat("s_numel_2p62.pt", _T(_Stor("0", 1 << 62), 0, [16, 64], [64, 1]), {"0": fl(10)})
    flat("s_numel_neg.pt", _T(_Stor("0", -1), 0, [16, 64], [64, 1]), {"0": fl(16 * 64)})
    flat("s_missing.pt", _T(s, 0, [16, 64], [64, 1]), {})
    flat("s_wrongkey.pt", _T(_Stor("7", 16 * 64), 0, [16, 64], [64, 1]), {"0": fl(16 * 64)})
    # one key shared: the second tensor declares a far larger storage than the first read
    write_archive(fx("s_shared_key.pt"), crafted_pickle(
        [_T(_Stor("0", 16 * 64), 0, [16, 64], [64, 1]), _T(_Stor("0", 1 << 40, "LongStorage"), 0, [1 << 36], [1])]),
        {"0": fl(16 * 64)})
    write_archive(fx("s_badtype.pt"), crafted_pickle(
        [_T(_Stor("0", 16 * 64, "QUInt8Storage"), 0, [16, 64], [64, 1]), tgt]), {"0": fl(16 * 64), "1": tgt_rec})
    write_archive(fx("s_garbage_pkl.pt"), bytes(random.Random(SEED).randrange(256) for _ in range(512)), {})
    write_archive(fx("s_empty_pkl.pt"), b"", {})
    write_archive(fx("s_trunc_pkl.pt"), crafted_pickle([_T(s, 0, [16, 64], [64, 1]), tgt])[:40], {"0": fl(16 * 64)})
    write_archive(fx("s_os_system.pt"), b"cos\nsystem\n(S'touch /tmp/hostile-pwned'\ntR.", {})
    write_archive(fx("s_deep_pkl.pt"), b"\x80\x02" + b"]" * 200000 + b"." , {})
    write_archive(fx("s_noversion.pt"), crafted_pickle([_T(s, 0, [16, 64], [64, 1]), tgt]),
                  {"0": fl(16 * 64), "1": tgt_rec}, version=None)
    write_archive(fx("s_badversion.pt"), crafted_pickle([_T(s, 0, [16, 64], [64, 1]), tgt]),
                  {"0": fl(16 * 64), "1": tgt_rec}, version=b"99999999999999999999\n")
    write_archive(fx("s_notensor.pt"), crafted_pickle({"a": 1}), {})


def build_storage_non_archives():
    """Class 4's files that are no valid archive: no data.pkl, the legacy format, random bytes, empty, text, truncated."""
    import torch
    with zipfile.ZipFile(fx("s_nodatapkl.pt"), "w") as z:
        z.writestr("archive/version", b"3\n")
    torch.save([torch.randn(16, 64), torch.randint(0, 10, (16,))], fx("s_legacy.pt"),
               _use_new_zipfile_serialization=False)
    with open(fx("s_random.pt"), "wb") as f:
        f.write(bytes(random.Random(SEED + 1).randrange(256) for _ in range(4096)))
    with open(fx("s_empty.pt"), "wb"):
        pass
    with open(fx("s_text.pt"), "w") as f:
        f.write("[1, 2, 3]\n")
    good = open(fx("mlp.batch.pt"), "rb").read()
    with open(fx("s_truncated_zip.pt"), "wb") as f:
        f.write(good[: len(good) // 2])


def build_zip_bomb():
    """Class 4's zip bomb: a deflated data.pkl of 4.5 GiB of zeros (about 4.5 MiB on disk); inflating it is the attack."""
    with zipfile.ZipFile(fx("s_bomb.pt"), "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        with z.open("archive/data.pkl", "w", force_zip64=True) as w:
            chunk = bytes(64 << 20)
            for _ in range(72):
                w.write(chunk)
        z.writestr("archive/version", b"3\n")


def build_later_fixtures(g):
    """Class 5's files: values a parser accepts but a later step refuses, flat data first, then ragged tokens."""
    build_later_flat(g)
    build_later_tokens(g)


def build_later_flat(g):
    """Class 5's flat data: targets out of range or of the wrong dtype or shape, odd inputs, odd containers."""
    import torch

    def flat5(name, x, y):
        torch.save([x, y], fx(name))
    X = torch.randn(16, 64, generator=g)
    flat5("l_neg_class.pt", X, torch.tensor([-1] + [1] * 15))
    flat5("l_neg_class5.pt", X, torch.tensor([3] * 15 + [-5]))
    flat5("l_class_eq.pt", X, torch.tensor([10] + [1] * 15))
    flat5("l_class_huge.pt", X, torch.tensor([1 << 40] + [1] * 15))
    flat5("l_all_ignore.pt", X, torch.full((16,), -100, dtype=torch.long))
    flat5("l_float_target.pt", X, torch.randn(16))
    flat5("l_int32_target.pt", X, torch.randint(0, 10, (16,), dtype=torch.int32))
    flat5("l_uint8_target.pt", X, torch.randint(0, 10, (16,), dtype=torch.uint8))
    flat5("l_bool_target.pt", X, torch.ones(16, dtype=torch.bool))
    flat5("l_target_2d.pt", X, torch.randint(0, 10, (16, 2)))
    flat5("l_int_input.pt", torch.randint(0, 10, (16, 64)), torch.randint(0, 10, (16,)))
    flat5("l_nan_input.pt", torch.full((16, 64), float("nan")), torch.randint(0, 10, (16,)))
    flat5("l_len_mismatch.pt", X, torch.randint(0, 10, (15,)))
    flat5("l_zero_samples.pt", torch.randn(0, 64), torch.zeros(0, dtype=torch.long))
    flat5("l_scalar_target.pt", X, torch.tensor(3))
    flat5("l_wrong_width.pt", torch.randn(16, 63), torch.randint(0, 10, (16,)))
    torch.save([X], fx("l_one_tensor.pt"))
    torch.save({"x": X, "y": torch.zeros(16, dtype=torch.long)}, fx("l_dict.pt"))
    torch.save(X, fx("l_tensor.pt"))
    torch.save([[X], [torch.zeros(16, dtype=torch.long)]], fx("l_nested.pt"))


def build_later_tokens(g):
    """Class 5's ragged token data: token ids or targets out of range, mixed dtypes, odd shapes, too long."""
    import torch

    def rag5(name, seqs, targets):
        torch.save([seqs, targets], fx(name))
    S = [torch.randint(0, 1000, (n,), generator=g) for n in [5, 9, 12, 7]]
    rag5("l_tok_neg.pt", [S[0], torch.tensor([1, -1, 2]), S[2]], None)
    rag5("l_tok_eq.pt", [S[0], torch.tensor([1, 1000, 2]), S[2]], None)
    rag5("l_tok_huge.pt", [S[0], torch.tensor([1, 1 << 40, 2]), S[2]], None)
    rag5("l_tok_all_ignore.pt", S, [torch.full((len(s),), -100, dtype=torch.long) for s in S])
    rag5("l_tok_len1_next.pt", [torch.tensor([5]), torch.tensor([7])], None)  # next-token: no valid token
    rag5("l_tok_float_after_int.pt", S, [torch.randint(0, 1000, (len(s),)) for s in S[:3]] + [torch.randn(len(S[3]))])
    rag5("l_tok_mixed_dtype.pt", [S[0], S[1].to(torch.int32), S[2]], None)
    rag5("l_tok_float_seq.pt", [S[0], S[1].float(), S[2]], None)
    rag5("l_tok_empty_seq.pt", [S[0], torch.zeros(0, dtype=torch.long), S[2]], None)
    rag5("l_tok_2d_seq.pt", [S[0], torch.zeros(3, 4, dtype=torch.long), S[2]], None)
    rag5("l_tok_target_len.pt", S, [torch.randint(0, 1000, (len(s) + 1,)) for s in S])
    rag5("l_tok_target_count.pt", S, [torch.randint(0, 1000, (len(s),)) for s in S[:2]])
    rag5("l_tok_target_neg.pt", S, [torch.full((len(s),), -7, dtype=torch.long) for s in S])
    rag5("l_tok_target_big.pt", S, [torch.full((len(s),), 5000, dtype=torch.long) for s in S])
    rag5("l_tok_long.pt", S + [torch.randint(0, 1000, (40,), generator=g)], None)  # 40 > tl plan's 16
    rag5("l_tok_nothing.pt", [], None)
    rag5("l_tok_notlist.pt", S[0], None)


# --------------------------------------------------------------------------------------------------
# JSON document mutation helpers


def load_fix_json(name):
    with open(fx(name), "rb") as f:
        return json.loads(f.read().decode("utf-8"))


def set_path(doc, path, value):
    cur = doc
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    return doc


def mutated(name, path, value, raw=None):
    """The bytes of fixture `name` with `path` set to `value`; `raw` (bytes) replaces the
    placeholder string @@RAW@@ after dumping (for invalid UTF-8 or invalid JSON)."""
    doc = load_fix_json(name)
    set_path(doc, path, value)
    data = json.dumps(doc, indent=1, ensure_ascii=False).encode("utf-8", "surrogatepass")
    if raw is not None:
        data = data.replace(b"@@RAW@@", raw)
    return data


# --------------------------------------------------------------------------------------------------
# class 1: outputs

OUTPUT_OPTS = [
    ("main", main_cmd, "--out"), ("main", main_cmd, "--report"),
    ("plan", plan_cmd, "--out"), ("export", export_cmd, "--out"),
    ("report", lambda *e: report_cmd(None, *e), "--out"),
    ("run", run_cmd, "--save"), ("run", run_cmd, "--stats"), ("run", run_cmd, "--plan-out"),
    ("run", run_cmd, "--trace"), ("verify", verify_cmd, "--json"), ("profile", profile_cmd, "--out"),
]

BAD_OTHER = {  # a second, bad option that makes the command refuse while a valid output is given
    "main": ("--target-batch", "0"), "plan": ("--world-size", "0"), "export": ("--to", "nope"),
    "report": ("--format", "pdf"), "run": ("--epochs", "0"), "verify": ("--device", "nope"),
    "profile": ("--world-size", "0"),
}


OLD = b'{"pre-existing": "must stay byte-identical"}\n'  # an output a refusal must leave as it was


def gen_outputs():
    """Class 1: outputs that cannot be written, outputs onto inputs or onto each other, outputs kept."""
    cls = "outputs"
    gen_outputs_per_option(cls)
    gen_outputs_onto_inputs(cls)
    gen_outputs_onto_each_other(cls)
    gen_outputs_kept(cls)


def gen_outputs_per_option(cls):
    """Every output option into a missing, non-directory, unwritable or over-long place, and kept on a refusal."""
    root = os.geteuid() == 0
    for sub, mk, opt in OUTPUT_OPTS:
        o = opt.lstrip("-")
        tag = "%s %s" % (sub, opt)
        add(cls, tag + " into a missing directory", mk(opt, "nodir/x.json"), names=(o, "nodir"))
        add(cls, tag + " onto a directory", mk(opt, "adir"), files={"adir": ("dir",)}, names=(o, "adir"))
        add(cls, tag + " empty ''", mk(opt, ""), names=(o,))
        add(cls, tag + " under a regular file", mk(opt, "afile/x.json"), files={"afile": b"data\n"}, names=(o, "afile"))
        add(cls, tag + " name longer than NAME_MAX", mk(opt, "n" * 300 + ".json"), names=(o, "nnnn"))
        bo, bv = BAD_OTHER[sub]
        add(cls, tag + " pre-existing output kept when another option is bad (%s %s)" % (bo, bv),
            with_opt(mk(opt, "old.json"), bo, bv), files={"old.json": OLD}, names=(bo.lstrip("-"),))
        add(cls, tag + " into an unwritable directory (chmod 555)", mk(opt, "ro/x.json"),
            files={"ro": ("dir", 0o555)}, names=(o, "ro"),
            skip="running as root: chmod 555 does not stop root" if root else None)
        add(cls, tag + " onto a read-only existing file (chmod 444)", mk(opt, "ro.json"),
            files={"ro.json": (OLD, 0o444)}, names=(o, "ro.json"), expect="refuse",
            skip="running as root: chmod 444 does not stop root" if root else None)


def gen_outputs_onto_inputs(cls):
    """An output that is one of the command's inputs: the same name, through ./, sub/.., a symlink, a hard link."""
    prof = ("copy", "profile.json")
    plan = ("copy", "plan.json")
    mplan = ("copy", "mlp.plan.json")
    batch = ("copy", "mlp.batch.pt")
    stats = ("copy", "mlp.stats.json")
    lens = ("copy", "seqlens.txt")
    same = [
        ("plan --out == --profile", plan_cmd("--out", "in.json", profile="in.json"), {"in.json": prof}, ("out",)),
        ("plan --out ./in == --profile in", plan_cmd("--out", "./in.json", profile="in.json"), {"in.json": prof}, ("out",)),
        ("plan --out sub/../in == --profile in", plan_cmd("--out", "sub/../in.json", profile="in.json"),
         {"in.json": prof, "sub": ("dir",)}, ("out",)),
        ("plan --out symlink-to --profile", plan_cmd("--out", "link.json", profile="in.json"),
         {"in.json": prof, "link.json": ("symlink", "in.json")}, ("out",)),
        ("plan --out hardlink-of --profile", plan_cmd("--out", "hard.json", profile="in.json"),
         {"in.json": prof, "hard.json": ("hardlink", "in.json")}, ("out",)),
        ("plan --out abs == --profile rel", None, {"in.json": prof}, ("out",)),
        ("export --out == --plan", export_cmd("--out", "in.json", plan="in.json"), {"in.json": plan}, ("out",)),
        ("export --out ./in == --plan", export_cmd("--out", "./in.json", plan="in.json"), {"in.json": plan}, ("out",)),
        ("export --out symlink == --plan", export_cmd("--out", "l.json", plan="in.json"),
         {"in.json": plan, "l.json": ("symlink", "in.json")}, ("out",)),
        ("report --out == input", report_cmd("in.json", "--out", "in.json", "--format", "html"), {"in.json": plan}, ("out",)),
        ("report --out == --stats", report_cmd("in.json", "--stats", "st.json", "--out", "st.json", "--format", "svg"),
         {"in.json": mplan, "st.json": stats}, ("out", "stats")),
        ("report --out hardlink of input", report_cmd("in.json", "--out", "h.html"),
         {"in.json": plan, "h.html": ("hardlink", "in.json")}, ("out",)),
        ("run --stats == --plan", run_cmd("--stats", "p.json", plan="p.json"), {"p.json": mplan}, ("stats",)),
        ("run --plan-out == --plan", run_cmd("--plan-out", "p.json", plan="p.json"), {"p.json": mplan}, ("plan-out",)),
        ("run --save == --plan", run_cmd("--save", "p.json", plan="p.json"), {"p.json": mplan}, ("save",)),
        ("run --trace == --data", run_cmd("--data", "d.pt", "--trace", "d.pt"), {"d.pt": batch}, ("trace",)),
        ("run --save == --model file", run_cmd("--save", "m.pt", "--force", model="m.pt"),
         {"m.pt": ("copy", "linear.pt")}, ("save",)),
        ("run --stats == --seq-len-file", run_cmd("--seq-len-file", "l.txt", "--stats", "l.txt", plan=fx("tl.plan.json"),
                                                  model="builtin:tinylm"), {"l.txt": lens}, ("stats",)),
        ("verify --json == --plan", verify_cmd("--json", "p.json", plan="p.json"), {"p.json": mplan}, ("json",)),
        ("verify --json == --data", verify_cmd("--data", "d.pt", "--json", "d.pt"), {"d.pt": batch}, ("json",)),
        ("main --out == --batch-file", main_cmd("--batch-file", "d.pt", "--out", "d.pt"), {"d.pt": batch}, ("out",)),
        ("main --report == --batch-file", main_cmd("--batch-file", "d.pt", "--report", "d.pt"), {"d.pt": batch}, ("report",)),
        ("main --out == --seq-len-file", main_cmd("--seq-len-file", "l.txt", "--out", "l.txt", "--input", "int64[B,T]:1000",
                                                  "--target", "int64[B,T]:1000", model="builtin:tinylm"),
         {"l.txt": lens}, ("out",)),
        ("main --out == --model file", main_cmd("--out", "m.pt", "--input", "float32[B,64]", "--target", "int64[B]:10",
                                                model="m.pt"), {"m.pt": ("copy", "linear.pt")}, ("out",)),
        ("profile --out == --batch-file", profile_cmd("--batch-file", "d.pt", "--out", "./d.pt"), {"d.pt": batch}, ("out",)),
    ]
    for name, argv, files, names in same:
        if argv is None:
            continue
        add(cls, name, argv, files=files, names=names)


def gen_outputs_onto_each_other(cls):
    """Two outputs on one file, or both on stdout."""
    pairs = [
        ("run --stats == --trace", run_cmd("--stats", "a.json", "--trace", "a.json")),
        ("run --save == --plan-out", run_cmd("--save", "a.json", "--plan-out", "a.json")),
        ("run --stats == --plan-out via ./", run_cmd("--stats", "a.json", "--plan-out", "./a.json")),
        ("run --trace == --save via sub/..", run_cmd("--trace", "a.json", "--save", "sub/../a.json")),
        ("run --stats symlink == --trace", run_cmd("--stats", "l.json", "--trace", "a.json")),
        ("main --out == --report", main_cmd("--out", "a.json", "--report", "a.json")),
        ("main --out == --report via ./", main_cmd("--out", "./a.html", "--report", "a.html")),
        ("run --stats - --plan-out -", run_cmd("--stats", "-", "--plan-out", "-")),
        ("run --stats - --trace -", run_cmd("--stats", "-", "--trace", "-")),
        ("run --stats - --save -", run_cmd("--stats", "-", "--save", "-")),
        ("main --out - --report -", main_cmd("--out", "-", "--report", "-")),
        ("main --out /dev/stdout --report -", main_cmd("--out", "/dev/stdout", "--report", "-")),
        ("run --stats /dev/stdout --plan-out -", run_cmd("--stats", "/dev/stdout", "--plan-out", "-")),
    ]
    for name, argv in pairs:
        files = {"sub": ("dir",)}
        if "symlink" in name:
            files["l.json"] = ("symlink", "a.json")
        add(cls, name, argv, files=files, names=("stats", "out", "trace", "save", "plan-out", "report", "stdout", "-"))


def gen_outputs_kept(cls):
    """Pre-existing outputs with a second invalid output or a refused input: neither written."""
    for name, argv, keep in [
        ("run: --stats existing kept when --trace dir is missing", run_cmd("--stats", "old.json", "--trace", "nodir/t.json"), "old.json"),
        ("run: --plan-out existing kept when --save is a directory", run_cmd("--plan-out", "old.json", "--save", "adir"), "old.json"),
        ("run: --trace existing kept when --stats is ''", run_cmd("--trace", "old.json", "--stats", ""), "old.json"),
        ("main: --out existing kept when --report dir is missing", main_cmd("--out", "old.json", "--report", "nodir/r.html"), "old.json"),
        ("main: --report existing kept when --out is a directory", main_cmd("--report", "old.html", "--out", "adir"), "old.html"),
        ("run: --stats existing kept when the model's SHA-256 differs", run_cmd("--stats", "old.json", model="builtin:convnet"), "old.json"),
        ("run: --plan-out existing kept when --data is missing", run_cmd("--plan-out", "old.json", "--data", "nodata.pt"), "old.json"),
        ("verify: --json existing kept when --data is missing", verify_cmd("--json", "old.json", "--data", "nodata.pt"), "old.json"),
        ("export: --out existing kept when the plan is missing", export_cmd("--out", "old.json", plan="noplan.json"), "old.json"),
        ("report: --out existing kept when --stats is missing", report_cmd(None, "--stats", "nostats.json", "--out", "old.json"), "old.json"),
        ("plan: --out existing kept when infeasible (1 KiB budget)",
         [BIN, "plan", "--profile", fx("profile.json"), "--target-batch", "64", "--memory-budget", "1KiB", "--out", "old.json"], "old.json"),
        ("main: --out existing kept when the budget is too small to measure", main_cmd("--out", "old.json", budget="1KiB"), "old.json"),
    ]:
        add(cls, name, argv, files={keep: OLD, "adir": ("dir",)},
            names=("trace", "report", "save", "stats", "out", "nodata", "noplan", "nostats", "sha", "budget", "1KiB",
                   "1.0 KiB", "1024", "memory"))


# --------------------------------------------------------------------------------------------------
# class 2: one-line

CTRL = ["\n", "\r", "\t", "\x1b[31m", "\x07", "\x7f", "\x01", "\x0b", "\x0c", "\r\n", "\x08", "\x1b]0;x\x07"]


NUMERIC_OPTS = {"--target-batch", "--ignore-index", "--lr", "--steps", "--rtol", "--probe-sizes", "--headroom"}
WHITESPACE = {"\n", "\r", "\t", "\x0b", "\x0c", "\r\n"}


def poison(value, payload, rnd):
    where = rnd.choice(["suffix", "prefix", "middle"])
    if where == "suffix":
        return value + payload
    if where == "prefix":
        return payload + value
    cut = max(1, len(value) // 2)
    return value[:cut] + payload + value[cut:]


def gen_one_line():
    cls = "one-line"
    rnd = random.Random(SEED + 2)
    opts = [
        ("main", main_cmd, "--progress", "none"), ("main", main_cmd, "--loss", "cross_entropy"),
        ("main", main_cmd, "--normalization", "auto"), ("main", main_cmd, "--optimizer", "sgd"),
        ("main", main_cmd, "--amp", "none"), ("main", main_cmd, "--device", "cpu"),
        ("main", main_cmd, "--memory-budget", "64MiB"), ("main", main_cmd, "--headroom", "auto"),
        ("main", main_cmd, "--probe", "auto"), ("main", main_cmd, "--probe-sizes", "2,4"),
        ("main", main_cmd, "--split", "balanced"), ("main", main_cmd, "--model", "builtin:mlp"),
        ("main", main_cmd, "--input", "float32[B,64]"), ("main", main_cmd, "--target", "int64[B]:10"),
        ("main", main_cmd, "--seq-len", "16..32"), ("main", main_cmd, "--target-batch", "8"),
        ("main", main_cmd, "--ignore-index", "-100"), ("main", main_cmd, "--lr", "0.01"),
        ("main", main_cmd, "--batch-file", "mlp.batch.pt"),
        ("plan", plan_cmd, "--split", "balanced"), ("plan", plan_cmd, "--headroom", "0.05"),
        ("plan", plan_cmd, "--memory-budget", "256MiB"), ("plan", plan_cmd, "--profile", "profile.json"),
        ("export", export_cmd, "--to", "deepspeed"), ("export", export_cmd, "--plan", "plan.json"),
        ("report", lambda *e: report_cmd(None, *e, "--out", "r.html"), "--format", "html"),
        ("run", run_cmd, "--progress", "plain"), ("run", run_cmd, "--amp", "none"),
        ("run", run_cmd, "--device", "cpu"), ("run", run_cmd, "--memory-budget", "64MiB"),
        ("run", run_cmd, "--model", "builtin:mlp"), ("run", run_cmd, "--data", "mlp.batch.pt"),
        ("run", run_cmd, "--steps", "1"),
        ("verify", verify_cmd, "--device", "cpu"), ("verify", verify_cmd, "--rtol", "1e-5"),
        ("profile", profile_cmd, "--probe", "cpu-counting"), ("profile", profile_cmd, "--probe-sizes", "2,4"),
    ]
    for i, (sub, mk, opt, good) in enumerate(opts):
        second = CTRL[1 + i % (len(CTRL) - 1)]
        payloads = ["\n", second if second != "\n" else "\r"]
        for p in payloads:
            v = poison(good, p, rnd)
            files = {}
            if opt in ("--batch-file", "--data", "--profile", "--plan"):
                files = {good: ("copy", good)}  # a valid file of that name; the poisoned name is missing
            argv = with_opt(mk(), opt, v)
            # a number parsed strtol-style skips leading white space: accepting "\n8" as 8 is lenient,
            # not a contract breach (nothing unsafe is echoed); anything else must be refused
            lenient = (opt in NUMERIC_OPTS and p in WHITESPACE and v.startswith(p))
            add(cls, "%s %s %r%s" % (sub, opt, v, " (leading white space: ok or refuse)" if lenient else ""), argv,
                files=files, names=(opt.lstrip("-"),), expect="ok-or-refuse" if lenient else "refuse")
    # free-text options echoed into an output: escaped (exit 0) or refused
    for p in ["\n", "\x1b[2J", "\r", "\x00x"[1:] + "\x07"]:
        add(cls, "export torchrun --binary %r" % ("accum" + p + "plan"),
            export_cmd("--binary", "accum" + p + "plan", to="torchrun"), expect="ok-or-refuse",
            validate=v_not_verbatim("accum" + p + "plan"), names=("binary",))
        add(cls, "export lightning --lightning-datamodule %r" % ("my.Data" + p + "Module"),
            export_cmd("--lightning-datamodule", "my.Data" + p + "Module", to="lightning"), expect="ok-or-refuse",
            validate=v_not_verbatim("my.Data" + p + "Module"), names=("lightning-datamodule", "datamodule"))
    # plan JSON string fields with control characters (the readers must refuse what is not a value)
    fields = [
        ("split", "balanced"), ("schema_version", "1.4"), ("schema", "accumplan.plan"),
        (("setup", "optimizer"), "sgd"), (("setup", "amp"), "none"), (("setup", "loss"), "cross_entropy"),
        (("setup", "normalization"), "auto"), (("device", "type"), "cpu"), (("setup", "inputs", 0), "float32[B,64]"),
        (("setup", "target"), "int64[B]:10"),
    ]
    for j, (path, good) in enumerate(fields):
        path = path if isinstance(path, tuple) else (path,)
        for k, p in enumerate(["\n", "\x1b[31m", "\r"]):
            v = poison(good, p, rnd)
            data = mutated("mlp.plan.json", list(path), v)
            label = ".".join(map(str, path))
            which = (j + k) % 3
            # run and export act on these fields: an enum or spec holding a control character is not
            # a value they know. report only draws: it may accept, but must not echo it raw.
            exp, val, outs = "refuse", None, ()
            if which == 0:
                argv, tag = export_cmd(plan="p.json"), "export"
                if path[-1] in (0, "target"):
                    exp, val = "ok-or-refuse", v_not_verbatim(v, also_json=True)
            elif which == 1:
                argv, tag = run_cmd(plan="p.json"), "run"
            else:
                argv, tag = report_cmd("p.json", "--out", "r.svg"), "report"
                exp, val, outs = "ok-or-refuse", v_report_file("r.svg"), ("r.svg",)
            add(cls, "%s: plan %s = %r" % (tag, label, v), argv, files={"p.json": data}, expect=exp, validate=val,
                outputs=outs, names=(label.split(".")[-1], "p.json"))


# --------------------------------------------------------------------------------------------------
# class 3: host data


def gen_host_data():
    cls = "host-data"
    tl = fx("tl.plan.json")
    for f, note in [("h_pad_320g.pt", "320 GiB padded"), ("h_pad_64g.pt", "64 GiB padded"),
                    ("h_pad_17g.pt", "17 GiB padded"), ("h_viewslong.pt", "10^5 long views, 800 GiB padded")]:
        add(cls, "main --batch-file %s (%s)" % (f, note), main_cmd("--batch-file", fx(f), model="builtin:tinylm"),
            names=(f, "host", "GiB", "GB"))
        add(cls, "run --data %s (%s)" % (f, note), run_cmd("--data", fx(f), plan=tl, model="builtin:tinylm"),
            names=(f, "host", "GiB", "GB", "max_seq_len", "tokens"))
        if f == "h_pad_320g.pt":
            add(cls, "profile --batch-file %s (%s)" % (f, note), profile_cmd("--batch-file", fx(f))[:3] +
                ["builtin:tinylm"] + profile_cmd("--batch-file", fx(f))[4:], names=(f, "host", "GiB", "GB"))
    add(cls, "main --batch-file h_pad_2g.pt with ACCUMPLAN_MAX_HOST_DATA=1GiB",
        main_cmd("--batch-file", fx("h_pad_2g.pt"), model="builtin:tinylm"), env={"ACCUMPLAN_MAX_HOST_DATA": "1GiB"},
        names=("h_pad_2g", "host", "ACCUMPLAN_MAX_HOST_DATA"))
    add(cls, "run --data h_pad_2g.pt with ACCUMPLAN_MAX_HOST_DATA=1GiB",
        run_cmd("--data", fx("h_pad_2g.pt"), plan=tl, model="builtin:tinylm"), env={"ACCUMPLAN_MAX_HOST_DATA": "1GiB"},
        names=("h_pad_2g", "host", "ACCUMPLAN_MAX_HOST_DATA", "max_seq_len"))
    add(cls, "main --batch-file h_pad_2g.pt (2 GiB padded: refuse, or bounded)",
        main_cmd("--batch-file", fx("h_pad_2g.pt"), model="builtin:tinylm", budget="128MiB"), expect="ok-or-refuse",
        validate=v_json_stdout, names=("h_pad_2g", "host", "GiB", "budget", "fit", "memory"), heavy=True, timeout=120)
    for v in ["abc", "-1", "1e400", "0", "1\n", "\x1b[31m", "99999PiB", ""]:
        add(cls, "main with ACCUMPLAN_MAX_HOST_DATA=%r" % v, main_cmd("--batch-file", fx("ragged.pt"), model="builtin:tinylm"),
            env={"ACCUMPLAN_MAX_HOST_DATA": v}, expect="ok-or-refuse" if v == "" else "refuse",
            validate=v_json_stdout, names=("ACCUMPLAN_MAX_HOST_DATA",))
    add(cls, "main --batch-file h_views16.pt (10^5 short views of one storage)",
        main_cmd("--batch-file", fx("h_views16.pt"), model="builtin:tinylm", budget="256MiB"), expect="ok-or-refuse",
        validate=v_json_stdout, names=("h_views16",), timeout=120, heavy=True)
    add(cls, "run --data h_views16.pt --steps 1 (10^5 views)", run_cmd("--data", fx("h_views16.pt"), plan=tl,
        model="builtin:tinylm"), expect="ok-or-refuse", names=("h_views16",), timeout=120, heavy=True)
    add(cls, "main --batch-file h_flat_view.pt (16 rows viewing a 512 MiB storage)",
        main_cmd("--batch-file", fx("h_flat_view.pt")), expect="ok-or-refuse", validate=v_json_stdout,
        names=("h_flat_view", "storage", "host"), heavy=True)
    add(cls, "run --data h_flat_view.pt (16 rows viewing a 512 MiB storage)", run_cmd("--data", fx("h_flat_view.pt")),
        expect="ok-or-refuse", names=("h_flat_view", "storage", "host"), heavy=True)
    add(cls, "main --batch-file h_expand.pt (stride-0 10^5 samples)", main_cmd("--batch-file", fx("h_expand.pt")),
        expect="ok-or-refuse", validate=v_json_stdout, names=("h_expand",), heavy=True)
    add(cls, "run --data h_expand.pt (stride-0 10^5 samples)", run_cmd("--data", fx("h_expand.pt")),
        expect="ok-or-refuse", names=("h_expand",), heavy=True)
    # --seq-len
    for v in ["1..2147483648", "16..4294967296", "1..99999999999999999999", "0..16", "16..8", "-1..5", "1..1e9",
              "16..", "..16", "16...32", "16..32..64", "1..2147483647"]:
        add(cls, "main --seq-len %s" % v, main_cmd("--seq-len", v, "--input", "int64[B,T]:1000", "--target", "int64[B,T]:1000",
                                                   model="builtin:tinylm"), names=("seq-len", v),
            heavy=v.endswith("2147483647"))
    add(cls, "main --seq-len 16..1048576 (huge T under 64 MiB)", main_cmd("--seq-len", "16..1048576", "--input",
        "int64[B,T]:1000", "--target", "int64[B,T]:1000", model="builtin:tinylm"), expect="refuse",
        names=("seq-len", "1048576", "budget", "fit", "memory", "token"), heavy=True)
    for f in ["h_lens_huge.txt", "h_lens_max.txt", "h_lens_digits.txt", "h_lens_float.txt", "h_lens_neg.txt",
              "h_lens_zero.txt", "h_lens_empty.txt", "h_lens_text.txt", "h_lens_nul.txt", "h_lens_u64.txt"]:
        add(cls, "main --seq-len-file %s" % f, main_cmd("--seq-len-file", fx(f), "--input", "int64[B,T]:1000", "--target",
                                                         "int64[B,T]:1000", model="builtin:tinylm"),
            names=(f, "seq-len-file"), heavy=f == "h_lens_max.txt")
        add(cls, "run --seq-len-file %s" % f, run_cmd("--seq-len-file", fx(f), plan=tl, model="builtin:tinylm"),
            names=(f, "seq-len-file", "max_seq_len"))
    add(cls, "run --seq-len-file h_lens_many.txt (200k lines)", run_cmd("--seq-len-file", fx("h_lens_many.txt"), plan=tl,
        model="builtin:tinylm"), expect="ok-or-refuse", names=("h_lens_many", "max_seq_len", "16"))
    # huge targets / synthetic data
    for tb, exp in [("1099511627776", "ok-or-refuse"), ("1099511627777", "refuse"), ("9223372036854775807", "refuse"),
                    ("9223372036854775808", "refuse"), ("-8", "refuse"), ("1e6", "refuse")]:
        add(cls, "main --target-batch %s" % tb, main_cmd(tb=tb), expect=exp, validate=v_json_stdout,
            names=("target-batch", tb), timeout=60)
        add(cls, "plan --target-batch %s" % tb, [BIN, "plan", "--profile", fx("profile.json"), "--target-batch", tb,
                                                  "--memory-budget", "256MiB"], expect=exp, validate=v_json_stdout,
            names=("target-batch", tb))
    # 64 float32 per sample: 2^26 + 2^20 samples = 16.25 GiB, over the documented 16 GiB host-data limit
    for v, exp in [("1073741824", "refuse"), ("1073741825", "refuse"), ("68157440", "refuse"), ("0", "refuse"),
                   ("1000000", "ok-or-refuse"), ("8388608", "ok-or-refuse")]:
        add(cls, "run --synthetic-samples %s" % v, run_cmd("--synthetic-samples", v), expect=exp,
            names=("synthetic-samples", v, "host"), heavy=True)
    add(cls, "main --target-tokens 2^40 (tinylm)", main_cmd("--seq-len", "8..16", "--input", "int64[B,T]:1000", "--target",
        "int64[B,T]:1000", "--target-tokens", "1099511627776", model="builtin:tinylm")[:3] + [
        a for a in main_cmd("--seq-len", "8..16", "--input", "int64[B,T]:1000", "--target", "int64[B,T]:1000",
                             "--target-tokens", "1099511627776", model="builtin:tinylm")[5:]],
        expect="ok-or-refuse", validate=v_json_stdout, names=("target-tokens",), heavy=True)
    add(cls, "main --input float32[B,2147483647] (huge sample)", main_cmd("--input", "float32[B,2147483647]", "--target",
        "int64[B]:10"), names=("input", "2147483647", "budget", "memory", "fit"))
    add(cls, "main --input float32[B,65536,65536] (2^32 elements/sample)", main_cmd("--input", "float32[B,65536,65536]"),
        names=("input", "65536"))


# --------------------------------------------------------------------------------------------------
# class 4: storage records

STORAGE_FILES = [
    "s_short0.pt", "s_short1.pt", "s_shorthalf.pt", "s_shortbyte.pt", "s_shape_over.pt", "s_offset_over.pt",
    "s_stride_over.pt", "s_stride_neg.pt", "s_stride0_huge.pt", "s_shape_overflow.pt", "s_shape_neg.pt",
    "s_numel_2p40.pt", "s_numel_2p62.pt", "s_numel_neg.pt", "s_missing.pt", "s_wrongkey.pt", "s_shared_key.pt",
    "s_badtype.pt", "s_garbage_pkl.pt", "s_empty_pkl.pt", "s_trunc_pkl.pt", "s_os_system.pt", "s_deep_pkl.pt",
    "s_noversion.pt", "s_badversion.pt", "s_notensor.pt", "s_nodatapkl.pt", "s_legacy.pt", "s_random.pt",
    "s_empty.pt", "s_text.pt", "s_truncated_zip.pt", "s_bomb.pt",
]


def gen_storage(skip_bomb):
    cls = "storage"
    add(cls, "control: main --batch-file s_ok.pt (crafted, valid)", main_cmd("--batch-file", fx("s_ok.pt")), expect="ok",
        validate=v_json_stdout)
    add(cls, "control: run --data s_ok.pt (crafted, valid)", run_cmd("--data", fx("s_ok.pt")), expect="ok")
    for i, f in enumerate(STORAGE_FILES):
        skip = "--skip-bomb" if (f == "s_bomb.pt" and skip_bomb) else None
        heavy = f in ("s_bomb.pt", "s_stride0_huge.pt", "s_shared_key.pt")
        # LibTorch's C++ unpickler does not keep a file's strides: it reads every tensor contiguous
        # over its storage (checked: [16, 64] with strides [-64, 1] loads as [64, 1]), so a negative
        # stride addresses nothing outside the storage. Read (as contiguous) or refused, both hold.
        expect = "ok-or-refuse" if f == "s_stride_neg.pt" else "refuse"
        add(cls, "main --batch-file %s" % f, main_cmd("--batch-file", fx(f)), names=(f, "batch-file"), skip=skip, heavy=heavy,
            expect=expect)
        which = i % 3
        if f == "s_bomb.pt":
            continue  # one bomb case is enough: each runs until killed at the RSS bound
        if which == 0:
            add(cls, "run --data %s" % f, run_cmd("--data", fx(f)), names=(f, "data"), skip=skip, heavy=heavy, expect=expect)
        elif which == 1:
            add(cls, "verify --data %s" % f, verify_cmd("--data", fx(f)), names=(f, "data"), skip=skip, heavy=heavy,
                expect=expect)
        else:
            add(cls, "profile --batch-file %s" % f, profile_cmd("--batch-file", fx(f)), names=(f, "batch-file"), skip=skip,
                heavy=heavy, expect=expect)
    # special files as data and as model
    specials = [
        ("a directory", "d", {"d": ("dir",)}), ("a FIFO with no writer", "fifo", {"fifo": ("fifo",)}),
        ("/dev/zero", "/dev/zero", {}), ("/dev/null", "/dev/null", {}), ("a missing file", "missing.pt", {}),
        ("a symlink loop", "loop", {"loop": ("symlink", "loop")}), ("a dangling symlink", "dang", {"dang": ("symlink", "nowhere")}),
        ("/proc/self/mem", "/proc/self/mem", {}),
    ]
    for desc, path, files in specials:
        # none of these may block or read for ever: 10 s is ample for a refusal
        add(cls, "main --batch-file %s" % desc, main_cmd("--batch-file", path), files=files, names=(path, "batch-file"),
            timeout=10)
        add(cls, "run --data %s" % desc, run_cmd("--data", path), files=files, names=(path, "data"), timeout=10)
        add(cls, "main --model %s" % desc, main_cmd("--input", "float32[B,64]", "--target", "int64[B]:10", model=path),
            files=files, names=(path, "model"), timeout=10)
        add(cls, "export --plan %s" % desc, export_cmd(plan=path), files=files, names=(path, "plan"), timeout=10)
    for f in ["s_empty.pt", "s_random.pt", "s_ok.pt", "s_legacy.pt", "s_text.pt", "mlp.batch.pt"]:
        add(cls, "main --model %s (not TorchScript)" % f, main_cmd("--input", "float32[B,64]", "--target", "int64[B]:10",
            model=fx(f)), names=(f, "model"))


# --------------------------------------------------------------------------------------------------
# class 5: accepted here, refused later


def gen_later():
    cls = "later"
    for v in ["4294967296", "-1099511627776", "2147483648", "-2147483649", "9223372036854775808",
              "-9223372036854775809", "1e3", "0x10", "", "18446744073709551616"]:
        lenient = v == "0x10"  # CLI11 reads hexadecimal: 16, a valid index
        add(cls, "main --ignore-index %r%s" % (v, " (hex: ok or refuse)" if lenient else ""), main_cmd("--ignore-index", v),
            names=("ignore-index",), expect="ok-or-refuse" if lenient else "refuse", validate=v_json_stdout)
    for v in ["4294967296", "2147483648", "-2147483649"]:
        add(cls, "profile --ignore-index %s" % v, profile_cmd("--ignore-index", v), names=("ignore-index",))
        add(cls, "main tinylm --ignore-index %s" % v, main_cmd("--ignore-index", v, model="builtin:tinylm"),
            names=("ignore-index",))
    flat = ["l_neg_class.pt", "l_neg_class5.pt", "l_class_eq.pt", "l_class_huge.pt", "l_all_ignore.pt", "l_float_target.pt",
            "l_int32_target.pt", "l_uint8_target.pt", "l_bool_target.pt", "l_target_2d.pt", "l_int_input.pt",
            "l_len_mismatch.pt", "l_zero_samples.pt", "l_scalar_target.pt", "l_wrong_width.pt", "l_one_tensor.pt",
            "l_dict.pt", "l_tensor.pt", "l_nested.pt"]
    maybe_ok = {"l_int32_target.pt", "l_uint8_target.pt"}
    for f in flat:
        exp = "ok-or-refuse" if f in maybe_ok else "refuse"
        add(cls, "main --batch-file %s" % f, main_cmd("--batch-file", fx(f)), expect=exp, validate=v_json_stdout,
            names=(f, "batch-file", "class", "target", "ignore"))
        add(cls, "run --data %s" % f, run_cmd("--data", fx(f)), expect=exp,
            names=(f, "data", "class", "target", "ignore"))
    add(cls, "main --batch-file l_nan_input.pt (NaN inputs)", main_cmd("--batch-file", fx("l_nan_input.pt")),
        expect="ok-or-refuse", validate=v_json_stdout, names=("l_nan_input", "NaN", "nan", "finite"))
    add(cls, "main --batch-file l_all_ignore.pt --ignore-index 3", main_cmd("--batch-file", fx("l_neg_class5.pt"),
        "--ignore-index", "-5"), expect="ok-or-refuse", validate=v_json_stdout, names=("l_neg_class5", "class"))
    rag = ["l_tok_neg.pt", "l_tok_eq.pt", "l_tok_huge.pt", "l_tok_all_ignore.pt", "l_tok_len1_next.pt",
           "l_tok_float_after_int.pt", "l_tok_mixed_dtype.pt", "l_tok_float_seq.pt", "l_tok_empty_seq.pt",
           "l_tok_2d_seq.pt", "l_tok_target_len.pt", "l_tok_target_count.pt", "l_tok_target_neg.pt",
           "l_tok_target_big.pt", "l_tok_nothing.pt", "l_tok_notlist.pt"]
    for f in rag:
        # an int32 sequence among int64 ones holds valid token ids: widening it is fine
        exp = "ok-or-refuse" if f == "l_tok_mixed_dtype.pt" else "refuse"
        add(cls, "main tinylm --batch-file %s" % f, main_cmd("--batch-file", fx(f), model="builtin:tinylm", budget="256MiB"),
            names=(f, "batch-file", "token", "target", "sequence"), expect=exp, validate=v_json_stdout)
        add(cls, "run tinylm --data %s" % f, run_cmd("--data", fx(f), plan=fx("tl.plan.json"), model="builtin:tinylm"),
            names=(f, "data", "token", "target", "sequence"), expect=exp)
    add(cls, "main tinylm --batch-file l_tok_long.pt --seq-len 1..8", main_cmd("--batch-file", fx("l_tok_long.pt"),
        "--seq-len", "1..8", model="builtin:tinylm"), names=("seq-len", "l_tok_long", "40"))
    add(cls, "main tinylm --batch-file ragged.pt --seq-len 1..8 (sequences of 16)", main_cmd("--batch-file", fx("ragged.pt"),
        "--seq-len", "1..8", model="builtin:tinylm"), names=("seq-len", "ragged", "16"))
    add(cls, "run tinylm --data l_tok_long.pt (40 > plan's max_seq_len 16)", run_cmd("--data", fx("l_tok_long.pt"),
        plan=fx("tl.plan.json"), model="builtin:tinylm"), names=("max_seq_len", "l_tok_long", "40", "seq"))
    add(cls, "verify tinylm --data l_tok_long.pt", verify_cmd("--data", fx("l_tok_long.pt"), plan=fx("tl.plan.json"))[:5] +
        ["builtin:tinylm", "--threads", "1", "--data", fx("l_tok_long.pt")], names=("max_seq_len", "l_tok_long", "40", "seq"))
    for spec, tgt in [("int64[B,T]:1000", "int64[B,T]:1000")]:
        for ii in ["1000", "999"]:
            add(cls, "main tinylm specs --ignore-index %s (a valid class id as ignore_index)" % ii,
                main_cmd("--seq-len", "8..16", "--input", spec, "--target", tgt, "--ignore-index", ii, model="builtin:tinylm",
                         budget="256MiB"), expect="ok-or-refuse", validate=v_json_stdout, names=("ignore-index",))
    add(cls, "main --target int64[B]:11 for a 10-class model", main_cmd("--target", "int64[B]:11"),
        names=("target", "11", "10", "class"))
    add(cls, "main --target int64[B]:0", main_cmd("--target", "int64[B]:0"), names=("target", ":0", "0"))
    add(cls, "main --input int64[B,64]:1000 for a float model", main_cmd("--input", "int64[B,64]:1000"),
        names=("input", "int64", "Float", "Long", "dtype"))
    add(cls, "main --input int8[B,64]:129", main_cmd("--input", "int8[B,64]:129"), names=("input", "129", "int8"))


# --------------------------------------------------------------------------------------------------
# class 6: non-UTF-8

BAD_BYTES = [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf8\x88\x80\x80\x80", b"\xfe\xfe"]


def gen_non_utf8():
    cls = "non-utf8"
    fb = os.fsencode
    opts = [
        (main_cmd, "--optimizer", b"sgd"), (main_cmd, "--loss", b"mse"), (main_cmd, "--amp", b"none"),
        (main_cmd, "--device", b"cpu"), (main_cmd, "--memory-budget", b"64MiB"), (main_cmd, "--input", b"float32[B,64]"),
        (main_cmd, "--target", b"int64[B]:10"), (main_cmd, "--progress", b"none"), (main_cmd, "--headroom", b"auto"),
        (export_cmd, "--to", b"hf"), (lambda *e: report_cmd(None, *e, "--out", "r.svg"), "--format", b"svg"),
        (run_cmd, "--amp", b"none"), (verify_cmd, "--device", b"cpu"), (main_cmd, "--model", b"builtin:mlp"),
        (plan_cmd, "--split", b"uniform"),
    ]
    for i, (mk, opt, good) in enumerate(opts):
        for k in range(2):
            bad = BAD_BYTES[(i + k) % len(BAD_BYTES)]
            v = good[:2] + bad + good[2:] if k == 1 else good + bad
            add(cls, "%s %r" % (opt, v), [fb(a) if isinstance(a, str) else a for a in with_opt(mk(), opt, v)],
                names=(opt.lstrip("-"),))
    # paths
    P = b"\xff\xfe.json"
    add(cls, "export --plan non-UTF-8 path (valid plan)", [fb(a) for a in export_cmd()[:2]] + [b"--plan", P, b"--to", b"deepspeed"],
        files={P: ("copy", "plan.json")}, expect="ok-or-refuse", validate=v_json_stdout, names=("plan",))
    add(cls, "export --plan missing non-UTF-8 path", [fb(BIN), b"export", b"--plan", b"nope\xff\xfe.json", b"--to", b"hf"],
        names=("plan", "nope"))
    add(cls, "export --out non-UTF-8 path", [fb(a) for a in export_cmd()] + [b"--out", b"o\xff.json"],
        expect="ok-or-refuse", outputs=(b"o\xff.json",), validate=v_json_file(b"o\xff.json"), names=("out",))
    add(cls, "report input non-UTF-8 path", [fb(BIN), b"report", P, b"--out", b"r.html"], files={P: ("copy", "plan.json")},
        expect="ok-or-refuse", outputs=("r.html",), validate=v_report_file("r.html"), names=("input",))
    add(cls, "report --out non-UTF-8 .svg path", [fb(BIN), b"report", fb(fx("plan.json")), b"--out", b"\xe9t\xe9.svg"],
        expect="ok-or-refuse", outputs=(b"\xe9t\xe9.svg",), validate=v_report_file(b"\xe9t\xe9.svg"), names=("out",))
    add(cls, "report --out into missing non-UTF-8 dir", [fb(BIN), b"report", fb(fx("plan.json")), b"--out", b"\xff/r.html"],
        names=("out",))
    add(cls, "plan --profile non-UTF-8 path", [fb(BIN), b"plan", b"--profile", P, b"--target-batch", b"64"],
        files={P: ("copy", "profile.json")}, expect="ok-or-refuse", validate=v_json_stdout, names=("profile",))
    add(cls, "run --plan non-UTF-8 path", [fb(BIN), b"run", b"--plan", P, b"--model", b"builtin:mlp", b"--threads", b"1",
                                          b"--progress", b"none", b"--steps", b"1"],
        files={P: ("copy", "mlp.plan.json")}, expect="ok-or-refuse", names=("plan",))
    add(cls, "run --stats non-UTF-8 path", [fb(a) for a in run_cmd()] + [b"--stats", b"s\xff\xfe.json"],
        expect="ok-or-refuse", outputs=(b"s\xff\xfe.json",), validate=v_json_file(b"s\xff\xfe.json"), names=("stats",))
    add(cls, "run --data missing non-UTF-8 path", [fb(a) for a in run_cmd()] + [b"--data", b"d\xc3\x28.pt"], names=("data",))
    add(cls, "main --batch-file non-UTF-8 path (valid)", [fb(a) for a in main_cmd()] + [b"--batch-file", b"b\xff.pt"],
        files={b"b\xff.pt": ("copy", "mlp.batch.pt")}, expect="ok-or-refuse", validate=v_json_stdout, names=("batch-file",))
    add(cls, "main --model missing non-UTF-8 path", [fb(a) for a in main_cmd(model="m\xff.pt".encode("latin-1").decode("utf-8", "surrogateescape"))],
        names=("model",))
    add(cls, "main --out non-UTF-8 path into missing dir", [fb(a) for a in main_cmd()] + [b"--out", b"\xfe\xfe/p.json"], names=("out",))
    add(cls, "verify --json non-UTF-8 path", [fb(a) for a in verify_cmd()] + [b"--json", b"v\xff.json"], expect="ok-or-refuse",
        outputs=(b"v\xff.json",), validate=v_json_file(b"v\xff.json"), names=("json",))
    # plan JSON with invalid UTF-8 in string fields (raw bytes) and lone surrogate escapes
    fields = [("reason",), ("device", "name"), ("model", "path"), ("libtorch_version",), ("setup", "optimizer"),
              ("split",), ("schema_version",), ("setup", "inputs", 0)]
    readers = [("export", lambda p: export_cmd(plan=p)), ("export-hf", lambda p: export_cmd(plan=p, to="hf")),
               ("report", lambda p: report_cmd(p, "--out", "r.html")), ("run", lambda p: run_cmd(plan=p))]
    for j, path in enumerate(fields):
        for k in range(2):
            tag, mk = readers[(j + k) % len(readers)]
            bad = BAD_BYTES[(j + k) % len(BAD_BYTES)]
            data = mutated("mlp.plan.json", list(path), "x@@RAW@@y", raw=bad)
            add(cls, "%s: plan %s holds raw %r" % (tag, ".".join(map(str, path)), bad), mk("p.json"),
                files={"p.json": data}, names=("p.json", "UTF-8", "utf"))
        tag, mk = readers[j % len(readers)]
        data = mutated("mlp.plan.json", list(path), "x@@RAW@@y", raw=b"\\ud800")
        add(cls, "%s: plan %s holds a lone surrogate escape" % (tag, ".".join(map(str, path))), mk("p.json"),
            files={"p.json": data}, expect="ok-or-refuse",
            validate=(v_report_file("r.html") if tag == "report" else v_json_stdout if tag.startswith("export") else None),
            outputs=("r.html",) if tag == "report" else (), names=("p.json", "UTF", "surrogate"))
    # profile and stats with raw bytes
    data = mutated("profile.json", ["device", "name"], "cpu@@RAW@@", raw=b"\xff")
    add(cls, "plan --profile with raw 0xff in device.name", plan_cmd(profile="p.json"), files={"p.json": data},
        names=("p.json", "UTF"))
    data = mutated("mlp.stats.json", ["backend"], "none@@RAW@@", raw=b"\xc0\xaf")
    add(cls, "report --stats with raw overlong bytes in backend", report_cmd(fx("mlp.plan.json"), "--stats", "s.json", "--out", "r.svg"),
        files={"s.json": data}, names=("s.json", "UTF", "stats"))


# --------------------------------------------------------------------------------------------------
# class 7: report

REPORT_STRINGS = ["a\x01b", "\x1b[31mred", "x\x00y", "<script>alert(1)</script>", "]]>&amp;<!--", "\x7fdel", "\ufffe",
                  "\uffff", "tab\there", "cr\rhere", "\u2028line", "\"'&<>", "\x0bvt\x0c", "\U0001F600"]


def gen_report():
    cls = "report"
    rnd = random.Random(SEED + 7)
    fields = [("reason",), ("device", "name"), ("model", "path"), ("libtorch_version",),
              ("profile", "device", "name"), ("profile", "model", "path"), ("model", "batch_dependent_layers", 0)]
    i = 0
    for s in REPORT_STRINGS:
        for _ in range(2):
            path = fields[i % len(fields)]
            i += 1
            fmt = "svg" if i % 2 else "html"
            doc_name = "plan.json" if path[-1] == 0 else "mlp.plan.json"
            try:
                data = mutated(doc_name, list(path), s)
            except (KeyError, IndexError, TypeError):
                data = mutated("mlp.plan.json", ["reason"], s)
            out = "r." + fmt
            add(cls, "report %s: plan %s = %r" % (fmt, ".".join(map(str, path)), s), report_cmd("p.json", "--out", out),
                files={"p.json": data}, expect="ok-or-refuse", outputs=(out,), validate=v_report_file(out),
                names=("p.json", ".".join(map(str, path[-1:]))))
    # profile input with strings
    for s in ["\x01\x02", "<b>x</b>", "\x1b]0;t\x07"]:
        data = mutated("profile.json", ["device", "name"], s)
        add(cls, "report svg: profile device.name = %r" % s, report_cmd("p.json", "--out", "-", "--format", "svg"),
            files={"p.json": data}, expect="ok-or-refuse", validate=v_report_stdout, names=("p.json", "name"))
    # main job --report with a control char in the model path? (a TorchScript file named with ESC)
    add(cls, "main --report with model file named with ESC", main_cmd("--report", "r.html", "--input", "float32[B,64]",
        "--target", "int64[B]:10", "--out", "p.json", model="m\x1b[31m.pt"), files={"m\x1b[31m.pt": ("copy", "linear.pt")},
        expect="ok-or-refuse", outputs=("r.html", "p.json"), validate=v_report_file("r.html"), names=("model",))
    # stats files
    st = "mlp.stats.json"
    stats_cases = [
        ("measured_peak_bytes = -1", ["measured_peak_bytes"], -1),
        ("window_series[0].peak_bytes = -5", ["window_series", 0, "peak_bytes"], -5),
        ("window_series[0].seconds = -1.5", ["window_series", 0, "seconds"], -1.5),
        ("mean_window_seconds = -1", ["mean_window_seconds"], -1),
        ("windows = 2^62", ["windows"], 1 << 62),
        ("window_series[0].window = 2^62", ["window_series", 0, "window"], 1 << 62),
        ("window_series[0].window = -1", ["window_series", 0, "window"], -1),
        ("microbatch_sizes = []", ["microbatch_sizes"], []),
        ("window_series[0].microbatch_sizes = []", ["window_series", 0, "microbatch_sizes"], []),
        ("window_series = []", ["window_series"], []),
        ("measured_peak_bytes = 2^63", ["measured_peak_bytes"], 1 << 63),
        ("measured_peak_bytes = 1e400", ["measured_peak_bytes"], "@@RAW@@"),
        ("final_loss = NaN", ["final_loss"], "@@RAW@@"),
        ("measured_peak_bytes = \"1\"", ["measured_peak_bytes"], "1"),
        ("schema = accumplan.plan", ["schema"], "accumplan.plan"),
        ("schema_version = 9.0", ["schema_version"], "9.0"),
        ("per_rank_batch = 7 (another plan)", ["per_rank_batch"], 7),
        ("window_series[0].samples = 2^62", ["window_series", 0, "samples"], 1 << 62),
        ("host_data_bytes = -1", ["host_data_bytes"], -1),
        ("window_series[0].loss = 1e308", ["window_series", 0, "loss"], 1e308),
        ("window_series[0] = 5", ["window_series", 0], 5),
        ("oom_recoveries = -3", ["oom_recoveries"], -3),
        ("backend = \\x1b[31m", ["backend"], "\x1b[31m"),
        ("probe = <svg>", ["probe"], "</svg><svg>"),
    ]
    for j, (desc, path, value) in enumerate(stats_cases):
        raw = None
        if value == "@@RAW@@":
            raw = b"1e400" if "1e400" in desc else b"NaN"
            value = "@@RAW@@"
        data = mutated(st, path, value)
        if raw is not None:
            data = data.replace(b'"@@RAW@@"', raw)
        fmt = "svg" if j % 2 else "html"
        exp = "ok-or-refuse" if desc.startswith(("window_series[0].loss", "backend", "probe", "per_rank_batch")) or \
            desc.endswith("= []") else "refuse"  # an empty list is drawn as nothing
        add(cls, "report --stats %s (%s)" % (desc, fmt), report_cmd(fx("mlp.plan.json"), "--stats", "s.json", "--out", "r." + fmt),
            files={"s.json": data}, expect=exp, outputs=("r." + fmt,), validate=v_report_file("r." + fmt),
            names=("s.json", "stats", path[-1] if isinstance(path[-1], str) else path[0]))
    add(cls, "report --stats from another plan (tinylm stats on the convnet plan)", report_cmd(None, "--stats", fx(st),
        "--out", "r.svg"), expect="ok-or-refuse", outputs=("r.svg",), validate=v_report_file("r.svg"),
        names=("stats", "plan", "batch"))
    add(cls, "report --stats a plan file", report_cmd(None, "--stats", fx("plan.json"), "--out", "r.svg"),
        names=("stats", "schema", "run_stats"))
    add(cls, "report --stats the profile", report_cmd(None, "--stats", fx("profile.json"), "--out", "r.svg"),
        names=("stats", "schema", "run_stats"))
    add(cls, "report --stats empty file", report_cmd(None, "--stats", "e.json", "--out", "r.svg"), files={"e.json": b""},
        names=("stats", "e.json", "empty"))
    add(cls, "report --stats JSON nested 100000 deep", report_cmd(None, "--stats", "n.json", "--out", "r.svg"),
        files={"n.json": b"[" * 100000 + b"]" * 100000}, names=("stats", "n.json", "nest", "deep"))
    big = load_fix_json(st)
    w0 = big["window_series"][0]
    big["window_series"] = [dict(w0, window=k) for k in range(300000)]
    big["windows"] = 300000
    add(cls, "report --stats with 300000 windows (bounded time)", report_cmd(fx("mlp.plan.json"), "--stats", "s.json",
        "--out", "r.svg"), files={"s.json": json.dumps(big).encode()}, expect="ok-or-refuse", outputs=("r.svg",),
        validate=v_report_file("r.svg"), names=("stats", "window"), timeout=60)
    # plan inputs with odd numbers
    for desc, path, value in [("memory.budget_bytes = -1", ["memory", "budget_bytes"], -1),
                              ("fit.slope_bytes_per_sample = 2^60", ["fit", "slope_bytes_per_sample"], 1 << 60),
                              ("profile.points = []", ["profile", "points"], []),
                              ("microbatch_sizes = []", ["microbatch_sizes"], []),
                              ("device.total_bytes = 2^51", ["device", "total_bytes"], 1 << 51)]:
        exp = "ok-or-refuse" if desc == "profile.points = []" else "refuse"
        add(cls, "report plan %s" % desc, report_cmd("p.json", "--out", "r.html"), files={"p.json": mutated("mlp.plan.json", path, value)},
            names=("p.json", path[-1]), expect=exp, outputs=("r.html",), validate=v_report_file("r.html"))
    _ = rnd


# --------------------------------------------------------------------------------------------------
# class 8: Python API

PY_PRELUDE = r'''
import os, sys, json, math
import accumplan
FIX = %r
def plan():
    return accumplan.load_plan(os.path.join(FIX, "mlp.plan.json"))
def tplan():
    return accumplan.load_plan(os.path.join(FIX, "tl.plan.json"))
def doc(name="mlp.plan.json"):
    with open(os.path.join(FIX, name)) as f:
        return json.load(f)
def mlp():
    import torch
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 10))
    return m, torch.optim.SGD(m.parameters(), lr=0.01)
def lm():
    import torch
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Embedding(1000, 8), torch.nn.Linear(8, 1000))
    return m, torch.optim.SGD(m.parameters(), lr=0.01)
def xy(n=8):
    import torch
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g)
def rag(n=4, T=12):
    import torch
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 1000, (3 + i,), generator=g) for i in range(n)]
    return accumplan.pad_sequences(seqs, next_token=True)
'''

PY_DRIVER = r'''
import json, sys, traceback
spec = json.load(open(sys.argv[1]))
res = {}
ns = {}
try:
    exec(spec["prelude"], ns)
    exec(compile(spec["code"], "<case>", "exec"), ns)
    res["status"] = "ok"
except BaseException as e:  # noqa
    import accumplan
    t = type(e)
    res["status"] = "raised"
    res["type"] = t.__module__ + "." + t.__qualname__
    res["planerror"] = isinstance(e, accumplan.PlanError)
    res["exact"] = t.__name__ if t in (ValueError, TypeError) else None
    res["msg"] = str(e)[:2000]
    res["tb"] = traceback.format_exc()[-1500:]
with open(sys.argv[2], "w") as f:
    json.dump(res, f)
'''


def py(name, code, expect="raise", names=(), files=None, allow=(), timeout=30):
    add("python", name, py=code, expect=expect, names=names, files=files, allow=allow, timeout=timeout)


def gen_python():
    """Class 8: the Python API's readers, replanning, helpers and train_window on hostile arguments."""
    gen_python_load_plan_files()
    gen_python_load_plan_fields()
    gen_python_replan()
    gen_python_helpers()
    gen_python_train_window()
    gen_python_padding_and_save()


def gen_python_load_plan_files():
    """load_plan on hostile files, paths and arguments: bad encodings, deep nesting, devices, FIFOs, NULs."""
    mk = lambda b: {"f.json": b}  # noqa: E731
    py("load_plan non-UTF-8 bytes", "accumplan.load_plan('f.json')", files=mk(b'{"schema": "\xff\xfe"}'), names=("f.json", "UTF"))
    py("load_plan UTF-16 BOM", "accumplan.load_plan('f.json')", files=mk('{"a":1}'.encode("utf-16")), names=("f.json", "UTF"))
    py("load_plan nested [ 100000 deep", "accumplan.load_plan('f.json')", files=mk(b"[" * 100000 + b"]" * 100000),
       names=("f.json", "deep", "nest"))
    py("load_plan nested {\"a\": 100000 deep", "accumplan.load_plan('f.json')",
       files=mk(b'{"a":' * 100000 + b"1" + b"}" * 100000), names=("f.json", "deep", "nest"))
    py("load_plan dict nested 100000 deep (in memory)",
       "d = {}\ncur = d\nfor _ in range(100000):\n    cur['x'] = {}\n    cur = cur['x']\n"
       "d2 = doc(); d2['setup'] = d\naccumplan.load_plan(d2)", expect="ok-or-raise", names=("setup",))
    py("load_plan /dev/zero", "accumplan.load_plan('/dev/zero')", names=("/dev/zero", "regular"))
    py("load_plan /dev/null", "accumplan.load_plan('/dev/null')", names=("/dev/null", "regular", "empty"))
    py("load_plan FIFO without writer", "os.mkfifo('p.fifo')\naccumplan.load_plan('p.fifo')", names=("p.fifo", "FIFO"))
    py("load_plan directory", "accumplan.load_plan('.')", names=("'.'", "directory"))
    py("load_plan missing", "accumplan.load_plan('missing.json')", names=("missing.json",))
    py("load_plan ''", "accumplan.load_plan('')", names=("''", "plan"))
    py("load_plan embedded NUL", "accumplan.load_plan('a\\0b.json')", names=("a", "null", "NUL"))
    py("load_plan non-UTF-8 path of a valid plan",
       "import shutil\nshutil.copy(os.path.join(FIX,'mlp.plan.json'), b'\\xff\\xfe.json')\naccumplan.load_plan(b'\\xff\\xfe.json')",
       expect="ok-or-raise")
    py("load_plan non-UTF-8 path missing", "accumplan.load_plan(b'\\xff\\xfe-missing.json')", names=("missing",))
    py("load_plan(123)", "accumplan.load_plan(123)", names=("path_or_doc", "int"))
    py("load_plan(None)", "accumplan.load_plan(None)", names=("path_or_doc", "None"))
    py("load_plan([])", "accumplan.load_plan([])", names=("path_or_doc", "list"))
    py("load_plan(dict, model=123)", "accumplan.load_plan(doc(), model=123)", names=("model",))
    py("load_plan(dict, model='/dev/zero')", "accumplan.load_plan(doc(), model='/dev/zero')", names=("model", "/dev/zero"),
       timeout=10)
    py("load_plan(dict, model=FIFO)", "os.mkfifo('m.fifo')\naccumplan.load_plan(doc(), model='m.fifo')", names=("m.fifo", "model"),
       timeout=10)
    py("load_plan(dict, model=directory)", "accumplan.load_plan(doc(), model='.')", names=("model", "directory", "'.'"))


def gen_python_load_plan_fields():
    """load_plan on plan files whose fields are out of range, of the wrong type, or inconsistent."""
    mk = lambda b: {"f.json": b}  # noqa: E731
    for desc, raw in [("integer of 10^5 digits", b"1" * 100000), ("1e400", b"1e400"), ("NaN", b"NaN"), ("-Infinity", b"-Infinity"),
                      ("2^70", str(1 << 70).encode()), ("-1", b"-1"), ("8.0", b"8.0"), ("true", b"true")]:
        data = mutated("mlp.plan.json", ["target_batch"], "@@RAW@@").replace(b'"@@RAW@@"', raw)
        py("load_plan target_batch = %s" % desc, "accumplan.load_plan('f.json')", files=mk(data), names=("target_batch",))
    for desc, path, value in [
            ("microbatch_sizes = 2^70 (all fields consistent)", None, None),
            ("weights = [NaN]", ["weights"], [float("nan")]),
            ("weights = [\"x\"]", ["weights"], ["x"]), ("weights = null", ["weights"], None),
            ("microbatch_sizes = \"8\"", ["microbatch_sizes"], "8"), ("microbatch_sizes = {}", ["microbatch_sizes"], {}),
            ("microbatch_sizes = [8.5]", ["microbatch_sizes"], [8.5]), ("setup = []", ["setup"], []),
            ("setup.ignore_index = 2^63", ["setup", "ignore_index"], 1 << 63),
            ("setup.ignore_index = \"x\"", ["setup", "ignore_index"], "x"),
            ("memory = 5", ["memory"], 5), ("fit = []", ["fit"], []),
            ("fit.slope_bytes_per_sample = \"1\"", ["fit", "slope_bytes_per_sample"], "1"),
            ("schema_version = 1 (int)", ["schema_version"], 1), ("schema_version = \"1.0.0\"", ["schema_version"], "1.0.0"),
            ("schema_version = \"\\n1.0\"", ["schema_version"], "\n1.0"), ("schema_version = \"1\\u0660.0\"", ["schema_version"], "1\u0660.0"),
            ("schema_version = \"\u00b9.0\" (superscript one)", ["schema_version"], "\u00b9.0"),
            ("schema = null", ["schema"], None), ("multiple_of = 0", ["multiple_of"], 0), ("multiple_of = -8", ["multiple_of"], -8),
            ("max_micro_batch = \"8\"", ["max_micro_batch"], "8"), ("split = [\"balanced\"]", ["split"], ["balanced"]),
            ("world_size = 0", ["world_size"], 0), ("per_rank_batch = 2^70", ["per_rank_batch"], 1 << 70),
            ("tokens = \"x\"", ["tokens"], "x"), ("tokens = {}", ["tokens"], {}),
            ("setup.normalization = \"tokens\\n\"", ["setup", "normalization"], "tokens\n"),
            ("setup.loss = 5", ["setup", "loss"], 5), ("reason = 5", ["reason"], 5), ("replans = 5", ["replans"], 5)]:
        if path is None:
            d = load_fix_json("mlp.plan.json")
            big = 1 << 70
            for k in ("target_batch", "per_rank_batch", "micro_batch", "max_micro_batch"):
                d[k] = big
            d["microbatch_sizes"] = [big]
            d["uniform"] = {"micro_batch": big, "accumulation_steps": 1}
            data = json.dumps(d).encode()
        else:
            data = mutated("mlp.plan.json", path, value)
        key = "microbatch_sizes" if path is None else str(path[-1])
        exp = "ok-or-raise" if key in ("reason", "replans") else "raise"
        py("load_plan %s" % desc, "p = accumplan.load_plan('f.json')\nrepr(p)\np.weights\np.largest_fitting()",
           files=mk(data), names=(key, "f.json"), expect=exp)
    tdoc = load_fix_json("tl.plan.json")
    for desc, path, value in [("tokens.token_budget = 0", ["tokens", "token_budget"], 0),
                              ("tokens.token_budget = 2^70", ["tokens", "token_budget"], 1 << 70),
                              ("tokens.max_seq_len = -1", ["tokens", "max_seq_len"], -1),
                              ("tokens.max_seq_len = \"16\"", ["tokens", "max_seq_len"], "16"),
                              ("tokens.step_cost = {\"per_token\": 2^70}", ["tokens", "step_cost"], {"per_microbatch": 1, "per_token": 1 << 70, "per_token_squared": 0}),
                              ("tokens.target_tokens = 0", ["tokens", "target_tokens"], 0),
                              ("tokens.target_tokens = 1.5", ["tokens", "target_tokens"], 1.5)]:
        d = json.loads(json.dumps(tdoc))
        set_path(d, path, value)
        py("load_plan token plan %s" % desc, "p = accumplan.load_plan('f.json')\np.pack([3, 5, 7])",
           files=mk(json.dumps(d).encode()), names=(path[-1], "f.json", "token"))


def gen_python_replan():
    """replan_below and repack_below with sizes that are no positive integer, or too large."""
    for desc, v in [("0", "0"), ("-1", "-1"), ("-2**70", "-2**70"), ("2**70", "2**70"), ("2**63", "2**63"),
                    ("1.5", "1.5"), ("nan", "float('nan')"), ("inf", "float('inf')"), ("'4'", "'4'"), ("None", "None"),
                    ("True", "True"), ("[4]", "[4]"), ("4.0", "4.0"), ("-inf", "float('-inf')")]:
        exp = "ok-or-raise" if desc in ("2**70", "2**63") else "raise"
        py("replan_below(%s)" % desc, "p = plan()\np.replan_below(%s)\nassert all(isinstance(n, int) and n >= 1 for n in p.microbatch_sizes), p.microbatch_sizes\nassert sum(p.microbatch_sizes) == p.per_rank_batch" % v,
           names=("failing_micro_batch", "micro", "batch", "size"), expect=exp)
    py("replan_below(1) (documented OutOfMemoryAtOne)", "plan().replan_below(1)", allow=("OutOfMemoryAtOne",),
       names=("size 1", "1"))
    py("replan_below(4) (valid OOM)", "p = plan()\np.replan_below(4)\nassert max(p.microbatch_sizes) < 4", expect="ok-or-raise")
    py("repack_below(0, 5)", "tplan().repack_below(0, 5)", names=("token", "failing"), allow=("OutOfMemoryAtOne",))
    py("repack_below('x', 5)", "tplan().repack_below('x', 5)", names=("failing_tokens", "token"))
    py("repack_below(2**70, 2**70)", "tplan().repack_below(2**70, 2**70)", names=("token", "longest"),
       allow=("OutOfMemoryAtOne",), expect="ok-or-raise")


def gen_python_helpers():
    """window_sizes, pack and the module's split and token helpers with hostile arguments."""
    for desc, v in [("0", "0"), ("-3", "-3"), ("2**70", "2**70"), ("'3'", "'3'"), ("3.5", "3.5"), ("None", "None")]:
        py("window_sizes(%s)" % desc, "plan().window_sizes(%s)" % v, names=("samples", "window"))
    for desc, v in [("[0]", "[0]"), ("[-1]", "[-1]"), ("['a']", "['a']"), ("[2**70]", "[2**70]"), ("[1.5]", "[1.5]"),
                    ("None", "None"), ("[float('nan')]", "[float('nan')]"), ("{}", "{}")]:
        py("token plan pack(%s)" % desc, "tplan().pack(%s)" % v, names=("length", "sequence", "token"),
           expect="ok-or-raise" if desc == "{}" else "raise")
    for call, nm in [("accumplan.balanced_split(2**70, 3)", "ok"), ("accumplan.pack_by_token_budget([3, 4], 2**70)", "ok")]:
        py(call.replace("accumplan.", "") + " (big ints are fine in Python)", call, expect="ok-or-raise", timeout=20)
    for call, nm in [("accumplan.balanced_split(10, 0)", "parts"), ("accumplan.balanced_split(10, -2)", "parts"),
("accumplan.split_samples(8, 0)", "max_micro_batch"),
                     ("accumplan.split_samples(8, 4, 'nope')", "split"), ("accumplan.split_samples(8, 4, unit=0)", "unit"),
                     ("accumplan.split_samples(8.5, 4)", "total"), ("accumplan.largest_divisor_at_most(8, 0)", "limit"),
                     ("accumplan.largest_divisor_at_most(0, 4)", "total"), 
                     ("accumplan.pack_by_token_budget(['x'], 8)", "length"), ("accumplan.token_windows([1, -1], 4)", "valid_tokens"),
                     ("accumplan.token_windows([1, 2], 0)", "target_tokens"), ("accumplan.token_windows([1.5], 4)", "valid_tokens"),
                     ("accumplan.file_sha256('/dev/zero')", "/dev/zero"), ("accumplan.file_sha256(os.getcwd())", "directory")]:
        py(call.replace("accumplan.", ""), call, names=(nm, call.split("(")[0].split(".")[-1]), timeout=10)


def gen_python_train_window():
    """train_window with hostile keyword arguments, targets, inputs and token lengths."""
    tw = "m, o = mlp()\nx, y = xy()\nplan().train_window(m, o, (x,), y%s)"
    for desc, kw in [("ignore_index=2**63", ", ignore_index=2**63"), ("ignore_index=-2**63-1", ", ignore_index=-2**63-1"),
                     ("ignore_index=2**70", ", ignore_index=2**70"), ("ignore_index=1.5", ", ignore_index=1.5"),
                     ("ignore_index='x'", ", ignore_index='x'"), ("ignore_index=None (plan default)", ", ignore_index=None"),
                     ("loss='nope'", ", loss='nope'"), ("normalization='tokens\\n'", ", normalization='tokens\\n'"),
                     ("max_grad_norm=-1", ", max_grad_norm=-1"), ("max_grad_norm=nan", ", max_grad_norm=float('nan')"),
                     ("autocast='bf16'", ", autocast='bf16'"), ("lengths=[1]*8 on a sample plan", ", lengths=[1]*8"),
                     ("lengths='abc' on a sample plan", ", lengths='abc'")]:
        # autocast='bf16': a name for torch.bfloat16 may be accepted
        exp = "ok-or-raise" if ("None" in desc or "sample plan" in desc or "autocast" in desc) else "raise"
        py("train_window %s" % desc, tw % kw, names=("ignore_index", "loss", "normalization", "max_grad_norm", "autocast",
                                                       "lengths"), expect=exp, timeout=60)
    for desc, code in [("target class 10 of 10", "y[0] = 10"), ("target class -1", "y[0] = -1"),
                       ("target class 2**40", "y[0] = 2**40"), ("float target for cross_entropy", "y = y.float()"),
                       ("target with 7 rows for 8 inputs", "y = y[:7]"), ("9 samples > per_rank_batch 8", "x, y = xy(9)"),
                       ("0 samples (ok or raise)", "x, y = x[:0], y[:0]"), ("scalar input", "x = x[0, 0]"),
                       ("all targets == ignore_index", "y[:] = -100")]:
        exp = "ok-or-raise" if ("ignore_index" in desc or "ok or raise" in desc) else "raise"
        py("train_window %s" % desc, "m, o = mlp()\nx, y = xy()\n%s\nplan().train_window(m, o, (x,), y)" % code,
           names=("target", "class", "sample", "window", "tensor", "dim"), expect=exp, timeout=60)
    twl = "m, o = lm()\ninp, tgt, lens = rag()\ntplan().train_window(m, o, (inp,), tgt, lengths=%s)"
    for desc, v in [("['3','4','5','6']", "['3','4','5','6']"), ("['a','b','c','d']", "['a','b','c','d']"),
                    ("float tensor", "lens.float() + 0.5"), ("wrong length", "lens[:2]"), ("negative", "[-1, 4, 5, 6]"),
                    ("zero", "[0, 4, 5, 6]"), ("2**70", "[2**70, 4, 5, 6]"), ("None", "None"), ("longer than padded", "[30, 4, 5, 6]"),
                    ("a dict", "{0: 3}"), ("nan", "[float('nan'), 4, 5, 6]"), ("2-D tensor", "lens.view(2, 2)"),
                    ("bool list", "[True, True, True, True]")]:
        py("train_window token plan lengths=%s" % desc, twl % v, names=("lengths", "length", "sequence"), timeout=60)
    py("train_window token plan ignore_index=2**63", "m, o = lm()\ninp, tgt, lens = rag()\n"
       "tplan().train_window(m, o, (inp,), tgt, lengths=lens, ignore_index=2**63)", names=("ignore_index",), timeout=60)


def gen_python_padding_and_save():
    """pad_sequences, valid_token_counts, padding_mask, Plan(doc) and plan.save with hostile arguments."""
    py("pad_sequences ignore_index=2**70", "import torch\naccumplan.pad_sequences([torch.tensor([1,2])], [torch.tensor([1,2])], ignore_index=2**70)",
       names=("ignore_index",))
    py("pad_sequences next_token ignore_index=2**63", "import torch\naccumplan.pad_sequences([torch.tensor([1,2])], next_token=True, ignore_index=2**63)",
       names=("ignore_index",))
    py("pad_sequences of 2-D sequences", "import torch\naccumplan.pad_sequences([torch.zeros(2, 3, dtype=torch.long)])",
       names=("sequence", "1-D", "dim"))
    py("pad_sequences of strings", "accumplan.pad_sequences(['abc'])", names=("sequence",))
    py("valid_token_counts lengths=['x']", "accumplan.valid_token_counts(['x'])", names=("lengths",))
    py("valid_token_counts lengths=[1.5]", "accumplan.valid_token_counts([1.5])", names=("lengths",))
    py("valid_token_counts ignore_index=2**70", "import torch\naccumplan.valid_token_counts([2], torch.zeros(1, 2, dtype=torch.long), ignore_index=2**70)",
       names=("ignore_index",), expect="ok-or-raise")
    py("padding_mask([2**70], 4)", "accumplan.padding_mask([2**70], 4)", names=("lengths",))
    py("padding_mask([2], -1)", "accumplan.padding_mask([2], -1)", names=("padded_length",))
    py("Plan(doc) with source=None", "accumplan.Plan(doc(), source=None)", expect="ok-or-raise")
    py("plan.save to a missing directory", "plan().save('nodir/p.json')", names=("nodir", "p.json"))
    py("plan.save onto a directory", "os.mkdir('d')\nplan().save('d')", names=("'d'", "directory"))
    py("plan.save('')", "plan().save('')", names=("''", "path"))


PLAN_HELPERS = r"""
import torch
def P(m=None, o=None, inputs=None, target=None, **kw):
    if m is None:
        m, o = mlp()
    if inputs is None:
        x, y = xy()
        inputs, target = (x,), y
    kw.setdefault("target_batch", 8)
    kw.setdefault("memory_budget", "64MiB")
    kw.setdefault("progress", False)
    return accumplan.plan(m, inputs, target, optimizer=o, **kw)
def weights(m):
    return [p.detach().clone() for p in m.state_dict().values()]
def unchanged(m, before):
    after = weights(m)
    assert len(after) == len(before) and all(torch.equal(a, b) for a, b in zip(after, before)), "the weights changed"
def keeps_weights(m, call):
    before = weights(m)
    try:
        call()
    finally:
        unchanged(m, before)
class Bad(torch.nn.Module):
    def __init__(self, fwd):
        super().__init__()
        self.lin = torch.nn.Linear(64, 10)
        self.fwd = fwd
    def forward(self, x):
        return self.fwd(self, x)
"""


def pp(name, code, expect="raise", names=(), allow=(), timeout=90, heavy=False):
    add("python-plan", name, py=PLAN_HELPERS + code, expect=expect, names=names, allow=allow, timeout=timeout,
        heavy=heavy)


def gen_python_plan():
    """Class 9: accumplan.plan and train_window on hostile arguments and models, and small legal plans."""
    gen_python_plan_data()
    gen_python_plan_arguments()
    gen_python_plan_models()
    gen_python_plan_legal()
    gen_python_plan_train_window()


def gen_python_plan_data():
    """accumplan.plan on hostile inputs and targets."""
    # What a user passes as data: every one named by its argument, before any window runs.
    for desc, code, nm in [
            ("inputs=()", "P(inputs=(), target=xy()[1])", ("inputs",)),
            ("inputs=None", "m, o = mlp()\naccumplan.plan(m, None, xy()[1], target_batch=8, optimizer=o, progress=False)", ("inputs",)),
            ("inputs='abc'", "P(inputs='abc', target=xy()[1])", ("inputs",)),
            ("inputs=(1.5,)", "P(inputs=(1.5,), target=xy()[1])", ("inputs",)),
            ("inputs=[[list]]", "P(inputs=([[0.0] * 64] * 8,), target=xy()[1])", ("inputs",)),
            ("inputs a NumPy array", "import numpy\nP(inputs=(numpy.zeros((8, 64), 'float32'),), target=xy()[1])", ("inputs",)),
            ("inputs sparse", "x, y = xy()\nP(inputs=(x.to_sparse(),), target=y)", ("inputs", "sparse")),
            ("inputs on the meta device", "x, y = xy()\nP(inputs=(torch.empty(8, 64, device='meta'),), target=y)", ("inputs", "meta")),
            ("inputs float64 for a float32 model", "x, y = xy()\nP(inputs=(x.double(),), target=y)", ("inputs", "dtype", "float64")),
            ("inputs int64 for a Linear", "x, y = xy()\nP(inputs=(x.long(),), target=y)", ("inputs", "dtype", "int64")),
            ("inputs of the wrong width", "x, y = xy()\nP(inputs=(x[:, :32],), target=y)", ("inputs", "shape", "model")),
            ("inputs a 0-dim tensor", "x, y = xy()\nP(inputs=(x[0, 0],), target=y)", ("inputs", "dim", "sample")),
            ("target a list", "x, y = xy()\nP(inputs=(x,), target=y.tolist())", ("target",)),
            ("target a NumPy array", "x, y = xy()\nP(inputs=(x,), target=y.numpy())", ("target",)),
            ("target a string", "x, y = xy()\nP(inputs=(x,), target='y')", ("target",)),
            ("target of 7 rows for 8 inputs", "x, y = xy()\nP(inputs=(x,), target=y[:7])", ("target", "samples", "7")),
            ("target classes out of range", "x, y = xy()\ny[0] = 10\nP(inputs=(x,), target=y)", ("target", "class", "10")),
            ("target float for mse of the wrong shape", "x, y = xy()\nP(inputs=(x,), target=torch.zeros(8, 3), loss='mse')",
             ("target", "shape", "mse")),
            ("inputs with requires_grad", "x, y = xy()\nP(inputs=(x.requires_grad_(),), target=y)", ("inputs", "grad")),
    ]:
        pp("plan " + desc, code, names=nm, expect="ok-or-raise" if "requires_grad" in desc else "raise")


def gen_python_plan_arguments():
    """accumplan.plan on hostile devices, budgets, optimizers, losses and options."""
    # Devices, budgets, optimizers, schedulers.
    for desc, code, nm in [
            ("device='cuda' (no CUDA here)", "P(device='cuda')", ("device", "cuda")),
            ("device='cuda:7'", "P(device='cuda:7')", ("device", "cuda")),
            ("device='mps'", "P(device='mps')", ("device", "mps")),
            ("device=5", "P(device=5)", ("device",)),
            ("memory_budget='12XB'", "P(memory_budget='12XB')", ("memory_budget", "12XB")),
            ("memory_budget='200%'", "P(memory_budget='200%')", ("memory_budget", "200%")),
            ("memory_budget=-1", "P(memory_budget=-1)", ("memory_budget",)),
            ("memory_budget=1.5", "P(memory_budget=1.5)", ("memory_budget",)),
            ("memory_budget=[1]", "P(memory_budget=[1])", ("memory_budget",)),
            ("headroom='-1'", "P(headroom='-1')", ("headroom",)),
            ("headroom='2'", "P(headroom='2')", ("headroom",)),
            ("headroom=None", "P(headroom=None)", ("headroom",)),
            ("world_size=0", "P(world_size=0)", ("world_size",)),
            ("world_size=16 over target_batch 8", "P(world_size=16)", ("world_size", "target_batch")),
            ("target_batch=0", "P(target_batch=0)", ("target_batch",)),
            ("target_batch='8'", "P(target_batch='8')", ("target_batch",)),
            ("optimizer=None", "m, o = mlp()\nP(m, None)", ("optimizer",)),
            ("optimizer='adam'", "m, o = mlp()\nP(m, 'adam')", ("optimizer",)),
            ("optimizer LBFGS (needs a closure)", "m, o = mlp()\nP(m, torch.optim.LBFGS(m.parameters()))", ("optimizer", "LBFGS")),
            ("optimizer of another model", "m, o = mlp()\nm2, o2 = mlp()\nP(m, o2)", ("optimizer", "parameters")),
            ("lr=nan", "m, o = mlp()\no.param_groups[0]['lr'] = float('nan')\nP(m, o)", ("lr",)),
            ("lr=-1", "m, o = mlp()\no.param_groups[0]['lr'] = -1.0\nP(m, o)", ("lr",)),
            ("lr='x'", "m, o = mlp()\no.param_groups[0]['lr'] = 'x'\nP(m, o)", ("lr",)),
            ("loss='nope'", "P(loss='nope')", ("loss",)),
            ("loss_fn=5", "P(loss_fn=5)", ("loss_fn",)),
            ("loss_fn returning a float", "P(loss_fn=lambda out, t: 1.0)", ("loss_fn",)),
            ("loss_fn returning a vector", "P(loss_fn=lambda out, t: (out - out.detach()).sum(1))", ("loss_fn",)),
            ("loss_fn returning None", "P(loss_fn=lambda out, t: None)", ("loss_fn",)),
            ("loss_fn raising KeyError", "def f(out, t):\n    raise KeyError('mine')\nP(loss_fn=f)", ("loss_fn", "mine")),
            ("amp='fp8'", "P(amp='fp8')", ("amp",)),
            ("max_grad_norm=0", "P(max_grad_norm=0)", ("max_grad_norm",)),
            ("normalization='nope'", "P(normalization='nope')", ("normalization",)),
            ("ignore_index=2**40", "P(ignore_index=2**40)", ("ignore_index",)),
            ("progress=5", "P(progress=5)", ("progress",)),
    ]:
        pp("plan " + desc, code, names=nm)
    # torch 2.x autocasts float16 on the CPU, 1.13 does not: planned, or refused naming amp.
    pp("plan amp='fp16' on the CPU", "P(amp='fp16')", names=("amp", "fp16"), expect="ok-or-raise")


def gen_python_plan_models():
    """accumplan.plan on models whose forward misbehaves, and on windows whose host data is too large."""
    # Models whose forward misbehaves: one line naming the model, never torch's trace.
    for desc, fwd, nm in [
            ("an output that does not require grad", "lambda self, x: self.lin(x).detach()", ("model", "grad")),
            ("a forward returning None", "lambda self, x: None", ("model", "output", "None")),
            ("a forward returning a string", "lambda self, x: 'out'", ("model", "output", "str")),
            ("a forward raising RuntimeError", "lambda self, x: (_ for _ in ()).throw(RuntimeError('mine'))", ("model", "mine")),
            ("a forward raising ValueError", "lambda self, x: (_ for _ in ()).throw(ValueError('mine'))", ("model", "mine")),
            ("a forward raising a multi-line error", "lambda self, x: (_ for _ in ()).throw(RuntimeError('a\\nb'))", ("model", "a")),
            ("a forward raising NotImplementedError", "lambda self, x: (_ for _ in ()).throw(NotImplementedError())",
             ("model", "NotImplementedError")),
            ("a forward of the wrong output width", "lambda self, x: self.lin(x)[:, :3]", ("target", "class", "model")),
    ]:
        pp("plan with " + desc, "m = Bad(%s)\nkeeps_weights(m, lambda: P(m, torch.optim.SGD(m.parameters(), lr=0.1)))" % fwd,
           names=nm)
    pp("plan with a forward allocating 10 GiB on the host",
       "m = Bad(lambda self, x: self.lin(x) + torch.empty(10 * 2**30 // 4).sum() * 0)\n"
       "keeps_weights(m, lambda: P(m, torch.optim.SGD(m.parameters(), lr=0.1)))",
       names=("memory", "model", "host"), allow=("OutOfMemoryAtOne",), heavy=True)
    # Host memory: the window's data is bounded by ACCUMPLAN_MAX_HOST_DATA (1 GiB in the children).
    pp("plan target_batch 2**30 with no budget (host data)",
       "x, y = xy()\nP(inputs=(x,), target=y, target_batch=2**30, memory_budget=None)",
       names=("ACCUMPLAN_MAX_HOST_DATA", "host", "target_batch"), expect="ok-or-raise", heavy=True, timeout=180)
    pp("plan 1 MiB samples, target_batch 4096, 64 GiB budget (host data)",
       "m = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(2**18, 2))\n"
       "o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
       "P(m, o, (torch.zeros(2, 2**18),), torch.zeros(2, dtype=torch.long), target_batch=4096, memory_budget='64GiB')",
       names=("ACCUMPLAN_MAX_HOST_DATA", "host", "target_batch"), expect="ok-or-raise", heavy=True, timeout=180)


def gen_python_plan_legal():
    """Small legal plans that must plan, a budget below two samples, and the weights kept after a refusal."""
    # Small and legal: these plan.
    ok = "p = %s\nassert sum(p.microbatch_sizes) == p.per_rank_batch, p.microbatch_sizes"
    for desc, call in [("target_batch=1", "P(target_batch=1)"), ("target_batch=2", "P(target_batch=2)"),
                       ("target_batch=3", "P(target_batch=3)"), ("target_batch=8 over 4 ranks", "P(world_size=4)")]:
        pp("plan " + desc + " (legal)", ok % call, expect="ok")
    pp("plan lr=0 on the model's own optimizer (legal)",
       "m, o = mlp()\no.param_groups[0]['lr'] = 0.0\n" + ok % "P(m, o)", expect="ok")
    for desc, setup in [
            ("amp='bf16'", "m, o = mlp()\nkw = dict(amp='bf16')"),
            ("a gradient hook", "m, o = mlp()\nm[0].weight.register_hook(lambda g: g * 2)\nkw = {}"),
            ("tied weights", "m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 10))\n"
                             "m[1].weight = m[0].weight\no = torch.optim.SGD(m.parameters(), lr=0.1)\nkw = {}"),
            ("weight_norm", "m, o = mlp()\nm[0] = torch.nn.utils.weight_norm(m[0])\no = torch.optim.SGD(m.parameters(), lr=0.1)\nkw = {}"),
            ("spectral_norm", "m, o = mlp()\nm[0] = torch.nn.utils.spectral_norm(m[0])\no = torch.optim.SGD(m.parameters(), lr=0.1)\nkw = {}"),
    ]:
        pp("plan with %s on a small MLP (legal)" % desc, setup + "\n" + ok % "P(m, o, **kw)", expect="ok")
    pp("plan SGD without momentum under a budget below two samples",
       "P(memory_budget=2000)", allow=("OutOfMemoryAtOne",), names=("memory_budget", "2000", "budget", "sample"))
    pp("plan leaves the weights as they were after a refusal",
       "m, o = mlp()\nkeeps_weights(m, lambda: P(m, o, loss_fn=lambda out, t: out.mean()))", names=("loss_fn", "sum", "mean"))


def gen_python_plan_train_window():
    """train_window and Plan.save on hostile arguments, the weights kept as they were."""
    # train_window: a bad argument costs nothing, the weights included.
    tw = "m, o = mlp()\nx, y = xy()\nkeeps_weights(m, lambda: plan().train_window(m, o, (x,), y%s))"
    for desc, kw, nm in [
            ("scheduler=5", ", scheduler=5", ("scheduler",)), ("scheduler='cosine'", ", scheduler='cosine'", ("scheduler",)),
            ("scaler=5", ", scaler=5", ("scaler",)), ("on_oom=5", ", on_oom=5", ("on_oom",)),
            ("oom_recovery='yes'", ", oom_recovery='yes'", ("oom_recovery",)),
            ("measure_memory='yes'", ", measure_memory='yes'", ("measure_memory",)),
            ("loss_fn returning a float", ", loss_fn=lambda out, t: 1.0", ("loss_fn",)),
            ("loss_fn raising KeyError", ", loss_fn=lambda out, t: {}['mine']", ("loss_fn", "mine")),
    ]:
        pp("train_window " + desc, tw % kw, names=nm)
    tw = "m, o = mlp()\nx, y = xy()\nkeeps_weights(m, lambda: plan().train_window(%s))"
    for desc, args, nm in [("inputs float64", "m, o, (x.double(),), y", ("inputs", "dtype", "float64")),
                           ("target a list", "m, o, (x,), y.tolist()", ("target",)),
                           ("optimizer='sgd'", "m, 'sgd', (x,), y", ("optimizer",)),
                           ("model=5", "5, o, (x,), y", ("model",))]:
        pp("train_window " + desc, tw % args, names=nm)
    pp("Plan.save('p.json/')", "plan().save('p.json/')", names=("p.json/", "directory", "path"))


# --------------------------------------------------------------------------------------------------
# running


# --------------------------------------------------------------------------------------------------
# class 10: the knobs (checkpointing, the evaluation batch, ragged data, the HF path, exports, plan
# fields they added)

GOLDEN_PLAN = os.path.join(ROOT, "tests", "golden", "plan.json")  # a plan with eval and checkpoint

KNOB_HELPERS = PLAN_HELPERS + r"""
GOLDEN = %r
def golden():
    with open(GOLDEN) as f:
        return json.load(f)
class Blk(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.bn, self.calls = torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), 0
    def forward(self, x):
        self.calls += 1
        return torch.tanh(self.bn(self.fc(x))) + x
class Net(torch.nn.Module):
    def __init__(self, n=3):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Blk() for _ in range(n))
        self.head = torch.nn.Linear(8, 10)
    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)
def net():
    torch.manual_seed(0)
    m = Net()
    return m, torch.optim.SGD(m.parameters(), lr=0.1), torch.randn(8, 8), torch.randint(0, 10, (8,))
from accumplan.checkpointing import apply_checkpointing
def seqs(*lengths):
    return [torch.ones(n, dtype=torch.long) for n in lengths]
def tok():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10))
    return m, torch.optim.SGD(m.parameters(), lr=0.1)
""" % GOLDEN_PLAN


def kp(name, code, expect="raise", names=(), allow=(), timeout=90):
    add("knobs", name, py=KNOB_HELPERS + code, expect=expect, names=names, allow=allow, timeout=timeout)


def golden_with(edit):
    """The golden plan's bytes after ``edit(doc)``."""
    with open(GOLDEN_PLAN) as f:
        doc = json.load(f)
    edit(doc)
    return json.dumps(doc, indent=1).encode()


def v_comment_kept(d, out):
    """An export of plan text with control characters: none raw, and no line of it outside its comment."""
    bad = _ctrl_free(out, "stdout")
    if bad:
        return bad
    lines = out.decode("utf-8", "replace").splitlines()
    return next(("a plan string escaped its comment: %r" % l for l in lines if l.startswith(("evil", "rule_key"))), None)


TAMPERED = [  # (what, edit of the golden plan, a needle of the refusal)
    ("checkpoint.head_bytes_per_sample -1", lambda d: d["checkpoint"].update(head_bytes_per_sample=-1), "head_bytes"),
    ("checkpoint.candidates duplicated", lambda d: d["checkpoint"]["candidates"].append(d["checkpoint"]["candidates"][0]),
     "candidates"),
    ("checkpoint.modules []", lambda d: d["checkpoint"].update(modules=[]), "modules"),
    ("checkpoint.modules a stranger", lambda d: d["checkpoint"].update(modules=["head"]), "modules"),
    ("checkpoint.rule 5", lambda d: d["checkpoint"].update(rule=5), "rule"),
    ("checkpoint.trials[0].kind probe", lambda d: d["checkpoint"]["trials"][0].update(kind="probe"), "kind"),
    ("eval.slope_bytes_per_sample -1", lambda d: d["eval"].update(slope_bytes_per_sample=-1), "slope_bytes"),
    ("eval.trials[0].kind probe", lambda d: d["eval"]["trials"][0].update(kind="probe"), "kind"),
    ("profile.eval.trials[0].kind climb", lambda d: d["profile"]["eval"]["trials"][0].update(kind="climb"), "kind"),
    ("eval.micro_batch 0", lambda d: d["eval"].update(micro_batch=0), "micro_batch"),
    ("eval.micro_batch null but confirmed", lambda d: d["eval"].update(micro_batch=None, confirmed=True), "confirmed"),
    ("eval.predicted_peak_bytes -5", lambda d: d["eval"].update(predicted_peak_bytes=-5), "predicted_peak_bytes"),
    ("checkpoint.without.micro_batch 0", lambda d: d["checkpoint"]["without"].update(micro_batch=0), "micro_batch"),
    ("checkpoint_choice.chosen another option", lambda d: d["checkpoint_choice"].update(chosen="all"), "chosen"),
    ("checkpoint_choice.options without none", lambda d: d["checkpoint_choice"]["options"].pop(0), "options"),
    ("checkpoint_choice kept, checkpoint gone", lambda d: d.pop("checkpoint"), "chosen"),
]


def gen_knobs():
    cls = "knobs"
    # Checkpointing's arguments: named by their Python names before any window runs.
    for desc, kw, nm in [("checkpointing='autoo'", "checkpointing='autoo'", ("checkpointing",)),
                         ("checkpointing=[]", "checkpointing=[]", ("checkpointing",)),
                         ("checkpointing=['nope']", "checkpointing=['nope']", ("checkpointing", "nope")),
                         ("checkpointing=5", "checkpointing=5", ("checkpointing",)),
                         ("checkpoint_candidates=[] with auto", "checkpointing='auto', checkpoint_candidates=[]",
                          ("checkpoint_candidates",)),
                         ("checkpoint_candidates twice", "checkpointing='auto', checkpoint_candidates=['blocks.0', "
                          "'blocks.0']", ("checkpoint_candidates", "twice")),
                         ("checkpoint_candidates without checkpointing", "checkpoint_candidates=['blocks.0']",
                          ("checkpoint_candidates", "checkpointing"))]:
        kp("plan " + desc, "m, o, x, y = net()\nkeeps_weights(m, lambda: P(m, o, (x,), y, %s))" % kw, names=nm)
    kp("checkpointing a TorchScript model", "m, o, x, y = net()\nP(torch.jit.trace(m, (x,)), o, (x,), y, "
       "checkpointing='auto')", names=("TorchScript",))
    kp("apply_checkpointing twice", "m = net()[0]\nh = apply_checkpointing(m, ['blocks.0'])\n"
       "apply_checkpointing(m, ['blocks.0'])", names=("blocks.0", "checkpointed already"))
    kp("a recomputed BatchNorm moves its statistics once (ok)",
       "outs = []\nfor wrap in (False, True):\n    m, o, x, y = net()\n    h = apply_checkpointing(m, "
       "['blocks.0', 'blocks.2']) if wrap else None\n    torch.nn.functional.cross_entropy(m(x), y).backward()\n"
       "    outs.append([b.clone() for b in m.buffers()])\n    h and h.remove()\n"
       "assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*outs)), 'buffers moved twice'", expect="ok")
    kp("Ctrl-C in a recompute is a KeyboardInterrupt (ok)",
       "m, o, x, y = net()\nblk = m.blocks[1]\nfwd = blk.forward\ndef stop(*a):\n    if blk.calls == 1:\n"
       "        raise KeyboardInterrupt\n    return fwd(*a)\nblk.forward = stop\nd = golden()\n"
       "p = accumplan.load_plan(dict(plan().raw, checkpoint=dict(d['checkpoint'], modules=['blocks.1'], candidates="
       "[dict(d['checkpoint']['candidates'][0], name='blocks.%d' % i) for i in range(3)])))\n"
       "try:\n    p.train_window(m, o, (x,), y)\n    raise AssertionError('no interrupt')\nexcept KeyboardInterrupt:\n"
       "    pass\nassert 'forward' not in m.blocks[1].__dict__ or m.blocks[1].forward is stop", expect="ok")
    # The evaluation batch.
    for desc, code, nm in [("plan.eval_sizes(2**40)", "plan().eval_sizes(2**40)", ("samples",)),
                           ("plan.eval_sizes(-1)", "plan().eval_sizes(-1)", ("samples",)),
                           ("plan.eval_sizes('8')", "plan().eval_sizes('8')", ("samples",)),
                           ("plan(eval=2)", "P(eval=2)", ("eval",)),
                           ("evaluate(inputs='x')", "m, o = mlp()\nplan().evaluate(m, 'x', xy()[1])", ("inputs",)),
                           ("evaluate a sparse target", "m, o = mlp()\nx, y = xy()\nplan().evaluate(m, (x,), "
                            "y.to_sparse())", ("target", "sparse"))]:
        kp(desc, code, names=nm)
    # Ragged data: every item checked, padding held to the host-data limit (1 GiB here).
    for desc, data, nm in [("a meta sequence", "[torch.ones(3, dtype=torch.long, device='meta')] + seqs(5)", ("meta",)),
                           ("a sparse sequence", "[torch.ones(3, dtype=torch.long).to_sparse()] + seqs(5)", ("sparse",)),
                           ("empty example dicts", "[{}, {}]", ("empty",)),
                           ("an empty sequence", "[torch.ones(0, dtype=torch.long)] + seqs(5)", ("empty",)),
                           ("a float sequence", "[torch.ones(3)] + seqs(5)", ("integers", "float")),
                           ("dicts then a tensor", "[{'input_ids': torch.ones(3, dtype=torch.long)}, torch.ones(4, "
                            "dtype=torch.long)]", ("dict",)),
                           ("one long among many short", "seqs(*([1] * 20000 + [100000]))", ("padded", "host"))]:
        kp("ragged plan: " + desc, "m, o = tok()\nkeeps_weights(m, lambda: P(m, o, %s, None, target_batch=2))" % data,
           names=("inputs",) + nm)
        kp("ragged train_window: " + desc, "m, o = tok()\np = P(m, o, seqs(8, 6, 8, 5), None, target_batch=4)\n"
           "keeps_weights(m, lambda: p.train_window(m, o, %s, None))" % data, names=("inputs",) + nm)
    kp("pad_sequences: one long among many short", "accumplan.pad_sequences(seqs(*([1] * 20000 + [100000])), "
       "next_token=True)", names=("padded", "ACCUMPLAN_MAX_HOST_DATA"))
    # The Hugging Face path: dict batches and the model's own loss.
    kp("a dict batch with a flag plans (ok)",
       "class HF(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
       "        self.lin = torch.nn.Linear(64, 10)\n    def forward(self, x, use_cache=True):\n"
       "        assert use_cache is False\n        return self.lin(x)\nm = HF()\nx, y = xy()\n"
       "P(m, torch.optim.SGD(m.parameters(), lr=0.1), {'x': x, 'use_cache': False}, y)", expect="ok")
    for desc, ret in [("{'loss': 3}", "{'loss': 3}"), ("a dict without loss", "{'logits': self.lin(x)}"),
                      ("None", "None")]:
        kp("loss='model' and the model returns " + desc,
           "m = Bad(lambda self, x: %s)\nP(m, torch.optim.SGD(m.parameters(), lr=0.1), (xy()[0],), None, loss='model')"
           % ret, names=("loss",))
    # Exports of plan text holding control characters, and the refusal in Python's words.
    evil = "def evil_plan():\n    d = golden()\n    c = d['checkpoint']\n    c['rule'] = 'rule\\r\\nrule_key: 1\\x1b[2J'\n" \
           "    d['checkpoint_choice']['chosen'] = d['checkpoint_choice']['options'][1]['rule'] = c['rule']\n" \
           "    c['candidates'][0]['name'] = c['modules'][0] = 'blocks.1\\nevil: true\\x00\\u2028evil: 2\\x85evil: 3'\n" \
           "    return accumplan.load_plan(d)\n"
    for to in ("lightning", "accelerate-config", "hf", "deepspeed", "accelerate"):
        kp("Plan.export(%r) of control characters (ok)" % to,
           evil + "t = evil_plan().export(%r)\nassert not any(l.startswith(('evil', 'rule_key')) for l in "
           "t.splitlines()), t\nassert not any(ord(ch) < 32 and ch not in '\\n\\t' for ch in t), 'raw control'" % to,
           expect="ok")
    kp("Plan.export('torchrun') of a checkpointed plan", "accumplan.load_plan(GOLDEN).export('torchrun')",
       names=("torchrun",))
    for to in ("lightning", "accelerate-config"):
        def edit(d):
            d["checkpoint"]["rule"] = d["checkpoint_choice"]["chosen"] = "rule\r\nrule_key: 1\x1b[2J"
            d["checkpoint_choice"]["options"][1]["rule"] = d["checkpoint"]["rule"]
            d["checkpoint"]["candidates"][0]["name"] = d["checkpoint"]["modules"][0] = "blocks.1\nevil: true\x00\u2028evil: 2"
        add(cls, "export --to %s of control characters (ok)" % to, export_cmd(plan="evil.json", to=to),
            files={"evil.json": golden_with(edit)}, expect="ok", validate=v_comment_kept)
    # Tampered plan fields: refused by both readers, naming the field.
    for what, edit, needle in TAMPERED:
        data = golden_with(edit)
        add(cls, "export of a plan with " + what, export_cmd(plan="p.json"), files={"p.json": data}, names=(needle,))
        kp("load_plan of a plan with " + what, "accumplan.load_plan(%r)" % json.loads(data), names=(needle,))


def snapshot(d):
    snap = {}
    d = os.fsencode(d)
    for dirpath, dirnames, filenames in os.walk(d, followlinks=False):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            rel = os.path.relpath(p, d)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            kind = stat.S_IFMT(st.st_mode)
            h = None
            if stat.S_ISREG(st.st_mode):
                try:
                    with open(p, "rb") as f:
                        h = hashlib.sha256(f.read()).hexdigest()
                except OSError:
                    h = "unreadable"
            elif stat.S_ISLNK(st.st_mode):
                h = os.readlink(p)
            snap[rel] = (kind, st.st_size if stat.S_ISREG(st.st_mode) else 0, st.st_mtime_ns, h, st.st_mode)
    return snap


def setup_files(d, files):
    db = os.fsencode(d)
    later_modes = []
    for name, spec in files.items():
        p = os.path.join(db, os.fsencode(name))
        if isinstance(spec, bytes):
            with open(p, "wb") as f:
                f.write(spec)
            continue
        if isinstance(spec, tuple) and isinstance(spec[0], bytes):
            with open(p, "wb") as f:
                f.write(spec[0])
            later_modes.append((p, spec[1]))
            continue
        kind = spec[0]
        if kind == "dir":
            os.makedirs(p, exist_ok=True)
            if len(spec) > 1:
                later_modes.append((p, spec[1]))
        elif kind == "fifo":
            os.mkfifo(p)
        elif kind == "symlink":
            os.symlink(os.fsencode(spec[1]), p)
        elif kind == "hardlink":
            os.link(os.path.join(db, os.fsencode(spec[1])), p)
        elif kind == "copy":
            shutil.copyfile(fx(spec[1]), p)
    for p, mode in later_modes:
        os.chmod(p, mode)


def shorten(argv):
    parts = []
    for a in argv:
        s = os.fsdecode(a) if isinstance(a, bytes) else a
        s = s.replace(FIX + "/", "$FIX/").replace(BIN, "accumplan")
        if any(ord(c) < 32 or ord(c) == 127 or ord(c) > 126 for c in s) or s == "" or " " in s:
            s = ascii(s)
        parts.append(s)
    line = " ".join(parts)
    line = line.replace("--device cpu --threads 1 --progress none", "…").replace("--threads 1 --progress none --steps 1", "…")
    return line if len(line) <= 260 else line[:257] + "..."


HEAVY = threading.Semaphore(2)  # heavy cases are killed at RSS_LIMIT, so two at a time stay under 8 GiB


def limit_child():
    try:
        resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
    except (ValueError, OSError):
        pass
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_process(argv, cwd, env, timeout, out_path, err_path):
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        t0 = time.monotonic()
        p = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                             start_new_session=True, preexec_fn=limit_child)
        hung = over = False
        peak = 0
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            rss = current_rss(p.pid)
            peak = max(peak, rss)
            if rss > RSS_LIMIT:
                over = True  # killed at the bound: it would have gone on growing
            if over or time.monotonic() - t0 > timeout:
                hung = not over
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                pid, status, ru = os.wait4(p.pid, 0)
                break
            time.sleep(0.02)
        p.returncode = 0  # reaped by wait4; keep Popen from waiting again
        elapsed = time.monotonic() - t0
    rc = os.waitstatus_to_exitcode(status)
    with open(out_path, "rb") as f:
        out = f.read()
    with open(err_path, "rb") as f:
        err = f.read()
    return rc, out, err, hung, max(ru.ru_maxrss * 1024, peak, RSS_LIMIT + 1 if over else 0), elapsed


def current_rss(pid):
    try:
        with open("/proc/%d/status" % pid, "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def needle_hit(err, names):
    if not names:
        return True
    low = err.decode("utf-8", "replace").lower()
    for n in names:
        n = os.fsdecode(n) if isinstance(n, bytes) else str(n)
        if n and n.lower() in low:
            return True
    return False


def check_stderr_line(err, kinds):
    if not err.endswith(b"\n") or err.count(b"\n") != 1:
        kinds.append("multi-line")
    elif any((c < 32 and c != 10) or c == 127 for c in err):
        kinds.append("ctrl-char")


def diff_snap(before, after, allowed):
    allowed = {os.fsencode(a) for a in allowed}
    problems = []
    for k in sorted(set(before) | set(after)):
        if k in allowed:
            continue
        if k not in after:
            problems.append("deleted %r" % k)
        elif k not in before:
            problems.append("created %r" % k)
        elif before[k] != after[k]:
            problems.append("changed %r" % k)
    for k in after:
        if k.endswith(b".tmp") or b".tmp." in os.path.basename(k) or os.path.basename(k).startswith(b".tmp"):
            problems.append("temp file left %r" % k)
    return sorted(set(problems))


def run_case(c, timeout_default):
    """Runs one case in its own scratch directory and judges it by the contract; returns its result."""
    res = {"id": c.id, "class": c.cls, "name": c.name, "expect": c.expect, "kinds": [], "detail": ""}
    if c.py is None:
        res["cmd"] = shorten(c.argv)
    else:
        res["cmd"] = "python: " + c.py.replace("\n", "; ")[:240]
    if c.skip:
        res["outcome"] = "skipped"
        res["detail"] = c.skip
        return res
    d = os.path.join(WORK, "cases", c.id)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    io_dir = os.path.join(WORK, "io")
    out_p, err_p = os.path.join(io_dir, c.id + ".out"), os.path.join(io_dir, c.id + ".err")
    timeout = c.timeout or timeout_default
    env = child_env(c.env)
    argv, cwd, res_p = prepare_case(c, d, io_dir)
    before = snapshot(d)
    if c.heavy:
        HEAVY.acquire()
    try:
        rc, out, err, hung, rss, elapsed = run_process(argv, cwd, env, timeout, out_p, err_p)
    finally:
        if c.heavy:
            HEAVY.release()
    after = snapshot(d)
    res.update(rc=rc, rss_mib=round(rss / 2 ** 20, 1), seconds=round(elapsed, 2),
               stderr=err.decode("utf-8", "backslashreplace")[:600], stdout_bytes=len(out))
    judge_limits(res, rc, hung, rss)
    if c.py is not None:
        judge_python(c, res, rc, hung, res_p, before, after)
    else:
        judge_cli(c, res, rc, out, err, hung, rss, d, before, after)
    res["kinds"] = sorted(set(res["kinds"]))
    res["outcome"] = "fail" if res["kinds"] else "pass"
    if not res["kinds"]:
        shutil.rmtree(d, ignore_errors=True)
    return res


def prepare_case(c, d, io_dir):
    """Sets up a case's files; returns its argv, its cwd and (for a Python case) its driver's result path."""
    if c.py is None:
        setup_files(d, c.files)
        return [os.fsencode(a) if isinstance(a, str) else a for a in c.argv], d, None
    cwd = os.path.join(d, "w")  # Python cases run one level down: a temp file beside cwd is seen too
    os.makedirs(cwd, exist_ok=True)
    setup_files(cwd, c.files)
    spec_p = os.path.join(io_dir, c.id + ".spec.json")
    res_p = os.path.join(io_dir, c.id + ".res.json")
    with open(spec_p, "w") as f:
        json.dump({"prelude": PY_PRELUDE % FIX, "code": c.py}, f)
    return [sys.executable, "-c", PY_DRIVER, spec_p, res_p], cwd, res_p


def judge_limits(res, rc, hung, rss):
    """Adds to `res` a hang and a child over the memory bound."""
    kinds = res["kinds"]
    if hung:
        kinds.append("hang")
    if rss > RSS_LIMIT:
        kinds.append("memory")
        if rc < 0:
            res["detail"] = "killed by the campaign at %d MiB resident (bound %d MiB)" % (rss >> 20, RSS_LIMIT >> 20)


def load_python_result(res_p):
    """The result the Python driver wrote, or None when it wrote none that parses."""
    try:
        with open(res_p) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def judge_python(c, res, rc, hung, res_p, before, after):
    """Adds to `res` what a Python case broke: its driver's result, and files changed outside its own w/."""
    kinds = res["kinds"]
    if not hung:
        judge_python_result(c, res, rc, load_python_result(res_p))
    probs = diff_snap(before, after, c.outputs)
    # a Python case may create what its code creates itself (fifo, copies, dirs) in its cwd
    probs = [p for p in probs if p.startswith("temp file") or not p.split("'")[1].startswith("w")]
    if probs:
        kinds.append("file")
        res["detail"] += "; ".join(probs)


def judge_python_result(c, res, rc, r):
    """Adds to `res` what the driver's result `r` breaks: a crash, a missing error, a wrong or unnamed exception."""
    kinds = res["kinds"]
    if r is None:
        kinds.append("signal" if rc < 0 else "crash")
        res["detail"] = "driver died rc=%d" % rc
    elif r["status"] == "ok":
        if c.expect == "raise":
            kinds.append("no-error")
            res["detail"] = "returned normally"
    else:
        res["stderr"] = "%s: %s" % (r["type"], r["msg"][:600])
        t = r["type"].split(".")[-1]
        okt = r["planerror"] or r["exact"] is not None or t in c.allow
        if not okt:
            kinds.append("wrong-exception")
        if "\n" in r["msg"]:
            kinds.append("multi-line")
        if okt and not needle_hit(r["msg"].encode(), c.names):
            kinds.append("unnamed")
        if okt and CLI_OPTION.search(re.sub(r"`[^`]*`", "", r["msg"])):
            kinds.append("cli-words")  # a Python caller has no --options: name the argument


def judge_cli(c, res, rc, out, err, hung, rss, d, before, after):
    """Adds to `res` what a command broke: a signal, a trace, a bad refusal or success, files changed."""
    kinds = res["kinds"]
    probs = diff_snap(before, after, () if rc != 0 else c.outputs)
    if rc < 0 and not hung and rss <= RSS_LIMIT:
        kinds.append("signal")
    if b"internal error" in err or b"Traceback" in err or b"terminate called" in err or b"what():" in err:
        kinds.append("traceback")
    if rc == 2 and not hung:
        judge_cli_refusal(c, kinds, out, err, probs)
    elif rc == 0 and not hung:
        judge_cli_success(c, res, out, d, probs)
    elif not hung and (rc >= 0 or rss <= RSS_LIMIT):
        if rc >= 0:
            kinds.append("exit")
        if probs:
            kinds.append("file")
    if probs:
        res["detail"] = (res["detail"] + "; " if res["detail"] else "") + "; ".join(probs)[:400]


def judge_cli_refusal(c, kinds, out, err, probs):
    """Adds to `kinds` how an exit 2 breaks the refusal contract: not one named line, stdout, files changed."""
    sub = []
    check_stderr_line(err, sub)
    if out:
        sub.append("stdout")
    if probs:
        sub.append("file")
    if not sub and not needle_hit(err, c.names):
        sub.append("unnamed")
    if c.expect == "ok":
        kinds.append("exit")
    kinds.extend(sub)


def judge_cli_success(c, res, out, d, probs):
    """Adds to `res` how an exit 0 breaks the case: a refusal expected, an output its validator rejects, files."""
    kinds = res["kinds"]
    if c.expect == "refuse":
        kinds.append("exit")
        res["detail"] = "exit 0, expected a refusal"
        if out and c.expect == "refuse":
            kinds.append("stdout")
    else:
        if c.validate is not None:
            prob = c.validate(d, out)
            if prob:
                kinds.append("bad-output")
                res["detail"] = prob
    if probs:
        kinds.append("file")


def class_of(arg):
    out = []
    for a in arg.split(","):
        a = a.strip()
        if a.isdigit() and 1 <= int(a) <= len(CLASSES):
            out.append(CLASSES[int(a) - 1])
        elif a in CLASSES:
            out.append(a)
        else:
            raise SystemExit("unknown class %r; one of %s (or 1..9)" % (a, ", ".join(CLASSES)))
    return out


def print_summary(results, only, wall, jobs):
    """The table by class and every failing and skipped case; returns the failures."""
    kinds_all = ["exit", "multi-line", "ctrl-char", "stdout", "file", "traceback", "signal", "hang", "memory",
                 "unnamed", "cli-words", "bad-output", "wrong-exception", "no-error", "crash"]
    used = [k for k in kinds_all if any(k in r["kinds"] for r in results)]
    head = ["class", "cases", "pass", "skip", "fail"] + used
    rows = []
    for cls in only:
        rs = [r for r in results if r["class"] == cls]
        rows.append([cls, len(rs), sum(r["outcome"] == "pass" for r in rs), sum(r["outcome"] == "skipped" for r in rs),
                     sum(r["outcome"] == "fail" for r in rs)] + [sum(k in r["kinds"] for r in rs) for k in used])
    rows.append(["total"] + [sum(r[i] for r in rows) for i in range(1, len(head))])
    w = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    print()
    print("hostile campaign: %s, %d cases in %.0f s (--jobs %d)" % (BIN, len(results), wall, jobs))
    print("  ".join(str(h).rjust(w[i]) if i else str(h).ljust(w[i]) for i, h in enumerate(head)))
    for row in rows:
        print("  ".join(str(x).rjust(w[i]) if i else str(x).ljust(w[i]) for i, x in enumerate(row)))
    fails = [r for r in results if r["outcome"] == "fail"]
    if fails:
        print("\nfailures (%d):" % len(fails))
        for r in fails:
            print("- [%s] %s  {%s}  exit %s, %.1f s, %s MiB" % (r["id"], r["name"], ",".join(r["kinds"]), r.get("rc"),
                                                               r.get("seconds", 0), r.get("rss_mib")))
            print("    $ %s" % r["cmd"])
            if r.get("detail"):
                print("    detail: %s" % r["detail"][:300])
            print("    stderr: %s" % ascii(r.get("stderr", "")[:200]))
    skipped = [r for r in results if r["outcome"] == "skipped"]
    if skipped:
        print("\nskipped (%d): %s" % (len(skipped), "; ".join(sorted({r["detail"] for r in skipped}))))
    return fails


def sampled(cases, n):
    """n of the cases, a seeded choice, topped up to SAMPLE_PER_CLASS of every class; in id order."""
    rnd = random.Random(SEED)
    chosen = rnd.sample(cases, n)
    for cls in CLASSES:
        own = [c for c in cases if c.cls == cls]
        drawn = [c for c in chosen if c.cls == cls]
        chosen += rnd.sample([c for c in own if c not in drawn], max(0, min(SAMPLE_PER_CLASS, len(own)) - len(drawn)))
    return sorted(chosen, key=lambda c: c.id)


def main():
    global BIN, FIX, WORK
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="the accumplan executable (a copy, not build/accumplan being relinked)")
    ap.add_argument("--only", help="run only these classes (names or 1..10, comma-separated)")
    ap.add_argument("--jobs", type=int, default=2, help="cases in parallel (default 2)")
    ap.add_argument("--json", help="write every case's result here")
    ap.add_argument("--work", default="/tmp/hostile-campaign", help="scratch directory (recreated)")
    ap.add_argument("--timeout", type=float, default=60, help="default per-case timeout in seconds")
    ap.add_argument("--skip-bomb", action="store_true", help="do not build or run the 4.5 GiB zip-bomb cases")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--sample", type=int, metavar="N",
                    help="run N of the cases, a fixed seeded choice topped up to %d of every class (the test "
                         "command's bounded subset)" % SAMPLE_PER_CLASS)
    args = ap.parse_args()
    BIN = os.path.abspath(args.bin)
    if not os.access(BIN, os.X_OK):
        raise SystemExit("--bin %s is not an executable" % BIN)
    WORK = os.path.abspath(args.work)
    FIX = os.path.join(WORK, "fixtures")
    only = class_of(args.only) if args.only else CLASSES
    if not args.list:
        shutil.rmtree(WORK, ignore_errors=True)
        os.makedirs(os.path.join(WORK, "cases"))
        os.makedirs(os.path.join(WORK, "io"))
        t0 = time.monotonic()
        print("building fixtures in %s ..." % FIX, file=sys.stderr, flush=True)
        build_fixtures(FIX, skip_bomb=args.skip_bomb)
        print("fixtures built in %.1f s" % (time.monotonic() - t0), file=sys.stderr, flush=True)
    else:
        FIX = os.path.join(WORK, "fixtures")
    gens = {"outputs": gen_outputs, "one-line": gen_one_line, "host-data": gen_host_data,
            "storage": lambda: gen_storage(args.skip_bomb), "later": gen_later, "non-utf8": gen_non_utf8,
            "report": gen_report, "python": gen_python, "python-plan": gen_python_plan, "knobs": gen_knobs}
    if args.list and not os.path.isdir(FIX):
        raise SystemExit("--list needs the fixtures of a previous run in %s" % FIX)
    for cls in CLASSES:
        if cls in only:
            n0 = len(CASES)
            gens[cls]()
            for i, c in enumerate(CASES[n0:]):
                c.id = "%d-%s-%03d" % (CLASSES.index(cls) + 1, cls, i)
    if args.sample is not None and args.sample < len(CASES):
        if args.sample < 1:
            raise SystemExit("--sample %d: give a positive number of cases" % args.sample)
        CASES[:] = sampled(CASES, args.sample)
    if args.list:
        for c in CASES:
            print(c.id, c.expect, c.name)
        print("%d cases" % len(CASES))
        return 0
    fix_before = snapshot(FIX)
    if os.path.exists("/tmp/hostile-pwned"):
        os.unlink("/tmp/hostile-pwned")
    print("running %d cases, %d at a time ..." % (len(CASES), args.jobs), file=sys.stderr, flush=True)
    t0 = time.monotonic()
    results = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(args.jobs, 4))) as ex:
        futs = {ex.submit(run_case, c, args.timeout): c for c in CASES}
        done = 0
        for f in concurrent.futures.as_completed(futs):
            results.append(f.result())
            done += 1
            if done % 50 == 0:
                print("  %d/%d (%.0f s)" % (done, len(CASES), time.monotonic() - t0), file=sys.stderr, flush=True)
    results.sort(key=lambda r: r["id"])
    wall = time.monotonic() - t0
    extra = []
    if snapshot(FIX) != fix_before:
        extra.append("the shared fixtures directory changed during the campaign")
    if os.path.exists("/tmp/hostile-pwned"):
        extra.append("/tmp/hostile-pwned exists: a pickle's os.system ran")

    fails = print_summary(results, only, wall, args.jobs)
    for e in extra:
        print("CAMPAIGN FAILURE: " + e)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bin": BIN, "seconds": wall, "results": results, "campaign_failures": extra}, f, indent=1)
    return 1 if fails or extra else 0


if __name__ == "__main__":
    sys.exit(main())
