"""The training engine end to end through the real ftd-worker binary: the embedded default job
learns, checkpoints are atomic, load in transformers and resume exactly, bad input is refused
with the field named."""
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from ftdtest import CONFIGS, WORKER, make_hf_model, max_rel_err, run_modes, run_parity, run_worker, write_tokens

torch.set_num_threads(2)


def test_embedded_default_job_learns(tmp_path):
    code, steps, result, _ = run_worker({"model": {"preset": "tiny"}, "steps": 60, "batch_size": 16, "seq_len": 64,
                                         "optimizer": {"lr": 3e-3}, "device": "cpu"}, tmp_path)
    assert code == 0 and result["outcome"] == "SUCCEEDED"
    losses = [s["loss"] for s in steps]
    assert losses[0] > 3.5                  # ~ln(64): it starts knowing nothing
    assert losses[-1] < losses[0] - 1.5     # and learns the arithmetic language's structure
    for s in steps:
        assert s["tokens"] == 16 * 64 and s["tokens_per_s"] > 0 and s["peak_rss_bytes"] > 0


def test_checkpoint_loads_in_transformers_with_same_logits(tmp_path):
    make_hf_model("gqa_llama3_untied", tmp_path / "m", seed=3)
    spec = {"model": {"weights_path": str(tmp_path / "m")}, "steps": 4, "batch_size": 2, "seq_len": 16,
            "optimizer": {"lr": 1e-2}, "device": "cpu", "checkpoint": {"dir": str(tmp_path / "ck"), "every_steps": 2}}
    _, _, result, _ = run_worker(spec, tmp_path)
    ck = tmp_path / "ck" / "step-00000004"
    assert result["last_checkpoint"] == str(ck)
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step-00000002", "step-00000004"]
    assert json.loads((ck / "MANIFEST.json").read_text())["step"] == 4

    from transformers import LlamaForCausalLM
    hf = LlamaForCausalLM.from_pretrained(ck, torch_dtype=torch.float32).eval()
    trained = dict(hf.named_parameters())
    before = make_hf_model("gqa_llama3_untied", tmp_path / "m0", seed=3)
    assert not torch.equal(trained["model.layers.0.self_attn.q_proj.weight"],
                           dict(before.named_parameters())["model.layers.0.self_attn.q_proj.weight"])
    ids = torch.randint(0, CONFIGS["gqa_llama3_untied"]["vocab_size"], (2, 11))
    ours = run_parity(ck, ids, ids.clone(), tmp_path)
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
    assert max_rel_err(ours["logits"], ref) <= 1e-5


@pytest.mark.parametrize("accum", [1, 2])
def test_resume_gives_the_same_later_losses(tmp_path, accum):
    """fp32 on CPU: resuming from the step-5 checkpoint gives steps 6-10 of the uninterrupted run."""
    base = {"model": {"preset": "tiny"}, "steps": 10, "batch_size": 4, "seq_len": 32, "grad_accum_steps": accum,
            "data": {"shuffle": True, "seed": 99}, "schedule": {"kind": "cosine", "warmup_steps": 2},
            "optimizer": {"lr": 2e-3}, "device": "cpu", "seed": 5}
    _, full, _, _ = run_worker(base, tmp_path)
    # The same job with a checkpoint every 5 steps; drop the final one, as if the run had died
    # after step 7, and resume from step 5.
    ck = tmp_path / "ck"
    spec = dict(base, checkpoint={"dir": str(ck), "every_steps": 5})
    _, part1, r1, _ = run_worker(spec, tmp_path)
    assert r1["last_checkpoint"].endswith("step-00000010")
    shutil.rmtree(ck / "step-00000010")
    _, part2, r2, err = run_worker(spec, tmp_path)
    assert "resumed from " + str(ck / "step-00000005") in err
    assert [s["step"] for s in part2] == list(range(6, 11))
    want = [s["loss"] for s in full]
    assert [s["loss"] for s in part1] == want   # checkpointing does not perturb the run
    assert [s["loss"] for s in part2] == pytest.approx(want[5:], rel=1e-6, abs=0)
    assert r2["last_checkpoint"].endswith("step-00000010")


def test_incomplete_checkpoints_are_ignored(tmp_path):
    base = {"model": {"preset": "tiny"}, "steps": 3, "batch_size": 2, "seq_len": 16, "device": "cpu",
            "checkpoint": {"dir": str(tmp_path / "ck")}}
    run_worker(base, tmp_path)
    ck = tmp_path / "ck"
    # A crash mid-write leaves a .tmp directory, or a directory whose manifest is missing or lies.
    shutil.copytree(ck / "step-00000003", ck / "step-00000007.tmp")
    shutil.copytree(ck / "step-00000003", ck / "step-00000008")
    (ck / "step-00000008" / "MANIFEST.json").unlink()
    shutil.copytree(ck / "step-00000003", ck / "step-00000009")
    with open(ck / "step-00000009" / "model.safetensors", "r+b") as f:
        f.truncate(100)
    _, steps, result, err = run_worker(dict(base, steps=5), tmp_path)
    assert "resumed from " + str(ck / "step-00000003") in err
    assert [s["step"] for s in steps] == [4, 5]


