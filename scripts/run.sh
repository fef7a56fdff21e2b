#!/usr/bin/env bash
# The main job on its embedded default: sets the machine up (scripts/setup.sh, idempotent), builds,
# starts the ftd daemon unless one already answers on $FTD_ADDR, submits the embedded default job
# with ftctl and watches it live. On a CPU: the tiny LLaMA on the embedded arithmetic dataset (under
# a minute); with a GPU: the LLaMA-3.1-8B shape (random init, bf16) at 4 x 2048 tokens.
# ftd stays up afterwards (in a session of its own, so Ctrl-C here does not reach it) for the
# README's next commands; the script says how to stop it. Extra arguments go to `ftctl submit`,
# e.g. scripts/run.sh --set steps=50.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh" >&2
bin=${FTD_BUILD_DIR:-$root/build}
runs="$root/runs"
# Clients reach ftd on its unix socket, where ftd knows them by their uid (docs/security.md); its
# TCP port (FTD_LISTEN) takes tokens.
export FTD_ADDR=${FTD_ADDR:-unix:$runs/ftd.sock}
if [[ $FTD_ADDR == unix:* ]]; then
  listen=(--socket "${FTD_ADDR#unix:}" --listen "${FTD_LISTEN:-127.0.0.1:7070}")
else
  listen=(--listen "$FTD_ADDR")
fi
ftctl="$bin/client/ftctl"
stop_hint=""
if "$ftctl" list --timeout 1 >/dev/null 2>&1; then
  echo "using the ftd already answering on $FTD_ADDR" >&2
else
  mkdir -p "$runs"
  log="$runs/ftd.log"
  touch "$log"
  start=$(stat -c %s "$log")
  setsid "$bin/server/ftd" "${listen[@]}" --metrics-listen "${FTD_METRICS_ADDR:-127.0.0.1:7071}" \
    --data-dir "${FTD_DATA_DIR:-$runs/ftd-data}" </dev/null >>"$log" 2>&1 &
  daemon=$!
  ready=0
  for _ in $(seq 200); do
    if ! kill -0 "$daemon" 2>/dev/null; then break; fi   # it exited: its reason is in the log
    if "$ftctl" list --timeout 1 >/dev/null 2>&1; then ready=1; break; fi
    sleep 0.1
  done
  if [ "$ready" != 1 ]; then
    kill "$daemon" 2>/dev/null || true
    echo "ftd did not start on $FTD_ADDR; from runs/ftd.log:" >&2
    tail -c +$((start + 1)) "$log" | grep -v '^[[:space:]]*$' | tail -5 >&2
    echo "(if another program holds the port, use another: FTD_LISTEN=127.0.0.1:7080 FTD_METRICS_ADDR=127.0.0.1:7081 $0)" >&2
    exit 1
  fi
  echo "$daemon" >"$runs/ftd.pid"
  stop_hint="ftd keeps running for the next commands (pid $daemon, log runs/ftd.log, metrics http://${FTD_METRICS_ADDR:-127.0.0.1:7071}/metrics); stop it with: kill \$(cat $runs/ftd.pid); for the next commands: export FTD_ADDR=$FTD_ADDR"
  echo "ftd started on $FTD_ADDR (log: runs/ftd.log)" >&2
fi
spec=$(mktemp --suffix=.json)
trap 'rm -f "$spec"' EXIT
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  "$bin/worker/ftd-worker" default-spec --gpu >"$spec"
else
  "$bin/worker/ftd-worker" default-spec >"$spec"
fi
id=$("$ftctl" submit "$spec" --name default-job "$@")
echo "submitted $id; watching (Ctrl-C stops watching; the job and ftd go on)" >&2
# Ctrl-C reaches ftctl (it stops watching and says the job goes on) and this script, which then
# says how to go on.
trap ':' INT
rc=0
"$ftctl" watch "$id" || rc=$?
if [ "$rc" = 130 ]; then
  echo "the job goes on: ftctl watch $id to watch again, ftctl cancel $id to stop it" >&2
fi
[ -n "$stop_hint" ] && echo "$stop_hint" >&2
echo "ftctl is $ftctl; put it on PATH with: cmake --install build --prefix ~/.local (or export PATH=$bin/client:\$PATH)" >&2
exit "$rc"
