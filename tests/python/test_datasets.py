"""JSONL datasets through the real ftd-worker: chat rendering against transformers'
apply_chat_template for the LLaMA-3 template, loss masks, our loss and gradients against HF
transformers with the same labels (fp32, CPU), packing (documents do not see each other), malformed
lines, the prepared-dataset cache, held-out loss and the vocabulary check.

The tokenizer is trained here, offline, in LLaMA-3's layout (tokenizer_corpus.train_llama3)."""
import json
import random
import re
import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import tokenizer_corpus as corpus
from ftdtest import BUILD, PARITY, WORKER, max_rel_err, run_worker

FTCTL = BUILD / "client" / "ftctl"

torch.set_num_threads(2)

LLAMA3_TEMPLATE = corpus.LLAMA3_TEMPLATE
# The same rendering with the assistant's part marked, so transformers returns its assistant mask.
LLAMA3_TEMPLATE_MASKED = (
    "{% for message in messages %}{% if loop.index0 == 0 %}{{ bos_token }}{% endif %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] | trim + '<|eot_id|>' }}"
    "{% endgeneration %}{% else %}{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}{% endfor %}")

ODD_TEXT = ["  leading spaces", "trailing newline\n\n", "\u3000ideographic space\u3000", "\u00a0nbsp\u2003",
            "tab\tinside", "emoji \U0001F600\U0001F680 ok", "digits 1234567 and 3.14159", "ελληνικά και русский",
            "code:\n    def f(x):\n        return x", "<|eot_id|> inside", "!!! punctuation first", "", " ", "\n",
            "line1\r\nline2", "混合 text 中文", "'s 've contractions", "\u0085next line\u0085"]


def rand_text(rng):
    words = ["the", "model", "learns", "chat", "tokens", "quick", "brown", "fox", "über", "naïve", "42", "x" * 30]
    if rng.random() < 0.35:
        return rng.choice(ODD_TEXT)
    return " ".join(rng.choice(words) for _ in range(rng.randint(1, 25)))


def chat_examples(seed, n):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        msgs = []
        if rng.random() < 0.4:
            msgs.append({"role": "system", "content": rand_text(rng)})
        for _ in range(rng.randint(1, 3)):
            msgs.append({"role": "user", "content": rand_text(rng)})
            msgs.append({"role": "assistant", "content": rand_text(rng)})
        out.append({"messages": msgs})
    return out


def write_jsonl(path, rows):
    # Every other line with raw UTF-8, the rest \u-escaped.
    path.write_text("".join(json.dumps(r, ensure_ascii=i % 2 == 0) + "\n" for i, r in enumerate(rows)),
                    encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("datasets")
    training = [line.decode("utf-8", "replace") for line in corpus.lines(seed=3, n=3000)]
    d = corpus.train_llama3(root / "tok", training, vocab_size=1500)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = LLAMA3_TEMPLATE
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


def hf_tokenizer(d):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(d))


def prepare(spec, tmp_path, check=True):
    path = tmp_path / f"prepare-{abs(hash(json.dumps(spec, sort_keys=True)))}.json"
    path.write_text(json.dumps(spec))
    p = subprocess.run([str(WORKER), "prepare", str(path), "--no-progress"], capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"ftd-worker prepare exited {p.returncode}: {p.stderr}")
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    return p, lines


def read_cache(d):
    ids = np.fromfile(f"{d}/ids.u32", dtype="<u4")
    loss = np.fromfile(f"{d}/loss.u8", dtype=np.uint8)
    docs = np.fromfile(f"{d}/docs.u64", dtype="<u8")
    return [(ids[a:b].tolist(), loss[a:b].tolist()) for a, b in zip(docs[:-1], docs[1:])]


def data_spec(path, fmt, tok, tmp_path, **extra):
    return {"path": str(path), "format": fmt, "tokenizer_path": str(tok), "cache_dir": str(tmp_path / "cache"), **extra}


def as_ids(x):
    if isinstance(x, dict) or hasattr(x, "keys"):
        x = x["input_ids"]
    return list(x)


