#!/usr/bin/env bash
# The main job on its embedded default: sets the machine up (scripts/setup.sh, idempotent), builds,
# starts the ftd daemon (unless one already answers on $FTD_ADDR), submits the embedded default job
# with ftctl and watches it live. On a CPU: the tiny LLaMA on the embedded arithmetic dataset (under
# a minute); with a GPU: the LLaMA-3.1-8B shape (random init, bf16) at 4 x 2048 tokens.
# Extra arguments go to `ftctl submit`, e.g. scripts/run.sh --set steps=50.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh" >&2
bin=${FTD_BUILD_DIR:-$root/build}
export FTD_ADDR=${FTD_ADDR:-127.0.0.1:7070}
ftctl="$bin/client/ftctl"
if ! "$ftctl" list --timeout 1 >/dev/null 2>&1; then
  mkdir -p "$root/runs"
  "$bin/server/ftd" --listen "$FTD_ADDR" --metrics-listen "${FTD_METRICS_ADDR:-127.0.0.1:7071}" \
    --data-dir "${FTD_DATA_DIR:-$root/runs/ftd-data}" >>"$root/runs/ftd.log" 2>&1 &
  daemon=$!
  trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null || true' EXIT
  for _ in $(seq 100); do "$ftctl" list --timeout 1 >/dev/null 2>&1 && break; sleep 0.1; done
  echo "ftd started (log: runs/ftd.log, metrics: http://${FTD_METRICS_ADDR:-127.0.0.1:7071}/metrics)" >&2
fi
spec=$(mktemp --suffix=.json)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  "$bin/worker/ftd-worker" default-spec --gpu >"$spec"
else
  "$bin/worker/ftd-worker" default-spec >"$spec"
fi
id=$("$ftctl" submit "$spec" --name default-job "$@")
echo "submitted $id; watching (Ctrl-C stops watching, not the job)" >&2
"$ftctl" watch "$id"
