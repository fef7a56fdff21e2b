"""How quickly an idle ftd reacts, measured with ftd-fake-worker as the worker (it trains nothing, so
only the daemon's own machinery is timed):

  submit -> RUNNING recorded   from the client's SubmitJob call to the timestamp of the job's RUNNING
                               state event (the daemon's clock; millisecond resolution)
  submit -> worker running     from the SubmitJob call to the worker process's first instruction
                               (it prints its clock; includes exec and loading the worker binary)
  step report -> watcher       from the worker writing a step report to a WatchJob client receiving
                               the event (the report goes through the daemon's event log)

Jobs run one at a time, each after the previous ended, so the daemon is idle when each is
submitted. Prints p50/p90/p99/max per measure (target: p99 under 10 ms for the last two) and writes
daemon_latency.json. --ftd runs another ftd binary (e.g. an older build) against the same worker.

  python3 bench/daemon_latency.py --build build [--ftd PATH] [--jobs 200] [--steps 300] [--interval-ms 10]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
from ftdapi import JobService, enum, msg, spec  # noqa: E402
from ftdbench import free_port  # noqa: E402

TINY = {"model": {"preset": "tiny"}, "batch_size": 4, "seq_len": 32, "device": "cpu", "steps": 1}
RUNNING = enum("JobState", "RUNNING")


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * len(xs)) - 1))]


def summary(name, xs):
    return {"measure": name, "n": len(xs), "p50_ms": statistics.median(xs), "p90_ms": pct(xs, 90),
            "p99_ms": pct(xs, 99), "max_ms": max(xs)}


def watch(svc, job_id, on_event):
    """Streams the job's events until its result; on_event(event, receive time in ns)."""
    for e in svc.WatchJob(msg("WatchJobRequest")(id=job_id), timeout=120):
        on_event(e, time.time_ns())
        if e.WhichOneof("event") == "result":
            return


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--ftd", help="the ftd binary (default: BUILD/server/ftd)")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--interval-ms", type=int, default=10)
    args = ap.parse_args()
    build = Path(args.build).resolve()
    ftd = Path(args.ftd or build / "server" / "ftd").resolve()
    fake = build / "server" / "ftd-fake-worker"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="ftd-latency-"))
    data = tmp / "data"
    scripts = {"stream": {"steps": args.steps, "step_interval_ms": args.interval_ms, "result": "SUCCEEDED"},
               "*": {"result": "SUCCEEDED"}}
    addr = f"127.0.0.1:{free_port()}"
    log = open(tmp / "ftd.log", "wb")
    proc = subprocess.Popen([str(ftd), "--listen", addr, "--metrics-listen", "", "--data-dir", str(data), "--gpus", "0",
                             "--worker", str(fake)], stdout=log, stderr=log,
                            env=dict(os.environ, FTD_FAKE_WORKER_SCRIPT=json.dumps(scripts)))
    channel = grpc.insecure_channel(addr)
    svc = JobService(channel)
    try:
        deadline = time.time() + 30
        while True:
            try:
                svc.ListJobs(msg("ListJobsRequest")(), timeout=1)
                break
            except grpc.RpcError:
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"ftd did not start: {(tmp / 'ftd.log').read_text()[-2000:]}")
                time.sleep(0.05)

        recorded, spawned = [], []
        for i in range(args.jobs):
            running_ms = []
            t0 = time.time_ns()
            job = svc.SubmitJob(msg("SubmitJobRequest")(spec=spec(TINY), name=f"spawn-{i}"), timeout=10).job.id
            watch(svc, job, lambda e, _: running_ms.append(e.unix_ms)
                  if e.WhichOneof("event") == "state" and e.state.state == RUNNING else None)
            started = re.search(r"fake-worker: started unix_us=(\d+)", (data / "jobs" / job / "worker.log").read_text())
            recorded.append(running_ms[0] - t0 / 1e6)
            spawned.append(int(started.group(1)) / 1e3 - t0 / 1e6)

        received = {}
        job = svc.SubmitJob(msg("SubmitJobRequest")(spec=spec(TINY), name="stream"), timeout=10).job.id
        watch(svc, job, lambda e, t: received.setdefault(e.step.step, t) if e.WhichOneof("event") == "step" else None)
        sent = {int(s): int(t) for s, t in
                re.findall(r"fake-worker: step (\d+) sent unix_us=(\d+)", (data / "jobs" / job / "worker.log").read_text())}
        step_delay = [received[s] / 1e6 - sent[s] / 1e3 for s in sent if s in received]
        if len(step_delay) != args.steps:
            raise RuntimeError(f"{len(step_delay)} of {args.steps} step reports reached the watcher")
    finally:
        channel.close()
        proc.terminate()
        proc.wait(timeout=60)
        log.close()

    rows = [summary("submit -> RUNNING recorded", recorded), summary("submit -> worker running", spawned),
            summary("step report -> watcher", step_delay)]
    (out / "daemon_latency.json").write_text(json.dumps({"ftd": str(ftd), "rows": rows}, indent=1))
    print(f"\nftd: {ftd} ({args.jobs} jobs, {args.steps} step reports every {args.interval_ms} ms; idle daemon)")
    print("| measure | n | p50 ms | p90 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['measure']} | {r['n']} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} | {r['p99_ms']:.2f} | "
              f"{r['max_ms']:.2f} |")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
