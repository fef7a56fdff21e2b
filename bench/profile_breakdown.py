"""One training step's device time by category, from ftd's own PROFILE jobs: GEMM, attention,
cross-entropy, optimizer, elementwise/norm/rope, communication, and idle/gaps (the step's wall time
less the busy device time). Runs one PROFILE job per shape through ftd + ftctl (the LLaMA-3.1-8B
shape, the fused kernel set, bf16), reads its per-op report (`ftctl profile JOB -o json`) and prints
one markdown table, shapes side by side. Writes profile_breakdown.json to --out.

  python3 bench/profile_breakdown.py --build build-gpu --out DIR [--shapes 4x2048,1x512] [--kernel-set fused]
      [--set activation_checkpointing=selective]
  python3 bench/profile_breakdown.py --report REPORT.json [...]   # a saved report: the table only

Every op row is mapped by CATEGORY_RULES, in order, first match wins: on the op's name (a LibTorch op,
one of ftd's kernels, or a device kernel no op claimed) and on the category ftd's profiler gave it
(worker/engine/profiler.cc). The cross-entropy row is the fused linear cross-entropy's own kernels;
its logits GEMMs count as GEMM.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

CATEGORIES = ("GEMM", "attention", "cross-entropy", "optimizer", "elementwise/norm/rope", "communication", "other")
IDLE = "idle/gaps"

# (category, op-name pattern or None, ftd profiler categories or None): a rule matches when every
# part given matches. Collectives come first (NCCL kernels and c10d ops carry no ftd category).
CATEGORY_RULES = [
    ("communication", r"nccl|c10d::|gloo|all_?reduce|all_?gather|reduce_?scatter", None),
    ("GEMM", r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm|addmv|mv)$", None),
    ("GEMM", r"gemm|cutlass|nvjet|xmma|cublas|sm\d+_.*(tn|nt|nn|tt)", None),
    ("GEMM", None, {"matmul"}),
    ("attention", None, {"attention"}),
    ("cross-entropy", None, {"cross_entropy"}),
    ("optimizer", None, {"optimizer"}),
    ("elementwise/norm/rope", None, {"rmsnorm", "rope", "swiglu", "lora", "other"}),
]


def category_of(op):
    """The breakdown category of one row of a ProfileReport's ops ({name, category, ...})."""
    name, cat = op.get("name", ""), op.get("category", "other")
    for out, pattern, cats in CATEGORY_RULES:
        if pattern is not None and not re.search(pattern, name, re.IGNORECASE):
            continue
        if cats is not None and cat not in cats:
            continue
        return out
    return "other"


def breakdown(report):
    """ProfileReport (ftctl profile -o json) -> {category: ms per step, IDLE: ..., "wall": ..., "busy": ...}."""
    ms = {c: 0.0 for c in CATEGORIES}
    for op in report.get("ops", []):
        ms[category_of(op)] += float(op.get("device_ms", 0.0))
    busy = float(report.get("step_device_ms", 0.0))
    wall = float(report.get("step_wall_ms", 0.0))
    ms[IDLE] = wall - busy
    ms["busy"], ms["wall"] = busy, wall
    return ms


