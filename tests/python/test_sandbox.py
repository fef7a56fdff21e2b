"""The file sandbox (docs/security.md, "Files"), with real daemons, the real ftctl and real
workers: paths confined to the configured roots at submit, the worker's own confinement at open,
workers off root, file modes, errors that leak nothing, and the attempt token out of `ps`."""
import json
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import grpc
import pytest

from ftdapi import JobService, msg, spec
from ftdservice import FTCTL, FTD, TINY, Daemon, ftctl, get, make_token, submit, wait_for
from test_auth import ALICE, BOB, denied, local_users, ok  # noqa: F401 (a fixture)


def running(daemon, job_id):
    j = get(daemon, job_id)
    if j.get("state") == "RUNNING" and int(j.get("worker_pid", 0)) > 0 and int(j.get("last_step", {}).get("step", 0)) >= 1:
        return j
    return None


def test_the_attempt_token_is_not_on_the_worker_command_line(daemon):
    job = submit(daemon, dict(TINY, steps=100000))
    pid = int(wait_for(lambda: running(daemon, job), 120, "the job to run")["worker_pid"])
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    environ = dict(kv.split(b"=", 1) for kv in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in kv)
    token = environ.get(b"FTD_ATTEMPT_TOKEN", b"")
    assert len(token) >= 16, "the worker got its token in $FTD_ATTEMPT_TOKEN"
    assert b"--token" not in cmdline and not any(token in arg for arg in cmdline), cmdline
    # the environment is its owner's only
    assert os.stat(f"/proc/{pid}/environ").st_mode & 0o077 == 0
    assert ftctl(daemon, "cancel", job).returncode == 0


# --- roots at submit -----------------------------------------------------------------------------

def roots_daemon(tmp_path, *flags):
    """A daemon with per-user roots (BASE/users/{user}, each its user's, 0700) and a shared read-only
    root (BASE/models), on a socket other local users can reach; the test users run ftctl."""
    base = Path(tempfile.mkdtemp(prefix="ftd-roots-"))
    base.chmod(0o755)
    for u in (ALICE, BOB, "root"):
        d = base / "users" / u
        d.mkdir(parents=True)
        pw = pwd.getpwnam(u)
        os.chown(d, pw.pw_uid, pw.pw_gid)
        d.chmod(0o700)
    (base / "users").chmod(0o755)
    (base / "models").mkdir()
    d = Daemon(tmp_path, "--user-root", str(base / "users" / "{user}"), "--read-only-root", str(base / "models"),
               *flags, socket=base / "ftd.sock")
    d.base = base
    return d


@pytest.fixture
def roots(tmp_path, local_users):
    d = roots_daemon(tmp_path)
    yield d
    d.stop()
    shutil.rmtree(d.base, ignore_errors=True)


@pytest.fixture
def paused_roots(tmp_path, local_users):
    d = roots_daemon(tmp_path, "--paused")
    yield d
    d.stop()
    shutil.rmtree(d.base, ignore_errors=True)


def user_ftctl(user, daemon, *args, cwd="/"):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp"}
    return subprocess.run(["runuser", "-u", user, "--", str(FTCTL), "--addr", daemon.addr, *args],
                          capture_output=True, text=True, timeout=60, env=env, cwd=cwd)


def test_checkpoint_dir_outside_the_roots_is_refused_at_submit(roots):
    assert not Path("/etc/ftd-sandbox-x").exists()
    p = user_ftctl(ALICE, roots, "submit", "--default", "--set", "checkpoint.dir=/etc/ftd-sandbox-x")
    denied(p, "PERMISSION_DENIED", "spec.checkpoint.dir: not permitted", "/etc/ftd-sandbox-x")
    assert not Path("/etc/ftd-sandbox-x").exists()
    # an output under the shared read-only root is refused too
    p = user_ftctl(ALICE, roots, "submit", "--default", "--set", f"checkpoint.dir={roots.base}/models/ck")
    denied(p, "PERMISSION_DENIED", "spec.checkpoint.dir: not permitted", "may write")


