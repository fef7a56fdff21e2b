"""The performance analysis scripts on the CPU: bench/profile_breakdown.py's op-to-category table on a
profile a real CPU PROFILE job (ftd + ftctl + ftd-worker) just recorded, and bench/roofline.py's FLOP
count against a count by hand and against torch.utils.flop_counter on a tiny HF LLaMA."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ftdservice import TINY, ftctl, submit
from ftdtest import BUILD

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load(name):
    if str(BENCH) not in sys.path:  # the benchmarks import their shared modules (bench_cli, ...) by name
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_profile_breakdown_of_a_recorded_cpu_profile(daemon, tmp_path):
    bd = load("profile_breakdown")
    job = submit(daemon, dict(TINY, profile={"warmup_steps": 1, "steps": 2}), "--kind", "profile")
    assert ftctl(daemon, "wait", job, timeout=300).returncode == 0
    fixture = tmp_path / "cpu-profile.json"
    fixture.write_text(ftctl(daemon, "profile", job, "-o", "json").stdout)
    report = json.loads(fixture.read_text())

    by_name = {}
    for op in report["ops"]:
        by_name.setdefault(op["name"], set()).add(bd.category_of(op))
    assert by_name["aten::mm"] == {"GEMM"}
    assert by_name["aten::_fused_adamw_"] == {"optimizer"}
    assert {"elementwise/norm/rope"} == by_name["aten::rsqrt"] == by_name["aten::pow"]  # RMSNorm's pieces
    assert any("attention" in c for n, c in by_name.items() if "scaled_dot_product" in n or "flash" in n)
    ce = [op for op in report["ops"] if op["category"] == "cross_entropy"]
    assert ce and {bd.category_of(op) for op in ce if not op["name"].startswith("aten::mm")} == {"cross-entropy"}

    ms = bd.breakdown(report)
    for c in ("GEMM", "attention", "cross-entropy", "optimizer", "elementwise/norm/rope"):
        assert ms[c] > 0, (c, ms)
    assert ms["communication"] == 0 and ms["other"] == 0, ms
    # the categories and the gaps add up to the step's wall time
    assert sum(ms[c] for c in bd.CATEGORIES + (bd.IDLE,)) == pytest.approx(report["step_wall_ms"], rel=1e-9)
    assert ms[bd.IDLE] == pytest.approx(report["step_wall_ms"] - report["step_device_ms"], rel=1e-9)

    # device kernels no op claimed and collectives, as they appear on a GPU
    assert bd.category_of({"name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "category": "other"}) == "communication"
    assert bd.category_of({"name": "c10d::allreduce_", "category": "other"}) == "communication"
    assert bd.category_of({"name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "category": "other"}) == "GEMM"
    assert bd.category_of({"name": "nvjet_tst_192x192_64x3_1x2_h_bz_coopB_TNT", "category": "other"}) == "GEMM"
    assert bd.category_of({"name": "aten::broadcast_tensors", "category": "other"}) == "elementwise/norm/rope"
    assert bd.category_of({"name": "flash_fwd_kernel", "category": "attention"}) == "attention"
    assert bd.category_of({"name": "ftd::swiglu_forward", "category": "swiglu"}) == "elementwise/norm/rope"

    p = subprocess.run([sys.executable, str(BENCH / "profile_breakdown.py"), "--report", str(fixture)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    rows = {l.split("|")[1].strip(): l for l in p.stdout.splitlines() if l.startswith("| ")}
    assert {"GEMM", "attention", "cross-entropy", "optimizer", "elementwise/norm/rope", "communication", "idle/gaps",
            "step wall time"} <= set(rows), p.stdout
    assert f"{report['step_wall_ms']:.2f} | 100.0%" in rows["step wall time"]


# A tiny config, counted by hand below.
TINY_CFG = SimpleNamespace(hidden_size=8, intermediate_size=12, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=2, vocab_size=16, tie_word_embeddings=False)


def test_step_flops_match_a_count_by_hand():
    rf = load("roofline")
    # Weights of one layer: q 8x8, k 8x4, v 8x4, o 8x8, gate/up/down 8x12 each = 64+32+32+64+96*3 = 480;
    # two layers and lm_head 16x8: 960 + 128 = 1088. Batch 2 x seq 3 = 6 tokens, 2 FLOPs a weight a token.
    linear_forward = 2 * 1088 * 6  # 13,056
    # Attention per layer and sequence: 4 heads x (QK^T: 3x2 @ 2x3, 18 MACs; PV: 3x3 @ 3x2, 18 MACs) =
    # 4 x 36 MACs = 288 FLOPs; 2 sequences x 2 layers = 1,152 FLOPs; the causal mask halves it.
    attention_forward = 1152
    f = rf.step_flops(TINY_CFG, 2, 3, causal=False)
    assert f["forward"] == linear_forward + attention_forward
    assert f["total"] == 3 * (13056 + 1152) == 42624  # backward: twice the forward
    assert rf.step_flops(TINY_CFG, 2, 3)["total"] == 3 * (13056 + 576)
    # AdamW over every parameter (+ embedding 16x8, 2 norms a layer of 8, the final norm): bf16 reads
    # p, g, m, v and writes p, m, v: 14 bytes a parameter; fp32 moments: 22.
    n = 1088 + 128 + 2 * 2 * 8 + 8
    assert rf.all_params(TINY_CFG) == n
    assert rf.optimizer_bytes(n) == 14 * n and rf.optimizer_bytes(n, state_bytes=4) == 22 * n


def test_step_flops_match_torch_flop_counter_on_hf_llama():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from torch.utils.flop_counter import FlopCounterMode
    rf = load("roofline")
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                                   num_attention_heads=6, num_key_value_heads=2, head_dim=8,
                                   tie_word_embeddings=False)
    torch.manual_seed(0)
    # eager attention: QK^T and PV as plain matmuls over the whole square, which the counter sees
    model = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="eager")
    B, T = 2, 7
    ids = torch.randint(0, cfg.vocab_size, (B, T + 1))
    with FlopCounterMode(display=False) as counter:
        logits = model(input_ids=ids[:, :-1]).logits
        torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size), ids[:, 1:].reshape(-1)).backward()
    rotary_table = 2 * (cfg.head_dim // 2) * T  # HF's inv_freq @ positions, forward only, one position row
    assert counter.get_total_flops() == rf.step_flops(cfg, B, T, causal=False)["total"] + rotary_table


def test_trace_breakdown_by_kernel_and_launching_op(tmp_path):
    """The kernel-level table: each kernel's category from its name and the ops that launched it, the
    same rules for ftd's traces and torch.profiler's; wall = first kernel start to last kernel end per
    step, idle = wall - the union of kernel intervals."""
    bd = load("profile_breakdown")

    def op(name, ts, dur, ext, tid=1, cat="cpu_op"):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
                "args": {"External id": ext}}

    def kernel(name, ts, dur, ext):
        return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
                "args": {"External id": ext}}

    events = [
        # forward: an FP8 GEMM (cuBLASLt names it like a bf16 one; the launching op tells them apart)
        op("LinearsFn", 0, 100, 1), op("aten::_scaled_mm", 10, 20, 2), kernel("nvjet_tst_128x256_64x4", 100, 400, 2),
        op("ftd::fp8_cast", 40, 5, 3), kernel("Fp8CastAmaxKernel", 500, 100, 3),
        op("aten::mm", 50, 5, 4), kernel("nvjet_tst_128x256_64x4", 600, 300, 4),
        # backward on the autograd thread: a byte transpose inside the fp8 function is a cast-side cost
        op("autograd::engine::evaluate_function: CppNode<ftd::engine::fp8::LinearsFn>", 60, 30, 5, tid=2),
        op("aten::copy_", 61, 5, 6, tid=2), kernel("elementwise_kernel<uint8>", 1000, 50, 6),  # after a 100 us gap
        op("aten::_scaled_dot_product_flash_attention", 70, 5, 7), kernel("pytorch_flash::flash_fwd_kernel", 1050, 150, 7),
        op("aten::add_", 80, 2, 8), kernel("vectorized_elementwise_kernel<add>", 1300, 100, 8),  # after a 100 us gap
        # a compiled peer's fused cast, and an optimizer kernel
        op("CompiledFunction", 85, 2, 9), kernel("triton_red_fused_abs_amax_clamp_0", 1400, 100, 9),
        op("Optimizer.step#AdamW.step", 90, 5, 10), op("aten::_fused_adamw_", 91, 2, 11),
        kernel("multi_tensor_apply_kernel", 1500, 100, 11),
        kernel("ncclDevKernel_AllReduce_Sum_bf16", 1600, 200, 99),
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    b = bd.trace_breakdown(bd.load_trace(path), steps=2)
    assert b["GEMM fp8"] == pytest.approx(0.4 / 2)
    assert b["GEMM bf16"] == pytest.approx(0.3 / 2)
    assert b["casts/amax/transposes"] == pytest.approx((0.1 + 0.05 + 0.1) / 2)
    assert b["attention"] == pytest.approx(0.15 / 2)
    assert b["norms/elementwise/rope"] == pytest.approx(0.1 / 2)
    assert b["optimizer"] == pytest.approx(0.1 / 2)
    assert b["communication"] == pytest.approx(0.2 / 2)
    assert b["wall"] == pytest.approx(1.7 / 2)
    assert b[bd.IDLE] == pytest.approx(0.2 / 2)
    assert sum(b[c] for c in bd.TRACE_CATEGORIES) + b[bd.IDLE] == pytest.approx(b["wall"])
    assert "ftd-x" in bd.trace_table([("ftd-x", b)])


def test_train_bench_peer_timeout_without_limits_runs_a_subprocess():
    """Without --run-timeout or --budget-s a peer's run has no limit: the timeout handed to subprocess is
    None (an 'infinite' number made subprocess raise OverflowError: timeout is too large)."""
    tb = load("train_bench")
    t = tb.peer_timeout(None, None, 12.0)
    assert t is None
    assert subprocess.run([sys.executable, "-c", "pass"], timeout=t).returncode == 0
    assert tb.peer_timeout(150, None, 0) == 150
    assert tb.peer_timeout(150, 420, 400) == pytest.approx(20)
    assert tb.peer_timeout(None, 420, 100) == pytest.approx(320)


def test_train_bench_peers_run_without_checkpointing_first(monkeypatch):
    """A peer runs first as its users run it (no gradient checkpointing); `auto` reruns it with
    checkpointing only after a real out-of-memory run, and that row is named +gc."""
    tb = load("train_bench")
    calls = []

    def fake_run_hf(tokens, b, t, steps, variant, grad_ckpt, timeout=None):
        calls.append(grad_ckpt)
        oom = variant == "float8" and not grad_ckpt and b * t > 8192
        return {"impl": f"hf-{variant}" + ("+gc" if grad_ckpt else ""),
                "outcome": "OUT_OF_MEMORY" if oom else "SUCCEEDED", "steps": []}

    monkeypatch.setattr(tb, "run_hf", fake_run_hf)
    assert tb.run_peer("tok", 8, 2048, 3, "hf-float8", "auto")["impl"] == "hf-float8+gc"
    assert calls == [False, True]
    calls.clear()
    assert tb.run_peer("tok", 4, 2048, 3, "hf-float8", "auto")["impl"] == "hf-float8"
    assert calls == [False]
    calls.clear()
    assert tb.run_peer("tok", 8, 2048, 3, "hf-float8", "off")["outcome"] == "OUT_OF_MEMORY"
    assert calls == [False]


def test_list_bench_times_restarts_as_the_queue_grows(tmp_path):
    """bench/list_bench.py, in miniature: restarts are timed at each queue size asked for."""
    p = subprocess.run([sys.executable, str(BENCH / "list_bench.py"), "--build", str(BUILD), "--out", str(tmp_path),
                        "--jobs", "60", "--restart-at", "20,60", "--restarts", "2", "--idle-samples", "2",
                        "--watchers", "1", "--clients", "1", "--seconds", "1", "--load-procs", "1"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads((tmp_path / "list_bench.json").read_text())
    assert [x["queued"] for x in r["restarts"]] == [20, 60], r["restarts"]
    assert all(x["n"] == 2 and 0 < x["p50_ms"] <= x["max_ms"] for x in r["restarts"]), r["restarts"]
    assert "| jobs queued | restarts | start p50 (ms) | start max (ms) |" in p.stdout, p.stdout
