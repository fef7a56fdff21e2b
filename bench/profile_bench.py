"""The playbook's loop on the GPU through the service: profile the LLaMA-3.1-8B step with the eager
and the fused kernel sets as PROFILE jobs (ftd + ftctl + ftd-worker), print both per-op tables, the
comparison and the trace sizes, and the per-category device time Prometheus got. Writes
profile_bench.json and the tables to --out.

  python3 bench/profile_bench.py --build build-gpu --out DIR [--shape 4x2048] [--warmup 3] [--steps 2]
"""
import json
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from ftdbench import start_ftd, token_file
import bench_cli  # noqa: E402


def main():
    ap = bench_cli.parser(build=True)
    ap.add_argument("--shape", default="4x2048")
    bench_cli.add_steps(ap, steps=2, warmup=3)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    build, out = Path(args.build), bench_cli.out_dir(args)
    b, t = (int(x) for x in args.shape.split("x"))
    tmp = Path(tempfile.mkdtemp(prefix="ftd-profile-bench-"))
    tokens = token_file(tmp / "tokens.u32", b * (t + 1) * (args.warmup + args.steps + 1))
    spec = {"model": {"preset": "llama-3.1-8b"}, "data": {"path": str(tokens), "token_dtype": "uint32"},
            "batch_size": b, "seq_len": t, "device": "cuda", "dtype": "bf16", "optimizer": {"lr": 1e-5},
            "profile": {"warmup_steps": args.warmup, "steps": args.steps}}
    spec_path = tmp / "spec.json"
    spec_path.write_text(json.dumps(spec))
    ftd, ftctl, metrics = start_ftd(build, tmp / "ftd-data", out / "ftd-profile-bench.log")
    run = lambda *a: subprocess.run(ftctl + list(a), capture_output=True, text=True)
    jobs, result = {}, {"shape": args.shape}
    try:
        for ks in ("eager", "fused"):
            p = run("submit", str(spec_path), "--kind", "profile", "--name", f"profile-{ks}", "--set", f"kernel_set={ks}")
            jobs[ks] = p.stdout.strip()
            print(f"# {ks}: {jobs[ks]} {p.stderr.strip()}", flush=True)
        for ks, job in jobs.items():
            w = run("wait", job)
            print(f"# {ks} {job}: {w.stdout.strip()} {w.stderr.strip()}", flush=True)
            table = run("profile", job, "--top", str(args.top), "--trace", str(tmp / f"trace-{ks}.json"))
            (out / f"profile-{ks}.txt").write_text(table.stdout)
            print(f"\n## {ks} ({job})\n\n{table.stdout}{table.stderr}", flush=True)
            report = json.loads(run("profile", job, "-o", "json").stdout or "{}")
            result[ks] = {"job": job, "step_device_ms": report.get("step_device_ms"),
                          "step_wall_ms": report.get("step_wall_ms"), "trace_bytes": report.get("trace_bytes"),
                          "categories": report.get("categories"),
                          "ops": [o for o in report.get("ops", [])][:60]}
        cmp = run("compare", jobs["eager"], jobs["fused"], "--top", str(args.top))
        (out / "profile-compare.txt").write_text(cmp.stdout)
        print(f"\n## compare eager (A) vs fused (B)\n\n{cmp.stdout}{cmp.stderr}", flush=True)
        text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10).read().decode()
        prom = [l for l in text.splitlines() if l.startswith("ftd_profile_")]
        print("\n## /metrics (ftd_profile_*)\n\n" + "\n".join(prom), flush=True)
        result["metrics"] = prom
    finally:
        ftd.terminate()
        ftd.wait(timeout=60)
    (out / "profile_bench.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
