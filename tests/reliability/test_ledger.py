"""The ledger: every request the tracer sees ends stored, sampled out, dropped with a reason, or
still pending, and the counts say so through ``recalltrace.ledger()``, the OpenTelemetry
metrics and one line at exit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

import recalltrace
from tests.support.ledger import LedgerCheck

ROOT = Path(__file__).resolve().parents[2]


def _points(reader: InMemoryMetricReader, name: str) -> list[tuple[dict[str, Any], float]]:
    data = reader.get_metrics_data()
    found: list[tuple[dict[str, Any], float]] = []
    for resource_metrics in data.resource_metrics if data else ():
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.name == name:
                    for point in metric.data.data_points:
                        found.append((dict(point.attributes or {}), getattr(point, "value", 0)))
    return found


def test_the_ledger_balances_against_the_database(database_url: str) -> None:
    app = f"ledger-{database_url.split(':', 1)[0]}"
    reader = InMemoryMetricReader()
    check = LedgerCheck()
    recalltrace.configure(
        database_url=database_url,
        tracer_provider=TracerProvider(),
        meter_provider=MeterProvider(metric_readers=[reader]),
        service_name="ledger",
        sample_rate=0.5,
        flush_interval=0.05,
        shutdown_timeout=10.0,
    )

    @recalltrace.retrieval
    def search(query: str) -> list[dict[str, Any]]:
        return [{"id": f"d{i}", "content": f"Document {i}."} for i in range(5)]

    @recalltrace.rag(app)
    def answer(question: str) -> str:
        search(question)
        return "ok"

    try:
        for i in range(200):
            answer(f"question {i}")
        counts = check.assert_matches_database(database_url, apps=[app])
        assert counts.seen == 200
        assert counts.stored > 0 and counts.sampled_out > 0
        assert counts.stored + counts.sampled_out == 200
        assert not counts.dropped
        assert recalltrace.ledger().unaccounted == 0
        stored = {
            attrs.get("rag.app"): value for attrs, value in _points(reader, "rag.traces.stored")
        }
        assert stored[app] == counts.stored
    finally:
        recalltrace.shutdown(10.0)


APP_SCRIPT = textwrap.dedent(
    """
    import logging
    import recalltrace
    from opentelemetry.sdk.trace import TracerProvider

    logging.basicConfig(level=logging.WARNING)
    recalltrace.configure(
        # A port nothing listens on: every write fails as "database unavailable".
        database_url="postgresql+psycopg://postgres@127.0.0.1:9/nothing",
        tracer_provider=TracerProvider(),
        service_name="exit-line",
        flush_interval=0.05,
        shutdown_timeout=1.0,
        handle_signals=False,
    )

    @recalltrace.rag("exit-line")
    def answer(question):
        return "ok"

    for i in range(7):
        answer(f"q{i}")
    print("ledger", recalltrace.ledger().seen, flush=True)
    """
)


@pytest.mark.parametrize("multiprocessing", [False, True], ids=["plain", "multiprocessing"])
def test_what_was_not_stored_is_said_in_one_line_at_exit(
    tmp_path: Path, multiprocessing: bool
) -> None:
    """Also in a process that imported multiprocessing, whose own exit path drains the queue
    before ``atexit`` does: the line is said once."""
    script = tmp_path / "app.py"
    script.write_text(("import multiprocessing.util\n" if multiprocessing else "") + APP_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "ledger 7" in done.stdout
    lines = [line for line in done.stderr.splitlines() if "recalltrace at exit" in line]
    assert lines == [
        "WARNING:recalltrace.tracer:recalltrace at exit: 7 request(s) seen: 0 stored, 0 "
        "sampled out, 7 dropped (shutdown 7), 0 pending"
    ], done.stderr
