#!/usr/bin/env python3
"""Mutation check: plants one plausible bug at a time in a scratch copy of the tree, builds it, and
runs the tests that must catch it. A mutant the tests let through is a missing test.

    .venv/bin/python scripts/mutants.py                # every mutant
    .venv/bin/python scripts/mutants.py --list         # what each one plants and which tests must fail
    .venv/bin/python scripts/mutants.py --only NAME    # one (repeatable)
    .venv/bin/python scripts/mutants.py --rotate 3     # 3 of them, a different 3 each day
    .venv/bin/python scripts/mutants.py --baseline     # first check the named tests pass unmutated

Each mutant is a one-line patch: a file, its exact line (indentation included; it must occur once)
and the line that replaces it. The copy is a detached git worktree beside the checkout
(`<parent>/.mutants-<checkout name>`, or $FTD_MUTANTS_DIR), synced with the checkout's working tree
(uncommitted and untracked files included) and configured like the checkout's own build (Ninja,
Release, ccache launchers, the same LibTorch and Python), so that ccache (base_dir above both) serves
the unchanged objects; each mutant rebuilds only the file it patched and what links it. With
$FTD_BUILD_LOCK set to a file, builds take that lock (flock), so that they queue behind other builds
on a shared machine. Exit status: 0 every mutant
caught, 1 one survived, 2 a mutant could not be tried (its line moved, the build failed, a test
name is wrong, or with --baseline a test fails unmutated).
"""
import argparse
import dataclasses
import datetime
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVICE_BINS = ["ftd", "ftctl", "ftd-fake-worker", "ftd-worker"]
PARITY = "tests/python/test_hf_parity.py::test_logits_and_gradients_match_transformers"
ADAMW = "tests/python/test_hf_parity.py::test_ten_adamw_steps_match_transformers"


@dataclasses.dataclass
class Mutant:
    name: str
    what: str      # the bug, in words
    file: str      # relative to the repository root
    old: str       # the exact line (without its newline)
    new: str       # what replaces it
    targets: list  # build targets the tests need
    tests: list    # ctest names, or pytest node ids (a path, "::")


