"""Postgres failing under a running app and a running worker.

The app (a real process tracing at a steady rate) and a worker process (``recalltrace worker``)
use the session's own database; their connections are found by ``application_name`` and killed
with ``pg_terminate_backend`` again and again, and for a few seconds the database refuses new
connections altogether (``ALLOW_CONNECTIONS false``) — an outage of this database only, the shared
server keeps running. Afterwards: every call of the app returned its own result, every trace the
app's queue accepted is stored, the ones it could not hold are counted exactly, and the worker,
never restarted, scores every stored trace once.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from recalltrace.storage.models import JobStatus, Trace
from tests.reliability.helpers import (
    Background,
    ConnectionKiller,
    job_statuses,
    last_json,
    score_keys,
    spawn,
    unfinished,
    wait_until,
    with_application_name,
    worker_args,
)

# The real-system stage (Postgres fault rounds).
pytestmark = [pytest.mark.postgres, pytest.mark.realsystem]

METRICS = ["non_llm_context_recall", "id_based_context_recall"]
APP_NAME = "rt_reliability_app"
WORKER_NAME = "rt_reliability_worker"


def run_outage_scenario(
    pg_engine: Any,
    postgres_url: str,
    tmp_path: Path,
    *,
    rate: float,
    seconds: float,
    max_queue_size: int,
    faults: list[tuple[str, float]],
    app_options: tuple[str, ...] = (),
) -> dict[str, Any]:
    app_url = with_application_name(postgres_url, APP_NAME)
    worker_url = with_application_name(postgres_url, WORKER_NAME)
    ids_file = tmp_path / "ids.txt"
    metric_args = [arg for metric in METRICS for arg in ("--metric", metric)]
    worker = spawn(worker_args(worker_url, "--poll-interval", "0.2", "--lease", "10", *metric_args))
    killer = ConnectionKiller(postgres_url, (APP_NAME, WORKER_NAME))
    try:
        assert worker.stdout is not None
        first = worker.stdout.readline()
        assert "scoring" in first, first + (worker.stderr.read() if worker.stderr else "")
        app = spawn(
            [
                "-m", "tests.reliability.app_process", "--database-url", app_url,
                "--rate", str(rate), "--seconds", str(seconds), "--ids-file", str(ids_file),
                "--max-queue-size", str(max_queue_size), "--flush-timeout", "60",
                *app_options,
            ]
        )  # fmt: skip

        assert app.stdout is not None
        first = app.stdout.readline()  # the app is configured and starts calling
        assert first.strip() == "STARTED", first + (app.stderr.read() if app.stderr else "")

        def inject() -> None:
            time.sleep(0.5)
            for kind, length in faults:
                if kind == "outage":
                    killer.outage(length)
                elif kind == "blips":
                    killer.blips(length, every=0.25)
                else:
                    time.sleep(length)

        injector = Background(inject)
        injector.start()
        out, err = app.communicate(timeout=180)
        injector.join_checked(60)
        assert app.returncode == 0, err[-3000:]
        summary = last_json(out)
        assert killer.killed + killer.outages > 0, "no fault was injected"

        # The app: every call returned its own result, nothing raised, the flush completed.
        assert summary["wrong"] == 0 and summary["errors"] == 0, summary
        assert summary["flushed"], summary
        issued = [line for line in ids_file.read_text().splitlines() if line]
        assert len(issued) == summary["calls"] == len(set(issued))
        with pg_engine.connect() as conn:
            stored = set(conn.scalars(select(Trace.trace_id)))
        dropped = summary["dropped"]
        # Nothing the queue accepted was lost: the only drops are the ones refused at the bound.
        assert set(dropped) <= {"queue_full"}, dropped
        assert stored <= set(issued)
        assert len(stored) == len(issued) - dropped.get("queue_full", 0), (
            len(stored),
            len(issued),
            dropped,
        )

        # The worker went through the same faults without a restart and scores everything once.
        wait_until(
            lambda: unfinished(pg_engine, METRICS) == 0, 60, "the worker to finish every job"
        )
        assert worker.poll() is None, "the worker exited"
        statuses = job_statuses(pg_engine, METRICS)
        assert statuses == {JobStatus.DONE: len(stored) * len(METRICS)}, statuses
        keys = [(t, m) for t, m, _ in score_keys(pg_engine) if m in METRICS]
        assert len(keys) == len(set(keys))
        assert set(keys) == {(t, m) for t in stored for m in METRICS}
        summary["stored"] = len(stored)
        summary["killed"] = killer.killed
        return summary
    finally:
        killer.close()
        worker.terminate()
        _out, worker_err = worker.communicate(timeout=60)
        assert worker.returncode == 0, worker_err[-3000:]


def test_killed_connections_and_an_outage_lose_no_accepted_trace(
    pg_engine: Any, postgres_url: str, tmp_path: Path
) -> None:
    summary = run_outage_scenario(
        pg_engine,
        postgres_url,
        tmp_path,
        rate=150,
        seconds=9,
        max_queue_size=2048,
        faults=[("blips", 2.0), ("outage", 3.0), ("blips", 2.0)],
    )
    assert summary["dropped"] == {}
    assert summary["stored"] == summary["calls"]


def test_an_outage_past_the_queue_bound_counts_every_drop(
    pg_engine: Any, postgres_url: str, tmp_path: Path
) -> None:
    summary = run_outage_scenario(
        pg_engine,
        postgres_url,
        tmp_path,
        rate=150,
        seconds=8,
        max_queue_size=200,
        faults=[("outage", 4.0)],
    )
    # 4 s at 150 requests/s is about 600 traces against a bound of 200.
    assert summary["dropped"].get("queue_full", 0) > 100, summary


def test_an_outage_past_the_retry_budget_loses_no_accepted_trace(
    pg_engine: Any, postgres_url: str, tmp_path: Path
) -> None:
    # Two attempts 0.1 s apart: the budget is spent early in a 3-second outage.
    run_outage_scenario(
        pg_engine,
        postgres_url,
        tmp_path,
        rate=100,
        seconds=5,
        max_queue_size=2048,
        faults=[("outage", 3.0)],
        app_options=("--max-write-attempts", "2", "--retry-backoff", "0.1"),
    )