def test_chat_rendering_equals_apply_chat_template(tok_dir, tmp_path):
    examples = chat_examples(1, 400)
    jsonl = write_jsonl(tmp_path / "chat.jsonl", examples)
    _, lines = prepare({"model": {"preset": "tiny"}, "data": data_spec(jsonl, "chat", tok_dir, tmp_path)}, tmp_path)
    docs = read_cache(lines[0]["cache"])
    assert len(docs) == len(examples)
    hf = hf_tokenizer(tok_dir)
    mismatches = 0
    for ex, (ids, loss) in zip(examples, docs):
        ref = as_ids(hf.apply_chat_template(ex["messages"], tokenize=True))
        mismatches += ref != ids
        assert ids == ref, (ex, hf.decode(ref), hf.decode(ids))
        masked = hf.apply_chat_template(ex["messages"], tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True, chat_template=LLAMA3_TEMPLATE_MASKED)
        assert as_ids(masked) == ids
        # The loss counts the assistant's content and its <|eot_id|>, nothing else.
        assert loss == list(masked["assistant_masks"]), (ex, loss, masked["assistant_masks"])
    assert mismatches == 0


def test_prompt_completion_tokens_and_mask(tok_dir, tmp_path):
    rng = random.Random(2)
    rows = [{"q": rand_text(rng) or "p", "a": rand_text(rng) or "c"} for _ in range(200)]
    jsonl = write_jsonl(tmp_path / "pc.jsonl", rows)
    spec = {"model": {"preset": "tiny"},
            "data": data_spec(jsonl, "prompt_completion", tok_dir, tmp_path, prompt_field="q", completion_field="a")}
    _, lines = prepare(spec, tmp_path)
    hf = hf_tokenizer(tok_dir)
    for r, (ids, loss) in zip(rows, read_cache(lines[0]["cache"])):
        p = hf(r["q"])["input_ids"]
        c = hf(r["a"], add_special_tokens=False)["input_ids"] + [hf.eos_token_id]
        assert ids == p + c
        assert loss == [0] * len(p) + [1] * len(c)


def tiny_model(out_dir, vocab, seed=7):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
                      max_position_embeddings=512, tie_word_embeddings=False, attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).float().eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    return model


def run_loader_parity(model_dir, data, seq_len, batch_size, tmp_path):
    req = tmp_path / f"loader-{abs(hash(json.dumps(data, sort_keys=True)))}-{seq_len}-{batch_size}.json"
    req.write_text(json.dumps({"data": data, "seq_len": seq_len, "batch_size": batch_size}))
    out = req.with_suffix(".safetensors")
    subprocess.run([str(PARITY), str(model_dir), str(req), str(out), "cpu", "fp32", "eager"], check=True)
    return {k: v.clone() for k, v in load_file(str(out)).items()}


def hf_labels(ids, mask):
    """HF's unshifted labels: the id where the loss counts it, else -100."""
    return [i if m else -100 for i, m in zip(ids, mask)]


def hf_loss_and_grads(model, docs):
    """Mean over every counted token of all documents, each run on its own (unpadded), and the
    gradients of that mean: what a packed or padded batch of the same documents must give."""
    model.zero_grad()
    total = sum(sum(1 for l in labels[1:] if l != -100) for _, labels in docs)
    loss_sum = 0
    for ids, labels in docs:
        x = torch.tensor([ids])
        logits = model(input_ids=x).logits.float()[0, :-1]
        y = torch.tensor(labels[1:])
        loss_sum = loss_sum + F.cross_entropy(logits, y, ignore_index=-100, reduction="sum")
    loss = loss_sum / total
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("fmt,sequence", [("chat", "pad"), ("prompt_completion", "pad"), ("chat", "pack"),
                                          ("prompt_completion", "pack")])
