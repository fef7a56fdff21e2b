"""Identity and access (docs/security.md), with real daemons, the real ftctl and real TLS:
the unix socket's peer uid, a second local user, bearer tokens, TLS and mutual TLS with certificates
made here by openssl, who may read and change whose jobs, admin-only calls, and the audit log."""
import json
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import grpc
import pytest

from ftdservice import FTCTL, FTD, Daemon, free_port, ftctl, make_token, stop_process, wait_for

ALICE, BOB = "ftdt-alice", "ftdt-bob"


def ok(p):
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def denied(p, code, *words):
    assert p.returncode == 3, (p.returncode, p.stdout, p.stderr)
    assert f"ftctl: {code}:" in p.stderr, p.stderr
    for w in words:
        assert w in p.stderr, (w, p.stderr)


def tcp(daemon, *args, token=None, env=None):
    """ftctl over the daemon's loopback port, with a token file when given."""
    e = dict(os.environ, **(env or {}))
    e.pop("FTD_TOKEN_FILE", None)
    if token:
        e["FTD_TOKEN_FILE"] = str(token)
    return ftctl(daemon.tcp, *args, env=e)


# --- local users -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def local_users():
    """Two unprivileged local users (no home, no login shell), made with useradd (root only) when missing.
    They are left in place: test files that run at the same time share them, and removing them at the end
    of one pulled them from under the other."""
    if os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("runuser") is None:
        pytest.skip("needs root, useradd and runuser to make a second local user (CI runs as root)")
    for u in (ALICE, BOB):
        for _ in range(50):  # another test may be adding it, or holding the passwd lock, right now
            try:
                pwd.getpwnam(u)
                break
            except KeyError:
                subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", u],
                               check=False, capture_output=True)
                time.sleep(0.1)
        else:
            pytest.fail(f"could not create the local user {u} with useradd")
    # The local users run the checkout's ftctl: every directory above it must let others through.
    for d in Path(FTCTL).resolve().parents:
        if not os.stat(d).st_mode & 0o001:
            pytest.fail(f"the local users {ALICE} and {BOB} cannot reach {FTCTL}: {d} is mode "
                        f"{os.stat(d).st_mode & 0o777:o}, without search (x) for others; chmod o+x it, or clone "
                        "the checkout into a directory other users can search")
    yield


@pytest.fixture
def shared(tmp_path, local_users):
    """A daemon whose socket other local users can reach (pytest's tmp_path is root's only); paused,
    so that jobs stay queued."""
    d_sock = Path(tempfile.mkdtemp(prefix="ftd-auth-"))
    d_sock.chmod(0o755)
    d = Daemon(tmp_path, "--paused", socket=d_sock / "ftd.sock")
    yield d
    d.stop()
    shutil.rmtree(d_sock, ignore_errors=True)