def test_relative_dot_dot_is_taken_against_the_users_root_and_refused(roots):
    # A raw request (no ftctl to make the path absolute): relative to the caller's root, not ftd's directory.
    svc = JobService(grpc.insecure_channel(roots.addr))
    for path in ("../../x", "../bob-like/x", "a/../../../x"):
        req = msg("SubmitJobRequest")(spec=spec(dict(TINY, checkpoint={"dir": path})))
        with pytest.raises(grpc.RpcError) as e:
            svc.SubmitJob(req, timeout=20)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED, e.value.details()
        assert e.value.details().startswith("spec.checkpoint.dir: not permitted"), e.value.details()
    # ftctl makes a relative path absolute against its directory: from inside Alice's root, ../../x
    # leaves it all the same
    alice_root = roots.base / "users" / ALICE
    p = user_ftctl(ALICE, roots, "submit", "--default", "--set", "checkpoint.dir=../../x", cwd=alice_root)
    denied(p, "PERMISSION_DENIED", "spec.checkpoint.dir: not permitted")
    assert not (roots.base / "x").exists()
    # a relative path inside the root is stored resolved
    ok_job = svc.SubmitJob(msg("SubmitJobRequest")(spec=spec(dict(TINY, steps=1, checkpoint={"dir": "run1/../ck"}))),
                           timeout=20).job
    assert ok_job.spec.checkpoint.dir == str(roots.base / "users" / "root" / "ck"), ok_job.spec.checkpoint.dir


def test_another_users_checkpoint_directory_is_refused(roots):
    alice_ck = roots.base / "users" / ALICE / "ck"
    p = user_ftctl(ALICE, roots, "submit", "--default", "--set", "steps=2", "--set", f"checkpoint.dir={alice_ck}",
                   "--wait")
    assert p.returncode == 0, p.stderr
    step = sorted(alice_ck.glob("step-*"))
    assert step, list(alice_ck.iterdir())
    # Bob may neither resume from nor write into Alice's directory, nor read her weights.
    for setting in (f"checkpoint.dir={alice_ck}", f"model.weights_path={step[-1]}", f"lora.adapter_path={step[-1]}"):
        p = user_ftctl(BOB, roots, "submit", "--default", "--set", setting)
        denied(p, "PERMISSION_DENIED", f"spec.{setting.split('=')[0]}: not permitted")


def test_symlinks_out_of_the_root_and_missing_inputs_are_refused(roots):
    alice_root = roots.base / "users" / ALICE
    (alice_root / "etc").symlink_to("/etc")
    (alice_root / "shadow").symlink_to("/etc/shadow")
    p = user_ftctl(ALICE, roots, "submit", "--default", "--set", f"checkpoint.dir={alice_root}/etc/x")
    denied(p, "PERMISSION_DENIED", "spec.checkpoint.dir: not permitted", "symbolic links")
    p = user_ftctl(ALICE, roots, "submit", "--default", "--set", f"data.path={alice_root}/shadow")
    denied(p, "PERMISSION_DENIED", "spec.data.path: not permitted")
    assert "root:" not in p.stderr
    assert not Path("/etc/x").exists()
    p = user_ftctl(ALICE, roots, "submit", "--default", "--set", f"data.path={alice_root}/nope.bin")
    assert p.returncode != 0 and "spec.data.path" in p.stderr and "does not exist" in p.stderr, p.stderr


def test_a_symlink_swapped_in_after_submit_is_refused_when_the_worker_opens(paused_roots):
    """Paths pass at submit; while the jobs wait, Alice swaps in symbolic links that lead out of her
    root. The worker opens beneath her root's directory (openat2 RESOLVE_BENEATH) and refuses."""
    d = paused_roots
    alice_root = d.base / "users" / ALICE
    tokens = bytes(range(1, 61)) * 40  # uint16 ids below the tiny vocabulary: a valid token file
    (d.base / "outside.bin").write_bytes(tokens)
    (d.base / "outside").mkdir()
    (alice_root / "train.bin").write_bytes(tokens)
    specs = [dict(TINY, steps=1, data={"path": str(alice_root / "train.bin")}),
             dict(TINY, steps=1, checkpoint={"dir": str(alice_root / "ck")})]
    jobs = []
    for i, job_spec in enumerate(specs):
        spec_file = d.base / f"spec-{i}.json"
        spec_file.write_text(json.dumps(job_spec))
        spec_file.chmod(0o644)
        jobs.append(ok(user_ftctl(ALICE, d, "submit", str(spec_file), "--max-attempts", "1")))
    (alice_root / "train.bin").unlink()
    (alice_root / "train.bin").symlink_to(d.base / "outside.bin")
    (alice_root / "ck").symlink_to(d.base / "outside")
    ok(ftctl(d, "resume"))
    for job, field in zip(jobs, ("spec.data.path", "spec.checkpoint.dir")):
        got = wait_for(lambda: finished(ALICE, d, job), 120, f"job {job} to end")
        assert got["state"] == "FAILED" and f"{field}: not permitted" in got["message"], got
    assert list((d.base / "outside").iterdir()) == []


