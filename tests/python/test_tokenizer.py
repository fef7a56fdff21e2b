"""The C++ tokenizer (worker/data/) against HF `tokenizers` from PyPI, through `ftd-worker tokenize`.

Tokenizers are trained here, offline, on seeded text (tokenizer_corpus.py): the LLaMA-3 layout, the
same with merges in the older "a b" spelling, GPT-2's layout, and a variant exercising the other
pre-tokenizer behaviours, a suffix template and added tokens with lstrip/rstrip/single_word.
12,000 seeded lines (mixed scripts, emoji, digits, whitespace runs, long words, special tokens,
invalid UTF-8) must encode to HF's ids on every line; invalid UTF-8 goes to HF as Python's
bytes.decode("utf-8", errors="replace") of the same bytes, the policy ours follows.
"""
import json
import os
import struct
import subprocess
import unicodedata
from pathlib import Path

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, pre_tokenizers, processors

import tokenizer_corpus as corpus

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("FTD_BUILD_DIR", ROOT / "build"))
WORKER = BUILD / "worker" / "ftd-worker"
N_LINES = 12000


def tokenize(directory, *args, input_bytes=None, check=True):
    r = subprocess.run([str(WORKER), "tokenize", "--tokenizer", str(directory), "--no-progress", *map(str, args)],
                       input=input_bytes, capture_output=True, timeout=300)
    if check and r.returncode != 0:
        raise AssertionError(f"ftd-worker tokenize {args} exited {r.returncode}: {r.stderr.decode()}")
    return r


def write_records(path, records):
    with open(path, "wb") as f:
        for r in records:
            f.write(struct.pack("<I", len(r)))
            f.write(r)
    return path


def parse_ids(stdout):
    return [[int(x) for x in line.split()] for line in stdout.decode().split("\n")[:-1]]


def first_difference(a, b):
    return next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))


def _byte_level_table():
    """GPT-2's bytes_to_unicode, which HF's ByteLevel pre-tokenizer shows pieces in."""
    printable = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
    rest = [b for b in range(256) if b not in printable]
    table = {b: chr(b) for b in printable}
    table.update({b: chr(256 + n) for n, b in enumerate(rest)})
    return table


BYTE_LEVEL = _byte_level_table()


def byte_level(piece_bytes):
    return "".join(BYTE_LEVEL[b] for b in piece_bytes)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizer")
    training = [line.decode("utf-8", "replace") for line in corpus.lines(seed=1, n=12000)]
    dirs = {"llama3": corpus.train_llama3(root / "llama3", training),
            "gpt2": corpus.train_gpt2(root / "gpt2", training)}

    # The LLaMA-3 file with merges spelled "a b", as Meta's tokenizer.json has them.
    spec = json.loads((dirs["llama3"] / "tokenizer.json").read_text())
    assert isinstance(spec["model"]["merges"][0], list)
    spec["model"]["merges"] = [f"{a} {b}" for a, b in spec["model"]["merges"]]
    legacy = root / "llama3_legacy_merges"
    legacy.mkdir()
    (legacy / "tokenizer.json").write_text(json.dumps(spec))
    (legacy / "tokenizer_config.json").write_text((dirs["llama3"] / "tokenizer_config.json").read_text())
    dirs["llama3_legacy_merges"] = legacy

    # A variant on the same vocabulary: other Split behaviours, invert, ByteLevel's prefix space and
    # regex, added tokens with lstrip/rstrip/single_word/normalized, and a template with a suffix.
    tok = Tokenizer.from_file(str(dirs["llama3"] / "tokenizer.json"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split("--", behavior="merged_with_next"),
        pre_tokenizers.Split(Regex(r"\p{N}+"), behavior="contiguous", invert=True),
        pre_tokenizers.Split(Regex(r"[.!?]"), behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"\x{3002}"), behavior="removed"),
        pre_tokenizers.Split(Regex(corpus.LLAMA3_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)])
    tok.add_tokens([AddedToken("model", single_word=True), AddedToken("ing", lstrip=True),
                    AddedToken("token", rstrip=True, normalized=False), AddedToken(" data", lstrip=True, rstrip=True),
                    AddedToken("\u3001", lstrip=True, rstrip=True, single_word=True),
                    AddedToken("learning rate", normalized=True)])
    bos, eos = "<|begin_of_text|>", "<|end_of_text|>"
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} $B", special_tokens=[(bos, tok.token_to_id(bos)),
                                                                            (eos, tok.token_to_id(eos))])
    variant = root / "variant"
    variant.mkdir()
    tok.save(str(variant / "tokenizer.json"))
    dirs["variant"] = variant

    lines = corpus.lines(seed=2, n=N_LINES)
    return {"root": root, "dirs": dirs, "lines": lines,
            "texts": [line.decode("utf-8", "replace") for line in lines],
            "records": write_records(root / "lines.bin", lines)}


