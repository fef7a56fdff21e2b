"""Checkpoint and cancel benchmark: how fast ftd-worker writes and loads a full checkpoint (weights,
AdamW state, RNG) and how long a cancel takes to end the process, on the LLaMA-3.1-8B shape on the
GPU (or the tiny model on the CPU, as a smoke test), against the raw write rate of the same disk.
Prints a markdown table, writes ckpt_bench.json.

  python3 bench/ckpt_bench.py --worker build-gpu/worker/ftd-worker --out DIR [--device cuda|cpu]
      [--preset llama-3.1-8b|tiny] [--batch B --seq T] [--ckpt-root DIR (default $CKPT_ROOT, else /tmp)]

First the checkpoint's size is predicted from the preset and the root's free space checked: too
little, and the bench stops before writing anything, with both numbers. Then the disk's raw rate:
the same byte count written to the root with large sequential writes (64 MiB, as dd bs=64M), one
fsync at the end, GB/s = bytes / (open -> fsync done). The checkpoint's write rate is then reported
beside it as a ratio ("how close to the disk"). Then three runs of `ftd-worker run`, one after the
other, every output line stamped when it arrives:
  1. write: a few steps, then the final checkpoint. GB/s = the checkpoint's bytes / (its first
     save_checkpoint progress line -> the "checkpoint DIR" line, which comes after the fsyncs and
     the rename).
  2. load + cancel during a step: resumes from that checkpoint (load GB/s from the load_checkpoint
     progress lines), trains, and gets SIGUSR1 (ftd's plain cancel: stop at the next step boundary,
     no checkpoint) half a step after its third step ended (half the interval between the second and
     third step lines); latency = signal -> process exit, expected about half a step.
  3. cancel during a checkpoint write: checkpoints every 2 steps and gets SIGUSR1 as soon as the
     first write has moved bytes; latency = signal -> process exit.
Only one checkpoint exists at a time (an 8B one is about 48 GB): each run's directory is removed
before the next. The checkpoints go under --ckpt-root, never under --out.
"""
import argparse
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np


