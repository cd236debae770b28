"""A worker SIGKILLed mid-judge: the judge answers it had received are not paid for again.

A real worker process scores ``llm_context_recall`` with the reference's claims asked apart
(two judge calls a job: the claims, then their verdicts) against the scripted judge server over
HTTP. The server answers the claims at once and the verdicts slowly, so the worker is always
killed with jobs half judged: their first answer received, their second in flight. It is killed
five times, restarted each time, then run until nothing is due.

What the server answered is counted by request: an answer it sent twice for the same request
was paid for twice. Before the answers were stored, every killed job paid again for its claims
(17% of the answers in this run); now a restarted job reads them back. A request the server
never answered (the kill cut it off) is sent again by the restarted job; those re-sent calls are
counted too, and reported, but no store can save them: nothing came back to store.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from sqlalchemy import Engine, select

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.judge_calls import JudgeCallStore
from recalltrace.storage.models import JobStatus, Score
from tests.reliability.helpers import job_statuses, python_env, wait_until
from tests.support import ROOT
from tests.support.factories import make_repository, make_trace
from tests.support.judge_server import JudgeServer, Reply, auto_answer, detect_task

pytestmark = [pytest.mark.realsystem]

METRIC = "llm_context_recall"
TRACES = 100
KILLS = 5
CONCURRENCY = 8
LEASE_S = 1.0
SLOW_S = 1.5  # the verdicts' latency: long enough that every kill lands mid-judge

_WORKER = """
import logging, sys
from recalltrace.scorers._judge import JudgeConfig
from recalltrace.scorers.worker import Worker, WorkerOptions
import asyncio

url, judge_url, keep = sys.argv[1], sys.argv[2], sys.argv[3] == "keep"
once = len(sys.argv) > 4
options = WorkerOptions(
    database_url=url,
    metrics=["{metric}"],
    judge=JudgeConfig(model="openai/test-judge", api_base=judge_url, api_key="test"),
    scorer_options={{"{metric}": {{"split_claims": True}}}},
    concurrency={concurrency},
    lease_s={lease},
    poll_interval_s=0.1,
    maintenance_interval_s=0.5,
    listen=False,
)
worker = Worker(options)
if not keep:
    worker._answers = None  # the worker as it was before answers were stored
    worker._writer._after_written = None
try:
    stats = asyncio.run(worker.run(once=once))
finally:
    worker.close()
print("replayed", stats.judge_answers_replayed, flush=True)
"""


class CountingServer(JudgeServer):
    """The scripted server, also counting the answers it sent in full, by request."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.answered_by_request: Counter[str] = Counter()
        self._answers_lock = threading.Lock()

    async def _respond(
        self, request: web.Request, body: dict[str, Any], reply: Reply
    ) -> web.StreamResponse:
        response = await super()._respond(request, body, reply)
        with self._answers_lock:
            self.answered_by_request[request_key(body)] += 1
        return response


def request_key(body: dict[str, Any]) -> str:
    return json.dumps(body, sort_keys=True)


def slow_verdicts(request: dict[str, Any]) -> Reply:
    reply = auto_answer(request)
    if detect_task(request) == "claim_verdicts":
        reply.delay = SLOW_S
    return reply


def start_worker(script: Path, url: str, judge_url: str, keep: bool, *extra: str) -> Any:
    return subprocess.Popen(
        [sys.executable, str(script), url, judge_url, "keep" if keep else "old", *extra],
        cwd=ROOT,
        env=python_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_kills(engine: Engine, url: str, tmp_path: Path, *, keep: bool) -> dict[str, Any]:
    script = tmp_path / "worker.py"
    script.write_text(
        textwrap.dedent(_WORKER).format(metric=METRIC, concurrency=CONCURRENCY, lease=LEASE_S)
    )
    repo = make_repository(engine, metrics=[METRIC])
    repo.write_traces(
        [
            make_trace(reference=f"Fact {i}: Paris is the capital of France. It is old.")
            for i in range(TRACES)
        ]
    )
    server = CountingServer(handler=slow_verdicts)
    with server:
        kills = 0
        for _ in range(KILLS):
            proc = start_worker(script, url, server.base_url, keep)
            try:
                before = len(server.answered_by_request)
                # Mid-judge: claims answered, verdicts in flight for a full set of jobs.
                wait_until(
                    lambda b=before: (
                        server.in_flight >= CONCURRENCY // 2 and len(server.answered_by_request) > b
                    ),
                    120,
                    "the worker to judge",
                )
                time.sleep(0.3)
                assert server.in_flight > 0
                proc.send_signal(signal.SIGKILL)
                kills += 1
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.communicate(timeout=30)
        time.sleep(LEASE_S + 0.5)  # the killed workers' leases expire
        last = start_worker(script, url, server.base_url, keep, "once")
        out, err = last.communicate(timeout=600)
        assert last.returncode == 0, err[-3000:]
        received = Counter(request_key(body) for body in server.requests)
        answered = Counter(server.answered_by_request)
    with engine.connect() as conn:
        rows = conn.execute(select(Score.trace_id, Score.metric, Score.status)).all()
    keys = [(r.trace_id, r.metric) for r in rows]
    assert len(keys) == len(set(keys)) == TRACES, "every job scored exactly once"
    assert all(r.status == "scored" for r in rows)
    assert job_statuses(engine) == {JobStatus.DONE: TRACES}
    unique = len(received)
    answered_total = sum(answered.values())
    return {
        "kills": kills,
        "unique_requests": unique,
        "received": sum(received.values()),
        "resent": sum(received.values()) - unique,
        "answered": answered_total,
        "answered_again": answered_total - len(answered),
        "left_stored": JudgeCallStore(engine).count(),
        "last_run": out.strip().splitlines()[-1] if out.strip() else "",
    }


def _check(result: dict[str, Any]) -> None:
    print(f"judge calls after {KILLS} SIGKILLs mid-judge: {result}")
    assert result["kills"] == KILLS
    share = result["answered_again"] / result["answered"]
    assert share <= 0.02, result
    # What was re-sent is only what was in flight when a worker died.
    assert result["resent"] <= KILLS * CONCURRENCY, result
    # Every finished job's answers are forgotten once its score is stored (a kill between the
    # two could leave one batch's behind, for the retention to delete).
    assert result["left_stored"] <= KILLS * CONCURRENCY, result


@pytest.mark.postgres
def test_answers_survive_sigkills_on_postgres(
    pg_engine: Engine, postgres_url: str, tmp_path: Path
) -> None:
    _check(run_kills(pg_engine, postgres_url, tmp_path, keep=True))


def test_answers_survive_sigkills_on_sqlite(sqlite_url: str, tmp_path: Path) -> None:
    engine = create_engine_from_url(sqlite_url)
    try:
        _check(run_kills(engine, sqlite_url, tmp_path, keep=True))
    finally:
        engine.dispose()


@pytest.mark.slow
@pytest.mark.postgres
def test_without_stored_answers_the_same_kills_pay_again(
    pg_engine: Engine, postgres_url: str, tmp_path: Path
) -> None:
    """The control: the same run with the answers not stored pays again for what the killed
    jobs had received, so the kills above do land mid-judge."""
    result = run_kills(pg_engine, postgres_url, tmp_path, keep=False)
    print(f"without stored answers: {result}")
    assert result["answered_again"] / result["answered"] > 0.02, result