def table(columns):
    """[(label, breakdown)] -> markdown: ms per step and share of the wall time, one column per label."""
    lines = ["| category | " + " | ".join(f"{label} (ms) | share" for label, _ in columns) + " |",
             "|---|" + "---:|---:|" * len(columns)]
    for c in CATEGORIES + (IDLE, "wall"):
        cells = []
        for _, b in columns:
            share = b[c] / b["wall"] if b["wall"] > 0 else 0.0
            cells.append(f"{b[c]:.2f} | {100 * share:.1f}%")
        name = "step wall time" if c == "wall" else c
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def profile_job(ftctl, spec_path, shape, kernel_set, sets=()):
    """Submits a PROFILE job at `shape` (with ftctl's --set KEY=VALUE for each of `sets`), waits for it,
    returns its report."""
    run = lambda *a: subprocess.run(ftctl + list(a), capture_output=True, text=True)
    extra = [x for kv in sets for x in ("--set", kv)]
    p = run("submit", str(spec_path), "--kind", "profile", "--name", f"breakdown-{shape}",
            "--set", f"kernel_set={kernel_set}", *extra)
    job = p.stdout.strip()
    if p.returncode != 0 or not job:
        raise RuntimeError(f"submit {shape}: {p.stderr.strip()}")
    w = run("wait", job)
    print(f"# {shape} {job}: {w.stdout.strip()} {w.stderr.strip()}", flush=True)
    if w.returncode != 0:
        raise RuntimeError(f"PROFILE job {job} at {shape} did not succeed: {w.stdout.strip()} {w.stderr.strip()}")
    report = json.loads(run("profile", job, "-o", "json").stdout or "{}")
    report["job"] = job
    return report


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", help="build directory with server/ftd, client/ftctl, worker/ftd-worker")
    ap.add_argument("--report", action="append", help="a saved ProfileReport JSON instead of running jobs")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    ap.add_argument("--shapes", default="4x2048,1x512")
    ap.add_argument("--kernel-set", default="fused")
    ap.add_argument("--preset", default="llama-3.1-8b")
    ap.add_argument("--vocab", type=int, default=128256, help="token ids drawn below this (the preset's vocab_size)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a spec field for every job, as ftctl submit --set takes it (activation_checkpointing=selective)")
    args = ap.parse_args()
    columns = []
    if args.report:
        for path in args.report:
            columns.append((Path(path).stem, json.loads(Path(path).read_text())))
    else:
        if not args.build:
            sys.exit("profile_breakdown: give --build (run PROFILE jobs) or --report (a saved report)")
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from ftdbench import start_ftd, token_file
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        shapes = [s for s in args.shapes.split(",") if s]
        tmp = Path(tempfile.mkdtemp(prefix="ftd-breakdown-"))
        most = max(int(b) * (int(t) + 1) for b, t in (s.split("x") for s in shapes))
        tokens = token_file(tmp / "tokens.u32", most * (args.warmup + args.steps + 1), vocab=args.vocab)
        failed = []
        ftd, ftctl, _ = start_ftd(Path(args.build), tmp / "ftd-data", out / "ftd-breakdown.log")
        try:
            for shape in shapes:
                b, t = (int(x) for x in shape.split("x"))
                spec = {"model": {"preset": args.preset}, "data": {"path": str(tokens), "token_dtype": "uint32"},
                        "batch_size": b, "seq_len": t, "device": args.device, "dtype": args.dtype,
                        "optimizer": {"lr": 1e-5}, "profile": {"warmup_steps": args.warmup, "steps": args.steps}}
                spec_path = tmp / f"spec-{shape}.json"
                spec_path.write_text(json.dumps(spec))
                try:
                    columns.append((shape, profile_job(ftctl, spec_path, shape, args.kernel_set, args.set)))
                except RuntimeError as e:  # e.g. a shape this GPU cannot hold: the others still run
                    print(f"# {shape}: {e}", flush=True)
                    failed.append(shape)
        finally:
            ftd.terminate()
            ftd.wait(timeout=60)
        (out / "profile_breakdown.json").write_text(json.dumps(
            {label: {"breakdown": breakdown(r), "report": r} for label, r in columns}, indent=1))
    if not columns:
        sys.exit("profile_breakdown: no PROFILE job succeeded")
    device = {r.get("device", "?") for _, r in columns}
    print(f"\nOne step's device time by category ({args.kernel_set} set; device {', '.join(sorted(device))}; "
          f"idle/gaps = step wall time - busy device time):\n")
    print(table([(label, breakdown(r)) for label, r in columns]), flush=True)


if __name__ == "__main__":
    main()
