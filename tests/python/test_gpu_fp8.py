"""GPU tests (label `gpu`) of the fp8 kernel set: training LLaMA-3.1-8B-shape layers (two of them, so
the test is quick) on a real text stream against the bf16 fused set, and resuming under fp8.

The text stream: the Python sources the `transformers` package ships (English docstrings, comments
and code), read in sorted file order as bytes, one token per byte (ids 0..255 of the 8B vocabulary).
"""
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from ftdtest import run_worker, write_tokens

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                                reason="no CUDA device with FP8 (compute capability 8.9+) visible")

STEPS, BATCH, SEQ = 300, 4, 512

# LLaMA-3.1-8B (the preset's config) with 2 decoder layers instead of 32.
CONFIG_8B_2L = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
                "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 2, "num_attention_heads": 32,
                "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu", "rms_norm_eps": 1e-5,
                "rope_theta": 500000.0, "max_position_embeddings": 131072, "initializer_range": 0.02,
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False}


def _text_tokens(path, n):
    import transformers
    data = bytearray()
    for f in sorted(Path(transformers.__file__).parent.rglob("*.py")):
        data += f.read_bytes()
        if len(data) >= n:
            break
    assert len(data) >= n, len(data)
    write_tokens(path, np.frombuffer(bytes(data[:n]), dtype=np.uint8).astype(np.uint32), np.uint32)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("fp8")
    (d / "config.json").write_text(json.dumps(CONFIG_8B_2L))
    _text_tokens(d / "text.u32", STEPS * BATCH * (SEQ + 1) + 1)
    spec = {"model": {"config_path": str(d / "config.json")}, "steps": STEPS, "batch_size": BATCH, "seq_len": SEQ,
            "device": "cuda", "dtype": "bf16", "seed": 7,
            "data": {"path": str(d / "text.u32"), "token_dtype": "uint32"},
            "optimizer": {"lr": 3e-4, "grad_clip": 1.0}, "schedule": {"kind": "cosine", "warmup_steps": 20}}
    return d, spec


def _mean(steps, lo, hi):
    return sum(s["loss"] for s in steps[lo:hi]) / (hi - lo)


def test_fp8_loss_follows_bf16_fused_over_300_steps_and_resumes(setup):
    """Same init, same token windows, same schedule: the fp8 set's final loss (mean of the last 10 steps)
    is within 1% of the bf16 fused set's, its curve never diverges (every loss finite, and no
    30-step mean more than 5% above bf16's after warm-up), and it learns (the final loss is far below the first).
    A checkpoint at step 150 resumes under fp8 and continues the same curve (within 1% step by step);
    the checkpoint holds bf16 weights, no FP8 tensor."""
    d, spec = setup
    _, fused, result, _ = run_worker(dict(spec, kernel_set="fused"), d)
    assert result["outcome"] == "SUCCEEDED", result
    ck = d / "ck"
    _, fp8, result, _ = run_worker(dict(spec, kernel_set="fp8", checkpoint={"dir": str(ck), "every_steps": 150}), d)
    assert result["outcome"] == "SUCCEEDED", result
    assert len(fp8) == len(fused) == STEPS
    curves = [(s["step"], round(a["loss"], 4), round(s["loss"], 4)) for a, s in zip(fused, fp8)][::10]
    print("step, bf16 fused loss, fp8 loss:", curves)
    assert all(math.isfinite(s["loss"]) for s in fp8)
    # Diverging shows as a loss above bf16's. Before step 100 the two runs' curves spike at different
    # steps (GPU reductions are not bit-reproducible, and at lr 3e-4 a spike moves a 10-step mean by 6%
    # either way: fp8 6% *below* bf16 at steps 80-90 was seen once), so the windows are 30 steps long.
    for lo in range(30, STEPS, 30):
        b, f = _mean(fused, lo, lo + 30), _mean(fp8, lo, lo + 30)
        assert f <= 1.05 * b, (lo, b, f)
    final_bf16, final_fp8 = _mean(fused, STEPS - 10, STEPS), _mean(fp8, STEPS - 10, STEPS)
    print(f"final loss (mean of the last 10 steps): bf16 fused {final_bf16:.4f}, fp8 {final_fp8:.4f}, "
          f"{100 * (final_fp8 / final_bf16 - 1):+.2f}%")
    assert abs(final_fp8 - final_bf16) <= 0.01 * final_bf16, (final_bf16, final_fp8)
    assert final_fp8 < fp8[0]["loss"] - 3, (fp8[0]["loss"], final_fp8)

    from safetensors import safe_open
    with safe_open(str(ck / f"step-{STEPS:08d}" / "model.safetensors"), "pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes == {"BF16"}, dtypes

    (ck / f"step-{STEPS:08d}").rename(d / "later")  # resume from step 150
    _, resumed, result, _ = run_worker(dict(spec, kernel_set="fp8", checkpoint={"dir": str(ck)}), d)
    assert result["outcome"] == "SUCCEEDED" and resumed[0]["step"] == 151, (result, resumed[:1])
    for a, b in zip(fp8[150:], resumed):
        assert abs(a["loss"] - b["loss"]) <= 1e-2 * abs(a["loss"]), (a["step"], a["loss"], b["loss"])
