#!/usr/bin/env bash
# scripts/gpu-prepare.sh — fills .gpu-deps/ (git-ignored) with what the GPU machine lacks, from
# Debian's packages on this (CPU) machine, so that scripts/gpu-check.sh can build there.
#
# What it is: a copy of the header-only dependencies accumplan builds with — nlohmann/json,
# CLI11 and Catch2 v2 (headers and CMake package files, which locate themselves relative to
# their own folder, so the copy works wherever it lands) — in an install-prefix layout:
#   .gpu-deps/include/{nlohmann,CLI,catch2}
#   .gpu-deps/share/cmake/{nlohmann_json,CLI11}   .gpu-deps/lib/cmake/Catch2 (+ its static lib)
# and .gpu-deps/MANIFEST naming the Debian package versions copied. About 4 MiB.
# What it is not: LibTorch, CUDA or Python packages — the GPU machine has its own (PyTorch 2.11
# with CUDA 13); nothing there can be fetched, and nothing here is sent but the working tree and
# the paths a call carries (carry [".gpu-deps"]).
#
# Idempotent: installs the packages if missing (scripts/install-deps.sh), then replaces the
# folder whole (built beside it and renamed, so a failed run leaves the old copy).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/install-deps.sh python-test  # pybind11-dev, for the Python package's compiled core
dest=.gpu-deps
tmp="$dest.tmp.$$"
trap 'rm -rf "$tmp"' EXIT
rm -rf "$tmp"
mkdir -p "$tmp/include" "$tmp/share/cmake" "$tmp/lib/cmake"
cp -a /usr/include/nlohmann /usr/include/CLI /usr/include/catch2 /usr/include/pybind11 "$tmp/include/"
cp -a /usr/lib/cmake/pybind11 "$tmp/lib/cmake/"
cp -a /usr/share/cmake/nlohmann_json /usr/share/cmake/CLI11 "$tmp/share/cmake/"
cp -a /usr/lib/cmake/Catch2 "$tmp/lib/cmake/"
# Catch2's package file checks that its (unused here) main library exists.
cp -a /usr/lib/libCatch2WithMain.a "$tmp/lib/"
{
  echo "# .gpu-deps: copied by scripts/gpu-prepare.sh on $(date -u +%Y-%m-%dT%H:%MZ) from Debian packages"
  dpkg-query -W -f='${Package} ${Version}\n' nlohmann-json3-dev libcli11-dev catch2 pybind11-dev
} >"$tmp/MANIFEST"
rm -rf "$dest"
mv "$tmp" "$dest"
trap - EXIT
echo "gpu-prepare: $dest holds $(du -sh "$dest" | cut -f1): $(grep -v '^#' "$dest/MANIFEST" | tr '\n' ' ')" >&2
