"""End-to-end training benchmark on a GPU: ftd-worker with the eager and the fused kernel sets
against HF transformers peers, the LLaMA-3.1-8B shape, same token windows, same hyperparameters,
run one after the other in the same invocation. Prints a markdown table and writes train_bench.json.
A run that runs out of memory is recorded as such and the benchmark goes on.

  python3 bench/train_bench.py --worker build-gpu/worker/ftd-worker --out DIR [--shapes 1x512,4x2048,8x2048]
      [--impls eager,fused,hf] [--repeat N] [--base-worker OTHER/ftd-worker] [--peer-gc auto|on|off]

ftd impls: a kernel set with options joined by `+`: `fused+ac=selective` (spec.activation_checkpointing),
`fused+es` (spec.expandable_segments), `fused+fp` (spec.kernel_tuning.fused_projections),
`fused+fcl=N` (spec.full_checkpoint_layers), `fused+nc` (optimizer.grad_clip 0), `fp8+fa` (kernel_tuning.fp8_fast_accum), `fused+ov`
(spec.optimizer.overlap, which needs grad_clip 0: nc implied), `fused+cg` (spec.kernel_tuning.cuda_graphs), e.g. `fused+ac=full+es` or `fused+ac=selective+fcl=16`.
Peers: `hf` (HF eager, sdpa, fused AdamW), `hf-compile` (torch.compile), `hf-liger` (Liger-Kernel), `hf-float8` (torchao float8 training + torch.compile). Each peer
runs first as its users run it, without gradient checkpointing; --peer-gc auto (default) reruns a peer that
ran out of memory with HF's gradient checkpointing, and the table names that row `+gc` (the peer ran
handicapped). `on` always uses it, `off` never.
--ftd-ac auto (default) reruns an ftd impl that ran out of memory with activation_checkpointing selective,
then full (named `+ac=...` in the table); `off` records the out-of-memory run.
--largest runs each peer at the largest of --shapes that runs (largest first; smaller ones only after a
failure); --run-timeout stops a peer's run after that many seconds and --budget-s caps all the peers'
runs together (a run past either is recorded as TIMEOUT, one not started as SKIPPED).

The issue-14 table in three commands (about 10 minutes each on an H200, estimated; scripts/gpu.sh stages
perf, perf-long and perf-peers):
  train_bench.py --shapes 1x512,4x2048,8x2048,16x2048 --impls fused,fused+es,fused+ac=selective,fused+ac=full
  train_bench.py --shapes 1x8192,2x8192,1x32768 --impls fused,fused+ac=selective,fused+ac=full --steps 8
  train_bench.py --shapes 8x2048,4x2048 --impls hf,hf-compile,hf-liger --largest --steps 6 --warmup 2 --run-timeout 150 --budget-s 420

The fp8 table (scripts/gpu.sh stage fp8): ftd's fp8 set against its bf16 fused set and HF + torchao float8:
  train_bench.py --shapes 4x2048,8x2048,2x8192 --impls fused,fp8,hf-float8 --steps 10 --warmup 3 --baseline ftd-fused

With --base-worker, an impl written `fused@base` (or `eager@base`) runs that kernel set on the other
build (another commit's ftd-worker), so two versions of ftd are compared in one invocation on the
same machine; --repeat alternates them to spread drift evenly.
"""
import json
import statistics
import subprocess
import tempfile
import time
import sys
from pathlib import Path

import numpy as np
import bench_cli  # noqa: E402

HERE = Path(__file__).resolve().parent


def summarize(steps, warmup):
    meas = steps[warmup:]
    if not meas:
        return None
    return {"tokens_per_s": statistics.median(s["tokens_per_s"] for s in meas),
            "step_time_s": statistics.median(s["step_time_s"] for s in meas),
            "peak_alloc_gib": max(s["peak_mem_allocated_bytes"] for s in meas) / 2**30,
            "peak_reserved_gib": max(s["peak_mem_reserved_bytes"] for s in meas) / 2**30,
            "mfu": statistics.median(s.get("mfu", 0.0) for s in meas),
            # NVML (ftd only): the last report's window of >= 1 s of whole steps
            "joules_per_token": meas[-1].get("joules_per_token", 0.0) if meas[-1].get("nvml_available") else None,
            "power_w": meas[-1].get("power_w", 0.0) if meas[-1].get("nvml_available") else None,
            "loss_first": steps[0]["loss"], "loss_last": steps[-1]["loss"], "measured_steps": len(meas)}


