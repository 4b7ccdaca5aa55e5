#!/usr/bin/env bash
# scripts/test.sh — the README's test command: installs dependencies, builds, runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "${JOBS:-2}"
