"""A fine-tuned model is usable as it comes out: every full checkpoint and every merged LoRA model
is a complete HF model directory. transformers loads it with the base's config fields, AutoTokenizer
loads its tokenizer with a chat template, and greedy generation on a chat prompt stops at the
end-of-turn token. Through the real ftd-worker, on a tiny model that learns a few chat answers on
the CPU, with a LLaMA-3-layout tokenizer trained here (tokenizer_corpus.train_llama3)."""
import json
import shutil

import pytest
import torch
from safetensors import safe_open

import tokenizer_corpus as corpus
from ftdtest import run_worker

torch.set_num_threads(2)

QA = [("what is 2 plus 3?", "2 plus 3 is 5."), ("what is 9 plus 9?", "9 plus 9 is 18."),
      ("name a colour.", "blue, like the sky."), ("say hello.", "hello there, friend!")]
MAX_NEW = 40
# Fields of the base's config.json that transformers' own defaults would not give back.
BASE_EXTRA = {"pretraining_tp": 1, "attention_dropout": 0.0, "ftd_test_field": "kept as it was"}


def conversations():
    return [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in QA]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """The tokenizer (Meta's chat template in its tokenizer_config.json), an HF base model whose
    config.json names the tokenizer's BOS and EOS (not transformers' defaults 1 and 2) and whose
    generation_config.json is an instruct model's (stop at end of text, of a tool call, of a turn;
    sampling by default), and a chat fine-tune of it that learned the answers."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    root = tmp_path_factory.mktemp("model_dir")
    text = [line.decode("utf-8", "replace") for line in corpus.lines(seed=5, n=400)] + [q + " " + a for q, a in QA] * 20
    tok_dir = corpus.train_llama3(root / "tok", text, vocab_size=400)
    cfg = json.loads((tok_dir / "tokenizer_config.json").read_text())
    cfg["chat_template"] = corpus.LLAMA3_TEMPLATE
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    ids = {t: tok.convert_tokens_to_ids(t) for t in ("<|begin_of_text|>", "<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")}
    assert len(set(ids.values())) == 4 and min(ids.values()) > 2  # none is a transformers default

    base = root / "base"
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, bos_token_id=ids["<|begin_of_text|>"],
        eos_token_id=ids["<|end_of_text|>"], **BASE_EXTRA))
    model.save_pretrained(base)
    generation = {"bos_token_id": ids["<|begin_of_text|>"], "do_sample": True, "temperature": 0.6, "top_p": 0.9,
                  "eos_token_id": [ids["<|end_of_text|>"], ids["<|eom_id|>"], ids["<|eot_id|>"]]}
    (base / "generation_config.json").write_text(json.dumps(generation))
    for f in tok_dir.iterdir():
        shutil.copy(f, base / f.name)
    (root / "chat.jsonl").write_text("".join(json.dumps(c) + "\n" for c in conversations()) * 16)

    spec = {"model": {"weights_path": str(base)},
            "data": {"path": str(root / "chat.jsonl"), "format": "chat", "cache_dir": str(root / "cache"),
                     "shuffle": True, "sequence": "pad"},
            "optimizer": {"lr": 3e-3, "weight_decay": 0.0}, "schedule": {"kind": "cosine", "warmup_steps": 5},
            "steps": 120, "batch_size": 4, "seq_len": 64, "device": "cpu", "dtype": "fp32", "log_every": 40,
            "checkpoint": {"dir": str(root / "ck")}}
    _, steps, result, log = run_worker(spec, root)
    assert result["outcome"] == "SUCCEEDED", log
    return {"root": root, "tok_dir": tok_dir, "base": base, "ids": ids, "generation": generation,
            "checkpoint": root / "ck" / "step-00000120", "final_loss": steps[-1]["loss"]}


def check_model_dir(d, base_config, ids):
    """transformers loads `d` with the base's config fields; AutoTokenizer loads its tokenizer; greedy
    generation after each trained question gives the trained answer and stops at <|eot_id|>."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    cfg = json.loads((d / "config.json").read_text())
    for key, value in base_config.items():
        if key not in ("dtype", "torch_dtype", "transformers_version"):
            assert cfg.get(key) == value, (key, cfg.get(key), value)
    loaded = AutoConfig.from_pretrained(str(d))
    assert (loaded.bos_token_id, loaded.eos_token_id) == (base_config["bos_token_id"], base_config["eos_token_id"])

    tok = AutoTokenizer.from_pretrained(str(d))
    assert tok.convert_tokens_to_ids("<|eot_id|>") == ids["<|eot_id|>"] and tok.chat_template
    model = AutoModelForCausalLM.from_pretrained(str(d)).eval()
    for q, a in QA:
        prompt = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        inputs = tok(prompt, add_special_tokens=False, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False)
        new = out[0, inputs["input_ids"].shape[1]:].tolist()
        assert tok.decode(new) == a + "<|eot_id|>", (q, tok.decode(new))


