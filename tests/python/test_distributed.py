"""Data-parallel jobs (spec.gpus > 1) through the real ftd-worker, one process per rank, joined by
c10d (Gloo on the CPU; FTD_TEST_DEVICE=cuda: NCCL on 2 GPUs, ctest's distributed_gpu_test, run by
scripts/gpu.sh's test and dist stages):
- 2 ranks at batch B give the losses and gradient norms of one process at batch 2B (fp32; on a GPU
  also bf16 with the fused kernel set), within TOL;
- ZeRO-1 (optimizer.shard_state) gives the unsharded results;
- ZeRO-2 (optimizer.shard_grads too) gives them while each rank keeps about 1/N of the gradients;
- a sharded checkpoint resumes exactly on the same number of ranks, and on another (re-sharding)."""
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from ftdtest import BUILD, WORKER, run_worker

FAKE_GPU_RANK = BUILD / "tests" / "ftd-fake-gpu-rank"

DEVICE = os.environ.get("FTD_TEST_DEVICE", "cpu")
if DEVICE == "cuda":
    import torch
    pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="FTD_TEST_DEVICE is cuda: needs 2 GPUs")

# Relative tolerance of the equalities below, per (device, dtype). On the CPU the ranks' results equal
# one process's up to reduction order. On a GPU another batch size picks other GEMM kernels, which
# round differently, and AdamW turns a near-zero gradient's rounding into a step of about lr; bf16
# also rounds every activation and gradient to 8 bits. A rank whose gradient is not summed with the
# other's is off by tens of percent in the gradient norm.
TOL = {("cpu", "fp32"): 1e-6, ("cuda", "fp32"): 1e-4, ("cuda", "bf16"): 3e-2}
DTYPES = ["fp32", "bf16"] if DEVICE == "cuda" else ["fp32"]


def cpu_only(test):
    """A test of CPU ranks (Gloo) under the daemon: the CUDA run leaves it out instead of skipping it
    (a skipped case fails scripts/gpu.sh), and a GPU build may lack Gloo's headers."""
    return test if DEVICE == "cpu" else None


def spec(**over):
    s = {"model": {"preset": "tiny"}, "steps": 4, "batch_size": 4, "seq_len": 32, "device": DEVICE,
         "dtype": "fp32", "seed": 3, "checkpoint": {"enabled": False},
         "optimizer": {"lr": 3e-3, "grad_clip": 0.5}, "data": {"shuffle": True, "seed": 5}}
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(s.get(k), dict):
            s[k] = {**s[k], **v}
        else:
            s[k] = v
    return s


def run_ranks(s, tmp, name, timeout=240, args=()):
    """Every rank of `s` as its own ftd-worker process (with ftd-worker flags `args`); returns rank 0's
    (steps, result) and asserts every rank exited 0."""
    n = s.get("gpus", 1)
    tmp = Path(tmp)
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(s))
    store = tmp / f"{name}.store"
    procs = []
    for r in range(n):
        err = open(tmp / f"{name}.rank{r}.err", "w")
        procs.append(subprocess.Popen([str(WORKER), "run", str(path), "--rank", str(r), "--store", str(store),
                                       "--rank-timeout", "60", *args],
                                      stdout=subprocess.PIPE, stderr=err, text=True))
    out0 = procs[0].communicate(timeout=timeout)[0]
    codes = [p.wait(timeout=timeout) for p in procs]
    lines = [json.loads(l) for l in out0.splitlines() if l.startswith("{")]
    steps = [l for l in lines if l["event"] == "step"]
    result = next((l for l in lines if l["event"] == "result"), None)
    assert codes == [0] * n, (codes, [(tmp / f"{name}.rank{r}.err").read_text()[-2000:] for r in range(n)])
    return steps, result


