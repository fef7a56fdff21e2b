"""The file sandbox (docs/security.md, "Files"), with real daemons, the real ftctl and real
workers: paths confined to the configured roots at submit, the worker's own confinement at open,
workers off root, file modes, errors that leak nothing, and the attempt token out of `ps`."""
import json
import os
from pathlib import Path

from ftdservice import TINY, ftctl, get, submit, wait_for


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