def test_full_checkpoint_is_a_complete_hf_model_directory(work):
    d = work["checkpoint"]
    base_config = json.loads((work["base"] / "config.json").read_text())
    check_model_dir(d, base_config, work["ids"])
    # The base's generation_config.json as it was (greedy here only because generate was told so).
    assert json.loads((d / "generation_config.json").read_text()) == work["generation"]
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (d / name).read_bytes() == (work["base"] / name).read_bytes(), name
    manifest = json.loads((d / "MANIFEST.json").read_text())["files"]
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} <= set(manifest)
    # Loaders that read every *.safetensors of a directory unless an index names the weights' files
    # (vLLM's, SGLang's): the index names model.safetensors alone, and it holds every weight.
    index = json.loads((d / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {"model.safetensors"}
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        assert set(index["weight_map"]) == set(f.keys())
        assert index["metadata"]["total_size"] == sum(f.get_tensor(k).nbytes for k in f.keys())


def test_merged_lora_model_is_complete_with_a_derived_generation_config(work, tmp_path):
    """A LoRA fine-tune of the checkpoint above whose directory has no generation_config.json and no
    tokenizer, with the tokenizer elsewhere and without a chat template: merged/ gets a generation
    config that stops at the tokenizer's end-of-turn tokens, and the template chat rendering
    trained with, which renders conversations as Meta's LLaMA-3 template does."""
    from transformers import AutoTokenizer
    base = tmp_path / "base"
    base.mkdir()
    for name in ("model.safetensors", "config.json"):
        shutil.copy(work["checkpoint"] / name, base / name)
    base_config = json.loads((base / "config.json").read_text())
    tok_dir = tmp_path / "tok"
    shutil.copytree(work["tok_dir"], tok_dir)
    cfg = json.loads((tok_dir / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(cfg))
    spec = {"model": {"weights_path": str(base)},
            "data": {"path": str(work["root"] / "chat.jsonl"), "format": "chat", "tokenizer_path": str(tok_dir),
                     "cache_dir": str(tmp_path / "cache")},
            "optimizer": {"lr": 1e-4}, "steps": 3, "batch_size": 2, "seq_len": 32, "device": "cpu", "dtype": "fp32",
            "lora": {"rank": 4, "target_modules": ["q", "v"], "merge": True}, "checkpoint": {"dir": str(tmp_path / "ck")}}
    _, _, result, log = run_worker(spec, tmp_path)
    assert result["outcome"] == "SUCCEEDED", log
    merged = tmp_path / "ck" / "step-00000003" / "merged"
    check_model_dir(merged, base_config, work["ids"])
    ids = work["ids"]
    generation = json.loads((merged / "generation_config.json").read_text())
    assert generation["bos_token_id"] == ids["<|begin_of_text|>"]
    assert sorted(generation["eos_token_id"]) == sorted([ids["<|end_of_text|>"], ids["<|eot_id|>"], ids["<|eom_id|>"]])
    ours, meta = AutoTokenizer.from_pretrained(str(merged)), AutoTokenizer.from_pretrained(str(work["tok_dir"]))
    for c in conversations() + [{"messages": [{"role": "system", "content": " be brief "}] + conversations()[0]["messages"]}]:
        for prompt in (False, True):
            msgs = c["messages"][:-1] if prompt else c["messages"]
            assert ours.apply_chat_template(msgs, add_generation_prompt=prompt, tokenize=False) == \
                meta.apply_chat_template(msgs, add_generation_prompt=prompt, tokenize=False)
    manifest = json.loads((tmp_path / "ck" / "step-00000003" / "MANIFEST.json").read_text())["files"]
    assert {"merged/config.json", "merged/generation_config.json", "merged/tokenizer.json",
            "merged/tokenizer_config.json"} <= set(manifest)
