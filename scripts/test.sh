#!/usr/bin/env bash
# scripts/test.sh — the README's test command: installs dependencies, builds, runs every test.
# Also builds and tests the planner-only configuration (no LibTorch) in build-planner-only/, so
# the promise that the planner needs nothing but nlohmann/json stays checked.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "${JOBS:-2}"

planner_dir="${PLANNER_BUILD_DIR:-build-planner-only}"
if [ ! -f "$planner_dir/CMakeCache.txt" ]; then
  cmake -S . -B "$planner_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DACCUMPLAN_WITH_TORCH=OFF \
    -DACCUMPLAN_WITH_CUPTI=OFF >/dev/null
fi
cmake --build "$planner_dir" -j "${JOBS:-2}"
ctest --test-dir "$planner_dir" --output-on-failure -j "${JOBS:-2}"
