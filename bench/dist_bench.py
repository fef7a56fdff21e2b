"""Data-parallel scaling on one host: the LLaMA-3.1-8B shape (random init, bf16, fused kernel set) at
B x T per GPU on 1 GPU and on N GPUs (one ftd-worker process per rank, NCCL), with and without
ZeRO-1 (optimizer.shard_state), in one invocation. Prints a markdown table and writes
dist_bench.json: the job's tokens/s (all ranks), the scaling efficiency against N x the 1-GPU run,
the largest per-rank peak memory, and the step's un-overlapped communication wait.

  python3 bench/dist_bench.py --worker build-gpu/worker/ftd-worker --out DIR [--gpus 2] [--shape 4x2048]
      [--steps 13] [--warmup 3]

A 1-GPU run of the 8B shape at 4x2048 needs ~81 GiB (docs/performance.md): on 80 GB cards it runs
out of memory, and the 1-GPU baseline is then reported as such (ZeRO-1 is what makes it fit there).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def run(worker, tokens, gpus, b, t, steps, shard, work):
    spec = {"model": {"preset": "llama-3.1-8b"}, "data": {"path": str(tokens), "token_dtype": "uint32"},
            "steps": steps, "batch_size": b, "seq_len": t, "device": "cuda", "dtype": "bf16", "kernel_set": "fused",
            "gpus": gpus, "checkpoint": {"enabled": False},
            "optimizer": {"lr": 1e-5, "weight_decay": 0.1, "grad_clip": 1.0, "shard_state": shard}}
    name = f"g{gpus}-{'zero1' if shard else 'plain'}"
    path = work / f"{name}.json"
    path.write_text(json.dumps(spec))
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    store = work / f"{name}.store"
    procs = [subprocess.Popen([str(worker), "run", str(path), "--rank", str(r), "--store", str(store)],
                              stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL,
                              stderr=open(work / f"{name}.rank{r}.log", "w"), text=True, env=env)
             for r in range(gpus)]
    out = procs[0].communicate()[0]
    codes = [p.wait() for p in procs]
    lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    result = next((l for l in lines if l["event"] == "result"), {"outcome": "FAILED", "message": f"exit codes {codes}"})
    return name, [l for l in lines if l["event"] == "step"], result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--shape", default="4x2048")
    ap.add_argument("--steps", type=int, default=13)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    b, t = (int(x) for x in a.shape.split("x"))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="dist-bench-"))
    tokens = work / "tokens.bin"
    rows = a.gpus * b * (a.steps + 1)
    np.random.default_rng(0).integers(0, 128256, size=rows * (t + 1), dtype=np.uint32).tofile(tokens)
    runs = []
    for gpus, shard in [(1, False), (a.gpus, False), (a.gpus, True)]:
        name, steps, result = run(a.worker, tokens, gpus, b, t, a.steps, shard, work)
        meas = steps[a.warmup:]
        r = {"run": name, "gpus": gpus, "zero1": shard, "outcome": result["outcome"], "message": result.get("message", "")}
        if meas and result["outcome"] == "SUCCEEDED":
            r.update(tokens_per_s=statistics.median(s["tokens_per_s"] for s in meas),
                     step_time_s=statistics.median(s["step_time_s"] for s in meas),
                     comm_wait_s=statistics.median(s.get("comm_wait_s", 0.0) for s in meas),
                     max_rank_peak_gib=max(s["max_rank_peak_mem_allocated_bytes"] for s in meas) / 2**30,
                     loss_first=steps[0]["loss"], loss_last=steps[-1]["loss"])
        runs.append(r)
        print(json.dumps(r), file=sys.stderr)
    base = runs[0].get("tokens_per_s")
    print(f"LLaMA-3.1-8B shape, bf16, fused, {b}x{t} per GPU, {a.steps} steps ({a.warmup} warm-up), median\n")
    print("| GPUs | ZeRO-1 | tokens/s (job) | x 1 GPU | efficiency | step (s) | comm wait (s) | max per-rank peak |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        if "tokens_per_s" not in r:
            print(f"| {r['gpus']} | {'yes' if r['zero1'] else 'no'} | {r['outcome']}: {r['message'][:80]} | | | | | |")
            continue
        speedup = r["tokens_per_s"] / base if base else None
        eff = speedup / r["gpus"] if speedup else None
        print(f"| {r['gpus']} | {'yes' if r['zero1'] else 'no'} | {r['tokens_per_s']:,.0f} | "
              f"{'' if speedup is None else f'{speedup:.2f}'} | {'' if eff is None else f'{eff:.1%}'} | "
              f"{r['step_time_s']:.3f} | {r['comm_wait_s']:.3f} | {r['max_rank_peak_gib']:.1f} GiB |")
    (out / "dist_bench.json").write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
