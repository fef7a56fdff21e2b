"""LoRA fine-tuning against HF transformers + PEFT on CPU, fp32, through the real ftd-worker: the
losses, gradient norms and adapter weights of 10 AdamW steps; PEFT loads the adapters ftd writes
and gives the same logits; the merged model loads in transformers alone; the init follows PEFT's;
resume; bad specs."""
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from ftdtest import (CONFIGS, hf_reference_steps, make_hf_model, max_rel_err, norm_rel_err, run_parity, run_worker,
                     token_windows, write_tokens)

torch.set_num_threads(2)

HF_NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
            "down": "down_proj"}


def peft_model(base, targets, rank, alpha, rslora=False, init=True):
    from peft import LoraConfig, get_peft_model
    cfg = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, use_rslora=rslora, init_lora_weights=init,
                     target_modules=[HF_NAMES.get(t, t) for t in targets], task_type="CAUSAL_LM")
    return get_peft_model(base, cfg)


def adapter_state(model):
    from peft import get_peft_model_state_dict
    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}


CASES = [
    # model, targets, rank, alpha, rslora, accumulation, clip, schedule
    ("gqa_llama3_untied", ["q", "k", "v", "o", "gate", "up", "down"], 4, 8, False, 1, 1.0, "cosine"),
    ("mqa_llama3_tied", ["q_proj", "v_proj"], 7, 3.5, True, 2, 0.05, "constant"),  # clip binds; accumulation
    ("mha_tied_headdim", ["o", "gate", "down"], 16, 16, False, 1, 0.0, "cosine"),
]


@pytest.mark.parametrize("lora_op", ["eager", "fused"])
@pytest.mark.parametrize("name,targets,rank,alpha,rslora,accum,clip,kind", CASES,
                         ids=[f"{c[0]}-r{c[2]}-{len(c[1])}mods" for c in CASES])
def test_ten_adamw_steps_match_peft(name, targets, rank, alpha, rslora, accum, clip, kind, lora_op, tmp_path):
    """Both start from the same adapters (PEFT's, B non-zero so every path carries signal from step
    1) saved by PEFT and read by ftd through spec.lora.adapter_path; same batches, schedule, clipping,
    weight decay. Losses within 1e-5, gradient norms within 1e-4, and the adapters after 10 steps.
    Both implementations of the lora op: eager (per module, as PEFT) and fused (grouped per input)."""
    base = make_hf_model(name, tmp_path / "m", seed=5)
    seed = 1000 * rank + 10 * len(targets) + accum  # fixed per case: a failure reproduces
    torch.manual_seed(seed)
    model = peft_model(base, targets, rank, alpha, rslora, init=False)
    model.save_pretrained(tmp_path / "init")
    vocab, b, t, steps = CONFIGS[name]["vocab_size"], 2, 13, 10
    tokens = np.random.default_rng(seed).integers(0, vocab, size=(steps * accum * b + 3) * (t + 1) + 5)
    write_tokens(tmp_path / "tokens.bin", tokens)
    hp = dict(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=clip)
    spec = {
        "model": {"weights_path": str(tmp_path / "m")},
        "data": {"path": str(tmp_path / "tokens.bin")},
        "optimizer": hp, "schedule": {"kind": kind, "warmup_steps": 3, "min_lr_ratio": 0.1},
        "steps": steps, "batch_size": b, "seq_len": t, "grad_accum_steps": accum, "device": "cpu", "dtype": "fp32",
        "lora": {"rank": rank, "alpha": alpha, "target_modules": targets, "use_rslora": rslora,
                 "adapter_path": str(tmp_path / "init")},
        "checkpoint": {"dir": str(tmp_path / "ck")}, "kernels": {"lora": lora_op},
    }
    _, ours, result, log = run_worker(spec, tmp_path)
    assert result["outcome"] == "SUCCEEDED" and len(ours) == steps
    assert ("kernels eager" in log) == (lora_op == "eager"), log  # the op ran as asked

    params = [p for p in model.parameters() if p.requires_grad]
    assert params and all(p.dim() == 2 for p in params)  # adapters only; all decayed (rank >= 2)
    opt = torch.optim.AdamW(params, lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"],
                            weight_decay=hp["weight_decay"])
    ref = hf_reference_steps(model, params, opt, token_windows(tokens, t), steps, b, accum, clip, hp["lr"], kind)
    for s, (total, norm, _) in enumerate(ref):
        assert abs(ours[s]["loss"] - total) / total <= 1e-5, (s, ours[s]["loss"], total)
        assert abs(ours[s]["grad_norm"] - norm) / norm <= 1e-4, s

    saved = load_file(str(tmp_path / "ck" / f"step-{steps:08d}" / "adapter_model.safetensors"))
    ref = adapter_state(model)
    assert sorted(saved) == sorted(ref)  # PEFT's names, nothing else
    for k, v in ref.items():
        assert saved[k].dtype == torch.float32 and saved[k].shape == v.shape, k
        # Norm-wise, as tight as the losses allow; element-wise looser: AdamW's update of an element
        # whose gradient is near zero is about lr x sign, so a rounding-level gradient difference can
        # move that one element by up to lr per step.
        assert norm_rel_err(saved[k], v) <= 1e-4, k
        assert max_rel_err(saved[k], v) <= 1e-3, k


