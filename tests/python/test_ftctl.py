"""ftctl as a daily tool, against real ftd daemons on loopback (or none at all): fast and clear
failures without a daemon, addresses, specs from stdin and YAML, relative paths, output formats, list
options, several ids to cancel. Every wait is bounded."""
import json
import os
import random
import re
import signal
import socket
import subprocess
import threading
import time

import pytest

from ftdservice import FTCTL, FTD, TINY, Daemon, free_port, ftctl, get, make_token, stop_process, submit, wait_for


class DaemonAt(Daemon):
    """A Daemon listening on a given TCP address (a host name) beside its unix socket."""

    def __init__(self, tmp, listen, *flags):
        self._listen = listen
        super().__init__(tmp, *flags)

    def start(self, wait=True):
        self.tcp = self._listen
        super().start(wait)


def test_ftd_refuses_a_port_in_use_at_once(tmp_path, daemon):
    # A second ftd on the first one's port must fail fast and say why on stderr (gRPC's default
    # SO_REUSEPORT would let it start and share the port).
    t0 = time.monotonic()
    p = subprocess.Popen([str(FTD), "--listen", daemon.tcp, "--metrics-listen", "", "--socket", str(tmp_path / "2.sock"),
                          "--data-dir", str(tmp_path / "second"), "--gpus", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = p.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        stop_process(p)
        raise AssertionError("a second ftd on a port in use kept running")
    assert p.returncode != 0
    assert f"cannot listen on --listen {daemon.tcp}" in err and "in use" in err, err
    assert time.monotonic() - t0 < 5


COMMANDS = [["list"], ["get", "j-000001"], ["watch", "j-000001"], ["wait", "j-000001"], ["cancel", "j-000001"],
            ["submit", "--default"], ["profile", "j-000001"], ["compare", "j-000001", "j-000002"]]


def _timed(*args, timeout=60, **kw):
    t0 = time.monotonic()
    p = subprocess.run([str(FTCTL), *args], capture_output=True, text=True, timeout=timeout, **kw)
    return p, time.monotonic() - t0


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: c[0])
def test_no_daemon_answers_within_3s_with_one_clear_line(cmd):
    addr = f"127.0.0.1:{free_port()}"  # nothing listens there
    p, took = _timed("--addr", addr, *cmd)
    assert p.returncode == 3, (p.returncode, p.stderr)
    assert took < 3, f"{cmd[0]} took {took:.1f}s"
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert f"cannot reach ftd at {addr}" in lines[0] and "connection refused" in lines[0], lines[0]
    assert "--addr" in lines[0] and f"ftd --listen {addr}" in lines[0], lines[0]  # what to check, how to start it
    assert p.stdout == ""


@pytest.mark.parametrize("cmd", [["list"], ["watch", "j-000001"], ["wait", "j-000001"]], ids=lambda c: c[0])
def test_timeout_bounds_every_call(cmd):
    p, took = _timed("--addr", f"127.0.0.1:{free_port()}", "--timeout", "0.5", *cmd)
    assert p.returncode == 3 and took < 1.5, (took, p.stderr)


def test_address_sources_are_named_and_a_bad_one_is_refused(tmp_path):
    (tmp_path / "empty.json").write_text("{}")
    env = dict(os.environ, FTD_ADDR=f"127.0.0.1:{free_port()}", FTCTL_CONFIG=str(tmp_path / "empty.json"))
    p, _ = _timed("list", env=env)
    assert p.returncode == 3 and "(from $FTD_ADDR)" in p.stderr, p.stderr
    p, _ = _timed("--addr", "gpu-box:http", "list", env=env)
    assert p.returncode == 64 and "no valid port" in p.stderr and "from --addr" in p.stderr, p.stderr


def test_host_without_port_gets_ftds_default_port(tmp_path):
    # `localhost` and `[::1]` mean ftd's port 7070 (gRPC would pick 443); skip if 7070 is taken here.
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", 7070))
        except OSError:
            pytest.skip("port 7070 is in use on this machine")
    d = DaemonAt(tmp_path, "localhost:7070")
    try:
        env = dict(os.environ, FTD_TOKEN_FILE=str(make_token(d, "ana")))
        for addr in ("localhost", "127.0.0.1"):
            p = ftctl(addr, "list", env=env)
            assert p.returncode == 0 and p.stdout.startswith("ID"), (addr, p.stderr)
    finally:
        d.stop()


def test_unix_socket_address_passes_through(tmp_path):
    sock = tmp_path / "ftd.sock"
    d = Daemon(tmp_path, unix_socket=True, socket=sock)
    try:
        p = ftctl(f"unix:{sock}", "list")
        assert p.returncode == 0, p.stderr
    finally:
        d.stop()


def test_calls_ride_through_daemon_restarts_under_1s(tmp_path):
    """SIGKILL the daemon while clients submit and wait, and start it again at once: every submit
    succeeds (none gives up), each request id names one job, and a running wait rides through."""
    d = Daemon(tmp_path, "--paused")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(dict(TINY, steps=1)))
    first = submit(d, dict(TINY, steps=1))
    waiter = subprocess.Popen([str(FTCTL), "--addr", d.addr, "wait", first], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    results, stop = [], threading.Event()

    def client(n):
        i = 0
        while not stop.is_set():
            i += 1
            rid = f"c{n}-{i}"
            p = ftctl(d, "submit", str(spec), "--request-id", rid, timeout=60)
            results.append((rid, p.returncode, p.stdout.strip(), p.stderr))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(2)]
    try:
        for t in threads:
            t.start()
        rng = random.Random()
        outages = []
        for _ in range(15):
            time.sleep(rng.uniform(0.1, 0.4))
            t0 = time.monotonic()
            d.kill(signal.SIGKILL)
            d.start(wait=False)
            outages.append(d.wait_ready() - t0)  # until the daemon says it serves (not a client's poll)
        stop.set()
        for t in threads:
            t.join(timeout=120)
        failed = [r for r in results if r[1] != 0]
        assert not failed, failed[:3]
        assert len(results) >= 15
        assert max(outages) < 1.5, outages
        # the waiter is still waiting for the paused job; cancelling ends it with the job's outcome
        assert waiter.poll() is None, waiter.communicate()
        assert ftctl(d, "cancel", first).returncode == 0
        out, err = waiter.communicate(timeout=30)
        assert waiter.returncode == 2, err
        jobs = json.loads(ftctl(d, "list", "-o", "json").stdout)
        by_rid = {}
        for j in jobs:
            by_rid.setdefault(j["request_id"], []).append(j["id"])
        for rid, _, job, _ in results:
            assert by_rid.get(rid) == [job], rid
    finally:
        stop.set()
        if waiter.poll() is None:
            waiter.kill()
        d.stop()


