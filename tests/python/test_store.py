"""The job store through a real ftd: the queue limit under concurrent submits, a retried request id
while the queue is full, listing pages in both orders, and a full disk under the data directory."""
import json
import os
import sqlite3
import subprocess
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from ftdapi import JobService, enum, msg, spec
from ftdservice import FTCTL, FTD, TINY, Daemon, ftctl, get, submit, wait_for

QUEUED = enum("JobState", "QUEUED")


def submit_req(request_id=None, **kw):
    return msg("SubmitJobRequest")(spec=spec(TINY), request_id=request_id or uuid.uuid4().hex, **kw)


def list_all(svc, page_size=50, **filters):
    ids, token = [], ""
    for _ in range(10000):
        resp = svc.ListJobs(msg("ListJobsRequest")(page_size=page_size, page_token=token, **filters), timeout=30)
        ids += [j.id for j in resp.jobs]
        token = resp.next_page_token
        if not token:
            return ids
    raise AssertionError("ListJobs never reached its last page")


def cancel_all(svc, ids):
    for i in ids:
        svc.CancelJob(msg("CancelJobRequest")(id=i), timeout=30)


def test_queue_limit_holds_under_concurrent_submits(tmp_path):
    """30 clients submit at the same instant against --max-queued 5, ten rounds over gRPC (a channel
    each) and three with 30 ftctl processes: exactly 5 are queued each round, the others are told
    the queue is full."""
    limit, clients = 5, 30
    d = Daemon(tmp_path, "--paused", "--max-queued", str(limit))
    try:
        channels = [grpc.insecure_channel(d.addr) for _ in range(clients)]
        for ch in channels:
            grpc.channel_ready_future(ch).result(timeout=20)
        stubs = [JobService(ch) for ch in channels]
        svc = stubs[0]
        for rnd in range(10):
            barrier = threading.Barrier(clients)

            def one(i):
                req = submit_req(name=f"r{rnd}-{i}")
                barrier.wait(timeout=30)
                try:
                    return "created" if stubs[i].SubmitJob(req, timeout=60).created else "existing"
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.details()
                    assert f"limit {limit}" in e.details(), e.details()
                    return "full"

            with ThreadPoolExecutor(clients) as ex:
                results = list(ex.map(one, range(clients)))
            queued = list_all(svc, states=[QUEUED])
            assert (results.count("created"), results.count("full"), len(queued)) == (limit, clients - limit, limit), \
                f"round {rnd}: {results.count('created')} created, {len(queued)} queued"
            cancel_all(svc, queued)

        spec_path = tmp_path / "spec.json"
        spec_path.write_text(json.dumps(TINY))
        for rnd in range(3):
            procs = [subprocess.Popen([str(FTCTL), "--addr", d.addr, "submit", str(spec_path)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for _ in range(clients)]
            outs = [(p.wait(timeout=120), *p.communicate()) for p in procs]
            ok = [o for o in outs if o[0] == 0]
            refused = [o for o in outs if o[0] != 0]
            assert all("RESOURCE_EXHAUSTED" in err and "the queue is full" in err for _, _, err in refused), refused
            queued = list_all(svc, states=[QUEUED])
            assert (len(ok), len(queued)) == (limit, limit), f"ftctl round {rnd}: {len(ok)} accepted"
            cancel_all(svc, queued)
        for ch in channels:
            ch.close()
    finally:
        d.stop()


def test_retried_request_id_gets_its_job_when_the_queue_is_full(tmp_path):
    """A client whose first answer was lost retries with the same request id after the queue filled:
    it is told about its job, not that the queue is full."""
    d = Daemon(tmp_path, "--paused", "--max-queued", "2")
    try:
        spec_path = tmp_path / "spec.json"
        spec_path.write_text(json.dumps(TINY))
        first = ftctl(d, "submit", str(spec_path), "--request-id", "req-1")
        assert first.returncode == 0, first.stderr
        assert ftctl(d, "submit", str(spec_path), "--request-id", "req-2").returncode == 0
        full = ftctl(d, "submit", str(spec_path), "--request-id", "req-3")
        assert full.returncode != 0 and "RESOURCE_EXHAUSTED" in full.stderr and "queue is full" in full.stderr, \
            full.stderr
        retry = ftctl(d, "submit", str(spec_path), "--request-id", "req-1")
        assert retry.returncode == 0, retry.stderr
        assert retry.stdout.strip() == first.stdout.strip()
        assert "request id already used" in retry.stderr
    finally:
        d.stop()


def test_list_pages_in_both_orders_with_filters(tmp_path):
    d = Daemon(tmp_path, "--paused", "--max-queued", "100")
    try:
        with grpc.insecure_channel(d.addr) as ch:
            svc = JobService(ch)
            owners = {}
            for i in range(23):
                owner = ["ana", "bob"][i % 3 == 0]
                owners[svc.SubmitJob(submit_req(owner=owner), timeout=30).job.id] = owner
            ids = list(owners)
            cancelled = ids[::4]
            cancel_all(svc, cancelled)
            assert list_all(svc, page_size=4) == ids
            assert list_all(svc, page_size=4, newest_first=True) == ids[::-1]
            bob_queued = [i for i in ids if owners[i] == "bob" and i not in cancelled]
            assert list_all(svc, page_size=2, owner="bob", states=[QUEUED]) == bob_queued
            assert list_all(svc, page_size=3, owner="bob", states=[QUEUED], newest_first=True) == bob_queued[::-1]
            assert list_all(svc, page_size=5, states=[enum("JobState", "CANCELLED")], newest_first=True) == \
                cancelled[::-1]
    finally:
        d.stop()


def mounted_tmpfs(tmp_path, size):
    """A tmpfs of `size` ("8m") mounted on tmp_path/data, unmounted after the test; skips where the
    test may not mount."""
    data = tmp_path / "data"
    data.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "ftd-test-tmpfs", str(data)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill ({p.stderr.strip()}): run as root to test a full disk")
    try:
        yield data
    finally:
        subprocess.run(["umount", "-l", str(data)], check=False)


@pytest.fixture
def small_disk(tmp_path):
    """An 8 MiB tmpfs on tmp_path/data."""
    yield from mounted_tmpfs(tmp_path, "8m")


def write_until_full(f):
    """Writes to the open file `f` until its filesystem has no room left."""
    block = b"f" * (64 << 10)
    for size in (len(block), 1):
        try:
            while True:
                f.write(block[:size])
        except OSError as e:
            assert e.errno == 28, e  # ENOSPC


def fill(path):
    """Writes `path` until the filesystem has no room left."""
    with open(path, "wb", buffering=0) as f:
        write_until_full(f)


class KeepFull:
    """Fills `path`'s filesystem and keeps it full: a thread takes back at once whatever room is freed
    (a checkpoint pruned after its successor was written frees exactly the room the next one needs, so a
    single fill could leave the job writing and pruning forever)."""

    def __init__(self, path):
        self.path, self.stop_ = path, threading.Event()
        fill(path)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        with open(self.path, "ab", buffering=0) as f:
            while not self.stop_.is_set():
                write_until_full(f)
                self.stop_.wait(0.002)

    def stop(self):
        """Stops topping up; the filler stays, and room freed from now on stays free."""
        self.stop_.set()
        self.thread.join()

    def release(self):
        """Stops topping up and removes the filler."""
        self.stop()
        os.remove(self.path)


def start_ftd(tmp_path, data):
    """ftd started on `data`, as a user starts it; its exit code and stderr once it stops."""
    p = subprocess.run([str(FTD), "--listen", "", "--metrics-listen", "", "--socket", str(tmp_path / "start.sock"),
                        "--data-dir", str(data), "--gpus", "0"], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stderr


def test_ftd_on_a_full_disk_does_not_start_and_says_so_in_one_line(tmp_path, small_disk):
    """Its databases there from an earlier run, no byte left: one line naming the directory, the disk
    and its free space, not the SQLite statement that failed."""
    d = Daemon(tmp_path, unix_socket=True)
    d.stop()
    fill(small_disk / "filler")
    rc, err = start_ftd(tmp_path, small_disk)
    lines = err.strip().splitlines()
    assert rc != 0 and len(lines) == 1, err
    assert "cannot start" in lines[0] and str(small_disk) in lines[0] and "is full" in lines[0], lines[0]
    assert "ftd-test-tmpfs (tmpfs)" in lines[0] and "0 B of" in lines[0] and "free" in lines[0], lines[0]
    assert "PRAGMA" not in lines[0] and "this write" not in lines[0], lines[0]


def test_ftd_where_no_file_can_be_made_does_not_start_and_says_so_in_one_line(tmp_path):
    """A new data directory on a disk with no inode left: the same one line, not "cannot create"."""
    disk = tmp_path / "disk"
    disk.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,nr_inodes=16", "ftd-test-tmpfs", str(disk)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill ({p.stderr.strip()}): run as root to test a full disk")
    try:
        for i in range(100):
            try:
                (disk / f"f{i}").touch()
            except OSError as e:
                assert e.errno == 28, e  # ENOSPC: no inode left
                break
        else:
            raise AssertionError("100 files on a tmpfs of 16 inodes")
        rc, err = start_ftd(tmp_path, disk / "ftd")
        lines = err.strip().splitlines()
        assert rc != 0 and len(lines) == 1, err
        assert "cannot start" in lines[0] and str(disk / "ftd") in lines[0] and "no inode free" in lines[0], lines[0]
        assert " free" in lines[0] and " of " in lines[0], lines[0]
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_full_disk_submit_is_resource_exhausted_and_recovers(tmp_path, small_disk):
    """With the data directory's disk full, SubmitJob answers RESOURCE_EXHAUSTED naming the disk and
    the directory (not INTERNAL), reads still work, and once space is freed submits succeed and every
    acknowledged job is there."""
    d = Daemon(tmp_path, "--paused", "--max-queued", "10000")
    try:
        with grpc.insecure_channel(d.addr) as ch:
            svc = JobService(ch)
            acked = [svc.SubmitJob(submit_req(name="before"), timeout=30).job.id for _ in range(3)]
            filler = small_disk / "filler"
            fill(filler)
            err = None
            for _ in range(200):  # SQLite may still have room inside its files for a few
                try:
                    acked.append(svc.SubmitJob(submit_req(name="x" * 200), timeout=30).job.id)
                except grpc.RpcError as e:
                    err = e
                    break
            assert err is not None, "200 submits on a full disk all succeeded"
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (err.code(), err.details())
            assert "the disk is full" in err.details() and str(small_disk) in err.details(), err.details()
            assert "ftd-test-tmpfs (tmpfs)" in err.details(), err.details()

            cli = ftctl(d, "submit", "--default", "--set", "device=cpu")
            assert cli.returncode != 0 and "RESOURCE_EXHAUSTED" in cli.stderr and "disk is full" in cli.stderr, \
                cli.stderr
            assert list_all(svc) == acked  # reads still work, and nothing half-written shows

            os.remove(filler)
            acked.append(svc.SubmitJob(submit_req(name="after"), timeout=30).job.id)
            assert list_all(svc) == acked
            assert int(acked[-1][2:]) == int(acked[-2][2:]) + 1, acked  # the refused submits left no trace
        db = sqlite3.connect(f"file:{small_disk / 'ftd.db'}?mode=ro", uri=True)
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        db.close()
    finally:
        d.stop()


def test_a_change_whose_audit_record_cannot_be_written_is_refused(tmp_path, small_disk):
    """docs/security.md: a mutating call's audit record is committed before its answer. With the disk
    full, records were dropped (a line in ftd's log each) while the calls went ahead. Now a call whose
    record cannot be written is refused and changes nothing; every call that went ahead has its record.
    Pausing and resuming the scheduler change no job, so only the audit log can refuse them."""
    d = Daemon(tmp_path)
    try:
        with grpc.insecure_channel(d.addr) as ch:
            svc = JobService(ch)
            done, refused = ["PauseScheduler", "ResumeScheduler"], None
            svc.PauseScheduler(msg("SchedulerRequest")(), timeout=30)
            svc.ResumeScheduler(msg("SchedulerRequest")(), timeout=30)
            fill(small_disk / "filler")
            for i in range(400):
                pause = i % 2 == 0
                call = svc.PauseScheduler if pause else svc.ResumeScheduler
                try:
                    state = call(msg("SchedulerRequest")(), timeout=30)
                    assert state.paused == pause
                    done.append("PauseScheduler" if pause else "ResumeScheduler")
                except grpc.RpcError as e:
                    refused = e
                    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (e.code(), e.details())
                    assert "audit log" in e.details() and "disk is full" in e.details(), e.details()
                    # Nothing changed: the scheduler is as the last call that went ahead left it.
                    assert svc.GetScheduler(msg("SchedulerRequest")(), timeout=30).paused == (not pause)
                    break
            assert refused is not None, "400 audited calls on a full disk all went ahead"
            os.remove(small_disk / "filler")
        records = json.loads(ftctl(d, "admin", "audit", "--limit", "1000", "-o", "json").stdout).get("records", [])
        recorded = [r["action"] for r in reversed(records) if r["action"] in ("PauseScheduler", "ResumeScheduler")]
        assert recorded[:len(done)] == done, (len(recorded), len(done))
        assert all(r["code"] == "OK" for r in records if r["action"] in ("PauseScheduler", "ResumeScheduler")
                   and r.get("message", "") == ""), records[:3]
        assert "refusing the call" in d.read_log()
    finally:
        d.stop()


@pytest.fixture
def job_disk(tmp_path):
    """A 48 MiB tmpfs on tmp_path/data: room for a few checkpoints of the tiny model."""
    yield from mounted_tmpfs(tmp_path, "48m")


def test_a_disk_that_fills_under_a_running_job(tmp_path, job_disk):
    """The real worker trains with its checkpoints and the daemon's database on a small tmpfs that
    fills while it runs. The worker fails writing a checkpoint; the daemon, which cannot write that
    outcome either, keeps it in memory and says why, naming the filesystem. ftd killed and started
    again while the disk is still full starts (before: it exited, its restart write refused), serves
    reads and refuses submits naming the disk. Once space is freed it records the restart, requeues
    the job, and the next attempt resumes from the last complete checkpoint to the final step: every
    acknowledged step and checkpoint kept."""
    # The disk is filled in milliseconds and kept full, so the job cannot end first; few enough steps that
    # the second attempt finishes quickly on a loaded machine.
    steps = 100
    spec_ = dict(TINY, batch_size=2, seq_len=16, steps=steps, checkpoint={"every_steps": 2, "keep_last": 1})
    d = Daemon(tmp_path, "--max-attempts", "2")
    filler = None
    try:
        job = submit(d, spec_)
        ck = job_disk / "jobs" / job / "checkpoints"
        wait_for(lambda: ck.exists() and any(p.name == "step-00000002" for p in ck.iterdir()), 120, "a checkpoint")
        filler = KeepFull(job_disk / "filler")
        wait_for(lambda: "CANNOT RECORD the outcome of job " + job in d.read_log(), 120, "the worker to fail")
        # From here the disk stays full but room ftd frees is not taken back: ftd's own start frees and
        # re-takes room (SQLite's WAL files); a filler still topping up made that start fail with an I/O error.
        filler.stop()
        line = [l for l in d.read_log().splitlines() if "CANNOT RECORD the outcome of job " + job in l][0]
        assert "No space left on device" in line and "the disk is full" in line, line
        assert "ftd-test-tmpfs (tmpfs)" in line, line
        assert get(d, job)["state"] == "RUNNING"
        kept = sorted(p.name for p in ck.iterdir() if not p.name.endswith(".tmp"))

        d.kill()
        d.start()  # the disk still full
        assert "CANNOT RECORD that job " + job + " was running when ftd restarted" in d.read_log()
        assert get(d, job)["state"] == "RUNNING"
        cli = ftctl(d, "submit", "--default", "--set", "device=cpu")
        assert cli.returncode != 0 and "disk is full" in cli.stderr, cli.stderr

        filler.release()
        filler = None
        done = wait_for(lambda: (lambda j: j if j["state"] in ("FAILED", "SUCCEEDED", "CANCELLED") else None)(
            get(d, job)), 300, "the job to end once there is room")
        assert done["state"] == "SUCCEEDED", done
        assert int(done["attempt"]) == 2 and int(done["result"]["steps_done"]) == steps, done
        log = ftctl(d, "logs", job).stdout
        assert f"resumed from {ck / kept[-1]}" in log, (kept, log[-3000:])
    finally:
        d.stop()
        if filler is not None:
            filler.release()
