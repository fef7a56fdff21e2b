"""ftctl's exit codes (docs/ftctl.md, "Exit codes") for every command and every outcome that command
can have, against one real ftd whose workers are ftd-fake-worker scripts (a job named "ok"
succeeds, "fails" fails, "hold" runs until it is cancelled):

- submit --wait, resubmit --wait, wait and watch: 0 SUCCEEDED, 1 FAILED, 2 CANCELLED, 130 on
  Ctrl-C (the job goes on), 3 refused or unreachable;
- every command: 0 on success, 3 when ftd refuses the call or cannot be reached, 64 on bad usage;
- cancel with several ids: the first failure's code, every id tried.

And the completion counter on the less common ending paths through the real daemon: a job
cancelled while queued and one cancelled while running each count once.
"""
import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from ftdservice import FTCTL, TINY, Daemon, free_port, ftctl, get, submit, wait_for

SCRIPTS = {"ok": {"steps": 1, "result": "SUCCEEDED"},
           "fails": {"steps": 1, "result": "FAILED", "message": "scripted failure", "exit": 1},
           "hold": {"steps": 1, "wait_for_stop": True}}
OK, FAILED, CANCELLED, CALL_FAILED, USAGE, INTERRUPTED = 0, 1, 2, 3, 64, 130


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    """One daemon for the module, four slots so a held job does not hold up the others."""
    daemon = Daemon(tmp_path_factory.mktemp("exit-codes"), "--gpus", "4", "--max-attempts", "1", scripts=SCRIPTS)
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def spec(d):
    path = Path(d.data).parent / "tiny.json"
    path.write_text(json.dumps(TINY))
    return str(path)


def running(d, job):
    return wait_for(lambda: (lambda j: j if j["state"] == "RUNNING" and j.get("last_step") else None)(get(d, job)),
                    60, f"{job} to run")


def ended(d, name, spec):
    """A finished job named `name` ("ok" or "fails"; "hold" is cancelled once it runs)."""
    job = submit(d, TINY, "--name", name)
    if name == "hold":
        running(d, job)
        assert ftctl(d, "cancel", job).returncode == 0
    assert ftctl(d, "wait", job).returncode in (OK, FAILED, CANCELLED)
    return job