def as_user(user, daemon, *args):
    """ftctl run as another local user (runuser), on the daemon's unix socket."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp"}
    return subprocess.run(["runuser", "-u", user, "--", str(FTCTL), "--addr", daemon.addr, *args],
                          capture_output=True, text=True, timeout=60, env=env)


def test_unix_socket_caller_is_the_peer_uid_and_root_is_admin(daemon):
    who = ok(ftctl(daemon, "whoami"))
    assert who.startswith("root (admin) via unix socket uid 0"), who
    job = ok(ftctl(daemon, "submit", "--default", "--set", "steps=1"))
    got = json.loads(ok(ftctl(daemon, "get", job, "-o", "json")))
    assert got["owner"] == "root" and got["submitted_by"] == "root", got
    # $USER is no identity: the owner stays the authenticated caller
    p = subprocess.run([str(FTCTL), "--addr", daemon.addr, "submit", "--default", "--set", "steps=1"],
                       capture_output=True, text=True, env=dict(os.environ, USER="mallory"))
    assert json.loads(ok(ftctl(daemon, "get", ok(p), "-o", "json")))["owner"] == "root"


def test_a_second_local_user_is_distinct_and_cannot_touch_others_jobs(shared):
    d = shared
    uid = pwd.getpwnam(ALICE).pw_uid
    assert ok(as_user(ALICE, d, "whoami")).startswith(f"{ALICE} (user) via unix socket uid {uid}")
    job = ok(as_user(ALICE, d, "submit", "--default", "--set", "steps=1", "--name", "alice-run"))
    got = json.loads(ok(as_user(ALICE, d, "get", job, "-o", "json")))
    assert got["owner"] == ALICE and got["submitted_by"] == ALICE and got["spec"], got

    # Bob sees the queue, not Alice's spec; he may not read its spec, watch, cancel or download her job's trace.
    listed = json.loads(ok(as_user(BOB, d, "list", "-o", "json")))
    mine = [j for j in (listed if isinstance(listed, list) else listed.get("jobs", [])) if j["id"] == job]
    assert mine and mine[0]["owner"] == ALICE and "spec" not in mine[0], listed
    denied(as_user(BOB, d, "get", job, "--spec"), "PERMISSION_DENIED", f"belongs to {ALICE}", "you are ftdt-bob")
    denied(as_user(BOB, d, "cancel", job), "PERMISSION_DENIED", f"belongs to {ALICE}")
    denied(as_user(BOB, d, "watch", job), "PERMISSION_DENIED", f"belongs to {ALICE}")
    denied(as_user(BOB, d, "profile", job, "--trace", "/tmp/ftd-auth-trace-bob.json"), "PERMISSION_DENIED",
           f"belongs to {ALICE}")
    # nor submit as her, nor above the priority cap, nor administer
    denied(as_user(BOB, d, "submit", "--default", "--owner", ALICE), "PERMISSION_DENIED", "only an admin")
    denied(as_user(BOB, d, "submit", "--default", "--priority", "500"), "PERMISSION_DENIED", "priority 500")
    denied(as_user(BOB, d, "admin", "token", "create", BOB, "--role", "admin"), "PERMISSION_DENIED", "only an admin")
    denied(as_user(BOB, d, "admin", "audit"), "PERMISSION_DENIED", "only an admin")
    assert json.loads(ok(ftctl(d, "get", job, "-o", "json")))["state"] == "QUEUED"

    # Alice may cancel her own; root, an admin, may cancel anyone's, and is recorded as such.
    other = ok(as_user(ALICE, d, "submit", "--default", "--set", "steps=1"))
    ok(as_user(ALICE, d, "cancel", other))
    assert json.loads(ok(ftctl(d, "get", other, "-o", "json")))["cancelled_by"] == ALICE
    ok(ftctl(d, "cancel", job))
    got = json.loads(ok(ftctl(d, "get", job, "-o", "json")))
    assert got["state"] == "CANCELLED" and got["cancelled_by"] == "root", got
    # An admin submits for someone else: the owner is Bob, the submitter root.
    j3 = ok(ftctl(d, "submit", "--default", "--owner", BOB))
    got = json.loads(ok(as_user(BOB, d, "get", j3, "-o", "json")))
    assert got["owner"] == BOB and got["submitted_by"] == "root"


def test_request_ids_are_per_owner_and_a_mismatch_names_fields_only_to_the_owner(shared, tmp_path):
    """Request ids were unique across users and checked before any authorization: Bob's submit with
    Alice's id named her job and, field by field, how her spec differed from his, and Bob could take
    an id before Alice used it. Now each owner's ids are their own, for local and token users alike."""
    d = shared
    alice = ok(as_user(ALICE, d, "submit", "--default", "--set", "optimizer.lr=0.00123", "--set", "steps=777",
                       "--request-id", "nightly-1"))
    p = as_user(BOB, d, "submit", "--default", "--set", "optimizer.lr=0.1", "--request-id", "nightly-1")
    bob = ok(p)
    assert bob != alice and "request id already used" not in p.stderr, (bob, p.stderr)
    p = as_user(BOB, d, "submit", "--default", "--set", "optimizer.lr=0.00123", "--set", "steps=777",
                "--request-id", "nightly-1")
    assert p.returncode == 3 and "ALREADY_EXISTS" in p.stderr and bob in p.stderr, p.stderr
    assert alice not in p.stderr and "owner" not in p.stderr.split("differs in:")[1], p.stderr  # his own job's fields
    # Alice's retry still finds her job; a different request of hers names her own fields.
    p = as_user(ALICE, d, "submit", "--default", "--set", "optimizer.lr=0.00123", "--set", "steps=777",
                "--request-id", "nightly-1")
    assert ok(p) == alice and "request id already used" in p.stderr, p.stderr
    p = as_user(ALICE, d, "submit", "--default", "--set", "steps=5", "--request-id", "nightly-1")
    assert p.returncode == 3 and f"already names job {alice}" in p.stderr and "spec.steps" in p.stderr, p.stderr
    # Bob taking an id first does not keep Alice from using it.
    taken = ok(as_user(BOB, d, "submit", "--default", "--request-id", "alice-tomorrow"))
    mine = ok(as_user(ALICE, d, "submit", "--default", "--request-id", "alice-tomorrow"))
    assert mine != taken
    owners = {j["id"]: j["owner"] for j in json.loads(ok(ftctl(d, "list", "-o", "json")))}
    assert (owners[alice], owners[bob], owners[taken], owners[mine]) == (ALICE, BOB, BOB, ALICE), owners
    # The same between two token users over TCP.
    carol, dave = make_token(d, "carol"), make_token(d, "dave")
    c = ok(tcp(d, "submit", "--default", "--set", "steps=3", "--request-id", "shared-id", token=carol))
    p = tcp(d, "submit", "--default", "--set", "steps=4", "--request-id", "shared-id", token=dave)
    assert ok(p) != c and "already" not in p.stderr, p.stderr


# --- tokens ------------------------------------------------------------------------------------

