"""The command line the benchmarks share: the binaries they run (--worker or --build), where their
results go (--out: $OUT, else bench-out; created), the step counts and the batch x sequence shapes."""
import argparse
import os
from pathlib import Path


def parser(*, worker=False, build=False, build_default=None, build_help=None, **kwargs):
    """An ArgumentParser with --out and, as asked, --worker (required) or --build (required unless
    build_default is given)."""
    ap = argparse.ArgumentParser(**kwargs)
    if worker:
        ap.add_argument("--worker", required=True, help="the ftd-worker binary")
    if build:
        ap.add_argument("--build", required=build_default is None, default=build_default,
                        help=build_help or "the build directory with server/ftd, client/ftctl, worker/ftd-worker")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-out"), help="the results' folder ($OUT, else bench-out)")
    return ap


def add_steps(ap, steps, warmup):
    """--steps (per run) and --warmup (the first steps, left out of the figures)."""
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--warmup", type=int, default=warmup)


def out_dir(args):
    """args.out as a Path, created if missing."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def shapes(text):
    """'1x2048,4x2048' -> [(1, 2048), (4, 2048)]."""
    return [tuple(int(x) for x in s.split("x")) for s in text.split(",") if s]