def start(d, *args):
    return subprocess.Popen([str(FTCTL), "--addr", d.addr, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def signals_blocked(pid):
    """Whether ftctl has blocked SIGINT (it takes Ctrl-C in a thread of its own from then on)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    blocked = int(re.search(r"^SigBlk:\s*([0-9a-f]+)", status, re.M).group(1), 16)
    return bool(blocked & (1 << (signal.SIGINT - 1)))


# --- following a job: the outcome is the exit code ---------------------------------------------------

FOLLOWERS = ["submit --wait", "resubmit --wait", "wait", "watch"]


def follow(d, how, name, spec):
    """Starts `how` on a job named `name`; returns (the process, the job id)."""
    if how == "submit --wait":
        p = start(d, "submit", spec, "--name", name, "--wait")
        job = p.stdout.readline().strip()
    elif how == "resubmit --wait":
        p = start(d, "resubmit", ended(d, name if name != "hold" else "hold", spec), "--wait")
        job = p.stdout.readline().strip()
    else:
        job = submit(d, TINY, "--name", name)
        p = start(d, how, job)
    assert re.fullmatch(r"[0-9a-z-]+", job), (job, p.stderr.read() if p.poll() is not None else "")
    return p, job


@pytest.mark.parametrize("how", FOLLOWERS)
@pytest.mark.parametrize("name,code", [("ok", OK), ("fails", FAILED), ("hold", CANCELLED)])
def test_following_a_job_exits_with_its_outcome(d, spec, how, name, code):
    p, job = follow(d, how, name, spec)
    if name == "hold":
        running(d, job)
        assert ftctl(d, "cancel", job).returncode == 0
    out, err = p.communicate(timeout=120)
    assert p.returncode == code, (how, name, p.returncode, out, err)
    state = {OK: "SUCCEEDED", FAILED: "FAILED", CANCELLED: "CANCELLED"}[code]
    assert get(d, job)["state"] == state
    if how.endswith("--wait"):
        assert f"{job} {state}:" in err, err  # the outcome, said on stderr


@pytest.mark.parametrize("how", FOLLOWERS)
def test_ctrl_c_stops_following_with_130_and_the_job_goes_on(d, spec, how):
    p, job = follow(d, how, "hold", spec)
    running(d, job)
    wait_for(lambda: signals_blocked(p.pid), 30, "ftctl to take Ctrl-C")
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == INTERRUPTED, (how, p.returncode, err)
    assert f"stopped watching {job}; the job goes on" in err, err
    assert get(d, job)["state"] == "RUNNING"
    assert ftctl(d, "cancel", job).returncode == 0
    assert ftctl(d, "wait", job).returncode == CANCELLED


@pytest.mark.parametrize("how", FOLLOWERS)
def test_following_exits_3_when_refused_or_unreachable(d, spec, how):
    bad = Path(d.data).parent / "bad.json"
    bad.write_text(json.dumps(dict(TINY, batch_size=0)))
    args = {"submit --wait": ["submit", str(bad), "--wait"], "resubmit --wait": ["resubmit", "j-nosuchjob", "--wait"],
            "wait": ["wait", "j-nosuchjob"], "watch": ["watch", "j-nosuchjob"]}[how]
    p = ftctl(d, *args)
    assert p.returncode == CALL_FAILED and re.search(r"^ftctl: (INVALID_ARGUMENT|NOT_FOUND): ", p.stderr, re.M), \
        (p.returncode, p.stderr)
    p = ftctl(f"127.0.0.1:{free_port()}", *[a if a != str(bad) else spec for a in args], timeout=60)
    assert p.returncode == CALL_FAILED and "UNAVAILABLE" in p.stderr, (p.returncode, p.stderr)


# --- every command: 0, 3, 64 -------------------------------------------------------------------------

def commands_in_help():
    out = subprocess.run([str(FTCTL), "--help"], capture_output=True, text=True, timeout=30).stdout
    section = out.split("SUBCOMMANDS:")[-1] if "SUBCOMMANDS:" in out else out.split("Subcommands:")[-1]
    return sorted(set(re.findall(r"^\s{2}([a-z]+)\s", section, re.M)))


TCP = "the same call over TCP without credentials"  # refused: UNAUTHENTICATED


def cases(d, spec):
    """command -> (a call that succeeds, a call ftd refuses, a call with bad usage); None where the
    command has no such case. Jobs are made here."""
    done = ended(d, "ok", spec)
    failed = ended(d, "fails", spec)
    held = submit(d, TINY, "--name", "hold")
    running(d, held)
    prep = Path(d.data).parent / "prep.json"
    data = Path(d.data).parent / "prep.jsonl"
    data.write_text('{"text": "x"}\n')
    prep.write_text(json.dumps(dict(TINY, data={"path": str(data), "format": "text"})))
    return held, {
        "submit": (["submit", spec, "--name", "ok"], ["submit", spec, "--set", "batch_size=0"],
                   ["submit", spec, "--set", "batch_size"]),
        "list": (["list"], TCP, ["list", "--bogus"]),
        "get": (["get", done], ["get", "j-nosuchjob"], ["get"]),
        "watch": (["watch", done], ["watch", "j-nosuchjob"], ["watch", done, "-o", "yaml"]),
        "cancel": (["cancel", held], ["cancel", done], ["cancel"]),
        "logs": (["logs", done], ["logs", "j-nosuchjob"], ["logs", done, "--tail", "-3"]),
        "delete": (["delete", failed], ["delete", "j-nosuchjob"], ["delete"]),
        "prune": (["prune", "--dry-run"], TCP, ["prune", "--older-than", "soon"]),
        "resubmit": (["resubmit", done, "--name", "ok"], ["resubmit", "j-nosuchjob"], ["resubmit"]),
        "pause": (["pause"], TCP, ["pause", "now"]),
        "resume": (["resume"], TCP, ["resume", "now"]),
        "scheduler": (["scheduler"], TCP, ["scheduler", "--bogus"]),
        "wait": (["wait", done], ["wait", "j-nosuchjob"], ["wait"]),
        "prepare": None,  # its own codes: test_prepare_exit_codes
        "profile": (None, ["profile", done], ["profile"]),  # success: test_profile.py
        "completion": (["completion", "bash"], None, ["completion", "fish"]),
        "compare": (None, ["compare", done, "j-nosuchjob"], ["compare", done]),  # success: test_profile.py
        "whoami": (["whoami"], TCP, ["whoami", "--bogus"]),
        "admin": (["admin", "token", "create", "ci"], ["admin", "token", "revoke", "t-nosuchtoken"],
                  ["admin", "token", "create"]),
    }


def test_every_command_exits_0_on_success_3_when_refused_and_64_on_bad_usage(d, spec):
    held, table = cases(d, spec)
    assert sorted(table) == commands_in_help(), "a command without exit-code cases"
    wrong = []
    for command, row in table.items():
        if row is None:
            continue
        for args, code in zip(row, (OK, CALL_FAILED, USAGE)):
            if args is None:
                continue
            if args == TCP:
                env = {k: v for k, v in os.environ.items() if k not in ("FTD_TOKEN_FILE", "FTD_CONTEXT")}
                p = ftctl(d.tcp, *row[0], env=env)
            else:
                p = ftctl(d, *args)
            if p.returncode != code:
                wrong.append((args, code, p.returncode, p.stderr[-300:]))
            elif code == CALL_FAILED and not re.search(r"^ftctl: [A-Z_]+: ", p.stderr, re.M):
                wrong.append((args, "no 'ftctl: CODE: message' line", p.stderr[-300:]))
        # unreachable: every command that calls ftd says so with 3
        if row[0] is not None and command not in ("completion",):
            p = ftctl(f"127.0.0.1:{free_port()}", *row[0], timeout=60)
            if p.returncode != CALL_FAILED or "UNAVAILABLE" not in p.stderr:
                wrong.append((command, "unreachable", p.returncode, p.stderr[-300:]))
    ftctl(d, "resume")
    ftctl(d, "cancel", held)
    ftctl(d, "wait", held)
    assert wrong == []


def test_cancel_of_several_ids_tries_each_and_exits_with_the_first_failure(d, spec):
    done = ended(d, "ok", spec)
    a, b = submit(d, TINY, "--name", "hold"), submit(d, TINY, "--name", "hold")
    p = ftctl(d, "cancel", a, done, "j-nosuchjob", b)
    assert p.returncode == CALL_FAILED, p.stderr
    assert "FAILED_PRECONDITION" in p.stderr and "NOT_FOUND" in p.stderr, p.stderr
    for job in (a, b):
        wait_for(lambda: get(d, job)["state"] == "CANCELLED", 60, f"{job} to be cancelled")


def test_prepare_exit_codes(d, tmp_path):
    """ftctl prepare: 0 prepared (or found in the cache), 2 a spec or data error naming it, 64 bad usage."""
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "hello"}\n{"text": 3}\n')
    from ftdservice import WORKER
    base = dict(TINY, data={"path": str(data), "format": "text", "cache_dir": str(tmp_path / "cache"),
                            "tokenizer_path": str(tmp_path / "nowhere")})
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(base))
    p = subprocess.run([str(FTCTL), "prepare", str(spec), "--worker", str(WORKER)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and "nowhere" in p.stderr, (p.returncode, p.stderr)
    p = subprocess.run([str(FTCTL), "prepare"], capture_output=True, text=True, timeout=60)
    assert p.returncode == USAGE, (p.returncode, p.stderr)


# --- the completion counter on each way of being cancelled -----------------------------------------

def completions(d):
    return {labels: v for (name, labels), v in d.metrics().items() if name == "ftd_job_completions_total"}


def runs(d, state):
    return d.metrics().get(("ftd_job_run_duration_seconds_count", (("state", state),)), 0)


def test_a_job_cancelled_while_queued_or_while_running_counts_one_completion_each(d):
    key = (("outcome", "cancelled"), ("state", "cancelled"))
    # the jobs of other tests have ended (a cancel returns before its job has)
    wait_for(lambda: json.loads(ftctl(d, "list", "--state", "queued", "--state", "running", "-o", "json").stdout) == [],
             120, "the other tests' jobs to end")
    before, runs_before = completions(d), runs(d, "cancelled")
    assert ftctl(d, "pause").returncode == 0
    try:
        queued = submit(d, TINY, "--name", "hold")
        assert get(d, queued)["state"] == "QUEUED"
        assert ftctl(d, "cancel", queued).returncode == 0
    finally:
        assert ftctl(d, "resume").returncode == 0
    after = completions(d)
    assert after[key] - before.get(key, 0) == 1, (before, after)
    assert all(v == before.get(k, 0) for k, v in after.items() if k != key), (before, after)
    assert runs(d, "cancelled") - runs_before == 1

    job = submit(d, TINY, "--name", "hold")
    running(d, job)
    assert ftctl(d, "cancel", job).returncode == 0
    assert ftctl(d, "wait", job).returncode == CANCELLED
    final = completions(d)
    assert final[key] - after[key] == 1, (after, final)
    assert all(v == after.get(k, 0) for k, v in final.items() if k != key), (after, final)
    assert runs(d, "cancelled") - runs_before == 2
