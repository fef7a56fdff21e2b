"""One training step's device time by category, from ftd's own PROFILE jobs: GEMM, attention,
cross-entropy, optimizer, elementwise/norm/rope, communication, and idle/gaps (the step's wall time
less the busy device time). Runs one PROFILE job per shape through ftd + ftctl (the LLaMA-3.1-8B
shape, the fused kernel set, bf16), reads its per-op report (`ftctl profile JOB -o json`) and prints
one markdown table, shapes side by side. Writes profile_breakdown.json to --out.

  python3 bench/profile_breakdown.py --build build-gpu --out DIR [--shapes 4x2048,1x512] [--kernel-set fused]
      [--set activation_checkpointing=selective]
  python3 bench/profile_breakdown.py --report REPORT.json [...]   # a saved report: the table only
  python3 bench/profile_breakdown.py --trace LABEL=TRACE.json[.gz] [...]   # kernel-level, see below

--trace: a Chrome/Perfetto trace (ftd's PROFILE trace from `ftctl profile ID --trace`, or torch.profiler's
from `hf_train.py --profile-trace` for a peer) broken down kernel by kernel into TRACE_CATEGORIES, the
same rules for both, so that ftd and a peer are compared on one table: a kernel's category comes from
its name and the ops that launched it (its launching op and that op's enclosing ops, by time on the
launching thread). FP8 GEMMs are the kernels under aten::_scaled_mm; casts/amax/transposes are the
kernels under ftd's fp8 casts (the RMSNorm and SwiGLU kernels that write E4M3 included) and the byte
copies inside the fp8 autograd functions, and for a compiled peer the Triton kernels whose fused ops
name an amax, abs, clamp or float8 conversion. Wall time per step is the span from the first kernel's
start to the last kernel's end divided by the steps; idle/gaps is that less the union of kernel time.
With --build and --trace-dir, each PROFILE job's trace is also downloaded and broken down this way.

Every op row is mapped by CATEGORY_RULES, in order, first match wins: on the op's name (a LibTorch op,
one of ftd's kernels, or a device kernel no op claimed) and on the category ftd's profiler gave it
(worker/engine/training/profiler.cc). The cross-entropy row is the fused linear cross-entropy's own kernels;
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


TRACE_CATEGORIES = ("GEMM bf16", "GEMM fp8", "casts/amax/transposes", "attention", "norms/elementwise/rope",
                    "cross-entropy", "optimizer", "communication", "other")

# (category, kernel-name pattern or None, launching-ops pattern or None), first match wins; the ops
# pattern is searched in the launching op's name and in each of its enclosing ops' names.
TRACE_RULES = [
    ("communication", r"nccl", None),
    ("attention", r"flash|fmha|attention|sdpa", None),
    ("attention", None, r"scaled_dot_product|_flash_attention|_efficient_attention|_cudnn_attention"),
    ("GEMM fp8", None, r"aten::_scaled_mm"),
    ("GEMM bf16", r"gemm|nvjet|cutlass|xmma|cublas|splitKreduce|sm\d+_.*_(tn|nt|nn|tt)\b", None),
    ("GEMM bf16", None, r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|addmv|mv)\b"),
    ("casts/amax/transposes", r"(?i)fp8|float8|amax|abs|clamp", None),
    ("casts/amax/transposes", None, r"ftd::(fp8_cast|rmsnorm_fp8|swiglu_fp8)|fp8::|Float8|float8"),
    ("cross-entropy", r"(?i)softmax|nll|cross_?entropy|LinearCe", None),
    ("cross-entropy", None, r"ftd::(linear_)?cross_entropy|log_softmax|nll_loss|cross_entropy"),
    ("optimizer", r"(?i)adam|multi_tensor|foreach", None),
    ("optimizer", None, r"ftd::adamw|Optimizer\.step|_fused_adamw|_foreach|clip_grad_norm|ftd::phase::optimizer"),
    ("norms/elementwise/rope", r".", None),
]


def kernel_category(kernel, ops):
    """The TRACE_CATEGORIES entry of a device kernel, given its name and the names of the ops that
    launched it (innermost first)."""
    for out, kpat, opat in TRACE_RULES:
        if kpat is not None and not re.search(kpat, kernel):
            continue
        if opat is not None and not any(re.search(opat, o) for o in ops):
            continue
        return out
    return "other"


def load_trace(path):
    import gzip
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def trace_breakdown(trace, steps):
    """A Chrome trace of `steps` training steps -> {category: ms per step, IDLE, "busy", "wall",
    "kernels": {name: [category, ms per step, launches per step]}}."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    host = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation", "python_function")]
    device = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not device:
        raise ValueError("the trace has no device kernels")
    # The enclosing op of each host event: nesting by time on its thread.
    host.sort(key=lambda e: (e.get("pid"), e.get("tid"), float(e["ts"]), -float(e.get("dur", 0))))
    parent, stack = [-1] * len(host), []
    for i, e in enumerate(host):
        te = float(e["ts"]) + float(e.get("dur", 0))
        while stack and ((host[stack[-1]].get("pid"), host[stack[-1]].get("tid")) != (e.get("pid"), e.get("tid"))
                         or float(host[stack[-1]]["ts"]) + float(host[stack[-1]].get("dur", 0)) < te):
            stack.pop()
        parent[i] = stack[-1] if stack else -1
        stack.append(i)
    by_ext = {}
    for i, e in enumerate(host):
        ext = (e.get("args") or {}).get("External id")
        if ext is not None and e.get("cat") == "cpu_op":
            by_ext.setdefault(ext, i)
    cat_ms = {c: 0.0 for c in TRACE_CATEGORIES}
    kernels = {}
    spans = []
    for d in device:
        ext = (d.get("args") or {}).get("External id")
        ops, i = [], by_ext.get(ext, -1)
        while i >= 0:
            ops.append(host[i]["name"])
            i = parent[i]
        name = d["name"]
        c = kernel_category(name, ops) if d.get("cat") == "kernel" else "norms/elementwise/rope"
        ms = float(d.get("dur", 0)) / 1e3
        cat_ms[c] += ms
        k = kernels.setdefault(name, [c, 0.0, 0])
        k[1] += ms
        k[2] += 1
        spans.append((float(d["ts"]), float(d["ts"]) + float(d.get("dur", 0))))
    spans.sort()
    busy, cur_s, cur_e = 0.0, spans[0][0], spans[0][1]
    for s_, e_ in spans[1:]:
        if s_ > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s_, e_
        else:
            cur_e = max(cur_e, e_)
    busy += cur_e - cur_s
    wall = (spans[-1][1] - spans[0][0]) / 1e3
    out = {c: v / steps for c, v in cat_ms.items()}
    out["busy"], out["wall"] = busy / 1e3 / steps, wall / steps
    out[IDLE] = out["wall"] - out["busy"]
    out["kernels"] = {n: [c, ms / steps, cnt / steps] for n, (c, ms, cnt) in
                      sorted(kernels.items(), key=lambda kv: -kv[1][1])}
    return out


