"""``recalltrace collect`` on a database that does not hold the schema it writes: it answers
``200`` only for what it can store.

- On a fresh database (no recalltrace tables; Postgres or a new SQLite file) it creates the
  tables before it prints READY, and every export answered ``200`` is stored by the time it
  exits after SIGTERM.
- On a schema at an older revision, or where its role may not create tables, or with a server
  that does not answer, it does not start: one line (naming ``recalltrace db upgrade
  --database-url URL`` where that is the fix, the password hidden) and exit status 2.
- No line it prints suggests an option it does not have (the tracer's ``auto_migrate``).

And Alembic's own INFO lines stay out of an application that only traces, even with its root
logger at INFO; ``recalltrace --verbose db upgrade`` still shows them.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import inspect, text
from sqlalchemy.engine import make_url

from recalltrace.storage.db import create_engine_from_url, redact_url
from recalltrace.storage.migrate import current_revision, head_revision, upgrade
from tests.acceptance.test_collect import start_collect
from tests.support import ROOT
from tests.support.postgres import admin_engine, empty_database

PROTOBUF = "application/x-protobuf"
OLDER = "0007"


@pytest.fixture(params=["postgres", "sqlite"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database nobody migrated: a new Postgres database, or a SQLite file not yet there."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    with empty_database("rt_collect_fresh") as url:
        yield url


def with_password(url: str, password: str = "hunter2-secret") -> str:
    """``url`` with a password (the test server trusts local connections, so it still works)."""
    if url.startswith("sqlite"):
        return url
    return make_url(url).set(password=password).render_as_string(hide_password=False)


def export_body(question: str) -> bytes:
    """One RAG request as OpenInference spans (a chain, its retriever, its model call), encoded
    as an OTLP/protobuf export request."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "python-rag"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("app")
    with tracer.start_as_current_span("answer") as root:
        root.set_attribute("openinference.span.kind", "CHAIN")
        root.set_attribute("input.value", question)
        with tracer.start_as_current_span("search") as retriever:
            retriever.set_attribute("openinference.span.kind", "RETRIEVER")
            retriever.set_attribute("retrieval.documents.0.document.id", "doc-1")
            retriever.set_attribute("retrieval.documents.0.document.content", "the answer")
        with tracer.start_as_current_span("generate") as llm:
            llm.set_attribute("openinference.span.kind", "LLM")
            llm.set_attribute("llm.model_name", "gpt-test")
            llm.set_attribute("llm.output_messages.0.message.content", "ok")
    provider.shutdown()
    return bytes(encode_spans(exporter.get_finished_spans()).SerializeToString())


