#!/usr/bin/env bash
# scripts/bench.sh — the benchmark in one command: installs what it needs (PyTorch and
# torchvision for exporting the models: scripts/torch-env.sh), exports the real models, builds the harness, runs it,
# and writes tests/bench/results.json and tests/bench/RESULTS.md. 21-27 minutes on 2 cores: the
# harness took 1228 s and 1508 s in two runs on this kind of machine, plus the build of the harness
# on a cold checkout (27 min 17 s in all for the second, from a fresh clone).
# Extra arguments go to the harness (e.g. --models resnet18,vgg11 or --quick).
set -euo pipefail
cd "$(dirname "$0")/.."
# Only the harness and what it links: a cold build of everything would add the test suite's
# compile time to the half hour this run is allowed.
BUILD_TARGET=accumplan_bench bash scripts/build.sh >&2
build_dir="${BUILD_DIR:-build}"
. scripts/torch-env.sh
python="$(torch_env_python)"
"$python" examples/export_models.py
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
"$build_dir/tests/accumplan_bench" --manifest examples/models/manifest.json \
  --out tests/bench/results.json "$@"
"$python" tests/bench/render_results.py tests/bench/results.json tests/bench/RESULTS.md
echo "wrote tests/bench/results.json and tests/bench/RESULTS.md" >&2
