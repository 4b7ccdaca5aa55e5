#!/usr/bin/env bash
# scripts/torch-env.sh — the one recipe for building accumplan against PyTorch 2.x, sourced by
# scripts/build.sh (CI, the demo) and scripts/gpu-check.sh (the GPU machine and its rehearsal).
#
# What it is: four functions.
#   torch_env_python         makes (once) and names the Python environment that holds the pinned
#                            PyTorch from PyPI (scripts/torch-pins.txt), with its own LibTorch and
#                            CUDA libraries. It lives outside the clone, in
#                            ${ACCUMPLAN_TORCH_ENV_ROOT:-~/.cache/accumplan}/torch-env-<hash of torch's
#                            pins and the interpreter>, so a fresh clone on a machine that has it
#                            installs nothing; a changed torch pin makes a new one, another changed
#                            pin is installed into it.
#   torch_cmake_args PY      the CMake arguments that find PY's torch and the CUDA toolkit, one a
#                            line (scripts/test.sh's consumer of the installed package uses them).
#   torch_configure PY DIR [ARGS...]
#                            configures DIR against the LibTorch of the interpreter PY, with CUDA,
#                            CUPTI and NCCL required (the pip LibTorch is a CUDA build; nothing here
#                            runs on a GPU, but everything compiles and links).
#   torch_overlay_venv PY DIR
#                            makes DIR a venv that sees PY's packages, for the accumplan package.
# What it is not: an installer of Debian's packages (scripts/install-deps.sh) or of the accumplan
# package itself (scripts/test.sh installs that into build/venv, over this environment).
#
# Run directly, it prints the environment's interpreter: "$(bash scripts/torch-env.sh)" -c 'import torch'.

accumplan_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# The interpreter the environment is made from: Debian's, which has venv and the headers the
# compiled core needs (python3-venv, python3-dev: scripts/install-deps.sh python-test).
torch_env_python() {
  local base="${ACCUMPLAN_BASE_PYTHON:-/usr/bin/python3}" pins="$accumplan_root/scripts/torch-pins.txt" key env
  # Named by torch's own pins and the interpreter only: the C++ build compiles against the folder's
  # path, so a new tool pinned beside torch is installed into the same environment, not a new one.
  key=$({ grep -E '^(torch|torchvision)==' "$pins"; "$base" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-12)
  env="${ACCUMPLAN_TORCH_ENV_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/accumplan}/torch-env-$key"
  # A complete environment has its stamp, a copy of the pins it holds, written last; a folder
  # without one is a half-made environment (an interrupted install) and is made again, one whose
  # stamp differs gets the pins installed again. flock: two builds at once make it once.
  mkdir -p "$(dirname "$env")"
  (
    flock 9
    if [ ! -f "$env/.complete" ]; then
      echo "torch-env: installing $(grep -v '^#' "$pins" | tr '\n' ' ')into $env (about 2.6 GB from PyPI, once per machine)" >&2
      rm -rf "$env"
      "$base" -m venv "$env" >&2
    elif cmp -s "$pins" "$env/.complete"; then
      exit 0
    else
      echo "torch-env: the pins changed; installing them into $env" >&2
    fi
    "$env/bin/python" -m pip install --quiet --disable-pip-version-check -r "$pins" >&2
    cp "$pins" "$env/.complete"
  ) 9>"$env.lock" || { echo "torch-env: could not make $env (see above)" >&2; return 1; }
  echo "$env/bin/python"
}

# The CMake arguments that find a Python's torch, one a line: its CMake package, and the torch
# folder itself (TorchConfig's find_library calls then find its lib/ before any LibTorch in the
# system's folders), after ACCUMPLAN_EXTRA_PREFIX if set; and the CUDA toolkit, which PyTorch's own
# CMake package looks for (find_package(CUDAToolkit), nvcc's version must match the toolkit's), so
# it is named three ways; TORCH_CUDA_ARCH_LIST skips its search for a GPU (9.0: H100/H200).
torch_cmake_args() {
  local py="$1" prefix nvcc
  prefix="$("$py" -c 'import os, torch.utils; print(torch.utils.cmake_prefix_path + ";" + os.path.dirname(torch.__file__))')" || return 1
  nvcc="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
  printf '%s\n' "-DCMAKE_PREFIX_PATH=${ACCUMPLAN_EXTRA_PREFIX:+$ACCUMPLAN_EXTRA_PREFIX;}$prefix" \
    "-DCUDAToolkit_ROOT=${CUDA_HOME:-$(dirname "$(dirname "$nvcc")")}" "-DCMAKE_CUDA_COMPILER=$nvcc" -DTORCH_CUDA_ARCH_LIST=9.0
}

# Configures accumplan in DIR against PY's torch, with CUDA, CUPTI and NCCL required.
torch_configure() {
  local py="$1" dir="$2" args
  shift 2
  args="$(torch_cmake_args "$py")" || return 1
  mapfile -t args <<<"$args"
  cmake -S "$accumplan_root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${args[@]}" \
    -DACCUMPLAN_WITH_TORCH=ON -DACCUMPLAN_WITH_CUDA=ON -DACCUMPLAN_WITH_CUPTI=ON "$@"
}

# A venv of the clone's own (build/venv) over the environment: a .pth file in its site-packages
# names the environment's, so torch, pip and setuptools come from there while what pip installs
# (accumplan) lands in the clone's venv and never in the shared environment. Made again when it
# is not over PY (a venv of an earlier layout, or over another environment).
torch_overlay_venv() {
  local py="$1" dir="$2" env_site site
  env_site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || return 1
  if ! grep -qxF "$env_site" "$dir"/lib/python3*/site-packages/accumplan-torch-env.pth 2>/dev/null; then
    rm -rf "$dir"
    "${ACCUMPLAN_BASE_PYTHON:-/usr/bin/python3}" -m venv --without-pip "$dir" || return 1
    site="$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || return 1
    echo "$env_site" >"$site/accumplan-torch-env.pth"
  fi
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  torch_env_python
fi
