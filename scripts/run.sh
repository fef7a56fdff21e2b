#!/usr/bin/env bash
# The main job on its embedded default: sets the machine up (scripts/setup.sh, idempotent), builds,
# starts the ftd daemon unless one already answers on $FTD_ADDR, submits the embedded default job
# with ftctl and watches it live. On a CPU: the tiny LLaMA on the embedded arithmetic dataset (under
# a minute); with a GPU: the LLaMA-3.1-8B shape (random init, bf16) at 4 x 2048 tokens.
# ftd stays up afterwards (in a session of its own, so Ctrl-C here does not reach it) for the
# README's next commands; the script says where it is and how to stop it. Extra arguments go to
# `ftctl submit`, e.g. scripts/run.sh --set steps=50.
#   scripts/run.sh --daemon-only   starts the same ftd (same socket, same data directory, so the same
#                                  jobs) unless it runs, and submits nothing: the way back after
#                                  stopping it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
daemon_only=0
if [[ ${1-} == --daemon-only ]]; then
  daemon_only=1
  shift
  if (($#)); then echo "run.sh: --daemon-only takes no other arguments (got: $*)" >&2; exit 64; fi
fi
bash "$root/scripts/setup.sh" >&2
bin=${FTD_BUILD_DIR:-$root/build}
runs="$root/runs"
data_dir=${FTD_DATA_DIR:-$runs/ftd-data}
# Clients reach ftd on its unix socket, where ftd knows them by their uid (docs/security.md); its
# TCP port (FTD_LISTEN) takes tokens.
export FTD_ADDR=${FTD_ADDR:-unix:$runs/ftd.sock}
if [[ $FTD_ADDR == unix:* ]]; then
  listen=(--socket "${FTD_ADDR#unix:}" --listen "${FTD_LISTEN:-127.0.0.1:7070}")
else
  listen=(--listen "$FTD_ADDR")
fi
ftctl="$bin/client/ftctl"
pid_file="$runs/ftd.pid"   # ftd writes it once it serves and removes it when it stops
if "$ftctl" list --timeout 1 >/dev/null 2>&1; then
  echo "using the ftd already answering on $FTD_ADDR" >&2
else
  mkdir -p "$runs"
  rm -f "$pid_file"   # left by an ftd that was killed (SIGKILL): its pid may be another process's now
  log="$runs/ftd.log"
  touch "$log"
  start=$(stat -c %s "$log")
  setsid "$bin/server/ftd" "${listen[@]}" --metrics-listen "${FTD_METRICS_ADDR:-127.0.0.1:7071}" \
    --data-dir "$data_dir" --pid-file "$pid_file" </dev/null >>"$log" 2>&1 &
  daemon=$!
  ready=0
  for _ in $(seq 200); do
    if ! kill -0 "$daemon" 2>/dev/null; then break; fi   # it exited: its reason is in the log
    if [ -s "$pid_file" ] && "$ftctl" list --timeout 1 >/dev/null 2>&1; then ready=1; break; fi
    sleep 0.1
  done
  if [ "$ready" != 1 ]; then
    kill "$daemon" 2>/dev/null || true
    echo "ftd did not start on $FTD_ADDR; from runs/ftd.log:" >&2
    tail -c +$((start + 1)) "$log" | grep -v '^[[:space:]]*$' | tail -5 >&2
    echo "(if another program holds the port, use another: FTD_LISTEN=127.0.0.1:7080 FTD_METRICS_ADDR=127.0.0.1:7081 $0)" >&2
    exit 1
  fi
  echo "ftd started on $FTD_ADDR (pid $daemon, log runs/ftd.log, metrics http://${FTD_METRICS_ADDR:-127.0.0.1:7071}/metrics)" >&2
fi
# Where it is and how to come back to it, from this shell or another.
if [ "$FTD_ADDR" = "unix:$runs/ftd.sock" ]; then
  reach="ftd: socket $runs/ftd.sock, data in $data_dir; ftctl finds it when run in $root or below (elsewhere: export FTD_ADDR=$FTD_ADDR)"
else
  reach="ftd: $FTD_ADDR (for ftctl: export FTD_ADDR=$FTD_ADDR)"
fi
if [ -s "$pid_file" ]; then
  reach="$reach; stop it with: kill \$(cat $pid_file); start it again (the same jobs) with: $root/scripts/run.sh --daemon-only"
fi
if [ "$daemon_only" = 1 ]; then
  echo "$reach" >&2
  exit 0
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
echo "$reach" >&2
echo "ftctl is $ftctl; put it on PATH with: cmake --install build --prefix ~/.local (or export PATH=$bin/client:\$PATH)" >&2
exit "$rc"