class Worker:
    """An ftd-worker run whose stdout (JSON events) and stderr (log lines) are read as they come."""

    def __init__(self, worker, spec_path):
        self.t_start = time.monotonic()
        self.p = subprocess.Popen([str(worker), "run", str(spec_path)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, bufsize=1)
        self.lines = queue.Queue()  # (monotonic time, "out"|"err", line)
        self.log = []
        for name, stream in (("out", self.p.stdout), ("err", self.p.stderr)):
            threading.Thread(target=self._read, args=(name, stream), daemon=True).start()
        self.t_exit = None

    def _read(self, name, stream):
        for line in stream:
            self.lines.put((time.monotonic(), name, line.rstrip("\n")))
        self.lines.put((time.monotonic(), name, None))

    def events(self, timeout_s):
        """Yields (t, kind, value) until both streams end: kind "event" (a parsed JSON line) or "log"."""
        open_streams = 2
        deadline = time.monotonic() + timeout_s
        while open_streams:
            try:
                t, name, line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                self.p.kill()
                raise SystemExit(f"ckpt_bench: ftd-worker gave no output for {timeout_s} s; killed")
            if line is None:
                open_streams -= 1
                continue
            self.log.append(f"{t - self.t_start:9.3f} {name} {line}")
            if name == "out" and line.startswith("{"):
                yield t, "event", json.loads(line)
            else:
                yield t, "log", line
        self.p.wait()
        self.t_exit = time.monotonic()


def write_spec(path, args, tokens, ckpt_dir, steps, every_steps=0):
    spec = {"model": {"preset": args.preset}, "data": {"path": str(tokens), "token_dtype": "uint32"},
            "steps": steps, "batch_size": args.batch, "seq_len": args.seq, "device": args.device,
            "log_every": 1, "kernel_set": args.kernel_set,
            "checkpoint": {"dir": str(ckpt_dir), "every_steps": every_steps, "resume": True}}
    if args.device == "cuda":
        spec["dtype"] = "bf16"
    path.write_text(json.dumps(spec))
    return path


# The presets' shapes (spec/llama_config.cc), for the checkpoint's size before anything is written.
PRESETS = {  # vocab, hidden, intermediate, layers, heads, kv heads, head dim, tied embeddings
    "llama-3.1-8b": (128256, 4096, 14336, 32, 32, 8, 128, False),
    "tiny": (64, 128, 352, 4, 4, 2, 32, False),
}


def predicted_checkpoint_bytes(preset, device):
    """Weights plus AdamW's two moments (each in the weights' dtype: bf16 on CUDA, fp32 on the CPU),
    or None for a preset not listed here. The headers, the RNG state and trainer_state.json add a few
    kilobytes."""
    if preset not in PRESETS:
        return None
    v, h, i, layers, heads, kv, hd, tied = PRESETS[preset]
    per_layer = h * heads * hd * 2 + h * kv * hd * 2 + 3 * h * i + 2 * h
    params = v * h * (1 if tied else 2) + layers * per_layer + h
    return params * (2 if device == "cuda" else 4) * 3


def raw_write_rate(directory, nbytes, block=64 << 20):
    """Writes nbytes of random data to a new file in `directory` in `block`-sized sequential writes,
    fsyncs once and removes it. Returns (seconds from open to fsync done, GB/s)."""
    buf = np.random.default_rng(1).integers(0, 256, size=block, dtype=np.uint8).tobytes()
    path = Path(directory) / "raw-write.bin"
    t0 = time.monotonic()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        left = nbytes
        while left > 0:
            view = memoryview(buf)[: min(block, left)]
            while view:
                view = view[os.write(fd, view):]
            left -= min(block, left)
        os.fsync(fd)
        dt = time.monotonic() - t0
    finally:
        os.close(fd)
        path.unlink()
    return dt, nbytes / dt / 1e9


def fmt_gb(n):
    return f"{n / 1e9:.1f}" if n >= 1e9 else f"{n / 1e9:.3f}"


def check_room(root, need, what):
    """Stops the bench, before anything is written, when `root` has less free space than `need`."""
    free = shutil.disk_usage(root).free
    if free < need:
        raise SystemExit(f"ckpt_bench: {root} has {fmt_gb(free)} GB free, and {what} need {fmt_gb(need)} GB: "
                         f"give --ckpt-root (or CKPT_ROOT) a directory on a disk with room")
    return free


def phase_rate(progress, phase):
    """(bytes, first line's time, last line's time) of one phase's progress lines."""
    rows = [(t, e) for t, e in progress if e["phase"] == phase]
    if not rows:
        return None
    return rows[-1][1]["total_bytes"], rows[0][0], rows[-1][0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--preset", help="model preset (default: llama-3.1-8b on cuda, tiny on cpu)")
    ap.add_argument("--batch", type=int, help="default 1 (8B) or 8 (tiny)")
    ap.add_argument("--seq", type=int, help="default 2048 (8B) or 64 (tiny)")
    ap.add_argument("--kernel-set", default="fused", help="fused|eager (default fused; the CPU runs eager)")
    ap.add_argument("--steps", type=int, default=3, help="steps before the checkpoint of run 1")
    ap.add_argument("--ckpt-root", default=os.environ.get("CKPT_ROOT") or tempfile.gettempdir(),
                    help="where the checkpoints and the raw-rate file go (not under --out); default $CKPT_ROOT, else /tmp")
    ap.add_argument("--raw-bytes", type=float, help="bytes of the raw write (default: the checkpoint's predicted size)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds without output before a run is killed")
    args = ap.parse_args()
    big = (args.preset or ("llama-3.1-8b" if args.device == "cuda" else "tiny")) != "tiny"
    args.preset = args.preset or ("llama-3.1-8b" if big else "tiny")
    args.batch = args.batch or (1 if big else 8)
    args.seq = args.seq or (2048 if big else 64)
    if args.device == "cpu":
        args.kernel_set = "eager"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    vocab = 128256 if big else 64
    n = args.batch * (args.seq + 1) * (args.steps + 64)
    predicted = predicted_checkpoint_bytes(args.preset, args.device)
    raw_bytes = int(args.raw_bytes or predicted or 4e9)
    # One checkpoint exists at a time, and the raw-rate file only before the first: the larger of
    # the two, the token file, and a margin for the files beside the tensors.
    need = max(predicted or 0, raw_bytes) + 4 * n + (1 << 30 if big else 1 << 20)
    Path(args.ckpt_root).mkdir(parents=True, exist_ok=True)
    free = check_room(args.ckpt_root, need, f"the {args.preset} checkpoint ({fmt_gb(predicted or 0)} GB), "
                      f"the raw-rate file ({fmt_gb(raw_bytes)} GB; one at a time) and the token file")
    print(f"ckpt_bench: {args.ckpt_root}: {fmt_gb(free)} GB free, {fmt_gb(need)} GB needed", flush=True)
    work = Path(tempfile.mkdtemp(prefix="ftd-ckpt-bench-", dir=args.ckpt_root))
    tokens = work / "tokens.u32"
    np.random.default_rng(0).integers(0, vocab, size=n, dtype=np.uint32).astype("<u4").tofile(tokens)
    res = {"preset": args.preset, "device": args.device, "batch": args.batch, "seq": args.seq,
           "kernel_set": args.kernel_set, "ckpt_root": str(args.ckpt_root),
           "predicted_checkpoint_bytes": predicted, "phase_s": {}}
    logs = {}
    t_phase = time.monotonic()

    def phase_done(name):
        nonlocal t_phase
        res["phase_s"][name] = round(time.monotonic() - t_phase, 1)
        t_phase = time.monotonic()
        print(f"ckpt_bench: {name} done in {res['phase_s'][name]} s", flush=True)

    try:
        # 0. the disk's raw rate
        res["raw_bytes"] = raw_bytes
        res["raw_write_s"], res["raw_write_gb_s"] = raw_write_rate(work, raw_bytes)
        phase_done("raw write")

        # 1. write
        ckpt = work / "ckpt"
        w = Worker(args.worker, write_spec(work / "write.json", args, tokens, ckpt, args.steps))
        progress, saved_at, steps = [], None, []
        for t, kind, v in w.events(args.timeout):
            if kind == "event" and v.get("event") == "progress":
                progress.append((t, v))
            elif kind == "event" and v.get("event") == "step":
                steps.append(v)
            elif kind == "log" and v.startswith("ftd-worker: checkpoint "):
                saved_at = t
        logs["write"] = w.log
        save = phase_rate(progress, "save_checkpoint")
        if w.p.returncode != 0 or save is None or saved_at is None:
            raise SystemExit(f"ckpt_bench: the write run failed (exit {w.p.returncode}):\n" + "\n".join(w.log[-30:]))
        res["checkpoint_bytes"] = save[0]
        res["write_s"] = saved_at - save[1]
        res["write_gb_s"] = save[0] / res["write_s"] / 1e9
        res["step_time_s"] = steps[-1]["step_time_s"] if steps else None
        res["predicted_write_s"] = next((e.get("predicted_s") for _, e in progress
                                         if e["phase"] == "save_checkpoint" and e.get("predicted_s")), None)
        res["write_vs_raw"] = res["write_gb_s"] / res["raw_write_gb_s"]
        phase_done("train and write")

        # 2. load, then cancel half a step after a step ended
        w = Worker(args.worker, write_spec(work / "load.json", args, tokens, ckpt, args.steps + 50))
        progress, signalled, step_times = [], None, []
        for t, kind, v in w.events(args.timeout):
            if kind == "event" and v.get("event") == "progress":
                progress.append((t, v))
            elif kind == "event" and v.get("event") == "step" and signalled is None:
                step_times.append(t)
                if len(step_times) == 3:  # the first step after a load is a warm-up
                    res["step_interval_s"] = step_times[2] - step_times[1]  # as seen here, the report included
                    time.sleep(res["step_interval_s"] / 2)
                    signalled = time.monotonic()
                    w.p.send_signal(signal.SIGUSR1)
        logs["load_and_cancel_in_step"] = w.log
        load = phase_rate(progress, "load_checkpoint")
        if load is None or signalled is None:
            raise SystemExit("ckpt_bench: the load run did not load or did not step:\n" + "\n".join(w.log[-30:]))
        res["load_s"] = load[2] - load[1]
        res["load_gb_s"] = load[0] / res["load_s"] / 1e9
        res["cancel_in_step_s"] = w.t_exit - signalled
        res["cancel_in_step_exit"] = w.p.returncode
        shutil.rmtree(ckpt)
        phase_done("load and cancel in a step")

        # 3. cancel while a checkpoint is being written
        ckpt = work / "ckpt-cancel"
        w = Worker(args.worker, write_spec(work / "cancel.json", args, tokens, ckpt, args.steps + 50, every_steps=2))
        signalled = None
        for t, kind, v in w.events(args.timeout):
            if (kind == "event" and v.get("event") == "progress" and v["phase"] == "save_checkpoint"
                    and v["done_bytes"] > 0 and signalled is None):
                signalled = time.monotonic()
                w.p.send_signal(signal.SIGUSR1)
        logs["cancel_in_checkpoint"] = w.log
        if signalled is None:
            raise SystemExit("ckpt_bench: no checkpoint write was seen moving:\n" + "\n".join(w.log[-30:]))
        res["cancel_in_checkpoint_s"] = w.t_exit - signalled
        res["cancel_in_checkpoint_exit"] = w.p.returncode
        res["partial_checkpoints_left"] = sorted(p.name for p in ckpt.glob("*.tmp")) if ckpt.exists() else []
        phase_done("cancel in a checkpoint write")
    finally:
        (out / "ckpt_bench.log").write_text("".join(f"## {k}\n" + "\n".join(v) + "\n" for k, v in logs.items()))
        shutil.rmtree(work, ignore_errors=True)
    (out / "ckpt_bench.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res), flush=True)
    gb = res["checkpoint_bytes"] / 1e9
    pred = f"{res['predicted_write_s']:.1f}" if res.get("predicted_write_s") else "-"
    print(f"\n| model | device | checkpoint (GB) | write (s) | predicted (s) | write GB/s | raw disk GB/s "
          f"| checkpoint/raw | load (s) | load GB/s | step (s) | cancel in step (s) | cancel in checkpoint write (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    print(f"| {args.preset} | {args.device} | {gb:.3f} | {res['write_s']:.2f} | {pred} | {res['write_gb_s']:.2f} "
          f"| {res['raw_write_gb_s']:.2f} | {res['write_vs_raw']:.2f} "
          f"| {res['load_s']:.2f} | {res['load_gb_s']:.2f} | {res['step_interval_s']:.3f} "
          f"| {res['cancel_in_step_s']:.2f} | {res['cancel_in_checkpoint_s']:.2f} |")
    print(f"\ncheckpoint write {res['write_gb_s']:.2f} GB/s, raw disk write {res['raw_write_gb_s']:.2f} GB/s "
          f"({fmt_gb(res['raw_bytes'])} GB in {res['raw_write_s']:.1f} s) in {args.ckpt_root}: "
          f"{res['write_vs_raw']:.2f} of the disk's rate")
    return 0


if __name__ == "__main__":
    sys.exit(main())
