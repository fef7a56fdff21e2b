"""The way back to a running daemon, walked as a user walks it: scripts/run.sh --daemon-only in a
project directory, ftctl from a new shell there (no $FTD_ADDR), the daemon stopped with the kill the
script prints, ftctl's message when nothing answers, the command that message gives, and the jobs
still there; ftctl with no daemon at all, the daemon its message says to start, and a TCP call
without credentials. Then scripts/setup.sh and a build directory configured from another clone.

The project directory is a fresh directory whose scripts/, .venv and CMakeLists.txt are this
checkout's (symbolic links), so run.sh runs exactly as in a clone; `cmake` is replaced on PATH by a
stand-in that records its arguments, so the set-up step builds nothing (the build is the one under
test, $FTD_BUILD_DIR)."""
import os
import re
import select
import signal
import subprocess
from pathlib import Path

import pytest

from ftdservice import FTCTL, FTD, free_port, stop_process
from ftdtest import BUILD, ROOT

FAKE_CMAKE = """#!/bin/sh
echo "$*" >> "$CMAKE_LOG"
case " $* " in
  *" --build "*) exit "${CMAKE_BUILD_RC:-0}";;
  *) exit "${CMAKE_CONFIGURE_RC:-0}";;
esac
"""


def user_env(tmp_path, **extra):
    """A user's environment: their own HOME, no ftd address, context or token set, the stand-in cmake."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("FTD_ADDR", "FTD_CONTEXT", "FTCTL_CONFIG", "FTD_TOKEN_FILE", "XDG_STATE_HOME", "XDG_CONFIG_HOME")}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "cmake").write_text(FAKE_CMAKE)
    (bin_dir / "cmake").chmod(0o755)
    env.update({"HOME": str(home), "PATH": f"{bin_dir}:{env['PATH']}", "CMAKE_LOG": str(tmp_path / "cmake.log"),
                "FTD_BUILD_DIR": str(BUILD), **extra})
    return env


def project(tmp_path):
    p = tmp_path / "proj"
    p.mkdir()
    for name in ("scripts", ".venv", "CMakeLists.txt"):
        (p / name).symlink_to(ROOT / name)
    return p


def run(args, cwd, env, timeout=120):
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def wait_exit(pid, timeout=60):
    """Waits for a process that is not our child to exit (its pidfd becomes readable)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        assert ready, f"pid {pid} still runs after {timeout}s"
    finally:
        os.close(fd)


def test_run_sh_daemon_only_and_the_way_back_after_stopping_it(tmp_path):
    proj = project(tmp_path)
    env = user_env(tmp_path, FTD_LISTEN=f"127.0.0.1:{free_port()}", FTD_METRICS_ADDR=f"127.0.0.1:{free_port()}")
    socket, data = proj / "runs" / "ftd.sock", proj / "runs" / "ftd-data"
    p = run([str(proj / "scripts" / "run.sh"), "--daemon-only"], proj, env)
    assert p.returncode == 0, p.stderr
    assert str(socket) in p.stderr and str(data) in p.stderr and "--daemon-only" in p.stderr, p.stderr
    started = p.stderr
    pid = int((proj / "runs" / "ftd.pid").read_text())
    try:
        # A new shell, no $FTD_ADDR: ftctl finds run.sh's daemon from the project directory and below.
        (proj / "sub").mkdir()
        for cwd in (proj, proj / "sub"):
            p = run([str(FTCTL), "list"], cwd, env)
            assert p.returncode == 0 and p.stdout.startswith("ID"), (cwd, p.stderr)
        assert run([str(FTCTL), "pause"], proj, env).returncode == 0
        job = run([str(FTCTL), "submit", "--default", "--name", "kept"], proj, env)
        assert job.returncode == 0, job.stderr
        job = job.stdout.strip()

        # Stopped as the script says: the pid file goes with it.
        stop = re.search(r"stop it with: (kill \$\(cat \S+\))", started)
        assert stop, started
        assert run(["bash", "-c", stop.group(1)], proj, env).returncode == 0
        wait_exit(pid)
        assert not (proj / "runs" / "ftd.pid").exists()

        # Nothing answers: the message says how to start the same daemon again, and that works.
        p = run([str(FTCTL), "list"], proj, env)
        assert p.returncode == 3 and len(p.stderr.strip().splitlines()) == 1, p.stderr
        again = re.search(r"start it again with (\S+ --daemon-only)", p.stderr)
        assert again and str(data) in p.stderr, p.stderr
        p = run(again.group(1).split(), proj, env)
        assert p.returncode == 0, p.stderr
        pid = int((proj / "runs" / "ftd.pid").read_text())
        p = run([str(FTCTL), "list", "-o", "json"], proj, env)
        assert p.returncode == 0 and job in p.stdout, p.stdout + p.stderr  # the same data directory: the job is there
    finally:
        try:
            os.kill(pid, signal.SIGTERM)
            wait_exit(pid)
        except ProcessLookupError:
            pass


