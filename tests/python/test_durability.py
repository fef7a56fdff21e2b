"""Durability that a SIGKILL cannot show: a killed process leaves its writes in the page cache, so
only a power cut would expose a missing fsync. These tests record the file-system calls of the real
processes in order (tests/fslog_preload.c, an LD_PRELOAD library) and check the protocols:

- a checkpoint (docs/checkpoint-format.md): every file written and fsynced before the manifest is
  created; the manifest written and fsynced, and the directory fsynced, before the rename; the
  checkpoint directory fsynced after the rename and before the worker reports the checkpoint;
  pruning and replacing never leave a step-N with files missing;
- the daemon's store: each commit of a submit fsyncs SQLite's write-ahead log before the submit
  returns (what `synchronous=FULL` does in WAL mode; `NORMAL` would sync only at WAL checkpoints)."""
import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from ftdservice import TINY, Daemon, submit
from ftdtest import BUILD, WORKER

SHIM = BUILD / "tests" / "libftd_fslog.so"
FILES = ["model.safetensors", "config.json", "optimizer.safetensors", "trainer_state.json"]
O_CREAT = 0o100
RENAME_EXCHANGE = 2
WRITES = ("write", "pwrite")
SYNCS = ("fsync", "fdatasync")


@dataclass
class Call:
    i: int
    ns: int
    pid: int
    call: str
    fd: int
    path: str
    path2: str = ""
    extra: str = ""


def read_log(path):
    calls = []
    for line in Path(path).read_text(errors="replace").splitlines():
        f = line.split("\t")
        if len(f) < 6:
            continue  # a line cut short by a process that was killed mid-write
        fd = -1 if f[4] == "-" else int(f[4])
        rest = f[6:]
        path2 = rest[0] if rest and not rest[0].startswith("flags=") and f[3] == "rename" else ""
        extra = rest[-1] if rest and rest[-1] != path2 else ""
        calls.append(Call(len(calls), int(f[0]), int(f[1]), f[3], fd, f[5], path2, extra))
    return calls


def flags(c):
    return int(c.extra.split("=")[1], 16) if c.extra.startswith("flags=") else 0


def first(calls, pred, after=-1, what=""):
    for c in calls:
        if c.i > after and pred(c):
            return c
    raise AssertionError(f"no {what} after call {after}")


