"""deploy/ against real servers. A real Prometheus (the Debian package's binary, on its own port and
storage) scrapes a real ftd running real jobs with the config of deploy/prometheus/prometheus.yml and
the rules of deploy/prometheus/alerts.yml; every PromQL expression of the Grafana dashboard and of the
alert rules is evaluated on it. promtool checks the config and rules and runs the rules' unit tests;
systemd-analyze verifies the unit, whose ExecStart line starts the real ftd. Every metric name and
label the deploy files use is checked against docs/metrics.md. Every wait is bounded."""
import json
import re
import shlex
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from ftdservice import FTD, OOM_SCRIPT, TINY, Daemon, free_port, ftctl, get, stop_process, submit, wait_for
from ftdtest import BUILD, ROOT

DEPLOY = ROOT / "deploy"
PROM_YML = DEPLOY / "prometheus" / "prometheus.yml"
ALERTS_YML = DEPLOY / "prometheus" / "alerts.yml"
ALERTS_TEST_YML = DEPLOY / "prometheus" / "alerts_test.yml"
UNIT = DEPLOY / "systemd" / "ftd.service"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "ftd.json"
GRAFANA_DS = DEPLOY / "grafana" / "provisioning" / "datasources" / "ftd-prometheus.yml"
GRAFANA_DASH_PROVIDER = DEPLOY / "grafana" / "provisioning" / "dashboards" / "ftd.yml"


def tool(name):
    """A binary of the Debian package `prometheus`; missing is a failure: scripts/setup.sh installs it."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"`{name}` is not on PATH: install the Debian package `prometheus` "
                    "(scripts/setup.sh does: apt-get install prometheus)")
    return path


# ---------------------------------------------------------------------------------------------
# docs/metrics.md and the names used by the deploy files

def catalog():
    """{metric name: set of labels} from docs/metrics.md, with a histogram's _bucket/_sum/_count."""
    names = {}
    for name, typ, labels in re.findall(r"^\| `(ftd_\w+)` \| (\w+) \| [^|]* \| ([^|]*) \|",
                                        (ROOT / "docs" / "metrics.md").read_text(), re.M):
        ls = {x.strip() for x in labels.split(",") if re.fullmatch(r"\s*\w+\s*", x)}
        if typ == "histogram":
            names.update({name + "_bucket": ls | {"le"}, name + "_sum": ls, name + "_count": ls})
        else:
            names[name] = ls
    assert "ftd_jobs" in names and "ftd_job_queue_wait_seconds_bucket" in names, "docs/metrics.md table not parsed"
    return names


KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}
GROUPING = r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)"


def names_in(expr):
    """(metric names, label names) a PromQL expression refers to (a lexer good enough for ours)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    labels = set()
    for m in re.finditer(r"\{([^}]*)\}", s):
        labels |= set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", m.group(1)))
    s = re.sub(r"\{[^}]*\}", " ", s)
    for m in re.finditer(GROUPING, s):
        labels |= set(re.findall(r"\w+", m.group(1)))
    s = re.sub(GROUPING, " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\boffset\s+\w+", " ", s)
    metrics = set()
    for m in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?", s):
        if m.group(2) is None and m.group(1) not in KEYWORDS:
            metrics.add(m.group(1))
    return metrics, labels


def dashboard_targets():
    """(panel title, target) of every query of the dashboard, rows' nested panels included."""
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                out.append((p["title"], t))
            walk(p.get("panels", []))

    walk(json.loads(DASHBOARD.read_text())["panels"])
    return out


def alert_rules():
    return [r for g in yaml.safe_load(ALERTS_YML.read_text())["groups"] for r in g["rules"]]


def grafana_expr(expr, kernel_set):
    """A dashboard query as Grafana sends it: its variables substituted."""
    return expr.replace("$__rate_interval", "1m").replace("$kernel_set", kernel_set)


def unit_settings():
    text = re.sub(r"\\\n\s*", " ", UNIT.read_text())
    settings = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            k, v = line.split("=", 1)
            settings.setdefault(k.strip(), []).append(v.strip())
    return settings


# ---------------------------------------------------------------------------------------------
# Static checks: promtool, systemd-analyze, the catalog

def test_promtool_checks_config_and_rules_and_runs_the_rule_unit_tests():
    promtool = tool("promtool")
    out = {}
    for args in (["check", "config", str(PROM_YML)], ["check", "rules", str(ALERTS_YML)],
                 ["test", "rules", str(ALERTS_TEST_YML)]):
        p = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, f"promtool {' '.join(args)}:\n{p.stdout}\n{p.stderr}"
        out[args[0] + " " + args[1]] = p.stdout + p.stderr
    assert "SUCCESS: 1 rule files found" in out["check config"]  # the config loads alerts.yml
    assert f"SUCCESS: {len(alert_rules())} rules found" in out["check rules"]