def test_a_jsonl_file_or_tokenizer_swapped_for_a_link_out_is_refused_when_the_worker_opens(paused_roots):
    """The JSONL dataset and the tokenizer are opened beneath the root too: links swapped in after
    submit fail the job naming the field."""
    d = paused_roots
    alice_root = d.base / "users" / ALICE
    outside = d.base / "outside"
    outside.mkdir()
    (outside / "train.jsonl").write_text('{"text": "secret line"}\n')
    (outside / "tokenizer.json").write_text("{}")
    jobs = []
    for i, field in enumerate(("spec.data.path", "spec.data.tokenizer_path")):
        (alice_root / f"train{i}.jsonl").write_text('{"text": "hello"}\n')
        (alice_root / f"tok{i}").mkdir()
        (alice_root / f"tok{i}" / "tokenizer.json").write_text("{}")
        data = {"path": str(alice_root / f"train{i}.jsonl"), "format": "text",
                "tokenizer_path": str(alice_root / f"tok{i}"), "cache_dir": str(alice_root / "cache")}
        spec_file = d.base / f"spec-{i}.json"
        spec_file.write_text(json.dumps(dict(TINY, steps=1, data=data)))
        spec_file.chmod(0o644)
        jobs.append((ok(user_ftctl(ALICE, d, "submit", str(spec_file), "--max-attempts", "1")), field))
    (alice_root / "train0.jsonl").unlink()
    (alice_root / "train0.jsonl").symlink_to(outside / "train.jsonl")
    (alice_root / "tok1" / "tokenizer.json").unlink()
    (alice_root / "tok1" / "tokenizer.json").symlink_to(outside / "tokenizer.json")
    ok(ftctl(d, "resume"))
    for job, field in jobs:
        got = wait_for(lambda: finished(ALICE, d, job), 120, f"job {job} to end")
        assert got["state"] == "FAILED" and f"{field}: not permitted" in got["message"], got


# --- errors leak nothing -------------------------------------------------------------------------

@pytest.fixture
def open_daemon(tmp_path, local_users):
    """A daemon without roots (the default) on a socket other local users can reach."""
    base = Path(tempfile.mkdtemp(prefix="ftd-open-"))
    base.chmod(0o755)
    d = Daemon(tmp_path, socket=base / "ftd.sock")
    d.base = base
    yield d
    d.stop()
    shutil.rmtree(base, ignore_errors=True)


def finished(user, daemon, job_id):
    got = json.loads(user_ftctl(user, daemon, "get", job_id, "-o", "json").stdout or "{}")
    return got if got.get("state") in ("SUCCEEDED", "FAILED", "CANCELLED") else None


