"""Seeded text for the tokenizer tests and benchmark, and HF tokenizers trained on it offline.

`lines(seed, n)` gives adversarial byte lines: mixed scripts (Latin, CJK, Arabic, Devanagari,
Cyrillic, Greek, Hebrew, Thai, Hangul), emoji (ZWJ sequences, skin tones, flags, keycaps),
digits (runs, Unicode digits, numbers with separators), whitespace runs (tabs, newlines, CR,
Unicode spaces), punctuation and code, very long words, special tokens inside the text, control
characters, and invalid UTF-8. `prose(seed, n_bytes)` gives plainer multilingual text for
throughput. `train_*` build tokenizer directories in the LLaMA-3 and GPT-2 layouts.
"""
import json
import random
from pathlib import Path

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# LLaMA-3.1's special tokens, in id order after the BPE vocabulary (128000...).
LLAMA3_SPECIALS = (["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                    "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
                   + [f"<|reserved_special_token_{i}|>" for i in range(3, 248)])

# Meta's LLaMA-3 (8B-Instruct) chat template.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

SYLLABLES = ["ka", "to", "ri", "an", "the", "ing", "str", "ou", "el", "qu", "ph", "tion", "er", "mo", "ble", "x",
             "z", "ab", "sch", "ght", "ea", "oo", "ll", "ve"]
COMMON = ["the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not",
          "he", "I", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they", "you",
          "we", "can", "model", "training", "token", "data", "learning", "rate", "batch", "gradient"]
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'Re", "\u2019s", "'x", "'"]


def _chars(rng, lo, hi, n):
    return "".join(chr(rng.randint(lo, hi)) for _ in range(n))


def _latin(rng):
    w = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) if rng.random() < 0.6 else rng.choice(COMMON)
    r = rng.random()
    if r < 0.15:
        w = w.capitalize()
    elif r < 0.2:
        w = w.upper()
    elif r < 0.25:
        w = "".join(c.upper() if rng.random() < 0.5 else c for c in w)
    if rng.random() < 0.1:
        w += rng.choice(CONTRACTIONS)
    if rng.random() < 0.08:
        w = w[:1] + rng.choice("éüñßøçåœæÿ") + w[1:]
    if rng.random() < 0.03:
        w += "e\u0301"  # a combining acute
    return w


def _cjk(rng):
    kind = rng.random()
    if kind < 0.5:
        return _chars(rng, 0x4E00, 0x9FA5, rng.randint(1, 8))
    if kind < 0.65:
        return _chars(rng, 0x3041, 0x3096, rng.randint(1, 6)) + _chars(rng, 0x4E00, 0x9FA5, 1)
    if kind < 0.8:
        return _chars(rng, 0x30A1, 0x30FA, rng.randint(1, 6))
    if kind < 0.9:
        return _chars(rng, 0xAC00, 0xD7A3, rng.randint(1, 5))
    return rng.choice(["\u3001", "\u3002", "\u300c", "\u300d", "\uff01", "\uff1f", "\uff21\uff22\uff23",
                       "\uff11\uff12\uff13", "\u30fc"])


def _arabic(rng):
    w = _chars(rng, 0x0621, 0x064A, rng.randint(2, 7))
    if rng.random() < 0.3:  # harakat: combining marks
        w = "".join(c + (chr(rng.randint(0x064B, 0x0652)) if rng.random() < 0.4 else "") for c in w)
    if rng.random() < 0.1:
        w += rng.choice(["\u060c", "\u061f", _chars(rng, 0x0660, 0x0669, rng.randint(1, 5))])
    return w


def _devanagari(rng):
    out = ""
    for _ in range(rng.randint(1, 5)):
        out += chr(rng.randint(0x0915, 0x0939))
        r = rng.random()
        if r < 0.4:
            out += chr(rng.randint(0x093E, 0x094C))  # vowel signs (marks)
        elif r < 0.5:
            out += "\u094d"  # virama
    if rng.random() < 0.1:
        out += rng.choice(["\u0964", _chars(rng, 0x0966, 0x096F, rng.randint(1, 4))])
    return out


def _cyrillic(rng):
    w = _chars(rng, 0x0430, 0x044F, rng.randint(2, 9))
    return w.capitalize() if rng.random() < 0.2 else w


def _other_script(rng):
    return rng.choice([
        lambda: _chars(rng, 0x03B1, 0x03C9, rng.randint(2, 7)),  # Greek
        lambda: _chars(rng, 0x05D0, 0x05EA, rng.randint(2, 6)),  # Hebrew
        lambda: _chars(rng, 0x0E01, 0x0E2E, rng.randint(3, 10)),  # Thai
        lambda: _chars(rng, 0x0531, 0x0556, rng.randint(2, 6)),  # Armenian
        lambda: _chars(rng, 0x10D0, 0x10F0, rng.randint(2, 6)),  # Georgian
        lambda: "\u0130stanbul \u0131s\u0131k",  # Turkish dotted/dotless i
    ])()


