"""How quickly an idle ftd reacts, measured with ftd-fake-worker as the worker (it trains nothing, so
only the daemon's own machinery is timed):

  submit -> RUNNING recorded   from the client's SubmitJob call to the timestamp of the job's RUNNING
                               state event (the daemon's clock; millisecond resolution)
  submit -> worker running     from the SubmitJob call to the worker process's first instruction
                               (it prints its clock): the daemon's part, then exec and the dynamic
                               loading of the worker binary
  exec -> worker running       that last part alone: the benchmark starting the same binary itself
  step report -> watcher       from the worker writing a step report to a WatchJob client receiving
                               the event (the report goes through the daemon's event log)
  retry after its backoff      from a retried job's not_before time to its next RUNNING event (the
                               worker exits without a result, which is retried)

and what an idle daemon costs while 20 clients watch a running job that reports nothing: its CPU
time and its threads' wake-ups (voluntary context switches) per second.

Jobs run one at a time, each after the previous ended, so the daemon is idle when each is
submitted. Prints p50/p90/p99/max per measure (target: p99 under 10 ms for the last two) and writes
daemon_latency.json. --ftd runs another ftd binary (e.g. an older build) against the same worker.

  python3 bench/daemon_latency.py --build build [--ftd PATH] [--fake-worker PATH] [--jobs 200] [--steps 300]
                                  [--interval-ms 10]
"""
import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
from ftdapi import JobService, enum, msg, spec  # noqa: E402

TINY = {"model": {"preset": "tiny"}, "batch_size": 4, "seq_len": 32, "device": "cpu", "steps": 1}
RUNNING = enum("JobState", "RUNNING")
QUEUED = enum("JobState", "QUEUED")
WATCHERS = 20


def cpu_and_switches(pid):
    """The process's CPU seconds and its threads' voluntary context switches so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    switches = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches"):  # each a wake-up from a wait
                    switches += int(line.split()[1])
        except FileNotFoundError:
            pass
    return cpu, switches


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    ap.add_argument("--fake-worker", help="ftd-fake-worker (default: BUILD/server/ftd-fake-worker)")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--interval-ms", type=int, default=10)
    args = ap.parse_args()
    build = Path(args.build).resolve()
    ftd = Path(args.ftd or build / "server" / "ftd").resolve()
    fake = Path(args.fake_worker or build / "server" / "ftd-fake-worker").resolve()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="ftd-latency-"))
    data = tmp / "data"
    scripts = {"stream": {"steps": args.steps, "step_interval_ms": args.interval_ms, "result": "SUCCEEDED"},
               "flaky": {"exit": 1}, "hold": {"wait_for_stop": True}, "*": {"result": "SUCCEEDED"}}
    addr = f"unix:{tmp / 'ftd.sock'}"  # ftd's unix socket: the benchmark's user is an admin there
    log = open(tmp / "ftd.log", "wb")
    proc = subprocess.Popen([str(ftd), "--listen", "", "--socket", str(tmp / "ftd.sock"), "--metrics-listen", "",
                             "--data-dir", str(data), "--gpus", "0",
                             "--worker", str(fake), "--backoff-s", "0.02"], stdout=log, stderr=log,
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

        exec_only = []
        for _ in range(args.jobs):
            t0 = time.time_ns()
            p = subprocess.run([str(fake)], capture_output=True, text=True)  # prints its clock, then its usage
            exec_only.append(int(re.search(r"started unix_us=(\d+)", p.stdout).group(1)) / 1e3 - t0 / 1e6)

        received = {}
        job = svc.SubmitJob(msg("SubmitJobRequest")(spec=spec(TINY), name="stream"), timeout=10).job.id
        watch(svc, job, lambda e, t: received.setdefault(e.step.step, t) if e.WhichOneof("event") == "step" else None)
        sent = {int(s): int(t) for s, t in
                re.findall(r"fake-worker: step (\d+) sent unix_us=(\d+)", (data / "jobs" / job / "worker.log").read_text())}
        step_delay = [received[s] / 1e6 - sent[s] / 1e3 for s in sent if s in received]
        if len(step_delay) != args.steps:
            raise RuntimeError(f"{len(step_delay)} of {args.steps} step reports reached the watcher")

        retry_delay = []
        for i in range(max(1, args.jobs // 4)):
            states = []
            job = svc.SubmitJob(msg("SubmitJobRequest")(spec=spec(TINY), name="flaky", max_attempts=5), timeout=10).job.id
            watch(svc, job, lambda e, _: states.append((e.unix_ms, e.state)) if e.WhichOneof("event") == "state" else None)
            not_before = None
            for ms, st in states:
                if st.state == QUEUED and st.not_before_unix_ms > 0:
                    not_before = st.not_before_unix_ms
                elif st.state == RUNNING and not_before is not None:
                    retry_delay.append(ms - not_before)
                    not_before = None

        job = svc.SubmitJob(msg("SubmitJobRequest")(spec=spec(TINY), name="hold"), timeout=10).job.id
        watchers = [threading.Thread(target=watch, args=(svc, job, lambda e, t: None)) for _ in range(WATCHERS)]
        for w in watchers:
            w.start()
        time.sleep(2)  # every watcher connected and waiting
        c0, s0, t0 = *cpu_and_switches(proc.pid), time.time()
        time.sleep(10)
        c1, s1, t1 = *cpu_and_switches(proc.pid), time.time()
        idle = {"cpu_ms_per_s": (c1 - c0) * 1000 / (t1 - t0), "switches_per_s": (s1 - s0) / (t1 - t0)}
        svc.CancelJob(msg("CancelJobRequest")(id=job), timeout=10)
        for w in watchers:
            w.join(timeout=60)
    finally:
        channel.close()
        proc.terminate()
        proc.wait(timeout=60)
        log.close()

    rows = [summary("submit -> RUNNING recorded", recorded), summary("submit -> worker running", spawned),
            summary("exec -> worker running", exec_only), summary("step report -> watcher", step_delay),
            summary("retry after its backoff", retry_delay)]
    (out / "daemon_latency.json").write_text(json.dumps({"ftd": str(ftd), "rows": rows, "idle": idle}, indent=1))
    print(f"\nftd: {ftd} ({args.jobs} jobs, {args.steps} step reports every {args.interval_ms} ms; idle daemon)")
    print("| measure | n | p50 ms | p90 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['measure']} | {r['n']} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} | {r['p99_ms']:.2f} | "
              f"{r['max_ms']:.2f} |")
    print(f"\nidle, {WATCHERS} watchers on a silent running job: {idle['cpu_ms_per_s']:.1f} ms CPU/s, "
          f"{idle['switches_per_s']:.0f} wake-ups/s")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
