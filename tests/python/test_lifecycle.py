"""A job's lifecycle as users drive it with ftctl, against real ftd daemons on loopback: request-id
reuse, attempt counts, logs, delete/prune/retention, resubmit, scheduler pause/resume, cancel with
and without a checkpoint. Jobs are acted out by ftd-fake-worker where training is beside the point.
Every wait is bounded."""
from ftdservice import TINY, Daemon, ftctl, get, submit, wait_for


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