def run_ours(worker, tokens, b, t, steps, out_dir, extra):
    spec = {"model": {"preset": "llama-3.1-8b"}, "data": {"path": str(tokens), "token_dtype": "uint32"},
            "steps": steps, "batch_size": b, "seq_len": t, "device": "cuda", "dtype": "bf16",
            "optimizer": {"lr": 1e-5, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "grad_clip": 1.0}}
    for key, value in extra.items():  # nested fields (optimizer.overlap) keep their block's other fields
        spec[key] = {**spec[key], **value} if isinstance(value, dict) and isinstance(spec.get(key), dict) else value
    path = tokens.parent / f"spec-{b}x{t}.json"
    path.write_text(json.dumps(spec))
    p = subprocess.run([str(worker), "run", str(path)], capture_output=True, text=True)
    sys.stderr.write("".join(l + "\n" for l in p.stderr.splitlines() if "phases" in l))
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    result = next((l for l in lines if l["event"] == "result"), {"outcome": "FAILED", "message": p.stderr[-2000:]})
    if result["outcome"] == "FAILED" and "out of memory" in result.get("message", "").lower():
        result["outcome"] = "OUT_OF_MEMORY"
    return {"impl": f"ftd-{extra.get('kernel_set', 'eager')}", "steps": [l for l in lines if l["event"] == "step"], "outcome": result["outcome"],
            "message": result.get("message", "")}


def ftd_options(impl):
    """`fused+ac=full+es` -> ("fused", spec fields, label)."""
    ks, *opts = impl.split("+")
    extra = {"kernel_set": "eager" if ks == "ftd" else ks}
    for o in opts:
        key, _, value = o.partition("=")
        if key == "ac" and value in ("none", "selective", "full"):
            extra["activation_checkpointing"] = value
        elif key == "es" and not value:
            extra["expandable_segments"] = True
        elif key == "fp" and not value:
            extra.setdefault("kernel_tuning", {})["fused_projections"] = True
        elif key == "fcl" and value.isdigit():
            extra["full_checkpoint_layers"] = int(value)
        elif key == "cg" and not value:
            extra.setdefault("kernel_tuning", {})["cuda_graphs"] = True
        elif key == "nc" and not value:
            extra.setdefault("optimizer", {})["grad_clip"] = 0
        elif key == "fa" and not value:
            extra.setdefault("kernel_tuning", {})["fp8_fast_accum"] = True
        elif key == "ov" and not value:
            extra.setdefault("optimizer", {}).update(grad_clip=0, overlap=True)
        else:
            sys.exit(f"train_bench: unknown option {o!r} in impl {impl!r} (ac=none|selective|full, es, fp, fcl=N, nc, ov, cg, fa)")
    return extra


def run_hf(tokens, b, t, steps, variant, grad_ckpt, timeout=None):
    cmd = [sys.executable, str(HERE / "hf_train.py"), "--tokens", str(tokens), "--batch", str(b), "--seq", str(t),
           "--steps", str(steps), "--variant", variant] + (["--grad-ckpt"] if grad_ckpt else [])
    impl = f"hf-{variant}" + ("+gc" if grad_ckpt else "")
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"impl": impl, "outcome": "TIMEOUT", "message": f"stopped after {timeout} s (--run-timeout)", "steps": []}
    sys.stderr.write("".join(l + "\n" for l in p.stderr.splitlines() if "phases" in l))
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        oom = "out of memory" in p.stderr.lower()
        return {"impl": impl, "outcome": "OUT_OF_MEMORY" if oom else "FAILED", "message": p.stderr[-2000:], "steps": []}


def run_peer(tokens, b, t, steps, impl, peer_gc, timeout=None):
    """A peer as its users run it: without gradient checkpointing first; with `auto`, again with it only
    after a real out-of-memory run (the row is then named +gc: the peer ran handicapped)."""
    variant = {"hf": "eager", "hf-eager": "eager", "hf-compile": "compile", "hf-liger": "liger",
               "hf-float8": "float8"}[impl]
    r = run_hf(tokens, b, t, steps, variant, peer_gc == "on", timeout)
    if r["outcome"] == "OUT_OF_MEMORY" and peer_gc == "auto":
        print(f"# {r['impl']} {b}x{t}: OUT_OF_MEMORY; again with gradient checkpointing", flush=True)
        r = run_hf(tokens, b, t, steps, variant, True, timeout)
    return r


def peer_timeout(run_timeout, budget_s, elapsed):
    """Seconds the next peer run may take (None: no limit): the smaller of --run-timeout and what is left
    of --budget-s."""
    limits = [x for x in (run_timeout, None if budget_s is None else budget_s - elapsed) if x is not None]
    return min(limits) if limits else None


