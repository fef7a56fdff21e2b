"""GPU tests (label `gpu`) of packed JSONL rows on the fused kernel set in bf16: the fused RoPE with
per-document positions and SDPA with the block-diagonal mask give a packed document the logits it
has alone, and the loss of a packed chat batch is HF transformers' (fp32, run per document) within
bf16 error. A row whose second document kept the first one's positions, or saw it, is ~100% off."""

import pytest
import torch

from ftdtest import max_rel_err
from test_datasets import (LLAMA3_TEMPLATE_MASKED, as_ids, chat_examples, data_spec, hf_labels, hf_loss_and_grads,
                           hf_tokenizer, run_loader_parity, tiny_model, tok_dir, write_jsonl)  # noqa: F401 (fixture)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")


def parity(model_dir, data, seq_len, batch, tmp_path, kernel_set):
    import json
    import subprocess
    from safetensors.torch import load_file
    from ftdtest import PARITY
    req = tmp_path / f"gpu-{kernel_set}-{abs(hash(json.dumps(data, sort_keys=True)))}-{seq_len}.json"
    req.write_text(json.dumps({"data": data, "seq_len": seq_len, "batch_size": batch}))
    out = req.with_suffix(".safetensors")
    subprocess.run([str(PARITY), str(model_dir), str(req), str(out), "cuda", "bf16", kernel_set], check=True)
    return {k: v.clone() for k, v in load_file(str(out)).items()}


@pytest.mark.parametrize("kernel_set", ["fused", "eager"])
def test_packed_document_logits_equal_alone_on_gpu(tok_dir, tmp_path, kernel_set):
    hf = hf_tokenizer(tok_dir)
    tiny_model(tmp_path / "m", vocab=len(hf))
    first = {"text": "the quick brown fox jumps " * 4}
    b = {"text": "model learns chat tokens and more tokens than before"}
    n_first = len(hf(first["text"])["input_ids"]) + 1
    n_b = len(hf(b["text"])["input_ids"]) + 1
    packed = parity(tmp_path / "m", data_spec(write_jsonl(tmp_path / "p.jsonl", [first, b]), "text", tok_dir, tmp_path),
                    n_first + n_b - 1, 1, tmp_path, kernel_set)
    alone = parity(tmp_path / "m", data_spec(write_jsonl(tmp_path / "a.jsonl", [b]), "text", tok_dir, tmp_path,
                                             sequence="pad"), n_b - 1, 1, tmp_path, kernel_set)
    assert packed["positions"][0, n_first:].tolist() == list(range(n_b - 1))
    # bf16 through different attention kernels (masked vs causal): a few bf16 ulps of the logits.
    assert max_rel_err(packed["logits"][0, n_first:], alone["logits"][0]) <= 2e-2


def test_packed_chat_loss_matches_transformers_on_gpu(tok_dir, tmp_path):
    hf = hf_tokenizer(tok_dir)
    model = tiny_model(tmp_path / "m", vocab=len(hf))
    rows = chat_examples(21, 5)
    docs = []
    for r in rows:
        m = hf.apply_chat_template(r["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True,
                                   chat_template=LLAMA3_TEMPLATE_MASKED)
        docs.append((as_ids(m), hf_labels(as_ids(m), list(m["assistant_masks"]))))
    total = sum(len(d) for d, _ in docs)
    ours = parity(tmp_path / "m", data_spec(write_jsonl(tmp_path / "c.jsonl", rows), "chat", tok_dir, tmp_path),
                  total - 1, 1, tmp_path, "fused")
    ref, _ = hf_loss_and_grads(model, docs)
    assert abs(ours["loss"].item() - ref.item()) / ref.item() <= 1e-2
