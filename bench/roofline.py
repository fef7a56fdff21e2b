"""Roofline of one training step of the LLaMA-3.1-8B shape: per shape, the FLOP-bound time of the
matrix work (the linear layers and causal attention, forward and backward) at the measured bf16 GEMM
peak, plus the bytes-bound time of the optimizer (AdamW reads parameters, gradients and both moments
and writes parameters and moments back) at the measured copy bandwidth, against the measured step
time from bench/train_bench.py's train_bench.json. The difference is what the step spends above the
hardware floor.

  python3 bench/roofline.py --bench DIR/train_bench.json [--bench ...] [--gemm-tflops X --copy-gbs Y]

Without --gemm-tflops / --copy-gbs it measures both on this machine's GPU: a large bf16 torch.matmul
(2 n^3 FLOPs) and a large device-to-device copy (2 bytes moved per byte copied).

FLOPs per step (tokens = batch * seq):
  linear:    2 * N * tokens forward, N = the decoder's projection weights plus lm_head (no embedding)
  attention: 4 * batch * heads * seq^2 * head_dim forward per layer (QK^T and PV), halved by the
             causal mask
  backward:  2x forward (input and weight gradients)
"""
import argparse
import json
import sys
from pathlib import Path


def linear_params(cfg):
    """Weights of every matmul of the model: q, k, v, o, gate, up, down per layer, and lm_head."""
    h, f, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    return cfg.num_hidden_layers * (h * q + 2 * h * kv + q * h + 3 * h * f) + cfg.vocab_size * h


def all_params(cfg):
    """Every parameter the optimizer updates in full fine-tuning: the matmuls, the embedding, the norms."""
    h = cfg.hidden_size
    embed = 0 if getattr(cfg, "tie_word_embeddings", False) else cfg.vocab_size * h
    return linear_params(cfg) + embed + cfg.num_hidden_layers * 2 * h + h


def step_flops(cfg, batch, seq, causal=True):
    """FLOPs of one training step's matrix work: {"linear", "attention", "forward", "total"}."""
    tokens = batch * seq
    linear = 2 * linear_params(cfg) * tokens
    attention = cfg.num_hidden_layers * 4 * batch * cfg.num_attention_heads * seq * seq * cfg.head_dim
    if causal:
        attention //= 2
    forward = linear + attention
    return {"linear": 3 * linear, "attention": 3 * attention, "forward": forward, "total": 3 * forward}


def optimizer_bytes(n_params, param_bytes=2, grad_bytes=2, state_bytes=2):
    """Bytes AdamW moves in one step: reads parameters, gradients, m and v; writes parameters, m and v."""
    return n_params * (2 * param_bytes + grad_bytes + 4 * state_bytes)


def measure_gemm_tflops(n=8192, iters=30):
    import torch
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        torch.matmul(a, b)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        torch.matmul(a, b)
    end.record()
    end.synchronize()
    return 2 * n**3 * iters / (start.elapsed_time(end) / 1e3) / 1e12


def measure_copy_gbs(gib=4, iters=10):
    import torch
    x = torch.empty(gib * 2**30, device="cuda", dtype=torch.uint8)
    y = torch.empty_like(x)
    for _ in range(2):
        y.copy_(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        y.copy_(x)
    end.record()
    end.synchronize()
    return 2 * x.numel() * iters / (start.elapsed_time(end) / 1e3) / 1e9


def roofline_rows(cfg, measured, gemm_tflops, copy_gbs, state_bytes=2):
    """measured: [(impl, batch, seq, step_time_s)] -> one dict per row with the floor and the gap."""
    opt_bytes = optimizer_bytes(all_params(cfg), state_bytes=state_bytes)
    opt_ms = opt_bytes / (copy_gbs * 1e9) * 1e3
    rows = []
    for impl, b, t, step_s in measured:
        fl = step_flops(cfg, b, t)
        mm_ms = fl["total"] / (gemm_tflops * 1e12) * 1e3
        floor = mm_ms + opt_ms
        rows.append({"impl": impl, "shape": f"{b}x{t}", "tflop": fl["total"] / 1e12,
                     "attention_share": fl["attention"] / fl["total"], "matmul_ms": mm_ms,
                     "optimizer_gb": opt_bytes / 1e9, "optimizer_ms": opt_ms, "floor_ms": floor,
                     "measured_ms": step_s * 1e3, "gap_ms": step_s * 1e3 - floor,
                     "floor_over_measured": floor / (step_s * 1e3)})
    return rows


def measured_steps(paths):
    """train_bench.json files -> [(impl, batch, seq, median step time s)] of the runs that succeeded."""
    out = []
    for p in paths:
        for r in json.loads(Path(p).read_text()):
            if r.get("summary") and r["impl"].startswith("ftd-"):
                out.append((r["impl"], r["batch"], r["seq"], r["summary"]["step_time_s"]))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", action="append", default=[], help="train_bench.json with measured steps")
    ap.add_argument("--gemm-tflops", type=float, help="bf16 GEMM peak; default: measured here")
    ap.add_argument("--copy-gbs", type=float, help="device copy bandwidth GB/s; default: measured here")
    ap.add_argument("--state-bytes", type=int, default=2, help="bytes of one AdamW moment element (bf16: 2)")
    ap.add_argument("--out", help="write roofline.json here")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from hf_common import llama_8b_config
    cfg = llama_8b_config()
    gemm = args.gemm_tflops or measure_gemm_tflops()
    copy = args.copy_gbs or measure_copy_gbs()
    print(f"measured: bf16 GEMM {gemm:.0f} TFLOP/s (8192^3 torch.matmul), copy {copy:.0f} GB/s "
          f"(4 GiB device-to-device, read + write)")
    rows = roofline_rows(cfg, measured_steps(args.bench), gemm, copy, args.state_bytes)
    print("\n| shape | impl | matmul TFLOP | attention share | FLOP-bound (ms) | optimizer GB | bytes-bound (ms) "
          "| floor (ms) | measured (ms) | floor / measured | gap (ms) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['shape']} | {r['impl']} | {r['tflop']:.1f} | {100 * r['attention_share']:.1f}% | "
              f"{r['matmul_ms']:.1f} | {r['optimizer_gb']:.1f} | {r['optimizer_ms']:.1f} | {r['floor_ms']:.1f} | "
              f"{r['measured_ms']:.1f} | {100 * r['floor_over_measured']:.0f}% | {r['gap_ms']:.1f} |")
    if not rows:
        print("(no measured ftd step in " + ", ".join(args.bench or ["--bench"]) + ")")
    if args.out:
        Path(args.out).write_text(json.dumps({"gemm_tflops": gemm, "copy_gbs": copy, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
