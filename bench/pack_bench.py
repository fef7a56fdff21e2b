"""Two LoRA jobs sharing one GPU through the service, against one job alone: the LLaMA-3.1-8B shape,
LoRA rank 16 on all seven projections, bf16 base, fused kernels. Starts ftd with two slots on GPU 0
(--gpus 1 --jobs-per-gpu 2), shows `ftctl submit --dry-run` (predicted peak, placement), runs one job
alone, then two at once, and reports each job's tokens/s (median over the steps both ran together),
their total against the job alone, the measured peaks against the prediction, and the slots and
Prometheus gauges that show the sharing. Prints a markdown table, writes pack_bench.json.

  python3 bench/pack_bench.py --build build-gpu --out DIR [--batch 4] [--seq 2048] [--steps 40]
"""
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from ftdbench import start_ftd, token_file  # noqa: E402
import bench_cli  # noqa: E402

GIB = 2**30


def spec(tokens, b, t, steps, rank):
    return {"model": {"preset": "llama-3.1-8b"}, "data": {"path": str(tokens), "token_dtype": "uint32"},
            "steps": steps, "batch_size": b, "seq_len": t, "device": "cuda", "dtype": "bf16", "kernel_set": "fused",
            "log_every": 1, "optimizer": {"lr": 1e-4}, "lora": {"rank": rank, "alpha": 2 * rank},
            "checkpoint": {"enabled": False}}


def run(ftctl, *args, stdin=None, check=True):
    p = subprocess.run(ftctl + list(args), capture_output=True, text=True, input=stdin, timeout=3600)
    if check and p.returncode != 0:
        raise RuntimeError(f"ftctl {' '.join(args)}: {p.stderr.strip()}")
    return p.stdout


def submit(ftctl, s, name):
    return run(ftctl, "submit", "-", "--name", name, stdin=json.dumps(s)).strip()


def steps_of(ftctl, job):
    """The job's step reports, each with the daemon's receive time (unix ms)."""
    out = []
    for line in run(ftctl, "watch", job, "-o", "json").splitlines():
        e = json.loads(line)
        if "step" in e:
            out.append(dict(e["step"], unix_ms=int(e["unix_ms"])))
    return out


def gauges(metrics_addr):
    text = urllib.request.urlopen(f"http://{metrics_addr}/metrics", timeout=5).read().decode()
    return [l for l in text.splitlines() if l.startswith(("ftd_gpu_jobs", "ftd_gpu_predicted_bytes"))]


def median_tps(steps, warmup, lo=None, hi=None):
    sel = [s for s in steps[warmup:] if (lo is None or s["unix_ms"] >= lo) and (hi is None or s["unix_ms"] <= hi)]
    return (statistics.median(s["tokens_per_s"] for s in sel), len(sel)) if sel else (None, 0)


def peak_gib(steps):
    return max((s.get("peak_mem_allocated_bytes", 0) for s in steps), default=0) / GIB


def main():
    ap = bench_cli.parser(build=True, build_default="build-gpu")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    bench_cli.add_steps(ap, steps=40, warmup=5)
    ap.add_argument("--rank", type=int, default=16)
    args = ap.parse_args()
    out = bench_cli.out_dir(args)
    tmp = Path(tempfile.mkdtemp(prefix="ftd-pack-bench-"))
    tokens = token_file(tmp / "tokens.u32", args.batch * (args.seq + 1) * (args.steps + 2))
    s = spec(tokens, args.batch, args.seq, args.steps, args.rank)
    proc, ftctl, metrics = start_ftd(args.build, tmp / "data", out / "pack_bench_ftd.log", "--gpus", "1",
                                     "--jobs-per-gpu", "2")
    result = {"shape": f"{args.batch}x{args.seq}", "rank": args.rank, "steps": args.steps}
    try:
        result["dry_run"] = run(ftctl, "submit", "-", "--dry-run", stdin=json.dumps(s)).strip()
        print("# dry run:", result["dry_run"], flush=True)
        alone = submit(ftctl, s, "alone")
        run(ftctl, "wait", alone, check=False)  # its state is reported below
        a_steps = steps_of(ftctl, alone)
        a_job = json.loads(run(ftctl, "get", alone, "-o", "json"))
        if a_job["state"] != "SUCCEEDED" or len(a_steps) <= args.warmup:
            raise RuntimeError(f"the job alone ended {a_job['state']}: {a_job['message']}")
        result["alone"] = {"id": alone, "tokens_per_s": median_tps(a_steps, args.warmup)[0], "peak_gib": peak_gib(a_steps),
                           "predicted_gib": a_job["predicted_peak_bytes"] / GIB}
        print("# alone:", json.dumps(result["alone"]), flush=True)
        pair = [submit(ftctl, s, f"shared-{i}") for i in range(2)]
        deadline = time.time() + 600
        while time.time() < deadline:
            jobs = [json.loads(run(ftctl, "get", j, "-o", "json")) for j in pair]
            if all(j["state"] == "RUNNING" for j in jobs):
                result["slots"] = [j["slot"] for j in jobs]
                result["list"] = run(ftctl, "list")
                result["gauges"] = gauges(metrics)
                print(result["list"], "\n".join(result["gauges"]), flush=True)
                break
            if any(j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") for j in jobs):
                break
            time.sleep(1)
        for j in pair:
            run(ftctl, "wait", j, check=False)
        p_steps = [steps_of(ftctl, j) for j in pair]
        # The steps both ran together: from the later first step to the earlier last one.
        if any(len(st) <= args.warmup for st in p_steps):
            raise RuntimeError(f"a shared job ran {min(len(st) for st in p_steps)} steps, no more than the warmup")
        lo = max(st[args.warmup]["unix_ms"] for st in p_steps)
        hi = min(st[-1]["unix_ms"] for st in p_steps)
        result["shared"] = []
        for j, st in zip(pair, p_steps):
            tps, n = median_tps(st, args.warmup, lo, hi)
            state = json.loads(run(ftctl, "get", j, "-o", "json"))
            result["shared"].append({"id": j, "state": state["state"], "tokens_per_s": tps, "steps_together": n,
                                     "peak_gib": peak_gib(st), "predicted_gib": state["predicted_peak_bytes"] / GIB})
        print("# shared:", json.dumps(result["shared"]), flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        (out / "pack_bench.json").write_text(json.dumps(result, indent=1))
    alone_tps = result["alone"]["tokens_per_s"]
    total = sum(x["tokens_per_s"] or 0 for x in result["shared"])
    print(f"\n8B LoRA rank {args.rank}, {args.batch}x{args.seq}, fused, one GPU (slots {result.get('slots')})\n")
    print("| run | tokens/s | peak alloc (GiB) | predicted (GiB) |")
    print("|---|---:|---:|---:|")
    print(f"| one job alone | {alone_tps:,.0f} | {result['alone']['peak_gib']:.1f} | {result['alone']['predicted_gib']:.1f} |")
    for i, x in enumerate(result["shared"]):
        print(f"| shared job {i + 1} ({x['steps_together']} steps together) | {x['tokens_per_s'] or 0:,.0f} | "
              f"{x['peak_gib']:.1f} | {x['predicted_gib']:.1f} |")
    ratio = f"{total / alone_tps:.2f}x alone" if alone_tps else "-"
    print(f"| two jobs, total | {total:,.0f} ({ratio}) | | |")


if __name__ == "__main__":
    main()
