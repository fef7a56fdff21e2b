"""Shared helpers of the Python test suites: paths to the built binaries, tiny HF LLaMA models,
token files, and running ftd-worker / ftd-parity as real processes."""
import json
import math
import os
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("FTD_BUILD_DIR", ROOT / "build"))
WORKER = BUILD / "worker" / "ftd-worker"
PARITY = BUILD / "tests" / "ftd-parity"

# Odd sizes, MHA/GQA/MQA, llama3 RoPE scaling with all three frequency bands, tied and untied; RMSNorm
# eps 1e-5 (LLaMA-3), 1e-6 (HF's default) and an odd 7.3e-5, so a model that ignores the configured eps
# fails at least two of them (at init, hidden states have mean squares near 4e-4, so eps is visible).
CONFIGS = {
    "gqa_llama3_untied": dict(vocab_size=211, hidden_size=72, intermediate_size=200, num_hidden_layers=2,
                              num_attention_heads=6, num_key_value_heads=2, head_dim=12, rms_norm_eps=1e-5,
                              rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                high_freq_factor=4.0, original_max_position_embeddings=32),
                              tie_word_embeddings=False),
    "mha_tied_headdim": dict(vocab_size=97, hidden_size=48, intermediate_size=131, num_hidden_layers=3,
                             num_attention_heads=4, num_key_value_heads=4, head_dim=16, rms_norm_eps=1e-6,
                             rope_theta=5000.0, tie_word_embeddings=True),
    "mqa_llama3_tied": dict(vocab_size=128, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                            num_attention_heads=8, num_key_value_heads=1, rms_norm_eps=7.3e-5,
                            rope_scaling=dict(rope_type="llama3", factor=4.0, low_freq_factor=1.0,
                                              high_freq_factor=2.0, original_max_position_embeddings=16),
                            tie_word_embeddings=True),
}


def make_hf_model(name, out_dir, seed=0):
    """A random LlamaForCausalLM (fp32) saved as HF safetensors in out_dir."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    kw = dict(CONFIGS[name])
    kw.setdefault("max_position_embeddings", 256)
    cfg = LlamaConfig(**kw, attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).float().eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    return model


def write_tokens(path, ids, dtype=np.uint16):
    np.asarray(ids, dtype=dtype).astype(np.dtype(dtype).newbyteorder("<")).tofile(path)


def run_parity(model_dir, input_ids, labels, tmp, device="cpu", dtype="fp32", kernel_set="eager", adapter_dir=None):
    """ftd-parity on one batch: logits, loss and gradients (of the adapters, with a PEFT adapter_dir)."""
    batch = Path(tmp) / "batch.safetensors"
    out = Path(tmp) / f"out-{device}-{dtype}-{kernel_set}{'-lora' if adapter_dir else ''}.safetensors"
    save_file({"input_ids": input_ids.contiguous(), "labels": labels.contiguous()}, str(batch))
    extra = [str(adapter_dir)] if adapter_dir else []
    subprocess.run([str(PARITY), str(model_dir), str(batch), str(out), device, dtype, kernel_set, *extra], check=True)
    return load_file(str(out))


def run_worker(spec, tmp, *extra, check=True):
    """Runs `ftd-worker run SPEC` and returns (exit code, step lines, result line, stderr)."""
    path = Path(tmp) / f"spec-{abs(hash(json.dumps(spec, sort_keys=True)))}.json"
    path.write_text(json.dumps(spec))
    p = subprocess.run([str(WORKER), "run", str(path), *extra], capture_output=True, text=True)
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    steps = [l for l in lines if l["event"] == "step"]
    result = next((l for l in lines if l["event"] == "result"), None)
    if check and p.returncode != 0:
        raise AssertionError(f"ftd-worker exited {p.returncode}: {p.stderr}\n{p.stdout}")
    return p.returncode, steps, result, p.stderr


class WorkerProcess:
    """`ftd-worker run SPEC` with its stdout and stderr read line by line on threads of their own, so
    that a test can wait for a line, signal the worker at that moment and still see every line.
    (Iterating over Popen.stdout and then calling communicate() loses the lines the iteration had
    read ahead: communicate() reads the pipe itself.)"""

    def __init__(self, spec_path, env=None):
        self.p = subprocess.Popen([str(WORKER), "run", str(spec_path)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env)
        self.out, self.err = [], []
        self._cv = threading.Condition()
        self._readers = [threading.Thread(target=self._read, args=(f, lines), daemon=True)
                         for f, lines in ((self.p.stdout, self.out), (self.p.stderr, self.err))]
        for t in self._readers:
            t.start()

    def _read(self, f, lines):
        for line in f:
            with self._cv:
                lines.append(line)
                self._cv.notify_all()
        with self._cv:
            lines.append(None)  # end of the stream
            self._cv.notify_all()

    def wait_for(self, pred, timeout=120):
        """Waits until pred(stdout lines, stderr lines) holds; False if the worker ended first or the
        time ran out."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while not pred([l for l in self.out if l is not None], [l for l in self.err if l is not None]):
                if (self.out and self.out[-1] is None and self.err and self.err[-1] is None) or \
                        not self._cv.wait(timeout=max(0.0, deadline - time.monotonic())):
                    return False
        return True

    def steps_seen(self):
        with self._cv:
            return sum('"event":"step"' in l for l in self.out if l is not None)

    def finish(self, timeout=180):
        """Waits for the worker to exit; (exit code, JSON lines of stdout, stderr)."""
        code = self.p.wait(timeout=timeout)
        for t in self._readers:
            t.join(timeout=timeout)
        out = "".join(l for l in self.out if l is not None)
        return code, [json.loads(l) for l in out.splitlines() if l.startswith("{")], \
            "".join(l for l in self.err if l is not None)