def test_lines_cover_what_they_should(work):
    lines, texts = work["lines"], work["texts"]
    assert len(lines) >= 10000
    invalid = sum(1 for b in lines if b.decode("utf-8", "replace").encode() != b)
    special = sum(1 for t in texts if any(s in t for s in corpus.LLAMA3_SPECIALS[:12]))
    long_word = sum(1 for t in texts if any(len(w) >= 200 for w in t.split()))
    scripts = {name: sum(1 for t in texts if any(lo <= ord(c) <= hi for c in t)) for name, lo, hi in [
        ("CJK", 0x4E00, 0x9FFF), ("Arabic", 0x0600, 0x06FF), ("Devanagari", 0x0900, 0x097F),
        ("Cyrillic", 0x0400, 0x04FF), ("emoji", 0x1F300, 0x1FAFF)]}
    zwj = sum(1 for t in texts if "\u200d" in t)
    skin = sum(1 for t in texts if any(0x1F3FB <= ord(c) <= 0x1F3FF for c in t))
    digits = sum(1 for t in texts if any(c.isdigit() for c in t))
    newlines = sum(1 for t in texts if "\n" in t)
    tabs = sum(1 for t in texts if "\t" in t)
    runs = sum(1 for t in texts if "     " in t)
    for name, count in [("invalid UTF-8", invalid), ("special tokens", special), ("long words", long_word),
                        ("ZWJ sequences", zwj), ("skin tones", skin), ("digits", digits), ("newlines", newlines),
                        ("tabs", tabs), ("space runs", runs), *scripts.items()]:
        assert count >= 100, f"only {count} lines with {name}"


@pytest.mark.parametrize("name", ["llama3", "llama3_legacy_merges", "gpt2", "variant"])
def test_ids_equal_hf_on_every_line(work, name):
    directory = work["dirs"][name]
    hf = Tokenizer.from_file(str(directory / "tokenizer.json"))
    expected = [e.ids for e in hf.encode_batch(work["texts"])]
    r = tokenize(directory, "--input", work["records"], "--format", "records", "--threads", 2)
    ours = parse_ids(r.stdout)
    assert len(ours) == len(expected)
    bad = [i for i in range(len(expected)) if ours[i] != expected[i]]
    if bad:
        i = bad[0]
        k = first_difference(ours[i], expected[i])
        pytest.fail(f"{name}: {len(bad)} of {len(expected)} lines differ from HF tokenizers; first: line {i} "
                    f"{work['lines'][i][:200]!r}\n  HF   {expected[i][max(0, k - 3):k + 6]} "
                    f"{[hf.id_to_token(x) for x in expected[i][max(0, k - 3):k + 6]]}\n"
                    f"  ours {ours[i][max(0, k - 3):k + 6]} {[hf.id_to_token(x) for x in ours[i][max(0, k - 3):k + 6]]}")


def test_ignore_merges_and_bos_matter_on_these_lines(work):
    """The LLaMA-3 parity above depends on ignore_merges and the template: without them HF differs."""
    directory = work["dirs"]["llama3"]
    spec = json.loads((directory / "tokenizer.json").read_text())
    with_flag = Tokenizer.from_str(json.dumps(spec))
    spec["model"]["ignore_merges"] = False
    without = Tokenizer.from_str(json.dumps(spec))
    a = with_flag.encode_batch(work["texts"], add_special_tokens=False)
    b = without.encode_batch(work["texts"], add_special_tokens=False)
    assert sum(x.ids != y.ids for x, y in zip(a, b)) >= 10
    bos = with_flag.token_to_id("<|begin_of_text|>")
    assert bos == len(spec["model"]["vocab"])
    assert all(e.ids[:1] == [bos] for e in with_flag.encode_batch(work["texts"][:50]))


