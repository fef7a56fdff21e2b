"""GPU tests (label `gpu`): the engine on CUDA in bf16 with LibTorch's fused AdamW."""
import pytest
import torch

from ftdtest import CONFIGS, make_hf_model, run_worker

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")


def test_bf16_training_on_gpu_learns_and_reports_memory(tmp_path):
    code, steps, result, _ = run_worker({"model": {"preset": "tiny"}, "steps": 60, "batch_size": 16, "seq_len": 64,
                                         "optimizer": {"lr": 3e-3}, "device": "cuda", "dtype": "bf16"}, tmp_path)
    assert result["outcome"] == "SUCCEEDED"
    assert steps[-1]["loss"] < steps[0]["loss"] - 1.5
    assert all(s["peak_mem_allocated_bytes"] > 0 and s["peak_mem_reserved_bytes"] >= s["peak_mem_allocated_bytes"]
               for s in steps)


@pytest.mark.parametrize("master", [False, True])
def test_gpu_first_step_loss_matches_transformers_bf16(tmp_path, master):
    import numpy as np
    from ftdtest import write_tokens
    import torch.nn.functional as F
    model = make_hf_model("gqa_llama3_untied", tmp_path / "m", seed=2)
    vocab, b, t = CONFIGS["gqa_llama3_untied"]["vocab_size"], 2, 64
    tokens = np.random.default_rng().integers(0, vocab, size=b * (t + 1) * 4)
    write_tokens(tmp_path / "tok.bin", tokens)
    _, ours, _, _ = run_worker({"model": {"weights_path": str(tmp_path / "m")}, "data": {"path": str(tmp_path / "tok.bin")},
                                "steps": 2, "batch_size": b, "seq_len": t, "device": "cuda", "dtype": "bf16",
                                "fp32_master_weights": master}, tmp_path)
    hf = model.to("cuda", torch.bfloat16)
    w = torch.from_numpy(tokens[: b * (t + 1)].astype(np.int64)).view(b, t + 1).cuda()
    with torch.no_grad():
        logits = hf(input_ids=w[:, :-1]).logits.float()
    ref = F.cross_entropy(logits.reshape(-1, vocab), w[:, 1:].reshape(-1)).item()
    assert abs(ours[0]["loss"] - ref) / ref < 2e-2
