"""Bounds at submission and out-of-memory workers, end to end: a real ftd, real workers (or
ftd-fake-worker where a test needs a scripted worker), requests sent as raw bytes where a client
library would refuse to build them."""
import os
import time
from pathlib import Path

import grpc
import pytest

from ftdapi import POOL, JobService, enum_name, msg, spec
from ftdservice import TINY, Daemon, make_token, wait_for


def submit_raw(daemon, raw):
    call = grpc.insecure_channel(daemon.addr).unary_unary(
        "/ftd.v1.JobService/SubmitJob", request_serializer=lambda b: b,
        response_deserializer=msg("SubmitJobResponse").FromString)
    return call(raw, timeout=20)


def refused(fn):
    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value.code(), e.value.details() or ""


def final(svc, job_id, timeout=60):
    done = {"SUCCEEDED", "FAILED", "CANCELLED"}
    return wait_for(lambda: (lambda j: j if enum_name("JobState", j.state) in done else None)(
        svc.GetJob(msg("GetJobRequest")(id=job_id), timeout=10)), timeout, f"job {job_id} to end")


def test_huge_strings_are_refused_and_records_stay_small(tmp_path):
    # One 3.9 MB data.path once made an 11.98 MB job record and 24 MB of events, after which a
    # default client could not list or get jobs.
    big_message = "cannot open " + "p" * 100_000 + ": No such file or directory"
    d = Daemon(tmp_path, scripts={"loud": {"result": "FAILED", "message": big_message, "exit": 1}})
    try:
        svc = JobService(grpc.insecure_channel(d.addr))
        req = msg("SubmitJobRequest")(name="huge", spec=spec(dict(TINY, data={"path": "/" + "x" * 3_900_000})))
        code, details = refused(lambda: svc.SubmitJob(req, timeout=20))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert details.startswith("spec.data.path ") and "at most 4096 bytes" in details, details
        assert len(details) < 400
        for field, value in (("name", "n" * 257), ("owner", "o" * 257)):
            code, details = refused(lambda: svc.SubmitJob(msg("SubmitJobRequest")(spec=spec(TINY), **{field: value}),
                                                          timeout=20))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(field + " "), details
        # A path near the longest allowed, run by the real worker (which refuses the file it names: 3
        # bytes are no token file), and a worker whose error is 100 kB long (the limit of one
        # environment string bounds the script).
        long_path = tmp_path
        while len(str(long_path)) < 3700:
            long_path = long_path / ("y" * 250)
        long_path.mkdir(parents=True)
        (long_path / "tokens.bin").write_bytes(b"abc")
        ids = [svc.SubmitJob(msg("SubmitJobRequest")(name="long", spec=spec(dict(TINY, steps=2, data={
            "path": str(long_path / "tokens.bin")}))), timeout=20).job.id,
            svc.SubmitJob(msg("SubmitJobRequest")(name="loud", spec=spec(TINY)), timeout=20).job.id]
        jobs = [final(svc, i) for i in ids]
        assert all(enum_name("JobState", j.state) == "FAILED" for j in jobs), jobs
        assert jobs[1].message.endswith("No such file or directory (worker exit code 1)"), jobs[1].message[-200:]
        sizes = [j.ByteSize() for j in jobs]
        listed = svc.ListJobs(msg("ListJobsRequest")(), timeout=20).ByteSize()
        print(f"job records {sizes} bytes, ListJobs {listed} bytes")
        assert max(sizes) < 32_000 and listed < 64_000
        code, details = refused(lambda: svc.GetJob(msg("GetJobRequest")(id="j" * 1_000_000), timeout=20))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("id must be at most"), details
        assert len(details) < 400
    finally:
        d.stop()


def _varint(n):
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def _bad_utf8_wire(desc):
    """Wire bytes of a `desc` message whose first string field (depth first, maps aside) holds invalid
    UTF-8, and that field's path; or (b"", None) if the message has no string field."""
    for f in desc.fields:
        if f.type == f.TYPE_STRING:
            return b"".join([_varint(f.number << 3 | 2), _varint(2), b"\xff\xfe"]), f.name
    for f in desc.fields:
        if f.type == f.TYPE_MESSAGE and not f.message_type.GetOptions().map_entry:
            inner, path = _bad_utf8_wire(f.message_type)
            if path is not None:
                return b"".join([_varint(f.number << 3 | 2), _varint(len(inner)), inner]), f"{f.name}.{path}"
    return b"", None