def test_deploy_readme_lists_every_alert():
    row = next(line for line in (ROOT / "deploy" / "README.md").read_text().splitlines()
               if line.startswith("| `prometheus/alerts.yml` |"))
    listed = set(re.findall(r"\bFtd\w+", row))
    assert listed == {r["alert"] for r in alert_rules()}, sorted(listed ^ {r["alert"] for r in alert_rules()})


def test_deploy_files_use_only_catalog_metrics_and_labels():
    cat = catalog()
    cat["up"] = {"job", "instance"}  # Prometheus' own series per scrape target (FtdDown)
    exprs = [(f"dashboard panel {title!r}", t["expr"]) for title, t in dashboard_targets()]
    exprs += [(f"alert {r['alert']}", r["expr"]) for r in alert_rules()]
    assert len(exprs) > 20
    used = set()
    for where, expr in exprs:
        metrics, labels = names_in(expr)
        assert metrics, f"{where}: no metric found in {expr!r}"
        unknown = metrics - set(cat)
        assert not unknown, f"{where}: metrics not in docs/metrics.md: {sorted(unknown)}"
        used |= metrics
        allowed = set().union(*(cat[m] for m in metrics)) | {"le"}
        if where.startswith("alert"):
            allowed |= {"job", "instance"}  # Prometheus' target labels, to alert per ftd host
        bad = labels - allowed
        assert not bad, f"{where}: labels {sorted(bad)} are not labels of {sorted(metrics)} in docs/metrics.md"
    # the dashboard's template variable queries a catalog metric and label too
    tv = {v["name"]: v for v in json.loads(DASHBOARD.read_text())["templating"]["list"]}
    assert tv["kernel_set"]["definition"] == "label_values(ftd_profile_device_seconds_per_step, kernel_set)"
    # what the dashboard and the alerts must cover
    for m in ("ftd_jobs", "ftd_job_submissions_total", "ftd_job_completions_total", "ftd_job_queue_wait_seconds_bucket",
              "ftd_job_run_duration_seconds_bucket", "ftd_worker_tokens_per_second", "ftd_worker_step_time_seconds",
              "ftd_worker_loss", "ftd_worker_mfu_ratio", "ftd_worker_peak_memory_bytes", "ftd_worker_power_watts",
              "ftd_worker_joules_per_token", "ftd_worker_energy_joules_total", "ftd_profile_device_seconds_per_step"):
        assert m in used, m