def _emoji(rng):
    r = rng.random()
    if r < 0.3:
        return _chars(rng, 0x1F600, 0x1F64F, rng.randint(1, 3))
    if r < 0.45:  # skin tones
        return chr(rng.choice([0x1F44B, 0x1F44D, 0x1F64F, 0x270C, 0x1F9D1])) + chr(rng.randint(0x1F3FB, 0x1F3FF))
    if r < 0.6:  # ZWJ sequences
        return rng.choice(["\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466",
                           "\U0001F469\u200d\U0001F4BB", "\U0001F3F3\ufe0f\u200d\U0001F308",
                           "\U0001F9D1\U0001F3FD\u200d\U0001F91d\u200d\U0001F9D1\U0001F3FB",
                           "\u2764\ufe0f\u200d\U0001F525"])
    if r < 0.75:  # flags: regional indicator pairs
        return "".join(chr(rng.randint(0x1F1E6, 0x1F1FF)) for _ in range(2 * rng.randint(1, 2)))
    if r < 0.85:  # keycaps, variation selectors
        return rng.choice(["#\ufe0f\u20e3", "1\ufe0f\u20e3", "\u2600\ufe0f", "\u263a\ufe0e"])
    return _chars(rng, 0x1F300, 0x1F5FF, rng.randint(1, 4))


def _digits(rng):
    r = rng.random()
    if r < 0.35:
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 20)))
    if r < 0.5:
        return f"{rng.randint(0, 10**9):,}.{rng.randint(0, 99):02d}"
    if r < 0.6:
        return _latin(rng) + str(rng.randint(0, 10**6)) + _latin(rng)
    if r < 0.7:
        return rng.choice(["\u00b2", "\u00b3", "\u00bd", "\u2155", "\u216b", "\u2460", "\u0663\u0664",
                           "\u0967\u0968", "\uff15\uff16\uff17\uff18"])
    if r < 0.8:
        return f"{rng.randint(1, 12)}/{rng.randint(1, 28)}/{rng.randint(1900, 2100)}"
    return f"v{rng.randint(0, 9)}.{rng.randint(0, 99)}.{rng.randint(0, 999)}-rc{rng.randint(1, 9)}"


def _space(rng):
    r = rng.random()
    if r < 0.55:
        return " "
    if r < 0.65:
        return " " * rng.randint(2, 12)
    if r < 0.72:
        return rng.choice(["\t", "\t\t", " \t ", "\t "])
    if r < 0.82:
        return rng.choice(["\n", "\n\n", "\r\n", "\r", " \n", "\n  ", "  \n\t", "\n\n\n    "])
    if r < 0.9:
        return rng.choice(["\u00a0", "\u3000", "\u2009", "\u202f", "\u2028", "\u2029", "\u0085", "\u180e",
                           "\u200b", "\ufeff", "\u1680", "\u205f", "\x0b", "\x0c"])
    return ""


def _punct(rng):
    r = rng.random()
    if r < 0.4:
        return "".join(rng.choice("!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~'") for _ in range(rng.randint(1, 4)))
    if r < 0.6:
        return rng.choice(["...", "\u2014", "\u2013", "\u201c", "\u201d", "\u00ab", "\u00bb", "\u2026", "\u20ac",
                           "\u00a3", "\u00a5", "\u2211", "\u222b", "\u00a7", "\u00b6", "\u2022", "\u2192", "\u00a9"])
    return rng.choice(["def f(x):\n    return x ** 2\n", "if (a && b) { c++; }", "https://example.com/a?b=1&c=2",
                       "user.name+tag@example.org", '{"key": [1, 2.5, null]}', "<div class=\"x\">&amp;</div>",
                       "$ ls -la | grep '\\.py$'", "C:\\Users\\x\\file.txt", "#include <vector>", "a_b__c___d"])


