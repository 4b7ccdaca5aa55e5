#!/usr/bin/env bash
# scripts/gpu-check.sh — the GPU check in one command: configure against PyTorch's own LibTorch
# (CUDA) and CUPTI, build with every core, run the CUDA/CUPTI probe tests, then the GPU benchmark
# (tests/bench/gpu_bench.py: accumplan's plan and `run` against the largest size that fits and
# against the real Accelerate and Lightning batch-size finders, same model and budget), writing
# everything under one folder.
#
# What it is not: part of the normal build. It runs on the lent GPU machine (an H200 with nvcc 13,
# CMake, ninja, Python 3.12 + PyTorch 2.11+cu130, Accelerate, Lightning; no nlohmann/json, CLI11
# or Catch2, and no network), and, as a rehearsal, here.
#
# How to send it (from the CPU machine, in the repository root):
#   1. bash scripts/gpu-prepare.sh        # fills the git-ignored .gpu-deps/ from Debian's packages
#   2. the device tool's run with  carry: [".gpu-deps"],  timeout_s: 600, and a command that writes
#      into a scratch folder and packs it, since the tool brings back at most 8 files from $OUT:
#        mkdir -p /tmp/gc; (OUT=/tmp/gc timeout -k 5 575 bash scripts/gpu-check.sh);
#        tar czf $OUT/gpu-check.tar.gz -C /tmp/gc .; cp /tmp/gc/steps.log /tmp/gc/RESULTS-gpu.md /tmp/gc/gpu-probes.json $OUT/
#   The folder holds 15 files: RESULTS-gpu.md, results-gpu.json, gpu-probes.json, build.log, test.log, bench.log,
#   steps.log, the Python API's python.log and python-plan.json (accumplan.plan with
#   device="cuda", judged by 3 windows of train_window), activation checkpointing's grid:
#   CHECKPOINT.md, checkpoint.json, checkpoint.log, and the sharded optimizer state on 2 ranks:
#   SHARDING.md, sharding.json, sharding.log (and python-gdb.log, the C++ stack of a Python
#   step that crashed). Copy RESULTS-gpu.md, gpu-probes.json, CHECKPOINT.md and SHARDING.md (as
#   CHECKPOINT-gpu.md and SHARDING-gpu.md) to tests/bench/ and commit them.
#   Sized for one 10-minute command: on the H200 (8 cores seen) configure took 5 s, the build of
#   the binary and the probe tests 57 s, the tests 2 s, the Python package 32 s (2026-12-04);
#   the benchmark gets the rest of 8 minutes (ROWS_UNTIL_S: fewer, for a lease with less left) and
#   is stopped a minute after that at the latest (rows not started in time are recorded as
#   skipped; resnet18's bf16 and CUDA-probe rows run right after its first row). A second call,
#   "BENCH_SECONDS=150 bash scripts/gpu-check.sh --bench-only", reruns only the benchmark on the
#   build the first left — only if sent at once: the machine goes back 30 s after a call, and the
#   15-minute lease then holds about 3 minutes more.
#
# Rehearsal: bash scripts/gpu-check.sh --rehearse — the same sequence here, against the same
# PyTorch 2.x (scripts/torch-env.sh: CUDA and CUPTI compiled, nothing run on a GPU), with the CPU
# device and tiny sizes: it proves that .gpu-deps configures,
# that the build, the tests and the benchmark run end to end and that every output is written;
# only the CUDA steps are left for the GPU. CI runs it (scripts/test.sh) after the main build,
# which it reuses (BUILD_DIR, default build/), so it costs no second build there.
#
# Exit status: 0 when every step passed; 1 otherwise (steps.log says which). On the GPU the
# script goes on after a failed step where the next one can still teach something.
set -uo pipefail
cd "$(dirname "$0")/.."

mode=gpu
bench_only=0
for arg in "$@"; do
  case "$arg" in
    --rehearse) mode=rehearse ;;
    --bench-only) bench_only=1 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check: unknown argument '$arg'; use --rehearse, --bench-only or nothing" >&2; exit 2 ;;
  esac
done

