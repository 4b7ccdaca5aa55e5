#!/usr/bin/env bash
# scripts/demo.sh — the README's main command: installs dependencies, builds, then measures,
# plans and confirms a built-in example model on the CPU device under a 256 MiB budget. The plan
# JSON goes to stdout, the summary and progress to stderr. Extra arguments go to accumplan
# (e.g. --target-batch 1024, --out plan.json).
set -euo pipefail
cd "$(dirname "$0")/.."
# Builds only the accumplan executable: the test suite is what scripts/test.sh builds.
BUILD_TARGET=accumplan bash scripts/build.sh >&2
args=(--model builtin:convnet --target-batch 256 --device cpu --memory-budget 256MiB --optimizer adam --threads 2)
echo "+ accumplan ${args[*]} $*" >&2
exec "${BUILD_DIR:-build}/accumplan" "${args[@]}" "$@"
