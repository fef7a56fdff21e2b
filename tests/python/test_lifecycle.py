"""A job's lifecycle as users drive it with ftctl, against real ftd daemons on loopback: request-id
reuse, attempt counts, logs, delete/prune/retention, resubmit, scheduler pause/resume, cancel with
and without a checkpoint. Jobs are acted out by ftd-fake-worker where training is beside the point.
Every wait is bounded."""
import signal
import subprocess
import time

from ftdservice import FTCTL, TINY, Daemon, ftctl, get, submit, wait_for


def test_a_request_id_reused_with_another_spec_is_refused_and_a_retry_gets_the_same_job(daemon):
    first = submit(daemon, TINY, "--request-id", "sweep-1", "--set", "steps=5")
    again = submit(daemon, TINY, "--request-id", "sweep-1", "--set", "steps=5")
    assert again == first
    p = ftctl(daemon, "submit", "--default", "--request-id", "sweep-1", "--set", "steps=7")
    assert p.returncode == 3, p.stderr
    assert "ALREADY_EXISTS" in p.stderr and first in p.stderr and "spec." in p.stderr, p.stderr


def test_max_attempts_zero_is_refused_naming_the_field(daemon):
    p = ftctl(daemon, "submit", "--default", "--max-attempts", "0")
    assert p.returncode != 0 and "max_attempts" in p.stderr, p.stderr


def test_after_a_drain_and_a_restart_a_job_shows_its_true_attempt(tmp_path):
    d = Daemon(tmp_path, scripts={"long": {"wait_for_stop": True}})
    try:
        job = submit(d, TINY, "--name", "long", "--max-attempts", "3")
        wait_for(lambda: get(d, job)["state"] == "RUNNING", 60, "the job to run")
        assert get(d, job)["message"] == "attempt 1 of 3 on cpu"
        d.stop()  # SIGTERM: drains, requeues the job without counting its attempt
        d.start()
        wait_for(lambda: get(d, job)["state"] == "RUNNING", 60, "the job to run again")
        j = get(d, job)
        assert j["message"] == "attempt 1 of 3 on cpu", j
        assert int(j["max_attempts"]) == 3, j
    finally:
        d.stop()


def _wait_state(d, job, states, timeout=60):
    return wait_for(lambda: get(d, job)["state"] in states and get(d, job), timeout, f"{job} to be {states}")


def test_logs_follow_prints_the_workers_output_and_step_lines_until_the_end(tmp_path):
    d = Daemon(tmp_path, scripts={"steps": {"steps": 5, "step_interval_ms": 300, "result": "SUCCEEDED"}})
    try:
        job = submit(d, TINY, "--name", "steps")
        t0 = time.monotonic()
        p = ftctl(d, "logs", "-f", job, timeout=60)
        assert p.returncode == 0, p.stderr
        assert time.monotonic() - t0 < 30
        assert "fake-worker: started" in p.stdout, p.stdout
        for s in range(1, 6):
            assert f"[ftd] step {s}/5 loss" in p.stdout, p.stdout
        assert get(d, job)["state"] == "SUCCEEDED"  # it ended only once the job had
        # Without -f, what is there; --tail counts lines, as kubectl logs --tail and tail -n do;
        # --tail-bytes bytes, from a whole line.
        whole = ftctl(d, "logs", job).stdout
        assert whole == p.stdout
        assert ftctl(d, "logs", "--tail", "2", job).stdout == "".join(whole.splitlines(True)[-2:])
        assert ftctl(d, "logs", "--tail", "1000", job).stdout == whole
        tail = ftctl(d, "logs", "--tail-bytes", "100", job).stdout
        assert 0 < len(tail) <= 100 and whole.endswith(tail) and whole[:-len(tail)].endswith("\n"), tail
        assert "[ftd] step 5/5" in tail, tail
        # The daemon's own log: a line per job event.
        log = d.read_log()
        assert f"ftd: job {job} submitted" in log
        assert f"ftd: job {job} QUEUED -> RUNNING (RUNNING): attempt 1 of 3 on cpu" in log
        assert f"ftd: job {job} RUNNING -> SUCCEEDED (SUCCEEDED)" in log
        assert ftctl(d, "logs", "j-999999").returncode == 3
    finally:
        d.stop()