def assert_same_steps(a, b, what, dtype="fp32"):
    rel = TOL[(DEVICE, dtype)]
    assert len(a) == len(b) > 0, what
    for x, y in zip(a, b):
        for key in ("loss", "grad_norm"):
            assert abs(x[key] - y[key]) <= rel * abs(y[key]), (what, x["step"], key, x[key], y[key])


@pytest.mark.parametrize("dtype", DTYPES)
def test_two_ranks_equal_one_process_at_the_combined_batch(tmp_path, dtype):
    prec = {"dtype": dtype, **({"kernel_set": "fused"} if dtype == "bf16" else {})}
    _, single, _, _ = run_worker(spec(batch_size=4, grad_accum_steps=2, **prec), tmp_path)
    dp, result = run_ranks(spec(batch_size=2, grad_accum_steps=2, gpus=2, **prec), tmp_path, "dp")
    assert_same_steps(dp, single, f"2 ranks x batch 2 vs 1 process x batch 4 ({dtype})", dtype)
    assert all(s["ranks"] == 2 and s["tokens"] == 4 * 32 * 2 for s in dp)
    assert all(s["comm_wait_s"] >= 0 for s in dp)
    assert result["outcome"] == "SUCCEEDED"
    # The loss moved: a run whose ranks drifted apart would show it within these steps.
    assert dp[-1]["loss"] < dp[0]["loss"]


def test_communication_levers_leave_the_results_alone(tmp_path):
    """ftd-worker's --bucket-mib (smaller gradient buckets: more of them), --flat-reduce (each
    bucket's gradients copied into one tensor and reduced there, where the default reduces them in place) and, under ZeRO-1,
    --coalesced-gather (the weights as one group of broadcasts on NCCL; Gloo says it cannot and
    sends them one by one) give the default run's losses and gradient norms."""
    plain, _ = run_ranks(spec(batch_size=2, gpus=2), tmp_path, "plain")
    small, _ = run_ranks(spec(batch_size=2, gpus=2), tmp_path, "small", args=["--bucket-mib", "1"])
    assert_same_steps(small, plain, "1 MiB gradient buckets vs the default")
    buckets = [(tmp_path / f"{n}.rank0.err").read_text() for n in ("plain", "small")]
    assert "gradient buckets of about 256 MiB" in buckets[0] and "gradient buckets of about 1 MiB" in buckets[1]
    count = [int(t.split(" gradient buckets")[0].rsplit(" ", 1)[1]) for t in buckets]
    assert count[1] > count[0], count
    flat, _ = run_ranks(spec(batch_size=2, gpus=2), tmp_path, "flat", args=["--flat-reduce", "--bucket-mib", "1"])
    assert_same_steps(flat, plain, "1 MiB buckets copied flat and reduced vs the default (in place)")
    assert "all-reduced in place" in buckets[0] and "in place" not in (tmp_path / "flat.rank0.err").read_text()
    zero1 = {"shard_state": True}
    coal, _ = run_ranks(spec(batch_size=2, gpus=2, optimizer=zero1), tmp_path, "coal", args=["--coalesced-gather"])
    assert_same_steps(coal, plain, "ZeRO-1 with the coalesced gather vs unsharded")
    log = (tmp_path / "coal.rank0.err").read_text()
    assert ("one coalesced group of broadcasts" if DEVICE == "cuda" else "cannot coalesce broadcasts") in log, log[-2000:]


def test_sharded_optimizer_state_equals_unsharded(tmp_path):
    plain, _ = run_ranks(spec(batch_size=2, gpus=2), tmp_path, "plain")
    zero1, _ = run_ranks(spec(batch_size=2, gpus=2, optimizer={"shard_state": True}), tmp_path, "zero1")
    assert_same_steps(zero1, plain, "ZeRO-1 vs unsharded")


ZERO2 = {"shard_state": True, "shard_grads": True}


