"""Data-parallel scaling on one host: the LLaMA-3.1-8B shape (random init, bf16, fused kernel set) at
B x T per GPU on 1 GPU and on N GPUs (one ftd-worker process per rank, NCCL): unsharded, ZeRO-1
(optimizer.shard_state) and ZeRO-2 (shard_state and shard_grads), in one invocation. Prints a
markdown table and writes dist_bench.json: the job's tokens/s (all ranks), the scaling efficiency
against N x the 1-GPU run, the largest per-rank peak memory and gradient bytes, and the step's
un-overlapped communication wait.

  python3 bench/dist_bench.py --worker build-gpu/worker/ftd-worker [--out DIR] [--gpus 2] [--shape 4x2048]
      [--layers 32] [--ac none|selective|full] [--steps 10] [--warmup 3] [--variant LABEL:TOKENS ...]

Communication levers: each `--variant LABEL:TOKENS` adds one N-GPU run after the four above, named
gN-LABEL, whose TOKENS (space-separated) are any of: `zero1` (optimizer.shard_state), `zero2`
(shard_state and shard_grads), ftd-worker flags (`--bucket-mib=100`: gradient buckets of 100 MiB instead of 256; `--flat-reduce`: each bucket's
gradients copied into one flat tensor and reduced there instead of in place; `--coalesced-gather`:
ZeRO-1's weights as one coalesced group of broadcasts), and NAME=VALUE environment entries for every rank
(`NCCL_MAX_NCHANNELS=8`: fewer NCCL channels, so fewer SMs taken from backward). E.g.
  --variant "b100:--bucket-mib=100" --variant "ch8:NCCL_MAX_NCHANNELS=8" --variant "z1-coal:zero1 --coalesced-gather"

`--singles`: one more row, N independent 1-GPU jobs started at once (one per GPU, no communication
between them), its tokens/s the sum of theirs: the ceiling data parallel can reach on this host when
the GPUs work side by side (power, clocks, host memory and CPU shared, nothing sent), which separates
what communication costs from what running N GPUs at once costs. Its losses are not compared.

Fitting an 80 GB card: a 1-GPU run of the 8B at 4x2048 needs ~81 GiB without activation
checkpointing (docs/performance.md), ~61 GiB with `--ac full`; `--layers 16` keeps the 8B's layer
shape with half its depth (~45 GiB without checkpointing; written as an HF config.json).

Self-checking: exits 1 when a run fails or when an N-GPU run's (ZeRO-1, ZeRO-2, a variant) losses and gradient norms
differ from the N-GPU unsharded run's by more than bf16 rounding (they see the same data).
`--model tiny --device cpu` runs the same on CPU ranks (Gloo): a check of this script, not a figure.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import bench_cli

# ZeRO-1, ZeRO-2 (and the levers) against unsharded, step by step (bf16: AdamW runs the same per-tensor math either
# way; the slack covers the broadcast of bf16 parameters, the reduction order and kernel choices).
ZERO_REL = 3e-2
ZERO = {0: {}, 1: {"shard_state": True}, 2: {"shard_state": True, "shard_grads": True}}


def model_fields(a, work):
    """The spec's model: the preset, or the 8B shape with --layers decoder layers (an HF config.json)."""
    if a.model != "llama-3.1-8b" or a.layers == 32:
        return {"preset": a.model}, 128256 if a.model == "llama-3.1-8b" else 64
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from hf_common import llama_8b_config
    cfg = llama_8b_config()
    cfg.num_hidden_layers = a.layers
    path = work / "config.json"
    cfg.to_json_file(str(path))
    return {"config_path": str(path)}, cfg.vocab_size


def parse_variant(text):
    """LABEL:TOKENS -> (label, ZeRO stage 0-2, worker flags, environment); ValueError naming what is wrong."""
    label, sep, rest = text.partition(":")
    if not sep or not label or not label.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"--variant {text!r}: write LABEL:TOKENS with a label of letters, digits, - and _")
    zero, flags, env = 0, [], {}
    for tok in rest.split():
        if tok in ("zero1", "zero2"):
            zero = int(tok[-1])
        elif tok.startswith("--"):
            flags.append(tok)
        elif "=" in tok and tok.split("=", 1)[0].isupper():
            k, v = tok.split("=", 1)
            env[k] = v
        else:
            raise ValueError(f"--variant {text!r}: {tok!r} is not zero1, zero2, an ftd-worker --flag or a NAME=VALUE "
                             "environment entry")
    return label, zero, flags, env


def job_spec(a, model, tokens, gpus, b, t, zero):
    cuda = a.device == "cuda"
    return {"model": model, "data": {"path": str(tokens), "token_dtype": "uint32"},
            "steps": a.steps, "batch_size": b, "seq_len": t, "device": a.device,
            "dtype": "bf16" if cuda else "fp32", "kernel_set": "fused" if cuda else "eager",
            "activation_checkpointing": a.ac, "gpus": gpus, "checkpoint": {"enabled": False},
            "optimizer": {"lr": 1e-5, "weight_decay": 0.1, "grad_clip": 1.0, **ZERO[zero]}}