def test_a_request_that_does_not_parse_is_invalid_argument_naming_the_field_on_every_method(daemon):
    # gRPC parses requests before any handler and answered INTERNAL with an empty message.
    channel = grpc.insecure_channel(daemon.addr)
    raw = dict(request_serializer=lambda b: b, response_deserializer=lambda b: b)
    checked = 0
    for service in ("ftd.v1.JobService", "ftd.v1.AdminService"):
        for m in POOL.FindServiceByName(service).methods:
            path = f"/{service}/{m.name}"
            call = (channel.unary_stream if m.server_streaming else channel.unary_unary)(path, **raw)
            invoke = (lambda w: list(call(w, timeout=20))) if m.server_streaming else (lambda w: call(w, timeout=20))
            wire, field = _bad_utf8_wire(m.input_type)
            cases = [(wire, f"{field} is not valid UTF-8; send text encoded as UTF-8")] if field else []
            # A truncated length-delimited field: malformed whatever the message.
            cases.append((b"\x0a\x7f", f"the request is not a valid {m.input_type.full_name} (malformed protobuf"))
            for w, expected in cases:
                code, details = refused(lambda: invoke(w))
                assert code == grpc.StatusCode.INVALID_ARGUMENT, (path, w, code, details)
                assert details.startswith(expected), (path, details)
                checked += 1
    assert checked >= 30, checked
    # Nested and top-level fields of SubmitJob, and the same request once valid.
    path = daemon.data.parent / "PATH"  # an input that exists: a missing one is refused at submit
    path.write_bytes(b"\0" * 64)
    assert str(path).count("PATH") == 1 and "NAME" not in str(path) and "OWNR" not in str(path)
    good = msg("SubmitJobRequest")(name="NAME", owner="OWNR", spec=spec(dict(TINY, data={"path": str(path)})))
    wire = good.SerializeToString()
    for marker, field in ((b"NAME", "name"), (b"OWNR", "owner"), (b"PATH", "spec.data.path")):
        code, details = refused(lambda: submit_raw(daemon, wire.replace(marker, b"\xff\xfe" + marker[2:])))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
        assert details.startswith(field + " is not valid UTF-8"), details
    assert submit_raw(daemon, wire).created


def test_a_job_that_cannot_fit_the_machine_is_refused_at_submit(daemon):
    svc = JobService(grpc.insecure_channel(daemon.addr))
    # batch_size 1e9 is refused by its static bound first (test_service.py).
    for shape in ({"batch_size": 20000, "seq_len": 2048}, {"batch_size": 65536, "seq_len": 2048}):
        code, details = refused(lambda: svc.SubmitJob(
            msg("SubmitJobRequest")(spec=spec(dict(TINY, **shape))), timeout=20))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, details
        assert details.startswith("spec.batch_size: ") and "lower spec.batch_size to at most" in details, details


def _cgroup_parent():
    """A fresh cgroup directory in a hierarchy with the memory controller, or a reason to skip."""
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    for line in mounts:
        f = line.split(" ")
        rest = f[f.index("-") + 1:]
        if rest[0] == "cgroup2":
            root = Path(f[4])
            if "memory" in (root / "cgroup.controllers").read_text().split():
                return root / f"ftd-test-{os.getpid()}"
    own = {p.split(":")[1]: p.split(":")[2] for p in Path("/proc/self/cgroup").read_text().splitlines()}
    for line in mounts:
        f = line.split(" ")
        rest = f[f.index("-") + 1:]
        if rest[0] == "cgroup" and "memory" in rest[2].split(","):
            key = next((k for k in own if "memory" in k.split(",")), None)
            if key is not None:
                return Path(f[4] + own[key]) / f"ftd-test-{os.getpid()}"
    return None


def test_a_worker_over_its_cgroups_memory_limit_is_out_of_memory_and_not_retried(tmp_path):
    parent = _cgroup_parent()
    if parent is None:
        pytest.skip("no cgroup hierarchy with the memory controller is mounted here")
    try:
        parent.mkdir()
    except OSError as e:
        pytest.skip(f"cannot create a cgroup ({parent}): {e}")
    d = None
    try:
        d = Daemon(tmp_path, "--worker-cgroup", str(parent), "--worker-memory-max", "96MiB",
                   scripts={"hog": {"allocate_mb": 2048, "result": "SUCCEEDED"}})
        svc = JobService(grpc.insecure_channel(d.addr))
        job = svc.SubmitJob(msg("SubmitJobRequest")(name="hog", max_attempts=3, spec=spec(TINY)), timeout=20).job
        j = final(svc, job.id)
        assert enum_name("JobState", j.state) == "FAILED" and j.reason == "HOST_OUT_OF_MEMORY", (j.reason, j.message)
        assert j.attempt == 1, "an out-of-memory job is not retried"
        assert "memory limit of 96 MiB" in j.message, j.message
    finally:
        if d is not None:
            d.stop()
        for child in sorted(parent.glob("*/"), reverse=True):
            if child.is_dir():
                child.rmdir()
        parent.rmdir()


