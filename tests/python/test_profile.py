"""PROFILE jobs end to end on the CPU: ftd + ftctl + a real ftd-worker under LibTorch's profiler.
The per-op table names real LibTorch ops split into phases, the trace downloads in chunks and parses
as Chrome trace JSON, two profiles compare side by side, and the categories reach /metrics."""
import json

from ftdservice import TINY, ftctl, get, submit


def test_profile_job_table_trace_compare_and_metrics(daemon, tmp_path):
    spec = dict(TINY, profile={"warmup_steps": 1, "steps": 2})
    a = submit(daemon, spec, "--kind", "profile", "--name", "prof-a")
    b = submit(daemon, dict(spec, batch_size=8), "--kind", "profile", "--name", "prof-b")
    for job in (a, b):
        assert ftctl(daemon, "wait", job, timeout=300).returncode == 0
    j = get(daemon, a)
    assert j["kind"] == "PROFILE" and int(j["last_step"]["step"]) == 3  # 1 warm-up + 2 profiled steps

    report = json.loads(ftctl(daemon, "profile", a, "-o", "json").stdout)
    assert report["device"] == "cpu" and report["steps"] == 2 and report["kernel_set"] == "eager"
    ops = report["ops"]
    names = {o["name"] for o in ops}
    assert {"aten::mm", "aten::_fused_adamw_"} <= names, sorted(names)[:40]
    assert any("flash_attention" in n or "scaled_dot_product" in n for n in names)
    phases = {o["phase"] for o in ops}
    assert {"forward", "backward", "optimizer"} <= phases
    mm = [o for o in ops if o["name"] == "aten::mm"]
    assert {o["phase"] for o in mm} >= {"forward", "backward"} and all(o["category"] == "matmul" for o in mm)
    # the RMSNorm pieces are found as such, in both directions
    rms = {(o["name"], o["phase"]) for o in ops if o["category"] == "rmsnorm"}
    assert ("aten::pow", "forward") in rms and ("aten::rsqrt", "forward") in rms and any(p == "backward" for _, p in rms)
    assert abs(sum(o["share"] for o in ops) - 1.0) < 1e-6
    assert report["step_device_ms"] > 0 and all(o["device_ms"] >= 0 and o["calls"] > 0 for o in ops)

    table = ftctl(daemon, "profile", a, "--trace", str(tmp_path / "a.json"), "--top", "10")
    assert table.returncode == 0, table.stderr
    assert "aten::mm" in table.stdout and "self CPU ms" in table.stdout
    assert len([l for l in table.stdout.splitlines() if l.startswith("aten::") or l.startswith("ftd::")]) <= 10
    trace = json.loads((tmp_path / "a.json").read_text())
    assert (tmp_path / "a.json").stat().st_size == int(report["trace_bytes"])
    events = trace["traceEvents"]
    assert any(e.get("name") == "aten::mm" and e.get("ph") == "X" for e in events)
    assert any(e.get("name") == "ftd::phase::backward" for e in events)

    cmp = ftctl(daemon, "compare", a, b)
    assert cmp.returncode == 0, cmp.stderr
    assert a in cmp.stdout and b in cmp.stdout and "aten::mm" in cmp.stdout and "B/A" in cmp.stdout
    cj = json.loads(ftctl(daemon, "compare", a, b, "-o", "json").stdout)
    assert cj["a"]["id"] == a and cj["b"]["id"] == b and any(o["op"] == "aten::mm" for o in cj["ops"]), cj
    import yaml
    assert yaml.safe_load(ftctl(daemon, "compare", a, b, "-o", "yaml").stdout) == cj
    assert yaml.safe_load(ftctl(daemon, "profile", a, "-o", "yaml").stdout) == report

    # the profile was streamed to watchers as an event, after the profiled steps
    events = [json.loads(l) for l in ftctl(daemon, "watch", a, "-o", "json").stdout.splitlines()]
    kinds = [next(k for k in ("state", "step", "log", "result", "profile") if k in e) for e in events]
    assert "profile" in kinds and kinds.index("profile") > max(i for i, k in enumerate(kinds) if k == "step")

    m = daemon.metrics()
    assert m[("ftd_profile_device_seconds_per_step", (("category", "matmul"), ("kernel_set", "eager")))] > 0
    assert m[("ftd_profile_step_device_seconds", (("kernel_set", "eager"),))] > 0


def test_profile_of_a_finetune_job_is_refused(daemon):
    job = submit(daemon, dict(TINY, steps=1))
    assert ftctl(daemon, "wait", job, timeout=300).returncode == 0
    p = ftctl(daemon, "profile", job)
    assert p.returncode == 3 and "not a PROFILE job" in p.stderr
    p = ftctl(daemon, "submit", "--default", "--kind", "profile", "--set", "profile.steps=0")
    assert p.returncode == 3 and "spec.profile.steps" in p.stderr