@pytest.fixture
def paused(tmp_path):
    d = Daemon(tmp_path, "--paused")
    yield d
    d.stop()


def test_tokens_unknown_revoked_expired_are_unauthenticated_a_good_one_works(paused, tmp_path):
    daemon = paused
    denied(tcp(daemon, "list"), "UNAUTHENTICATED", "no credentials")
    carol = make_token(daemon, "carol")
    secret = carol.read_text().strip()
    assert secret.startswith("ftd_") and len(secret) == 4 + 12 + 1 + 64
    tid = secret.split("_")[1]
    assert ok(tcp(daemon, "whoami", token=carol)).startswith(f"carol (user) via token {tid}")
    job = ok(tcp(daemon, "submit", "--default", "--set", "steps=1", token=carol))
    assert json.loads(ok(ftctl(daemon, "get", job, "-o", "json")))["owner"] == "carol"

    unknown = tmp_path / "unknown"
    unknown.write_text("ftd_" + "0" * 12 + "_" + "1" * 64)
    denied(tcp(daemon, "list", token=unknown), "UNAUTHENTICATED", "unknown")
    forged = tmp_path / "forged"  # a real id with another secret
    forged.write_text(f"ftd_{tid}_" + "2" * 64)
    denied(tcp(daemon, "list", token=forged), "UNAUTHENTICATED", "unknown")
    garbage = tmp_path / "garbage"
    garbage.write_text("hunter2")
    p = tcp(daemon, "list", token=garbage)
    denied(p, "UNAUTHENTICATED", "not an ftd token")
    assert "hunter2" not in p.stderr

    # listing shows ids, never secrets; a user's token cannot make tokens
    listed = ok(ftctl(daemon, "admin", "token", "list", "-o", "json"))
    assert tid in listed and secret.split("_")[2] not in listed
    denied(tcp(daemon, "admin", "token", "create", "carol", "--role", "admin", token=carol), "PERMISSION_DENIED")

    ok(ftctl(daemon, "admin", "token", "revoke", tid))
    denied(tcp(daemon, "list", token=carol), "UNAUTHENTICATED", "revoked")
    short = make_token(daemon, "carol", "--ttl", "1s")
    ok(tcp(daemon, "list", token=short))
    time.sleep(1.2)
    denied(tcp(daemon, "list", token=short), "UNAUTHENTICATED", "expired")

    # an admin token works over TCP; no secret reaches the daemon's log
    admin = make_token(daemon, "erin", "--role", "admin")
    assert ok(tcp(daemon, "whoami", token=admin)).startswith("erin (admin)")
    ok(tcp(daemon, "cancel", job, token=admin))
    log = daemon.read_log()
    for f in (carol, short, admin):
        assert f.read_text().strip().split("_")[2] not in log


def test_a_token_file_others_may_read_is_used_with_a_warning_naming_it_and_chmod(paused):
    token = make_token(paused, "carol")
    secret = token.read_text().strip()
    p = tcp(paused, "whoami", token=token)  # 0600
    assert ok(p).startswith("carol (user)") and p.stderr == "", p.stderr
    token.chmod(0o644)
    p = tcp(paused, "whoami", token=token)
    assert ok(p).startswith("carol (user)"), p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ftctl: warning: the token file {token} ($FTD_TOKEN_FILE)"), lines
    assert "mode 0644" in lines[0] and f"chmod 600 {token}" in lines[0], lines
    assert secret not in p.stderr and secret.split("_")[2] not in p.stderr


def test_offline_token_commands_work_with_the_daemon_stopped_and_running(tmp_path):
    data = tmp_path / "data"

    def offline(*args):
        return subprocess.run([str(FTD), "token", *args, "--data-dir", str(data)], capture_output=True, text=True,
                              timeout=60)

    # The first admin token, made before ftd ever ran.
    p = offline("create", "dana", "--role", "admin", "--ttl", "2d", "--description", "first admin")
    secret = ok(p)
    assert secret.startswith("ftd_") and "shown only now" in p.stderr and secret not in p.stderr
    tid = secret.split("_")[1]
    token = tmp_path / "dana"
    token.write_text(secret)
    token.chmod(0o600)
    listed = ok(offline("list"))
    assert f"{tid} dana" in listed and "first admin" in listed and secret.split("_")[2] not in listed
    p = offline("create", "Not-A-Name")
    assert p.returncode == 1 and "ftd token: user" in p.stderr, p.stderr
    d = Daemon(tmp_path)
    try:
        assert ok(tcp(d, "whoami", token=token)).startswith(f"dana (admin) via token {tid}")
        # Revoked offline while ftd runs: the next call is refused, and the audit log says who did it.
        ok(offline("revoke", tid))
        denied(tcp(d, "whoami", token=token), "UNAUTHENTICATED", "revoked")
        audit = json.loads(ok(ftctl(d, "admin", "audit", "-o", "json")))["records"]
        actions = [(r["action"], r.get("via", "")) for r in audit]
        assert ("RevokeToken", "ftd token (offline, on auth.db)") in actions, actions
        assert ("CreateToken", "ftd token (offline, on auth.db)") in actions, actions
    finally:
        d.stop()
    assert tid not in ok(offline("list"))
    row = next(line for line in ok(offline("list", "--all")).splitlines() if line.startswith(tid))
    assert row.split()[5] != "-", row  # the REVOKED column has a date


