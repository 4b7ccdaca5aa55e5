#!/usr/bin/env bash
# scripts/build.sh — configures and builds accumplan into build/ (Release, Ninja, ccache) against
# PyTorch 2.x from PyPI (scripts/torch-env.sh: its LibTorch, with CUDA, CUPTI and NCCL compiled in).
# Re-running only rebuilds what changed; a build/ configured against another LibTorch is
# configured again. BUILD_DIR overrides the folder; BUILD_TARGET builds one target only
# (scripts/demo.sh: BUILD_TARGET=accumplan, not the test suite). Arguments: install-deps extras.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh "$@"
# shellcheck source=scripts/torch-env.sh
. scripts/torch-env.sh
python="$(torch_env_python)"
build_dir="${BUILD_DIR:-build}"
torch_dir="$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')/Torch"
if ! grep -qxF "Torch_DIR:PATH=$torch_dir" "$build_dir/CMakeCache.txt" 2>/dev/null; then
  rm -f "$build_dir/CMakeCache.txt"
  torch_configure "$python" "$build_dir"
fi
# 2 jobs: a LibTorch translation unit takes about 1 GiB of memory and the CI machine has 2 cores.
cmake --build "$build_dir" -j "${JOBS:-2}" ${BUILD_TARGET:+--target "$BUILD_TARGET"}