def run_logged(spec, tmp, log):
    path = Path(tmp) / "spec.json"
    path.write_text(json.dumps(spec))
    env = dict(os.environ, LD_PRELOAD=str(SHIM), FTD_FSLOG=str(log))
    p = subprocess.run([str(WORKER), "run", str(path)], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr
    return read_log(log)


def check_checkpoint_protocol(calls, root, step):
    tmp, final = f"{root}/step-{step:08d}.tmp", f"{root}/step-{step:08d}"
    manifest = f"{tmp}/MANIFEST.json"
    created = first(calls, lambda c: c.call == "open" and c.path == manifest and flags(c) & O_CREAT,
                    what=f"creation of {manifest}")
    moved = first(calls, lambda c: c.call == "rename" and c.path == tmp and c.path2 == final,
                  what=f"rename {tmp} -> {final}")
    for name in FILES + ["MANIFEST.json"]:
        path = f"{tmp}/{name}"
        writes = [c for c in calls if c.call in WRITES and c.path == path]
        assert writes, f"{path} was never written"
        synced = first(calls, lambda c: c.call in SYNCS and c.path == path, after=writes[-1].i,
                       what=f"fsync of {path} after its last write")
        bound, what = (moved, "the rename") if name == "MANIFEST.json" else (created, "the manifest is created")
        assert synced.i < bound.i, f"{path} is fsynced only after {what}"
    manifest_synced = first(calls, lambda c: c.call in SYNCS and c.path == manifest, what="fsync of the manifest")
    dir_synced = first(calls, lambda c: c.call in SYNCS and c.path == tmp, after=manifest_synced.i,
                       what=f"fsync of the directory {tmp} after the manifest's")
    assert dir_synced.i < moved.i, f"{tmp} is fsynced only after the rename"
    root_synced = first(calls, lambda c: c.call in SYNCS and c.path == str(root), after=moved.i,
                        what=f"fsync of {root} after the rename")
    # The worker reports the checkpoint (its log line on stderr, a progress line on stdout) only
    # once the rename is durable.
    reported = first(calls, lambda c: c.call == "flush" and c.fd in (1, 2), after=moved.i,
                     what="a report after the rename")
    assert root_synced.i < reported.i, f"the worker reported {final} before fsyncing {root}"
    return moved, root_synced


def test_checkpoint_write_order(tmp_path):
    ck = tmp_path / "ck"
    log = tmp_path / "fs.log"
    spec = {"model": {"preset": "tiny"}, "batch_size": 2, "seq_len": 16, "device": "cpu", "steps": 4,
            "log_every": 1, "checkpoint": {"dir": str(ck), "every_steps": 2, "keep_last": 1}}
    calls = run_logged(spec, tmp_path, log)
    check_checkpoint_protocol(calls, ck, 2)
    _, synced4 = check_checkpoint_protocol(calls, ck, 4)
    # keep_last 1 prunes step 2 once step 4 is durable, renaming it to a partial name first: no
    # step-2 with files missing exists at any instant.
    old = f"{ck}/step-00000002"
    aside = first(calls, lambda c: c.call == "rename" and c.path == old, what=f"the rename of {old} to prune it")
    assert aside.path2.endswith(".tmp") and aside.i > synced4.i
    removed = [c for c in calls if c.call in ("unlink", "rmdir") and c.path.startswith(old)]
    assert removed and all(c.i > aside.i and c.path.startswith(aside.path2) for c in removed)


def test_replacing_a_checkpoint_exchanges_it_in_one_rename(tmp_path):
    """A run started over (resume off) writes a step that exists: at no instant is there no
    complete step-N; the old one is removed after the exchange is durable."""
    ck = tmp_path / "ck"
    spec = {"model": {"preset": "tiny"}, "batch_size": 2, "seq_len": 16, "device": "cpu", "steps": 2,
            "checkpoint": {"dir": str(ck)}}
    run_logged(spec, tmp_path, tmp_path / "first.log")
    log = tmp_path / "fs.log"
    calls = run_logged(dict(spec, seed=7, checkpoint={"dir": str(ck), "resume": False}), tmp_path, log)
    moved, root_synced = check_checkpoint_protocol(calls, ck, 2)
    final = f"{ck}/step-00000002"
    assert flags(moved) & RENAME_EXCHANGE, f"{final} was replaced by a plain rename"
    removed = [c for c in calls if c.call in ("unlink", "rmdir")
               and (c.path == final or c.path.startswith(final + "/") or c.path.startswith(moved.path))]
    assert removed, "the replaced checkpoint was not removed"
    assert all(c.i > root_synced.i and c.path.startswith(moved.path) for c in removed), \
        "something of step-2 was removed before the exchange was durable"


def test_store_commits_sync_the_wal_before_submit_returns(tmp_path):
    log = tmp_path / "ftd-fs.log"
    d = Daemon(tmp_path, "--paused", env={"LD_PRELOAD": str(SHIM), "FTD_FSLOG": str(log)})
    try:
        for k in range(3):
            before = time.monotonic_ns()
            submit(d, TINY, "--name", f"durable-{k}")
            returned = time.monotonic_ns()
            calls = [c for c in read_log(log) if c.pid == d.proc.pid and before <= c.ns <= returned]
            wal = [c for c in calls if c.call in WRITES and c.path.endswith("-wal")]
            assert wal, f"submit {k} wrote nothing to the write-ahead log"
            assert any(c.call in SYNCS and c.path == wal[-1].path and c.i > wal[-1].i for c in calls), \
                f"submit {k} returned before its commit's WAL frames were fsynced"
    finally:
        d.stop()