def test_sharded_gradients_equal_unsharded_with_a_share_of_the_gradients_on_each_rank(tmp_path):
    """ZeRO-2: the losses and gradient norms of the unsharded run (with gradient accumulation, and with
    1 MiB buckets: several reduce-scatters in flight), while each rank's gradients at the step take
    about half the bytes of all of them (unsharded, every rank holds all of them; ZeRO-1 too), the
    two halves adding up to the whole."""
    accum = {"batch_size": 2, "gpus": 2, "grad_accum_steps": 2}
    plain, plain_res = run_ranks(spec(**accum), tmp_path, "plain")
    zero2, zero2_res = run_ranks(spec(**accum, optimizer=ZERO2), tmp_path, "zero2")
    small, small_res = run_ranks(spec(**accum, optimizer=ZERO2), tmp_path, "small", args=["--bucket-mib", "1"])
    assert_same_steps(zero2, plain, "ZeRO-2 vs unsharded")
    assert_same_steps(small, plain, "ZeRO-2 with 1 MiB buckets vs unsharded")
    log = (tmp_path / "small.rank0.err").read_text()
    buckets = int(log.split(" gradient buckets of about 1 MiB, reduce-scattered")[0].rsplit(" ", 1)[1])
    assert buckets > 2, log[-2000:]  # more than GradReducer::kMaxInFlight: the oldest is waited for
    assert "AdamW state and gradients sharded (ZeRO-2)" in log
    whole = plain_res["rank_grad_bytes"][0]
    assert plain_res["rank_grad_bytes"] == [whole, whole]
    for res in (zero2_res, small_res):
        shares = res["rank_grad_bytes"]
        assert sum(shares) == whole, (shares, whole)
        assert all(0 < b <= 0.55 * whole for b in shares), (shares, whole)


def test_sharded_gradients_need_the_sharded_state(tmp_path):
    code, _, result, _ = run_worker(spec(gpus=2, optimizer={"shard_grads": True}), tmp_path, check=False)
    assert code != 0
    assert "spec.optimizer.shard_grads needs optimizer.shard_state true" in result["message"]
    assert "set optimizer.shard_state true, or optimizer.shard_grads false" in result["message"]


@pytest.mark.parametrize("stage", ["zero1", "zero2"])
def test_sharded_checkpoint_resumes_exactly_on_the_same_and_another_number_of_ranks(tmp_path, stage):
    """Written by 2 ranks x batch 2: resumed by the same 2 ranks, and by another number of them with
    the same combined batch: one process x 4, which takes both shards, or (ZeRO-2, where there are 4
    CPUs or GPUs to run on) 4 ranks x 1, which re-shard the AdamW state by parameter name and keep
    about a quarter of the gradients each."""
    zero = {"shard_state": True} if stage == "zero1" else ZERO2
    full, _ = run_ranks(spec(batch_size=2, gpus=2, steps=6, optimizer=zero), tmp_path, "full")
    ck = tmp_path / "ck"
    first, result = run_ranks(spec(batch_size=2, gpus=2, steps=3, optimizer=zero,
                                   checkpoint={"dir": str(ck), "enabled": True}), tmp_path, "first")
    step3 = ck / "step-00000003"
    manifest = json.loads((step3 / "MANIFEST.json").read_text())
    assert manifest["optimizer_shards"] == 2
    assert {"optimizer-rank-0-of-2.safetensors", "optimizer-rank-1-of-2.safetensors",
            "model.safetensors"} <= set(manifest["files"])
    assert not (step3 / "optimizer.safetensors").exists()
    assert_same_steps(first, full[:3], "before the checkpoint")
    # The same two ranks resume: steps 4..6 as the uninterrupted run.
    same = tmp_path / "same"
    subprocess.run(["cp", "-r", str(ck), str(same)], check=True)
    resumed, _ = run_ranks(spec(batch_size=2, gpus=2, steps=6, optimizer=zero,
                                checkpoint={"dir": str(same), "enabled": True}), tmp_path, "resumed")
    assert [s["step"] for s in resumed] == [4, 5, 6]
    assert_same_steps(resumed, full[3:], "resumed on 2 ranks")
    four = stage == "zero2" and (DEVICE == "cpu" or torch.cuda.device_count() >= 4)
    if four:
        other, res = run_ranks(spec(batch_size=1, gpus=4, steps=6, optimizer=zero,
                                    checkpoint={"dir": str(ck), "enabled": True}), tmp_path, "four")
        shares = res["rank_grad_bytes"]
        assert len(shares) == 4 and all(0 < b <= 0.3 * sum(shares) for b in shares), shares
    else:
        _, other, _, _ = run_worker(spec(batch_size=4, steps=6, checkpoint={"dir": str(ck), "enabled": True}),
                                    tmp_path)
    assert [s["step"] for s in other] == [4, 5, 6]
    assert_same_steps(other, full[3:], f"resumed by {'4 ranks' if four else '1 process'}")