MUTANTS = [
    Mutant("optimizer-decay-on-norms", "weight decay applied to norm weights too",
           "worker/engine/optimizer.cc",
           "    s.decay = p.dim() >= 2;",
           "    s.decay = true;",
           ["ftd-worker"], [ADAMW + "[mha_tied_headdim-1-0.0-cosine]"]),
    Mutant("optimizer-clip-scales-up", "gradient clipping also scales small gradients up to the limit",
           "worker/engine/optimizer.cc",
           "  auto coef = torch::clamp_max(max_norm / (norm + 1e-6), 1.0).to(grads.front().scalar_type());",
           "  auto coef = (max_norm / (norm + 1e-6)).to(grads.front().scalar_type());",
           ["ftd-worker"], [ADAMW + "[gqa_llama3_untied-1-1000.0-cosine]"]),
    Mutant("non-finite-step-applied", "a step whose loss is not finite still updates weights and moments",
           "worker/engine/trainer.cc",
           "    opt_->Step(lr, found_inf);",
           "    opt_->Step(lr, torch::zeros_like(found_inf));",
           ["ftd-worker"],
           ["tests/python/test_training.py::test_non_finite_loss_stops_the_run_without_applying_the_update"]),
    Mutant("rmsnorm-eps-hardcoded", "RMSNorm uses 1e-6 whatever the model's rms_norm_eps",
           "worker/engine/model.cc",
           "  return w * (xf * torch::rsqrt(var + eps)).to(x.scalar_type());",
           "  return w * (xf * torch::rsqrt(var + 1e-6)).to(x.scalar_type());",
           ["ftd-parity"], [PARITY + "[gqa_llama3_untied]"]),
    Mutant("rmsnorm-ref-eps-ignored", "the RMSNorm reference (which GPU kernels are checked against) drops eps",
           "kernels/rmsnorm_ref.cc",
           "    const double s = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);",
           "    const double s = 1.0 / std::sqrt(ss / static_cast<double>(n));",
           ["rmsnorm_ref_test"], ["rmsnorm_ref_test"]),
    Mutant("rope-llama3-no-low-freq-scaling", "llama3 RoPE scaling leaves the low frequencies unscaled",
           "worker/engine/model.cc",
           "  auto llama = torch::where(wavelen > low_freq_wavelen, inv_freq / r.factor, inv_freq);",
           "  auto llama = inv_freq;",
           ["ftd-parity"], [PARITY + "[gqa_llama3_untied]"]),
    Mutant("gqa-heads-tiled", "GQA maps query head h to key/value head h % kv_heads (tiled, not grouped)",
           "worker/engine/model.cc",
           "  auto v = qkv[2].view({B, T, c.num_key_value_heads, c.head_dim}).transpose(1, 2);",
           "  auto v = qkv[2].view({B, T, c.num_key_value_heads, c.head_dim}).transpose(1, 2); "
           "k = k.repeat({1, c.num_attention_heads / c.num_key_value_heads, 1, 1}); "
           "v = v.repeat({1, c.num_attention_heads / c.num_key_value_heads, 1, 1});",
           ["ftd-parity"], [PARITY + "[gqa_llama3_untied]"]),
    Mutant("loss-mask-ignored", "the eager loss ignores label 0 instead of -100, so masked labels reach the loss",
           "worker/engine/model.cc",
           "      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex).reduction(torch::kSum));",
           "      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(0).reduction(torch::kSum));",
           ["ftd-parity"], [PARITY + "[mha_tied_headdim]"]),
    Mutant("loss-mean-counts-masked", "the mean loss divides by every label, masked ones included",
           "worker/engine/model.cc",
           "  return LossSum(ids, labels, layout) / count;",
           "  return LossSum(ids, labels, layout) / static_cast<double>(labels.numel());",
           ["ftd-parity"], [PARITY + "[mqa_llama3_tied]"]),
    Mutant("checkpoint-dir-not-synced-before-rename", "a checkpoint is renamed into place before its directory is fsynced",
           "worker/engine/checkpoint.cc",
           "  if (auto s = FsyncDir(tmp.string()); !s.ok()) return s;",
           "  if (auto s = absl::OkStatus(); !s.ok()) return s;",
           ["ftd-worker", "ftd_fslog"], ["tests/python/test_durability.py::test_checkpoint_write_order"]),
    Mutant("checkpoint-resume-from-oldest", "resume picks the oldest complete checkpoint, not the newest",
           "worker/engine/checkpoint.cc",
           "    if (!best || *step > best->first) best = {*step, e.path()};",
           "    if (!best || *step < best->first) best = {*step, e.path()};",
           ["ftd-worker"], ["tests/python/test_checkpoints.py::test_resume_takes_the_newest_complete_checkpoint"]),
    Mutant("checkpoint-prune-newest", "keep_last prunes the newest checkpoints instead of the oldest",
           "worker/engine/checkpoint.cc",
           "  std::sort(others.begin(), others.end(), [](const auto& a, const auto& b) { return a.first > b.first; });",
           "  std::sort(others.begin(), others.end(), [](const auto& a, const auto& b) { return a.first < b.first; });",
           ["ftd-worker"], ["tests/python/test_checkpoints.py::test_keep_last_prunes_older_checkpoints"]),
    Mutant("dispatch-reversed", "the dispatcher walks the queue from its end (queue_position unchanged)",
           "server/job_queue.h",
           "    for (const auto& key : order_) {",
           "    for (auto it = order_.rbegin(); it != order_.rend(); ++it) { const auto& key = *it;",
           ["job_manager_test", *SERVICE_BINS],
           ["job_manager_test",
            "tests/python/test_service.py::test_jobs_start_by_priority_then_submission_order"]),
    Mutant("dispatch-newest-first", "among equal priorities the newest job is queued first",
           "server/job_queue.h",
           "  static Key KeyOf(const QueuedJob& j) { return {-static_cast<int64_t>(j.priority), j.seq}; }",
           "  static Key KeyOf(const QueuedJob& j) { return {-static_cast<int64_t>(j.priority), -j.seq}; }",
           ["job_queue_test", "job_manager_test"], ["job_queue_test", "job_manager_test"]),
    Mutant("retry-oom", "a GPU out-of-memory is retried like an infrastructure failure",
           "server/exit_classification.h",
           "    {Reason::kGpuOutOfMemory, \"GPU_OUT_OF_MEMORY\", ftd::v1::FAILED, Retry::kNever},",
           "    {Reason::kGpuOutOfMemory, \"GPU_OUT_OF_MEMORY\", ftd::v1::FAILED, Retry::kWhileAttemptsLeft},",
           ["job_manager_test"], ["job_manager_test"]),
    Mutant("retry-signal-as-worker-error", "a worker killed by a signal is classified as its own error (never retried)",
           "server/exit_classification.h",
           "    {Asked::kAny,           kAnyReport,                            Ended::kSignal,       "
           "Reason::kKilledBySignal},",
           "    {Asked::kAny,           kAnyReport,                            Ended::kSignal,       "
           "Reason::kWorkerError},",
           ["exit_classification_test", "job_manager_test"], ["exit_classification_test", "job_manager_test"]),
    Mutant("retry-one-attempt-too-many", "a job is retried after its last attempt",
           "server/job_manager_attempts.cc",
           "    if (info.retry == Retry::kWhileAttemptsLeft && job.attempt() < job.max_attempts()) {",
           "    if (info.retry == Retry::kWhileAttemptsLeft && job.attempt() <= job.max_attempts()) {",
           ["job_manager_test"], ["job_manager_test"]),
    Mutant("request-id-not-looked-up", "a retried request id is not looked up before inserting",
           "server/store_jobs.cc",
           "    if (rc == SQLITE_ROW) {",
           "    if (rc == SQLITE_ROW && false) {",
           ["store_test"], ["store_test"]),
    Mutant("request-id-dropped", "the daemon does not store the submit's request id",
           "server/job_manager_submit.cc",
           "  job.set_request_id(req.request_id());",
           "  job.set_request_id(\"\");",
           SERVICE_BINS, ["tests/python/test_service.py::test_request_id_makes_submit_idempotent"]),
]