def test_token_is_not_sent_in_clear_off_the_machine(tmp_path):
    token = tmp_path / "t"
    token.write_text("ftd_" + "0" * 12 + "_" + "1" * 64)
    p = subprocess.run([str(FTCTL), "--addr", "192.0.2.1:7070", "list"], capture_output=True, text=True,
                       env=dict(os.environ, FTD_TOKEN_FILE=str(token)), timeout=30)
    assert p.returncode == 3 and "refusing to send a token in clear" in p.stderr, p.stderr
    assert "1" * 64 not in p.stderr


def test_every_method_needs_credentials(daemon):
    """Every method of JobService and AdminService (read from the protos), called over TCP with no
    credentials, is UNAUTHENTICATED: no handler forgets the check."""
    from google.protobuf import descriptor_pb2
    from ftdapi import PROTO
    import subprocess as sp
    out = Path(daemon.data).parent / "all.pb"
    sp.run(["protoc", f"--proto_path={PROTO}", "--include_imports", f"--descriptor_set_out={out}",
            str(PROTO / "ftd/v1/jobs.proto"), str(PROTO / "ftd/v1/admin.proto")], check=True)
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    methods = [(f"/{f.package}.{s.name}/{m.name}", m.server_streaming)
               for f in fds.file if f.package == "ftd.v1" for s in f.service
               if s.name in ("JobService", "AdminService") for m in s.method]
    assert len(methods) >= 11
    checked = 0
    with grpc.insecure_channel(daemon.tcp) as ch:
        for path, streaming in methods:
            call = (ch.unary_stream if streaming else ch.unary_unary)(path, request_serializer=lambda b: b,
                                                                      response_deserializer=lambda b: b)
            with pytest.raises(grpc.RpcError) as e:
                r = call(b"", timeout=10)
                if streaming:
                    list(r)
            if e.value.code() == grpc.StatusCode.UNIMPLEMENTED:
                continue  # declared, not served yet: nothing runs
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, (path, e.value.code(), e.value.details())
            checked += 1
    assert checked >= 11


# --- TLS ---------------------------------------------------------------------------------------

def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(d, name):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}", cwd=d)
    return d / f"{name}.pem"


def make_cert(d, ca, name, cn, days=2, server=False):
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=d)
    ext = d / f"{name}.ext"
    ext.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n" if server
                   else "extendedKeyUsage=clientAuth\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", str(days), "-extfile", str(ext), cwd=d)
    return d / f"{name}.pem", d / f"{name}.key"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    make_ca(d, "ca")
    make_ca(d, "other-ca")
    return {
        "dir": d, "ca": d / "ca.pem", "other_ca": d / "other-ca.pem",
        "server": make_cert(d, "ca", "server", "localhost", server=True),
        "expired_server": make_cert(d, "ca", "old-server", "localhost", days=-1, server=True),
        "dave": make_cert(d, "ca", "dave", "dave"),
        "expired_dave": make_cert(d, "ca", "old-dave", "dave", days=-1),
        "stranger": make_cert(d, "other-ca", "stranger", "dave"),
    }


def tls_daemon(tmp_path, pki, server="server"):
    cert, key = pki[server]
    return Daemon(tmp_path, "--tls-cert", str(cert), "--tls-key", str(key), "--tls-client-ca", str(pki["ca"]))


def context_config(tmp_path, daemon, name, **ctx):
    """An ftctl config file with one context, `name`, at the daemon's TCP port as localhost."""
    cfg = tmp_path / f"ftctl-{name}.json"
    ctx = {"addr": f"localhost:{daemon.port}", **{k: str(v) for k, v in ctx.items()}}
    cfg.write_text(json.dumps({"current_context": name, "contexts": {name: ctx}}))
    return cfg


def via_context(cfg, *args, context=None):
    env = dict(os.environ, FTCTL_CONFIG=str(cfg))
    env.pop("FTD_TOKEN_FILE", None)
    env.pop("FTD_ADDR", None)
    extra = ["--context", context] if context else []
    return subprocess.run([str(FTCTL), *extra, *args, "--timeout", "5"], capture_output=True, text=True, env=env,
                          timeout=60)