def test_loss_and_gradients_equal_transformers(tok_dir, tmp_path, fmt, sequence):
    hf = hf_tokenizer(tok_dir)
    model = tiny_model(tmp_path / "m", vocab=len(hf))
    rng = random.Random(5)
    if fmt == "chat":
        rows = chat_examples(9, 6)
        docs_ids = [as_ids(hf.apply_chat_template(r["messages"], tokenize=True)) for r in rows]
        masks = [list(hf.apply_chat_template(r["messages"], tokenize=True, return_dict=True,
                                             return_assistant_tokens_mask=True,
                                             chat_template=LLAMA3_TEMPLATE_MASKED)["assistant_masks"]) for r in rows]
    else:
        rows = [{"prompt": rand_text(rng) or "p", "completion": rand_text(rng) or "c"} for _ in range(6)]
        docs_ids, masks = [], []
        for r in rows:
            p = hf(r["prompt"])["input_ids"]
            c = hf(r["completion"], add_special_tokens=False)["input_ids"] + [hf.eos_token_id]
            docs_ids.append(p + c)
            masks.append([0] * len(p) + [1] * len(c))
    jsonl = write_jsonl(tmp_path / "d.jsonl", rows)
    longest = max(len(d) for d in docs_ids)
    data = data_spec(jsonl, fmt, tok_dir, tmp_path, sequence=sequence)
    if sequence == "pad":
        seq_len, batch = longest - 1, len(rows)   # every example whole, one per row
        expected = list(zip(docs_ids, masks))
    else:
        total = sum(len(d) for d in docs_ids)
        seq_len, batch = total - 1, 1             # every example packed in one row
        expected = list(zip(docs_ids, masks))
    ours = run_loader_parity(tmp_path / "m", data, seq_len, batch, tmp_path)
    # Our batch: the rows hold HF's ids, labels shifted from HF's mask.
    got_ids, got_labels = ours["input_ids"], ours["labels"]
    if sequence == "pad":
        for b, (ids, mask) in enumerate(expected):
            n = len(ids)
            assert got_ids[b, :n].tolist() == ids[:seq_len]  # the row's inputs: all but its last token
            assert got_labels[b, :n - 1].tolist() == hf_labels(ids, mask)[1:]
            assert (got_labels[b, n - 1:] == -100).all()
    else:
        flat = [i for ids, _ in expected for i in ids]
        labels = [l for ids, mask in expected for l in [-100] + hf_labels(ids, mask)[1:]]
        assert got_ids[0].tolist() == flat[:seq_len]
        assert got_labels[0].tolist() == labels[1:seq_len + 1]
        starts = np.cumsum([0] + [len(d) for d, _ in expected])[:-1]
        pos = ours["positions"][0].tolist()
        for s, (ids, _) in zip(starts, expected):
            assert pos[s:s + len(ids)][:seq_len - s] == list(range(len(ids)))[:seq_len - s]
    loss, grads = hf_loss_and_grads(model, [(ids, hf_labels(ids, m)) for ids, m in expected])
    assert abs(ours["loss"].item() - loss.item()) / loss.item() <= 1e-5
    for name, g in grads.items():
        assert max_rel_err(ours["grad." + name], g) <= 1e-5, name


def test_packed_document_logits_do_not_depend_on_its_neighbour(tok_dir, tmp_path):
    hf = hf_tokenizer(tok_dir)
    tiny_model(tmp_path / "m", vocab=len(hf))
    a, c = {"text": "the quick brown fox " * 3}, {"text": "über naïve 42 digits 1234 " * 2}
    b = {"text": "model learns chat tokens and more tokens"}
    logits_b = []
    for first in (a, c):
        jsonl = write_jsonl(tmp_path / f"pack-{len(logits_b)}.jsonl", [first, b])
        n_first = len(hf(first["text"])["input_ids"]) + 1
        n_b = len(hf(b["text"])["input_ids"]) + 1
        data = data_spec(jsonl, "text", tok_dir, tmp_path)
        out = run_loader_parity(tmp_path / "m", data, n_first + n_b - 1, 1, tmp_path)
        seg = out["segments"][0]
        assert seg[:n_first].eq(0).all() and seg[n_first:].eq(1).all()
        assert out["positions"][0, n_first:].tolist() == list(range(n_b - 1))
        logits_b.append(out["logits"][0, n_first:])
    # B alone, in a row of its own.
    jsonl = write_jsonl(tmp_path / "alone.jsonl", [b])
    alone = run_loader_parity(tmp_path / "m", data_spec(jsonl, "text", tok_dir, tmp_path, sequence="pad"), n_b - 1,
                              1, tmp_path)["logits"][0]
    assert max_rel_err(logits_b[0], logits_b[1]) <= 1e-5
    assert max_rel_err(logits_b[0], alone) <= 1e-5