def run_fake_gpu_ranks(s, tmp, name, gpus):
    """Every rank of `s` through tests/fake_gpu_rank.cc, rank r with the fake GPU gpus[r] = (joules a
    step, MiB in use, utilisation); rank 0's step lines, after every rank exited 0."""
    tmp = Path(tmp)
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(s))
    procs = [subprocess.Popen([str(FAKE_GPU_RANK), str(path), str(r), str(tmp / f"{name}.store"), *map(str, gpu)],
                              stdout=subprocess.PIPE, stderr=open(tmp / f"{name}.rank{r}.err", "w"), text=True)
             for r, gpu in enumerate(gpus)]
    out0 = procs[0].communicate(timeout=240)[0]
    codes = [p.wait(timeout=240) for p in procs]
    assert codes == [0] * len(gpus), (codes, [(tmp / f"{name}.rank{r}.err").read_text()[-2000:] for r in range(len(gpus))])
    return [l for l in map(json.loads, out0.splitlines()) if l["event"] == "step"]


@cpu_only
def test_mfu_and_energy_count_every_ranks_gpu(tmp_path):
    """A data-parallel job's MFU is its throughput against the peak of every GPU it runs on, and its
    energy, J/token and GPU memory are those of all its GPUs over all its ranks' tokens. CPU ranks,
    each with a fake GPU of its own (tests/fake_gpu_rank.cc: a fixed energy per step, so the figures
    do not depend on the step times of a busy machine; power is the same summed counter over time)."""
    peak = 1e12
    one = run_fake_gpu_ranks(spec(batch_size=4, steps=6, peak_flops=peak), tmp_path, "one", [(100, 1024, 0.2)])
    dp = run_fake_gpu_ranks(spec(batch_size=2, gpus=2, steps=6, peak_flops=peak), tmp_path, "dp",
                            [(100, 1024, 0.2), (300, 3072, 0.6)])
    assert len(dp) == len(one) == 6 and all(s["ranks"] == 2 and s["tokens"] == 4 * 32 for s in dp)
    # Model FLOPs per token over the peak of the job's GPUs: the same model and seq_len in both runs.
    per_token = [s["mfu"] * s["ranks"] / s["tokens_per_s"] for s in one + dp]
    assert all(abs(x - per_token[0]) <= 1e-9 * per_token[0] for x in per_token), per_token

    def close(a, b):
        return abs(a - b) <= 1e-9 * abs(b)

    for runs, joules, mib, util in ((one, 100, 1024, 0.2), (dp, 400, 4096, 0.4)):
        for s in runs:
            assert s["nvml_available"] and s["power_w"] > 0, s
            assert close(s["step_energy_j"], joules) and close(s["energy_total_j"], joules * s["step"]), (joules, s)
            assert close(s["joules_per_token"], joules / s["tokens"]), (joules, s)  # every rank's tokens
            assert s["gpu_memory_used_bytes"] == mib << 20 and abs(s["gpu_utilization"] - util) < 1e-12, s


