"""Checkpoint robustness through the real ftd-worker: keep_last pruning, resuming at the final step,
partial checkpoints that dead writers left, replacing a checkpoint of the same step, and SIGTERM at
random moments. Each of these once removed a directory through a std::filesystem call that bound
into LibTorch's copy of libstdc++ and crashed (docs/building.md).

The device comes from FTD_TEST_DEVICE (default cpu); ctest runs this file a second time on CUDA
as checkpoint_gpu_test (label gpu)."""
import errno
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from ftdtest import BUILD, WORKER, WorkerProcess, make_hf_model, run_worker, write_tokens

DEVICE = os.environ.get("FTD_TEST_DEVICE", "cpu")
pytestmark = pytest.mark.skipif(DEVICE.startswith("cuda") and not torch.cuda.is_available(),
                                reason="FTD_TEST_DEVICE is cuda but no CUDA device is visible")


def tiny(ck, **kw):
    spec = {"model": {"preset": "tiny"}, "batch_size": 4, "seq_len": 32, "device": DEVICE, "steps": 20,
            "checkpoint": {"dir": str(ck), "every_steps": 5}}
    spec["checkpoint"].update(kw.pop("checkpoint", {}))
    spec.update(kw)
    return spec


def complete_checkpoints(root):
    """Names of the directories under root whose manifest lists files of the sizes they have."""
    out = []
    for d in sorted(Path(root).iterdir()):
        m = d / "MANIFEST.json"
        if not d.is_dir() or d.is_symlink() or not m.exists():
            continue
        files = json.loads(m.read_text())["files"]
        if all((d / f).exists() and (d / f).stat().st_size == size for f, size in files.items()):
            out.append(d.name)
    return out


def contents(d):
    return {p.name: p.read_bytes() for p in sorted(Path(d).iterdir())}


@pytest.mark.parametrize("keep_last", [1, 2])
def test_keep_last_prunes_older_checkpoints(tmp_path, keep_last):
    ck = tmp_path / "ck"
    code, steps, result, err = run_worker(tiny(ck, checkpoint={"keep_last": keep_last}), tmp_path, check=False)
    assert code == 0, err
    assert result["outcome"] == "SUCCEEDED" and [s["step"] for s in steps] == list(range(1, 21))
    want = [f"step-{n:08d}" for n in (5, 10, 15, 20)][-keep_last:]
    assert sorted(p.name for p in ck.iterdir()) == want
    assert complete_checkpoints(ck) == want


def test_running_a_finished_spec_again_resumes_at_the_final_step(tmp_path):
    ck = tmp_path / "ck"
    spec = tiny(ck, checkpoint={"keep_last": 1})
    code, steps, first, err = run_worker(spec, tmp_path, check=False)
    assert code == 0 and len(steps) == 20, err
    final = ck / "step-00000020"
    before = contents(final)
    code, steps, again, err = run_worker(spec, tmp_path, check=False)
    assert code == 0, err
    assert again["outcome"] == "SUCCEEDED" and again["steps_done"] == 20 and steps == []
    assert f"resumed from {final} at step 20" in err
    assert again["last_checkpoint"] == str(final)
    # Nothing to write: the checkpoint it resumed from is the state it ends in, kept as it was.
    assert sorted(p.name for p in ck.iterdir()) == ["step-00000020"]
    assert contents(final) == before


def test_resume_takes_the_newest_complete_checkpoint(tmp_path):
    """With several complete checkpoints (and a partial one of a later step), a run resumes from the
    newest complete one."""
    ck = tmp_path / "ck"
    spec = tiny(ck, steps=12, checkpoint={"every_steps": 3, "keep_last": 0})
    code, steps, result, err = run_worker(spec, tmp_path, check=False)
    assert code == 0, err
    assert complete_checkpoints(ck) == [f"step-{n:08d}" for n in (3, 6, 9, 12)]
    for name in ("step-00000012", "step-00000003"):  # the newest and the oldest gone: 6 and 9 are left
        for f in (ck / name).iterdir():
            f.unlink()
        (ck / name).rmdir()
    (ck / "step-00000011.tmp").mkdir()  # a dead writer's partial checkpoint is no candidate
    code, steps, result, err = run_worker(spec, tmp_path, check=False)
    assert code == 0, err
    assert f"resumed from {ck / 'step-00000009'} at step 9" in err, err
    assert [s["step"] for s in steps] == [10, 11, 12]


