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

# The installed package: `cmake --install` into scratch prefixes, then the out-of-tree consumer
# (examples/consumer) configured with find_package(accumplan) against each: the LibTorch build
# (accumplan::planner and accumplan::runtime; the consumer's trainer is compiled, not run: ctest
# ran it in-tree) and the planner-only build (accumplan::planner, and pkg-config).
for dir in "${BUILD_DIR:-build}" "$planner_dir"; do
  prefix="$PWD/$dir/install-test"
  rm -rf "$prefix" "$dir/consumer"
  cmake --install "$dir" --prefix "$prefix" >/dev/null
  cmake -S examples/consumer -B "$dir/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
  cmake --build "$dir/consumer" -j "${JOBS:-2}"
  "$dir/consumer/consumer_planner" examples/profiles/builtin-convnet-cpu.profile.json >/dev/null
done
cxx_flags=$(PKG_CONFIG_PATH="$PWD/$planner_dir/install-test/lib/pkgconfig" pkg-config --cflags --libs accumplan-planner)
# shellcheck disable=SC2086
"${CXX:-c++}" -x c++ - -o "$planner_dir/consumer/pkg-config-check" $cxx_flags <<'CPP'
#include <accumplan/solver.h>
int main() { return accumplan::balanced_split(256, 5, 1).front() == 52 ? 0 : 1; }
CPP
"$planner_dir/consumer/pkg-config-check"
echo "test.sh: all tests passed (C++, planner-only, Python, installed package)"
