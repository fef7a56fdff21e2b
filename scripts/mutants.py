#!/usr/bin/env python3
"""Mutation check: plants one plausible bug at a time in a scratch copy of the tree, builds it, and
runs the tests that must catch it. A mutant the tests let through is a missing test.

    .venv/bin/python scripts/mutants.py                # every mutant
    .venv/bin/python scripts/mutants.py --list         # what each one plants and which tests must fail
    .venv/bin/python scripts/mutants.py --only NAME    # one (repeatable)
    .venv/bin/python scripts/mutants.py --rotate 3     # 3 of them, a different 3 each day
    .venv/bin/python scripts/mutants.py --baseline     # first check the named tests pass unmutated
    .venv/bin/python scripts/mutants.py --random 40 --seed 7 server/ spec/ client/ worker/data/
                                                       # 40 one-line mutants drawn at random from these

With --random, the mutants are not hand-written: every line of the named files (and of the C++
sources under named folders, tests excluded) is a candidate for a small set of one-line mutations
(a comparison or logical operator flipped, arithmetic inverted, a constant or a boolean changed,
a condition negated, a statement dropped, min and max swapped, break and continue swapped), and N
are drawn with the seed. Each is built incrementally (a mutant that does not compile is replaced by
another draw) and tried against the tests COVERAGE names for its file (the longest matching path
prefix): unit tests first, then pytest files, stopping at the first that fails. It prints CAUGHT
(by which test) or SURVIVED with the patch, then the caught ratio and every survivor.

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
import random
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
           "worker/engine/training/optimizer.cc",
           "    s.decay = p.dim() >= 2;",
           "    s.decay = true;",
           ["ftd-worker"], [ADAMW + "[mha_tied_headdim-1-0.0-cosine]"]),
    Mutant("optimizer-clip-scales-up", "gradient clipping also scales small gradients up to the limit",
           "worker/engine/training/optimizer.cc",
           "  auto coef = torch::clamp_max(max_norm / (norm + 1e-6), 1.0).to(grads.front().scalar_type());",
           "  auto coef = (max_norm / (norm + 1e-6)).to(grads.front().scalar_type());",
           ["ftd-worker"], [ADAMW + "[gqa_llama3_untied-1-1000.0-cosine]"]),
    Mutant("non-finite-step-applied", "a step whose loss is not finite still updates weights and moments",
           "worker/engine/training/trainer.cc",
           "    opt_->Step(lr, found_inf);",
           "    opt_->Step(lr, torch::zeros_like(found_inf));",
           ["ftd-worker"],
           ["tests/python/test_training.py::test_non_finite_loss_stops_the_run_without_applying_the_update"]),
    Mutant("rmsnorm-eps-hardcoded", "RMSNorm uses 1e-6 whatever the model's rms_norm_eps",
           "worker/engine/model/model.cc",
           "  return w * (xf * torch::rsqrt(var + eps)).to(x.scalar_type());",
           "  return w * (xf * torch::rsqrt(var + 1e-6)).to(x.scalar_type());",
           ["ftd-parity"], [PARITY + "[gqa_llama3_untied]"]),
    Mutant("rmsnorm-ref-eps-ignored", "the RMSNorm reference (which GPU kernels are checked against) drops eps",
           "kernels/rmsnorm_ref.cc",
           "    const double s = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);",
           "    const double s = 1.0 / std::sqrt(ss / static_cast<double>(n));",
           ["rmsnorm_ref_test"], ["rmsnorm_ref_test"]),
    Mutant("rope-llama3-no-low-freq-scaling", "llama3 RoPE scaling leaves the low frequencies unscaled",
           "worker/engine/model/model.cc",
           "  auto llama = torch::where(wavelen > low_freq_wavelen, inv_freq / r.factor, inv_freq);",
           "  auto llama = inv_freq;",
           ["ftd-parity"], [PARITY + "[gqa_llama3_untied]"]),
    Mutant("gqa-heads-tiled", "GQA maps query head h to key/value head h % kv_heads (tiled, not grouped)",
           "worker/engine/model/model.cc",
           "  auto v = qkv[2].view({B, T, c.num_key_value_heads, c.head_dim}).transpose(1, 2);",
           "  auto v = qkv[2].view({B, T, c.num_key_value_heads, c.head_dim}).transpose(1, 2); "
           "k = k.repeat({1, c.num_attention_heads / c.num_key_value_heads, 1, 1}); "
           "v = v.repeat({1, c.num_attention_heads / c.num_key_value_heads, 1, 1});",
           ["ftd-parity"], [PARITY + "[gqa_llama3_untied]"]),
    Mutant("loss-mask-ignored", "the eager loss ignores label 0 instead of -100, so masked labels reach the loss",
           "worker/engine/model/model.cc",
           "      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex).reduction(torch::kSum));",
           "      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(0).reduction(torch::kSum));",
           ["ftd-parity"], [PARITY + "[mha_tied_headdim]"]),
    Mutant("loss-mean-counts-masked", "the mean loss divides by every label, masked ones included",
           "worker/engine/model/model.cc",
           "  return LossSum(ids, labels, layout) / count;",
           "  return LossSum(ids, labels, layout) / static_cast<double>(labels.numel());",
           ["ftd-parity"], [PARITY + "[mqa_llama3_tied]"]),
    Mutant("checkpoint-dir-not-synced-before-rename", "a checkpoint is renamed into place before its directory is fsynced",
           "worker/engine/training/checkpoint.cc",
           "  if (auto s = FsyncDir(tmp.string()); !s.ok()) return s;",
           "  if (auto s = absl::OkStatus(); !s.ok()) return s;",
           ["ftd-worker", "ftd_fslog"], ["tests/python/test_durability.py::test_checkpoint_write_order"]),
    Mutant("checkpoint-resume-from-oldest", "resume picks the oldest complete checkpoint, not the newest",
           "worker/engine/training/checkpoint.cc",
           "    if (!best || *step > best->first) best = {*step, e.path()};",
           "    if (!best || *step < best->first) best = {*step, e.path()};",
           ["ftd-worker"], ["tests/python/test_checkpoints.py::test_resume_takes_the_newest_complete_checkpoint"]),
    Mutant("checkpoint-prune-newest", "keep_last prunes the newest checkpoints instead of the oldest",
           "worker/engine/training/checkpoint.cc",
           "  std::sort(others.begin(), others.end(), [](const auto& a, const auto& b) { return a.first > b.first; });",
           "  std::sort(others.begin(), others.end(), [](const auto& a, const auto& b) { return a.first < b.first; });",
           ["ftd-worker"], ["tests/python/test_checkpoints.py::test_keep_last_prunes_older_checkpoints"]),
    Mutant("dispatch-reversed", "the dispatcher walks the queue from its end (queue_position unchanged)",
           "server/policy/job_queue.h",
           "    for (const auto& key : order_) {",
           "    for (auto it = order_.rbegin(); it != order_.rend(); ++it) { const auto& key = *it;",
           ["job_manager_test", *SERVICE_BINS],
           ["job_manager_test",
            "tests/python/test_service.py::test_jobs_start_by_priority_then_submission_order"]),
    Mutant("dispatch-newest-first", "among equal priorities the newest job is queued first",
           "server/policy/job_queue.h",
           "  static Key KeyOf(const QueuedJob& j) { return {-static_cast<int64_t>(j.priority), j.seq}; }",
           "  static Key KeyOf(const QueuedJob& j) { return {-static_cast<int64_t>(j.priority), -j.seq}; }",
           ["job_queue_test", "job_manager_test"], ["job_queue_test", "job_manager_test"]),
    Mutant("retry-oom", "a GPU out-of-memory is retried like an infrastructure failure",
           "server/policy/exit_classification.h",
           "    {Reason::kGpuOutOfMemory, \"GPU_OUT_OF_MEMORY\", ftd::v1::FAILED, Retry::kNever},",
           "    {Reason::kGpuOutOfMemory, \"GPU_OUT_OF_MEMORY\", ftd::v1::FAILED, Retry::kWhileAttemptsLeft},",
           ["job_manager_test"], ["job_manager_test"]),
    Mutant("retry-signal-as-worker-error", "a worker killed by a signal is classified as its own error (never retried)",
           "server/policy/exit_classification.h",
           "    {Asked::kAny,           kAnyReport,                            Ended::kSignal,       "
           "Reason::kKilledBySignal},",
           "    {Asked::kAny,           kAnyReport,                            Ended::kSignal,       "
           "Reason::kWorkerError},",
           ["exit_classification_test", "job_manager_test"], ["exit_classification_test", "job_manager_test"]),
    Mutant("retry-one-attempt-too-many", "a job is retried after its last attempt",
           "server/jobs/job_manager_attempts.cc",
           "    if (info.retry == Retry::kWhileAttemptsLeft && job.attempt() < job.max_attempts()) {",
           "    if (info.retry == Retry::kWhileAttemptsLeft && job.attempt() <= job.max_attempts()) {",
           ["job_manager_test"], ["job_manager_test"]),
    Mutant("request-id-not-looked-up", "a retried request id is not looked up before inserting",
           "server/store/store_jobs.cc",
           "    if (rc == SQLITE_ROW) {",
           "    if (rc == SQLITE_ROW && false) {",
           ["store_test"], ["store_test"]),
    Mutant("request-id-dropped", "the daemon does not store the submit's request id",
           "server/jobs/job_manager_submit.cc",
           "  job.set_request_id(req.request_id());",
           "  job.set_request_id(\"\");",
           SERVICE_BINS, ["tests/python/test_service.py::test_request_id_makes_submit_idempotent"]),
]


# Random mutants (--random): the tests that cover each source, by path. The longest matching prefix
# (a file, or a folder ending in "/") wins. Each entry lists ctest names (unit tests, run first, in
# order) and pytest files or node ids (run after them); a mutant is CAUGHT by the first that fails.
# Keep the cheap tests first: most mutants are caught by a unit test and never reach the suites.
SERVER_JOBS = ["job_manager_test", "tests/python/test_sched.py", "tests/python/test_exit_codes.py",
               "tests/python/test_daemon_flags.py", "tests/python/test_service.py",
               "tests/python/test_lifecycle.py"]
SERVER_AUTH = ["auth_test", "call_limits_test", "offline_tokens_test", "tests/python/test_auth.py",
               "tests/python/test_limits.py"]
CLIENT = ["render_test", "context_test", "spec_input_test", "output_test", "cli_help_test",
          "tests/python/test_exit_codes.py", "tests/python/test_ftctl.py", "tests/python/test_lifecycle.py"]
TOKENIZER = ["tokenizer_test", "tests/python/test_tokenizer.py"]
COVERAGE = {
    "server/": SERVER_JOBS,
    "server/job_queue": ["job_queue_test", *SERVER_JOBS],
    "server/scheduling_policy": ["scheduling_policy_test", *SERVER_JOBS],
    "server/usage_ledger": ["usage_ledger_test", *SERVER_JOBS],
    "server/quotas": ["quotas_test", *SERVER_JOBS],
    "server/exit_classification": ["exit_classification_test", *SERVER_JOBS],
    "server/memory_fit": ["memory_fit_test", *SERVER_JOBS, "tests/python/test_limits.py"],
    "server/event_hub": ["event_hub_test", *SERVER_JOBS],
    "server/job_files": ["job_files_test", *SERVER_JOBS],
    "server/job_log": ["job_files_test", *SERVER_JOBS],
    "server/request_match": ["request_match_test", *SERVER_JOBS],
    "server/request_limits": ["request_limits_test", "tests/python/test_limits.py", *SERVER_JOBS],
    "server/store": ["store_test", "job_manager_test", "tests/python/test_store.py", "tests/python/test_service.py"],
    "server/filesystem_info": ["filesystem_info_test", "store_test", "tests/python/test_store.py"],
    "server/process_metrics": ["process_metrics_test", "tests/python/test_prometheus.py"],
    "server/metrics": ["job_manager_test", "tests/python/test_exit_codes.py", "tests/python/test_service.py",
                       "tests/python/test_prometheus.py"],
    "server/worker_launcher": ["worker_launcher_test", "tests/python/test_service.py", "tests/python/test_limits.py",
                               "tests/python/test_sandbox.py"],
    "server/worker_cgroups": ["worker_launcher_test", "tests/python/test_limits.py"],
    "server/supervisor": ["tests/python/test_service.py", "tests/python/test_exit_codes.py",
                          "tests/python/test_lifecycle.py"],
    "server/auth": SERVER_AUTH,
    "server/authz": SERVER_AUTH,
    "server/call_auth": SERVER_AUTH,
    "server/call_limits": SERVER_AUTH,
    "server/offline_tokens": SERVER_AUTH,
    "server/admin_service": SERVER_AUTH,
    "server/listen_config": SERVER_AUTH,
    "server/unix_listener": SERVER_AUTH,
    "server/parsed_service": ["parsed_service_test", "tests/python/test_limits.py", "tests/python/test_service.py"],
    "server/service": ["parsed_service_test", "tests/python/test_service.py", "tests/python/test_exit_codes.py",
                       "tests/python/test_auth.py", "tests/python/test_lifecycle.py"],
    "server/daemon_flags": ["tests/python/test_daemon_flags.py", "tests/python/test_sched.py",
                            "tests/python/test_service.py", "tests/python/test_auth.py"],
    "server/main": ["tests/python/test_daemon_flags.py", "tests/python/test_service.py", "tests/python/test_auth.py",
                    "tests/python/test_sched.py"],
    "server/data_dir": ["tests/python/test_sandbox.py", "tests/python/test_service.py"],
    "server/gpu_probe": ["tests/python/test_sched.py", "tests/python/test_service.py"],
    "spec/": ["train_config_test", "llama_config_test", "spec_test", "tests/python/test_ftctl.py"],
    "spec/spec": ["spec_test", "train_config_test", "tests/python/test_ftctl.py", "tests/python/test_service.py"],
    "spec/paths": ["paths_test", "tests/python/test_ftctl.py", "tests/python/test_sandbox.py"],
    "spec/sandbox": ["sandbox_test", "tests/python/test_sandbox.py"],
    "spec/duration": ["duration_test", "tests/python/test_lifecycle.py"],
    "spec/message_check": ["message_check_test", "request_limits_test", "tests/python/test_limits.py"],
    "spec/message_walk": ["message_check_test", "request_limits_test", "tests/python/test_limits.py"],
    "spec/lora_config": ["lora_config_test", "train_config_test", "tests/python/test_lora.py"],
    "spec/peak_memory": ["peak_memory_test", "memory_fit_test", "tests/python/test_sched.py",
                         "tests/python/test_limits.py"],
    "spec/input_files": ["input_files_test", "tests/python/test_service.py"],
    "spec/profile_table": ["tests/python/test_profile.py"],
    "spec/run_outcome": ["reports_test", "exit_classification_test", "tests/python/test_service.py"],
    "client/": CLIENT,
    "client/cmd_prepare": [*CLIENT, "tests/python/test_datasets.py"],
    "client/cmd_profile": [*CLIENT, "tests/python/test_profile.py"],
    "client/cmd_compare": [*CLIENT, "tests/python/test_profile.py"],
    "client/render_profile": ["render_test", "tests/python/test_profile.py"],
    "worker/data/": TOKENIZER,
    "worker/data/dataset": ["dataset_test", "dataset_cache_test", "tokenizer_test", "tests/python/test_datasets.py"],
    "worker/data/parallel_encode": ["dataset_test", *TOKENIZER],
    "worker/data/dataset_cache": ["dataset_cache_test", "tests/python/test_datasets.py"],
    "worker/data/confined_open": [*TOKENIZER, "dataset_cache_test", "tests/python/test_sandbox.py"],
    "worker/data/tokenize_cli": ["tests/python/test_tokenizer.py", "tests/python/test_datasets.py"],
}
# The binaries the pytest suites drive (ctest's pytest suites included).
PYTEST_TARGETS = SERVICE_BINS + ["ftd-parity"]


def coverage_of(path):
    """The tests COVERAGE names for a source path (relative to the root), or [] if none."""
    best = max((k for k in COVERAGE if path.startswith(k)), key=len, default=None)
    return list(COVERAGE[best]) if best else []


def targets_of(tests, unit_names):
    """Build targets for `tests`: a gtest's executable is its ctest name; anything else is a pytest
    suite, which drives the service binaries."""
    out = [t for t in tests if t in unit_names]
    if any(t not in unit_names for t in tests):
        out += PYTEST_TARGETS
    return out


@dataclasses.dataclass
class LineMutant:
    file: str
    line: int      # 0-based
    old: str
    new: str
    what: str      # the operator, in words

    @property
    def name(self):
        return f"{self.file}:{self.line + 1}"


# Headers are left out: a mutant in a header rebuilds every file that includes it, which on a 2-core
# machine is most of the project for spec/'s. Name a header explicitly to draw from it.
CPP_SUFFIXES = (".cc",)


def random_sources(paths):
    """The C++ sources named by `paths` (files, or folders searched recursively: .cc files), tests
    and test doubles excluded, relative to the root."""
    out = set()
    for p in paths:
        full = ROOT / p
        files = [full] if full.is_file() else sorted(full.rglob("*")) if full.is_dir() else []
        if not files:
            raise SystemExit(f"--random: {p} names no file or folder")
        for f in files:
            rel = str(f.relative_to(ROOT))
            if ((f.suffix in CPP_SUFFIXES or f == full) and not rel.endswith("_test.cc") and "/testing/" not in rel
                    and f.is_file()):
                out.add(rel)
    return sorted(out)


def _code_spans(line):
    """Index ranges of `line` outside string and char literals and before a // comment."""
    spans, start, i, quote = [], 0, 0, None
    while i < len(line):
        c = line[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote, start = None, i + 1
        elif c in "\"'":
            if c == "'" and i > 0 and line[i - 1].isalnum():  # a digit separator: 1'000
                i += 1
                continue
            spans.append((start, i))
            quote = c
        elif line.startswith("//", i):
            spans.append((start, i))
            return spans
        i += 1
    if quote is None:
        spans.append((start, len(line)))
    return spans


_OPERATORS = [  # (pattern, replacement, what); binary operators are spaced in this code base
    (r"(?<= )<=(?= )", "<", "<= to <"), (r"(?<= )<(?= )", "<=", "< to <="),
    (r"(?<= )>=(?= )", ">", ">= to >"), (r"(?<= )>(?= )", ">=", "> to >="),
    (r"(?<= )==(?= )", "!=", "== to !="), (r"(?<= )!=(?= )", "==", "!= to =="),
    (r"(?<= )&&(?= )", "||", "&& to ||"), (r"(?<= )\|\|(?= )", "&&", "|| to &&"),
    (r"(?<= )\+(?= )", "-", "+ to -"), (r"(?<= )-(?= )", "+", "- to +"),
    (r"(?<= )\*(?= )", "/", "* to /"), (r"(?<= )/(?= )", "*", "/ to *"),
    (r"(?<= )\+=(?= )", "-=", "+= to -="), (r"(?<= )-=(?= )", "+=", "-= to +="),
    (r"\btrue\b", "false", "true to false"), (r"\bfalse\b", "true", "false to true"),
    (r"\bstd::min\b", "std::max", "min to max"), (r"\bstd::max\b", "std::min", "max to min"),
    (r"\bbreak;", "continue;", "break to continue"), (r"\bcontinue;", "break;", "continue to break"),
    (r"\+\+", "--", "++ to --"),
    (r"(?<![\w.])0(?![\w.'])", "1", "0 to 1"), (r"(?<![\w.])1(?![\w.'])", "0", "1 to 0"),
    (r"(?<![\w.'])([2-9]|[1-9][0-9']+)(?![\w.'])", None, "a constant + 1"),
]


def line_mutants(rel, lines):
    """Every one-line mutant of a file's lines."""
    out = []
    for i, line in enumerate(lines):
        s = line.strip()
        if not s or s.startswith(("//", "#", "*", "/*")) or s in ("{", "}", "};", "});", "})", "public:", "private:",
                                                                    "protected:", "default:", "else {", "} else {"):
            continue
        spans = _code_spans(line)
        inside = lambda a, b: any(x <= a and b <= y for x, y in spans)
        for pattern, repl, what in _OPERATORS:
            for m in re.finditer(pattern, line):
                if not inside(m.start(), m.end()):
                    continue
                r = repl if repl is not None else str(int(m.group(0).replace("'", "")) + 1)
                out.append(LineMutant(rel, i, line, line[:m.start()] + r + line[m.end():], what))
        # A condition negated.
        for m in re.finditer(r"\b(if|while) \(", line):
            if not inside(m.start(), m.end()):
                continue
            depth, j = 1, m.end()
            while j < len(line) and depth:
                depth += {"(": 1, ")": -1}.get(line[j], 0) if inside(j, j + 1) else 0
                j += 1
            if depth == 0:
                cond = line[m.end():j - 1]
                out.append(LineMutant(rel, i, line, line[:m.end()] + f"!({cond})" + line[j - 1:],
                                      f"{m.group(1)} condition negated"))
        # A statement dropped: a call or an assignment on a line of its own.
        if (s.endswith(";") and not s.startswith(("return", "case ", "using ", "namespace", "struct ", "class ",
                                                    "template", "const ", "static ", "constexpr", "typedef"))
                and re.match(r"^[\w:.\->\[\]()*&]+(\(|\s*[-+*/|&]?=\s)", s) and line.count("(") == line.count(")")):
            indent = line[:len(line) - len(line.lstrip())]
            out.append(LineMutant(rel, i, line, indent + ";  // (statement dropped)", "statement dropped"))
    return out


def draw(paths, seed):
    """All candidates from the sources under `paths`, in a seeded random order."""
    cands = []
    for rel in random_sources(paths):
        cands += line_mutants(rel, (ROOT / rel).read_text().split("\n"))
    rng = random.Random(seed)
    rng.shuffle(cands)
    return cands


def try_line_mutant(scratch, m, tests, unit_names, timeout, jobs):
    """('CAUGHT', test) | ('SURVIVED', None) | ('NOT VIABLE', why). The tests run in order, up to the
    first that fails. The file is restored afterwards."""
    path = scratch.path / m.file
    original = path.read_text()
    lines = original.split("\n")
    if lines[m.line] != m.old:
        raise RuntimeError(f"{m.name}: the scratch copy differs from the checkout")
    lines[m.line] = m.new
    try:
        path.write_text("\n".join(lines))
        b = scratch.ninja(targets_of(tests, unit_names), jobs)
        if b.returncode != 0:
            return "NOT VIABLE", "does not build"
        for t in tests:
            if scratch.run_tests([t], timeout):
                return "CAUGHT", t
        return "SURVIVED", None
    finally:
        path.write_text(original)


def ctest_names(build):
    """(every ctest name, the ones that are gtest executables: those ftd_test registers)."""
    p = sh(["ctest", "--test-dir", str(build), "--show-only=json-v1"], check=False)
    names, units = set(), set()
    if p.returncode == 0:
        import json
        for t in json.loads(p.stdout).get("tests", []):
            names.add(t["name"])
            cmd = t.get("command") or []
            # A gtest's command is its executable (none listed before it is built); a pytest
            # suite's is Python.
            if not cmd or Path(cmd[0]).name == t["name"]:
                units.add(t["name"])
    return names, units


def available_tests(tests, tree, names, without):
    """`tests` less those this tree does not have (a ctest name it does not register, a pytest file
    it lacks) and those named by --without."""
    out = []
    for t in tests:
        if t in without or t.split("::")[0] in without:
            continue
        if ("/" in t or "::" in t) and (Path(tree) / t.split("::")[0]).is_file():
            out.append(t)
        elif t in names:
            out.append(t)
    return out


def run_random(args):
    cands = draw(args.paths, args.seed)
    if args.list:
        for m in cands[:args.random]:
            print(f"{m.name} ({m.what})\n  - {m.old.strip()}\n  + {m.new.strip()}\n"
                  f"  tests: {', '.join(coverage_of(m.file)) or '(none)'}")
        return 0
    scratch = Scratch(args.scratch)
    t0 = time.monotonic()
    scratch.prepare()
    without = set(args.without or [])
    b = scratch.ninja(["build.ninja"], args.jobs)  # (re)configures, so that ctest knows every test
    names, units = ctest_names(scratch.build)
    tests_of = lambda f: available_tests(coverage_of(f), scratch.path, names, without)
    needed = sorted({t for m in cands[:10 * args.random] for t in targets_of(tests_of(m.file), units)})
    b = scratch.ninja(needed or PYTEST_TARGETS, max(2, args.jobs))  # the first build: mostly ccache hits
    if b.returncode != 0:
        print(f"the unmutated tree does not build:\n{b.stdout[-3000:]}{b.stderr[-2000:]}")
        return 2
    print(f"scratch {scratch.path} synced and built in {time.monotonic() - t0:.0f} s; "
          f"{len(cands)} candidate mutants in {len(random_sources(args.paths))} files, seed {args.seed}", flush=True)
    rows, tried, not_viable, baseline = [], 0, 0, {}
    for m in cands:
        if len(rows) >= args.random:
            break
        tests = tests_of(m.file)
        if not tests:
            continue
        t = time.monotonic()
        tried += 1
        verdict, detail = try_line_mutant(scratch, m, tests, units, args.timeout, args.jobs)
        if verdict == "NOT VIABLE":
            not_viable += 1
            continue
        if verdict == "CAUGHT" and detail not in baseline:
            # The first time a test catches a mutant, it must pass on the unmutated tree (or every
            # mutant it "catches" says nothing).
            scratch.ninja(targets_of([detail], units), args.jobs)
            baseline[detail] = not scratch.run_tests([detail], args.timeout)
            print(f"    baseline: {detail} {'passes' if baseline[detail] else 'FAILS'} unmutated", flush=True)
            if not baseline[detail]:
                print(f"{detail} fails without a mutant: fix it (or leave it out with --without) and run again")
                return 2
        secs = time.monotonic() - t
        rows.append((m, verdict, detail, secs))
        print(f"{len(rows):3} {verdict:8} {m.name} ({m.what}; {secs:.0f} s){': ' + detail if detail else ''}\n"
              f"      - {m.old.strip()}\n      + {m.new.strip()}", flush=True)
    caught = sum(v == "CAUGHT" for _, v, _, _ in rows)
    survivors = [(m, s) for m, v, _, s in rows if v == "SURVIVED"]
    print(f"\n{len(rows)} mutant(s) (seed {args.seed}; {not_viable} drawn that did not build were replaced): "
          f"{caught} caught, {len(survivors)} survived: {100.0 * caught / max(1, len(rows)):.1f}% caught; "
          f"{time.monotonic() - t0:.0f} s in all")
    for m, _ in survivors:
        print(f"SURVIVED {m.name} ({m.what})\n  - {m.old.strip()}\n  + {m.new.strip()}")
    if args.markdown:
        print("\n| # | mutant | change | result |\n|---|---|---|---|")
        for n, (m, verdict, detail, secs) in enumerate(rows, 1):
            change = f"`{m.old.strip()}` → `{m.new.strip()}`".replace("|", "\\|")
            print(f"| {n} | `{m.name}` ({m.what}) | {change} | {verdict}{' by `' + detail.split('/')[-1] + '`' if detail else ''} |")
    return 1 if survivors else 0


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
            # Paths inside the checkout (its .venv) are taken inside the scratch tree (the same link),
            # so that the compile commands, relative to base_dir, are the checkout's and ccache hits.
            prefix, python = (str(self.path / Path(x).relative_to(ROOT)) if Path(x).is_relative_to(ROOT) else x
                              for x in (prefix, python))
            sh(["cmake", "-S", str(self.path), "-B", str(self.build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                "-DFTD_BUILD_BENCH=OFF", "-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache",
                "-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache", f"-DCMAKE_PREFIX_PATH={prefix}",
                f"-DPython3_EXECUTABLE={python}"])

    def ninja(self, targets, jobs=None):
        cmd = ["nice", "ninja", "-C", str(self.build), f"-j{jobs or os.cpu_count() or 2}", *targets]
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
    ap.add_argument("--random", type=int, metavar="N",
                    help="draw N random one-line mutants from the C++ sources under PATHS (default: server/ spec/ "
                         "client/ worker/data/) instead of the hand-written list")
    ap.add_argument("--seed", type=int, default=1, help="the random draw's seed (--random)")
    ap.add_argument("--jobs", type=int, default=1, help="ninja's parallelism for the mutants' builds (--random)")
    ap.add_argument("--without", action="append", metavar="TEST",
                    help="leave this ctest name or pytest file out of COVERAGE (repeatable; --random)")
    ap.add_argument("paths", nargs="*", help="files and folders to draw from (--random)")
    args = ap.parse_args()
    if args.random:
        args.paths = args.paths or ["server/", "spec/", "client/", "worker/data/"]
        return run_random(args)
    if args.paths:
        ap.error("PATHS go with --random")
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