def run(a, model, tokens, gpus, b, t, zero, work, label=None, flags=(), extra_env=None):
    name = f"g{gpus}-{label or (f'zero{zero}' if zero else 'plain')}"
    path = work / f"{name}.json"
    path.write_text(json.dumps(job_spec(a, model, tokens, gpus, b, t, zero)))
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    env.update(extra_env or {})
    store = work / f"{name}.store"
    logs = [open(work / f"{name}.rank{r}.log", "w") for r in range(gpus)]
    procs = [subprocess.Popen([str(a.worker), "run", str(path), "--rank", str(r), "--store", str(store),
                               "--rank-timeout", "120", *flags],
                              stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL,
                              stderr=logs[r], text=True, env=env)
             for r in range(gpus)]
    try:
        out = procs[0].communicate(timeout=a.timeout)[0]
        codes = [p.wait(timeout=60) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        out, codes = "", [p.wait() for p in procs]
    lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    tail = (work / f"{name}.rank0.log").read_text()[-300:].strip().replace("\n", " / ")
    result = next((l for l in lines if l["event"] == "result"),
                  {"outcome": "FAILED", "message": f"exit codes {codes} (limit {a.timeout} s); rank 0: {tail}"})
    return name, [l for l in lines if l["event"] == "step"], result


def run_singles(a, model, tokens, b, t, work):
    """--singles: a.gpus independent 1-GPU jobs at once, GPU i for job i (CPU: all on the CPU). Returns each
    job's (step lines, result)."""
    path = work / "singles.json"
    path.write_text(json.dumps(job_spec(a, model, tokens, 1, b, t, 0)))
    procs, logs = [], []
    for i in range(a.gpus):
        env = dict(os.environ)
        if a.device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = str(i)
        logs.append(open(work / f"singles.{i}.log", "w"))
        procs.append(subprocess.Popen([str(a.worker), "run", str(path)], stdout=subprocess.PIPE, stderr=logs[i],
                                      text=True, env=env))
    outs = []
    for i, p in enumerate(procs):
        try:
            outs.append(p.communicate(timeout=a.timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            outs.append("")
    done = []
    for i, out in enumerate(outs):
        lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
        tail = (work / f"singles.{i}.log").read_text()[-300:].strip().replace("\n", " / ")
        result = next((l for l in lines if l["event"] == "result"),
                      {"outcome": "FAILED", "message": f"job {i}: exit code {procs[i].wait()}; {tail}"})
        done.append(([l for l in lines if l["event"] == "step"], result))
    return done


def check_against_unsharded(runs, steps_of):
    """Messages for each step where a later N-GPU run's (ZeRO-1, ZeRO-2, a lever) loss or gradient norm is not
    the unsharded run's: they see the same data, so only rounding may differ."""
    plain = steps_of.get(runs[1]["run"])
    bad = []
    for other in runs[2:]:
        steps = steps_of.get(other["run"])
        if not plain or not steps:
            continue
        for x, y in zip(steps, plain):
            for key in ("loss", "grad_norm"):
                if abs(x[key] - y[key]) > ZERO_REL * abs(y[key]):
                    bad.append(f"step {x['step']}: {other['run']} {key} {x[key]:.5g} vs unsharded {y[key]:.5g}")
    return bad


def main():
    ap = bench_cli.parser(worker=True)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--shape", default="4x2048", help="B x T per GPU")
    ap.add_argument("--model", default="llama-3.1-8b", choices=["llama-3.1-8b", "tiny"])
    ap.add_argument("--layers", type=int, default=32, help="decoder layers of the 8B shape (32: the 8B itself)")
    ap.add_argument("--ac", default="none", choices=["none", "selective", "full"], help="activation_checkpointing")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    bench_cli.add_steps(ap, steps=10, warmup=3)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per run")
    ap.add_argument("--singles", action="store_true",
                    help="one more row: --gpus independent 1-GPU jobs at once, no communication (the host's ceiling)")
    ap.add_argument("--variant", action="append", default=[],
                    help="LABEL:TOKENS, one more N-GPU run (see the module's help); repeatable")
    a = ap.parse_args()
    try:
        variants = [parse_variant(v) for v in a.variant]
    except ValueError as e:
        ap.error(str(e))
    shapes = bench_cli.shapes(a.shape)
    if len(shapes) != 1:
        ap.error(f"--shape {a.shape!r}: one B x T per GPU, e.g. 4x2048")
    (b, t), = shapes
    out = bench_cli.out_dir(a)
    work = Path(tempfile.mkdtemp(prefix="dist-bench-"))
    model, vocab = model_fields(a, work)
    tokens = work / "tokens.bin"
    rows = a.gpus * b * (a.steps + 1)
    np.random.default_rng(0).integers(0, vocab, size=rows * (t + 1), dtype=np.uint32).tofile(tokens)
    runs, steps_of = [], {}
    plan = [(1, 0, None, [], {})] + [(a.gpus, zero, None, [], {}) for zero in (0, 1, 2)]
    plan += [(a.gpus, zero, label, flags, env) for label, zero, flags, env in variants]
    for gpus, zero, label, flags, env in plan:
        name, steps, result = run(a, model, tokens, gpus, b, t, zero, work, label, flags, env)
        steps_of[name] = steps
        meas = steps[a.warmup:]
        r = {"run": name, "gpus": gpus, "zero": zero, "levers": " ".join(flags + [f"{k}={v}" for k, v in env.items()]),
             "outcome": result["outcome"], "message": result.get("message", "")}
        if meas and result["outcome"] == "SUCCEEDED":
            r.update(tokens_per_s=statistics.median(s["tokens_per_s"] for s in meas),
                     step_time_s=statistics.median(s["step_time_s"] for s in meas),
                     comm_wait_s=statistics.median(s.get("comm_wait_s", 0.0) for s in meas),
                     max_rank_peak_gib=max(s["max_rank_peak_mem_allocated_bytes"] for s in meas) / 2**30,
                     max_rank_grad_gib=max(result.get("rank_grad_bytes") or [0]) / 2**30,
                     loss_first=steps[0]["loss"], loss_last=steps[-1]["loss"])
        runs.append(r)
        print(json.dumps(r), file=sys.stderr)
    if a.singles:
        jobs = run_singles(a, model, tokens, b, t, work)
        bad = [res if res["outcome"] != "SUCCEEDED" else {"outcome": "FAILED", "message": "no steps reported"}
               for steps, res in jobs if res["outcome"] != "SUCCEEDED" or not steps]
        r = {"run": f"{a.gpus}x1-singles", "gpus": a.gpus, "zero": 0,
             "levers": f"{a.gpus} independent 1-GPU jobs at once", "outcome": bad[0]["outcome"] if bad else "SUCCEEDED",
             "message": bad[0].get("message", "") if bad else ""}
        if not bad:
            meas = [steps[a.warmup:] or steps for steps, _ in jobs]
            r.update(tokens_per_s=sum(statistics.median(s["tokens_per_s"] for s in m) for m in meas),
                     step_time_s=max(statistics.median(s["step_time_s"] for s in m) for m in meas),
                     comm_wait_s=0.0,
                     max_rank_peak_gib=max(s["max_rank_peak_mem_allocated_bytes"] for m in meas for s in m) / 2**30,
                     max_rank_grad_gib=max(max(res.get("rank_grad_bytes") or [0]) for _, res in jobs) / 2**30)
        runs.append(r)
        print(json.dumps(r), file=sys.stderr)
    base = runs[0].get("tokens_per_s")
    depth = "" if a.layers == 32 or a.model != "llama-3.1-8b" else f" with {a.layers} layers"
    what = "LLaMA-3.1-8B shape" if a.model == "llama-3.1-8b" else a.model
    print(f"{what}{depth}, {'bf16, fused' if a.device == 'cuda' else 'fp32, eager, CPU'}, activation checkpointing "
          f"{a.ac}, {b}x{t} per GPU, {a.steps} steps ({a.warmup} warm-up), median\n")
    print("| GPUs | ZeRO | levers | tokens/s (job) | x 1 GPU | efficiency | step (s) | comm wait (s) | max per-rank peak "
          "| max per-rank gradients |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        head = f"| {r['gpus']} | {r['zero'] or '-'} | {r['levers']} |"
        if "tokens_per_s" not in r:
            print(f"{head} {r['outcome']}: {r['message'][:200]} | | | | | | |")
            continue
        speedup = r["tokens_per_s"] / base if base else None
        eff = speedup / r["gpus"] if speedup else None
        r.update(speedup=speedup, efficiency=eff)
        print(f"{head} {r['tokens_per_s']:,.0f} | "
              f"{'' if speedup is None else f'{speedup:.2f}'} | {'' if eff is None else f'{eff:.1%}'} | "
              f"{r['step_time_s']:.3f} | {r['comm_wait_s']:.3f} | {r['max_rank_peak_gib']:.1f} GiB | "
              f"{r['max_rank_grad_gib']:.3g} GiB |")
    problems = [f"{r['run']}: {r['outcome']}" for r in runs if "tokens_per_s" not in r] + check_against_unsharded(runs, steps_of)
    config = {"model": model, "layers": a.layers, "ac": a.ac, "shape": a.shape, "device": a.device,
              "steps": a.steps, "warmup": a.warmup}
    (out / "dist_bench.json").write_text(json.dumps({"config": config, "runs": runs, "problems": problems}, indent=2))
    for p in problems:
        print(f"dist_bench: {p}")
    print(f"\ndist_bench: {'FAILED' if problems else 'ok'} (rank logs in {work})")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
