"""Fine-tuning on a chat JSONL: ftd-worker with packing and with padding, side by side with HF
transformers + its data collator, on the same generated conversations in the same command.

The dataset is generated (seeded): --examples conversations of 1-3 user/assistant turns with an
optional system message, lengths drawn so examples range from a few dozen to a few thousand
tokens. A byte-level BPE tokenizer in LLaMA-3's layout (its pattern and special tokens) is trained
on it offline with the `tokenizers` trainer, so the ids are not LLaMA-3's own but the rendering,
the masks and the length distribution are those of a LLaMA-3 chat dataset. `ftd-worker prepare`
tokenizes the file once (timed); every ftd run reuses that cache.

Runs (each `--steps`, the first `--warmup` not measured):
  ftd-pack  data.sequence "pack": rows of seq_len tokens, documents isolated (block-diagonal mask)
  ftd-pad   data.sequence "pad": one example per row, padded to seq_len
  hf-pad    LlamaForCausalLM (sdpa) + DataCollatorForSeq2Seq (pads each batch to its longest
            example, labels -100), torch.optim.AdamW(fused=True) on the same examples in the same
            order as ftd-pad (file order; the generated file is in random order already), each
            truncated to seq_len + 1 tokens as ftd-pad truncates them

Reports per run: real-token tokens/s (padding not counted), all-token tokens/s, the loss-masked
fraction of real tokens, peak memory. Prints a markdown table and writes data_bench.json.

  GPU (8B):  python3 bench/data_bench.py --worker build/worker/ftd-worker --out DIR
  CPU check: python3 bench/data_bench.py --worker build/worker/ftd-worker --out DIR --tiny
"""
import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import bench_cli  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "python"))
GIB = 2**30

WORDS = ("the of and to in is that for it as with was on be by this are or from at which an have not they "
         "model data train loss token chat answer question explain why how step value result error memory "
         "function return list table file system user assistant example number first second because").split()


def sentence(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + rng.choice([".", "?", "!", ":\n"])


def text(rng, mean_words):
    n = max(3, int(rng.lognormvariate(np.log(mean_words), 0.8)))
    out, left = [], n
    while left > 0:
        k = min(left, rng.randint(4, 20))
        out.append(sentence(rng, k))
        left -= k
    return " ".join(out)


def generate_chat(path, n, seed):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            msgs = []
            if rng.random() < 0.3:
                msgs.append({"role": "system", "content": text(rng, 15)})
            for _ in range(rng.choice([1, 1, 2, 3])):
                msgs.append({"role": "user", "content": text(rng, 40)})
                msgs.append({"role": "assistant", "content": text(rng, 120)})
            f.write(json.dumps({"messages": msgs}) + "\n")


def train_tokenizer(jsonl, out_dir, vocab_size):
    import tokenizer_corpus as corpus
    lines = []
    with open(jsonl) as f:
        for i, line in enumerate(f):
            if i >= 5000:
                break
            lines.extend(m["content"] for m in json.loads(line)["messages"])
    return corpus.train_llama3(out_dir, lines, vocab_size=vocab_size)


def tiny_model_dir(out_dir, vocab):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-5,
                      max_position_embeddings=4096, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def read_cache(cache):
    ids = np.fromfile(f"{cache}/ids.u32", dtype="<u4")
    loss = np.fromfile(f"{cache}/loss.u8", dtype=np.uint8)
    docs = np.fromfile(f"{cache}/docs.u64", dtype="<u8")
    return ids, loss, docs


def summarize(name, steps, warmup, extra=None):
    meas = steps[warmup:] or steps[-1:]
    if not meas:
        return {"impl": name, "outcome": "NO_STEPS"}
    time_s = sum(s["step_time_s"] for s in meas)
    real = sum(s["real_tokens"] for s in meas)
    counted = sum(s["loss_tokens"] for s in meas)
    total = sum(s["tokens"] for s in meas)
    out = {"impl": name, "real_tokens_per_s": real / time_s, "tokens_per_s": total / time_s,
           "step_time_s": statistics.median(s["step_time_s"] for s in meas),
           "masked_fraction": 1 - counted / max(real, 1), "padding_fraction": 1 - real / max(total, 1),
           "peak_alloc_gib": max(s.get("peak_mem_allocated_bytes", 0) for s in steps) / GIB,
           "loss_first": steps[0]["loss"], "loss_last": steps[-1]["loss"], "measured_steps": len(meas)}
    out.update(extra or {})
    return out


def run_ftd(args, out, model, tok_dir, jsonl, sequence):
    spec = {"model": model,
            "data": {"path": str(jsonl), "format": "chat", "sequence": sequence, "tokenizer_path": str(tok_dir),
                     "cache_dir": str(out / "cache"), "shuffle": False},
            "steps": args.steps, "batch_size": args.batch, "seq_len": args.seq, "device": args.device,
            "dtype": "bf16" if args.device != "cpu" else "fp32", "kernel_set": args.kernel_set,
            "optimizer": {"lr": 1e-5, "weight_decay": 0.1, "grad_clip": 1.0}, "checkpoint": {"enabled": False}}
    path = out / f"spec-{sequence}.json"
    path.write_text(json.dumps(spec))
    p = subprocess.run([args.worker, "run", str(path)], capture_output=True, text=True)
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    steps = [l for l in lines if l["event"] == "step"]
    result = next((l for l in lines if l["event"] == "result"), {"outcome": "FAILED"})
    if result["outcome"] != "SUCCEEDED":
        return {"impl": f"ftd-{sequence}", "outcome": result["outcome"], "message": result.get("message", p.stderr[-1500:])}
    return summarize(f"ftd-{sequence}", steps, args.warmup, {"outcome": "SUCCEEDED"})


def run_hf(args, out, tok_dir, model_dir, cache):
    """HF transformers in a child process (its own GPU memory), on the prepared examples."""
    cmd = [sys.executable, __file__, "--hf-child", "--worker", args.worker, "--out", str(out), "--cache", str(cache),
           "--tok", str(tok_dir), "--batch", str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps),
           "--device", args.device]
    if model_dir:
        cmd += ["--model-dir", str(model_dir)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    try:
        r = json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"impl": "hf-pad", "outcome": "FAILED", "message": p.stderr[-1500:]}
    if r.get("outcome") != "SUCCEEDED":
        return r
    return summarize("hf-pad", r["steps"], args.warmup, {"outcome": "SUCCEEDED"})


