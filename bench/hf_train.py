"""HF transformers baselines: the LLaMA-3.1-8B shape (random init, bf16 weights, sdpa attention,
torch.optim.AdamW(fused=True)) trained on the same token windows as ftd-worker. Prints one JSON
object with per-step metrics. Used by bench/train_bench.py.

  --variant eager    HF as it comes (logits materialised, fp32 cross-entropy)
  --variant compile  the same model under torch.compile (model.compile())
  --variant liger    Liger-Kernel's LLaMA patches (RoPE, RMSNorm, SwiGLU, fused linear cross-entropy;
                     the loss from shift_labels, the same targets)
  --variant float8   torchao's float8 training (convert_to_float8_training: every decoder linear in FP8
                     with per-tensor dynamic scaling, lm_head in bf16, as ftd's fp8 set) under torch.compile,
                     compiled per decoder layer as torchtitan does (one layer's graph, reused by all 32:
                     a fraction of a whole-model compile's time)
  --grad-ckpt        HF's gradient checkpointing (non-reentrant), for shapes that do not fit without it
"""
import argparse
import importlib
import json
import sys
import time

import torch
import torch.nn.functional as F

from hf_common import add_run_args, llama_8b_config, step_record, token_windows


def peer_import(out, module, name, package):
    """module.name; or, where the package is not installed, None after printing the run's FAILED line."""
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as e:
        out.update(outcome="FAILED", message=f"{package} is not installed ({e}): put its wheel in .whl/")
        print(json.dumps(out), flush=True)
        return None


def main():
    ap = argparse.ArgumentParser()
    add_run_args(ap, lr=1e-5)
    ap.add_argument("--variant", choices=["eager", "compile", "liger", "float8"], default="eager")
    ap.add_argument("--grad-ckpt", action="store_true", help="HF gradient checkpointing (non-reentrant)")
    ap.add_argument("--profile-trace", metavar="PATH",
                    help="record the last --profile-steps steps with torch.profiler (CPU ops and CUDA kernels) and "
                         "write their Chrome trace to PATH (.json or .json.gz), for bench/profile_breakdown.py --trace")
    ap.add_argument("--profile-steps", type=int, default=2)
    ap.add_argument("--phase-times", action="store_true",
                    help="print each step's phase GPU times, as ftd-worker run --phase-times does")
    args = ap.parse_args()

    from transformers import LlamaForCausalLM
    cfg = llama_8b_config()
    impl = "hf-" + args.variant + ("+gc" if args.grad_ckpt else "")
    out = {"impl": impl, "batch": args.batch, "seq": args.seq, "steps": []}
    if args.variant == "liger":
        apply_liger_kernel_to_llama = peer_import(out, "liger_kernel.transformers", "apply_liger_kernel_to_llama",
                                                  "liger-kernel")
        if apply_liger_kernel_to_llama is None:
            return
        apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=True, fused_linear_cross_entropy=True)
    cfg.use_cache = False
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.train()
    if args.grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.variant == "float8":
        convert_to_float8_training = peer_import(out, "torchao.float8", "convert_to_float8_training", "torchao")
        if convert_to_float8_training is None:
            return
        convert_to_float8_training(model, module_filter_fn=lambda mod, fqn: fqn != "lm_head")
    if args.variant == "compile":
        model.compile()
    elif args.variant == "float8":
        for layer in model.model.layers:
            layer.compile()
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    windows = token_windows(args.tokens, args.seq)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
    steps = out["steps"]
    prof = None
    try:
        for s in range(args.steps):
            if args.profile_trace and s == max(0, args.steps - args.profile_steps):
                torch.cuda.synchronize()
                prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                          torch.profiler.ProfilerActivity.CUDA])
                prof.start()
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            batch = windows[s * args.batch:(s + 1) * args.batch].cuda(non_blocking=True)
            ev[0].record()
            if args.variant == "liger":
                # Contiguous ids and labels: Liger's fused linear cross-entropy views the labels flat, which a
                # column slice of the batch does not allow ("view size is not compatible ...").
                loss = model(input_ids=batch[:, :-1].contiguous(), shift_labels=batch[:, 1:].contiguous()).loss
            else:
                logits = model(input_ids=batch[:, :-1]).logits
                loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
                del logits
            loss.backward()
            ev[1].record()
            norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
            ev[2].record()
            opt.step()
            opt.zero_grad(set_to_none=True)
            ev[3].record()
            loss_v, _ = loss.item(), norm.item()
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            if args.phase_times:
                print(f"hf phases step {s + 1}: forward+backward {ev[0].elapsed_time(ev[1]):.2f} ms, norm+clip "
                      f"{ev[1].elapsed_time(ev[2]):.2f} ms, optimizer {ev[2].elapsed_time(ev[3]):.2f} ms, "
                      f"wall {dt * 1e3:.2f} ms", file=sys.stderr, flush=True)
            steps.append(step_record(s + 1, loss_v, dt, args.batch, args.seq))
        if prof is not None:
            prof.stop()
            prof.export_chrome_trace(args.profile_trace)
            out["trace"] = args.profile_trace
            out["profiled_steps"] = min(args.profile_steps, args.steps)
        out["outcome"] = "SUCCEEDED"
    except torch.OutOfMemoryError as e:
        out["outcome"] = "OUT_OF_MEMORY"
        out["message"] = str(e).splitlines()[0]
    except Exception as e:  # a compiler or kernel failure: recorded, and the benchmark goes on
        out["outcome"] = "OUT_OF_MEMORY" if "out of memory" in str(e).lower() else "FAILED"
        out["message"] = f"{type(e).__name__}: {str(e)[:1000]}"
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