def test_tls_token_and_mutual_tls_work_and_wrong_ca_expired_or_plain_are_refused(tmp_path, pki):
    d = tls_daemon(tmp_path, pki)
    try:
        token = make_token(d, "carol")
        good = context_config(tmp_path, d, "good", ca_file=pki["ca"], token_file=token)
        assert ok(via_context(good, "whoami")).startswith("carol (user) via token")
        # mutual TLS: the certificate's CN is the user; no token needed
        cert, key = pki["dave"]
        mtls = context_config(tmp_path, d, "mtls", ca_file=pki["ca"], cert_file=cert, key_file=key)
        assert ok(via_context(mtls, "whoami")).startswith("dave (user) via client certificate CN=dave")
        job = ok(via_context(mtls, "submit", "--default", "--set", "steps=1"))
        assert json.loads(ok(ftctl(d, "get", job, "-o", "json")))["owner"] == "dave"
        # TLS without a client certificate or token: no identity
        anon = context_config(tmp_path, d, "anon", ca_file=pki["ca"])
        denied(via_context(anon, "list"), "UNAUTHENTICATED")
        # a server certificate from a CA the client does not trust
        wrong = context_config(tmp_path, d, "wrong", ca_file=pki["other_ca"], token_file=token)
        p = via_context(wrong, "list")
        assert p.returncode == 3 and "UNAVAILABLE" in p.stderr and "TLS handshake failed" in p.stderr, p.stderr
        # ftd does listen there: the advice is about certificates, not about starting an ftd
        assert f"does not verify against {pki['other_ca']}" in p.stderr and "to start one" not in p.stderr, p.stderr
        # a client certificate that expired, or from another CA: the handshake fails
        cert, key = pki["expired_dave"]
        old = context_config(tmp_path, d, "old", ca_file=pki["ca"], cert_file=cert, key_file=key)
        denied(via_context(old, "list"), "UNAVAILABLE")
        cert, key = pki["stranger"]
        stranger = context_config(tmp_path, d, "stranger", ca_file=pki["ca"], cert_file=cert, key_file=key)
        denied(via_context(stranger, "list"), "UNAVAILABLE")
        # plain text to a TLS port
        denied(tcp(d, "list", token=token), "UNAVAILABLE")
    finally:
        d.stop()


def handshake_lines(daemon):
    return [line for line in daemon.read_log().splitlines() if "TLS handshake" in line]


def test_tls_mistakes_are_told_as_handshake_failures_with_what_to_check(tmp_path, pki):
    """A TLS port talked to in clear, a client certificate from another CA or expired, TLS to a port
    without it: each is a handshake failure named as such, with what to check and no advice to start
    a daemon that runs; ftd logs one line per failed handshake naming the peer."""
    d = tls_daemon(tmp_path, pki)
    (tmp_path / "plain").mkdir()
    plain = Daemon(tmp_path / "plain")
    try:
        token = make_token(d, "carol")

        def fails(cfg, *words):
            p = via_context(cfg, "list")
            assert p.returncode == 3 and "UNAVAILABLE" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
            assert "to start one" not in p.stderr and "no answer" not in p.stderr, p.stderr
            for w in words:
                assert w in p.stderr, (w, p.stderr)

        before = len(handshake_lines(d))
        # A context with no ca_file against the TLS port: ftctl spoke in clear.
        fails(context_config(tmp_path, d, "noca", token_file=token), "speaks TLS", "--ca-file")
        # A client certificate from another CA, or expired: ftd refused it.
        for name in ("stranger", "expired_dave"):
            cert, key = pki[name]
            fails(context_config(tmp_path, d, name, ca_file=pki["ca"], cert_file=cert, key_file=key),
                  "TLS handshake failed", f"refused the client certificate {cert}", "--tls-client-ca")
        # TLS to a port that does not speak it.
        fails(context_config(tmp_path, plain, "tls-to-plain", ca_file=pki["ca"], token_file=token),
              "TLS handshake failed", "does not speak TLS")
        # ftd's log: one line per failed handshake, with the peer.
        lines = handshake_lines(d)[before:]
        assert lines and all(re.search(r"TLS handshake failed with (127\.0\.0\.1|\[::1\]):\d+: ", line) for line in lines), lines
        assert not [line for line in d.read_log().splitlines() if "ssl_transport_security" in line or "Handshake failed" in line]

        # The CA and the client certificate as flags, with no config file.
        cert, key = pki["dave"]
        env = dict(os.environ)
        for k in ("FTD_TOKEN_FILE", "FTD_ADDR", "FTCTL_CONFIG"):
            env.pop(k, None)
        env["FTCTL_CONFIG"] = str(tmp_path / "none.json")
        (tmp_path / "none.json").write_text("{}")
        p = subprocess.run([str(FTCTL), "--addr", f"localhost:{d.port}", "--ca-file", str(pki["ca"]), "--cert-file",
                            str(cert), "--key-file", str(key), "whoami"], capture_output=True, text=True, env=env,
                           timeout=60)
        assert p.returncode == 0 and p.stdout.startswith("dave (user) via client certificate CN=dave"), p.stderr
        p = subprocess.run([str(FTCTL), "--addr", f"localhost:{d.port}", "--ca-file", str(pki["ca"]), "whoami"],
                           capture_output=True, text=True, env=dict(env, FTD_TOKEN_FILE=str(token)), timeout=60)
        assert p.returncode == 0 and p.stdout.startswith("carol (user) via token"), p.stderr
        p = subprocess.run([str(FTCTL), "--addr", f"localhost:{d.port}", "--cert-file", str(cert), "whoami"],
                           capture_output=True, text=True, env=env, timeout=60)
        assert p.returncode == 64 and "--key-file" in p.stderr, p.stderr
    finally:
        d.stop()
        plain.stop()