def test_a_local_user_cannot_point_a_job_at_files_she_may_not_read(open_daemon):
    """Without roots the workers open a spec's paths with their own rights (root's here). Alice
    pointing jobs at root's files once had them fail on what the files held ("not a multiple of 2
    bytes" told a file's size parity; a parser's error its first bytes). Now her submit is refused,
    naming the field, as "permission denied": what she may not read herself is not read for her, and
    whether it exists is not told either. Her own files still work."""
    d = open_daemon
    secret = d.base / "secret"
    secret.mkdir(mode=0o700)
    odd = secret / "odd.bin"
    odd.write_bytes(b"hunter2-secret-bytes!")  # 21 bytes: not a uint16 token file
    config = secret / "config.json"
    config.write_text('{"hidden_size": "hunter2-secret')  # the parser quotes an unterminated string
    shadow = d.base / "shadow.bin"
    shadow.write_bytes(b"hunter2-secret-bytes!")
    for f in (odd, config, shadow):
        f.chmod(0o600)
    cases = [(dict(TINY, data={"path": str(odd)}), "spec.data.path", "reach"),
             (dict(TINY, data={"path": str(secret / "no-such.bin")}), "spec.data.path", "reach"),
             (dict(TINY, data={"path": str(shadow)}), "spec.data.path", "read"),
             (dict(TINY, model={"config_path": str(config)}), "spec.model.config_path", "reach"),
             (dict(TINY, checkpoint={"dir": str(secret / "ck")}), "spec.checkpoint.dir", "write")]
    for i, (job_spec, field, verb) in enumerate(cases):
        spec_file = d.base / f"spec-{i}.json"
        spec_file.write_text(json.dumps(dict(job_spec, steps=1)))
        spec_file.chmod(0o644)
        p = user_ftctl(ALICE, d, "submit", str(spec_file))
        denied(p, "PERMISSION_DENIED", f"{field}: permission denied: {ALICE} (uid", f"may not {verb}")
        for leak in ("hunter2", "secret-bytes", "21 bytes", "20 bytes", "multiple of", "does not exist"):
            assert leak not in p.stderr, (leak, p.stderr)
    # A file she may read is hers to use; root (an admin) is not held to this.
    mine = d.base / "mine.bin"
    mine.write_bytes(bytes(b for i in range(1, 61) for b in (i, 0)) * 40)  # uint16 ids 1..60
    mine.chmod(0o644)
    spec_file = d.base / "spec-mine.json"
    spec_file.write_text(json.dumps(dict(TINY, steps=1, data={"path": str(mine)})))
    spec_file.chmod(0o644)
    job = ok(user_ftctl(ALICE, d, "submit", str(spec_file)))
    got = wait_for(lambda: finished(ALICE, d, job), 120, "Alice's job on her readable file to end")
    assert got["state"] == "SUCCEEDED", got
    assert ok(ftctl(d, "submit", str(d.base / "spec-2.json"), "--dry-run"))


# --- modes ---------------------------------------------------------------------------------------

def test_the_data_directory_databases_logs_and_checkpoints_are_the_owners_only(daemon):
    job = submit(daemon, dict(TINY, steps=2))
    assert ftctl(daemon, "wait", job, timeout=120).returncode == 0
    assert ftctl(daemon, "admin", "token", "list").returncode == 0  # auth.db in use
    data = Path(daemon.data)
    assert data.stat().st_mode & 0o777 == 0o700, oct(data.stat().st_mode)
    files = [data / "ftd.db", data / "auth.db"] + [p for p in (data / "jobs").rglob("*")]
    assert any(p.name == "worker.log" for p in files) and any("step-" in str(p) for p in files), files
    for p in files:
        mode = p.stat().st_mode & 0o777
        assert mode == (0o700 if p.is_dir() else 0o600), (str(p), oct(mode))


def test_an_id_outside_the_vocabulary_is_named_only_in_the_callers_own_files(roots):
    """A token file with an id beyond the tiny vocab: under Alice's own root her job's message names
    the id and its position; under the shared read-only root (a file that may be another user's) it
    says only that the file holds ids outside the vocabulary."""
    bytes_ = b"hunter2-secret-bytes"  # uint16 ids: 0x7568 = 30056 first, far beyond the tiny vocab of 64
    own = roots.base / "users" / ALICE / "tokens.bin"
    shared_file = roots.base / "models" / "tokens.bin"
    for f in (own, shared_file):
        f.write_bytes(bytes_)
        f.chmod(0o644)
    pw = pwd.getpwnam(ALICE)
    os.chown(own, pw.pw_uid, pw.pw_gid)
    got = {}
    for path in (own, shared_file):
        p = user_ftctl(ALICE, roots, "submit", "--default", "--set", "steps=1", "--set", f"data.path={path}")
        job = ok(p).strip()
        got[path] = wait_for(lambda: finished(ALICE, roots, job), 120, f"the job on {path} to end")
        assert got[path]["state"] == "FAILED", got[path]
    assert "not a valid token file for this model: token 0 is id 30056, outside the model's vocab_size 64" \
        in got[own]["message"], got[own]
    text = got[shared_file]["message"] + got[shared_file].get("result", {}).get("message", "")
    assert "not a valid token file for this model: it holds ids outside the model's vocab_size 64" in text, text
    for leak in ("30056", "token 0", "hunter2"):
        assert leak not in text, (leak, text)