def test_one_user_is_held_to_call_rate_and_stream_limits_per_user_and_connection(tmp_path):
    d = Daemon(tmp_path, "--paused", "--max-calls-per-s-per-user", "5", "--max-streams-per-user", "2",
               "--max-streams-per-connection", "1")
    try:
        secret = make_token(d, "carol").read_text().strip()
        auth = (("authorization", f"Bearer {secret}"),)
        # A subchannel pool per channel: three TCP connections (by default channels share them).
        channels = [grpc.insecure_channel(d.tcp, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(3)]
        svcs = [JobService(c) for c in channels]
        sched = msg("SchedulerRequest")()

        # Rate: a burst of twice the rate passes, then calls are refused until the bucket refills.
        answers = []
        for _ in range(30):
            try:
                svcs[0].GetScheduler(sched, metadata=auth, timeout=10)
                answers.append("OK")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (e.code(), e.details())
                assert "user carol is over the call rate limit of 5 calls per second (bursts of 10" in e.details()
                answers.append("REFUSED")
        assert answers[:10] == ["OK"] * 10 and "REFUSED" in answers, answers
        # Another connection of the same user draws on the same bucket; an admin is not limited.
        code, details = refused(lambda: svcs[1].GetScheduler(sched, metadata=auth, timeout=10))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        admin = JobService(grpc.insecure_channel(d.addr))
        for _ in range(50):
            admin.GetScheduler(sched, timeout=10)
        time.sleep(2.2)  # refills the burst

        # Streams: one per connection, two per user; a closed stream gives its place back.
        job = svcs[0].SubmitJob(msg("SubmitJobRequest")(spec=spec(TINY)), metadata=auth, timeout=10).job.id
        watch = msg("WatchJobRequest")(id=job)

        def open_watch(i):
            it = svcs[i].WatchJob(watch, metadata=auth, timeout=60)
            next(it)  # the job's first event: the stream is open on the daemon
            return it

        first = open_watch(0)
        code, details = refused(lambda: open_watch(0))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "(--max-streams-per-connection 1)" in details, details
        second = open_watch(1)
        code, details = refused(lambda: open_watch(2))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        assert "user carol has 2 streaming calls open" in details and "(--max-streams-per-user 2)" in details, details
        first.cancel()

        def reopened():
            try:
                return open_watch(2)
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.details()
                time.sleep(0.5)
                return None
        wait_for(reopened, 10, "the cancelled stream's place to be given back").cancel()
        second.cancel()
    finally:
        d.stop()


def test_a_sample_of_fuzzed_submits_against_the_real_daemon_gets_no_internal_answer(tmp_path):
    # The in-process fuzz target (tests/fuzz, ctest submit_fuzz_test) runs 100,000 inputs; here a
    # sample of the same kind of inputs goes through real gRPC to a real ftd, which must answer each
    # with a status other than UNKNOWN and INTERNAL and stay up.
    import random
    corpus = sorted((Path(__file__).parents[1] / "fuzz" / "corpus" / "submit").glob("wire_*"))
    seeds = [p.read_bytes()[1:] for p in corpus]
    rng = random.Random(7)
    d = Daemon(tmp_path, "--paused", "--max-queued", "20")
    try:
        codes = {}
        for i in range(300):
            b = bytearray(rng.choice(seeds))
            for _ in range(rng.randint(1, 3)):
                at = rng.randrange(len(b) + 1)
                op = rng.randrange(4)
                if op == 0 and b:
                    b[at % len(b)] ^= 1 << rng.randrange(8)
                elif op == 1:
                    b[at:at] = bytes([rng.choice([0, 0x7F, 0x80, 0xFF])])
                elif op == 2 and b:
                    del b[at:at + rng.randint(1, 8)]
                else:
                    b = b[:at]
            try:
                submit_raw(d, bytes(b))
                code = grpc.StatusCode.OK
            except grpc.RpcError as e:
                code = e.code()
                assert code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), (bytes(b).hex(), e.details())
            codes[code.name] = codes.get(code.name, 0) + 1
        print("answers:", codes)
        assert d.proc.poll() is None, "ftd died"
        assert codes.get("INVALID_ARGUMENT", 0) > 50, codes
    finally:
        d.stop()
