#!/usr/bin/env bash
# scripts/test.sh — the README's test command: installs dependencies, builds, runs every test.
# Also builds and tests the planner-only configuration (no LibTorch) in build-planner-only/, so
# the promise that the planner needs nothing but nlohmann/json stays checked, and runs the Python
# package's tests (python/accumplan, tests/python) with Debian's python3-torch, against the
# accumplan just built.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh python-test
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "${JOBS:-2}"

planner_dir="${PLANNER_BUILD_DIR:-build-planner-only}"
if [ ! -f "$planner_dir/CMakeCache.txt" ]; then
  cmake -S . -B "$planner_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DACCUMPLAN_WITH_TORCH=OFF \
    -DACCUMPLAN_WITH_CUPTI=OFF >/dev/null
fi
cmake --build "$planner_dir" -j "${JOBS:-2}"
ctest --test-dir "$planner_dir" --output-on-failure -j "${JOBS:-2}"

# Python: Debian's interpreter (/usr/bin/python3 has python3-torch; a pyenv python3 on PATH may not).
python="${PYTHON:-/usr/bin/python3}"
ACCUMPLAN_BIN="$PWD/${BUILD_DIR:-build}/accumplan" OMP_NUM_THREADS=1 \
  "$python" -m unittest discover -s tests/python -t tests/python
