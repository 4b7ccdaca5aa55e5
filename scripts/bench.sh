#!/usr/bin/env bash
# scripts/bench.sh — the benchmark in one command: installs what it needs (Debian's PyTorch and
# torchvision for exporting the models), exports the real models, builds the harness, runs it,
# and writes tests/bench/results.json and tests/bench/RESULTS.md. About 20-30 minutes on 2 cores.
# Extra arguments go to the harness (e.g. --models resnet18,vgg11 or --quick).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh python-torch
bash scripts/build.sh >&2
/usr/bin/python3 examples/export_models.py
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
"${BUILD_DIR:-build}/tests/accumplan_bench" --manifest examples/models/manifest.json \
  --out tests/bench/results.json "$@"
/usr/bin/python3 tests/bench/render_results.py tests/bench/results.json tests/bench/RESULTS.md
echo "wrote tests/bench/results.json and tests/bench/RESULTS.md" >&2