def run_modes(base, tmp, field, values):
    """Runs the worker once per value of the spec's top-level `field`; {value: step lines}, each run
    having succeeded."""
    runs = {}
    for v in values:
        _, steps, result, _ = run_worker(dict(base, **{field: v}), tmp)
        assert result["outcome"] == "SUCCEEDED", (v, result)
        runs[v] = steps
    return runs


def max_rel_err(ours, ref):
    """max |ours - ref| / max |ref| over the tensor (docs/testing.md)."""
    ours, ref = ours.double(), ref.double()
    return ((ours - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def norm_rel_err(ours, ref):
    """||ours - ref|| / ||ref|| (Frobenius) over the tensor (docs/testing.md)."""
    ours, ref = ours.double(), ref.double()
    return ((ours - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def schedule_lr(step, total, lr, kind, warmup, min_ratio):
    """The documented schedule (docs/job-spec.md), written out independently of the engine: linear
    warm-up to lr over `warmup` steps, then constant, or cosine from lr to min_ratio*lr reached at the
    last step."""
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    if kind == "constant":
        return lr
    decay = total - warmup
    if decay <= 1:
        return lr
    progress = min(1.0, (step - warmup) / (decay - 1))
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def token_windows(tokens, t):
    """A token file's ids as windows of t+1 tokens (inputs and shifted labels), in file order."""
    return torch.from_numpy(tokens[: (len(tokens) // (t + 1)) * (t + 1)].astype(np.int64)).view(-1, t + 1)


def hf_reference_steps(model, params, opt, windows, steps, b, accum, clip, lr, kind):
    """The reference side of a training comparison, in ftd's step order: per step, `accum` micro-batches
    of b windows, the loss summed over the step's tokens / their count, backward, clip (0: none), the
    schedule (3 warm-up steps, floor 0.1), AdamW. Yields (loss, grad norm before clipping, lr)."""
    import torch.nn.functional as F
    model.train()
    for s in range(steps):
        micro = [windows[(s * accum + a) * b:(s * accum + a + 1) * b] for a in range(accum)]
        count = sum(w[:, 1:].numel() for w in micro)
        total = 0.0
        for w in micro:
            logits = model(input_ids=w[:, :-1]).logits.float()
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), w[:, 1:].reshape(-1), reduction="sum") / count
            loss.backward()
            total += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
        for g in opt.param_groups:
            g["lr"] = schedule_lr(s, steps, lr, kind, 3, 0.1)
        opt.step()
        opt.zero_grad(set_to_none=True)
        yield total, norm.item(), opt.param_groups[0]["lr"]