def hf_child(args):
    import torch
    from transformers import AutoTokenizer, DataCollatorForSeq2Seq, LlamaConfig, LlamaForCausalLM
    dev = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    tok = AutoTokenizer.from_pretrained(args.tok)
    tok.pad_token = tok.eos_token
    torch.manual_seed(0)
    if args.model_dir:
        model = LlamaForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32, attn_implementation="sdpa").to(dev)
    else:
        cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                          num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5,
                          rope_theta=500000.0, max_position_embeddings=131072, tie_word_embeddings=False,
                          rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                            original_max_position_embeddings=8192))
        with dev:
            model = LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.train()
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=1e-5, betas=(0.9, 0.95), eps=1e-8, fused=dev.type == "cuda")
    ids, loss_mask, docs = read_cache(args.cache)
    order = np.arange(len(docs) - 1)  # file order, as ftd-pad takes them (the file is shuffled already)
    collator = DataCollatorForSeq2Seq(tok, padding="longest", label_pad_token_id=-100, return_tensors="pt")
    w = args.seq  # HF shifts inside the model: seq tokens give seq-1 predictions, as our seq+1-token rows give seq
    steps, out = [], {"impl": "hf-pad", "steps": None}
    cuda = dev.type == "cuda"
    try:
        for s in range(args.steps):
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            feats = []
            for d in order[s * args.batch:(s + 1) * args.batch]:
                a, b = int(docs[d]), int(min(docs[d + 1], docs[d] + w + 1))
                x = ids[a:b].astype(np.int64).tolist()
                feats.append({"input_ids": x, "attention_mask": [1] * len(x),
                              "labels": [t if m else -100 for t, m in zip(x, loss_mask[a:b])]})
            batch = {k: v.to(dev) for k, v in collator(feats).items()}
            loss = model(**batch).loss  # mean over the batch's counted labels
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss_v = loss.item()
            if cuda:
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            real = int(batch["attention_mask"].sum())
            steps.append({"step": s + 1, "loss": loss_v, "step_time_s": dt, "real_tokens": real,
                          "tokens": int(batch["input_ids"].numel()),
                          "loss_tokens": int((batch["labels"][:, 1:] != -100).sum()),
                          "peak_mem_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else 0})
        out["outcome"] = "SUCCEEDED"
    except torch.OutOfMemoryError as e:
        out["outcome"] = "OUT_OF_MEMORY"
        out["message"] = str(e).splitlines()[0]
    out["steps"] = steps
    print(json.dumps(out), flush=True)


def main():
    ap = bench_cli.parser(worker=True)
    ap.add_argument("--examples", type=int, default=50000)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    bench_cli.add_steps(ap, steps=12, warmup=3)
    ap.add_argument("--impls", default="ftd-pack,ftd-pad,hf-pad")
    ap.add_argument("--kernel-set", default="fused")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a tiny model on the CPU: checks the script, not a figure")
    ap.add_argument("--hf-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    ap.add_argument("--tok", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.hf_child:
        return hf_child(args)
    if args.tiny:
        args.device, args.kernel_set = "cpu", "eager"
        args.examples, args.seq, args.batch, args.steps, args.warmup = min(args.examples, 400), 128, 2, 4, 1
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "chat.jsonl"
    t0 = time.perf_counter()
    generate_chat(jsonl, args.examples, seed=0)
    tok_dir = train_tokenizer(jsonl, out / "tokenizer", vocab_size=8000 if not args.tiny else 1000)
    gen_s = time.perf_counter() - t0
    model, model_dir = {"preset": "llama-3.1-8b"}, None
    if args.tiny:
        n = json.loads((tok_dir / "tokenizer.json").read_text())
        vocab = max([len(n["model"]["vocab"])] + [t["id"] + 1 for t in n["added_tokens"]])
        model_dir = tiny_model_dir(out / "model", vocab)
        model = {"weights_path": str(model_dir)}
    spec = out / "prepare.json"
    spec.write_text(json.dumps({"model": model, "data": {"path": str(jsonl), "format": "chat", "tokenizer_path": str(tok_dir),
                                                         "cache_dir": str(out / "cache")}}))
    t0 = time.perf_counter()
    p = subprocess.run([args.worker, "prepare", str(spec), "--no-progress"], capture_output=True, text=True, check=True)
    prepare_s = time.perf_counter() - t0
    prepared = json.loads(p.stdout.strip().splitlines()[-1])
    results = {"examples": args.examples, "batch": args.batch, "seq": args.seq, "device": args.device,
               "kernel_set": args.kernel_set, "generate_s": gen_s, "prepare_s": prepare_s, "prepared": prepared,
               "jsonl_bytes": jsonl.stat().st_size, "runs": []}
    for impl in args.impls.split(","):
        if impl in ("ftd-pack", "ftd-pad"):
            r = run_ftd(args, out, model, tok_dir, jsonl, impl.split("-")[1])
        elif impl == "hf-pad":
            r = run_hf(args, out, tok_dir, model_dir, prepared["cache"])
        else:
            raise SystemExit(f"unknown impl {impl}")
        results["runs"].append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
    (out / "data_bench.json").write_text(json.dumps(results, indent=2))
    print(f"{args.examples} conversations, {prepared['tokens']} tokens, {prepared['loss_tokens'] / prepared['tokens']:.1%} "
          f"counted by the loss; `ftd-worker prepare` {prepare_s:.1f} s ({results['jsonl_bytes'] / prepare_s / 1e6:.1f} MB/s)\n")
    print(f"| run | real tokens/s | all tokens/s | padding | loss-masked (of real) | peak GiB | loss first -> last |")
    print("|---|---|---|---|---|---|---|")
    for r in results["runs"]:
        if r.get("outcome") != "SUCCEEDED":
            print(f"| {r['impl']} | {r.get('outcome')} | {r.get('message', '')[:80]} | | | | |")
            continue
        print(f"| {r['impl']} | {r['real_tokens_per_s']:.0f} | {r['tokens_per_s']:.0f} | {r['padding_fraction']:.1%} | "
              f"{r['masked_fraction']:.1%} | {r['peak_alloc_gib']:.1f} | {r['loss_first']:.3f} -> {r['loss_last']:.3f} |")


if __name__ == "__main__":
    main()
