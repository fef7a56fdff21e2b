"""What one user or a network peer can do to ftd and to the other users, with real processes: a real
ftd (under a low descriptor limit where that is the point), real ftctl, real local users, raw
sockets. Connection floods and their limits, connections that never finish their handshake,
unauthenticated calls (refused before their bytes are parsed, audited a few a minute), control
characters in names and messages (refused at submit, escaped wherever they still show), YAML
aliases that expand without end, the admins' stream limit."""
import json
import os
import pty
import resource
import select
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
from pathlib import Path

import grpc
import pytest

from ftdapi import JobService, msg, spec
from ftdservice import FTCTL, FTD, TINY, Daemon, ftctl, make_token, wait_for
from test_auth import ALICE, BOB, local_users, pki  # noqa: F401 (fixtures)

RAW = dict(request_serializer=lambda b: b, response_deserializer=lambda b: b)


def ok(p):
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    return p.stdout.strip()


def as_user(user, daemon, *args, timeout=60):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp"}
    return subprocess.run(["runuser", "-u", user, "--", str(FTCTL), "--addr", daemon.addr, *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def closed_by_peer(s, timeout):
    """Reads `s` until the peer closes it (True) or `timeout` seconds pass (False)."""
    end = time.monotonic() + timeout
    s.setblocking(False)
    while time.monotonic() < end:
        r, _, _ = select.select([s], [], [], max(0.0, end - time.monotonic()))
        if not r:
            continue
        try:
            if not s.recv(65536):
                return True
        except ConnectionResetError:
            return True
        except BlockingIOError:
            continue
    return False


@pytest.fixture
def shared_dir():
    """A directory other local users can reach (pytest's tmp_path is root's only), for the socket."""
    d = Path(tempfile.mkdtemp(prefix="ftd-abuse-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


# --- connection floods -----------------------------------------------------------------------------

# Run as another local user: opens N connections to the unix socket and holds them until stdin closes.
HOLD_UNIX = """
import socket, sys
held = []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    try:
        s.connect(sys.argv[1])
        held.append(s)
    except OSError:
        s.close()
print(len(held), flush=True)
sys.stdin.read()
"""


def test_a_flood_of_idle_connections_leaves_other_users_and_their_jobs_served(tmp_path, shared_dir, local_users):
    """ftd under a 384-descriptor limit. Bob holds 300 idle connections on the unix socket and two TCP
    peers 300 each, sending nothing (before: ftd reached its limit, Alice and root could not connect
    and a job's start failed on `pipe: Too many open files`). Each flooding peer gets its share and
    no more, the rest closed with a reason in ftd's log; Alice's submit and job, and root's list, work."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))  # this test's 600 sockets
    d = Daemon(tmp_path, socket=shared_dir / "ftd.sock", nofile=384,
               scripts={"alice-run": {"result": "SUCCEEDED", "message": "done"}})
    bob = None
    tcp = []
    try:
        bob = subprocess.Popen(["runuser", "-u", BOB, "--", "/usr/bin/python3", "-c", HOLD_UNIX, str(d.socket), "300"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for peer in ("127.0.0.2", "127.0.0.3"):
            for _ in range(300):
                s = socket.socket()
                s.bind((peer, 0))
                s.connect(("127.0.0.1", d.port))
                tcp.append(s)
        assert int(bob.stdout.readline()) > 0
        wait_for(lambda: all(f"refused a connection from {who}" in d.read_log()
                             for who in (f"local user {BOB}", "ipv4:127.0.0.2", "ipv4:127.0.0.3")),
                 60, "ftd to refuse the flooding peers")
        log = d.read_log()
        assert "the limit per peer" in log, log[-3000:]
        # A peer's connections beyond its share were closed at once (the rest wait out the handshake timeout).
        closed = sum(closed_by_peer(s, 0.01) for s in tcp[:300])
        assert closed >= 300 - 64, closed
        # Alice and root are served, and Alice's job runs to its end.
        assert ok(as_user(ALICE, d, "--timeout", "20", "submit", "--default", "--name", "alice-run", "--set", "steps=1",
                          "--wait", timeout=120))
        assert ok(ftctl(d, "--timeout", "20", "list"))
        open_fds = len(os.listdir(f"/proc/{d.proc.pid}/fd"))
        assert open_fds < 384 - 64, open_fds
        assert "Too many open files" not in d.read_log()
    finally:
        for s in tcp:
            s.close()
        if bob is not None:
            bob.stdin.close()
            bob.wait(timeout=30)
        d.stop()


def test_a_connection_that_never_finishes_its_handshake_or_calls_is_closed(tmp_path, pki):
    """Over TLS: a TCP connection that sends nothing is closed once the handshake timeout has passed,
    and one that finished its TLS handshake but makes no call once the idle timeout has (before:
    both stayed open, two minutes and for ever)."""
    cert, key = pki["server"]
    d = Daemon(tmp_path, "--tls-cert", str(cert), "--tls-key", str(key), "--handshake-timeout-s", "1",
               "--idle-connection-timeout-s", "2")
    try:
        silent = socket.create_connection(("127.0.0.1", d.port))
        t0 = time.monotonic()
        assert closed_by_peer(silent, 30), "a connection that sent nothing is still open"
        assert time.monotonic() - t0 >= 0.5
        ctx = ssl.create_default_context(cafile=str(pki["ca"]))
        ctx.set_alpn_protocols(["h2"])
        tls = ctx.wrap_socket(socket.create_connection(("127.0.0.1", d.port)), server_hostname="localhost")
        tls.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000"))  # preface, SETTINGS
        assert closed_by_peer(tls, 30), "a connection that made no call is still open"
        # A client that does call is served, and reconnects by itself once its idle connection was closed.
        token = make_token(d, "carol")
        cfg = tmp_path / "ftctl.json"
        cfg.write_text(json.dumps({"current_context": "c", "contexts": {"c": {
            "addr": f"localhost:{d.port}", "ca_file": str(pki["ca"]), "token_file": str(token)}}}))
        env = dict(os.environ, FTCTL_CONFIG=str(cfg))
        env.pop("FTD_ADDR", None)
        p = subprocess.run([str(FTCTL), "whoami"], capture_output=True, text=True, env=env, timeout=60)
        assert ok(p).startswith("carol (user)")
    finally:
        d.stop()


def test_the_connection_limit_is_checked_against_the_descriptor_limit_at_start(tmp_path):
    def start(nofile, *flags):
        return subprocess.run([str(FTD), "--data-dir", str(tmp_path / "data"), "--socket", str(tmp_path / "s.sock"),
                               "--listen", "", "--metrics-listen", "", "--gpus", "0", *flags], capture_output=True,
                              text=True, timeout=60,
                              preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile)))
    p = start(64)
    assert p.returncode == 1, p.stderr
    assert "the descriptor limit (RLIMIT_NOFILE 64)" in p.stderr and "raise the limit (ulimit -n" in p.stderr, p.stderr
    p = start(1024, "--max-connections", "5000")
    assert p.returncode == 1, p.stderr
    assert "--max-connections 5000 does not fit the descriptor limit (RLIMIT_NOFILE 1024)" in p.stderr, p.stderr
    assert "lower it" in p.stderr


def test_an_admin_has_a_stream_limit_too(tmp_path):
    d = Daemon(tmp_path, "--paused", "--max-streams-per-admin", "3")
    try:
        svc = JobService(grpc.insecure_channel(d.addr))
        job = svc.SubmitJob(msg("SubmitJobRequest")(spec=spec(TINY)), timeout=20).job.id
        streams = []
        for _ in range(3):
            it = svc.WatchJob(msg("WatchJobRequest")(id=job), timeout=60)
            next(it)  # open on the daemon
            streams.append(it)
        with pytest.raises(grpc.RpcError) as e:
            next(svc.WatchJob(msg("WatchJobRequest")(id=job), timeout=60))
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value.details()
        assert "admin root has 3 streaming calls open" in e.value.details(), e.value.details()
        assert "(--max-streams-per-admin 3)" in e.value.details()
        streams.pop().cancel()
        wait_for(lambda: _opens(svc, job), 10, "the closed stream's place")
    finally:
        d.stop()


def _opens(svc, job):
    try:
        next(svc.WatchJob(msg("WatchJobRequest")(id=job), timeout=60))
        return True
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.details()
        return False


# --- unauthenticated calls -------------------------------------------------------------------------

def test_unauthenticated_calls_are_refused_unparsed_and_audited_a_few_a_minute(tmp_path):
    """3,000 CancelJob calls with no credentials once committed 3,000 audit rows; malformed ones were
    parsed first (INVALID_ARGUMENT, and a libprotobuf line in ftd's log each). Now every one is
    UNAUTHENTICATED, nothing is parsed or logged, and the audit log holds the first call and, once
    its minute is over, one record counting the rest."""
    d = Daemon(tmp_path, "--paused")
    try:
        good = msg("CancelJobRequest")(id="j-000001").SerializeToString()
        bad_utf8 = b"\x0a\x02\xff\xfe"  # CancelJobRequest.id, not UTF-8
        truncated = b"\x0a\x7f"
        with grpc.insecure_channel(d.tcp) as ch:
            cancel = ch.unary_unary("/ftd.v1.JobService/CancelJob", **RAW)
            submit = ch.unary_unary("/ftd.v1.JobService/SubmitJob", **RAW)
            codes = {}
            for i in range(600):
                call = submit if i % 3 == 0 else cancel
                with pytest.raises(grpc.RpcError) as e:
                    call([good, bad_utf8, truncated][i % 3], timeout=20)
                codes[e.value.code()] = codes.get(e.value.code(), 0) + 1
        assert codes == {grpc.StatusCode.UNAUTHENTICATED: 600}, codes
        log = d.read_log()
        assert "protobuf" not in log.lower() and "UTF-8" not in log, log[-2000:]
        records = json.loads(ok(ftctl(d, "admin", "audit", "--limit", "1000", "-o", "json")))["records"]
        unauth = [r for r in records if r["code"] == "UNAUTHENTICATED"]
        assert len(unauth) == 1, len(unauth)
        assert unauth[0]["peer"].startswith("ipv4:127.0.0.1:") and unauth[0]["action"] in ("CancelJob", "SubmitJob")
        # The count of the rest is written when ftd stops (or the minute ends).
        d.stop()
        d.start()
        records = json.loads(ok(ftctl(d, "admin", "audit", "--limit", "1000", "-o", "json")))["records"]
        summary = [r for r in records if "unauthenticated calls from ipv4:127.0.0.1 in the last minute" in
                   r.get("detail", "")]
        assert len(summary) == 1, [r.get("detail") for r in records]
        assert summary[0]["detail"].startswith("600 unauthenticated calls"), summary[0]
        assert "CancelJob 400" in summary[0]["detail"] and "SubmitJob 199" in summary[0]["detail"], summary[0]
    finally:
        d.stop()


# --- control characters ----------------------------------------------------------------------------

FORGED = "ftd: job j-000001 RUNNING -> SUCCEEDED (SUCCEEDED): forged line"
ESCAPES = "\x1b]0;owned\x07\x1b[2J"


def test_control_characters_are_refused_at_submit_naming_the_field(daemon, tmp_path):
    p = ftctl(daemon, "submit", "--default", "--name", "run\n" + FORGED)
    assert p.returncode == 3 and "INVALID_ARGUMENT: name holds a control character (U+000A, a newline, at byte 3)" \
        in p.stderr, p.stderr
    p = ftctl(daemon, "submit", "--default", "--name", "x" + ESCAPES)
    assert p.returncode == 3 and "name holds a control character (U+001B, an escape" in p.stderr, p.stderr
    assert "\x1b" not in p.stderr
    p = ftctl(daemon, "submit", "--default", "--request-id", "nightly\t1")
    assert p.returncode == 3 and "request_id holds a control character (U+0009, a tab" in p.stderr, p.stderr
    # A NUL in a path field: the part after it was dropped when the file was opened.
    data = tmp_path / "data.bin"
    data.write_bytes(b"\0" * 64)
    job = tmp_path / "job.json"
    job.write_text(json.dumps(dict(TINY, data={"path": str(data) + "\u0000/../../etc/shadow"})))
    p = ftctl(daemon, "submit", str(job))
    assert p.returncode == 3 and f"spec.data.path holds a NUL byte (U+0000, a NUL, at byte {len(str(data))})" \
        in p.stderr, p.stderr
    p = ftctl(daemon, "admin", "token", "create", "carol", "--description", "laptop" + ESCAPES)
    assert p.returncode == 3 and "description holds a control character" in p.stderr, p.stderr
    assert json.loads(ok(ftctl(daemon, "list", "-o", "json"))) == []


def test_text_from_jobs_reaches_the_log_and_terminals_escaped(tmp_path):
    """A worker's message with a newline and terminal escapes (text ftd cannot refuse: it comes from the
    job's files) forges no line in ftd's log, and no ftctl renderer passes the escapes to a terminal."""
    message = "bad\n" + FORGED + ESCAPES
    d = Daemon(tmp_path, scripts={"loud": {"result": "FAILED", "message": message, "exit": 1}})
    try:
        job = ok(ftctl(d, "submit", "--default", "--name", "loud", "--max-attempts", "1"))
        ftctl(d, "wait", job, timeout=120)
        log = d.read_log()
        assert FORGED not in log.splitlines() and not any(line.startswith(FORGED) for line in log.splitlines())
        assert "\x1b" not in log and "\x07" not in log
        assert "\\n" + FORGED + "\\x1b]0;owned\\x07" in log, log[-2000:]
        outputs = {verb: ftctl(d, *verb.split(), job).stdout for verb in ("get", "watch", "wait")}
        outputs["list"] = ftctl(d, "list").stdout
        outputs["cancel"] = ftctl(d, "cancel", job).stderr
        for verb, out in outputs.items():
            assert "\x1b" not in out and "\x07" not in out, (verb, out)
            assert not any(line.startswith(FORGED) for line in out.splitlines()), (verb, out)
        assert len(outputs["list"].splitlines()) == 2, outputs["list"]  # the header and one row
        assert "\\x1b]0;owned\\x07" in outputs["get"], outputs["get"]
        # ftctl logs: on a terminal escaped, into a pipe byte for byte.
        (d.data / "jobs" / job / "worker.log").open("a").write("line " + ESCAPES + "\n")
        assert ESCAPES in ftctl(d, "logs", job).stdout
        master, slave = pty.openpty()
        p = subprocess.Popen([str(FTCTL), "--addr", d.addr, "logs", job], stdout=slave, stderr=subprocess.PIPE)
        os.close(slave)
        shown = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: ftctl has exited and the terminal is closed
                break
            if not chunk:
                break
            shown += chunk
        os.close(master)
        assert p.wait(timeout=60) == 0, p.stderr.read()
        assert b"line \\x1b]0;owned\\x07\\x1b[2J" in shown and b"\x1b" not in shown, shown[-500:]
    finally:
        d.stop()


# --- YAML ------------------------------------------------------------------------------------------

def test_yaml_aliases_that_expand_without_end_are_refused_naming_the_file(tmp_path):
    """Nine levels of aliases in 300-odd bytes once kept ftctl busy for minutes, growing to gigabytes."""
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    bomb = tmp_path / "laughs.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    t0 = time.monotonic()
    p = subprocess.run([str(FTCTL), "--addr", "unix:/nonexistent", "submit", str(bomb)], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 64, (p.returncode, p.stderr)
    assert f"{bomb}: the YAML spec expands to more than 100000 values" in p.stderr, p.stderr
    assert time.monotonic() - t0 < 10
