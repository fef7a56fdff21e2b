"""What ftd refuses at submit (and `ftctl submit --dry-run` reports) because the job would fail
later, after its wait in the queue, or train something else than asked: rows longer than the
model's positions, a JSONL file given as a token file, malformed JSONL lines (all of a small file,
a bounded prefix of a large one, saying so), mistyped spec fields, and PEFT adapter settings ftd
does not implement. Each is also refused by `ftd-worker run` on its own. A real ftd, real ftctl,
real ftd-worker; specs and files as a user writes them."""
import json
import re

import pytest

from ftdservice import Daemon, ftctl
from ftdtest import CONFIGS, make_hf_model, run_worker


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("ftd"))
    yield d
    d.stop()


def dry_run(daemon, spec, tmp_path, *args):
    path = tmp_path / "job.json"
    path.write_text(json.dumps(spec))
    return ftctl(daemon, "submit", str(path), "--dry-run", *args)


def hf_config(tmp_path, name="mha_tied_headdim"):
    """A model directory from transformers (config.json and weights) and what its config says."""
    d = tmp_path / name
    if not d.exists():
        make_hf_model(name, d)
    return d, json.loads((d / "config.json").read_text())


def test_rows_longer_than_the_models_positions_are_refused(daemon, tmp_path):
    model, cfg = hf_config(tmp_path)
    positions = cfg["max_position_embeddings"]
    spec = {"model": {"config_path": str(model / "config.json")}, "device": "cpu", "batch_size": 1, "steps": 1}
    p = dry_run(daemon, dict(spec, seq_len=positions * 8), tmp_path)
    assert p.returncode == 3, (p.returncode, p.stdout, p.stderr)
    line = p.stderr.strip()
    assert "spec.seq_len" in line and f"max_position_embeddings {positions}" in line, line
    assert f"at most {positions}" in line, line  # the fix
    # At the limit it is valid.
    p = dry_run(daemon, dict(spec, seq_len=positions), tmp_path)
    assert p.returncode == 0 and p.stdout.startswith("valid"), p.stderr
    # ftd-worker on its own refuses it before building anything.
    rc, steps, result, err = run_worker(dict(spec, seq_len=positions + 1), tmp_path, check=False)
    assert rc == 2 and not steps and result["outcome"] == "INVALID_SPEC", (rc, err)
    assert "spec.seq_len" in result["message"] and str(positions) in result["message"], result


def test_a_jsonl_file_given_as_a_token_file_names_data_format(daemon, tmp_path):
    data = tmp_path / "chat.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"{i}+{i}?"}, {"role": "assistant", "content": str(2 * i)}]}
            for i in range(50)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = {"model": {"preset": "tiny"}, "device": "cpu", "batch_size": 1, "seq_len": 8, "steps": 1,
            "data": {"path": str(data)}}
    p = dry_run(daemon, spec, tmp_path)
    assert p.returncode == 3 and "spec.data.path" in p.stderr and "data.format" in p.stderr, p.stderr
    assert "JSON lines" in p.stderr, p.stderr
    rc, _, result, err = run_worker(spec, tmp_path, check=False)
    assert rc == 2 and "data.format" in result["message"], (rc, result, err)
    # A real token file of the same bytes' length is still a token file.
    tokens = tmp_path / "tokens.bin"
    tokens.write_bytes(bytes(range(14)) * 400)
    assert dry_run(daemon, dict(spec, data={"path": str(tokens)}), tmp_path).returncode == 0


def chat_spec(data, tok, **data_extra):
    return {"model": {"preset": "tiny"}, "device": "cpu", "batch_size": 1, "seq_len": 8, "steps": 1,
            "data": dict({"path": str(data), "format": "chat", "tokenizer_path": str(tok)}, **data_extra)}


def chat_line(i, role="assistant"):
    return json.dumps({"messages": [{"role": "user", "content": f"q{i}"}, {"role": role, "content": f"a{i}"}]})


def test_dry_run_checks_jsonl_lines(daemon, tmp_path):
    # The dry run reads lines only (no tokenizer needed): an empty directory stands for one.
    tok = tmp_path / "tok"
    tok.mkdir()
    data = tmp_path / "chat.jsonl"
    lines = [chat_line(i) for i in range(10)]
    lines[2] = "{not json"
    lines[6] = chat_line(6, role="wizard")
    data.write_text("\n".join(lines) + "\n")
    p = dry_run(daemon, chat_spec(data, tok), tmp_path)
    assert p.returncode == 3, (p.stdout, p.stderr)
    assert "2 bad lines" in p.stderr and "line 3" in p.stderr and "line 7" in p.stderr, p.stderr
    assert '"wizard"' in p.stderr and "data.on_bad_line" in p.stderr, p.stderr
    # With on_bad_line skip it is valid and says what it checked.
    p = dry_run(daemon, chat_spec(data, tok, on_bad_line="skip"), tmp_path)
    assert p.returncode == 0, p.stderr
    assert f"all {len(lines)} lines" in p.stdout and "8 example(s)" in p.stdout and "2 bad line(s)" in p.stdout, p.stdout
    # A file larger than what the dry run reads: a bad line past that is not seen, and it says so.
    big = tmp_path / "big.jsonl"
    good = chat_line(0) + "\n"
    count = (17 << 20) // len(good) + 1
    with open(big, "w") as f:
        f.write(good * count)
        f.write("{broken\n")
    p = dry_run(daemon, chat_spec(big, tok), tmp_path)
    assert p.returncode == 0, p.stderr
    m = re.search(r"checked the first (\d+) lines of \S+ \(([\d.]+ MiB) of ([\d.]+ MiB); the job checks the rest", p.stdout)
    assert m is not None, p.stdout
    assert 0 < int(m.group(1)) < count, m.group(0)