def main():
    ap = bench_cli.parser(worker=True)
    ap.add_argument("--shapes", default="1x512,4x2048,8x2048")
    bench_cli.add_steps(ap, steps=13, warmup=3)
    ap.add_argument("--impls", default="eager,fused,hf",
                    help="ftd kernel sets with options (fused+ac=selective, ...) and/or peers hf, hf-compile, hf-liger")
    ap.add_argument("--peer-gc", choices=["auto", "on", "off"], default="auto",
                    help="HF gradient checkpointing: auto = only after the peer ran out of memory without it")
    ap.add_argument("--ftd-ac", choices=["auto", "off"], default="auto",
                    help="auto: an ftd impl that ran out of memory runs again with activation checkpointing "
                         "selective, then full")
    ap.add_argument("--baseline", default="hf-eager",
                    help="the impl (label prefix) the ratio column divides by, at the same shape")
    ap.add_argument("--repeat", type=int, default=1, help="alternate the implementations this many times")
    ap.add_argument("--base-worker", help="another build's ftd-worker, for impls written KERNEL_SET@base")
    ap.add_argument("--largest", action="store_true",
                    help="peers: only the largest shape that runs (shapes tried largest first, with --peer-gc)")
    ap.add_argument("--run-timeout", type=float, help="seconds a peer's run may take (recorded as TIMEOUT)")
    ap.add_argument("--budget-s", type=float, help="seconds all the peers' runs may take together")
    args = ap.parse_args()
    out = bench_cli.out_dir(args)
    shapes = bench_cli.shapes(args.shapes)
    n = max(b * (t + 1) for b, t in shapes) * (args.steps + 1)
    tokens = Path(tempfile.mkdtemp(prefix="ftd-bench-")) / "tokens.u32"
    np.random.default_rng(0).integers(0, 128256, size=n, dtype=np.uint32).astype("<u4").tofile(tokens)
    rows = []
    t_start = time.monotonic()
    placed = set()  # --largest: the peers that already ran at a larger shape
    if args.largest:
        shapes.sort(key=lambda s: s[0] * s[1], reverse=True)
    for b, t in shapes:
        for impl in args.impls.split(",") * args.repeat:
            if impl.startswith("hf") and args.largest and impl in placed:
                continue
            if impl.startswith("hf"):
                timeout = peer_timeout(args.run_timeout, args.budget_s, time.monotonic() - t_start)
                if timeout is not None and timeout < 10:
                    r = {"impl": impl, "outcome": "SKIPPED", "message": "--budget-s spent", "steps": []}
                else:
                    r = run_peer(tokens, b, t, args.steps, impl, args.peer_gc, timeout)
                if args.largest and r["outcome"] == "SUCCEEDED":
                    placed.add(impl)
            else:
                ks, _, build = impl.partition("@")
                if build and not args.base_worker:
                    sys.exit(f"train_bench: --impls names {impl}: give --base-worker")
                worker = args.base_worker if build else args.worker
                r = run_ours(worker, tokens, b, t, args.steps, out, ftd_options(ks))
                r["impl"] = "ftd-" + ks + ("@" + build if build else "")
                # Out of memory: the same impl with less kept between forward and backward.
                for ac in ("selective", "full"):
                    if r["outcome"] != "OUT_OF_MEMORY" or args.ftd_ac == "off" or "ac=" in ks:
                        break
                    ks_ac = f"{ks}+ac={ac}"
                    print(f"# {r['impl']} {b}x{t}: OUT_OF_MEMORY; again with activation_checkpointing {ac}", flush=True)
                    r = run_ours(worker, tokens, b, t, args.steps, out, ftd_options(ks_ac))
                    r["impl"] = "ftd-" + ks_ac + ("@" + build if build else "")
            r.update(batch=b, seq=t, summary=summarize(r["steps"], args.warmup) if r["outcome"] == "SUCCEEDED" else None)
            rows.append(r)
            print(f"# {r['impl']} {b}x{t}: {r['outcome']} {r.get('message', '')[:300]}", flush=True)
            print(json.dumps(r["summary"]), flush=True)
    (out / "train_bench.json").write_text(json.dumps(rows, indent=1))
    print(f"\n| shape | impl | tokens/s | vs {args.baseline} | step (s) | peak alloc (GiB) | peak reserved (GiB) | MFU | J/token | power (W) | loss first -> last |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        s = r["summary"]
        hf_runs = [x["summary"]["tokens_per_s"] for x in rows if x["impl"].startswith(args.baseline)
                   and x["batch"] == r["batch"] and x["seq"] == r["seq"] and x["summary"]]
        hf = {"tokens_per_s": statistics.median(hf_runs)} if hf_runs else None
        if s is None:
            print(f"| {r['batch']}x{r['seq']} | {r['impl']} | {r['outcome']} | | | | | | | | |")
            continue
        ratio = f"{s['tokens_per_s'] / hf['tokens_per_s']:.3f}" if hf else "-"
        print(f"| {r['batch']}x{r['seq']} | {r['impl']} | {s['tokens_per_s']:.0f} | {ratio} | {s['step_time_s']:.3f} | "
              f"{s['peak_alloc_gib']:.1f} | {s['peak_reserved_gib']:.1f} | {100 * s['mfu']:.1f}% | "
              f"{'-' if s.get('joules_per_token') is None else format(s['joules_per_token'], '.3f')} | "
              f"{'-' if s.get('power_w') is None else format(s['power_w'], '.0f')} | "
              f"{s['loss_first']:.3f} -> {s['loss_last']:.3f} |")
    if any(r["impl"].startswith("hf") and "+gc" in r["impl"] for r in rows):
        print("\n+gc: the peer ran out of memory as its users run it and was rerun with gradient checkpointing "
              "(handicapped).")


if __name__ == "__main__":
    main()