def _long(rng):
    r = rng.random()
    n = rng.randint(200, 3000)
    if r < 0.3:
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n))
    if r < 0.45:
        return rng.choice(SYLLABLES) * (n // 3)
    if r < 0.6:
        return "".join(rng.choice("0123456789") for _ in range(n))
    if r < 0.7:
        return " " * n
    if r < 0.8:
        return rng.choice("-=*#!.") * n
    if r < 0.9:
        return _chars(rng, 0x4E00, 0x9FA5, n // 3)
    return "\n" * (n // 10)


def _special(rng, specials):
    r = rng.random()
    if r < 0.7:
        return rng.choice(specials[:12] if rng.random() < 0.8 else specials)
    return rng.choice(["<|eot_id|", "<|begin_of_text", "<|", "|>", "<|eot_id|><|eot_id|>", "<|endoftext|>",
                       "<|start_header_id|>user<|end_header_id|>\n\n", "<s>", "</s>"])


def _control(rng):
    return rng.choice(["\x00", "\x01", "\x07", "\x1b[0m", "\x7f", "\x80", "\x9f", "\u00ad", "\u200e", "\ufffd"])


def _invalid_bytes(rng):
    return rng.choice([b"\xff", b"\xfe\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xe2\x82", b"\xf0\x9f\x98",
                       b"\x80", b"\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xe0\x80\xaf",
                       b"\xc3", b"\xc3(", b"a\xe2\x28\xa1"])


GENERATORS = [(_latin, 30), (_cjk, 6), (_arabic, 4), (_devanagari, 4), (_cyrillic, 4), (_other_script, 3),
              (_emoji, 5), (_digits, 8), (_punct, 6), (_long, 0.4), (_control, 1)]


def lines(seed, n, specials=LLAMA3_SPECIALS, invalid_fraction=0.06):
    """n lines of bytes (newlines inside them too), deterministic for a seed."""
    rng = random.Random(seed)
    gens = [g for g, _ in GENERATORS]
    weights = [w for _, w in GENERATORS]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 30)):
            parts.append(rng.choices(gens, weights)[0](rng).encode())
            parts.append(_space(rng).encode())
            if rng.random() < 0.04:
                parts.append(_special(rng, specials).encode())
        line = b"".join(parts)
        if rng.random() < invalid_fraction:
            for _ in range(rng.randint(1, 3)):
                k = rng.randint(0, len(line))
                line = line[:k] + _invalid_bytes(rng) + line[k:]
        if rng.random() < 0.01:
            line = b""
        out.append(line)
    return out


def prose(seed, n_bytes):
    """Plainer multilingual text, one paragraph per line, for throughput: Zipf-distributed
    English-like words (some capitalised, some contractions), numbers, punctuation, and a few words
    of CJK, Cyrillic, Arabic and Devanagari."""
    import itertools
    rng = random.Random(seed)
    vocab = COMMON + ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(30000)]
    cum = list(itertools.accumulate(1.0 / (i + 1) for i in range(len(vocab))))
    others = [_digits, _cjk, _cyrillic, _arabic, _devanagari]
    punct = [",", ".", ";", ":", "!", "?", "(", ")", "\"", "-", "'"]
    out, size = [], 0
    while size < n_bytes:
        n = rng.randint(20, 150)
        words = rng.choices(vocab, cum_weights=cum, k=n)
        for i in range(n):
            r = rng.random()
            if r < 0.04:
                words[i] = rng.choice(others)(rng)
            elif r < 0.12:
                words[i] += rng.choice(punct)
            elif r < 0.17:
                words[i] = words[i].capitalize()
            elif r < 0.19:
                words[i] += rng.choice(CONTRACTIONS[:7])
        line = " ".join(words) + "\n"
        out.append(line)
        size += len(line.encode())
    return "".join(out)


def _save(tok, directory, config):
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return directory


def train_llama3(directory, training_text, vocab_size=4000):
    """A byte-level BPE tokenizer in LLaMA-3's layout: Split(LLaMA-3 pattern, Isolated) then
    ByteLevel(use_regex=False), ignore_merges, the 256 special tokens after the vocabulary, BOS by
    TemplateProcessing, the ByteLevel decoder."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(training_text, trainer)
    # Like LLaMA-3's vocabulary (converted from tiktoken), some entries are whole pieces that the
    # merges do not produce: frequent multi-token pieces, found only through ignore_merges.
    counts = {}
    for text in training_text[:3000]:
        for piece, _ in tok.pre_tokenizer.pre_tokenize_str(text):
            counts[piece] = counts.get(piece, 0) + 1
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    extra = [p for p, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
             if p not in vocab and len(tok.model.tokenize(p)) >= 2][:300]
    for piece in extra:
        vocab[piece] = len(vocab)
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.add_special_tokens(LLAMA3_SPECIALS)
    bos = "<|begin_of_text|>"
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                      special_tokens=[(bos, tok.token_to_id(bos))])])
    config = {"bos_token": bos, "eos_token": {"__type": "AddedToken", "content": "<|eot_id|>", "lstrip": False,
                                              "normalized": False, "rstrip": False, "single_word": False},
              "model_max_length": 131072, "tokenizer_class": "PreTrainedTokenizerFast"}
    d = _save(tok, directory, config)
    spec = json.loads((d / "tokenizer.json").read_text())
    assert spec["model"]["ignore_merges"] is True
    return d


def train_gpt2(directory, training_text, vocab_size=3000):
    """GPT-2's layout: ByteLevel(use_regex=True) alone, no ignore_merges, <|endoftext|> as id 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"])
    tok.train_from_iterator(training_text, trainer)
    return _save(tok, directory, {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"})
