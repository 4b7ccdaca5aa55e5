#!/usr/bin/env bash
# scripts/demo.sh — the README's main command: installs dependencies, builds, and plans for a
# built-in example. Extra arguments are passed to accumplan.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh >&2
bin="${BUILD_DIR:-build}/accumplan"
echo "+ accumplan plan --profile examples/profiles/builtin-convnet-cpu.profile.json --target-batch 256 --memory-budget 256MiB" >&2
exec "$bin" plan --profile examples/profiles/builtin-convnet-cpu.profile.json --target-batch 256 \
  --memory-budget 256MiB "$@"