def test_logs_follow_resumes_across_a_daemon_restart_without_losing_or_repeating_lines(tmp_path):
    d = Daemon(tmp_path, unix_socket=True,
               scripts={"steps": {"steps": 30, "step_interval_ms": 200, "result": "SUCCEEDED"}})
    try:
        job = submit(d, TINY, "--name", "steps")
        follow = subprocess.Popen([str(FTCTL), "--addr", d.addr, "logs", "-f", job], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        wait_for(lambda: "[ftd] step 5/30 " in ftctl(d, "logs", job).stdout, 60, "five steps in the log")
        before = len(ftctl(d, "logs", job).stdout)
        d.kill(signal.SIGKILL)  # mid-follow, with the job running
        time.sleep(0.5)
        d.start()
        out, err = follow.communicate(timeout=120)
        assert follow.returncode == 0, err
        assert "lost the connection to ftd" in err and "reconnected" in err, err
        whole = ftctl(d, "logs", job).stdout
        assert len(whole) > before, "the log went on after the restart"
        # Every byte once, in order: exactly what a read of the whole log gives.
        assert out == whole
        assert get(d, job)["state"] in ("SUCCEEDED", "FAILED", "CANCELLED")
    finally:
        d.stop()


def test_delete_and_prune_remove_finished_jobs_and_their_files(tmp_path):
    d = Daemon(tmp_path, scripts={"quick": {"steps": 1, "result": "SUCCEEDED"},
                                  "bad": {"steps": 1, "result": "FAILED", "exit": 1},
                                  "long": {"wait_for_stop": True}})
    try:
        a = submit(d, TINY, "--name", "quick")
        b = submit(d, TINY, "--name", "bad")
        c = submit(d, TINY, "--name", "quick")
        for j in (a, b, c):
            _wait_state(d, j, ("SUCCEEDED", "FAILED"))
        assert (d.data / "jobs" / a / "worker.log").exists()
        p = ftctl(d, "delete", a)
        assert p.returncode == 0 and f"{a} deleted" in p.stdout, p.stderr
        assert not (d.data / "jobs" / a).exists()
        assert ftctl(d, "get", a).returncode == 3
        running = submit(d, TINY, "--name", "long")
        _wait_state(d, running, ("RUNNING",))
        p = ftctl(d, "delete", running)
        assert p.returncode == 3 and "FAILED_PRECONDITION" in p.stderr, p.stderr
        # Nothing finished a week ago; then only the succeeded one goes.
        p = ftctl(d, "prune", "--older-than", "7d", "--state", "succeeded")
        assert p.returncode == 0 and p.stdout == "", (p.stdout, p.stderr)
        p = ftctl(d, "prune", "--older-than", "0s", "--state", "succeeded", "--dry-run")
        assert p.stdout.split() == [c] and "would delete 1 job(s)" in p.stderr, (p.stdout, p.stderr)
        assert get(d, c)["state"] == "SUCCEEDED"
        p = ftctl(d, "prune", "--older-than", "0s", "--state", "succeeded")
        assert p.stdout.split() == [c], p.stdout
        assert not (d.data / "jobs" / c).exists()
        assert get(d, b)["state"] == "FAILED" and get(d, running)["state"] == "RUNNING"
        assert ftctl(d, "prune", "--older-than", "7 days").returncode == 64
        ftctl(d, "cancel", running)
    finally:
        d.stop()


def test_retention_deletes_old_finished_jobs_and_partial_checkpoints(tmp_path):
    d = Daemon(tmp_path, "--retention", "3s", scripts={"quick": {"steps": 1, "result": "SUCCEEDED"},
                                                       "long": {"wait_for_stop": True}})
    try:
        job = submit(d, TINY, "--name", "quick")
        _wait_state(d, job, ("SUCCEEDED",))
        running = submit(d, TINY, "--name", "long")
        _wait_state(d, running, ("RUNNING",))
        partial = d.data / "jobs" / running / "checkpoints" / "step-00000007.tmp"
        partial.mkdir(parents=True)
        wait_for(lambda: ftctl(d, "get", job).returncode == 3, 30, "retention to delete the job")
        assert not (d.data / "jobs" / job).exists()
        assert partial.exists()  # its job runs: its writer may be at work
        ftctl(d, "cancel", running)
        _wait_state(d, running, ("CANCELLED",))
        wait_for(lambda: not partial.exists(), 30, "retention to remove the partial checkpoint")
        assert "ftd: retention: deleted 1 job(s)" in d.read_log()
    finally:
        d.stop()


def test_pause_and_resume_without_a_restart(tmp_path):
    d = Daemon(tmp_path, scripts={"quick": {"steps": 1, "result": "SUCCEEDED"}})
    try:
        p = ftctl(d, "pause")
        assert p.returncode == 0 and "paused" in p.stdout, p.stderr
        job = submit(d, TINY, "--name", "quick")
        time.sleep(1)
        j = get(d, job)
        assert j["state"] == "QUEUED" and j["reason"] == "PAUSED", j
        assert "paused" in ftctl(d, "scheduler").stdout
        p = ftctl(d, "resume")
        assert p.returncode == 0 and "running" in p.stdout, p.stderr
        _wait_state(d, job, ("SUCCEEDED",))
    finally:
        d.stop()


def test_cancel_stops_without_a_checkpoint_and_cancel_checkpoint_waits_for_a_slow_one(tmp_path):
    # --grace-s is 3 in these daemons; the scripted checkpoint takes 6 s but reports progress.
    d = Daemon(tmp_path, scripts={"long": {"wait_for_stop": True, "checkpoint_ms": 6000}})
    try:
        a = submit(d, TINY, "--name", "long")
        _wait_state(d, a, ("RUNNING",))
        p = ftctl(d, "cancel", a)
        assert p.returncode == 0 and "without a checkpoint" in p.stdout, p.stdout
        j = _wait_state(d, a, ("CANCELLED",))
        log = ftctl(d, "logs", a).stdout
        assert "fake-worker: no checkpoint" in log, log

        b = submit(d, TINY, "--name", "long")
        _wait_state(d, b, ("RUNNING",))
        p = ftctl(d, "cancel", "--checkpoint", b)
        assert p.returncode == 0 and "after a checkpoint" in p.stdout, p.stdout
        j = _wait_state(d, b, ("CANCELLED",), timeout=60)
        assert "exit code 5" in j["message"], j  # it finished its checkpoint: not killed at 3 s
        assert "fake-worker: checkpoint" in ftctl(d, "logs", b).stdout
    finally:
        d.stop()


def test_a_cancelled_job_resumes_from_its_checkpoint(daemon):
    spec = dict(TINY, steps=400)
    job = submit(daemon, spec, "--name", "to-resume")
    wait_for(lambda: int(get(daemon, job).get("last_step", {}).get("step", 0)) >= 2, 120, "two steps")
    assert ftctl(daemon, "cancel", "--checkpoint", job).returncode == 0
    j = _wait_state(daemon, job, ("CANCELLED",), timeout=120)
    stopped_at = int(j["result"]["steps_done"])
    assert stopped_at >= 2, j
    p = ftctl(daemon, "resubmit", job, "--resume", "--set", f"steps={stopped_at + 2}")
    assert p.returncode == 0, p.stderr
    new = p.stdout.strip()
    assert new != job
    n = _wait_state(daemon, new, ("SUCCEEDED",), timeout=180)
    assert int(n["result"]["steps_done"]) == stopped_at + 2, n
    log = ftctl(daemon, "logs", new).stdout
    assert f"[ftd] resuming {job}" in log and f"resumed from" in log and f"at step {stopped_at}" in log, log
    # Without --resume: a fresh copy with the override.
    p = ftctl(daemon, "resubmit", job, "--set", "steps=3", "--name", "copy")
    assert p.returncode == 0, p.stderr
    c = get(daemon, p.stdout.strip())
    assert c["name"] == "copy" and int(c["spec"]["steps"]) == 3, c
    # A succeeded job cannot be resumed.
    p = ftctl(daemon, "resubmit", new, "--resume")
    assert p.returncode == 3 and "FAILED_PRECONDITION" in p.stderr, p.stderr