def test_malformed_lines_refused_with_line_numbers_or_skipped(tok_dir, tmp_path):
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    lines = [json.dumps(good)] * 3 + [
        "{not json",                                                            # 4
        json.dumps({"messages": [{"role": "wizard", "content": "x"}]}),         # 5 unknown role
        json.dumps({"messages": [{"role": "user", "content": "only a user"}]}), # 6 no assistant
        json.dumps({"msgs": []}),                                               # 7 no field
        "",                                                                     # 8 blank
        json.dumps(good),
        json.dumps({"messages": [{"role": "user"}]}),                           # 10 no content
        json.dumps({"messages": "text"}),                                       # 11 not a list
    ]
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text("\n".join(lines) + "\n")
    spec = {"model": {"preset": "tiny"}, "data": data_spec(jsonl, "chat", tok_dir, tmp_path)}
    p, _ = prepare(spec, tmp_path, check=False)
    assert p.returncode == 2
    assert "7 bad lines in" in p.stderr
    for n in (4, 5, 6, 7, 8):
        assert f"line {n}:" in p.stderr
    assert "line 10:" not in p.stderr  # the first five only
    assert "unknown role \\\"wizard\\\"" in p.stderr or 'unknown role "wizard"' in p.stderr
    assert "on_bad_line" in p.stderr
    spec["data"]["on_bad_line"] = "skip"
    p, out = prepare(spec, tmp_path)
    assert out[0]["examples"] == 4 and out[0]["bad_lines"] == 7
    # prompt_completion: an empty completion is malformed.
    pc = tmp_path / "pc.jsonl"
    pc.write_text(json.dumps({"prompt": "a", "completion": ""}) + "\n" + json.dumps({"prompt": "a", "completion": "b"}) + "\n")
    p, _ = prepare({"model": {"preset": "tiny"}, "data": data_spec(pc, "prompt_completion", tok_dir, tmp_path)},
                   tmp_path, check=False)
    assert p.returncode == 2 and "line 1: field \"completion\" is empty" in p.stderr


def test_prepare_caches_and_jobs_reuse_it(tok_dir, tmp_path):
    jsonl = write_jsonl(tmp_path / "c.jsonl", chat_examples(3, 50))
    spec = {"model": {"preset": "tiny"}, "data": data_spec(jsonl, "chat", tok_dir, tmp_path)}
    _, first = prepare(spec, tmp_path)
    _, again = prepare(spec, tmp_path)
    assert not first[0]["reused"] and again[0]["reused"] and first[0]["cache"] == again[0]["cache"]
    spec["data"]["role_field"] = "r"  # other options, another entry
    p, _ = prepare(spec, tmp_path, check=False)
    assert p.returncode == 2  # every line lacks "r" now
    # A job on the same data and tokenizer finds the entry.
    hf = hf_tokenizer(tok_dir)
    tiny_model(tmp_path / "m", vocab=len(hf))
    job = {"model": {"weights_path": str(tmp_path / "m")},
           "data": {"path": str(jsonl), "format": "chat", "cache_dir": str(tmp_path / "cache"),
                    "tokenizer_path": str(tok_dir)},
           "steps": 1, "batch_size": 4, "seq_len": 128, "device": "cpu", "dtype": "fp32"}
    _, steps, result, err = run_worker(job, tmp_path)
    assert result["outcome"] == "SUCCEEDED"
    assert f"reused {first[0]['cache']}" in err
    assert 0 < steps[0]["loss_tokens"] < steps[0]["tokens"]


