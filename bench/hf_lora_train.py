"""HF transformers + PEFT LoRA baseline: the LLaMA-3.1-8B shape (random init, bf16 base, sdpa
attention), LoRA on the given modules (PEFT's defaults: fp32 adapters, kaiming-uniform A, B zero),
torch.optim.AdamW(fused=True) over the adapters, gradient clipping at 1.0, trained on the same token
windows as ftd-worker. Prints one JSON object with per-step metrics. Used by bench/lora_bench.py."""
import argparse
import json
import time

import torch
import torch.nn.functional as F

from hf_common import add_run_args, llama_8b_config, step_record, token_windows


def main():
    ap = argparse.ArgumentParser()
    add_run_args(ap, lr=1e-4)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32)
    args = ap.parse_args()

    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM
    cfg = llama_8b_config()
    torch.manual_seed(0)
    with torch.device("cuda"):
        base = LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    model = get_peft_model(base, LoraConfig(r=args.rank, lora_alpha=args.alpha, lora_dropout=0.0,
                                            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                            "up_proj", "down_proj"], task_type="CAUSAL_LM"))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    windows = token_windows(args.tokens, args.seq)
    steps = []
    out = {"impl": "hf-peft", "batch": args.batch, "seq": args.seq, "steps": steps,
           "adapter_dtype": str(params[0].dtype), "trainable": sum(p.numel() for p in params)}
    try:
        for s in range(args.steps):
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            batch = windows[s * args.batch:(s + 1) * args.batch].cuda(non_blocking=True)
            logits = model(input_ids=batch[:, :-1]).logits
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss_v, _ = loss.item(), norm.item()
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            steps.append(step_record(s + 1, loss_v, dt, args.batch, args.seq))
        out["outcome"] = "SUCCEEDED"
    except torch.OutOfMemoryError as e:
        out["outcome"] = "OUT_OF_MEMORY"
        out["message"] = str(e).splitlines()[0]
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