def sh(cmd, cwd=None, env=None, timeout=None, check=True):
    p = subprocess.run(cmd, cwd=cwd, env=env, timeout=timeout, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({p.returncode}):\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    return p


def listed_files(tree):
    out = sh(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=tree).stdout
    return {f for f in out.split("\0") if f}


def cache_value(build, key):
    cache = Path(build) / "CMakeCache.txt"
    if cache.exists():
        m = re.search(rf"^{re.escape(key)}:[A-Z]+=(.*)$", cache.read_text(), re.M)
        if m:
            return m.group(1)
    return None


class Scratch:
    def __init__(self, path):
        self.path = Path(path)
        self.build = self.path / "build"

    def prepare(self):
        """Creates the worktree if needed and makes its files equal to the checkout's, writing only
        the files that differ (so that the build redoes only what changed)."""
        if not (self.path / ".git").exists():
            sh(["git", "worktree", "add", "--detach", str(self.path), "HEAD"], cwd=ROOT)
        src = {f for f in listed_files(ROOT) if (ROOT / f).is_file() and not (ROOT / f).is_symlink()}
        for f in sorted(listed_files(self.path) - src):
            p = self.path / f
            if p.is_file() and not p.is_symlink():
                p.unlink()
        for f in sorted(src):
            data = (ROOT / f).read_bytes()
            dst = self.path / f
            if not dst.is_file() or dst.read_bytes() != data:
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_bytes(data)
                os.chmod(dst, (ROOT / f).stat().st_mode & 0o777)
        for link in (".venv", ".devdeps"):  # the checkout's environment, shared
            if (ROOT / link).exists() and not (self.path / link).exists():
                (self.path / link).symlink_to((ROOT / link).resolve())
        if not (self.build / "CMakeCache.txt").exists():
            prefix = cache_value(ROOT / "build", "CMAKE_PREFIX_PATH")
            python = cache_value(ROOT / "build", "Python3_EXECUTABLE") or sys.executable
            if prefix is None:
                prefix = sh([python, "-c", "import torch; print(torch.utils.cmake_prefix_path)"]).stdout.strip()
            sh(["cmake", "-S", str(self.path), "-B", str(self.build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                "-DFTD_BUILD_BENCH=OFF", "-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache",
                "-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache", f"-DCMAKE_PREFIX_PATH={prefix}",
                f"-DPython3_EXECUTABLE={python}"])

    def ninja(self, targets):
        cmd = ["nice", "ninja", "-C", str(self.build), f"-j{os.cpu_count() or 2}", *targets]
        lock = os.environ.get("FTD_BUILD_LOCK", "")
        if lock:
            cmd = ["flock", lock, *cmd]
        return sh(cmd, check=False)

    def python(self):
        return cache_value(self.build, "Python3_EXECUTABLE") or sys.executable

    def run_tests(self, tests, timeout):
        """The named tests that failed (or timed out), all of them run. Raises when they could not
        run as named (no such ctest test, no such pytest node)."""
        ctests = [t for t in tests if "/" not in t and "::" not in t]
        pytests = [t for t in tests if t not in ctests]
        failed = []
        if ctests:
            regex = "^(" + "|".join(re.escape(t) for t in ctests) + ")$"
            try:
                p = sh(["ctest", "--test-dir", str(self.build), "-R", regex, "--no-tests=error",
                        "--output-on-failure", "--timeout", str(timeout)], check=False, timeout=timeout + 60)
            except subprocess.TimeoutExpired:
                return ctests  # ctest's own timeout should have fired first
            ran = re.search(r"tests passed, (\d+) tests? failed out of (\d+)", p.stdout)
            if ran is None or int(ran.group(2)) != len(ctests):
                raise RuntimeError(f"ctest did not run {ctests}:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
            failed += [t for t in ctests if re.search(rf"\d+ - {re.escape(t)} \(", p.stdout)]
        env = dict(os.environ, FTD_BUILD_DIR=str(self.build), PYTHONDONTWRITEBYTECODE="1")
        for node in pytests:
            try:
                p = sh([self.python(), "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", node],
                       cwd=self.path, env=env, check=False, timeout=timeout)
            except subprocess.TimeoutExpired:
                failed.append(node)
                continue
            if p.returncode == 1:
                failed.append(node)
            elif p.returncode != 0:
                raise RuntimeError(f"pytest could not run {node} (exit {p.returncode}):\n{p.stdout[-2000:]}")
        return failed


def patched(text, m):
    lines = text.split("\n")
    hits = [i for i, l in enumerate(lines) if l == m.old]
    if len(hits) != 1:
        raise RuntimeError(f"{m.name}: the line to mutate occurs {len(hits)} times in {m.file} "
                           f"(the code moved: update the mutant):\n  {m.old}")
    lines[hits[0]] = m.new
    return "\n".join(lines)


def try_mutant(scratch, m, timeout):
    """('CAUGHT' | 'SURVIVED', the tests that failed). The file is restored afterwards, with a new mtime, so that
    the next build recompiles it (a ccache hit)."""
    path = scratch.path / m.file
    original = path.read_text()
    mutated = patched(original, m)
    try:
        path.write_text(mutated)
        b = scratch.ninja(m.targets)
        if b.returncode != 0:
            raise RuntimeError(f"{m.name}: the mutant does not build:\n{b.stdout[-3000:]}{b.stderr[-2000:]}")
        failed = scratch.run_tests(m.tests, timeout)
    finally:
        path.write_text(original)
    return ("CAUGHT" if failed else "SURVIVED"), failed


def pick(args):
    chosen = MUTANTS
    if args.only:
        names = {m.name for m in MUTANTS}
        unknown = [n for n in args.only if n not in names]
        if unknown:
            sys.exit(f"unknown mutant(s) {unknown}; --list shows them")
        chosen = [m for m in MUTANTS if m.name in args.only]
    if args.rotate:
        n = min(args.rotate, len(chosen))
        start = (datetime.date.today().toordinal() * n) % len(chosen)
        chosen = [chosen[(start + i) % len(chosen)] for i in range(n)]
    return chosen


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--only", action="append", metavar="NAME", help="run this mutant (repeatable)")
    ap.add_argument("--rotate", type=int, metavar="N", help="run N mutants, a different N each day")
    ap.add_argument("--baseline", action="store_true", help="first check that the named tests pass unmutated")
    ap.add_argument("--scratch", default=os.environ.get("FTD_MUTANTS_DIR", str(ROOT.parent / f".mutants-{ROOT.name}")),
                    help="the scratch worktree (default: beside the checkout)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds allowed for one mutant's tests")
    ap.add_argument("--markdown", action="store_true", help="print the result table as Markdown")
    args = ap.parse_args()
    chosen = pick(args)
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.what}\n  {m.file}\n  - {m.old.strip()}\n  + {m.new.strip()}\n"
                  f"  must fail: {', '.join(m.tests)}")
        return 0

    scratch = Scratch(args.scratch)
    t0 = time.monotonic()
    scratch.prepare()
    try:  # every mutant's line must be where the list says, before spending time on builds
        for m in chosen:
            patched((scratch.path / m.file).read_text(), m)
    except RuntimeError as e:
        print(e)
        return 2
    targets = sorted({t for m in chosen for t in m.targets})
    b = scratch.ninja(targets)
    if b.returncode != 0:
        print(f"the unmutated tree does not build:\n{b.stdout[-3000:]}{b.stderr[-2000:]}")
        return 2
    print(f"scratch {scratch.path} synced and built in {time.monotonic() - t0:.0f} s", flush=True)
    if args.baseline:
        for m in chosen:
            failed = scratch.run_tests(m.tests, args.timeout)
            if failed:
                print(f"{m.name}: its tests fail without the mutant: {', '.join(failed)}")
                return 2
        print("baseline: every named test passes unmutated", flush=True)

    rows, status = [], 0
    for m in chosen:
        t = time.monotonic()
        failed = []
        try:
            verdict, failed = try_mutant(scratch, m, args.timeout)
            detail = "failed: " + ", ".join(failed) if failed else "every named test passed"
        except RuntimeError as e:
            verdict, detail = "ERROR", str(e)
            status = max(status, 2)
        secs = time.monotonic() - t
        if verdict == "SURVIVED":
            status = max(status, 1)
        rows.append((m, verdict, failed, secs))
        print(f"{verdict:8} {m.name} ({secs:.0f} s): {detail}", flush=True)

    print()
    if args.markdown:
        print("| mutant | planted bug | tests that must fail | result | seconds |\n|---|---|---|---|---|")
        for m, verdict, failed, secs in rows:
            tests = ", ".join(f"`{t.split('::')[-1]}`" + ("" if t in failed else " (passed)") for t in m.tests)
            print(f"| `{m.name}` | {m.what} (`{m.file}`) | {tests} | {verdict} | {secs:.0f} |")
    else:
        for m, verdict, failed, secs in rows:
            print(f"{verdict:8} {secs:6.0f} s  {m.name}")
    survived = [m.name for m, v, _, _ in rows if v == "SURVIVED"]
    print(f"{len(rows)} mutant(s): {sum(v == 'CAUGHT' for _, v, _, _ in rows)} caught, {len(survived)} survived"
          + (f" ({', '.join(survived)}: each is a missing test)" if survived else "")
          + f"; {time.monotonic() - t0:.0f} s in all")
    return status


if __name__ == "__main__":
    sys.exit(main())
