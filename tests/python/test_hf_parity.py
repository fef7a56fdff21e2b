"""Parity of our LibTorch LLaMA with HF transformers on CPU, fp32: logits, gradients, and the losses
of 10 AdamW steps through the real ftd-worker (data loader, schedule, clipping, accumulation)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ftdtest import (CONFIGS, hf_reference_steps, make_hf_model, max_rel_err, run_parity, run_worker, token_windows,
                     write_tokens)

torch.set_num_threads(2)


def random_batch(vocab, b, t, gen):
    ids = torch.randint(0, vocab, (b, t + 1), generator=gen)
    labels = ids[:, 1:].clone()
    labels[0, :3] = -100          # ignore_index honoured: a masked prefix...
    labels[-1, -2] = -100         # ...and a masked position inside a row
    return ids[:, :-1].contiguous(), labels


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_and_gradients_match_transformers(name, tmp_path):
    model = make_hf_model(name, tmp_path / "m", seed=11)
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)  # fresh inputs on every run
    ids, labels = random_batch(CONFIGS[name]["vocab_size"], 3, 17, gen)

    ours = run_parity(tmp_path / "m", ids, labels, tmp_path)

    logits = model(input_ids=ids).logits.float()
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100)
    loss.backward()
    assert max_rel_err(ours["logits"], logits.detach()) <= 1e-5
    assert abs(ours["loss"].item() - loss.item()) / loss.item() <= 1e-5
    grads = dict(model.named_parameters())
    checked = 0
    for key, g in ours.items():
        if not key.startswith("grad."):
            continue
        ref = grads[key[len("grad."):]].grad
        assert max_rel_err(g, ref) <= 1e-4, key
        checked += 1
    assert checked == len(grads)  # every HF parameter (tied ones once) has a gradient from us


@pytest.mark.parametrize("name,accum,clip,kind", [
    ("gqa_llama3_untied", 1, 1e3, "cosine"),    # a clip that never binds: gradients pass unscaled
    ("mqa_llama3_tied", 2, 0.05, "constant"),   # a clip that binds, and gradient accumulation
    ("mha_tied_headdim", 1, 0.0, "cosine"),
])
def test_ten_adamw_steps_match_transformers(name, accum, clip, kind, tmp_path):
    model = make_hf_model(name, tmp_path / "m", seed=5)
    vocab, b, t, steps = CONFIGS[name]["vocab_size"], 2, 13, 10
    rng = np.random.default_rng()
    tokens = rng.integers(0, vocab, size=(steps * accum * b + 3) * (t + 1) + 5)
    write_tokens(tmp_path / "tokens.bin", tokens)
    hp = dict(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=clip)
    spec = {
        "model": {"weights_path": str(tmp_path / "m")},
        "data": {"path": str(tmp_path / "tokens.bin"), "token_dtype": "uint16", "shuffle": False},
        "optimizer": hp,
        "schedule": {"kind": kind, "warmup_steps": 3, "min_lr_ratio": 0.1},
        "steps": steps, "batch_size": b, "seq_len": t, "grad_accum_steps": accum,
        "device": "cpu", "dtype": "fp32",
    }
    _, ours, result, _ = run_worker(spec, tmp_path)
    assert result["outcome"] == "SUCCEEDED" and len(ours) == steps

    # Reference: transformers + torch.optim.AdamW with the same hyperparameters and batches.
    params = [p for p in model.parameters()]
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": hp["weight_decay"]},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"])
    ref = hf_reference_steps(model, params, opt, token_windows(tokens, t), steps, b, accum, clip, hp["lr"], kind)
    for s, (total, norm, lr) in enumerate(ref):
        assert clip < 1e3 or norm < clip / 10, norm  # the non-binding case does not bind
        assert abs(ours[s]["loss"] - total) / total <= 1e-5, (s, ours[s]["loss"], total)
        assert abs(ours[s]["grad_norm"] - norm) / norm <= 1e-4, s
        assert ours[s]["lr"] == pytest.approx(lr, rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sharded_half_precision_checkpoints_load(dtype, tmp_path):
    """HF weights saved in bf16/fp16 and sharded (model.safetensors.index.json) load into our fp32
    model exactly: the logits equal HF's on the same (upcast) weights."""
    model = make_hf_model("gqa_llama3_untied", tmp_path / "full", seed=4)
    model.to(dtype).save_pretrained(tmp_path / "m", safe_serialization=True, max_shard_size="60KB")
    assert (tmp_path / "m" / "model.safetensors.index.json").exists()
    assert len(list((tmp_path / "m").glob("model-*.safetensors"))) > 1
    model = model.float()  # the same values, upcast
    ids = torch.randint(0, CONFIGS["gqa_llama3_untied"]["vocab_size"], (2, 9))
    ours = run_parity(tmp_path / "m", ids, ids.clone(), tmp_path)
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    assert max_rel_err(ours["logits"], ref) <= 1e-5


def test_random_init_follows_hf(tmp_path):
    """Without weights: linear and embedding weights ~ N(0, initializer_range), norm weights 1."""
    from safetensors.torch import load_file
    cfg = dict(CONFIGS["gqa_llama3_untied"], initializer_range=0.05, model_type="llama")
    (tmp_path / "config.json").write_text(__import__("json").dumps(cfg))
    spec = {"model": {"config_path": str(tmp_path / "config.json")}, "steps": 1, "batch_size": 1, "seq_len": 8,
            "optimizer": {"lr": 1e-12, "weight_decay": 0.0}, "device": "cpu",
            "checkpoint": {"dir": str(tmp_path / "ck")}}
    run_worker(spec, tmp_path)
    w = load_file(str(tmp_path / "ck" / "step-00000001" / "model.safetensors"))
    mats = torch.cat([t.flatten() for k, t in w.items() if t.dim() == 2])
    assert abs(mats.mean().item()) < 2e-3 and mats.std().item() == pytest.approx(0.05, rel=0.02)
    norms = [t for k, t in w.items() if k.endswith("norm.weight")]
    assert len(norms) == 2 * cfg["num_hidden_layers"] + 1
    assert all(torch.allclose(t, torch.ones_like(t), atol=1e-6) for t in norms)
