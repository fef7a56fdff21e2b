"""ListJobs latency against a real ftd holding many jobs: idle, then under load; and how long ftd takes
to restart as its queue grows. Prints markdown tables and writes list_bench.json.

  python3 bench/list_bench.py --build build --out DIR [--jobs 10000] [--queued 10000] [--owners 10]
                              [--idle-samples 200] [--watchers 50] [--clients 20] [--seconds 30]
                              [--restarts 5] [--restart-at 1000,10000]

ftd runs --paused (jobs are stored, none starts) on a fresh data directory. The store is filled with
--jobs jobs over gRPC, owners user0..user<owners-1> in turn; all but the newest --queued are then
cancelled, so the queue holds --queued jobs. Each measured call is one ListJobs of a 50-job page,
timed at the client (gRPC round trip included), for each query shape below in turn.

Load: --watchers WatchJob streams on queued jobs (each wakes whenever the daemon notifies watchers),
and --clients clients that each loop: SubmitJob, GetJob, ListJobs (a page of 50), CancelJob of the
job they submitted (the queue stays at its size). Load runs in separate processes (8 at most) so
that Python's GIL in the measuring process does not slow the measurement; the measuring process
only lists.

Restarts: while the store is filled, at each --restart-at size (jobs queued then), ftd is killed
(SIGKILL) and started again --restarts times; each start is timed from the process's start to its
"serving on" line (written once it has recovered its queue and listens), read from its log.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
from ftdapi import JobService, enum, msg, spec  # noqa: E402

from ftdbench import free_port  # noqa: E402

TINY = {"model": {"preset": "tiny"}, "batch_size": 4, "seq_len": 32, "device": "cpu", "steps": 10}
QUEUED = enum("JobState", "QUEUED")
PAGE = 50


def shapes(mid_token):
    """(label, ListJobsRequest fields) of the measured pages."""
    return [
        ("first page, oldest first", {}),
        ("first page, newest first", {"newest_first": True}),
        ("page after the middle", {"page_token": mid_token}),
        ("state=QUEUED", {"states": [QUEUED]}),
        ("owner=user3", {"owner": "user3"}),
        ("owner=user3, state=QUEUED, newest first", {"owner": "user3", "states": [QUEUED], "newest_first": True}),
    ]


def list_req(fields):
    return msg("ListJobsRequest")(page_size=PAGE, **fields)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def summary(ms):
    return {"n": len(ms), "p50_ms": pct(ms, 50), "p99_ms": pct(ms, 99), "max_ms": max(ms),
            "mean_ms": statistics.fmean(ms)}


def start_ftd(build, data, log_path, max_queued):
    # Clients on ftd's unix socket: the benchmark, as the user who started ftd, is an admin there.
    sock, metrics = Path(data) / "ftd.sock", f"127.0.0.1:{free_port()}"
    addr = f"unix:{sock}"
    log = open(log_path, "ab")
    proc = subprocess.Popen([str(Path(build) / "server" / "ftd"), "--listen", "", "--socket", str(sock),
                             "--metrics-listen", metrics,
                             "--data-dir", str(data), "--gpus", "0", "--paused", "--max-queued", str(max_queued)],
                            stdout=log, stderr=log)
    ch = grpc.insecure_channel(addr)
    try:
        grpc.channel_ready_future(ch).result(timeout=30)
    except grpc.FutureTimeoutError:
        proc.kill()
        raise RuntimeError(f"ftd did not start (log: {log_path})")
    return proc, addr, ch


def time_restarts(build, data, log_path, max_queued, proc, n):
    """Kills ftd (SIGKILL) and starts it again `n` times; returns (the last process, its address, a
    channel to it, the start times in ms: process start to its "serving on" line)."""
    times = []
    addr = ch = None
    for _ in range(n):
        proc.kill()
        proc.wait(timeout=60)
        start = Path(log_path).stat().st_size
        t0 = time.monotonic()
        proc, addr, ch = start_ftd(build, data, log_path, max_queued)
        end = time.monotonic() + 120
        while time.monotonic() < end:
            with open(log_path, "rb") as f:
                f.seek(start)
                if b"ftd: serving on " in f.read():
                    break
            time.sleep(0.001)
        else:
            raise RuntimeError(f"ftd did not say it serves after a restart (log: {log_path})")
        times.append((time.monotonic() - t0) * 1e3)
    return proc, addr, ch, times


def fill(addr, jobs, owners, threads=8, first=0):
    """Submits `jobs` jobs (numbered from `first`); returns their ids in submission order."""
    svc = JobService(grpc.insecure_channel(addr))
    spec_msg = spec(TINY)
    ids = [None] * jobs

    def one(i):
        k = first + i
        r = svc.SubmitJob(msg("SubmitJobRequest")(spec=spec_msg, owner=f"user{k % owners}", name=f"fill-{k}",
                                                  request_id=f"fill-{k}"), timeout=120)
        ids[i] = r.job.id

    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(one, range(jobs)))
    return sorted(ids)  # ids are j-NNNNNN: this is submission order


def measure(svc, fields_list, samples=None, seconds=None, max_seconds_per_shape=60):
    """Times ListJobs for each shape: `samples` calls each (idle), or round-robin for `seconds`."""
    times = {label: [] for label, _ in fields_list}
    if samples is not None:
        for label, fields in fields_list:
            req = list_req(fields)
            t_end = time.monotonic() + max_seconds_per_shape
            for _ in range(samples):
                t0 = time.perf_counter()
                svc.ListJobs(req, timeout=120)
                times[label].append((time.perf_counter() - t0) * 1e3)
                if time.monotonic() > t_end:
                    break
    else:
        t_end = time.monotonic() + seconds
        reqs = [(label, list_req(fields)) for label, fields in fields_list]
        i = 0
        while time.monotonic() < t_end:
            label, req = reqs[i % len(reqs)]
            t0 = time.perf_counter()
            svc.ListJobs(req, timeout=120)
            times[label].append((time.perf_counter() - t0) * 1e3)
            i += 1
    return times


def load_main(args):
    """A load process: watchers and clients until --seconds pass; prints its counts as JSON."""
    watch_ids = json.loads(Path(args.watch_ids).read_text())
    rng = random.Random(args.seed)
    stop = time.monotonic() + args.seconds
    counts = {"client_loops": 0, "watch_events": 0, "errors": 0}
    lock = threading.Lock()
    spec_msg = spec(TINY)

    def watcher(k):
        svc = JobService(grpc.insecure_channel(args.addr))
        job = watch_ids[(args.seed * 1000 + k) % len(watch_ids)]
        call = svc.WatchJob(msg("WatchJobRequest")(id=job), timeout=args.seconds + 30)
        threading.Timer(max(0.0, stop - time.monotonic()), call.cancel).start()
        n = 0
        try:
            for _ in call:
                n += 1
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                with lock:
                    counts["errors"] += 1
        with lock:
            counts["watch_events"] += n

    def client(k):
        svc = JobService(grpc.insecure_channel(args.addr))
        r = random.Random(rng.random())
        label_fields = shapes("")[:2] + shapes("")[3:]
        while time.monotonic() < stop:
            try:
                job = svc.SubmitJob(msg("SubmitJobRequest")(spec=spec_msg, owner=f"user{r.randrange(10)}",
                                                            name=f"load-{k}"), timeout=60).job
                svc.GetJob(msg("GetJobRequest")(id=job.id), timeout=60)
                svc.ListJobs(list_req(r.choice(label_fields)[1]), timeout=60)
                svc.CancelJob(msg("CancelJobRequest")(id=job.id), timeout=60)
                with lock:
                    counts["client_loops"] += 1
            except grpc.RpcError:
                with lock:
                    counts["errors"] += 1

    threads = [threading.Thread(target=watcher, args=(k,)) for k in range(args.watchers)]
    threads += [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(counts))


def split(n, parts):
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    ap.add_argument("--jobs", type=int, default=10000)
    ap.add_argument("--queued", type=int, default=None, help="jobs left queued (default: all)")
    ap.add_argument("--owners", type=int, default=10)
    ap.add_argument("--idle-samples", type=int, default=200)
    ap.add_argument("--watchers", type=int, default=50)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--load-procs", type=int, default=8)
    ap.add_argument("--label", default="", help="a name for this build in the output (e.g. a commit)")
    ap.add_argument("--restarts", type=int, default=5, help="timed restarts at each --restart-at size")
    ap.add_argument("--restart-at", default="1000,10000",
                    help="queue sizes (jobs queued) at which restarts are timed; sizes above --jobs are left out")
    # internal: a load process
    ap.add_argument("--role", default="main", choices=["main", "load"])
    ap.add_argument("--addr")
    ap.add_argument("--watch-ids")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.role == "load":
        return load_main(args)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    queued = args.jobs if args.queued is None else args.queued
    tmp = Path(tempfile.mkdtemp(prefix="ftd-list-bench-"))
    log_path, max_queued = out / "ftd-list-bench.log", max(args.jobs, 1000) * 2
    log_path.unlink(missing_ok=True)
    proc, addr, ch = start_ftd(args.build, tmp / "data", log_path, max_queued)
    result = {"label": args.label, "jobs": args.jobs, "queued": queued, "page_size": PAGE, "restarts": []}
    try:
        svc = JobService(ch)
        ids, filled, result["fill_s"] = [], 0, 0.0
        restart_at = {int(x) for x in args.restart_at.split(",") if x and 0 < int(x) <= args.jobs}
        for size in sorted(restart_at | {args.jobs}):
            t0 = time.monotonic()
            ids += fill(addr, size - filled, args.owners, first=filled)
            result["fill_s"] += time.monotonic() - t0
            filled = size
            if args.restarts > 0 and size in restart_at:
                proc, addr, ch, times = time_restarts(args.build, tmp / "data", log_path, max_queued, proc,
                                                      args.restarts)
                result["restarts"].append({"queued": size, **summary(times)})
        svc = JobService(ch)
        for i in ids[: args.jobs - queued]:
            svc.CancelJob(msg("CancelJobRequest")(id=i), timeout=120)
        # A real token from the middle: page there in pages of 500.
        token = ""
        for _ in range(args.jobs // 2 // 500):
            token = svc.ListJobs(msg("ListJobsRequest")(page_size=500, page_token=token), timeout=300).next_page_token
        qs = shapes(token)
        result["idle"] = {k: summary(v) for k, v in measure(svc, qs, samples=args.idle_samples).items() if v}

        watch_ids = tmp / "watch_ids.json"
        watch_ids.write_text(json.dumps(ids[args.jobs - queued:] or ids))
        procs = []
        nprocs = max(1, min(args.load_procs, args.watchers + args.clients))
        for k, (w, c) in enumerate(zip(split(args.watchers, nprocs), split(args.clients, nprocs))):
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--role", "load", "--addr", addr, "--watch-ids", str(watch_ids),
                 "--watchers", str(w), "--clients", str(c), "--seconds", str(args.seconds + 4), "--seed", str(k + 1)],
                stdout=subprocess.PIPE, text=True))
        time.sleep(4)  # let the load start
        loaded = measure(svc, qs, seconds=args.seconds)
        counts = {"client_loops": 0, "watch_events": 0, "errors": 0}
        for p in procs:
            o, _ = p.communicate(timeout=args.seconds + 300)
            for k, v in json.loads(o.strip().splitlines()[-1]).items():
                counts[k] += v
        result["load"] = {"watchers": args.watchers, "clients": args.clients, "seconds": args.seconds, **counts,
                          "client_loops_per_s": counts["client_loops"] / (args.seconds + 4)}
        result["loaded"] = {k: summary(v) for k, v in loaded.items() if v}
        all_loaded = [x for v in loaded.values() for x in v]
        result["loaded_all"] = summary(all_loaded) if all_loaded else None
        for name in ("ftd.db", "ftd.db-wal"):
            f = tmp / "data" / name
            result[f"{name}_bytes"] = f.stat().st_size if f.exists() else 0
    finally:
        proc.terminate()
        proc.wait(timeout=60)

    (out / "list_bench.json").write_text(json.dumps(result, indent=1))
    print(f"\n{args.label} {args.jobs} jobs in the store, {queued} queued; ListJobs pages of {PAGE}; "
          f"filled in {result['fill_s']:.0f} s\n")
    print("| query | idle p50 (ms) | idle p99 (ms) | loaded p50 (ms) | loaded p99 (ms) | loaded n |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, _ in qs:
        i, l = result["idle"].get(label), result["loaded"].get(label)
        print(f"| {label} | {i['p50_ms']:.2f} | {i['p99_ms']:.2f} | " +
              (f"{l['p50_ms']:.2f} | {l['p99_ms']:.2f} | {l['n']} |" if l else " | | 0 |"))
    la = result["loaded_all"]
    if la:
        print(f"| all, under load | | | {la['p50_ms']:.2f} | {la['p99_ms']:.2f} | {la['n']} |")
    ld = result["load"]
    print(f"\nload: {ld['watchers']} watchers, {ld['clients']} clients, {ld['client_loops_per_s']:.1f} client loops/s "
          f"(submit, get, list, cancel), {ld['watch_events']} watch events, {ld['errors']} errors; "
          f"database {result['ftd.db_bytes'] / 2**20:.1f} MiB, WAL {result['ftd.db-wal_bytes'] / 2**20:.1f} MiB")
    if result["restarts"]:
        print("\n| jobs queued | restarts | start p50 (ms) | start max (ms) |")
        print("|---:|---:|---:|---:|")
        for r in result["restarts"]:
            print(f"| {r['queued']} | {r['n']} | {r['p50_ms']:.0f} | {r['max_ms']:.0f} |")


if __name__ == "__main__":
    main()