# --- workers off root ----------------------------------------------------------------------------

@pytest.fixture
def worker_user_daemon():
    if os.geteuid() != 0:
        pytest.skip(f"ftd switches its workers to --worker-user only when it runs as root (this test runs as uid "
                    f"{os.geteuid()}; CI runs as root)")
    base = Path(tempfile.mkdtemp(prefix="ftd-worker-user-"))
    base.chmod(0o755)  # pytest's tmp_path is root's only: the workers' user could not reach the data directory
    d = Daemon(base, "--worker-user", "nobody")
    d.base = base
    yield d
    d.stop()
    shutil.rmtree(base, ignore_errors=True)


def test_workers_run_as_the_worker_user_and_cannot_read_roots_files(worker_user_daemon):
    d = worker_user_daemon
    nobody = pwd.getpwnam("nobody")
    job = submit(d, dict(TINY, steps=2))
    got = wait_for(lambda: finished("root", d, job), 120, "the job to end")
    assert got["state"] == "SUCCEEDED", got
    job_dir = d.data / "jobs" / job
    written = [p for p in job_dir.rglob("*") if "step-" in str(p)]
    assert written, list(job_dir.rglob("*"))
    for p in [job_dir] + written:
        assert p.stat().st_uid == nobody.pw_uid, (str(p), p.stat().st_uid)
    assert (d.data.stat().st_mode & 0o777) == 0o711  # passable to the workers' user, not listable
    # A token file only root may read: the worker cannot open it, the job fails naming the field.
    secret = d.base / "secret.bin"
    secret.write_bytes(bytes(range(1, 61)) * 40)  # a valid token file, which a root worker would train on
    secret.chmod(0o600)
    job = submit(d, dict(TINY, steps=1, data={"path": str(secret)}), "--max-attempts", "1")
    got = wait_for(lambda: finished("root", d, job), 120, "the job on the root-only file to end")
    assert got["state"] == "FAILED" and "spec.data.path" in got["message"], got
    assert "ermission denied" in got["message"], got
    # The job's directory is the workers' user's: a link it plants there is never followed by ftd.
    log = d.data / "jobs" / job / "worker.log"
    log.unlink()
    secret.write_text("root-only-secret\n")
    log.symlink_to(secret)
    p = ftctl(d, "logs", job)
    assert "root-only-secret" not in p.stdout + p.stderr, p.stdout


