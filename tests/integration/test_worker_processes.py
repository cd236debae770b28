"""Worker processes as deployed: several at once on Postgres, killed, stopped, scraped.

The judge is the scripted OpenAI-compatible server in its own process; workers are the
installed ``recalltrace worker`` command.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

from recalltrace.storage.models import JobStatus, Score, ScoringJob
from recalltrace.storage.repository import Repository
from tests.support import ROOT
from tests.support.clocks import HANG_GUARD_S
from tests.support.factories import make_repository, make_trace
from tests.support.judge_server import start_process

# The real-system stage (worker processes killed and stopped).
pytestmark = [pytest.mark.postgres, pytest.mark.realsystem]


@pytest.fixture
def judge_url() -> Iterator[str]:
    proc, url = start_process("--latency", "0.05")
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def slow_judge_url() -> Iterator[str]:
    # Answers after ten minutes: no job sent to it is done within a test, however slow the
    # host; only the worker's own stopping ends its calls.
    proc, url = start_process("--latency", "600")
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def worker_cmd(url: str, judge_url: str | None, *extra: str) -> list[str]:
    cmd = [
        sys.executable, "-m", "recalltrace", "worker", "--database-url", url,
        "--poll-interval", "0.2", "--no-progress",
    ]  # fmt: skip
    if judge_url:
        cmd += ["--judge-model", "openai/test-judge", "--judge-api-base", judge_url]
    return cmd + list(extra)


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["OPENAI_API_KEY"] = "test-key"
    env.pop("RECALLTRACE_DATABASE_URL", None)
    return env


def spawn(cmd: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        cmd, cwd=ROOT, env=worker_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_for_running(repo: Repository, at_least: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with repo.engine.connect() as conn:
            running = conn.scalar(
                select(func.count())
                .select_from(ScoringJob)
                .where(ScoringJob.status == JobStatus.RUNNING)
            )
        if running and running >= at_least:
            return int(running)
        time.sleep(0.1)
    raise AssertionError(f"fewer than {at_least} jobs were running after {timeout} s")


def counts(repo: Repository) -> tuple[dict[str, int], int, int]:
    with repo.engine.connect() as conn:
        statuses = {
            status: n
            for status, n in conn.execute(
                select(ScoringJob.status, func.count()).group_by(ScoringJob.status)
            )
        }
        scores = conn.scalar(select(func.count()).select_from(Score)) or 0
        distinct = (
            conn.scalar(
                select(func.count()).select_from(
                    select(Score.trace_id, Score.metric).distinct().subquery()
                )
            )
            or 0
        )
    return statuses, int(scores), int(distinct)


def scored_from(output: str) -> int:
    match = re.search(r"scored (\d+), skipped (\d+), failed (\d+)", output)
    assert match, output
    return sum(int(g) for g in match.groups())


def test_four_worker_processes_score_every_job_exactly_once(
    pg_engine: Any, judge_url: str, postgres_url: str
) -> None:
    metrics = ["non_llm_context_recall", "id_based_context_recall", "judge_context_recall"]
    repo = make_repository(pg_engine, metrics=metrics)
    traces = [
        make_trace(
            contexts=2,
            context_chars=60,
            reference_contexts=["Paris is the capital."],
            reference_context_ids=["doc_1"],
        )
        for _ in range(2000)
    ]
    for start in range(0, len(traces), 500):
        repo.write_traces(traces[start : start + 500])
    args = ["--once", "--concurrency", "32", "--batch-size", "32"]
    for m in metrics:
        args += ["--metric", m]
    procs = [spawn(worker_cmd(postgres_url, judge_url, *args)) for _ in range(4)]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=400)
        assert proc.returncode == 0, err[-2000:]
        outputs.append(out)
    statuses, scores, distinct = counts(repo)
    assert statuses == {JobStatus.DONE: 6000}
    assert scores == distinct == 6000
    per_worker = [scored_from(out) for out in outputs]
    # Each job was scored by exactly one process: the processes' own counts add up.
    assert sum(per_worker) == 6000, per_worker
    assert sum(1 for n in per_worker if n > 0) >= 2, per_worker


def test_sigkill_mid_batch_loses_nothing_and_doubles_nothing(
    pg_engine: Any, slow_judge_url: str, judge_url: str, postgres_url: str
) -> None:
    repo = make_repository(pg_engine, metrics=["judge_context_recall"])
    repo.write_traces([make_trace() for _ in range(30)])
    victim = spawn(
        worker_cmd(
            postgres_url,
            slow_judge_url,
            "--metric",
            "judge_context_recall",
            "--concurrency",
            "8",
            "--lease",
            "2",
        )
    )
    try:
        # 8 jobs in flight plus 4 claimed ahead (half the concurrency), all under lease.
        held = wait_for_running(repo, 12)
        assert held == 12
        time.sleep(0.5)
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
    statuses, scores, _ = counts(repo)
    assert statuses.get(JobStatus.RUNNING) == 12  # its leases are still held by the dead worker
    time.sleep(2.5)  # let the dead worker's leases expire
    survivor = spawn(
        worker_cmd(postgres_url, judge_url, "--metric", "judge_context_recall", "--once")
    )
    out, err = survivor.communicate(timeout=120)
    assert survivor.returncode == 0, err[-2000:]
    assert scored_from(out) == 30 - scores
    statuses, scores, distinct = counts(repo)
    assert statuses == {JobStatus.DONE: 30}
    assert scores == distinct == 30


def test_sigterm_exits_cleanly_and_gives_leases_back(
    pg_engine: Any, slow_judge_url: str, postgres_url: str
) -> None:
    repo = make_repository(pg_engine, metrics=["judge_context_recall"])
    repo.write_traces([make_trace() for _ in range(6)])
    proc = spawn(
        worker_cmd(
            postgres_url,
            slow_judge_url,
            "--metric",
            "judge_context_recall",
            "--grace-period",
            "0.5",
        )
    )
    wait_for_running(repo, 6)
    proc.send_signal(signal.SIGTERM)
    # The judge would answer after ten minutes: the worker ends (its grace period is half a
    # second) well before this guard only if it stops waiting for the calls.
    out, err = proc.communicate(timeout=HANG_GUARD_S)
    assert proc.returncode == 0, err[-2000:]
    assert "given back 6" in out
    statuses, scores, _ = counts(repo)
    assert statuses == {JobStatus.QUEUED: 6}
    assert scores == 0
    with repo.engine.connect() as conn:
        holders = conn.scalars(select(ScoringJob.locked_by).distinct()).all()
    assert holders == [None]


def test_prometheus_endpoint_serves_the_recall_histogram(
    pg_engine: Any, judge_url: str, postgres_url: str
) -> None:
    repo = make_repository(pg_engine, metrics=["id_based_context_recall", "llm_context_recall"])
    repo.write_traces(
        [
            make_trace(app_name="shop-assistant", reference_context_ids=["doc_1", "x"])
            for _ in range(5)
        ]
    )
    proc = spawn(worker_cmd(postgres_url, judge_url, "--prometheus-port", "0"))
    try:
        assert proc.stdout is not None
        port = None
        for _ in range(5):
            line = proc.stdout.readline()
            match = re.search(r"Prometheus metrics on port (\d+)", line)
            if match:
                port = int(match.group(1))
                break
        assert port, "the worker did not report its Prometheus port"
        deadline = time.monotonic() + 60
        families: dict[str, Any] = {}
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                body = resp.read().decode()
            families = {f.name: f for f in text_string_to_metric_families(body)}
            recall = families.get("rag_context_recall_ratio") or families.get("rag_context_recall")
            if recall is not None:
                counts_by_metric = {
                    s.labels.get("rag_metric"): s.value
                    for s in recall.samples
                    if s.name.endswith("_count")
                }
                if (
                    counts_by_metric.get("id_based_context_recall") == 5
                    and counts_by_metric.get("llm_context_recall") == 5
                ):
                    break
            time.sleep(0.3)
        else:
            raise AssertionError(f"recall histogram incomplete; families: {sorted(families)}")
        buckets = {
            s.labels["le"]
            for s in recall.samples
            if s.name.endswith("_bucket")
            and s.labels.get("rag_metric") == "id_based_context_recall"
        }
        assert {"0.0", "0.5", "1.0", "+Inf"} <= buckets
        sums = {s.labels["rag_metric"]: s.value for s in recall.samples if s.name.endswith("_sum")}
        assert sums["id_based_context_recall"] == pytest.approx(2.5)
        sample = next(s for s in recall.samples if s.name.endswith("_count"))
        assert sample.labels["rag_app"] == "shop-assistant"
        assert any(name.startswith("gen_ai_client_token_usage") for name in families)
        assert any(name.startswith("rag_queue_depth") for name in families)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0