out="${OUT:-$PWD/build-gpu-check/out}"
mkdir -p "$out"
steps="$out/steps.log"
: >"$steps"
failed=0
t_start=$(date +%s)

# Runs one named step, logging its command's output to a file, its status and seconds to steps.log.
step() {
  local name="$1" log="$2"
  shift 2
  local t0=$(date +%s) rc=0
  echo "gpu-check: $name ..." >&2
  "$@" >>"$log" 2>&1 || rc=$?
  local secs=$(($(date +%s) - t0))
  if [ "$rc" -eq 0 ]; then
    echo "ok     $name (${secs} s)" | tee -a "$steps" >&2
  else
    echo "FAILED $name (exit $rc, ${secs} s; see $(basename "$log"))" | tee -a "$steps" >&2
    tail -n 15 "$log" >&2
    failed=1
  fi
  return "$rc"
}

deps="$PWD/.gpu-deps"
if [ ! -f "$deps/MANIFEST" ]; then
  echo "gpu-check: $deps is missing: run 'bash scripts/gpu-prepare.sh' on the CPU machine and carry .gpu-deps" >&2
  exit 2
fi

# One recipe with CI (scripts/torch-env.sh): the LibTorch of the Python that runs the check, CUDA,
# CUPTI and NCCL required, the header-only packages from .gpu-deps first on the search path (the
# GPU machine has no other copy and reaches no registry).
# shellcheck source=scripts/torch-env.sh
. scripts/torch-env.sh
export ACCUMPLAN_EXTRA_PREFIX="$deps"
if [ "$mode" = gpu ]; then
  python=python3
  build="${BUILD_DIR:-build-gpu}"
  configured_dir="$build"
  jobs="$(nproc)"
  torch_prefix="$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
  nvcc="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
  cuda_root="${CUDA_HOME:-$(dirname "$(dirname "$nvcc")")}"
  export CUDA_HOME="$cuda_root"
  bench_args=(--device cuda)
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-8}"
else
  # The rehearsal: CI's own torch environment and build (BUILD_DIR, configured by scripts/build.sh
  # through the same recipe), and a scratch folder configured with .gpu-deps first, to check that
  # every header-only package comes from there.
  python="${PYTHON:-$(torch_env_python)}"
  build="${BUILD_DIR:-build}"
  configured_dir=build-gpu-rehearse
  jobs="${JOBS:-2}"
  if [ ! -f "$build/CMakeCache.txt" ]; then torch_configure "$python" "$build" >/dev/null; fi
  # One budget: the plumbing is the same at the second, and CI pays for every second. Room above
  # resnet18's Adam state (171 MiB) for a CPU's convolution workspace (up to the weights' size,
  # 45 MiB with oneDNN on an AMD EPYC) and a few samples, whatever CPU CI has.
  bench_args=(--device cpu --rehearse --budgets 320MiB)
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
fi

{
  echo "# gpu-check ($mode) $(date -u +%Y-%m-%dT%H:%MZ) at $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "# $(uname -m), $(nproc) cores; .gpu-deps: $(grep -v '^#' "$deps/MANIFEST" | tr '\n' ' ')"
  echo "# $(cmake --version | head -n 1); python: $("$python" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1)"
  if [ "$mode" = gpu ]; then
    # LibTorch's c10d headers include gloo's: the wheel must ship them (torch/include/gloo).
    gloo="$(dirname "$(dirname "$torch_prefix")")/include/gloo/config.h"
    echo "# gloo headers in the wheel: $([ -f "$gloo" ] && echo yes || echo "NO ($gloo)")"
    echo "# nvcc: $nvcc ($("$nvcc" --version 2>&1 | tail -n 1)); toolkit: $cuda_root; GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1)"
    # Where CUPTI is, if CMake's CUDA::cupti does not find it (the cu13 wheels ship only
    # libcupti.so.13, which needs -DCUDA_cupti_LIBRARY=...): what a rerun would pass.
    echo "# libcupti: $(find "$cuda_root" "$(dirname "$(dirname "$(dirname "$torch_prefix")")")/nvidia" \
      -name 'libcupti.so*' 2>/dev/null | head -n 3 | tr '\n' ' ')"
  fi
} >>"$steps"