def stored_questions(url: str) -> list[str]:
    engine = create_engine_from_url(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT user_input FROM traces")).all()
    finally:
        engine.dispose()
    return sorted(row[0] for row in rows)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_collect(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """``collect`` that is expected not to start: it must exit by itself."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    command = [sys.executable, "-m", "recalltrace", "collect", "--listen", "127.0.0.1:0"]
    process = subprocess.Popen(
        [*command, "--database-url", url, *extra],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"collect did not exit by itself: {out}{err}")
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "READY" not in done.stdout, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("recalltrace: error: "), lines
    return lines[0]


def test_collect_on_a_fresh_database_stores_everything_it_answered_200(fresh_url: str) -> None:
    service = start_collect(fresh_url, "--trace-idle", "1")
    try:
        # READY is said once the tables are there, before anything was received.
        assert current_revision(fresh_url) == head_revision()
        answered = []
        for index in range(12):
            question = f"question {index}"
            status, _, body = service.post(export_body(question), PROTOBUF)
            assert status in (200, 503), (status, body)
            if status == 200:
                answered.append(question)
        assert answered
        time.sleep(1.5)  # some are built and stored while it runs, the rest at the stop
    finally:
        err = service.stop()
    assert service.process.returncode == 0, err
    assert "records not stored: 0 (none)" in err, err
    assert "auto_migrate" not in err, err
    created = [line for line in err.splitlines() if "created the recalltrace tables" in line]
    assert len(created) == 1 and redact_url(fresh_url) in created[0], err
    assert stored_questions(fresh_url) == sorted(answered)


def test_collect_refuses_a_schema_at_an_older_revision(fresh_url: str) -> None:
    upgrade(fresh_url, OLDER)
    url = with_password(fresh_url)
    line = one_error_line(run_collect(url))
    assert f"at schema revision {OLDER}" in line, line
    upgrade_command = f"recalltrace db upgrade --database-url {shlex.quote(redact_url(url))}"
    assert f"`{upgrade_command}`" in line, line
    assert "hunter2-secret" not in line
    assert "auto_migrate" not in line
    assert current_revision(fresh_url) == OLDER  # left as it was: not upgraded behind its back


@pytest.mark.postgres
def test_collect_refuses_when_its_role_may_not_create_the_tables() -> None:
    role = "rt_collect_writer"
    admin = admin_engine()
    with admin.connect() as conn:
        if not conn.scalar(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}):
            conn.execute(text(f"CREATE ROLE {role} LOGIN"))
    admin.dispose()
    with empty_database("rt_collect_role") as owner_url:
        url = make_url(owner_url).set(username=role, password="hunter2-secret")
        shown = url.render_as_string(hide_password=True)
        line = one_error_line(run_collect(url.render_as_string(hide_password=False)))
        assert "cannot create the recalltrace tables" in line, line
        assert f"recalltrace db upgrade --database-url '{shown}'" in line, line
        assert "as a role that may create tables" in line, line
        assert "hunter2-secret" not in line
        engine = create_engine_from_url(owner_url)
        try:
            assert inspect(engine).get_table_names() == []
        finally:
            engine.dispose()


def test_collect_does_not_start_on_a_database_that_does_not_answer() -> None:
    url = f"postgresql+psycopg://alice:hunter2-secret@127.0.0.1:{closed_port()}/recalltrace"
    line = one_error_line(run_collect(url, "--database-wait", "0"))
    assert f"cannot reach the database at {redact_url(url)}" in line, line
    assert "collect did not start" in line, line
    assert "hunter2-secret" not in line


@pytest.mark.postgres
def test_a_schema_gone_while_collect_runs_names_no_option_it_lacks() -> None:
    """The tables are dropped under a running collect: what it says names the command to run,
    and no option of the tracer's that collect does not have."""
    with empty_database("rt_collect_gone") as url:
        service = start_collect(url, "--trace-idle", "1", "--stop-timeout", "3")
        try:
            engine = create_engine_from_url(url)
            with engine.begin() as conn:
                conn.execute(text("DROP SCHEMA public CASCADE"))
                conn.execute(text("CREATE SCHEMA public"))
            engine.dispose()
            status, _, _ = service.post(export_body("lost"), PROTOBUF)
            assert status == 200
            time.sleep(3)  # built, then its write finds no tables
        finally:
            err = service.stop()
    assert service.process.returncode == 1, err
    assert "recalltrace db upgrade" in err, err
    assert "auto_migrate" not in err, err
    assert "records not stored: 1" in err, err


TRACING_APP = textwrap.dedent(
    """
    import logging
    import sys

    logging.basicConfig(level=logging.INFO)

    import recalltrace

    recalltrace.configure(database_url=sys.argv[1], sample_rate=1.0, flush_interval=0.05)


    @recalltrace.rag("app")
    def answer(question):
        return "ok"


    answer("one")
    assert recalltrace.flush(60)
    """
)


def test_an_application_that_only_traces_shows_no_alembic_line(fresh_url: str) -> None:
    """The tracer creates the schema (SQLite: it migrates on open; Postgres: a database with
    none of it) in an application whose root logger is at INFO, as Dramatiq's workers set up:
    Alembic's lines are not among the application's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, "-c", TRACING_APP, fresh_url],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert current_revision(fresh_url) == head_revision()
    assert stored_questions(fresh_url) == ["one"]
    alembic = [line for line in run.stderr.splitlines() if "alembic" in line.lower()]
    assert alembic == [], run.stderr


def test_db_upgrade_still_shows_alembic_lines_with_verbose(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'verbose.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    run = subprocess.run(
        [sys.executable, "-m", "recalltrace", "--verbose", "db", "upgrade", "--database-url", url],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "alembic.runtime.migration: Running upgrade  -> 0001" in run.stderr, run.stderr