def test_failed_handshakes_are_logged_rate_limited(tmp_path, pki):
    """A client that fails its handshake over and over: ftd logs one line per failure, with the
    client's address and port, up to a limit (the count of the rest goes with the next line logged,
    handshake_log_test), so the log stays readable."""
    d = tls_daemon(tmp_path, pki)
    try:
        import socket as so
        import ssl
        ctx = ssl.create_default_context(cafile=str(pki["other_ca"]))  # not the CA of ftd's certificate
        ctx.check_hostname = False
        ports = []
        for _ in range(60):
            with so.create_connection(("127.0.0.1", d.port)) as s, s.dup() as raw:
                ports.append(s.getsockname()[1])
                with pytest.raises(ssl.SSLError):
                    ctx.wrap_socket(s, server_hostname="localhost")
                # ftd writes its line, then shuts the connection down: the end of the stream says
                # the line has been written (or left out).
                raw.settimeout(30)
                while raw.recv(1024):
                    pass
        lines = handshake_lines(d)
        assert 1 <= len(lines) < len(ports), lines
        for line in lines:
            m = re.search(r"TLS handshake failed with 127\.0\.0\.1:(\d+): .*alert unknown ca", line)
            assert m and int(m.group(1)) in ports, line
    finally:
        d.stop()


def test_an_expired_server_certificate_is_refused(tmp_path, pki):
    d = tls_daemon(tmp_path, pki, server="expired_server")
    try:
        cfg = context_config(tmp_path, d, "c", ca_file=pki["ca"], token_file=make_token(d, "carol"))
        denied(via_context(cfg, "list"), "UNAVAILABLE", "TLS handshake failed")
    finally:
        d.stop()


def start_ftd(tmp_path, *flags):
    return subprocess.run([str(FTD), "--data-dir", str(tmp_path / "data"), "--socket", str(tmp_path / "s.sock"),
                           "--metrics-listen", "", "--gpus", "0", *flags], capture_output=True, text=True, timeout=10)