def test_saved_adapter_loads_in_peft_and_merged_model_loads_alone(tmp_path):
    """ftd trains from its own init (B zero) and writes the adapters and the merged model. PEFT loads
    the adapters onto the HF base (which ftd must not have changed) and gives ftd's logits; the
    merged model loads in transformers alone and gives the same logits."""
    from peft import PeftModel
    from transformers import LlamaForCausalLM
    name = "gqa_llama3_untied"
    base = make_hf_model(name, tmp_path / "m", seed=7)
    vocab = CONFIGS[name]["vocab_size"]
    write_tokens(tmp_path / "tokens.bin", np.random.default_rng().integers(0, vocab, size=4000))
    spec = {"model": {"weights_path": str(tmp_path / "m")}, "data": {"path": str(tmp_path / "tokens.bin")},
            "steps": 8, "batch_size": 2, "seq_len": 16, "device": "cpu", "optimizer": {"lr": 1e-2},
            "lora": {"rank": 6, "alpha": 12, "target_modules": ["q", "v", "up", "down"], "merge": True},
            "checkpoint": {"dir": str(tmp_path / "ck"), "every_steps": 4}}
    _, steps, result, _ = run_worker(spec, tmp_path)
    assert result["outcome"] == "SUCCEEDED"
    final = tmp_path / "ck" / "step-00000008"
    assert result["last_checkpoint"] == str(final)
    assert sorted(p.name for p in final.iterdir()) == [
        "MANIFEST.json", "adapter_config.json", "adapter_model.safetensors", "merged", "optimizer.safetensors",
        "trainer_state.json"]
    assert not (tmp_path / "ck" / "step-00000004" / "merged").exists()  # merged with the last checkpoint only
    manifest = json.loads((final / "MANIFEST.json").read_text())
    assert set(manifest["files"]) >= {"merged/model.safetensors", "merged/config.json", "adapter_model.safetensors"}
    cfg = json.loads((final / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == str(tmp_path / "m")
    adapters = load_file(str(final / "adapter_model.safetensors"))
    assert all(v.abs().max() > 0 for k, v in adapters.items() if "lora_B" in k)  # trained away from zero

    ids = torch.randint(0, vocab, (3, 11))
    peft = PeftModel.from_pretrained(base, str(final)).eval()
    with torch.no_grad():
        ref = peft(input_ids=ids).logits
        base_logits = peft.get_base_model()
    ours = run_parity(tmp_path / "m", ids, ids.clone(), tmp_path, adapter_dir=final)
    assert max_rel_err(ours["logits"], ref) <= 1e-5
    merged = LlamaForCausalLM.from_pretrained(str(final / "merged")).eval()
    with torch.no_grad():
        assert max_rel_err(merged(input_ids=ids).logits, ref) <= 1e-5
    # The adapters matter: without them the logits are elsewhere.
    with torch.no_grad(), peft.disable_adapter():
        plain = peft(input_ids=ids).logits
    assert max_rel_err(plain, ref) > 1e-3
    del base_logits


@pytest.mark.parametrize("init", ["kaiming_uniform", "gaussian"])
def test_init_follows_peft_and_the_first_loss_is_the_base_models(init, tmp_path):
    """A as PEFT draws it (kaiming_uniform_(a=sqrt(5)): U(-1/sqrt(in), 1/sqrt(in)); gaussian:
    N(0, 1/rank)), B zero: the first step's loss is the frozen base's, as HF computes it."""
    name = "gqa_llama3_untied"
    base = make_hf_model(name, tmp_path / "m", seed=3)
    c = CONFIGS[name]
    vocab, rank, t = c["vocab_size"], 8, 16
    tokens = np.random.default_rng().integers(0, vocab, size=2 * (t + 1) * 3)
    write_tokens(tmp_path / "tokens.bin", tokens)
    spec = {"model": {"weights_path": str(tmp_path / "m")}, "data": {"path": str(tmp_path / "tokens.bin")},
            "steps": 1, "batch_size": 2, "seq_len": t, "device": "cpu", "seed": 123,
            "optimizer": {"lr": 1e-12, "weight_decay": 0.0},
            "lora": {"rank": rank, "init": init}, "checkpoint": {"dir": str(tmp_path / "ck")}}
    _, steps, _, _ = run_worker(spec, tmp_path)
    w = token_windows(tokens, t)[:2]
    with torch.no_grad():
        logits = base(input_ids=w[:, :-1]).logits
    ref = F.cross_entropy(logits.reshape(-1, vocab), w[:, 1:].reshape(-1)).item()
    assert abs(steps[0]["loss"] - ref) / ref <= 1e-5

    saved = load_file(str(tmp_path / "ck" / "step-00000001" / "adapter_model.safetensors"))
    assert len(saved) == 2 * 7 * c["num_hidden_layers"]  # default: all seven projections
    a_all = []
    for k, v in saved.items():
        if "lora_B" in k:
            assert v.abs().max() < 1e-9, k  # zero, moved by at most lr
            continue
        assert v.shape[0] == rank
        fan_in = v.shape[1]
        if init == "kaiming_uniform":
            bound = 1 / math.sqrt(fan_in)
            assert v.abs().max() <= bound * (1 + 1e-6), k
            a_all.append(v.flatten() / bound)  # U(-1, 1): std 1/sqrt(3)
        else:
            a_all.append(v.flatten() * rank)  # N(0, 1)
    a = torch.cat(a_all)
    want = 1 / math.sqrt(3) if init == "kaiming_uniform" else 1.0
    assert abs(a.mean().item()) < 0.02 and a.std().item() == pytest.approx(want, rel=0.03)
    # Another seed draws other adapters; the same seed the same ones.
    spec2 = dict(spec, checkpoint={"dir": str(tmp_path / "ck2")})
    run_worker(spec2, tmp_path)
    again = load_file(str(tmp_path / "ck2" / "step-00000001" / "adapter_model.safetensors"))
    assert all(torch.equal(again[k], saved[k]) for k in saved)
    spec3 = dict(spec, seed=124, checkpoint={"dir": str(tmp_path / "ck3")})
    run_worker(spec3, tmp_path)
    other = load_file(str(tmp_path / "ck3" / "step-00000001" / "adapter_model.safetensors"))
    assert not any(torch.equal(other[k], saved[k]) for k in saved if "lora_A" in k)


def test_resume_from_adapter_checkpoint_reproduces_the_losses(tmp_path):
    """Checkpoints hold the adapters and their AdamW state only; a run stopped at step 3 and resumed
    gives the uninterrupted run's losses (cosine schedule, accumulation, shuffled data)."""
    name = "mqa_llama3_tied"
    make_hf_model(name, tmp_path / "m", seed=1)
    vocab = CONFIGS[name]["vocab_size"]
    write_tokens(tmp_path / "tokens.bin", np.random.default_rng(0).integers(0, vocab, size=6000))
    def spec(steps, ck):
        return {"model": {"weights_path": str(tmp_path / "m")},
                "data": {"path": str(tmp_path / "tokens.bin"), "shuffle": True}, "steps": steps, "batch_size": 2,
                "seq_len": 12, "grad_accum_steps": 2, "device": "cpu", "optimizer": {"lr": 5e-3},
                "schedule": {"kind": "cosine", "warmup_steps": 2},
                "lora": {"rank": 4, "target_modules": ["k", "o", "up"]}, "checkpoint": {"dir": str(tmp_path / ck)}}
    _, full, _, _ = run_worker(spec(6, "full"), tmp_path)
    _, first, _, _ = run_worker(spec(3, "resumed"), tmp_path)
    ck = tmp_path / "resumed" / "step-00000003"
    assert not (ck / "model.safetensors").exists()
    opt = load_file(str(ck / "optimizer.safetensors"))
    adapters = load_file(str(ck / "adapter_model.safetensors"))
    assert {k for k in opt if k.startswith("exp_avg.")} == {f"exp_avg.{k}" for k in adapters}
    _, rest, _, log = run_worker(spec(6, "resumed"), tmp_path)
    assert "resumed from" in log
    assert [s["step"] for s in rest] == [4, 5, 6]
    for a, b in zip(full[3:], rest):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6), (a, b)

    # A full fine-tuning run on this LoRA checkpoint directory is refused, naming both kinds.
    bad = spec(8, "resumed")
    del bad["lora"]
    code, _, result, _ = run_worker(bad, tmp_path, check=False)
    assert code != 0 and "LoRA checkpoint" in result["message"] and "full fine-tuning" in result["message"]


@pytest.mark.parametrize("lora,extra,needle", [
    ({"rank": 0}, {}, "spec.lora.rank must be in [1, 4096] (got 0)"),
    ({"target_modules": ["q", "lm_head"]}, {}, "spec.lora.target_modules takes only q, k, v, o, gate, up, down"),
    ({"target_modules": ["q", "q_proj"]}, {}, "spec.lora.target_modules names each module once"),
    ({"target_modules": []}, {}, None),  # an empty list is the default (all seven), not an error
    ({"dropout": 1.0}, {}, "spec.lora.dropout must be in [0, 1)"),
    ({"alpha": -1}, {}, "spec.lora.alpha must be a finite number > 0"),
    ({"dtype": "fp16"}, {}, "spec.lora.dtype must be \"fp32\" or \"bf16\""),
    ({"init": "pissa"}, {}, "spec.lora.init must be \"kaiming_uniform\""),
    ({}, {"fp32_master_weights": True, "dtype": "bf16"}, "spec.fp32_master_weights does not apply to LoRA"),
])
def test_bad_lora_specs_are_refused_naming_the_field(lora, extra, needle, tmp_path):
    spec = {"model": {"preset": "tiny"}, "steps": 1, "batch_size": 1, "seq_len": 8, "device": "cpu", "lora": lora,
            **extra}
    code, _, result, _ = run_worker(spec, tmp_path, check=False)
    if needle is None:
        assert code == 0 and result["outcome"] == "SUCCEEDED"
    else:
        assert code == 2 and result["outcome"] == "INVALID_SPEC" and needle in result["message"], result


def test_adapter_path_that_disagrees_with_the_spec_is_refused(tmp_path):
    base = make_hf_model("gqa_llama3_untied", tmp_path / "m", seed=1)
    peft_model(base, ["q", "v"], 4, 8).save_pretrained(tmp_path / "a")
    common = {"model": {"weights_path": str(tmp_path / "m")}, "steps": 1, "batch_size": 1, "seq_len": 8,
              "device": "cpu"}
    for lora, needle in [
        ({"rank": 8, "alpha": 8, "target_modules": ["q", "v"]}, "r is 4 but spec.lora.rank gives 8"),
        ({"rank": 4, "alpha": 8, "target_modules": ["q", "k"]}, "target_modules"),
        ({"rank": 4, "target_modules": ["q", "v"]}, "lora_alpha is 8 but spec.lora.alpha gives 4"),
    ]:
        code, _, result, _ = run_worker(dict(common, lora=dict(lora, adapter_path=str(tmp_path / "a"))), tmp_path,
                                        check=False)
        assert code == 2 and "spec.lora.adapter_path" in result["message"] and needle in result["message"], result
    code, _, result, _ = run_worker(dict(common, lora={"rank": 4, "alpha": 8, "target_modules": ["q", "v"],
                                                       "adapter_path": str(tmp_path / "a")}), tmp_path)
    assert code == 0


def test_dropout_trains_and_changes_the_path(tmp_path):
    """lora.dropout > 0 runs (on the adapters' input only): the same seed and data with dropout 0.3
    follow another loss curve than without, and both learn."""
    runs = {}
    for p in (0.0, 0.3):
        spec = {"model": {"preset": "tiny"}, "steps": 30, "batch_size": 8, "seq_len": 32, "device": "cpu",
                "optimizer": {"lr": 1e-2}, "lora": {"rank": 8, "dropout": p}}
        _, steps, result, _ = run_worker(spec, tmp_path)
        assert result["outcome"] == "SUCCEEDED"
        runs[p] = [s["loss"] for s in steps]
    assert runs[0.0][0] == pytest.approx(runs[0.3][0], rel=1e-6)  # B = 0: dropout cannot matter yet
    assert runs[0.0][-1] != pytest.approx(runs[0.3][-1], rel=1e-4)
    assert runs[0.0][-1] < runs[0.0][0] - 0.3 and runs[0.3][-1] < runs[0.3][0] - 0.3


def test_bf16_adapters_on_an_fp32_base_train_alike_with_both_lora_ops(tmp_path):
    """lora.dtype bf16 on the CPU's fp32 base: both implementations of the lora op train, and their
    losses agree to bf16 precision."""
    losses = {}
    for op in ("eager", "fused"):
        spec = {"model": {"preset": "tiny"}, "steps": 20, "batch_size": 8, "seq_len": 32, "device": "cpu",
                "optimizer": {"lr": 1e-2}, "lora": {"rank": 8, "dtype": "bf16", "alpha": 16},
                "kernels": {"lora": op}, "checkpoint": {"dir": str(tmp_path / op)}}
        _, steps, result, _ = run_worker(spec, tmp_path)
        assert result["outcome"] == "SUCCEEDED"
        losses[op] = [s["loss"] for s in steps]
        saved = load_file(str(tmp_path / op / "step-00000020" / "adapter_model.safetensors"))
        assert all(v.dtype == torch.bfloat16 for v in saved.values())
    assert losses["fused"][-1] < losses["fused"][0] - 0.3
    for a, b in zip(losses["eager"], losses["fused"]):
        assert a == pytest.approx(b, rel=1e-2)
