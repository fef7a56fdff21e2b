"""What a user is told about a job, against a real ftd with real ftd-worker processes: the held-out
loss where people look (watch's text, the [ftd] step log lines, get and its result line), one ETA
that get and watch agree on, a finished spec run again saying it had nothing to train, and a resume
refused for a changed batch being the spec's fault (INVALID_SPEC), not a worker error. Every wait
is bounded."""
import json
import subprocess

import numpy as np

from ftdservice import FTCTL, TINY, ftctl, get, submit, wait_for
from ftdtest import write_tokens


def events_of(daemon, job):
    p = ftctl(daemon, "watch", job, "-o", "json", timeout=300)
    return [json.loads(l) for l in p.stdout.splitlines()]


def wait_state(daemon, job, states, timeout=300):
    return wait_for(lambda: get(daemon, job)["state"] in states and get(daemon, job), timeout, f"{job} to be {states}")


def test_held_out_loss_shows_in_watch_logs_and_get(daemon, tmp_path):
    """Measured at steps 3 and 6 (eval_every_steps 3, reported although log_every is 2): those step
    lines carry eval_loss, the others do not; the result line carries final_eval_loss. The figures
    are the job's own events' (watch -o json), to the 4 decimals the lines print."""
    write_tokens(tmp_path / "tokens.bin", np.random.default_rng(7).integers(0, 64, size=33 * 40))  # the tiny vocab
    data = {"path": str(tmp_path / "tokens.bin"), "eval_fraction": 0.25, "eval_every_steps": 3}
    job = submit(daemon, dict(TINY, steps=6, log_every=2, data=data))
    text = ftctl(daemon, "watch", job, timeout=300)
    assert text.returncode == 0, text.stderr
    events = events_of(daemon, job)
    steps = {e["step"]["step"]: e["step"] for e in events if "step" in e}
    assert sorted(steps) == [2, 3, 4, 6], sorted(steps)
    measured = {n: s["eval_loss"] for n, s in steps.items() if s.get("eval_loss") is not None}
    assert sorted(measured) == [3, 6], steps
    result = next(e["result"] for e in events if "result" in e)
    assert result["final_eval_loss"] == measured[6]

    lines = {int(l.split()[1].split("/")[0]): l for l in text.stdout.splitlines() if l.startswith("step ")}
    assert sorted(lines) == [2, 3, 4, 6], text.stdout
    for n, line in lines.items():
        assert (f"eval_loss {measured[n]:.4f}" in line) if n in measured else ("eval_loss" not in line), line
    assert f"result: SUCCEEDED: trained 6 steps; final_eval_loss {measured[6]:.4f}" in text.stdout, text.stdout

    log = ftctl(daemon, "logs", job).stdout
    step_lines = {int(l.split()[2].split("/")[0]): l for l in log.splitlines() if l.startswith("[ftd] step ")}
    assert sorted(step_lines) == [2, 3, 4, 6], log
    for n, line in step_lines.items():
        assert (f"eval_loss {measured[n]:.4f}" in line) if n in measured else ("eval_loss" not in line), line

    shown = ftctl(daemon, "get", job).stdout
    assert f"result:         SUCCEEDED: trained 6 steps; final_eval_loss {measured[6]:.4f}\n" in shown, shown
    assert f"last step:      {lines[6]}\n" in shown, shown


def test_get_and_watch_show_the_workers_one_eta(daemon):
    """Stopped mid-run, so that steps are left: get's last step and watch's last step line are the
    same line, ETA included, and the ETA is the worker's: the steps left times the exponentially
    weighted moving average (0.2 on the newest) of every step's time. (watch averaged the reports it
    saw and get took the last step's time alone: 2m44s against 1m29s for one report.)"""
    job = submit(daemon, dict(TINY, steps=100000))
    watch = subprocess.Popen([str(FTCTL), "--addr", daemon.addr, "watch", job], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    lines = []
    for line in watch.stdout:
        lines.append(line.rstrip("\n"))
        if line.startswith("step 12/"):
            assert ftctl(daemon, "cancel", job).returncode == 0
    watch.wait(timeout=120)
    assert watch.returncode == 2, (watch.returncode, watch.stderr.read())  # CANCELLED
    step_lines = [l for l in lines if l.startswith("step ")]
    shown = ftctl(daemon, "get", job).stdout
    assert f"last step:      {step_lines[-1]}\n" in shown, (step_lines[-1], shown)

    steps = [e["step"] for e in events_of(daemon, job) if "step" in e]
    assert [s["step"] for s in steps] == list(range(1, len(steps) + 1)) and len(steps) >= 12
    ewma = None
    for s in steps:
        ewma = s["step_time_s"] if ewma is None else 0.2 * s["step_time_s"] + 0.8 * ewma
        assert abs(s["eta_s"] - (s["total_steps"] - s["step"]) * ewma) <= 1e-9 * s["eta_s"], s


def test_a_finished_spec_run_again_says_it_had_nothing_to_train(daemon, tmp_path):
    ck = tmp_path / "ck"
    spec = dict(TINY, steps=3, checkpoint={"dir": str(ck)})
    first = submit(daemon, spec)
    assert wait_state(daemon, first, ("SUCCEEDED", "FAILED"))["result"]["message"] == "trained 3 steps"
    again = submit(daemon, spec)
    j = wait_state(daemon, again, ("SUCCEEDED", "FAILED"))
    assert j["state"] == "SUCCEEDED" and int(j["result"]["steps_done"]) == 3, j
    assert j["result"]["message"].startswith(f"already at step 3 of 3 in {ck}/step-00000003; nothing to train"), j
    assert "already at step 3 of 3" in ftctl(daemon, "get", again).stdout
    more = submit(daemon, dict(spec, steps=5))
    j = wait_state(daemon, more, ("SUCCEEDED", "FAILED"))
    assert j["result"]["message"] == "trained 2 steps (4 to 5, resumed from step 3)", j


def test_a_resume_refused_for_a_changed_batch_is_an_invalid_spec(daemon):
    """The spec's fault: INVALID_SPEC naming the field, which the failing-jobs alert leaves alone
    (deploy/prometheus/alerts.yml counts only the reasons that mean the service is unwell)."""
    job = submit(daemon, dict(TINY, steps=400))
    wait_for(lambda: int(get(daemon, job).get("last_step", {}).get("step", 0)) >= 2, 120, "two steps")
    assert ftctl(daemon, "cancel", "--checkpoint", job).returncode == 0
    wait_state(daemon, job, ("CANCELLED",))
    p = ftctl(daemon, "resubmit", job, "--resume", "--set", "batch_size=2")
    assert p.returncode == 0, p.stderr
    j = wait_state(daemon, p.stdout.strip(), ("SUCCEEDED", "FAILED"))
    assert j["state"] == "FAILED" and j["reason"] == "INVALID_SPEC", j
    assert "spec.batch_size x spec.gpus (the batch of all ranks) is 2 but the checkpoint was written with 4" in \
        j["message"], j
    completions = daemon.metrics()
    assert completions[("ftd_job_completions_total", (("outcome", "invalid_spec"), ("state", "failed")))] == 1
    assert completions[("ftd_job_completions_total", (("outcome", "worker_error"), ("state", "failed")))] == 0