@pytest.mark.parametrize("name", ["llama3", "gpt2", "variant"])
def test_decode_equals_hf_and_round_trips(work, name):
    directory = work["dirs"][name]
    hf = Tokenizer.from_file(str(directory / "tokenizer.json"))
    texts = work["texts"]
    ids = [e.ids for e in hf.encode_batch(texts)]
    ids_text = "".join(" ".join(map(str, x)) + "\n" for x in ids).encode()
    for skip in (False, True):
        flags = ["--decode", "--json"] + (["--skip-special"] if skip else [])
        ours = [json.loads(x) for x in tokenize(directory, *flags, input_bytes=ids_text).stdout.decode().split("\n")[:-1]]
        expected = hf.decode_batch(ids, skip_special_tokens=skip)
        bad = [i for i in range(len(texts)) if ours[i] != expected[i]]
        assert not bad, f"{len(bad)} decodes differ (skip_special={skip}); line {bad[0]}: {ours[bad[0]]!r} vs {expected[bad[0]]!r}"

    # decode(encode(x)) == x: without the template's tokens, our ids decode to the text (invalid
    # UTF-8 to its replaced form).
    r = tokenize(directory, "--input", work["records"], "--format", "records", "--no-special")
    back = tokenize(directory, "--decode", "--json", input_bytes=r.stdout).stdout.decode().split("\n")[:-1]
    if name == "variant":  # ByteLevel's prefix space and the removed 。 do not round-trip, by design
        return
    bad = [i for i in range(len(texts)) if json.loads(back[i]) != texts[i]]
    assert not bad, f"{len(bad)} lines do not round-trip; line {bad[0]}: {work['lines'][bad[0]][:120]!r}"


def test_pretokenizer_matches_hf_on_every_code_point(work):
    """Every code point Unicode assigns (as of the Unicode version of PCRE2's tables), in contexts
    that exercise each branch of the patterns, pre-tokenizes into HF's pieces."""
    info = json.loads(tokenize(work["dirs"]["llama3"], "--info").stdout)
    if info["unicode"] != unicodedata.unidata_version:
        pytest.skip(f"PCRE2 has Unicode {info['unicode']}, Python {unicodedata.unidata_version}: the sweep needs "
                    f"both to agree on which code points are assigned")
    assigned = [c for c in range(0x110000)
                if not 0xD800 <= c < 0xE000 and unicodedata.category(chr(c)) not in ("Cn", "Co")]
    assigned += list(range(0xE000, 0xE100))  # a sample of private use
    records = []
    for i in range(0, len(assigned), 40):
        parts = []
        for c in assigned[i:i + 40]:
            ch = chr(c)
            parts.append(f"x{ch}y {ch}{ch} 7{ch}8 '{ch} \n{ch}\t {ch}  .{ch}\r\n")
        records.append("".join(parts))
    path = write_records(work["root"] / "sweep.bin", [r.encode() for r in records])
    for name in ("llama3", "gpt2"):
        hf = Tokenizer.from_file(str(work["dirs"][name] / "tokenizer.json")).pre_tokenizer
        ours = tokenize(work["dirs"][name], "--input", path, "--format", "records", "--pieces").stdout
        ours = [json.loads(x) for x in ours.decode().split("\n")[:-1]]
        assert len(ours) == len(records)
        for i, text in enumerate(records):
            expected = [p for p, _ in hf.pre_tokenize_str(text)]
            got = [byte_level(p.encode()) for p in ours[i]]
            if got != expected:
                k = first_difference(got, expected)
                pytest.fail(f"{name}: record {i} pieces differ at {k}: ours {got[k:k + 3]!r} HF {expected[k:k + 3]!r}")


def test_jsonl_field_and_token_file(work, tmp_path):
    directory = work["dirs"]["llama3"]
    hf = Tokenizer.from_file(str(directory / "tokenizer.json"))
    texts = work["texts"][:3000]
    rows = [json.dumps({"text": t, "id": i}) for i, t in enumerate(texts)]
    rows[10] = "{not json"
    rows[20] = json.dumps({"body": "x"})
    rows[30] = json.dumps({"text": 3})
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(rows) + "\n")
    r = tokenize(directory, "--input", data, "--format", "jsonl", "--field", "text", check=False)
    assert r.returncode == 1
    msg = r.stderr.decode()
    assert "3 bad lines" in msg and "line 11: not valid JSON" in msg and "line 21: no field \"text\"" in msg \
        and "line 31: field \"text\" is number, not a string" in msg, msg

    out = tmp_path / "train.bin"
    tokenize(directory, "--input", data, "--format", "jsonl", "--field", "text", "--skip-bad-lines",
             "--eos", "--output", out, "--threads", 3)
    import numpy as np
    got = np.fromfile(out, dtype="<u4").tolist()
    eos = hf.token_to_id("<|eot_id|>")
    expected = []
    for i, t in enumerate(texts):
        if i not in (10, 20, 30):
            expected += hf.encode(t).ids + [eos]
    assert got == expected


