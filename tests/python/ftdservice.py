"""Test harness for the job service: real ftd daemons on loopback ports, the real ftctl, real
ftd-worker processes. Every wait is bounded."""
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from ftdtest import BUILD

FTD = BUILD / "server" / "ftd"
FTCTL = BUILD / "client" / "ftctl"
WORKER = BUILD / "worker" / "ftd-worker"
FAKE_WORKER = BUILD / "server" / "ftd-fake-worker"  # test double: server/testing/fake_worker.cc

# What a worker reports, and how it exits, when it catches a CUDA out-of-memory (worker/agent.cc).
OOM_SCRIPT = {"result": "OUT_OF_MEMORY", "message": "GPU out of memory (scripted by ftd-fake-worker)", "exit": 3}

# How much slower than a normal build the binaries under test run (scripts/sanitize.sh sets 4 for
# ASan+UBSan): windows a test waits in, or gives a process to get something done, are scaled by it.
TIME_FACTOR = float(os.environ.get("FTD_TEST_TIME_FACTOR", "1"))

TINY = {"model": {"preset": "tiny"}, "batch_size": 4, "seq_len": 32, "device": "cpu", "log_every": 1}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """`scripts` ({job name: script}) runs the jobs so named with ftd-fake-worker acting out the
    script, and every other job with the real ftd-worker. Clients reach it on its unix socket
    (`addr`, `socket`: in `tmp` unless given), where the test, as root, is an admin; `tcp` is its
    loopback port, where calls need a token or a client certificate. `unix_socket` leaves TCP off:
    for tests that restart the daemon while clients retry, so that no other process can take the
    port in between and answer them. `nofile` runs it under that descriptor limit (RLIMIT_NOFILE)."""

    def __init__(self, tmp, *flags, env=None, scripts=None, unix_socket=False, socket=None, nofile=None):
        self.data = Path(tmp) / "data"
        self.port, self.metrics_port = free_port(), free_port()
        self.socket = Path(socket) if socket else Path(tmp) / "ftd.sock"
        self.addr = f"unix:{self.socket}"
        self.tcp = "" if unix_socket else f"127.0.0.1:{self.port}"
        self.flags = list(flags)
        self.env = dict(os.environ, **(env or {}))
        if scripts is not None:
            self.flags += ["--worker", str(FAKE_WORKER)]
            self.env.update(FTD_FAKE_WORKER_SCRIPT=json.dumps(scripts), FTD_FAKE_WORKER_REAL=str(WORKER))
        self.nofile = nofile
        self.log = open(Path(tmp) / "ftd.log", "ab")
        self.proc = None
        self.start()

    def start(self, wait=True):
        self.log.flush()
        self._log_from = Path(self.log.name).stat().st_size
        # The harness's defaults, each left out where the test passes the flag itself (ftd takes a
        # flag once).
        defaults = {"--metrics-listen": f"127.0.0.1:{self.metrics_port}", "--gpus": "0", "--backoff-s": "0.2",
                    "--grace-s": "3", "--heartbeat-timeout-s": "5"}
        self.proc = subprocess.Popen(
            [str(FTD), "--listen", self.tcp, "--socket", str(self.socket), "--data-dir", str(self.data),
             *[x for k, v in defaults.items() if k not in self.flags for x in (k, v)], *self.flags],
            stdout=self.log, stderr=self.log, env=self.env, preexec_fn=self._limit if self.nofile else None)
        if wait:
            self.wait_ready()

    def _limit(self):
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

    def wait_ready(self, timeout=20):
        """Waits for the daemon's own "serving on" line (printed once it listens and has recovered
        its queue) and returns time.monotonic() when it was seen. Reading the log costs nothing, so
        this measures the daemon's start-up and not how long a client process takes to start on a
        busy machine."""
        end = time.monotonic() + timeout
        needle = f"ftd: serving on {self.addr} ".encode()
        with open(self.log.name, "rb") as f:
            while time.monotonic() < end:
                f.seek(self._log_from)
                if needle in f.read():
                    return time.monotonic()
                if self.proc.poll() is not None:
                    raise AssertionError(f"ftd exited with {self.proc.returncode}: {self.read_log()[-2000:]}")
                time.sleep(0.01)
        raise AssertionError("ftd did not become ready")

    def read_log(self):
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def kill(self, sig=signal.SIGKILL, wait=True):
        self.proc.send_signal(sig)
        if wait:
            self.proc.wait(timeout=60)

    def stop(self):
        if self.proc:
            stop_process(self.proc)

    def metrics(self):
        from prometheus_client.parser import text_string_to_metric_families
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()
        samples = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return samples


def stop_process(proc, grace=30):
    """SIGTERM, then SIGKILL if it has not exited within `grace` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def ftctl(daemon, *args, timeout=120, input=None, env=None):
    addr = daemon.addr if hasattr(daemon, "addr") else daemon
    return subprocess.run([str(FTCTL), "--addr", addr, *args], capture_output=True, text=True, timeout=timeout,
                          input=input, env=env)


def make_token(daemon, user, *args):
    """A token for `user` made over the daemon's unix socket (as root: an admin), in a file of mode 0600."""
    p = ftctl(daemon, "admin", "token", "create", user, *args)
    assert p.returncode == 0, p.stderr
    path = Path(daemon.data).parent / f"token-{user}-{time.monotonic_ns()}"
    path.write_text(p.stdout)
    path.chmod(0o600)
    return path


def submit(daemon, spec, *args):
    path = Path(daemon.data).parent / f"spec-{time.monotonic_ns()}.json"
    path.write_text(json.dumps(spec))
    p = ftctl(daemon, "submit", str(path), *args)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def get(daemon, job_id):
    p = ftctl(daemon, "get", job_id, "-o", "json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def wait_for(pred, timeout, what):
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