def test_ftctl_prepare_tokenizes_into_the_cache_that_jobs_use(tok_dir, tmp_path):
    """ftctl prepare runs ftd-worker prepare on the spec as ftctl reads it: YAML, relative paths
    resolved against the caller's directory, --set applied; bad data exits 2 naming the lines."""
    write_jsonl(tmp_path / "c.jsonl", chat_examples(5, 40))
    (tmp_path / "job.yaml").write_text(
        f"model: {{preset: tiny}}\ndata: {{path: c.jsonl, format: chat, tokenizer_path: {tok_dir}}}\n")
    run = lambda *a: subprocess.run([str(FTCTL), "prepare", *a], capture_output=True, text=True, timeout=300,
                                    cwd=tmp_path)
    p = run("job.yaml", "--set", f"data.cache_dir={json.dumps(str(tmp_path / 'cache'))}")
    assert p.returncode == 0, p.stderr
    [first] = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    assert first["path"] == str(tmp_path / "c.jsonl") and first["examples"] == 40 and not first["reused"]
    assert first["cache"].startswith(str(tmp_path / "cache"))
    # A job's own prepare (the worker's) finds the same entry.
    _, again = prepare({"model": {"preset": "tiny"}, "data": data_spec(tmp_path / "c.jsonl", "chat", tok_dir, tmp_path)},
                       tmp_path)
    assert again[0]["reused"] and again[0]["cache"] == first["cache"]
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    write_jsonl(tmp_path / "bad.jsonl", [good, good, {"messages": [{"role": "robot", "content": "x"}]}, good])
    p = run("job.yaml", "--set", 'data.path="bad.jsonl"', "--set", f"data.cache_dir={json.dumps(str(tmp_path / 'cache'))}")
    assert p.returncode == 2 and "robot" in p.stderr and "line 3:" in p.stderr, p.stderr
    p = run("missing.yaml")
    assert p.returncode == 64 and "missing.yaml" in p.stderr, p.stderr


def test_held_out_loss_in_steps_and_result(tok_dir, tmp_path):
    hf = hf_tokenizer(tok_dir)
    model = tiny_model(tmp_path / "m", vocab=len(hf))
    rng = random.Random(11)
    train = [{"prompt": rand_text(rng) or "p", "completion": rand_text(rng) or "c"} for _ in range(40)]
    held = [{"prompt": rand_text(rng) or "p", "completion": rand_text(rng) or "c"} for _ in range(5)]
    write_jsonl(tmp_path / "train.jsonl", train)
    write_jsonl(tmp_path / "eval.jsonl", held)
    seq = 48
    job = {"model": {"weights_path": str(tmp_path / "m")},
           "data": {"path": str(tmp_path / "train.jsonl"), "format": "prompt_completion", "sequence": "pad",
                    "eval_path": str(tmp_path / "eval.jsonl"), "eval_every_steps": 2,
                    "cache_dir": str(tmp_path / "cache"), "tokenizer_path": str(tok_dir)},
           "optimizer": {"lr": 1e-12, "weight_decay": 0.0}, "log_every": 10,
           "steps": 3, "batch_size": 2, "seq_len": seq, "device": "cpu", "dtype": "fp32"}
    _, steps, result, _ = run_worker(job, tmp_path)
    assert [s["step"] for s in steps] == [2, 3]  # eval steps are reported even off log_every
    assert all(s["eval_loss"] is not None for s in steps)
    assert result["final_eval_loss"] == steps[-1]["eval_loss"]
    # With lr 1e-12 the model is unchanged: the held-out loss is HF's mean masked loss over the
    # held-out examples, each truncated to seq_len + 1 tokens.
    docs = []
    for r in held:
        p = hf(r["prompt"])["input_ids"]
        c = hf(r["completion"], add_special_tokens=False)["input_ids"] + [hf.eos_token_id]
        ids, mask = (p + c)[:seq + 1], ([0] * len(p) + [1] * len(c))[:seq + 1]
        docs.append((ids, hf_labels(ids, mask)))
    ref, _ = hf_loss_and_grads(model, docs)
    assert abs(steps[-1]["eval_loss"] - ref.item()) / ref.item() <= 1e-5
    # A seeded fraction instead of a file: the same split on every run.
    job["data"].pop("eval_path")
    job["data"]["eval_fraction"] = 0.2
    _, s1, _, _ = run_worker(job, tmp_path)
    _, s2, _, _ = run_worker(job, tmp_path)
    assert s1[-1]["eval_loss"] == s2[-1]["eval_loss"]