def test_mistyped_spec_fields_say_what_was_meant(daemon, tmp_path):
    # The names meant are docs/job-spec.md's.
    for args, meant in ((["--set", "lr=1e-4"], "optimizer.lr"), (["--set", "optimiser.lr=1e-4"], "optimizer"),
                        (["--set", "batchsize=4"], "batch_size")):
        p = ftctl(daemon, "submit", "--default", "--dry-run", *args)
        assert p.returncode == 64 and f'did you mean "{meant}"?' in p.stderr, (args, p.stderr)
    path = tmp_path / "typo.yaml"
    path.write_text("model: {preset: tiny}\nbatchsize: 4\n")
    p = ftctl(daemon, "submit", str(path), "--dry-run")
    assert p.returncode == 64 and 'spec.batchsize' in p.stderr and 'did you mean "batch_size"?' in p.stderr, p.stderr


def peft_adapter(tmp_path, name, base, **config):
    """An adapter PEFT made for `base` on o_proj, rank 3, lora_alpha 7, with `config` on top."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                           LoraConfig(r=3, lora_alpha=7, target_modules=["o_proj"], init_lora_weights=False, **config))
    out = tmp_path / name
    model.save_pretrained(out)
    return out


LORA = {"rank": 3, "alpha": 7, "target_modules": ["o"]}


@pytest.mark.parametrize("setting,config", [
    ("alpha_pattern", {"alpha_pattern": {"o_proj": 14}}),
    ("rank_pattern", {"rank_pattern": {"o_proj": 2}}),
    ("alora_invocation_tokens", None),
    ("use_dora", {"use_dora": True}),
])
def test_peft_adapter_settings_ftd_does_not_implement_are_refused_by_name(daemon, tmp_path, setting, config):
    base, cfg = hf_config(tmp_path)
    if config is None:  # written in the file, as PEFT writes it for an activated LoRA
        adapter = peft_adapter(tmp_path, "a", base)
        c = json.loads((adapter / "adapter_config.json").read_text())
        c[setting] = [cfg["vocab_size"] - 2, cfg["vocab_size"] - 1]
        (adapter / "adapter_config.json").write_text(json.dumps(c))
    else:
        adapter = peft_adapter(tmp_path, "a", base, **config)
    tokens = tmp_path / "tokens.bin"
    tokens.write_bytes(bytes([1, 0]) * 4000)
    spec = {"model": {"weights_path": str(base)}, "device": "cpu", "batch_size": 1, "seq_len": 8, "steps": 1,
            "data": {"path": str(tokens)}, "lora": dict(LORA, adapter_path=str(adapter))}
    p = dry_run(daemon, spec, tmp_path)
    assert p.returncode == 3 and "spec.lora.adapter_path" in p.stderr and f" {setting} " in p.stderr, p.stderr
    assert "does not implement" in p.stderr, p.stderr
    rc, steps, result, err = run_worker(spec, tmp_path, check=False)
    assert rc == 2 and not steps and setting in result["message"], (rc, result, err)


def test_a_plain_peft_adapter_passes(daemon, tmp_path):
    base, _ = hf_config(tmp_path)
    adapter = peft_adapter(tmp_path, "plain", base)
    tokens = tmp_path / "tokens.bin"
    tokens.write_bytes(bytes([1, 0]) * 4000)
    spec = {"model": {"weights_path": str(base)}, "device": "cpu", "batch_size": 1, "seq_len": 8, "steps": 1,
            "data": {"path": str(tokens)}, "lora": dict(LORA, adapter_path=str(adapter))}
    p = dry_run(daemon, spec, tmp_path)
    assert p.returncode == 0, p.stderr
    assert "is a LoRA adapter this spec trains" in p.stdout, p.stdout
    # The spec must describe the adapter: another rank is refused at submit, naming both.
    p = dry_run(daemon, dict(spec, lora=dict(LORA, rank=4, adapter_path=str(adapter))), tmp_path)
    assert p.returncode == 3 and "spec.lora.rank" in p.stderr, p.stderr