def test_a_file_under_a_root_the_worker_user_may_not_read_is_permission_denied(tmp_path):
    """With a read-only root, a file in it that the workers' user may not read (mode 0600, root's) fails
    its job as "Permission denied", which it is, and not as a path outside the job's directories."""
    if os.geteuid() != 0:
        pytest.skip("ftd switches its workers to --worker-user only when it runs as root (CI runs as root)")
    base = Path(tempfile.mkdtemp(prefix="ftd-ro-root-"))
    try:
        base.chmod(0o755)
        ro = base / "ro"
        ro.mkdir()
        secret = ro / "secret.bin"
        secret.write_bytes(bytes(range(1, 61)) * 40)
        secret.chmod(0o600)
        d = Daemon(base, "--worker-user", "nobody", "--read-only-root", str(ro), "--user-root", str(base / "u-{user}"))
        try:
            (base / "u-root").mkdir(exist_ok=True)
            job = submit(d, dict(TINY, steps=1, data={"path": str(secret)}), "--max-attempts", "1")
            got = wait_for(lambda: finished("root", d, job), 120, "the job to end")
            assert got["state"] == "FAILED" and "spec.data.path" in got["message"], got
            assert "Permission denied" in got["message"], got["message"]
            assert "outside the directories" not in got["message"], got["message"]
        finally:
            d.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_worker_user_needs_a_daemon_running_as_root(tmp_path):
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser to start ftd as another user")
    p = subprocess.run(["runuser", "-u", "nobody", "--", str(FTD), "--worker-user", "nobody", "--data-dir",
                        "/nonexistent/ftd", "--listen", ""], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "--worker-user nobody needs ftd to run as root" in p.stderr, p.stderr


# --- workers as the job's local owner ------------------------------------------------------------

@pytest.fixture
def owner_daemon(local_users):
    """ftd as root with --workers-as-owner (and nobody for the other jobs), its data directory and
    socket where the test users may reach them."""
    base = Path(tempfile.mkdtemp(prefix="ftd-as-owner-"))
    base.chmod(0o755)
    d = Daemon(base, "--worker-user", "nobody", "--workers-as-owner", socket=base / "ftd.sock")
    d.base = base
    yield d
    d.stop()
    shutil.rmtree(base, ignore_errors=True)


def spec_file_for(d, name, job_spec):
    path = d.base / name
    path.write_text(json.dumps(job_spec))
    path.chmod(0o644)
    return str(path)


def can_read(user, path):
    return subprocess.run(["runuser", "-u", user, "--", "cat", str(path)], capture_output=True,
                          timeout=60).returncode == 0


def test_a_local_users_job_runs_as_that_user_and_its_files_are_theirs_alone(owner_daemon):
    d = owner_daemon
    alice, nobody = pwd.getpwnam(ALICE), pwd.getpwnam("nobody")
    job = ok(user_ftctl(ALICE, d, "submit", spec_file_for(d, "tiny.json", dict(TINY, steps=2))))
    got = wait_for(lambda: finished(ALICE, d, job), 120, "Alice's job to end")
    assert got["state"] == "SUCCEEDED", got
    assert got["owner_uid"] == alice.pw_uid, got
    job_dir = d.data / "jobs" / job
    written = [job_dir, job_dir / "worker.log"] + [p for p in job_dir.rglob("*") if "step-" in str(p)]
    assert len(written) > 2, list(job_dir.rglob("*"))
    for p in written:
        st = p.lstat()
        assert (st.st_uid, st.st_gid) == (alice.pw_uid, alice.pw_gid), (str(p), st.st_uid, st.st_gid)
        assert st.st_mode & 0o077 == 0, (str(p), oct(st.st_mode))
    weights = next(p for p in written if p.is_file() and "step-" in str(p))
    assert can_read(ALICE, weights) and can_read(ALICE, job_dir / "worker.log")
    assert not can_read(BOB, weights) and not can_read(BOB, job_dir / "worker.log")
    # Bob's file, his only: Alice's worker cannot open it, though ftd (root) could.
    bobs = d.base / "bob-tokens.bin"
    bobs.write_bytes(bytes(range(1, 61)) * 40)  # a valid token file
    os.chown(bobs, pwd.getpwnam(BOB).pw_uid, pwd.getpwnam(BOB).pw_gid)
    bobs.chmod(0o600)
    job = ok(user_ftctl(ALICE, d, "submit", spec_file_for(d, "bobs.json", dict(TINY, steps=1, data={"path": str(bobs)})),
                        "--max-attempts", "1"))
    got = wait_for(lambda: finished(ALICE, d, job), 120, "Alice's job on Bob's file to end")
    assert got["state"] == "FAILED" and "spec.data.path" in got["message"], got
    assert "ermission denied" in got["message"], got
    # Root's own job, and a job Alice submits with a token over TCP, run as the service user.
    token = make_token(d, ALICE)
    e = dict(os.environ, FTD_TOKEN_FILE=str(token))
    by_token = ok(ftctl(d.tcp, "submit", spec_file_for(d, "t.json", dict(TINY, steps=1)), env=e))
    by_root = submit(d, dict(TINY, steps=1))
    for job in (by_token, by_root):
        got = wait_for(lambda: finished("root", d, job), 120, f"job {job} to end")
        assert got["state"] == "SUCCEEDED", got
        assert (d.data / "jobs" / job).stat().st_uid == nobody.pw_uid, job
    assert "owner_uid" not in get(d, by_token) and get(d, by_root)["owner_uid"] == 0


def test_workers_as_owner_need_a_service_user_for_the_other_jobs(tmp_path):
    p = subprocess.run([str(FTD), "--workers-as-owner", "--data-dir", str(tmp_path / "data"), "--listen", ""],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "--workers-as-owner needs --worker-user NAME" in p.stderr, p.stderr