def test_ids_outside_the_model_vocabulary_are_refused_before_training(tok_dir, tmp_path):
    tiny_model(tmp_path / "m", vocab=200)  # far smaller than the tokenizer
    write_jsonl(tmp_path / "t.jsonl", [{"text": "the quick brown fox"}] * 20)
    job = {"model": {"weights_path": str(tmp_path / "m")},
           "data": {"path": str(tmp_path / "t.jsonl"), "format": "text", "tokenizer_path": str(tok_dir),
                    "cache_dir": str(tmp_path / "cache")},
           "steps": 1, "batch_size": 1, "seq_len": 8, "device": "cpu", "dtype": "fp32"}
    code, steps, result, _ = run_worker(job, tmp_path, check=False)
    assert code == 2 and steps == []
    assert result["outcome"] == "INVALID_SPEC"
    # Run unconfined (no roots: the single-user default), the message names the id and where it is.
    m = re.search(r"not a valid token file for this model: token (\d+) \(in example (\d+)\) is id (\d+), "
                  r"outside the model's vocab_size 200 ", result["message"])
    assert m, result["message"]
    assert 1 <= int(m.group(2)) <= 20 and 200 <= int(m.group(3)) < len(hf_tokenizer(tok_dir))


def test_loss_is_the_mean_over_the_steps_counted_tokens_across_accumulation(tok_dir, tmp_path):
    """One step of 4 padded chat rows equals one step of 2 micro-batches of 2 rows: the loss is the
    mean over every counted label of the step (rows with few counted labels weigh less), not a mean
    of per-micro-batch means, so the first loss and the gradient norm agree."""
    hf = hf_tokenizer(tok_dir)
    tiny_model(tmp_path / "m", vocab=len(hf))
    jsonl = write_jsonl(tmp_path / "c.jsonl", chat_examples(17, 8))
    base = {"model": {"weights_path": str(tmp_path / "m")},
            "data": {"path": str(jsonl), "format": "chat", "sequence": "pad", "tokenizer_path": str(tok_dir),
                     "cache_dir": str(tmp_path / "cache")},
            "steps": 1, "seq_len": 96, "device": "cpu", "dtype": "fp32"}
    _, whole, _, _ = run_worker({**base, "batch_size": 4, "grad_accum_steps": 1}, tmp_path)
    _, accum, _, _ = run_worker({**base, "batch_size": 2, "grad_accum_steps": 2}, tmp_path)
    assert whole[0]["loss_tokens"] == accum[0]["loss_tokens"] > 0
    assert abs(whole[0]["loss"] - accum[0]["loss"]) / whole[0]["loss"] <= 1e-5
    assert abs(whole[0]["grad_norm"] - accum[0]["grad_norm"]) / whole[0]["grad_norm"] <= 1e-4


def test_an_unwritable_cache_costs_a_tokenization_not_the_job(tok_dir, tmp_path):
    hf = hf_tokenizer(tok_dir)
    tiny_model(tmp_path / "m", vocab=len(hf))
    jsonl = write_jsonl(tmp_path / "t.jsonl", [{"text": "the quick brown fox " * 4}] * 16)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory would be")
    job = {"model": {"weights_path": str(tmp_path / "m")},
           "data": {"path": str(jsonl), "format": "text", "tokenizer_path": str(tok_dir),
                    "cache_dir": str(blocker / "cache")},
           "steps": 1, "batch_size": 2, "seq_len": 16, "device": "cpu", "dtype": "fp32"}
    _, steps, result, err = run_worker(job, tmp_path)
    assert result["outcome"] == "SUCCEEDED" and len(steps) == 1
    assert "not cached: spec.data.cache_dir: create " in err
    p, _ = prepare(job, tmp_path, check=False)  # prepare exists to fill the cache: it fails
    assert p.returncode == 1 and "spec.data.cache_dir" in p.stderr
