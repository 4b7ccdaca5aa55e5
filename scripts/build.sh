#!/usr/bin/env bash
# scripts/build.sh — configures and builds accumplan into build/ (Release, Ninja, ccache).
# Re-running only rebuilds what changed. BUILD_DIR overrides the folder; BUILD_TARGET builds one
# target only (scripts/demo.sh: BUILD_TARGET=accumplan, not the test suite).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh "$@"
build_dir="${BUILD_DIR:-build}"
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
# 2 jobs: a LibTorch translation unit takes about 1 GiB of memory and the CI machine has 2 cores.
cmake --build "$build_dir" -j "${JOBS:-2}" ${BUILD_TARGET:+--target "$BUILD_TARGET"}