def test_watch_gives_up_after_timeout_once_ftd_is_gone(tmp_path):
    d = Daemon(tmp_path, "--paused")
    job = submit(d, dict(TINY, steps=1))
    watch = subprocess.Popen([str(FTCTL), "--addr", d.addr, "--timeout", "2", "watch", job],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: d.proc.poll() is None, 5, "daemon")
        time.sleep(0.5)  # the watch has shown the QUEUED event
        d.kill(signal.SIGKILL)
        t0 = time.monotonic()
        out, err = watch.communicate(timeout=30)
        took = time.monotonic() - t0
        assert watch.returncode == 3, err
        assert 1.5 < took < 4, took
        assert "reconnecting for up to 2 s" in err and "lost ftd at" in err and "the job goes on" in err, err
        assert "QUEUED" in out
    finally:
        if watch.poll() is None:
            watch.kill()
        d.stop()


def _ftctl_in(cwd, daemon, *args, input=None):
    return subprocess.run([str(FTCTL), "--addr", daemon.addr, *args], capture_output=True, text=True, timeout=60,
                          cwd=cwd, input=input)


def test_spec_from_stdin_and_yaml(tmp_path):
    d = Daemon(tmp_path, "--paused")
    try:
        p = _ftctl_in(tmp_path, d, "submit", "-", input=json.dumps(dict(TINY, steps=3)))
        assert p.returncode == 0, p.stderr
        assert get(d, p.stdout.strip())["spec"]["steps"] == 3
        yaml_text = "model: {preset: tiny}\nbatch_size: 4\nseq_len: 32\ndevice: cpu\nsteps: 4\noptimizer:\n  lr: 1e-4\n"
        p = _ftctl_in(tmp_path, d, "submit", "-", input=yaml_text)  # YAML on stdin
        assert p.returncode == 0, p.stderr
        job = get(d, p.stdout.strip())
        assert job["spec"]["steps"] == 4 and job["spec"]["optimizer"]["lr"] == 1e-4, job["spec"]
        (tmp_path / "job.yml").write_text(yaml_text.replace("steps: 4", "steps: 5"))
        p = _ftctl_in(tmp_path, d, "submit", "job.yml")
        assert p.returncode == 0, p.stderr
        assert get(d, p.stdout.strip())["spec"]["steps"] == 5
    finally:
        d.stop()


