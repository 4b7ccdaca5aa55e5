#!/usr/bin/env bash
# scripts/install-deps.sh — installs what accumplan builds and tests with, from Debian's packages.
# PyTorch itself comes from PyPI (scripts/torch-env.sh), into a venv made with Debian's python3-venv.
#
# Idempotent: packages already installed are not touched, and apt is not run at all when nothing
# is missing. Needs root (or sudo) only when something must be installed.
set -euo pipefail

packages=(cmake ninja-build g++ ccache pkg-config
          libgloo-dev nlohmann-json3-dev libcli11-dev catch2 python3-venv
          libxml2-dev)  # libxml2: the report tests parse the HTML/SVG with a real XML parser
# libgloo-dev: c10d's Gloo headers include gloo's, which PyTorch's wheels do not ship.
# Extra groups, asked for by the scripts that need them.
for extra in "$@"; do
  case "$extra" in
    # The Python package, installed with pip into a venv and tested (scripts/test.sh): its
    # compiled core needs pybind11 and Python's headers.
    python-test) packages+=(python3-dev pybind11-dev) ;;
    sanitize) packages+=(clang libclang-rt-14-dev) ;;  # ASan/UBSan build and libFuzzer (scripts/test.sh)
    *) echo "install-deps: unknown extra '$extra'" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then sudo="sudo"; else
    echo "install-deps: missing ${missing[*]}; run as root to install them" >&2; exit 2
  fi
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
