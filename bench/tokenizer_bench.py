"""Tokenizer throughput: ftd's C++ tokenizer (`ftd-worker tokenize`) against HF `tokenizers` from
PyPI on the same text, the same tokenizer.json, in the same command; per core (1 thread) and with N
threads. Checks that both give the same ids, then prints a markdown table (and --json).

  .venv/bin/python bench/tokenizer_bench.py [--worker build/worker/ftd-worker] [--threads 1,2]
      [--corpus prose,code] [--mb 32] [--tokenizer DIR] [--repeat 3] [--json out.json]

Corpora: `prose`, seeded synthetic multilingual text (tests/python/tokenizer_corpus.py); `code`, the
Python sources of the installed `transformers` package. Without --tokenizer, a 32,000-token BPE in
LLaMA-3's layout is trained on the prose first (offline). ftd's time is its encoding time (after
loading, with the input in memory: the --stats line); HF's is `Tokenizer.encode_batch_fast` (its
fastest batch call: no offsets) over the lines, with RAYON_NUM_THREADS set to the thread count. Both are reported as wall-clock MB/s and
as MB per CPU-second (process CPU time over the same span), which is the per-core rate and stays
meaningful on a machine that other work shares.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))
import tokenizer_corpus as corpus  # noqa: E402

HF_SCRIPT = r"""
import json, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
lines = open(sys.argv[2], encoding="utf-8").read().split("\n")
if lines and lines[-1] == "":
    lines.pop()
best = None
for _ in range(int(sys.argv[4])):
    t0, c0 = time.perf_counter(), time.process_time()
    enc = tok.encode_batch_fast(lines)
    run = {"seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0}
    best = run if best is None or run["seconds"] < best["seconds"] else best
ids = [i for e in enc for i in e.ids]
import numpy as np
np.asarray(ids, dtype="<u4").tofile(sys.argv[3])
best["tokens"] = len(ids)
print(json.dumps(best))
"""


def code_corpus(mb):
    import transformers
    text, size = [], 0
    for path in sorted(Path(transformers.__file__).parent.rglob("*.py")):
        t = path.read_text(encoding="utf-8", errors="replace")
        text.append(t)
        size += len(t.encode())
        if size >= mb * 1e6:
            break
    return "".join(text)


def run_ours(worker, tok_dir, path, threads, repeat, out_ids):
    best = None
    for _ in range(repeat):
        r = subprocess.run([str(worker), "tokenize", "--tokenizer", str(tok_dir), "--input", str(path),
                            "--format", "lines", "--threads", str(threads), "--no-progress", "--stats",
                            "--output", str(out_ids)], capture_output=True, check=True)
        stats = json.loads(r.stderr.decode().strip().splitlines()[-1])
        best = stats if best is None or stats["seconds"] < best["seconds"] else best
    return best


def run_hf(tok_dir, path, threads, repeat, out_ids):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true")
    r = subprocess.run([sys.executable, "-c", HF_SCRIPT, str(tok_dir / "tokenizer.json"), str(path), str(out_ids),
                        str(repeat)], capture_output=True, check=True, env=env)
    return json.loads(r.stdout.decode().strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", default=str(ROOT / "build" / "worker" / "ftd-worker"))
    ap.add_argument("--tokenizer", help="a model directory with tokenizer.json (default: train one)")
    ap.add_argument("--threads", default=f"1,{os.cpu_count()}")
    ap.add_argument("--corpus", default="prose,code")
    ap.add_argument("--mb", type=float, default=32, help="megabytes of text per corpus")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each; the fastest counts")
    ap.add_argument("--json")
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    load0 = f"{os.getloadavg()[0]:.1f}"

    with tempfile.TemporaryDirectory(prefix="ftd-tokbench-") as tmp:
        tmp = Path(tmp)
        texts = {}
        for name in args.corpus.split(","):
            texts[name] = corpus.prose(seed=0, n_bytes=int(args.mb * 1e6)) if name == "prose" else code_corpus(args.mb)
        if args.tokenizer:
            tok_dir = Path(args.tokenizer)
        else:
            t0 = time.time()
            train = corpus.prose(seed=1, n_bytes=8_000_000).split("\n")
            tok_dir = corpus.train_llama3(tmp / "tok", train, vocab_size=32000)
            print(f"trained a 32,000-token LLaMA-3-layout tokenizer in {time.time() - t0:.0f} s", file=sys.stderr)
        rows = []
        for name, text in texts.items():
            path = tmp / f"{name}.txt"
            path.write_text(text, encoding="utf-8")
            nbytes = path.stat().st_size
            for t in threads:
                ours = run_ours(args.worker, tok_dir, path, t, args.repeat, tmp / "ours.bin")
                hf = run_hf(tok_dir, path, t, args.repeat, tmp / "hf.bin")
                same = np.array_equal(np.fromfile(tmp / "ours.bin", dtype="<u4"), np.fromfile(tmp / "hf.bin", dtype="<u4"))
                if not same:
                    raise SystemExit(f"{name}: ftd's ids differ from HF tokenizers' ids")
                mb = nbytes / 1e6
                rows.append({"corpus": name, "bytes": nbytes, "tokens": ours["tokens"], "threads": t,
                             "ftd_mb_s": mb / ours["seconds"], "hf_mb_s": mb / hf["seconds"],
                             "ftd_mb_per_cpu_s": mb / ours["cpu_seconds"], "hf_mb_per_cpu_s": mb / hf["cpu_seconds"],
                             "ids_equal": same})
                print(f"{name} threads={t}: ftd {rows[-1]['ftd_mb_s']:.1f} MB/s, HF {rows[-1]['hf_mb_s']:.1f} MB/s",
                      file=sys.stderr)
    print(f"{os.cpu_count()} CPUs; load average before: {load0}; after: {os.getloadavg()[0]:.1f}")
    print("| corpus | MB | tokens | threads | ftd MB/s | HF MB/s | ftd / HF | ftd MB per CPU-s | HF MB per CPU-s | same ids |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['corpus']} | {r['bytes'] / 1e6:.1f} | {r['tokens']:,} | {r['threads']} | {r['ftd_mb_s']:.1f} | "
              f"{r['hf_mb_s']:.1f} | {r['ftd_mb_s'] / r['hf_mb_s']:.2f} | {r['ftd_mb_per_cpu_s']:.1f} | "
              f"{r['hf_mb_per_cpu_s']:.1f} | {'yes' if r['ids_equal'] else 'NO'} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
