"""A fresh Postgres database nobody ran ``recalltrace db upgrade`` on.

By default the tracer creates the schema in a database that has none of it (under the
migration lock), and never upgrades an older one. With ``auto_migrate=False`` records must not
be dropped with ``relation "traces" does not exist``: they are kept (bounded) with one line
saying what to run, stored once the schema exists, and a process that exits first says what to
run in its exit line. ``auto_migrate=True`` creates or upgrades it.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from sqlalchemy import func, select

import recalltrace
from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import current_revision, head_revision, upgrade
from recalltrace.storage.models import Trace
from tests.support import ROOT
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


def _said(caplog: pytest.LogCaptureFixture, words: str) -> bool:
    return any(words in r.getMessage() for r in caplog.records)


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
        auto_migrate=False,
    )
    try:
        with caplog.at_level(logging.WARNING, logger="recalltrace"):
            for index in range(10):
                answer(f"q{index}")
            # The first write fails once the storage process has started (seconds on a busy
            # host); the records stay queued however long it takes.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not _said(caplog, "db upgrade"):
                recalltrace.flush(0.5)
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


def test_a_fresh_database_gets_the_schema_by_default(empty_database: str) -> None:
    recalltrace.configure(
        database_url=empty_database, tracer_provider=TracerProvider(), flush_interval=0.05
    )
    try:
        for index in range(3):
            answer(f"q{index}")
        assert recalltrace.flush(30)
        assert stored(empty_database) == 3
        assert current_revision(empty_database) == head_revision()
    finally:
        recalltrace.shutdown(5)


def test_an_older_schema_is_not_upgraded_without_auto_migrate(empty_database: str) -> None:
    upgrade(empty_database, "0007")
    recalltrace.configure(
        database_url=empty_database, tracer_provider=TracerProvider(), flush_interval=0.05
    )
    try:
        answer("q")
        recalltrace.flush(5)
    finally:
        recalltrace.shutdown(2)
    assert current_revision(empty_database) == "0007"


SHORT_SCRIPT = textwrap.dedent(
    """
    import recalltrace

    recalltrace.configure(sample_rate=1.0, flush_interval=0.05)


    @recalltrace.rag("short-script")
    def answer(question):
        return "ok"


    answer("one")
    answer("two")
    recalltrace.flush()
    """
)


def test_a_script_that_may_not_create_the_schema_names_the_command_at_exit(
    empty_database: str, tmp_path: Path
) -> None:
    script = tmp_path / "short.py"
    script.write_text(SHORT_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    env.update(
        RECALLTRACE_DATABASE_URL=empty_database,
        RECALLTRACE_AUTO_MIGRATE="false",
        # Long enough for the first write to fail on a loaded machine (the exit line can only
        # name the missing tables once a write found them missing).
        RECALLTRACE_FLUSH_TIMEOUT="15",
        RECALLTRACE_SHUTDOWN_TIMEOUT="1",
        PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
    )
    run = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    lines = run.stderr.splitlines()
    drop = [line for line in lines if "2 dropped (shutdown 2)" in line]
    assert len(drop) == 1, run.stderr
    # The lines at exit say what to run, not only that records were dropped.
    assert any("recalltrace db upgrade" in line for line in lines), run.stderr
    assert stored_or_none(empty_database) is None
    assert current_revision(empty_database) is None


def stored_or_none(url: str) -> int | None:
    """Stored traces, or None when the database has no traces table."""
    from sqlalchemy import inspect

    engine = create_engine_from_url(url)
    try:
        if not inspect(engine).has_table("traces"):
            return None
    finally:
        engine.dispose()
    return stored(url)


def test_processes_starting_together_on_a_fresh_database_create_it_once(
    empty_database: str, tmp_path: Path
) -> None:
    """Four traced processes start at once on a database nobody migrated: the schema is
    created once, under the migration lock, and every process stores its two requests."""
    script = tmp_path / "short.py"
    script.write_text(SHORT_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    env.update(
        RECALLTRACE_DATABASE_URL=empty_database,
        PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
    )
    runs = [
        subprocess.Popen(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    for run in runs:
        _out, err = run.communicate(timeout=180)
        assert run.returncode == 0, err
        assert err == "", err
    assert stored(empty_database) == 8
    assert current_revision(empty_database) == head_revision()


def test_a_role_that_may_not_create_tables_keeps_the_records(
    empty_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The tracer's role may write but not create tables (Postgres 15's default for a role that
    does not own the database): creating the schema is refused, the records are kept with one
    line saying what to run, and stored once an owner ran the upgrade."""
    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    from tests.support.postgres import admin_engine

    role = "rt_clock_writer"
    admin = admin_engine()
    with admin.connect() as conn:
        if not conn.scalar(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}):
            conn.execute(text(f"CREATE ROLE {role} LOGIN"))
    admin.dispose()
    as_role = make_url(empty_database).set(username=role).render_as_string(hide_password=False)
    before = dropped()
    recalltrace.configure(
        database_url=as_role,
        tracer_provider=TracerProvider(),
        flush_interval=0.05,
        retry_backoff=0.05,
        max_write_attempts=2,
    )
    try:
        with caplog.at_level(logging.WARNING, logger="recalltrace"):
            for index in range(3):
                answer(f"q{index}")
            deadline = time.monotonic() + 60  # the storage process starts first (busy host)
            while time.monotonic() < deadline and not _said(caplog, "could not create"):
                recalltrace.flush(0.5)
            assert recalltrace.flush(2) is False
        refused = [r.getMessage() for r in caplog.records if "could not create" in r.getMessage()]
        assert len(refused) == 1 and "recalltrace db upgrade" in refused[0], refused
        assert dropped() == before
        upgrade(empty_database)
        owner = create_engine_from_url(empty_database)
        with owner.begin() as conn:
            conn.execute(text(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}"))
            conn.execute(text(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}"))
        owner.dispose()
        assert recalltrace.flush(30)
        assert stored(empty_database) == 3
        assert dropped() == before
    finally:
        recalltrace.shutdown(5)