def test_a_different_combined_batch_is_refused_naming_the_fields(tmp_path):
    ck = tmp_path / "ck"
    run_ranks(spec(batch_size=2, gpus=2, steps=2, checkpoint={"dir": str(ck), "enabled": True}), tmp_path, "w")
    code, _, result, _ = run_worker(spec(batch_size=2, steps=4, checkpoint={"dir": str(ck), "enabled": True}),
                                    tmp_path, check=False)
    assert code != 0
    assert "spec.batch_size x spec.gpus (the batch of all ranks) is 2 but the checkpoint was written with 4" \
        in result["message"]


def test_a_rank_without_its_store_is_refused(tmp_path):
    p = tmp_path / "s.json"
    p.write_text(json.dumps(spec(gpus=2)))
    r = subprocess.run([str(WORKER), "run", str(p)], capture_output=True, text=True)
    assert r.returncode == 2
    assert "--rank R" in r.stderr and "--store" in r.stderr


def rank_pids(job):
    """pid -> rank of every worker process of `job` (its argv: agent ... --job J ... --rank r)."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"agent" in argv and job.encode() in argv and b"--rank" in argv:
            out[int(d.name)] = int(argv[argv.index(b"--rank") + 1])
    return out


@cpu_only
def test_killing_one_rank_stops_every_rank_and_the_job_resumes_as_a_whole(daemon):
    """ftd starts both ranks of a gpus: 2 job in one process group; SIGKILL to rank 1 ends rank 0
    too (no rank is left behind), and the job is retried as a whole from its last checkpoint."""
    from ftdservice import TINY, ftctl, get, group_alive, pid_alive, submit, wait_for
    job = submit(daemon, dict(TINY, steps=30, gpus=2, checkpoint={"every_steps": 4}), "--max-attempts", "2")
    j = wait_for(lambda: (lambda g: g if g.get("state") == "RUNNING" and int(g.get("last_step", {}).get("step", 0)) >= 5
                          else None)(get(daemon, job)), 120, "the job to pass its first checkpoint")
    leader = int(j["worker_pid"])
    ranks = rank_pids(job)
    assert sorted(ranks.values()) == [0, 1], ranks
    follower = next(p for p, r in ranks.items() if r == 1)
    assert os.getpgid(follower) == leader  # one process group: stop and kill reach every rank
    os.kill(follower, signal.SIGKILL)
    wait_for(lambda: not group_alive(leader) and not pid_alive(leader), 30, "rank 0 to be stopped too")
    assert ftctl(daemon, "wait", job, timeout=240).returncode == 0
    j = get(daemon, job)
    assert j["state"] == "SUCCEEDED" and int(j["attempt"]) == 2, j
    log = ftctl(daemon, "logs", job).stdout
    assert "resumed from" in log, log[-3000:]
    assert not rank_pids(job)


def test_a_job_asking_for_more_gpus_than_the_host_has_is_refused_at_submit(daemon):
    from ftdservice import TINY, ftctl
    path = Path(daemon.data).parent / "big.json"
    path.write_text(json.dumps(dict(TINY, device="auto", gpus=2)))
    p = ftctl(daemon, "submit", str(path))
    assert p.returncode != 0
    assert "spec.gpus asks for 2 GPUs but this ftd has 0" in p.stderr, p.stderr


@cpu_only
def test_dist_bench_runs_on_cpu_ranks_and_fails_when_a_run_does(tmp_path):
    """bench/dist_bench.py end to end on CPU ranks (tiny model, Gloo): its four runs (1 rank, 2 ranks,
    2 ranks with ZeRO-1 and with ZeRO-2) succeed, ZeRO-1 and ZeRO-2 agree with unsharded, ZeRO-2's ranks hold
    about half the gradients, the table and JSON say so, exit 0; a
    --variant adds a run with its levers, --singles a row of independent 1-rank jobs at once; a token it does not know is refused; a run that fails
    (killed at its time limit) makes it exit 1 naming the run."""
    import sys
    bench = Path(__file__).resolve().parents[2] / "bench" / "dist_bench.py"
    cmd = [sys.executable, str(bench), "--worker", str(WORKER), "--model", "tiny", "--device", "cpu",
           "--shape", "2x32", "--steps", "4", "--warmup", "1"]
    p = subprocess.run(cmd + ["--out", str(tmp_path / "ok")], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    res = json.loads((tmp_path / "ok" / "dist_bench.json").read_text())
    assert [(r["gpus"], r["zero"], r["outcome"]) for r in res["runs"]] == \
        [(1, 0, "SUCCEEDED"), (2, 0, "SUCCEEDED"), (2, 1, "SUCCEEDED"), (2, 2, "SUCCEEDED")]
    assert res["problems"] == [] and all(r["tokens_per_s"] > 0 for r in res["runs"])
    grads = [r["max_rank_grad_gib"] for r in res["runs"]]
    assert grads[0] == grads[1] == grads[2] > 0 and grads[3] <= 0.55 * grads[1], grads
    assert "| 2 | 1 |" in p.stdout and "| 2 | 2 |" in p.stdout and "dist_bench: ok" in p.stdout
    # A lever variant: one more 2-rank run, its flags and environment passed to every rank.
    p = subprocess.run(cmd + ["--out", str(tmp_path / "lever"), "--steps", "2", "--variant",
                              "z1c:zero1 --coalesced-gather --bucket-mib=1 NCCL_MAX_NCHANNELS=2", "--singles"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    res = json.loads((tmp_path / "lever" / "dist_bench.json").read_text())
    assert [(r["run"], r["zero"], r["outcome"]) for r in res["runs"]][4:5] == [("g2-z1c", 1, "SUCCEEDED")]
    assert res["runs"][4]["levers"] == "--coalesced-gather --bucket-mib=1 NCCL_MAX_NCHANNELS=2"
    assert "| --coalesced-gather --bucket-mib=1 NCCL_MAX_NCHANNELS=2 |" in p.stdout
    # --singles: two independent 1-rank jobs at once, their tokens/s summed.
    single = res["runs"][5]
    assert (single["run"], single["gpus"], single["outcome"]) == ("2x1-singles", 2, "SUCCEEDED"), single
    assert single["tokens_per_s"] > 0 and "| 2 independent 1-GPU jobs at once |" in p.stdout
    p = subprocess.run(cmd + ["--out", str(tmp_path / "typo"), "--variant", "x:zero3"], capture_output=True, text=True)
    assert p.returncode == 2 and "'zero3' is not zero1, zero2" in p.stderr
    p = subprocess.run(cmd + ["--out", str(tmp_path / "bad"), "--timeout", "0"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 1, p.stdout
    assert "dist_bench: g1-plain: FAILED" in p.stdout and "dist_bench: FAILED" in p.stdout


@cpu_only
def test_allreduce_bandwidth_script_on_gloo(tmp_path):
    """bench/allreduce_bw.py on 2 CPU ranks (Gloo): one row per size, bus bandwidth = algorithm
    bandwidth x 2(N-1)/N, in its table and JSON."""
    import sys
    bench = Path(__file__).resolve().parents[2] / "bench" / "allreduce_bw.py"
    p = subprocess.run([sys.executable, str(bench), "--out", str(tmp_path), "--device", "cpu", "--mib", "1,2",
                        "--iters", "2"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    res = json.loads((tmp_path / "allreduce_bw.json").read_text())
    assert [r["mib"] for r in res["rows"]] == [1, 2]
    for r in res["rows"]:
        assert r["time_s"] > 0 and r["busbw_gbs"] == pytest.approx(r["algbw_gbs"] * 2 * (2 - 1) / 2)
    assert "| 2 MiB |" in p.stdout