if [ "$bench_only" -eq 1 ]; then
  if [ ! -x "$build/accumplan" ]; then
    echo "gpu-check: --bench-only needs $build/accumplan from a first call on this machine; it is gone (a fresh machine)" >&2
    exit 2
  fi
  echo "# --bench-only: configure, build and tests skipped; $build/accumplan as it is" >>"$steps"
elif step "configure" "$out/build.log" torch_configure "$python" "$configured_dir"; then
  for pkg in nlohmann_json CLI11 Catch2; do
    dir=$(grep "^${pkg}_DIR:" "$configured_dir/CMakeCache.txt" | cut -d= -f2-)
    case "$dir" in
      "$deps"/*) echo "ok     $pkg from .gpu-deps ($dir)" >>"$steps" ;;
      *) echo "FAILED $pkg not from .gpu-deps: '$dir'" | tee -a "$steps" >&2; failed=1 ;;
    esac
  done
  grep -E "✓|✗" "$out/build.log" | sed 's/^-- */summary: /' >>"$steps"
fi

# The binary, the probe tests (CUDA and CUPTI ones included in a CUDA build) and nothing else:
# the rest of the suite is torch-version-independent and runs in CI.
if [ "$bench_only" -eq 0 ]; then
  # -k 0: the first compile against a new LibTorch shows every error, not the first one only.
  step "build" "$out/build.log" cmake --build "$build" -j "$jobs" --target accumplan accumplan_probe_tests \
    accumplan_timeline_tests -- -k 0
  step "probe tests" "$out/test.log" ctest --test-dir "$build" -R "^(probes|timeline):" --no-tests=error \
    --output-on-failure -j "$jobs"
fi

# Python's output unbuffered, and a crash's Python stack in the log (faulthandler): the first H200
# run's Python steps died of SIGSEGV with nothing after the last progress line.
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1

# A crash in compiled code shows faulthandler nothing below the call into it (the first H200 run:
# SIGSEGV inside _core.search_plan), so the crashed Python command runs once more under a
# debugger, its C++ stack to python-gdb.log: cuda-gdb on the H200's image (it debugs programs
# without GPU code too; there is no gdb there), gdb elsewhere. Arguments: PYTHONPATH, then the
# command. The package is built with debug information on the GPU (below), so frames have names.
native_stack() {
  local pypath="$1" dbg
  shift
  dbg="$(command -v cuda-gdb || command -v gdb)" || { echo "# no cuda-gdb or gdb: no C++ stack of the crash" >>"$steps"; return 0; }
  echo "# $dbg, PYTHONPATH=$pypath: $*" >>"$out/python-gdb.log"
  env PYTHONFAULTHANDLER= "PYTHONPATH=$pypath" timeout -k 5 180 "$dbg" -batch -ex run -ex "bt 60" --args "$@" \
    >>"$out/python-gdb.log" 2>&1
  echo "# the crash's C++ stack: python-gdb.log ($dbg)" >>"$steps"
}

