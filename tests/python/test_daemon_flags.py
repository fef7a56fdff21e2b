"""ftd's flags as a user of the real daemon sees them: each flag read in its unit (seconds, GiB, a
duration) and acting where docs/api.md says it does, measured on the daemon's own records (the
times of a job's state events) with ftd-fake-worker playing the workers. The unit tests set the job
manager's values directly, below the flag; these start ftd with the flag.

Also a check that every flag of `ftd --help` is exercised by some service test (a flag no test
passes to a real daemon is read in whatever unit main.cc happens to use).
"""
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import grpc
import pytest

from ftdapi import JobService, msg
from ftdservice import FTD, TIME_FACTOR, TINY, Daemon, ftctl, get, make_token, submit, wait_for

ROOT = Path(__file__).resolve().parents[2]
HOLD = {"steps": 1, "wait_for_stop": True}
GiB = 1 << 30


def state_events(d, job):
    """(unix_ms, job state) of each state event, as the daemon recorded them."""
    p = ftctl(d, "watch", job, "-o", "json", timeout=120)
    assert p.returncode in (0, 1, 2), p.stderr
    return [(int(e["unix_ms"]), e["state"]) for e in map(json.loads, p.stdout.splitlines()) if "state" in e]


def mkdir(path):
    path.mkdir(parents=True, exist_ok=True)
    return path


def wait_state(d, job, states, timeout=60):
    return wait_for(lambda: (lambda j: j if j["state"] in states else None)(get(d, job)), timeout,
                    f"{job} to be one of {states}")


def test_every_daemon_flag_is_passed_to_a_real_daemon_by_some_test():
    """A proxy for "every flag through the real daemon at least once": each long flag `ftd --help`
    lists appears, quoted, in a service test file (the harness's own defaults in ftdservice.py do not
    count: they set a flag without observing it)."""
    out = subprocess.run([str(FTD), "--help"], capture_output=True, text=True, timeout=30).stdout
    flags = sorted(set(re.findall(r"^\s+(--[a-z][a-z0-9-]+)", out, re.M)) - {"--help"})
    assert len(flags) >= 35, out
    texts = [p.read_text() for p in (ROOT / "tests" / "python").glob("test_*.py")]
    missing = [f for f in flags if not any(f'"{f}"' in t for t in texts)]
    assert missing == [], f"no service test starts ftd with {missing}"


def test_backoff_s_is_in_seconds_and_doubles_per_attempt(tmp_path):
    """--backoff-s 1.5: a worker that exits without a result (WORKER_EXIT, retried) is retried 1.5 s
    after its first attempt ended and 3 s after its second (docs/api.md), and not before."""
    d = Daemon(tmp_path, "--backoff-s", "1.5", scripts={"flaky": {"exit": 5}})
    try:
        job = submit(d, TINY, "--name", "flaky", "--max-attempts", "3")
        assert ftctl(d, "wait", job, timeout=120).returncode == 1
        events = state_events(d, job)
        retries = [(ms, s) for ms, s in events if s["state"] == "QUEUED" and s["reason"] == "WORKER_EXIT"]
        starts = [ms for ms, s in events if s["state"] == "RUNNING" and s["reason"] == "RUNNING"]
        assert len(retries) == 2 and len(starts) == 3, events
        for n, ((ended, s), started) in enumerate(zip(retries, starts[1:])):
            backoff = 1500 * 2 ** n
            assert abs(int(s["not_before_unix_ms"]) - ended - backoff) <= 50, (n, ended, s)
            assert started >= int(s["not_before_unix_ms"]), (n, started, s)
            assert started - ended <= backoff + 3000 * TIME_FACTOR, (n, ended, started)
    finally:
        d.stop()


def worker_started_ms(d, job):
    """When the (fake) worker of `job` started, by its own first line in the job's log."""
    log = (Path(d.data) / "jobs" / job / "worker.log").read_text()
    return int(re.search(r"fake-worker: started unix_us=(\d+)", log).group(1)) / 1000


def test_heartbeat_timeout_s_is_in_seconds(tmp_path):
    """--heartbeat-timeout-s 3: a worker that never heartbeats is killed 3 s after it last spoke (its
    start), not at once, not twice as late (LOST_HEARTBEAT)."""
    d = Daemon(tmp_path, "--heartbeat-timeout-s", "3",
               scripts={"silent": {"heartbeat": False, "wait_for_stop": True, "ignore_stop": True}})
    try:
        job = submit(d, TINY, "--name", "silent", "--max-attempts", "1")
        assert ftctl(d, "wait", job, timeout=120).returncode == 1
        ms, failed = state_events(d, job)[-1]
        assert failed["state"] == "FAILED" and failed["reason"] == "LOST_HEARTBEAT", failed
        started = worker_started_ms(d, job)
        assert 3000 <= ms - started <= 3000 + 2000 * TIME_FACTOR, (started, ms)
    finally:
        d.stop()