def test_partial_checkpoints_left_by_dead_writers_are_removed(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("not the writer's")
    # What writers killed mid-write leave: a non-empty partial of a step this run will write, one of
    # a later step, one a prune was removing; a link named like a partial checkpoint must go without
    # its target. Names that are not partial checkpoints are left alone.
    (ck / "step-00000005.tmp" / "deep" / "deeper").mkdir(parents=True)
    (ck / "step-00000005.tmp" / "model.safetensors").write_bytes(os.urandom(4096))
    (ck / "step-00000005.tmp" / "deep" / "deeper" / "x").write_text("x")
    (ck / "step-00000099.tmp").mkdir()
    (ck / "step-00000099.tmp" / "MANIFEST.json").write_text("{}")
    (ck / "step-00000003.pruned.tmp").mkdir()
    (ck / "step-00000007.tmp").symlink_to(outside, target_is_directory=True)
    (ck / "notes.tmp").write_text("mine")
    (ck / "step-notes").mkdir()
    code, steps, result, err = run_worker(tiny(ck, steps=5), tmp_path, check=False)
    assert code == 0 and result["outcome"] == "SUCCEEDED", err
    assert sorted(p.name for p in ck.iterdir()) == ["notes.tmp", "step-00000005", "step-notes"]
    assert complete_checkpoints(ck) == ["step-00000005"]
    assert (outside / "keep.txt").read_text() == "not the writer's"


def test_a_run_started_over_replaces_a_checkpoint_of_the_same_step(tmp_path):
    """checkpoint.resume off: the new run's step-5 takes the old one's place in one rename."""
    ck = tmp_path / "ck"
    run_worker(tiny(ck, steps=5, seed=1), tmp_path)
    old = load_file(str(ck / "step-00000005" / "model.safetensors"))
    code, _, result, err = run_worker(tiny(ck, steps=5, seed=2, checkpoint={"resume": False}), tmp_path, check=False)
    assert code == 0 and result["last_checkpoint"] == str(ck / "step-00000005"), err
    new = load_file(str(ck / "step-00000005" / "model.safetensors"))
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(old[name], new[name])   # the second run's weights, not the first's
    assert sorted(p.name for p in ck.iterdir()) == ["step-00000005"]
    assert complete_checkpoints(ck) == ["step-00000005"]


def test_sigterm_at_random_moments(tmp_path):
    """20 runs of one job, each stopped by SIGTERM at a random moment: while loading or resuming, or
    a random time after its k-th step, while it trains or writes one of its checkpoints (one every
    step, pruned to 2). Each exits 5 with a CANCELLED result (or, signalled before its handler
    exists, dies of SIGTERM having done nothing), resumes where the last one stopped, and leaves
    only complete checkpoints."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    ck = tmp_path / "ck"
    spec = tiny(ck, batch_size=2, seq_len=16, steps=100000, log_every=1,
                checkpoint={"every_steps": 1, "keep_last": 2})
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    done = 0
    for i in range(20):
        w = WorkerProcess(path)
        if rng.random() < 0.4:
            delay = rng.uniform(0.0, 1.2)
            when = f"{delay:.2f} s after start"
            time.sleep(delay)
        else:
            k, delay = rng.randint(1, 4), rng.uniform(0.0, 0.2)
            when = f"{delay:.3f} s after its step {k}"
            w.wait_for(lambda out, err: sum('"event":"step"' in l for l in out) >= k)
            time.sleep(delay)
        w.p.send_signal(signal.SIGTERM)
        p = w.p
        _, lines, err = w.finish()
        results = [l for l in lines if l["event"] == "result"]
        last = [l for l in lines if l["event"] in ("step", "result")][-3:]
        where = f"run {i}, SIGTERM {when} (seed {seed}): exit {p.returncode}\n{err[-3000:]}\nlast lines: {last}"
        steps = [l["step"] for l in lines if l["event"] == "step"]
        if p.returncode == -signal.SIGTERM:
            assert not lines and "model:" not in err, where
        else:
            assert p.returncode == 5 and len(results) == 1, where
            r = results[0]
            assert r["outcome"] == "CANCELLED", where
            assert steps == list(range(done + 1, r["steps_done"] + 1)), where
            done = r["steps_done"]
            assert r["last_checkpoint"] == str(ck / f"step-{done:08d}"), where
        names = sorted(p.name for p in ck.iterdir()) if ck.exists() else []
        assert names == (complete_checkpoints(ck) if names else []), where
        assert len(names) <= 2 and not [n for n in names if n.endswith(".tmp")], where
    assert done >= 10, f"the runs got to step {done} only (seed {seed})"


# Moments of a resume, each a predicate on (stdout lines, stderr lines) that holds from it on.
RESUME_STAGES = {
    # the data is open; the checkpoint's trainer state is read next (each read of it slowed)
    "before the load": lambda out, err: any("ftd-worker: data:" in l for l in err),
    # the load began (done 0); mapping the weights and the optimizer state, each slowed, comes next
    "during the load": lambda out, err: any('"phase":"load_checkpoint"' in l for l in out),
    # the load is over; the first step comes next
    "right after the load": lambda out, err: any("ftd-worker: resumed from" in l for l in err),
}


@pytest.mark.parametrize("stage", list(RESUME_STAGES))
def test_sigterm_at_each_stage_of_a_resume(tmp_path, stage):
    """A run that resumes from the checkpoint of step 2, on a slow disk (reads and maps of files
    sleep 300 ms each), gets SIGTERM before, during and right after the load: it ends with one
    CANCELLED result line, exit 5 and its closing stderr line, keeps the checkpoint it resumed from
    (or the one of the step it went on to take), and leaves nothing partial."""
    ck = tmp_path / "ck"
    spec = tiny(ck, batch_size=2, seq_len=16, steps=2, log_every=1, checkpoint={"every_steps": 1, "keep_last": 2})
    code, _, result, err = run_worker(spec, tmp_path, check=False)
    assert code == 0 and result["last_checkpoint"] == str(ck / "step-00000002"), err
    spec["steps"] = 100000  # the resumed run would go on for long
    path = tmp_path / "resume.json"
    path.write_text(json.dumps(spec))
    env = dict(os.environ, LD_PRELOAD=str(BUILD / "tests" / "libftd_slow_write_preload.so"), FTD_SLOW_READ_MS="300")
    w = WorkerProcess(path, env=env)
    reached = w.wait_for(RESUME_STAGES[stage], timeout=300)
    w.p.send_signal(signal.SIGTERM)
    code, lines, err = w.finish(timeout=300)
    assert reached, f"the worker ended before {stage} (exit {code}):\n{err[-3000:]}"
    results = [l for l in lines if l["event"] == "result"]
    where = f"SIGTERM {stage}: exit {code}, results {results}\n{err[-3000:]}"
    assert code == 5 and len(results) == 1 and results[0]["outcome"] == "CANCELLED", where
    r = results[0]
    steps = [l["step"] for l in lines if l["event"] == "step"]
    assert r["steps_done"] in (2, 3) and steps == list(range(3, r["steps_done"] + 1)), where
    assert r["last_checkpoint"] == str(ck / f"step-{r['steps_done']:08d}"), where
    assert "exit() called while" not in err, where
    assert err.rstrip().endswith("ftd-worker: exit 5 (CANCELLED)"), where
    names = sorted(x.name for x in ck.iterdir())
    assert names == complete_checkpoints(ck) and f"step-{r['steps_done']:08d}" in names, where


def test_sigterm_while_reading_the_spec_cancels_cleanly(tmp_path):
    """A SIGTERM that comes before training starts (here while the worker waits to read its spec
    from a FIFO) is taken by the worker's signal thread, not by the default action: the run stops
    before its first step with a CANCELLED result, exit 5, and says on stderr which signal came
    while it was doing what."""
    spec = tmp_path / "spec.json"
    os.mkfifo(spec)
    p = subprocess.Popen([str(WORKER), "run", str(spec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Wait until the worker has the FIFO open for reading (before that, a non-blocking open for
    # writing fails with ENXIO): only then is it in main, past the dynamic loader, reading its spec.
    deadline = time.monotonic() + 120
    while True:
        try:
            fd = os.open(spec, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as e:
            if e.errno != errno.ENXIO or p.poll() is not None or time.monotonic() > deadline:
                p.kill()
                pytest.fail(f"the worker never opened its spec ({e}; exit {p.wait()})")
            time.sleep(0.05)
    p.send_signal(signal.SIGTERM)  # the worker blocks in read(): the FIFO has a writer and no data yet
    time.sleep(0.5)
    assert p.poll() is None, f"SIGTERM killed the worker while it read its spec (exit {p.returncode})"
    os.set_blocking(fd, True)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(tiny(tmp_path / "ck", steps=5)))
    out, err = p.communicate(timeout=120)
    lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    assert p.returncode == 5, err
    results = [l for l in lines if l["event"] == "result"]
    assert len(results) == 1 and results[0]["outcome"] == "CANCELLED", out
    assert results[0]["steps_done"] == 0 and not [l for l in lines if l["event"] == "step"], out
    assert "received SIGTERM: stopping at the next step (while reading the spec)" in err, err
    assert err.rstrip().endswith("ftd-worker: exit 5 (CANCELLED)"), err


def test_an_exit_from_inside_a_library_names_its_caller(tmp_path):
    """exit() called by a library rather than by the worker (here fsync, interposed, exits 4 while the
    first checkpoint is written) leaves no result line; the worker's exit hook says so on stderr with
    the stage and the caller's stack, which names the library."""
    shim = BUILD / "tests" / "libftd_exit_preload.so"
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(tiny(tmp_path / "ck", steps=10)))
    env = dict(os.environ, LD_PRELOAD=str(shim), FTD_EXIT_IN_FSYNC="4")
    p = subprocess.run([str(WORKER), "run", str(path)], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 4, p.stderr
    assert '"event": "result"' not in p.stdout and '"event":"result"' not in p.stdout, p.stdout
    assert "exit() called while training, before a result was reported" in p.stderr, p.stderr
    assert "libftd_exit_preload.so" in p.stderr, p.stderr


def run_lines(spec, tmp):
    """ftd-worker run SPEC: (exit code, every JSON line it printed, stderr)."""
    path = Path(tmp) / "spec.json"
    path.write_text(json.dumps(spec))
    p = subprocess.run([str(WORKER), "run", str(path)], capture_output=True, text=True, timeout=600)
    return p.returncode, [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")], p.stderr


def data_bytes(*files):
    """Bytes of tensor data in .safetensors files, from their headers."""
    total = 0
    for f in files:
        with open(f, "rb") as fh:
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        total += sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__")
    return total


def phases(lines, phase):
    """The progress lines of `phase`, split into runs of it (each from done 0 to done == total)."""
    runs, cur = [], []
    for l in lines:
        if l["event"] != "progress" or l["phase"] != phase:
            continue
        if l["done_bytes"] == 0 and cur and cur[-1]["done_bytes"] == cur[-1]["total_bytes"]:
            runs.append(cur)
            cur = []
        cur.append(l)
    return runs + ([cur] if cur else [])


def check_run(run, total):
    assert run[0]["done_bytes"] == 0 and run[-1]["done_bytes"] == run[-1]["total_bytes"] == total
    assert all(a["done_bytes"] <= b["done_bytes"] for a, b in zip(run, run[1:]))
    assert all(l["done_bytes"] <= l["total_bytes"] for l in run)


def test_progress_is_reported_while_loading_and_writing(tmp_path):
    """The hook a watchdog reads: every load and write outside the steps reports its bytes, ending
    with the bytes of tensor data the files hold."""
    make_hf_model("gqa_llama3_untied", tmp_path / "m", seed=4)
    tokens = np.random.default_rng(0).integers(0, 211, size=3000)
    write_tokens(tmp_path / "tok.bin", tokens)
    ck = tmp_path / "ck"
    spec = {"model": {"weights_path": str(tmp_path / "m")}, "data": {"path": str(tmp_path / "tok.bin")},
            "batch_size": 2, "seq_len": 16, "steps": 4, "device": DEVICE, "log_every": 1,
            "checkpoint": {"dir": str(ck), "every_steps": 2}}
    code, lines, err = run_lines(spec, tmp_path)
    assert code == 0, err
    [weights] = phases(lines, "load_weights")
    check_run(weights, data_bytes(tmp_path / "m" / "model.safetensors"))
    [data] = phases(lines, "load_data")
    check_run(data, (tmp_path / "tok.bin").stat().st_size)
    saves = phases(lines, "save_checkpoint")
    assert len(saves) == 2
    for run, step in zip(saves, (2, 4)):
        d = ck / f"step-{step:08d}"
        check_run(run, data_bytes(d / "model.safetensors", d / "optimizer.safetensors"))
    # Each save is reported between the step it follows and the next one.
    step_at = {l["step"]: i for i, l in enumerate(lines) if l["event"] == "step"}
    saved_at = [i for i, l in enumerate(lines) if l["event"] == "progress" and l["phase"] == "save_checkpoint"
                and l["done_bytes"] == l["total_bytes"]]
    assert step_at[2] < saved_at[0] < step_at[3]
    assert phases(lines, "load_checkpoint") == []

    code, lines, err = run_lines(dict(spec, steps=6), tmp_path)
    assert code == 0, err
    [resume] = phases(lines, "load_checkpoint")
    d = ck / "step-00000004"
    check_run(resume, data_bytes(d / "model.safetensors", d / "optimizer.safetensors"))


CKPT_BENCH = Path(__file__).resolve().parents[2] / "bench" / "ckpt_bench.py"


def test_checkpoint_benchmark_smoke(tmp_path):
    """bench/ckpt_bench.py on the tiny model: the checkpoint's size predicted before the runs, the
    disk's raw write rate beside the checkpoint's, a checkpoint written and loaded at a measured rate,
    and SIGUSR1 (the plain cancel) ending a standalone run during a step and during a checkpoint
    write, exit 5 both times, with nothing left in the checkpoint directories."""
    p = subprocess.run([sys.executable, str(CKPT_BENCH), "--worker", str(WORKER), "--out", str(tmp_path / "out"),
                        "--device", "cpu", "--batch", "2", "--seq", "16", "--steps", "2"],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, CKPT_ROOT=str(tmp_path / "ck")))
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads((tmp_path / "out" / "ckpt_bench.json").read_text())
    assert res["ckpt_root"] == str(tmp_path / "ck")
    assert res["checkpoint_bytes"] > 1_000_000
    # the tensors' bytes, predicted from the preset; the headers and the RNG state add a little
    assert 0 < res["checkpoint_bytes"] - res["predicted_checkpoint_bytes"] < 100_000, res
    assert res["raw_bytes"] == res["predicted_checkpoint_bytes"] and res["raw_write_gb_s"] > 0
    assert res["write_vs_raw"] == pytest.approx(res["write_gb_s"] / res["raw_write_gb_s"])
    assert "raw disk write" in p.stdout and "of the disk's rate" in p.stdout
    assert res["write_gb_s"] > 0 and res["load_gb_s"] > 0
    assert res["cancel_in_step_exit"] == 5 and res["cancel_in_checkpoint_exit"] == 5
    assert res["partial_checkpoints_left"] == []
    assert "| tiny | cpu |" in p.stdout
    assert [x.name for x in (tmp_path / "ck").iterdir()] == [], "removed after"


def test_checkpoint_benchmark_refuses_a_root_without_room(tmp_path):
    """A root with less free space than the checkpoint (here: a raw write larger than any disk) is
    refused before anything is written, with the free and the needed gigabytes."""
    p = subprocess.run([sys.executable, str(CKPT_BENCH), "--worker", str(WORKER), "--out", str(tmp_path / "out"),
                        "--device", "cpu", "--raw-bytes", "1e18", "--ckpt-root", str(tmp_path / "ck")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert re.search(r"ckpt_bench: .*/ck has [0-9.]+ GB free, and the tiny checkpoint .* need 1000000000.0 GB", p.stderr), \
        p.stderr
    assert "--ckpt-root (or CKPT_ROOT)" in p.stderr
    assert list((tmp_path / "ck").iterdir()) == []


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_a_cancel_during_a_checkpoint_write(tmp_path, sig):
    """On a slow disk (every large file write sleeps 100 ms), a signal that comes while a periodic
    checkpoint is written: SIGUSR1 (a plain cancel) stops the write at the next piece, removes the
    .tmp directory and exits 5 within seconds, long before the write would end; SIGTERM (a cancel
    that asks for a checkpoint) lets the write finish and keeps it."""
    shim = BUILD / "tests" / "libftd_slow_write_preload.so"
    ck = tmp_path / "ck"
    spec = tiny(ck, batch_size=2, seq_len=16, steps=4, log_every=1, checkpoint={"every_steps": 2})
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    env = dict(os.environ, LD_PRELOAD=str(shim), FTD_SLOW_WRITE_MS="100")
    w = WorkerProcess(path, env=env)
    w.wait_for(lambda out, err: any('"phase":"save_checkpoint"' in l for l in out))
    time.sleep(0.5)  # a few pieces into the write
    t0 = time.monotonic()
    w.p.send_signal(sig)
    code, lines, err = w.finish(timeout=300)
    took = time.monotonic() - t0
    saves = [l for l in lines if l["event"] == "progress" and l["phase"] == "save_checkpoint"]
    total = saves[0]["total_bytes"]
    [r] = [l for l in lines if l["event"] == "result"]
    assert code == 5 and r["outcome"] == "CANCELLED", err[-3000:]
    assert r["steps_done"] == 2
    names = sorted(x.name for x in ck.iterdir())
    if sig == signal.SIGUSR1:
        assert took < 3.0, f"exit {took:.1f} s after the cancel"
        assert not any(s["done_bytes"] == total for s in saves), "the write ran to its end"
        assert names == [] and r["last_checkpoint"] == "", (names, r)
    else:
        assert saves[-1]["done_bytes"] == total, "the write did not run to its end"
        assert names == ["step-00000002"] == complete_checkpoints(ck)
