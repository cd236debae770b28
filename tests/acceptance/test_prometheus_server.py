"""The shipped Prometheus rules, run by the real thing: Debian's ``promtool`` checks and unit-tests
them, and a real Prometheus server scrapes real workers and evaluates every shipped recording
rule and alert on what they export. A real Pushgateway receives a ``worker --once`` run.

Prometheus, promtool and the Pushgateway come from Debian's packages (``.ci/run`` installs them);
without them these tests fail under ``CI=true`` and are skipped elsewhere.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import upgrade
from tests.support import ROOT
from tests.support.factories import make_repository, make_trace
from tests.support.judge_server import start_process

# The real-system stage (Prometheus, promtool and the Pushgateway).
pytestmark = pytest.mark.realsystem

RULES = ROOT / "deploy" / "prometheus" / "recalltrace-rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "recalltrace-rules.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "recalltrace.json"
MODEL = "openai/gpt-4o-mini"


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (apt-get install prometheus prometheus-pushgateway)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: Callable[[], Any], what: str, timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except OSError as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def worker_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECALLTRACE_", "OTEL_"))}
    env["OPENAI_API_KEY"] = "test-key"
    return env


def new_database(path: Path) -> str:
    url = f"sqlite:///{path}"
    upgrade(url)
    return url


def store_traces(url: str, metrics: list[str], apps: dict[str, list[str]], count: int = 25) -> None:
    """``count`` traces per app, whose reference ids are ``apps[app]``."""
    repo = make_repository(create_engine_from_url(url), metrics=metrics)
    for app, reference_ids in apps.items():
        repo.write_traces(
            [make_trace(app_name=app, reference_context_ids=reference_ids) for _ in range(count)]
        )
    repo.dispose()


def seeded_database(path: Path, metrics: list[str], apps: dict[str, list[str]]) -> str:
    url = new_database(path)
    store_traces(url, metrics, apps)
    return url


def start_worker(url: str, *extra: str) -> tuple[subprocess.Popen[str], int]:
    command = [sys.executable, "-m", "recalltrace", "worker", "--database-url", url]
    command += ["--prometheus-port", "0", "--poll-interval", "0.2", "--no-progress", *extra]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=worker_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        match = re.search(r"Prometheus metrics on port (\d+)", line)
        if match:
            return process, int(match.group(1))
        assert line or process.poll() is None, "the worker exited before serving metrics"
    raise AssertionError("the worker did not report its scrape port")


class Prometheus:
    """A real Prometheus server on a free loopback port."""

    def __init__(self, tmp: Path, targets: list[int], pushgateway: str | None = None) -> None:
        shutil.copy(RULES, tmp / RULES.name)
        scrapes: list[dict[str, Any]] = [
            {
                "job_name": "recalltrace_worker",
                "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in targets]}],
            }
        ]
        if pushgateway is not None:
            # As the Pushgateway's documentation asks: keep the job and instance pushed.
            scrapes.append(
                {
                    "job_name": "pushgateway",
                    "honor_labels": True,
                    "static_configs": [{"targets": [pushgateway.split("://", 1)[1]]}],
                }
            )
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [RULES.name],
            "scrape_configs": scrapes,
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
        self.port = free_port()
        self.process = subprocess.Popen(
            [
                tool("prometheus"),
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: self.get("/-/ready"), "Prometheus to start")

    def get(self, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as reply:
            return str(reply.read().decode())

    def query(self, expr: str) -> list[dict[str, Any]]:
        answer = json.loads(self.get("/api/v1/query?" + urllib.parse.urlencode({"query": expr})))
        assert answer["status"] == "success", answer
        return list(answer["data"]["result"])

    def numbers(self, expr: str) -> list[float]:
        """The values of ``expr``, or nothing while any of them is not a number yet."""
        values = [float(sample["value"][1]) for sample in self.query(expr)]
        return [] if any(v != v for v in values) else values

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def shipped_rules() -> tuple[list[str], dict[str, str]]:
    """The recording rules' names and the alerts' expressions of the shipped file."""
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    records = [r["record"] for g in groups for r in g["rules"] if "record" in r]
    alerts = {r["alert"]: r["expr"] for g in groups for r in g["rules"] if "alert" in r}
    return records, alerts


def test_promtool_checks_and_unit_tests_the_shipped_rules() -> None:
    promtool = tool("promtool")
    checked = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    records, alerts = shipped_rules()
    assert f"SUCCESS: {len(records) + len(alerts)} rules found" in checked.stdout
    tested = subprocess.run(
        [promtool, "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # Every alert is exercised by the unit tests.
    test_text = RULE_TESTS.read_text(encoding="utf-8")
    for alert in alerts:
        assert f"alertname: {alert}" in test_text, alert


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel target, with Grafana's variables as a user's
    "All" selection and a one-hour range would fill them."""
    document = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    queries = []
    for panel in document["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", "1m").replace("$__range", "1h")
            queries.append((panel["title"], expr.replace("$metric", ".*").replace("$app", ".*")))
    return queries


