"""LoRA training benchmark on a GPU: the LLaMA-3.1-8B shape, LoRA rank 16 (alpha 32) on all seven
projections, bf16 base, fp32 adapters, with ftd-worker (kernel sets eager and fused, and fused with
the lora op eager: the grouped LoRA path's before/after) against HF transformers + PEFT (sdpa,
torch.optim.AdamW(fused=True)), one after the other in the same invocation on the same token
windows. Reports tokens/s and peak memory, and each ftd run's measured peak against the peak
spec/peak_memory.h predicts (the worker logs it). Prints markdown tables, writes lora_bench.json.

  python3 bench/lora_bench.py --worker build-gpu/worker/ftd-worker --out DIR
      [--shapes 1x2048,4x2048] [--impls eager,fused,fused-lora-eager,hf] [--mem-shapes 2x1024,8x512,1x8192]

An impl may carry train_bench.py's options: `fused+ac=full` (spec.activation_checkpointing),
`fused+es`, `fused+fp`. The 4x2048 memory line with activation checkpointing:
  lora_bench.py --shapes 4x2048 --impls fused,fused+ac=selective,fused+ac=full,hf --mem-shapes ""
"""
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from train_bench import ftd_options  # noqa: E402
import bench_cli  # noqa: E402
GIB = 2**30
IMPLS = {"eager": {"kernel_set": "eager"}, "fused": {"kernel_set": "fused"},
         "fused-lora-eager": {"kernel_set": "fused", "kernels": {"lora": "eager"}}}


def summarize(steps, warmup):
    meas = steps[warmup:] or steps[-1:]
    if not meas:
        return None
    return {"tokens_per_s": statistics.median(s["tokens_per_s"] for s in meas),
            "step_time_s": statistics.median(s["step_time_s"] for s in meas),
            "peak_alloc_gib": max(s["peak_mem_allocated_bytes"] for s in steps) / GIB,
            "peak_reserved_gib": max(s["peak_mem_reserved_bytes"] for s in steps) / GIB,
            "loss_first": steps[0]["loss"], "loss_last": steps[-1]["loss"], "measured_steps": len(meas)}


def run_ftd(worker, tokens, b, t, steps, impl, rank, alpha):
    spec = {"model": {"preset": "llama-3.1-8b"}, "data": {"path": str(tokens), "token_dtype": "uint32"},
            "steps": steps, "batch_size": b, "seq_len": t, "device": "cuda", "dtype": "bf16",
            "optimizer": {"lr": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "grad_clip": 1.0},
            "lora": {"rank": rank, "alpha": alpha}, "checkpoint": {"enabled": False}}
    spec.update(IMPLS[impl] if impl in IMPLS else ftd_options(impl))
    path = tokens.parent / f"spec-{impl}-{b}x{t}.json"
    path.write_text(json.dumps(spec))
    p = subprocess.run([str(worker), "run", str(path)], capture_output=True, text=True)
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    result = next((l for l in lines if l["event"] == "result"), {"outcome": "FAILED", "message": p.stderr[-2000:]})
    m = re.search(r"predicted (peak ([0-9.]+) GiB.*)", p.stderr)
    return {"impl": f"ftd-{impl}", "steps": [l for l in lines if l["event"] == "step"], "outcome": result["outcome"],
            "message": result.get("message", ""), "predicted_gib": float(m.group(2)) if m else None,
            "predicted": m.group(1) if m else None}


def run_hf(tokens, b, t, steps, rank, alpha):
    p = subprocess.run([sys.executable, str(HERE / "hf_lora_train.py"), "--tokens", str(tokens), "--batch", str(b),
                        "--seq", str(t), "--steps", str(steps), "--rank", str(rank), "--alpha", str(alpha)],
                       capture_output=True, text=True)
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"impl": "hf-peft", "outcome": "FAILED", "message": p.stderr[-2000:], "steps": []}


def main():
    ap = bench_cli.parser(worker=True)
    ap.add_argument("--shapes", default="1x2048,4x2048")
    ap.add_argument("--impls", default="eager,fused,fused-lora-eager,hf")
    ap.add_argument("--mem-shapes", default="2x1024,8x512,1x8192",
                    help="extra shapes run with ftd fused only, for measured vs predicted peak memory")
    bench_cli.add_steps(ap, steps=8, warmup=3)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32)
    args = ap.parse_args()
    out = bench_cli.out_dir(args)
    shapes, mem_shapes = bench_cli.shapes(args.shapes), bench_cli.shapes(args.mem_shapes)
    n = max(b * (t + 1) for b, t in shapes + mem_shapes) * (args.steps + 1)
    tokens = Path(tempfile.mkdtemp(prefix="ftd-lora-bench-")) / "tokens.u32"
    np.random.default_rng(0).integers(0, 128256, size=n, dtype=np.uint32).astype("<u4").tofile(tokens)
    rows = []
    plan = [(b, t, impl) for b, t in shapes for impl in args.impls.split(",")]
    plan += [(b, t, "fused") for b, t in mem_shapes]
    for b, t, impl in plan:
        if impl == "hf":
            r = run_hf(tokens, b, t, args.steps, args.rank, args.alpha)
        else:
            r = run_ftd(args.worker, tokens, b, t, args.steps, impl, args.rank, args.alpha)
        r.update(batch=b, seq=t, summary=summarize(r["steps"], args.warmup) if r["outcome"] == "SUCCEEDED" else None)
        rows.append(r)
        print(f"# {r['impl']} {b}x{t}: {r['outcome']} {r.get('message', '')[:300]}", flush=True)
        print(json.dumps(r["summary"]), flush=True)
        if r.get("predicted"):
            print(f"#   predicted {r['predicted']}", flush=True)
    (out / "lora_bench.json").write_text(json.dumps(rows, indent=1))

    print("\n| shape | impl | tokens/s | vs HF+PEFT | step (s) | peak alloc (GiB) | peak reserved (GiB) | loss first -> last |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for r in rows[: len(shapes) * len(args.impls.split(","))]:
        s = r["summary"]
        hf = next((x["summary"] for x in rows if x["impl"] == "hf-peft" and x["batch"] == r["batch"]
                   and x["seq"] == r["seq"] and x["summary"]), None)
        if s is None:
            print(f"| {r['batch']}x{r['seq']} | {r['impl']} | {r['outcome']} | | | | | |")
            continue
        ratio = f"{s['tokens_per_s'] / hf['tokens_per_s']:.2f}" if hf else "-"
        print(f"| {r['batch']}x{r['seq']} | {r['impl']} | {s['tokens_per_s']:,.0f} | {ratio} | {s['step_time_s']:.3f} | "
              f"{s['peak_alloc_gib']:.1f} | {s['peak_reserved_gib']:.1f} | {s['loss_first']:.3f} -> {s['loss_last']:.3f} |")
    print("\n| shape | impl | measured peak (GiB) | predicted (GiB) | error |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        if r["summary"] and r.get("predicted_gib"):
            m, p = r["summary"]["peak_alloc_gib"], r["predicted_gib"]
            print(f"| {r['batch']}x{r['seq']} | {r['impl']} | {m:.2f} | {p:.2f} | {100 * (p - m) / m:+.1f}% |")


if __name__ == "__main__":
    main()