def test_grace_s_is_in_seconds(tmp_path):
    """--grace-s 2.5: a worker that ignores the stop signal is killed 2.5 s after the cancel (not at
    once, not twice as late), and the job is CANCELLED."""
    d = Daemon(tmp_path, "--grace-s", "2.5", scripts={"stubborn": dict(HOLD, ignore_stop=True)})
    try:
        job = submit(d, TINY, "--name", "stubborn")
        wait_for(lambda: get(d, job).get("last_step"), 60, "the worker's first step")
        assert ftctl(d, "cancel", job).returncode == 0
        assert ftctl(d, "wait", job, timeout=120).returncode == 2
        events = state_events(d, job)
        cancelling = [ms for ms, s in events if s["reason"] == "CANCELLING"]
        ms, end = events[-1]
        assert len(cancelling) == 1 and end["state"] == "CANCELLED", events
        # the kill is timed from the stop signal, sent just before CANCELLING is written
        assert 2400 <= ms - cancelling[0] <= 2500 + 2000 * TIME_FACTOR, (cancelling, ms)
    finally:
        d.stop()


def test_drain_timeout_s_is_in_seconds(tmp_path):
    """--drain-timeout-s 3 (with a longer --grace-s): on SIGTERM, ftd waits 3 s for a worker that
    ignores the stop signal, then kills it (not at once, not twice as late): the attempt's end, in
    the job's events as the restarted daemon has them, comes 3 s after the SIGTERM."""
    d = Daemon(tmp_path, "--drain-timeout-s", "3", "--grace-s", "60", scripts={"stubborn": dict(HOLD, ignore_stop=True)})
    try:
        job = submit(d, TINY, "--name", "stubborn")
        wait_for(lambda: get(d, job).get("last_step"), 60, "the worker's first step")
        sigterm_ms = time.time() * 1000
        d.kill(signal.SIGTERM)
        assert d.proc.returncode == 0
        assert "draining (up to 3 s)" in d.read_log()
        d.flags.append("--paused")  # the requeued job stays queued: cancelled, its events end
        d.start()
        assert ftctl(d, "cancel", job).returncode == 0
        ended = [ms for ms, s in state_events(d, job) if s["reason"] == "DAEMON_SHUTDOWN"]
        assert len(ended) == 1, state_events(d, job)
        assert 3000 <= ended[0] - sigterm_ms <= 3000 + 1500 * TIME_FACTOR, (sigterm_ms, ended)
    finally:
        d.stop()


def test_gpu_margin_gib_is_in_gib(tmp_path):
    """--gpu-margin-gib: two jobs share a GPU only while their predicted peaks plus the margin fit
    --gpu-memory-gib. The GPU here has room for both with 0.25 GiB to spare: a 0.2 GiB margin lets the
    second in, a 0.3 GiB margin holds it (WAITING_FOR_MEMORY, naming the margin)."""
    on_gpu = dict(TINY, device="cuda")
    probe = Daemon(mkdir(tmp_path / "probe"), "--gpus", "1", "--gpu-memory-gib", "80", "--paused")
    try:
        peak = int(get(probe, submit(probe, on_gpu))["predicted_peak_bytes"])
    finally:
        probe.stop()
    assert 0 < peak < 10 * GiB, peak
    memory = (2 * peak + 0.25 * GiB) / GiB
    for margin, shared in (("0.2", True), ("0.3", False)):
        d = Daemon(mkdir(tmp_path / margin), "--gpus", "1", "--jobs-per-gpu", "2", "--gpu-memory-gib", f"{memory:.6f}",
                   "--gpu-margin-gib", margin, scripts={"*": HOLD})
        try:
            a, b = submit(d, on_gpu, "--name", "a"), submit(d, on_gpu, "--name", "b")
            wait_state(d, a, ("RUNNING",))
            if shared:
                wait_state(d, b, ("RUNNING",))
            else:
                j = wait_for(lambda: (lambda j: j if j["reason"] == "WAITING_FOR_MEMORY" else None)(get(d, b)), 30,
                             "the second job to wait for memory")
                assert "(less a margin of 307 MiB when shared)" in j["message"], j["message"]
            for job in (a, b):
                assert ftctl(d, "cancel", job).returncode == 0
        finally:
            d.stop()