def test_the_dashboard_reads_only_series_that_exist() -> None:
    from tests.integration.test_worker_prometheus import documented_series

    records, _ = shipped_rules()
    known = documented_series() | set(records) | {"up"}
    document = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert document["uid"] == "recalltrace"
    for title, expr in dashboard_queries():
        # Label matchers and grouping clauses hold label names, not series; a name followed
        # by "(" is a function.
        bare = re.sub(r"\{[^}]*\}", "", expr)
        bare = re.sub(r"\b(by|without)\s*\([^)]*\)", "", bare)
        names = set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", bare))
        series = {re.sub(r"_(bucket|sum|count)$", "", n) for n in names}
        assert series, (title, expr)
        assert series <= known | {n + "_total" for n in known}, (title, series - known)


@pytest.fixture
def judge_url() -> Iterator[str]:
    process, url = start_process("--latency", "0.01")
    yield url
    process.terminate()
    process.wait(timeout=10)


def test_a_real_prometheus_evaluates_every_shipped_rule_on_real_workers(
    tmp_path: Path, judge_url: str
) -> None:
    # Worker A scores two apps: support-bot's retrieval never finds its reference (recall 0),
    # docs-search's always does (recall 1); its judge answers. Worker B's judge has nothing
    # listening: it pauses, and its jobs stay due (lag). Traffic arrives once Prometheus
    # watches, as in production (a rate needs the counters to move while scraped).
    scored_url = new_database(tmp_path / "a.db")
    paused_url = new_database(tmp_path / "b.db")
    nobody = free_port()
    workers = [
        start_worker(scored_url, "--judge-model", MODEL, "--judge-api-base", judge_url),
        start_worker(
            paused_url,
            *("--judge-model", MODEL, "--judge-api-base", f"http://127.0.0.1:{nobody}/v1"),
            *("--judge-timeout", "2", "--judge-max-retries", "0"),
        ),
    ]
    prom_dir = tmp_path / "prometheus"
    prom_dir.mkdir()
    prometheus = Prometheus(prom_dir, [port for _, port in workers])
    try:
        wait_for(
            lambda: len(prometheus.query('up{job="recalltrace_worker"} == 1')) == 2,
            "both workers scraped",
        )
        # A series is born with its first score, and rate() reads increases only: the first
        # few requests of each app create the series, the rest move them while scraped.
        apps = {"support-bot": ["doc_missing"], "docs-search": ["doc_0"]}
        both = ["id_based_context_recall", "judge_context_recall"]
        store_traces(scored_url, both, apps, count=3)
        wait_for(lambda: len(prometheus.query("rag_context_recall_count")) >= 4, "the series born")
        time.sleep(2)
        store_traces(scored_url, both, apps, count=25)
        store_traces(paused_url, ["judge_context_recall"], {"batch": ["doc_0"]})
        records, alerts = shipped_rules()
        for record in records:
            wait_for(lambda record=record: prometheus.query(record), f"recording rule {record}")

        low = wait_for(
            lambda: prometheus.numbers(
                'rag:context_recall:mean5m{rag_app="support-bot",'
                'rag_metric="id_based_context_recall"}'
            ),
            "support-bot's mean",
        )
        assert low == [0.0]
        high = wait_for(
            lambda: prometheus.numbers(
                'rag:context_recall:mean5m{rag_app="docs-search",'
                'rag_metric="id_based_context_recall"}'
            ),
            "docs-search's mean",
        )
        assert high == [1.0]
        cost = prometheus.query("rag:judge_cost_usd:per_hour")
        assert any(float(s["value"][1]) > 0 for s in cost), cost

        # The alerts, as Prometheus evaluates them (pending until their `for` has passed).
        recall_low = wait_for(
            lambda: prometheus.query('ALERTS{alertname="RecalltraceRecallLow"}'), "RecallLow"
        )
        assert {(s["metric"]["rag_app"], s["metric"]["rag_metric"]) for s in recall_low} == {
            ("support-bot", "id_based_context_recall")
        }
        paused = wait_for(
            lambda: prometheus.query('ALERTS{alertname="RecalltraceJudgePaused"}'),
            "JudgePaused",
        )
        assert {s["metric"]["alertstate"] for s in paused} == {"firing"}
        assert {s["metric"]["gen_ai_request_model"] for s in paused} == {"gpt-4o-mini"}
        # The rest evaluate (no error) and hold what the data says: one failure-free run, lag
        # still under the threshold, workers up.
        for name in ("RecalltraceScoringLag", "RecalltraceFailureRatioHigh"):
            assert prometheus.query(alerts[name]) == [], name
        assert prometheus.query(alerts["RecalltraceNoWorkerUp"]) == []
        assert prometheus.query("rag:worker_jobs:failed_ratio1h")
        assert all(
            float(s["value"][1]) == 0.0
            for s in prometheus.query("rag:worker_jobs:failed_ratio1h")
            if s["value"][1] != "NaN"
        )

        # Every query of the shipped dashboard runs, and shows data.
        for title, expr in dashboard_queries():
            assert prometheus.query(expr), (title, expr)

        # Every worker stopped: the no-worker alert's expression fires.
        for process, _ in workers:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
        none_up = wait_for(
            lambda: prometheus.query(alerts["RecalltraceNoWorkerUp"]), "NoWorkerUp's expression"
        )
        assert [float(s["value"][1]) for s in none_up] == [1.0]
    finally:
        for process, _ in workers:
            if process.poll() is None:
                process.kill()
                process.wait()
        prometheus.stop()