def test_sigterm_checkpoints_and_stops(tmp_path):
    spec = {"model": {"preset": "tiny"}, "steps": 100000, "batch_size": 2, "seq_len": 16, "device": "cpu",
            "checkpoint": {"dir": str(tmp_path / "ck")}}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    p = subprocess.Popen([str(WORKER), "run", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stdout:  # wait until it is really training
        if json.loads(line).get("step", 0) >= 3:
            break
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=60)
    result = [json.loads(l) for l in out.splitlines() if '"result"' in l][-1]
    assert p.returncode == 5 and result["outcome"] == "CANCELLED"
    assert Path(result["last_checkpoint"]).joinpath("MANIFEST.json").exists()


def test_non_finite_loss_stops_the_run_without_applying_the_update(tmp_path):
    from safetensors.torch import load_file
    base = {"model": {"preset": "tiny"}, "steps": 200, "batch_size": 4, "seq_len": 16, "device": "cpu",
            "optimizer": {"lr": 1e30, "grad_clip": 0, "weight_decay": 0}}
    code, steps, result, err = run_worker(dict(base, checkpoint={"dir": str(tmp_path / "ck")}), tmp_path, check=False)
    assert code == 4 and result["outcome"] == "NON_FINITE"
    assert "non-finite" in result["message"] and "skipped" in result["message"]
    good = result["steps_done"]
    assert good == len(steps) and 1 <= good < 200
    # The last good state was checkpointed. The same job stopped after its `good` steps ends in the
    # state the failed step must have left alone: weights, AdamW moments and step counts, RNG, bit
    # for bit.
    ck = Path(result["last_checkpoint"])
    assert ck.name == f"step-{good:08d}"
    _, _, ref, _ = run_worker(dict(base, steps=good, checkpoint={"dir": str(tmp_path / "ref")}), tmp_path)
    for name in ("model.safetensors", "optimizer.safetensors"):
        got, want = load_file(str(ck / name)), load_file(str(Path(ref["last_checkpoint"]) / name))
        assert got.keys() == want.keys()
        changed = [k for k in want if not torch.equal(got[k].reshape(-1).view(torch.uint8),
                                                      want[k].reshape(-1).view(torch.uint8))]
        assert not changed, f"the skipped step changed {name}: {changed[:5]}"


@pytest.mark.parametrize("spec,needle", [
    ({"batch_size": 0}, "spec.batch_size must be >= 1 (got 0)"),
    ({"batchsize": 3}, "batchsize"),
    ({"optimizer": {"lr": -1}}, "spec.optimizer.lr"),
    ({"model": {"preset": "gpt2"}}, "spec.model.preset must be one of"),
    ({"data": {"path": "/nonexistent/tokens.bin"}}, "spec.data.path"),
    ({"device": "cuda:7"}, "spec.device"),
    ({"kernel_set": "fused"}, "need a GPU"),
    ({"kernels": {"rmsnrom": "fused"}}, "spec.kernels.rmsnrom is not an op; the ops are: rmsnorm, rope"),
    # Non-finite numbers (the JSON mapping spells them as strings) and the static upper bounds.
    ({"optimizer": {"eps": "Infinity"}}, "spec.optimizer.eps must be a finite number (got inf)"),
    ({"peak_flops": "Infinity"}, "spec.peak_flops must be a finite number (got inf)"),
    ({"optimizer": {"lr": "NaN"}}, "spec.optimizer.lr must be a finite number (got nan)"),
    ({"batch_size": 1000000000}, "spec.batch_size must be <= 65536 (got 1000000000)"),
    ({"seq_len": 2000000}, "spec.seq_len must be <= 1048576 (got 2000000)"),
])
def test_bad_specs_are_refused_naming_the_field(tmp_path, spec, needle):
    code, steps, _, err = run_worker(dict({"device": "cpu", "steps": 2}, **spec), tmp_path, check=False)
    assert code == 2 and not steps
    assert needle in err


def run_worker_within(spec, tmp, seconds):
    """ftd-worker run SPEC, killed if it has not exited within `seconds`: (exit code, result, stderr)."""
    path = Path(tmp) / "spec.json"
    path.write_text(json.dumps(spec))
    p = subprocess.Popen([str(WORKER), "run", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"ftd-worker still running after {seconds} s: {err}")
    result = next((json.loads(l) for l in out.splitlines() if '"result"' in l), None)
    return p.returncode, result, err


@pytest.mark.parametrize("where,field,kind", [
    ("data", "spec.data.path", "a FIFO"),
    ("data_dir", "spec.data.path", "a directory"),
    ("data_device", "spec.data.path", "a character device"),
    ("weights", "spec.model.weights_path", "a FIFO"),
    ("weights_config", "spec.model.weights_path", "a FIFO"),
    ("config", "spec.model.config_path", "a FIFO"),
])
def test_inputs_that_are_not_regular_files_are_refused_at_open(tmp_path, where, field, kind):
    """A FIFO with no writer blocked the worker in open() or read() forever; a device or a directory
    where a file belongs is refused as well, naming the spec field."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    spec = {"model": {"preset": "tiny"}, "device": "cpu", "steps": 1, "batch_size": 1, "seq_len": 8}
    if where == "data":
        spec["data"] = {"path": str(fifo)}
    elif where == "data_dir":
        spec["data"] = {"path": str(tmp_path)}
    elif where == "data_device":
        spec["data"] = {"path": "/dev/zero"}
    elif where == "config":
        spec["model"] = {"config_path": str(fifo)}
    else:
        make_hf_model("mha_tied_headdim", tmp_path / "m")
        name = "model.safetensors" if where == "weights" else "config.json"
        (tmp_path / "m" / name).unlink()
        os.mkfifo(tmp_path / "m" / name)
        spec["model"] = {"weights_path": str(tmp_path / "m")}
    code, result, err = run_worker_within(spec, tmp_path, 60)
    assert code == 2 and result["outcome"] == "INVALID_SPEC", err
    assert result["message"].startswith(field + ": ") and f" is {kind}, not a regular file" in result["message"]


def test_corrupt_weights_are_refused_naming_the_tensor(tmp_path):
    make_hf_model("mha_tied_headdim", tmp_path / "m")
    f = tmp_path / "m" / "model.safetensors"
    size = f.stat().st_size
    with open(f, "r+b") as fh:
        fh.truncate(size - 64)  # the last tensor in the buffer loses its tail
    code, _, result, err = run_worker({"model": {"weights_path": str(tmp_path / "m")}, "device": "cpu",
                                       "steps": 1, "batch_size": 1, "seq_len": 8}, tmp_path, check=False)
    assert code == 2 and result["outcome"] == "INVALID_SPEC"
    assert "truncated" in err and "tensor \"" in err


def test_token_files_uint16_and_uint32_train_alike(tmp_path):
    ids = np.random.default_rng(0).integers(0, 60, size=4000)
    write_tokens(tmp_path / "t16.bin", ids, np.uint16)
    write_tokens(tmp_path / "t32.bin", ids, np.uint32)
    base = {"model": {"preset": "tiny"}, "steps": 3, "batch_size": 2, "seq_len": 16, "device": "cpu"}
    _, a, _, _ = run_worker(dict(base, data={"path": str(tmp_path / "t16.bin")}), tmp_path)
    _, b, _, _ = run_worker(dict(base, data={"path": str(tmp_path / "t32.bin"), "token_dtype": "uint32"}), tmp_path)
    assert [s["loss"] for s in a] == [s["loss"] for s in b]


def test_activation_checkpointing_gives_the_losses_of_none(tmp_path):
    """spec.activation_checkpointing through the real worker on the CPU (fp32, eager set, LoRA with
    dropout): selective and full recompute what they drop with the same ops, the same values and the
    same dropout masks, so 4 steps of training report the losses and gradient norms of `none`."""
    base = {"model": {"preset": "tiny"}, "steps": 4, "batch_size": 4, "seq_len": 32, "optimizer": {"lr": 3e-3},
            "device": "cpu", "lora": {"rank": 4, "dropout": 0.1}, "kernels": {"lora": "eager"}}
    runs = run_modes(base, tmp_path, "activation_checkpointing", ("none", "selective", "full"))
    for mode in ("selective", "full"):
        for a, b in zip(runs["none"], runs[mode]):
            assert b["loss"] == pytest.approx(a["loss"], rel=1e-6), (mode, a["step"])
            assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-6), (mode, a["step"])
    code, _, result, _ = run_worker(dict(base, activation_checkpointing="some"), tmp_path, check=False)
    assert code == 2 and result["message"].startswith("spec.activation_checkpointing must be")


def test_full_checkpoint_layers_give_the_losses_of_none(tmp_path):
    """spec.full_checkpoint_layers on the CPU (fp32, eager set, LoRA with dropout, the tiny model's four
    layers): the first 1 or 3 layers rerun in backward and the others saving what `none` or `selective`
    saves, and every layer rerun (6 >= 4), report the losses and gradient norms of `none` over 4 steps."""
    base = {"model": {"preset": "tiny"}, "steps": 4, "batch_size": 4, "seq_len": 32, "optimizer": {"lr": 3e-3},
            "device": "cpu", "lora": {"rank": 4, "dropout": 0.1}, "kernels": {"lora": "eager"}}
    ref = run_modes(base, tmp_path, "activation_checkpointing", ("none",))["none"]
    for mode in ("none", "selective"):
        runs = run_modes(dict(base, activation_checkpointing=mode), tmp_path, "full_checkpoint_layers", (1, 3, 6))
        for n, steps in runs.items():
            assert len(steps) == len(ref) == 4
            for a, b in zip(ref, steps):
                assert b["loss"] == pytest.approx(a["loss"], rel=1e-6), (mode, n, a["step"])
                assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-6), (mode, n, a["step"])
    code, _, result, _ = run_worker(dict(base, activation_checkpointing="full", full_checkpoint_layers=1), tmp_path,
                                    check=False)
    assert code == 2 and result["message"].startswith("spec.full_checkpoint_layers applies with")


@pytest.mark.parametrize("case", ["plain", "accum2_fused_projections", "tied_full_checkpointing", "lora_accum2"])
def test_optimizer_overlap_is_bit_identical_without_clipping(tmp_path, case):
    """spec.optimizer.overlap (fp32, CPU, grad_clip 0): each layer's AdamW update inside backward
    gives bit for bit the losses, weights and optimizer state of the update after backward, with
    gradient accumulation (overlap on the last micro-batch), fused projections (q/k/v gradients
    sharing one buffer), tied embeddings (two uses, one accumulation) and full activation
    checkpointing (the layer's gradients come out of a recomputation), and LoRA adapters."""
    base = {"model": {"preset": "tiny"}, "steps": 5, "batch_size": 4, "seq_len": 32, "device": "cpu", "seed": 7,
            "data": {"shuffle": True, "seed": 3}, "optimizer": {"lr": 3e-3, "grad_clip": 0}}
    weights = "model.safetensors"
    if case == "accum2_fused_projections":
        base.update(grad_accum_steps=2, kernel_tuning={"fused_projections": True})
    elif case == "tied_full_checkpointing":
        make_hf_model("mha_tied_headdim", tmp_path / "m", seed=1)
        base.update(model={"weights_path": str(tmp_path / "m")}, activation_checkpointing="full")
    elif case == "lora_accum2":
        base.update(grad_accum_steps=2, lora={"rank": 4})
        weights = "adapter_model.safetensors"
    runs = {}
    for overlap in (False, True):
        ck = tmp_path / f"ck-{overlap}"
        spec = dict(base, checkpoint={"dir": str(ck)})
        spec["optimizer"] = dict(base["optimizer"], overlap=overlap)
        _, steps, result, _ = run_worker(spec, tmp_path)
        assert result["outcome"] == "SUCCEEDED", result
        runs[overlap] = (steps, ck / "step-00000005")
    (plain, plain_ck), (over, over_ck) = runs[False], runs[True]
    assert [s["loss"] for s in over] == [s["loss"] for s in plain]
    for a, b in zip(plain, over):  # the norm is summed group by group: equal to rounding
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-6)
    for f in (weights, "optimizer.safetensors"):
        assert (over_ck / f).read_bytes() == (plain_ck / f).read_bytes(), f


def test_optimizer_overlap_resumes_a_plain_run_and_needs_no_clipping(tmp_path):
    """A checkpoint written without overlap resumes with it (the state is the same) and continues with
    the uninterrupted run's losses; overlap with clipping on is refused, naming the fields."""
    base = {"model": {"preset": "tiny"}, "steps": 6, "batch_size": 4, "seq_len": 32, "device": "cpu", "seed": 7,
            "optimizer": {"lr": 3e-3, "grad_clip": 0}}
    _, full, _, _ = run_worker(base, tmp_path)
    ck = tmp_path / "ck"
    run_worker(dict(base, steps=3, checkpoint={"dir": str(ck)}), tmp_path)
    _, rest, result, err = run_worker(dict(base, checkpoint={"dir": str(ck)},
                                           optimizer=dict(base["optimizer"], overlap=True)), tmp_path)
    assert "resumed from " + str(ck / "step-00000003") in err and result["outcome"] == "SUCCEEDED"
    assert [s["loss"] for s in rest] == pytest.approx([s["loss"] for s in full[3:]], rel=1e-6, abs=0)
    code, _, result, _ = run_worker(dict(base, optimizer={"overlap": True}), tmp_path, check=False)
    assert code == 2 and result["message"].startswith("spec.optimizer.overlap needs optimizer.grad_clip 0")
