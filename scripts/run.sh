#!/usr/bin/env bash
# The main job on its embedded default: sets the machine up (scripts/setup.sh, idempotent), builds,
# then trains. On a CPU: the tiny LLaMA on the embedded arithmetic dataset (about a minute); with a
# GPU: the LLaMA-3.1-8B shape (random init, bf16) at 4 x 2048 tokens. Extra arguments go to
# `ftd-worker run`, e.g. scripts/run.sh --set steps=50.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh"
exec "${FTD_BUILD_DIR:-$root/build}/worker/ftd-worker" run --default --format text "$@"