def test_quota_window_and_fair_share_half_life_are_read_as_durations(tmp_path):
    """--quota-window 45m and --fair-share-half-life 36h show in a queued job's message as the
    window and the half-life, and the GPU-hours limit counts the CPU slot's time in that window: a
    user over gpu-hours=0.0001 (0.36 s) is refused naming the window. With a half-life of 0 the
    message has no fair-share figure."""
    d = Daemon(mkdir(tmp_path / "a"), "--quota-window", "45m", "--fair-share-half-life", "36h",
               "--user-limits", "gpu-hours=0.0001", "--paused", scripts={"*": HOLD})
    try:
        job, queued = submit(d, TINY, "--name", "runs"), submit(d, TINY, "--name", "queued")
        assert ftctl(d, "resume").returncode == 0
        wait_state(d, job, ("RUNNING",))
        message = get(d, queued)["message"]
        # A CPU-only daemon speaks of CPU-slot hours (the same quota, the CPU slot's time).
        assert "CPU-slot hours in the last 45 min" in message and "half-life 36 h)" in message, message
        # the running job is counted up to now: soon over 0.36 GPU-seconds
        over = wait_for(lambda: (lambda p: p if p.returncode == 3 else None)(
            ftctl(d, "submit", "-", "--dry-run", input=json.dumps(TINY))), 30, "the limit to be reached")
        assert "CPU-slot hours in the last 45 min, the limit for the user (gpu-hours=0.0001)" in over.stderr, over.stderr
        for j in (job, queued):
            ftctl(d, "cancel", j)
    finally:
        d.stop()
    d = Daemon(mkdir(tmp_path / "b"), "--fair-share-half-life", "0", "--paused")
    try:
        message = get(d, submit(d, TINY))["message"]
        assert "fair-share" not in message and "GPU-hours" not in message, message
    finally:
        d.stop()


def test_max_calls_per_s_per_connection_holds_one_connection_not_the_user(tmp_path):
    """--max-calls-per-s-per-connection 2: one connection of a token user gets a burst of 4 calls, then
    RESOURCE_EXHAUSTED naming the flag; another connection of the same user is not held by it."""
    d = Daemon(tmp_path, "--paused", "--max-calls-per-s-per-connection", "2")
    try:
        auth = (("authorization", f"Bearer {make_token(d, 'carol').read_text().strip()}"),)
        channels = [grpc.insecure_channel(d.tcp, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(2)]
        first, second = (JobService(c) for c in channels)
        sched = msg("SchedulerRequest")()
        answers = []
        for _ in range(12):
            try:
                first.GetScheduler(sched, metadata=auth, timeout=10)
                answers.append("OK")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (e.code(), e.details())
                assert ("this connection is over the call rate limit of 2 calls per second (bursts of 4; "
                        "--max-calls-per-s-per-connection)") in e.details(), e.details()
                answers.append("REFUSED")
        assert answers[:4] == ["OK"] * 4 and "REFUSED" in answers, answers
        second.GetScheduler(sched, metadata=auth, timeout=10)
    finally:
        d.stop()


def test_metrics_listen_empty_serves_no_metrics(tmp_path):
    """--metrics-listen "" turns the endpoint off, and ftd says so."""
    d = Daemon(tmp_path, "--metrics-listen", "", "--paused")
    try:
        assert "metrics on (off)" in d.read_log()
        with pytest.raises(OSError):
            d.metrics()
    finally:
        d.stop()


def test_max_connections_per_peer_closes_a_tcp_peers_connections_beyond_it(tmp_path):
    """`--max-connections-per-peer 3`: a loopback TCP peer's fourth and fifth connections are closed at
    once, with the flag named in ftd's log, while its first three stay open and another address
    still connects."""
    import select
    import socket
    d = Daemon(tmp_path, "--max-connections-per-peer", "3")
    held = []
    try:
        for _ in range(5):
            s = socket.socket()
            s.bind(("127.0.0.2", 0))
            s.connect(("127.0.0.1", d.port))
            held.append(s)

        def closed(s, timeout):
            r, _, _ = select.select([s], [], [], timeout)
            if not r:
                return False
            try:
                return s.recv(1) == b""
            except ConnectionResetError:
                return True

        wait_for(lambda: "--max-connections-per-peer 3" in d.read_log(), 20 * TIME_FACTOR,
                 "ftd to refuse 127.0.0.2's fourth connection")
        assert [closed(s, 2.0) for s in held[3:]] == [True, True]
        assert [closed(s, 0.2) for s in held[:3]] == [False, False, False]
        other = socket.create_connection(("127.0.0.1", d.port))
        assert not closed(other, 0.2)
        other.close()
        assert "ipv4:127.0.0.2 has 3 connections open" in d.read_log(), d.read_log()[-2000:]
    finally:
        for s in held:
            s.close()
        d.stop()


def test_pid_file_holds_the_serving_daemons_pid_and_goes_when_it_stops(tmp_path):
    """`--pid-file P`: P holds the pid of the ftd that serves, once it serves, and is removed when that
    ftd stops; a pid file another process has since written is left alone."""
    pid_file = tmp_path / "ftd.pid"
    d = Daemon(tmp_path, "--pid-file", str(pid_file))
    try:
        assert pid_file.read_text() == f"{d.proc.pid}\n"
    finally:
        d.stop()
    assert d.proc.returncode == 0 and not pid_file.exists()
    d.start()
    try:
        pid_file.write_text("12345\n")  # another ftd's, say, written after this one started
    finally:
        d.stop()
    assert pid_file.read_text() == "12345\n"
