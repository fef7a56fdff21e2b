#!/usr/bin/env bash
# Runs every test: sets the machine up (scripts/setup.sh, idempotent), builds, then ctest.
# Tests labelled `gpu` run only where a CUDA device is visible; elsewhere they are skipped, and
# this script says so.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh"
build=${FTD_BUILD_DIR:-$root/build}
cd "$build"
if "$root/.venv/bin/python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  ctest --output-on-failure -j2
else
  n=$(ctest -N -L gpu | sed -n 's/^Total Tests: //p')
  echo "GPU tests skipped: no CUDA device visible (${n:-0} tests labelled gpu; scripts/gpu.sh runs them on a GPU machine)"
  ctest --output-on-failure -j2 -LE gpu
fi