# The Python API on the device: the package built with pip against this machine's torch (into a
# folder of the build, no venv needed), then accumplan.plan on a conv net and 3 windows of
# train_window of its plan (tests/bench/python_device_check.py). About a minute.
if [ "$bench_only" -eq 0 ]; then
  pydir="$PWD/$build/python-pkg"
  pyargs="-DCMAKE_PREFIX_PATH=$deps"
  [ "$mode" = gpu ] && pyargs+=" -DCMAKE_BUILD_TYPE=RelWithDebInfo"  # names in a crash's C++ stack
  step "python package" "$out/python.log" env "ACCUMPLAN_CMAKE_ARGS=$pyargs" JOBS="$jobs" \
    "$python" -m pip install --no-build-isolation --no-index --no-deps --upgrade --target "$pydir" .
  # A static libstdc++ inside a module must stay private (python/CMakeLists.txt): its std::locale
  # symbols exported from _core made the first H200 runs crash. 0 is right.
  for so in "$pydir"/accumplan/_*.so; do
    [ -e "$so" ] && echo "# $(basename "$so"): $(nm -D --defined-only "$so" 2>/dev/null | grep -c St6locale) std::locale symbols exported" >>"$steps"
  done
  py_plan=("$python" tests/bench/python_device_check.py --device "$([ "$mode" = gpu ] && echo cuda || echo cpu)"
           --out-json "$out/python-plan.json")
  step "python plan ($([ "$mode" = gpu ] && echo cuda || echo cpu))" "$out/python.log" env "PYTHONPATH=$pydir" \
    "${py_plan[@]}" || { [ $? -eq 139 ] && native_stack "$pydir" "${py_plan[@]}"; }
  # Activation checkpointing's trade where it shows: every set the planner considers for
  # a decoder and an MLP stack, measured against the prediction and accumplan.plan's choice
  # (tests/bench/checkpoint_bench.py; CHECKPOINT.md). About a minute on the GPU; the rehearsal runs
  # its tiny model for seconds.
  if [ "$mode" = gpu ]; then ck_args=(--device cuda --models decoder,mlp); else ck_args=(--models tiny --target 16); fi
  step "checkpoint bench" "$out/checkpoint.log" env "PYTHONPATH=$pydir" timeout -s INT -k 15 150 \
    "$python" tests/bench/checkpoint_bench.py "${ck_args[@]}" --out "$out"
  # The optimizer state sharded over 2 gloo ranks on the one device (ZeRO-1 with torch's
  # ZeroRedundancyOptimizer; tests/bench/sharding_bench.py, SHARDING.md): every rank's steady peak
  # against its prediction, the true gain of sharding, the updates against one process's. About
  # two minutes on the GPU (a guess: it has not run there); the rehearsal's tiny tower, seconds.
  if [ "$mode" = gpu ]; then sh_args=(--device cuda --worlds 2); else sh_args=(--worlds 2 --width 64 --budget 1MiB --per-rank 128); fi
  step "sharding bench" "$out/sharding.log" env "PYTHONPATH=$pydir" timeout -s INT -k 15 180 \
    "$python" tests/bench/sharding_bench.py "${sh_args[@]}" --out-dir "$out"
fi

bench_seconds="${BENCH_SECONDS:-}"
if [ "$mode" = gpu ] && [ -z "$bench_seconds" ]; then
  # No row starts after 8 minutes from the script's start (ROWS_UNTIL_S: less, for a lease with
  # less left); `timeout` stops the benchmark a minute after that (SIGINT, then SIGKILL), so the
  # 10-minute command always ends with steps.log.
  left=$((${ROWS_UNTIL_S:-480} - ($(date +%s) - t_start)))
  bench_seconds=$((left > 90 ? left : 90))
fi
[ -n "$bench_seconds" ] && bench_args+=(--time-limit "$bench_seconds")
step "benchmark" "$out/bench.log" timeout -s INT -k 15 "$(( ${bench_seconds:-300} + 60 ))" \
  "$python" tests/bench/gpu_bench.py --accumplan "$build/accumplan" \
  --scratch "$build/bench-scratch" --out-json "$out/results-gpu.json" --out-md "$out/RESULTS-gpu.md" \
  "${bench_args[@]}"

# The run's probe sequences added to the set the planner's tests replay (tests/bench/gpu_probes.py):
# copy the returned gpu-probes.json to tests/bench/ and commit it with RESULTS-gpu.md.
probes_args=()
[ "$mode" = rehearse ] && probes_args=(--rehearsal-ok)
step "probe sequences" "$out/bench.log" "$python" tests/bench/gpu_probes.py "$out/results-gpu.json" \
  --into "$out/gpu-probes.json" "${probes_args[@]}"

expected=(RESULTS-gpu.md results-gpu.json bench.log gpu-probes.json)
[ "$bench_only" -eq 1 ] || expected+=(build.log test.log python.log python-plan.json CHECKPOINT.md checkpoint.json
                                      SHARDING.md sharding.json)
for f in "${expected[@]}"; do
  [ -s "$out/$f" ] || { echo "FAILED output $f missing or empty" | tee -a "$steps" >&2; failed=1; }
done
echo "# $(( $(date +%s) - t_start )) s in all; $([ "$failed" -eq 0 ] && echo 'every step passed' || echo 'some steps FAILED')" \
  | tee -a "$steps" >&2
exit "$failed"
