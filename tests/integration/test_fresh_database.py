"""A fresh Postgres database nobody ran ``recalltrace db upgrade`` on.

Records must not be dropped with ``relation "traces" does not exist``: they are kept (bounded)
with one line saying what to run, and stored once the schema exists; ``auto_migrate`` creates
it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from sqlalchemy import func, select

import recalltrace
from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import upgrade
from recalltrace.storage.models import Trace
from tests.support.postgres import empty_database as empty_database_on_server
from tests.support.tracer_helpers import dropped


@pytest.fixture
def empty_database() -> Iterator[str]:
    with empty_database_on_server("rt_fresh") as url:
        yield url


@recalltrace.rag
def answer(question: str) -> str:
    return "ok"


def stored(url: str) -> int:
    engine = create_engine_from_url(url)
    with engine.connect() as conn:
        count = int(conn.scalar(select(func.count()).select_from(Trace)) or 0)
    engine.dispose()
    return count


def test_records_wait_for_the_schema_and_say_what_to_run(
    empty_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    before = dropped()
    recalltrace.configure(
        database_url=empty_database,
        tracer_provider=TracerProvider(),
        flush_interval=0.05,
        retry_backoff=0.05,
        max_write_attempts=2,
    )
    try:
        with caplog.at_level(logging.WARNING, logger="recalltrace"):
            for index in range(10):
                answer(f"q{index}")
            assert recalltrace.flush(1.5) is False
        lines = [r.getMessage() for r in caplog.records if "db upgrade" in r.getMessage()]
        assert len(lines) == 1, [r.getMessage() for r in caplog.records]
        assert dropped() == before  # kept, not dropped after max_write_attempts
        upgrade(empty_database)
        assert recalltrace.flush(15)
        assert stored(empty_database) == 10
        assert dropped() == before
    finally:
        recalltrace.shutdown(5)


def test_auto_migrate_creates_the_schema(empty_database: str) -> None:
    recalltrace.configure(
        database_url=empty_database,
        tracer_provider=TracerProvider(),
        flush_interval=0.05,
        auto_migrate=True,
    )
    try:
        answer("q")
        assert recalltrace.flush(15)
        assert stored(empty_database) == 1
    finally:
        recalltrace.shutdown(5)