def test_threads_do_not_change_the_output(work):
    directory = work["dirs"]["llama3"]
    one = tokenize(directory, "--input", work["records"], "--format", "records", "--threads", 1).stdout
    many = tokenize(directory, "--input", work["records"], "--format", "records", "--threads", 5).stdout
    assert one == many


def test_info_and_errors(work, tmp_path):
    directory = work["dirs"]["llama3"]
    info = json.loads(tokenize(directory, "--info").stdout)
    hf = Tokenizer.from_file(str(directory / "tokenizer.json"))
    assert info["vocab_size"] == hf.get_vocab_size(with_added_tokens=True)
    assert info["bos_id"] == hf.token_to_id("<|begin_of_text|>") and info["eos_id"] == hf.token_to_id("<|eot_id|>")
    assert info["template_prefix"] == [info["bos_id"]] and info["template_suffix"] == []
    assert len(info["added_tokens"]) == 256

    r = tokenize(tmp_path / "nowhere", "--info", check=False)
    assert r.returncode == 2 and "nowhere/tokenizer.json" in r.stderr.decode()

    spec = json.loads((directory / "tokenizer.json").read_text())
    spec["normalizer"] = {"type": "NFKC"}
    bad = tmp_path / "nfkc"
    bad.mkdir()
    (bad / "tokenizer.json").write_text(json.dumps(spec))
    r = tokenize(bad, "--info", check=False)
    assert r.returncode == 2 and "normalizer NFKC is not supported" in r.stderr.decode()

    r = tokenize(directory, "--decode", input_bytes=f"1 2 {info['vocab_size'] + 5}\n".encode(), check=False)
    assert r.returncode == 1 and f"id {info['vocab_size'] + 5}" in r.stderr.decode()


@pytest.mark.parametrize("spelling", ["pairs", "strings"])
def test_duplicate_merges_later_wins_as_in_hf(work, tmp_path, spelling):
    """A tokenizer.json whose merges list names pairs twice: HF builds its merge map entry by entry,
    so a later duplicate wins with its later rank. Duplicates of early (high-priority) merges are
    appended at the end, which demotes them, and duplicates of late merges are put at the front,
    which changes nothing; our ids must equal HF's on every line, and HF's must differ from the
    file without duplicates (or the duplicates would prove nothing)."""
    directory = work["dirs"]["llama3"]
    spec = json.loads((directory / "tokenizer.json").read_text())
    merges = spec["model"]["merges"]
    assert len(merges) > 3000
    demoted = [list(m) for m in merges[:2000:7]]
    no_effect = [list(m) for m in merges[-200:]]
    spec["model"]["merges"] = no_effect + merges + demoted
    if spelling == "strings":
        spec["model"]["merges"] = [f"{a} {b}" for a, b in spec["model"]["merges"]]
    dup = tmp_path / "duplicates"
    dup.mkdir()
    (dup / "tokenizer.json").write_text(json.dumps(spec))
    (dup / "tokenizer_config.json").write_text((directory / "tokenizer_config.json").read_text())
    hf = Tokenizer.from_file(str(dup / "tokenizer.json"))
    texts = work["texts"][:4000]
    expected = [e.ids for e in hf.encode_batch(texts)]
    original = [e.ids for e in Tokenizer.from_file(str(directory / "tokenizer.json")).encode_batch(texts)]
    changed = sum(1 for a, b in zip(expected, original) if a != b)
    assert changed >= 1000, f"the duplicates changed only {changed} of {len(texts)} lines in HF"
    records = write_records(tmp_path / "lines.bin", work["lines"][:4000])
    ours = parse_ids(tokenize(dup, "--input", records, "--format", "records", "--threads", 2).stdout)
    bad = [i for i in range(len(expected)) if ours[i] != expected[i]]
    assert not bad, f"{len(bad)} of {len(expected)} lines differ from HF; first: line {bad[0]} {texts[bad[0]][:120]!r}"