def test_with_no_daemon_ftctl_says_where_it_looked_and_its_advice_works(tmp_path):
    env = user_env(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    state = Path(env["HOME"]) / ".local" / "state" / "ftd"
    p = run([str(FTCTL), "list"], elsewhere, env)
    assert p.returncode == 3 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    line = p.stderr
    assert "looked for a local ftd" in line and "runs/ftd.sock" in line and "ftd.sock" in line, line
    assert "ftd &" in line and "--daemon-only" in line, line
    # Started as advised (on a free port rather than 7070, which this machine may use), with its
    # default data directory: a plain `ftctl list` reaches it by its socket, with no token.
    port = free_port()
    d = subprocess.Popen([str(FTD), "--listen", f"127.0.0.1:{port}", "--metrics-listen", "", "--gpus", "0"], cwd=elsewhere,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for out in d.stdout:
            if "ftd: serving on" in out:
                break
        assert (state / "ftd.sock").exists()
        p = run([str(FTCTL), "list"], elsewhere, env)
        assert p.returncode == 0 and p.stdout.startswith("ID"), p.stderr
        # Over TCP without a token it is refused, and the message says where the socket is.
        p = run([str(FTCTL), "--addr", f"127.0.0.1:{port}", "list"], elsewhere, env)
        assert p.returncode == 3 and "UNAUTHENTICATED" in p.stderr, p.stderr
        assert f"--addr unix:{state / 'ftd.sock'}" in p.stderr, p.stderr
    finally:
        stop_process(d)


def fake_build(tmp_path, source):
    build = tmp_path / "build"
    build.mkdir()
    (build / "CMakeCache.txt").write_text(f"CMAKE_HOME_DIRECTORY:INTERNAL={source}\n")
    return build


def setup_sh(tmp_path, build, **extra):
    env = user_env(tmp_path, FTD_BUILD_DIR=str(build), **extra)
    log = Path(env["CMAKE_LOG"])
    log.unlink(missing_ok=True)
    p = run(["bash", str(ROOT / "scripts" / "setup.sh")], ROOT, env, timeout=300)
    return p, log.read_text().splitlines() if log.exists() else []


def test_setup_configures_afresh_a_build_dir_from_another_clone(tmp_path):
    build = fake_build(tmp_path, "/nonexistent/old-clone")
    p, calls = setup_sh(tmp_path, build)
    assert p.returncode == 0, p.stderr
    assert "/nonexistent/old-clone" in p.stderr and str(ROOT) in p.stderr, p.stderr
    assert calls[0].startswith(f"--fresh -S {ROOT} -B {build} "), calls
    assert calls[-1].startswith(f"--build {build}"), calls


def test_setup_leaves_its_own_build_dir_alone_and_fails_when_cmake_fails(tmp_path):
    build = fake_build(tmp_path, ROOT)
    p, calls = setup_sh(tmp_path, build)
    assert p.returncode == 0 and len(calls) == 1 and calls[0].startswith("--build"), (calls, p.stderr)
    p, calls = setup_sh(tmp_path, build, CMAKE_BUILD_RC="1")
    assert p.returncode != 0 and "build" in p.stderr, p.stderr
    (build / "CMakeCache.txt").write_text("CMAKE_HOME_DIRECTORY:INTERNAL=/elsewhere\n")
    p, calls = setup_sh(tmp_path, build, CMAKE_CONFIGURE_RC="1")
    assert p.returncode != 0 and "configure" in p.stderr, p.stderr
    assert not any(c.startswith("--build") for c in calls), calls