@pytest.fixture
def pushgateway(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        # Debian's build persists every group to one file under /var/lib by default: each
        # test's gateway starts empty instead.
        [
            tool("prometheus-pushgateway"),
            f"--web.listen-address=127.0.0.1:{port}",
            f"--persistence.file={tmp_path / 'pushgateway.data'}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: urllib.request.urlopen(url + "/-/ready", timeout=2).status == 200, "gateway")
    yield url
    process.terminate()
    process.wait(timeout=30)


def test_a_once_run_pushes_what_it_left_behind_to_a_real_pushgateway(
    tmp_path: Path, pushgateway: str
) -> None:
    url = seeded_database(
        tmp_path / "cron.db", ["id_based_context_recall"], {"support-bot": ["doc_0"]}
    )
    command = [sys.executable, "-m", "recalltrace", "worker", "--once", "--database-url", url]
    run = subprocess.run(
        [*command, "--pushgateway", pushgateway, "--no-progress"],
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr
    assert f"pushed metrics to the Pushgateway at {pushgateway}" in run.stdout
    with urllib.request.urlopen(pushgateway + "/metrics", timeout=5) as reply:
        text = reply.read().decode()
    host = socket.gethostname()

    def sample(name: str, *labels: str) -> float:
        for line in text.splitlines():
            if line.startswith(name + "{") and all(label in line for label in labels):
                assert 'job="recalltrace_worker"' in line and f'instance="{host}"' in line
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"{name} {labels} not pushed")

    assert sample("rag_worker_jobs_total", 'rag_job_outcome="scored"') == 25
    assert sample("rag_worker_jobs_total", 'rag_job_outcome="failed"') == 0
    # The queue as the run left it (empty), not as it found it (25 due).
    assert sample("rag_queue_depth", 'rag_job_state="due"', "id_based_context_recall") == 0
    assert sample("push_time_seconds") > 0

    # A gateway that cannot be reached: the scores are stored, the run says so and exits 5.
    closed = f"http://127.0.0.1:{free_port()}"
    failed = subprocess.run(
        [*command, "--pushgateway", closed, "--no-progress"],
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert failed.returncode == 5, failed.stderr
    said = [line for line in failed.stderr.splitlines() if "Pushgateway" in line]
    assert len(said) == 1 and said[0].startswith(
        f"exit 5: could not push metrics to the Pushgateway at {closed}: "
    )
    assert "Traceback" not in failed.stderr


def test_cron_runs_pushed_to_a_real_pushgateway_sum_in_a_real_prometheus(
    tmp_path: Path, pushgateway: str
) -> None:
    """Four ``--once --pushgateway`` runs of 30 jobs each: a push replaces the gateway's group,
    so per-run counters would read 30 after every run and ``increase()`` would see almost
    nothing; running totals make Prometheus sum the runs as it would one process's counters."""
    prom_dir = tmp_path / "prometheus"
    prom_dir.mkdir()
    prometheus = Prometheus(prom_dir, [], pushgateway=pushgateway)
    url = new_database(tmp_path / "cron.db")
    scored = (
        'rag_worker_jobs_total{job="recalltrace_worker",rag_job_outcome="scored",'
        'rag_metric="id_based_context_recall"}'
    )
    try:
        # The group's first push: a series is born with it, and increase() counts from there
        # (the run pushes zeros first, seen only when a scrape falls inside the run).
        born = subprocess.run(
            [sys.executable, "-m", "recalltrace", "worker", "--once", "--database-url", url,
             "--pushgateway", pushgateway, "--no-progress"],
            cwd=ROOT, env=worker_env(), capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert born.returncode == 0, born.stderr
        wait_for(lambda: prometheus.numbers(scored) == [0.0], "the group born")
        for run in range(1, 5):
            store_traces(url, ["id_based_context_recall"], {"support-bot": ["doc_0"]}, count=30)
            done = subprocess.run(
                [sys.executable, "-m", "recalltrace", "worker", "--once", "--database-url", url,
                 "--pushgateway", pushgateway, "--no-progress"],
                cwd=ROOT, env=worker_env(), capture_output=True, text=True, timeout=180,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            wait_for(
                lambda run=run: prometheus.numbers(scored) == [30.0 * run],
                f"run {run} ({prometheus.query(scored)})",
            )
        window = f"{scored}[10m]"
        assert prometheus.numbers(f"max_over_time({window}) - min_over_time({window})") == [120]
        (increase,) = prometheus.numbers(f"increase({window})")
        # increase() extrapolates a little past the first and last samples; it no longer
        # misses the runs (per-run counters gave 21.6 of 120 here).
        assert 115 <= increase <= 135, increase
    finally:
        prometheus.stop()


def test_the_compose_stack_refers_to_files_that_exist_and_commands_that_parse(
    tmp_path: Path,
) -> None:
    """No Docker engine runs here: the compose file is checked for what can go wrong without
    one (missing files, a worker command the CLI refuses, a Prometheus config promtool
    rejects, ports open beyond loopback)."""
    from recalltrace.cli import build_parser

    deploy = ROOT / "deploy"
    compose = yaml.safe_load((deploy / "compose.yml").read_text(encoding="utf-8"))
    services = compose["services"]
    assert set(services) == {"postgres", "worker", "prometheus", "grafana"}
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (deploy / source).exists(), (name, source)
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)
    script = services["worker"]["command"][-1]
    for line in script.split("&&"):
        words = line.split()
        if words[:2] == ["exec", "recalltrace"]:
            words = words[1:]
        if words[:1] == ["recalltrace"]:
            build_parser().parse_args(words[1:])  # raises SystemExit on a refused flag
    assert "recalltrace worker --prometheus-host 0.0.0.0 --prometheus-port 9464" in script

    # The compose Prometheus config, checked by promtool with its rule file beside it.
    config = yaml.safe_load((deploy / "prometheus" / "prometheus.yml").read_text("utf-8"))
    assert config["scrape_configs"][0]["job_name"] == "recalltrace_worker"
    shutil.copy(RULES, tmp_path / RULES.name)
    config["rule_files"] = [str(tmp_path / RULES.name)]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    checked = subprocess.run(
        [tool("promtool"), "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