def test_dashboard_and_grafana_provisioning_are_well_formed():
    d = json.loads(DASHBOARD.read_text())
    assert d["title"] == "ftd" and d["uid"] == "ftd"
    panels = d["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        for t in p.get("targets", []):
            assert t["datasource"] == {"type": "prometheus", "uid": "${datasource}"} and t["refId"], p["title"]
    quantiles = [t["expr"] for _, t in dashboard_targets() if "histogram_quantile" in t["expr"]]
    assert any("ftd_job_queue_wait_seconds_bucket" in e for e in quantiles)
    assert any("ftd_job_run_duration_seconds_bucket" in e for e in quantiles)
    stacked = [p for p in panels if "ftd_profile_device_seconds_per_step" in json.dumps(p.get("targets", []))
               and p.get("repeat") == "kernel_set"]
    assert stacked and stacked[0]["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    ds = yaml.safe_load(GRAFANA_DS.read_text())["datasources"][0]
    assert ds["type"] == "prometheus" and ds["url"].endswith(":9090")
    prov = yaml.safe_load(GRAFANA_DASH_PROVIDER.read_text())["providers"][0]
    assert prov["type"] == "file" and prov["options"]["path"]


def test_systemd_unit_verifies_and_its_execstart_runs_ftd(tmp_path):
    s = unit_settings()
    argv = shlex.split(s["ExecStart"][0])
    flags = dict(a[2:].split("=", 1) for a in argv[1:])
    assert s["User"] == ["ftd"] and s["StateDirectory"] == ["ftd"] and flags["data-dir"] == "/var/lib/ftd"
    assert s["Restart"] == ["on-failure"] and s["KillSignal"] == ["SIGTERM"] and s["KillMode"] == ["mixed"]
    drain = float(flags.get("drain-timeout-s", 30))
    assert float(s["TimeoutStopSec"][0]) > drain + 10, "TimeoutStopSec must exceed ftd's --drain-timeout-s"
    assert "PrivateDevices" not in s and any("nvidia" in v for v in s["DeviceAllow"])
    # Prometheus scrapes what the unit serves
    target = yaml.safe_load(PROM_YML.read_text())["scrape_configs"][0]["static_configs"][0]["targets"][0]
    assert target == flags["metrics-listen"]

    # The unit's ExecStart as systemd would run it (binary in this build, loopback ports and data
    # dir of this test): ftd accepts every flag, serves, and exits 0 on the unit's KillSignal
    # within the drain time, so a stop is no "failure" for Restart=on-failure.
    port, mport = free_port(), free_port()
    flags.update({"listen": f"127.0.0.1:{port}", "metrics-listen": f"127.0.0.1:{mport}",
                  "data-dir": str(tmp_path / "state")})
    with open(tmp_path / "ftd.log", "wb") as log:
        proc = subprocess.Popen([str(FTD), *(f"--{k}={v}" for k, v in flags.items())], stdout=log, stderr=log)
        try:
            sock = f"unix:{tmp_path / 'state' / 'ftd.sock'}"  # --socket's default outside systemd
            wait_for(lambda: proc.poll() is not None or ftctl(sock, "list", "--timeout", "1").returncode == 0,
                     20, "ftd started from the unit's ExecStart")
            assert proc.poll() is None, (tmp_path / "ftd.log").read_text()
            urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5).read()
            proc.send_signal(getattr(signal, s["KillSignal"][0]))
            assert proc.wait(timeout=drain + 5) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed (Debian package systemd): unit not verified")
    unit = tmp_path / "ftd.service"  # the unit with ExecStart pointing at this build's ftd
    unit.write_text(UNIT.read_text().replace("/opt/ftd/build/", f"{BUILD.resolve()}/"))
    p = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "ftd.service" not in p.stderr + p.stdout, p.stdout + p.stderr


# ---------------------------------------------------------------------------------------------
# A real Prometheus scraping a real ftd

class Prometheus:
    def __init__(self, tmp, target):
        self.bin = tool("prometheus")
        tmp = Path(tmp)
        tmp.mkdir()
        cfg = yaml.safe_load(PROM_YML.read_text())
        # the deploy config; only the target, the intervals and the rule file's (absolute) path differ
        (ftd_job,) = [sc for sc in cfg["scrape_configs"] if sc["job_name"] == "ftd"]
        (static,) = ftd_job["static_configs"]
        static["targets"] = [target]
        cfg["global"]["scrape_interval"] = cfg["global"]["evaluation_interval"] = "1s"
        assert cfg["rule_files"] == ["alerts.yml"]
        cfg["rule_files"] = [str(ALERTS_YML)]
        self.config = Path(tmp) / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(cfg))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(Path(tmp) / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [self.bin, f"--config.file={self.config}", f"--storage.tsdb.path={Path(tmp) / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=self.log)
        wait_for(self._ready, 60, "Prometheus to be ready")

    def _ready(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited with {self.proc.returncode}:\n{self.read_log()[-3000:]}")
        try:
            return urllib.request.urlopen(f"{self.url}/-/ready", timeout=2).status == 200
        except (urllib.error.URLError, ConnectionError):
            return False

    def read_log(self):
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def api(self, path, **params):
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}"
        try:
            body = urllib.request.urlopen(url, timeout=15).read()
        except urllib.error.HTTPError as e:  # 400/422 carry the error as JSON
            body = e.read()
        return json.loads(body)

    def query(self, expr):
        r = self.api("query", query=expr)
        assert r["status"] == "success", f"{expr!r}: {r.get('errorType')}: {r.get('error')}"
        return r["data"]["result"]

    def value(self, expr):
        """The single value of an instant vector, or None."""
        res = self.query(expr)
        assert len(res) <= 1, res
        return float(res[0]["value"][1]) if res else None

    def stop(self):
        stop_process(self.proc)
        self.log.close()


def active_alerts(prom):
    r = prom.api("alerts")
    assert r["status"] == "success", r
    return {(a["labels"]["alertname"], a["state"]) for a in r["data"]["alerts"]}


def test_prometheus_scrapes_ftd_and_evaluates_every_dashboard_and_alert_expression(tmp_path):
    tool("prometheus")  # fail before starting anything when it is missing
    started = time.time()
    d = Daemon(tmp_path, scripts={"oom-job": OOM_SCRIPT})
    prom = None
    try:
        prom = Prometheus(tmp_path / "prom", f"127.0.0.1:{d.metrics_port}")

        def target_up():
            r = prom.api("targets")
            ts = [t for t in r["data"]["activeTargets"] if t["labels"]["job"] == "ftd"]
            return len(ts) == 1 and ts[0]["health"] == "up"
        wait_for(target_up, 30, "Prometheus to scrape ftd")

        # What the jobs do. A long fine-tune runs until Prometheus has seen it running with
        # throughput, then is cancelled; a short fine-tune and a profile job succeed; one job fails
        # with a (simulated) GPU out-of-memory.
        sel = '{job="ftd", slot="cpu", kernel_set="eager"}'
        long = submit(d, dict(TINY, steps=100000), "--name", "long")
        wait_for(lambda: prom.value('ftd_jobs{job="ftd", state="running"}') == 1
                 and (prom.value(f"ftd_worker_tokens_per_second{sel}") or 0) > 0
                 and (prom.value(f"ftd_worker_loss{sel}") or 0) > 0, 120,
                 "Prometheus to see the long job running with throughput")
        assert ftctl(d, "cancel", long).returncode == 0
        steps = 8
        ft = submit(d, dict(TINY, steps=steps), "--name", "e2e")
        pr = submit(d, dict(TINY, profile={"warmup_steps": 1, "steps": 2}), "--kind", "profile", "--name", "prof")
        oom = submit(d, dict(TINY, steps=3), "--name", "oom-job")
        for job in (long, ft, pr, oom):
            ftctl(d, "wait", job, timeout=300)
        jobs = {j: get(d, j) for j in (long, ft, pr, oom)}
        assert [jobs[j]["state"] for j in (long, ft, pr, oom)] == ["CANCELLED", "SUCCEEDED", "SUCCEEDED", "FAILED"], jobs
        assert jobs[oom]["reason"] == "GPU_OUT_OF_MEMORY"
        assert int(jobs[ft]["last_step"]["step"]) == steps and int(jobs[pr]["last_step"]["step"]) == 3
        assert "last_step" not in jobs[oom] or int(jobs[oom]["last_step"].get("step", 0)) == 0
        # log_every 1: every step is reported, so the counters must add up to the jobs' last steps
        job_steps = sum(int(j.get("last_step", {}).get("step", 0)) for j in jobs.values())
        tokens = job_steps * TINY["batch_size"] * TINY["seq_len"]

        # Prometheus has what the jobs did (and what ftd's own /metrics says).
        want = {
            f"ftd_worker_steps_total{sel}": job_steps,
            f"ftd_worker_tokens_total{sel}": tokens,
            'ftd_job_completions_total{job="ftd", state="succeeded", outcome="succeeded"}': 2,
            'ftd_job_completions_total{job="ftd", state="failed", outcome="gpu_out_of_memory"}': 1,
            'sum(ftd_job_completions_total{job="ftd", state="cancelled"})': 1,
            'sum(ftd_job_completions_total{job="ftd"})': 4,
            'ftd_job_submissions_total{job="ftd", kind="finetune"}': 3,
            'ftd_job_submissions_total{job="ftd", kind="profile"}': 1,
            'ftd_jobs{job="ftd", state="succeeded"}': 2,
            'ftd_jobs{job="ftd", state="failed"}': 1,
            'ftd_jobs{job="ftd", state="cancelled"}': 1,
            'ftd_jobs{job="ftd", state="queued"}': 0,
            'ftd_jobs{job="ftd", state="running"}': 0,
            'ftd_job_queue_wait_seconds_count{job="ftd"}': 4,
            f"ftd_worker_tokens_per_second{sel}": 0,  # the slot is idle again
            f"ftd_worker_loss{sel}": None,  # and the last job's loss is not drawn on as a flat line
            f"ftd_worker_step_time_seconds{sel}": None,
            'ftd_worker_peak_memory_bytes{job="ftd", slot="cpu", kind="host_rss"}': None,
        }
        seen = {}

        def scraped():
            seen.update({q: prom.value(q) for q in want})
            return seen == want
        try:
            wait_for(scraped, 30, "Prometheus to have scraped the jobs' results")
        except AssertionError as e:
            raise AssertionError(f"{e}; want {want}, last seen {seen}") from None
        m = d.metrics()
        assert m[("ftd_worker_steps_total", (("kernel_set", "eager"), ("slot", "cpu")))] == job_steps
        assert m[("ftd_job_completions_total", (("outcome", "gpu_out_of_memory"), ("state", "failed")))] == 1
        # The process series client libraries export by default, and the build.
        assert prom.value('process_open_fds{job="ftd"}') >= 3
        assert 0 < prom.value('process_max_fds{job="ftd"}')
        assert 1 << 20 < prom.value('process_resident_memory_bytes{job="ftd"}') < prom.value('process_virtual_memory_bytes{job="ftd"}')
        assert prom.value('process_cpu_seconds_total{job="ftd"}') > 0
        assert started - 5 < prom.value('process_start_time_seconds{job="ftd"}') < started + 5
        version = re.search(r"project\(ftd VERSION ([0-9.]+)", (ROOT / "CMakeLists.txt").read_text()).group(1)
        [info] = prom.query('ftd_build_info{job="ftd"}')
        assert info["metric"]["version"] == version and info["metric"]["commit"] and float(info["value"][1]) == 1
        assert prom.value('ftd_profile_device_seconds_per_step{job="ftd", category="matmul", kernel_set="eager"}') > 0

        # The rule file loaded: its groups and rules, each evaluated without error.
        groups = yaml.safe_load(ALERTS_YML.read_text())["groups"]

        def rules_healthy():
            r = prom.api("rules")
            got = {g["name"]: g["rules"] for g in r["data"]["groups"]}
            assert set(got) == {g["name"] for g in groups}, got.keys()
            for g in groups:
                assert [x["name"] for x in got[g["name"]]] == [x["alert"] for x in g["rules"]]
                for x in got[g["name"]]:
                    assert x["health"] in ("ok", "unknown") and not x.get("lastError"), x
            return all(x["health"] == "ok" for rs in got.values() for x in rs)
        wait_for(rules_healthy, 30, "every rule to be evaluated")

        # Every expression of the alert rules and of the dashboard evaluates without error; a
        # dashboard query over metrics the jobs produced has data (the NVML ones have none on a CPU).
        # With every job finished, only the out-of-memory condition holds (value: one job).
        for r in alert_rules():
            res = prom.query(r["expr"])
            if r["alert"] == "FtdGpuOutOfMemory":
                assert [float(x["value"][1]) for x in res] == [1.0], res
            else:
                assert res == [], (r["alert"], res)
        kernel_sets = prom.api("label/kernel_set/values", **{"match[]": "ftd_profile_device_seconds_per_step"})["data"]
        assert kernel_sets == ["eager"]
        present = {name for name in catalog() if prom.query(f'count({{__name__="{name}", job="ftd"}})')}
        def panel_result(title, expr, instant):
            if instant:
                return prom.query(expr)
            now = time.time()
            r = prom.api("query_range", query=expr, start=now - 120, end=now, step=2)
            assert r["status"] == "success", f"{title}: {expr!r}: {r.get('error')}"
            return r["data"]["result"]

        for title, t in dashboard_targets():
            for ks in (kernel_sets if "$kernel_set" in t["expr"] else [""]):
                expr = grafana_expr(t["expr"], ks)
                res = panel_result(title, expr, t.get("instant"))
                metrics, _ = names_in(expr)
                if metrics <= present and not res:
                    # rate() needs a second sample of a series born at its first observation; on a
                    # loaded machine that scrape can come a little later
                    wait_for(lambda: panel_result(title, expr, t.get("instant")), 30,
                             f"dashboard panel {title!r} to have data for {expr!r}")

        # The OOM outcome fires at once (its counter series was born at 1, which rate() cannot see).
        wait_for(lambda: ("FtdGpuOutOfMemory", "firing") in active_alerts(prom), 30, "FtdGpuOutOfMemory to fire")
        assert not {n for n, st in active_alerts(prom) if st == "firing"} - {"FtdGpuOutOfMemory"}

        # ftd stops: FtdDown goes pending (it fires after its `for: 2m`).
        d.stop()
        wait_for(lambda: ("FtdDown", "pending") in active_alerts(prom), 30, "FtdDown to go pending")
    finally:
        if prom is not None:
            prom.stop()
        d.stop()


def test_every_catalog_metric_is_checked_by_a_test_besides_this_one():
    """Each ftd_* family of docs/metrics.md is named by some test other than this file's catalog
    checks (a unit test reading the registry, or a service test reading /metrics), so that a family
    a path forgets to move, or moves in another unit, has a test to fail. The process_* families are
    process_metrics_test's; prometheus-cpp's own exposer_* families are not ftd's."""
    base = {re.sub(r"_(bucket|sum|count)$", "", n) for n in catalog()}
    sources = [p for p in (ROOT / "tests" / "python").glob("test_*.py") if p.name != Path(__file__).name]
    sources += [p for d in ("server", "worker", "spec", "client") for p in (ROOT / d).rglob("*_test.cc")]
    texts = [p.read_text() for p in sources]
    missing = sorted(n for n in base if not any(n in t for t in texts))
    assert missing == [], f"no test besides the catalog checks names {missing}"
