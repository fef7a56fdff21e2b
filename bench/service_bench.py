"""The same 8B-shaped job through the job service (ftd + ftctl + an ftd-worker it spawns) and as a
standalone `ftd-worker run`, alternating, in one invocation on one GPU: the service must cost
nothing measurable (tokens/s within 2%). Prints a markdown table and writes service_bench.json.

  python3 bench/service_bench.py --build build-gpu --out DIR [--shape 4x2048] [--steps 13] [--repeat 2]
"""
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ftdbench import start_ftd, token_file
import bench_cli  # noqa: E402


def median_tps(steps, warmup):
    meas = steps[warmup:]
    return statistics.median(s["tokens_per_s"] for s in meas) if meas else 0.0


def main():
    ap = bench_cli.parser(build=True)
    ap.add_argument("--shape", default="4x2048")
    bench_cli.add_steps(ap, steps=13, warmup=3)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--kernel-set", default="eager")
    args = ap.parse_args()
    build, out = Path(args.build), bench_cli.out_dir(args)
    b, t = (int(x) for x in args.shape.split("x"))
    tmp = Path(tempfile.mkdtemp(prefix="ftd-service-bench-"))
    tokens = token_file(tmp / "tokens.u32", b * (t + 1) * (args.steps + 1))
    spec = {"model": {"preset": "llama-3.1-8b"}, "data": {"path": str(tokens), "token_dtype": "uint32"},
            "steps": args.steps, "batch_size": b, "seq_len": t, "device": "cuda", "dtype": "bf16",
            "kernel_set": args.kernel_set, "optimizer": {"lr": 1e-5, "weight_decay": 0.1},
            "checkpoint": {"enabled": False}}  # the same work as the standalone run: no 48 GB final checkpoint
    spec_path = tmp / "spec.json"
    spec_path.write_text(json.dumps(spec))

    ftd, ftctl, _ = start_ftd(build, tmp / "ftd-data", out / "ftd-service-bench.log")
    rows = []
    try:
        for rep in range(args.repeat):
            for mode in ("standalone", "service"):
                if mode == "standalone":
                    p = subprocess.run([str(build / "worker" / "ftd-worker"), "run", str(spec_path)], capture_output=True,
                                       text=True)
                    lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
                    steps = [l for l in lines if l["event"] == "step"]
                    ok = p.returncode == 0
                else:
                    job = subprocess.run(ftctl + ["submit", str(spec_path), "--name", f"bench-{rep}"], capture_output=True,
                                         text=True).stdout.strip()
                    ok = subprocess.run(ftctl + ["wait", job], capture_output=True).returncode == 0
                    events = subprocess.run(ftctl + ["watch", job, "-o", "json"], capture_output=True, text=True).stdout
                    steps = [e["step"] for e in map(json.loads, events.splitlines()) if "step" in e]
                    for s in steps:  # proto3 JSON writes 64-bit integers as strings
                        s.update({k: float(v) for k, v in s.items() if isinstance(v, str)})
                    if not ok:
                        print(subprocess.run(ftctl + ["get", job], capture_output=True, text=True).stdout, flush=True)

                tps = median_tps(steps, args.warmup) if ok else 0.0
                rows.append({"mode": mode, "repeat": rep, "ok": ok, "tokens_per_s": tps, "steps": len(steps)})
                print(f"# {mode} run {rep + 1}: {'ok' if ok else 'FAILED'}, {tps:.0f} tokens/s over {len(steps)} steps",
                      flush=True)
    finally:
        ftd.terminate()
        ftd.wait(timeout=60)
    (out / "service_bench.json").write_text(json.dumps(rows, indent=1))
    med = {m: statistics.median(r["tokens_per_s"] for r in rows if r["mode"] == m and r["ok"]) for m in
           ("standalone", "service") if any(r["mode"] == m and r["ok"] for r in rows)}
    print(f"\n| {args.shape}, kernel_set {args.kernel_set} | runs (tokens/s) | median | vs standalone |")
    print("|---|---|---|---|")
    for m in ("standalone", "service"):
        runs = ", ".join(f"{r['tokens_per_s']:,.0f}" for r in rows if r["mode"] == m)
        ratio = f"{med[m] / med['standalone']:.4f}" if m in med and "standalone" in med else "-"
        print(f"| {m} | {runs} | {med.get(m, 0):,.0f} | {ratio} |")


if __name__ == "__main__":
    sys.exit(main())
