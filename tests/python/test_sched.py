"""Several jobs per GPU and per-user limits, against a real ftd with the CPU-only machine's GPU
memory given by --gpu-memory-gib and ftd-fake-worker as the workers (they hold their slot until
cancelled). Every wait is bounded."""
import json

from ftdservice import TINY, Daemon, ftctl, get, submit, wait_for

HOLD = {"*": {"steps": 1, "wait_for_stop": True}}
ON_GPU = dict(TINY, device="cuda")


def _state(d, job):
    return get(d, job)["state"]


def test_two_jobs_share_a_gpu_and_list_metrics_get_and_dry_run_say_so(tmp_path):
    d = Daemon(tmp_path, "--gpus", "1", "--jobs-per-gpu", "2", "--gpu-memory-gib", "80", scripts=HOLD)
    try:
        dry = ftctl(d, "submit", "-", "--dry-run", input=json.dumps(ON_GPU))
        assert dry.returncode == 0, dry.stderr
        assert "predicted peak memory" in dry.stdout and "it would start on GPU 0" in dry.stdout, dry.stdout
        assert json.loads(ftctl(d, "list", "-o", "json").stdout) == []  # nothing was submitted
        jobs = [submit(d, ON_GPU, "--name", f"share-{i}") for i in range(2)]
        wait_for(lambda: all(_state(d, j) == "RUNNING" for j in jobs), 60, "both jobs running")
        slots = sorted(get(d, j)["slot"] for j in jobs)
        assert slots == ["gpu:0/0", "gpu:0/1"], slots
        table = ftctl(d, "list").stdout.splitlines()
        assert table[0].split()[-1] == "GPU", table[0]
        assert all(line.endswith("0 (2 jobs)") for line in table[1:]), table
        text = ftctl(d, "get", jobs[0]).stdout
        assert "predicted peak:" in text, text
        m = d.metrics()
        assert m[("ftd_gpu_jobs", (("gpu", "0"),))] == 2
        predicted = get(d, jobs[0])["predicted_peak_bytes"] + get(d, jobs[1])["predicted_peak_bytes"]
        assert m[("ftd_gpu_predicted_bytes", (("gpu", "0"),))] == predicted > 0
        for j in jobs:
            assert ftctl(d, "cancel", j).returncode == 0
    finally:
        d.stop()


def test_user_limits_refuse_and_hold_with_the_limit_and_the_use(tmp_path):
    d = Daemon(tmp_path, "--gpus", "2", "--user-limits", "queued=1,running=1", scripts=HOLD)
    try:
        first = submit(d, TINY, "--name", "first")
        wait_for(lambda: _state(d, first) == "RUNNING", 60, "the first job running")
        second = submit(d, TINY, "--name", "second")
        waiting = get(d, second)
        assert waiting["reason"] == "QUOTA", waiting
        assert "runs 1 job(s), the limit for the user (running=1)" in waiting["message"], waiting["message"]
        over = ftctl(d, "submit", "-", input=json.dumps(TINY))
        assert over.returncode != 0
        assert "has 1 job(s) queued, the limit for the user (queued=1)" in over.stderr, over.stderr
        for j in (first, second):
            assert ftctl(d, "cancel", j).returncode == 0
    finally:
        d.stop()


def test_a_bad_limit_flag_stops_ftd_naming_it(tmp_path):
    import subprocess
    from ftdservice import FTD
    p = subprocess.run([str(FTD), "--data-dir", str(tmp_path / "d"), "--listen", "", "--metrics-listen", "",
                        "--gpus", "0", "--user-limit", "alice:gpus=2"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "--user-limit" in p.stderr and "unknown limit \"gpus\"" in p.stderr, p.stderr