def test_spec_syntax_errors_name_line_and_column(tmp_path):
    (tmp_path / "job.json").write_text('{\n  "steps": 3,\n  "seq_len": 32,\n}\n')
    (tmp_path / "job.yaml").write_text("steps: 3\nmodel: {preset: tiny\n")
    # Usage errors come before any connection: no daemon is needed.
    env = dict(os.environ, FTD_ADDR=f"127.0.0.1:{free_port()}")
    p = subprocess.run([str(FTCTL), "submit", "job.json"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert p.returncode == 64 and "job.json: spec is not valid JSON: line 4, column 1" in p.stderr, p.stderr
    p = subprocess.run([str(FTCTL), "submit", "job.yaml"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert p.returncode == 64 and "job.yaml: spec is not valid YAML: line 3" in p.stderr, p.stderr


def test_relative_paths_are_resolved_against_the_callers_directory(tmp_path):
    d = Daemon(tmp_path, "--paused")
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    weights = tmp_path / "abs" / "weights"  # an absolute path stays as it is
    weights.mkdir(parents=True)
    spec = dict(TINY, data={"path": "train.bin"}, checkpoint={"dir": "../ck"},
                model={"weights_path": str(weights), "config_path": "sub/config.json"},
                lora={"adapter_path": "adapters/a"})
    (work / "sub" / "job.json").write_text(json.dumps(spec))
    for f in ("train.bin", "data/x.bin", "sub/config.json"):  # inputs that exist, seen from the caller
        (work / f).parent.mkdir(parents=True, exist_ok=True)
        (work / f).write_bytes(b"")
    (work / "adapters" / "a").mkdir(parents=True)
    try:
        p = _ftctl_in(work, d, "submit", "sub/job.json", "--set", "data.path=data/x.bin")
        assert p.returncode == 0, p.stderr
        s = get(d, p.stdout.strip())["spec"]
        assert s["data"]["path"] == str(work / "data" / "x.bin")  # --set paths too
        assert s["checkpoint"]["dir"] == str(tmp_path / "ck")
        assert s["model"] == {"weights_path": str(weights), "config_path": str(work / "sub" / "config.json")}
        assert s["lora"]["adapter_path"] == str(work / "adapters" / "a")
    finally:
        d.stop()


def test_a_missing_input_is_refused_at_submit_not_after_the_queue(tmp_path):
    # Without --user-root (the single-user default of scripts/run.sh) a data file that is not there
    # was accepted, waited its turn in the queue, and only then failed the job.
    d = Daemon(tmp_path, "--paused")
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.json").write_text(json.dumps(dict(TINY, data={"path": "train.bin"}, checkpoint={"dir": "ck"})))
    try:
        p = _ftctl_in(work, d, "submit", "job.json")
        assert p.returncode == 3, (p.stdout, p.stderr)
        assert f'INVALID_ARGUMENT: spec.data.path "{work / "train.bin"}" does not exist; give an existing file' \
            in p.stderr, p.stderr
        p = _ftctl_in(work, d, "submit", "job.json", "--set", 'model.weights_path="w"', "--set", 'data.path=""')
        assert p.returncode == 3 and f'spec.model.weights_path "{work / "w"}" does not exist' in p.stderr, p.stderr
        assert json.loads(ftctl(d, "list", "-o", "json").stdout) == []  # nothing was queued
        (work / "train.bin").write_bytes(b"\0" * 4096)  # once it exists (the output ck/ need not)
        p = _ftctl_in(work, d, "submit", "job.json")
        assert p.returncode == 0, p.stderr
    finally:
        d.stop()


def test_list_newest_first_limit_name_and_columns(tmp_path):
    d = Daemon(tmp_path, "--paused")
    try:
        ids = [submit(d, dict(TINY, steps=1), "--name", n) for n in ("sweep-1", "sweep-2", "other", "sweep-3")]
        rows = json.loads(ftctl(d, "list", "-o", "json").stdout)
        assert [r["id"] for r in rows] == ids[::-1]  # newest first by default
        assert [r["id"] for r in json.loads(ftctl(d, "list", "--oldest-first", "-o", "json").stdout)] == ids
        assert [r["id"] for r in json.loads(ftctl(d, "list", "--limit", "2", "-o", "json").stdout)] == ids[:1:-1]
        named = json.loads(ftctl(d, "list", "--name", "sweep-*", "--limit", "2", "-o", "json").stdout)
        assert [r["name"] for r in named] == ["sweep-3", "sweep-2"]
        assert [r["id"] for r in json.loads(ftctl(d, "list", "--name", "other", "-o", "json").stdout)] == [ids[2]]
        table = ftctl(d, "list").stdout.splitlines()
        assert table[0].split() == ["ID", "NAME", "STATE", "REASON", "KIND", "STEP", "LOSS", "AGE", "DURATION", "PRI",
                                    "OWNER", "GPU"], table[0]
        assert table[1].startswith(ids[3])
    finally:
        d.stop()


def test_output_formats_and_json_integers_are_numbers(tmp_path, daemon):
    import yaml
    job = submit(daemon, dict(TINY, steps=2), "--name", "fmt")
    assert ftctl(daemon, "wait", job, timeout=300).returncode == 0
    as_json = json.loads(ftctl(daemon, "get", job, "-o", "json").stdout)
    for key in ("created_unix_ms", "started_unix_ms", "finished_unix_ms"):
        assert isinstance(as_json[key], int) and as_json[key] > 0, (key, as_json[key])
    assert as_json["spec"]["steps"] == 2 and as_json["last_step"]["step"] == 2
    as_yaml = yaml.safe_load(ftctl(daemon, "get", job, "-o", "yaml").stdout)
    assert as_yaml == as_json
    listed = yaml.safe_load(ftctl(daemon, "list", "-o", "yaml").stdout)
    assert listed == json.loads(ftctl(daemon, "list", "-o", "json").stdout) and listed[0]["id"] == job
    text = ftctl(daemon, "get", job).stdout
    assert "duration:" in text, text
    events = [json.loads(l) for l in ftctl(daemon, "watch", job, "-o", "json").stdout.splitlines()]
    assert all(isinstance(e["seq"], int) for e in events)
    p = ftctl(daemon, "get", job, "-o", "text")
    assert p.returncode == 64 and "table" in p.stderr, p.stderr


def test_cancel_takes_several_ids(tmp_path):
    d = Daemon(tmp_path, "--paused")
    try:
        a, b = submit(d, dict(TINY, steps=1)), submit(d, dict(TINY, steps=1))
        p = ftctl(d, "cancel", a, "j-999999", b)
        assert p.returncode == 3, p.stderr  # one of them failed, the others were cancelled
        assert "NOT_FOUND" in p.stderr and "j-999999" in p.stderr
        assert [l.split()[:2] for l in p.stdout.splitlines()] == [[a, "CANCELLED"], [b, "CANCELLED"]]
        assert get(d, a)["state"] == get(d, b)["state"] == "CANCELLED"
    finally:
        d.stop()


def test_bad_flag_values_are_named_with_what_is_allowed():
    # CLI11's own refusals printed "Value -1 not in range 0.000000 to 1797693134862315708145..." and
    # "Check jsn value in {json->1,table->0,yaml->2} OR {1,0,2} FAILED".
    env = dict(os.environ, FTD_ADDR=f"127.0.0.1:{free_port()}")  # refused before any connection
    for args, line in ((["list", "--limit", "-1"], '--limit: must be a whole number >= 0 (got "-1")'),
                       (["list", "-o", "jsn"], '--output: must be one of table, json, yaml (got "jsn")'),
                       (["--timeout", "0", "get", "j-1"], '--timeout: must be a number > 0 (got "0")'),
                       (["logs", "--tail", "ten", "j-1"], '--tail: must be a whole number >= 0 (got "ten")')):
        p = subprocess.run([str(FTCTL), *args], capture_output=True, text=True, timeout=10, env=env)
        cmd = next(a for a in args if a in ("list", "get", "logs"))
        assert p.returncode == 64 and p.stderr == f"ftctl: {line}; ftctl {cmd} --help lists the flags\n", p.stderr
    p = subprocess.run([str(FTCTL), "list", "-o", "YAML", "--limit", "0"], capture_output=True, text=True, timeout=10,
                       env=env)
    assert p.returncode == 3 and "UNAVAILABLE" in p.stderr, p.stderr  # accepted: it went on to connect


def test_version_did_you_mean_and_completion():
    p = subprocess.run([str(FTCTL), "--version"], capture_output=True, text=True, timeout=10)
    assert p.returncode == 0 and p.stdout.startswith("ftctl "), (p.stdout, p.stderr)
    p = subprocess.run([str(FTCTL), "lsit"], capture_output=True, text=True, timeout=10)
    assert p.returncode == 64 and 'unknown command "lsit"; did you mean "list"?' in p.stderr, p.stderr
    p = subprocess.run([str(FTCTL), "list", "--limt", "3"], capture_output=True, text=True, timeout=10)
    assert p.returncode == 64 and 'did you mean "--limit"?' in p.stderr, p.stderr
    # bash completes commands, flags and flag values from the script ftctl prints
    script = subprocess.run([str(FTCTL), "completion", "bash"], capture_output=True, text=True, timeout=10).stdout

    def complete(*words):
        line = " ".join(f"'{w}'" for w in words)
        out = subprocess.run(["bash", "-c", f'{script}\nCOMP_WORDS=(ftctl {line}); COMP_CWORD={len(words)}; _ftctl; '
                              'printf "%s\\n" "${COMPREPLY[@]}"'], capture_output=True, text=True, timeout=10)
        assert out.returncode == 0, out.stderr
        return set(out.stdout.split())

    assert complete("can") == {"cancel"}
    assert complete("list", "--li") == {"--limit"}
    assert complete("--addr", "h:1", "get", "-o", "y") == {"yaml"}
    zsh = subprocess.run([str(FTCTL), "completion", "zsh"], capture_output=True, text=True, timeout=10)
    assert zsh.returncode == 0 and "bashcompinit" in zsh.stdout


def help_text(*command):
    p = subprocess.run([str(FTCTL), *command, "--help"], capture_output=True, text=True, timeout=10)
    assert p.returncode == 0, p.stderr
    return p.stdout


def help_flags(text):
    """The flags a CLI11 help text lists ("-o,--output" gives both spellings)."""
    flags = set()
    for spelled in re.findall(r"^  (-[-\w,]+)", text.split("Options:")[1].split("Subcommands:")[0], re.M):
        flags.update(spelled.split(","))
    return flags


def help_subcommands(text):
    return set(re.findall(r"^  ([a-z][\w-]*) ", text.split("Subcommands:")[1], re.M)) if "Subcommands:" in text else set()


def test_completion_completes_what_the_cli_takes(tmp_path):
    """The completion script offers, at each point of a command line, what ftctl's own --help says
    it takes there: the subcommands, the flags of the command reached (and the global ones), a flag's
    values where a value is expected (and never flag names there), files where a file is."""
    script = subprocess.run([str(FTCTL), "completion", "bash"], capture_output=True, text=True, timeout=10).stdout
    (tmp_path / "job.json").write_text("{}")

    def complete(line):
        words = line.split(" ")  # the last one is being typed ("" after a space)
        quoted = " ".join("'" + w + "'" for w in words)
        out = subprocess.run(["bash", "-c", f'{script}\nCOMP_WORDS=(ftctl {quoted}); COMP_CWORD={len(words)}; _ftctl; '
                              'printf "%s\\n" "${COMPREPLY[@]}"'], capture_output=True, text=True, timeout=10,
                             cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        return set(out.stdout.split())

    top = help_text()
    global_flags = help_flags(top)
    # Every command, and the commands below it, walked from the help texts.
    pending, seen = [[c] for c in help_subcommands(top)], 0
    while pending:
        path = pending.pop()
        text = help_text(*path)
        subs = help_subcommands(text)
        assert complete(" ".join(path) + " -") == help_flags(text) | global_flags, path
        if subs:
            assert complete(" ".join(path) + " ") == subs, path
            pending += [path + [s] for s in subs]
        seen += 1
    assert seen >= 20
    # What a user typed and got nothing, or flag names, for.
    assert complete("--context lab list --st") == {"--state"}
    assert complete("admin ") == help_subcommands(help_text("admin")) == {"token", "audit"}
    assert complete("completion ") == {"bash", "zsh"}
    for line in ("prune --older-than ", "logs j-1 --tail ", "--context ", "--timeout 3 list --limit ", "submit --set "):
        assert not any(w.startswith("-") for w in complete(line)), line
    assert complete("list --state s") == {"succeeded"}
    assert complete("--context lab submit j") == {"job.json"}
    assert complete("--ca-file j") == {"job.json"}