def trace_table(columns):
    """[(label, trace_breakdown)] -> markdown, ms per step and share of the wall time. Kernel time on
    several streams at once counts in each category, so the categories may add up to more than busy."""
    lines = ["| category | " + " | ".join(f"{label} (ms) | share" for label, _ in columns) + " |",
             "|---|" + "---:|---:|" * len(columns)]
    for c in TRACE_CATEGORIES + (IDLE, "wall"):
        cells = []
        for _, b in columns:
            share = b[c] / b["wall"] if b["wall"] > 0 else 0.0
            cells.append(f"{b[c]:.2f} | {100 * share:.1f}%")
        lines.append(f"| {'step wall time' if c == 'wall' else c} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


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


def profile_job(ftctl, spec_path, shape, kernel_set, sets=(), trace=None):
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
    if trace is not None:
        t = run("profile", job, "--trace", str(trace))
        if t.returncode != 0:
            raise RuntimeError(f"trace of {job}: {t.stderr.strip()}")
    return report


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", help="build directory with server/ftd, client/ftctl, worker/ftd-worker")
    ap.add_argument("--report", action="append", help="a saved ProfileReport JSON instead of running jobs")
    ap.add_argument("--trace", action="append", default=[], metavar="LABEL=PATH[:STEPS]",
                    help="a saved Chrome trace of STEPS steps (default 2): the kernel-level table")
    ap.add_argument("--trace-dir", help="with --build: download each PROFILE job's trace here (trace-SHAPE.json) "
                                        "and print the kernel-level table too")
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
    columns, traces = [], []
    for t in args.trace:
        label, _, rest = t.partition("=")
        path, _, steps = rest.rpartition(":") if rest.rpartition(":")[2].isdigit() else (rest, "", "2")
        traces.append((label, trace_breakdown(load_trace(path), int(steps))))
    if args.trace and not args.report and not args.build:
        print_traces(traces, args.out)
        return
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
                    trace = Path(args.trace_dir) / f"trace-{args.kernel_set}-{shape}.json" if args.trace_dir else None
                    if trace is not None:
                        trace.parent.mkdir(parents=True, exist_ok=True)
                    columns.append((shape, profile_job(ftctl, spec_path, shape, args.kernel_set, args.set, trace)))
                    if trace is not None:
                        traces.append((f"{args.kernel_set} {shape}", trace_breakdown(load_trace(trace), args.steps)))
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
    if traces:
        print_traces(traces, args.out)


def print_traces(traces, out):
    print("\nKernel-level breakdown (ms per step; the same rules for every trace):\n")
    print(trace_table(traces), flush=True)
    for label, b in traces:
        print(f"\n{label}: the 25 kernels with the most time (ms per step, launches per step)")
        for name, (c, ms, n) in list(b["kernels"].items())[:25]:
            print(f"  {ms:9.2f}  {n:7.1f}  {c:24s} {name[:150]}")
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "trace_breakdown.json").write_text(json.dumps(dict(traces), indent=1))


if __name__ == "__main__":
    main()