def test_non_loopback_listen_without_tls_refuses_to_start(tmp_path, pki):
    p = start_ftd(tmp_path, "--listen", f"0.0.0.0:{free_port()}")
    assert p.returncode == 1 and "not a loopback address and there is no TLS" in p.stderr, p.stderr
    assert "--insecure-listen-without-tls" in p.stderr
    p = start_ftd(tmp_path, "--listen", f"127.0.0.1:{free_port()}", "--tls-cert", str(pki["server"][0]))
    assert p.returncode == 1 and "--tls-cert and --tls-key go together" in p.stderr, p.stderr
    p = start_ftd(tmp_path, "--listen", f"127.0.0.1:{free_port()}", "--tls-cert", str(tmp_path / "none.pem"),
                  "--tls-key", str(tmp_path / "none.key"))
    assert p.returncode == 1 and "none.pem cannot be read" in p.stderr, p.stderr
    # with the loud flag it starts
    proc = subprocess.Popen([str(FTD), "--data-dir", str(tmp_path / "data"), "--socket", str(tmp_path / "s.sock"),
                             "--metrics-listen", "", "--gpus", "0", "--listen", f"0.0.0.0:{free_port()}",
                             "--insecure-listen-without-tls"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: ftctl(f"unix:{tmp_path / 's.sock'}", "list", "--timeout", "1").returncode == 0, 20, "ftd up")
    finally:
        stop_process(proc)


# --- ftctl contexts ----------------------------------------------------------------------------

def test_contexts_select_address_ca_and_token(tmp_path, daemon):
    token = make_token(daemon, "carol")
    cfg = tmp_path / "ftctl.json"
    cfg.write_text(json.dumps({"current_context": "local", "contexts": {
        "local": {"addr": daemon.addr},
        "remote": {"addr": daemon.tcp, "token_file": token.name},  # relative: beside the config file
    }}))
    assert ok(via_context(cfg, "whoami")).startswith("root (admin) via unix socket")
    assert ok(via_context(cfg, "whoami", context="remote")).startswith("carol (user) via token")
    env = dict(os.environ, FTCTL_CONFIG=str(cfg), FTD_CONTEXT="remote")
    env.pop("FTD_ADDR", None)
    p = subprocess.run([str(FTCTL), "whoami"], capture_output=True, text=True, env=env, timeout=30)
    assert ok(p).startswith("carol"), p.stderr
    p = via_context(cfg, "list", context="nope")
    assert p.returncode == 64 and 'context "nope"' in p.stderr and "local, remote" in p.stderr, p.stderr
    # an explicitly named config file that does not exist is an error, not silently the default
    p = via_context(tmp_path / "missing.json", "list")
    assert p.returncode == 64 and "missing.json" in p.stderr and "does not exist" in p.stderr, p.stderr
    # an unreadable token file is named; the token never appears in ps or messages
    cfg.write_text(json.dumps({"contexts": {"r": {"addr": daemon.tcp, "token_file": str(tmp_path / "gone")}}}))
    p = via_context(cfg, "list", context="r")
    assert p.returncode == 64 and "gone" in p.stderr and "cannot be read" in p.stderr, p.stderr


# --- audit -------------------------------------------------------------------------------------

def test_audit_records_every_mutating_call_durably(tmp_path):
    d = Daemon(tmp_path, "--paused")
    try:
        carol = make_token(d, "carol")
        job = ok(ftctl(d, "submit", "--default", "--name", "audited"))
        denied(tcp(d, "cancel", job, token=carol), "PERMISSION_DENIED")
        ok(ftctl(d, "cancel", job))
        denied(tcp(d, "cancel", job), "UNAUTHENTICATED")
        ok(ftctl(d, "list"))  # reads are not audited
        d.stop()
        d.start()  # the record survives a restart
        recs = json.loads(ok(ftctl(d, "admin", "audit", "-o", "json")))["records"]
        got = [(r.get("user", ""), r["action"], r.get("target", ""), r["code"]) for r in reversed(recs)]
        tid = carol.read_text().split("_")[1]
        assert got == [("root", "CreateToken", tid, "OK"), ("root", "SubmitJob", job, "OK"),
                       ("carol", "CancelJob", job, "PERMISSION_DENIED"), ("root", "CancelJob", job, "OK"),
                       ("", "CancelJob", "", "UNAUTHENTICATED")], got
        sub = recs[-2]
        assert "name=audited" in sub["detail"] and sub["via"] == "unix socket uid 0" and "local uid 0" in sub["peer"]
        assert recs[2]["peer"].startswith("ipv4:127.0.0.1:") and "belongs to root" in recs[2]["message"]
        assert "user=carol" in recs[-1]["detail"]
        text = ok(ftctl(d, "admin", "audit", "--user", "carol"))
        assert "CancelJob" in text and "PERMISSION_DENIED" in text and "SubmitJob" not in text
        # The table's columns line up, the token id (12 characters) and long action names included.
        table = ok(ftctl(d, "admin", "audit")).splitlines()
        assert any(tid in row for row in table[1:]), table
        for column in ("USER", "ACTION", "TARGET", "OUTCOME", "FROM / DETAIL"):
            at = table[0].index(column)
            for row in table[1:]:
                assert row[at - 2:at] == "  " and row[at] != " ", (column, table[0], row)
        assert oct((Path(d.data) / "auth.db").stat().st_mode & 0o777) == "0o600"
    finally:
        d.stop()


def test_get_of_another_users_job_is_its_public_row_and_the_spec_is_the_owners(tmp_path, pki):
    """Over TLS with two users' tokens: Bob's get of Alice's job is the row his list shows (no spec, no
    path of hers) and says who may see the rest; the spec, log, profile and changes stay Alice's and
    the admins'."""
    cert, key = pki["server"]
    d = Daemon(tmp_path, "--paused", "--tls-cert", str(cert), "--tls-key", str(key))
    try:
        secret_dir = tmp_path / "alice-private-ckpts"
        alice = context_config(tmp_path, d, "alice", ca_file=pki["ca"], token_file=make_token(d, "alice"))
        bob = context_config(tmp_path, d, "bob", ca_file=pki["ca"], token_file=make_token(d, "bob"))
        job = ok(via_context(alice, "submit", "--default", "--kind", "profile", "--name", "alice-run",
                             "--set", f"checkpoint.dir={json.dumps(str(secret_dir))}"))
        assert str(secret_dir) in ok(via_context(alice, "get", job, "-o", "json"))

        row = json.loads(ok(via_context(bob, "get", job, "-o", "json")))
        assert row["owner"] == "alice" and row["name"] == "alice-run" and row["state"] == "QUEUED", row
        assert row["public_only"] is True and "spec" not in row and row["request_id"] == "", row
        assert row["queue_position"] == 1 and "the scheduler is paused" in row["message"], row
        listed = [j for j in json.loads(ok(via_context(bob, "list", "-o", "json"))) if j["id"] == job]
        assert listed == [row]
        table = ok(via_context(bob, "get", job))
        assert "alice-private" not in table and "visible to alice and admins only" in table, table

        denied(via_context(bob, "get", job, "--spec"), "PERMISSION_DENIED", "belongs to alice", "you are bob")
        for verb in (["logs"], ["profile"], ["resubmit"], ["cancel"], ["delete"], ["watch"]):
            denied(via_context(bob, *verb, job), "PERMISSION_DENIED", "belongs to alice")

        # the owner and an admin see everything; the spec comes back as a file submit takes
        spec = json.loads(ok(via_context(alice, "get", job, "--spec")))
        assert spec["checkpoint"]["dir"] == str(secret_dir), spec
        (tmp_path / "again.json").write_text(json.dumps(spec))
        ok(via_context(alice, "submit", str(tmp_path / "again.json"), "--dry-run"))
        full = json.loads(ok(ftctl(d, "get", job, "-o", "json")))
        assert full["public_only"] is False and full["spec"]["checkpoint"]["dir"] == str(secret_dir), full
        assert json.loads(ok(ftctl(d, "get", job, "--spec")))["checkpoint"]["dir"] == str(secret_dir)
        ok(ftctl(d, "cancel", job))
        ok(ftctl(d, "delete", job))
    finally:
        d.stop()


def test_cross_user_trace_download_is_denied_and_an_admin_passes(paused):
    daemon = paused
    job = ok(ftctl(daemon, "submit", "--default", "--kind", "profile", "--set", "steps=1"))
    bob = make_token(daemon, "bob").read_text().strip()
    admin = make_token(daemon, "erin", "--role", "admin").read_text().strip()
    req = b"\x0a" + bytes([len(job)]) + job.encode()  # GetTraceRequest{id}
    with grpc.insecure_channel(daemon.tcp) as ch:
        get_trace = ch.unary_stream("/ftd.v1.JobService/GetTrace", request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as e:
            list(get_trace(req, metadata=[("authorization", f"Bearer {bob}")], timeout=10))
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED and "belongs to root" in e.value.details()
        try:
            list(get_trace(req, metadata=[("authorization", f"Bearer {admin}")], timeout=10))
        except grpc.RpcError as err:  # the trace may not be written yet: anything but a denial
            assert err.code() not in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED), err


def test_a_local_user_named_with_admin_is_an_admin_on_the_unix_socket(tmp_path, local_users):
    """ftd --admin ALICE: Alice, connecting over the unix socket as her own uid (not root), is an
    admin: whoami says so, and she may do what only admins may (cancel and read another user's job,
    submit for someone else above the priority cap, pause the scheduler, read the audit log, make
    tokens). Bob, not named, is still a plain user; --admin takes effect only through the flag."""
    d_sock = Path(tempfile.mkdtemp(prefix="ftd-admin-"))
    d_sock.chmod(0o755)
    d = Daemon(tmp_path, "--paused", "--admin", ALICE, "--max-user-priority", "10", socket=d_sock / "ftd.sock")
    try:
        uid = pwd.getpwnam(ALICE).pw_uid
        assert ok(as_user(ALICE, d, "whoami")).startswith(f"{ALICE} (admin) via unix socket uid {uid}")
        assert "(user)" in ok(as_user(BOB, d, "whoami"))
        bobs = ok(as_user(BOB, d, "submit", "--default", "--set", "steps=1", "--name", "bobs"))
        assert json.loads(ok(as_user(ALICE, d, "get", bobs, "--spec")))["steps"] == 1
        ok(as_user(ALICE, d, "cancel", bobs))
        got = json.loads(ok(ftctl(d, "get", bobs, "-o", "json")))
        assert got["state"] == "CANCELLED" and got["cancelled_by"] == ALICE, got
        for_bob = ok(as_user(ALICE, d, "submit", "--default", "--owner", BOB, "--priority", "500"))
        got = json.loads(ok(ftctl(d, "get", for_bob, "-o", "json")))
        assert got["owner"] == BOB and got["submitted_by"] == ALICE and got["priority"] == 500, got
        ok(as_user(ALICE, d, "cancel", for_bob))
        ok(as_user(ALICE, d, "resume"))
        ok(as_user(ALICE, d, "pause"))
        audit = ok(as_user(ALICE, d, "admin", "audit"))
        assert "CancelJob" in audit and ALICE in audit, audit
        ok(as_user(ALICE, d, "admin", "token", "create", "ci"))
        # Bob may do none of it.
        alices = ok(as_user(ALICE, d, "submit", "--default", "--set", "steps=1"))
        denied(as_user(BOB, d, "cancel", alices), "PERMISSION_DENIED", f"belongs to {ALICE}")
        denied(as_user(BOB, d, "submit", "--default", "--owner", ALICE), "PERMISSION_DENIED", "only an admin")
        denied(as_user(BOB, d, "submit", "--default", "--priority", "11"), "PERMISSION_DENIED", "priority 11")
        ok(as_user(BOB, d, "submit", "--default", "--priority", "10"))  # at the cap: allowed
        denied(as_user(BOB, d, "admin", "audit"), "PERMISSION_DENIED", "only an admin")
        denied(as_user(BOB, d, "pause"), "PERMISSION_DENIED")
    finally:
        d.stop()
        shutil.rmtree(d_sock, ignore_errors=True)
