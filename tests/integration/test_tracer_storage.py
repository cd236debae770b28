"""The tracer writing to real storage: SQLite files and Postgres (skipped when unreachable,
except under ``CI=true``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

import recalltrace
from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.history import History
from recalltrace.storage.records import ReferenceUpdate
from recalltrace.storage.repository import Repository, TraceNotFound
from tests.support.factories import make_history, make_repository


@pytest.fixture(params=["thread", "process"])
def stored(database_url: str, request: pytest.FixtureRequest) -> Iterator[History]:
    """The tracer writing to ``database_url`` through the real repository, from its writer
    thread or through a storage process (``storage_process``): every test here holds for both."""
    recalltrace.configure(
        database_url=database_url,
        storage_process=request.param == "process",
        tracer_provider=TracerProvider(),
        service_name="integration",
        flush_interval=0.05,
        retry_backoff=0.05,
        reference_wait=5.0,
        shutdown_timeout=5.0,
    )
    engine = create_engine_from_url(database_url)
    yield make_history(engine)
    recalltrace.shutdown(5)
    engine.dispose()


@recalltrace.retrieval
def search(query: str) -> list[dict[str, Any]]:
    return [
        {
            "id": "doc-1",
            "content": "Paris is the capital of France.",
            "score": 0.92,
            "metadata": {"source": "geo.md", "api_key": "k-123"},
        },
        {"id": "doc-2", "content": "France is in Europe.", "score": 0.41},
    ]


@recalltrace.generation(model="judge-free")
def generate(prompt: str) -> dict[str, Any]:
    return {
        "model": "gpt-test",
        "choices": [{"message": {"content": "Paris."}}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 2},
    }


@recalltrace.rag("geo-bot", reference_param="expected")
def answer(question: str, expected: str | None = None) -> str:
    search(question)
    return str(generate(question)["choices"][0]["message"]["content"])


def test_trace_is_stored_with_contexts_metadata_and_scrubbing(stored: History) -> None:
    ids: list[str | None] = []

    @recalltrace.rag("geo-bot")
    def ask(question: str) -> str:
        ids.append(recalltrace.current_trace_id())
        return answer(question)

    assert ask("What is the capital of France? Mail me at ann@example.org") == "Paris."
    assert recalltrace.flush(10)
    (trace_id,) = ids
    assert trace_id is not None
    detail = stored.trace(trace_id)
    assert detail.app_name == "geo-bot"
    assert detail.service_name == "integration"
    assert detail.user_input == "What is the capital of France? Mail me at [REDACTED]"
    assert detail.response == "Paris."
    assert [(c.context_id, c.content, c.score) for c in detail.contexts] == [
        ("doc-1", "Paris is the capital of France.", pytest.approx(0.92)),
        ("doc-2", "France is in Europe.", pytest.approx(0.41)),
    ]
    assert dict(detail.contexts[0].metadata) == {"source": "geo.md", "api_key": "[REDACTED]"}
    assert detail.metadata["llm"] == [
        {"model": "gpt-test", "prompt_tokens": 20, "completion_tokens": 2, "total_tokens": 22}
    ]
    assert "scrubbed email in user_input" in detail.notes
    assert detail.error is False
    assert detail.jobs, "storage created scoring jobs for the trace"


def test_reference_by_argument_and_late_reference(stored: History) -> None:
    ids: list[str | None] = []

    @recalltrace.rag("geo-bot", reference_param="expected")
    def ask(question: str, expected: str | None = None) -> str:
        ids.append(recalltrace.current_trace_id())
        return "Paris."

    ask("capital of France?", expected="Paris")
    ask("capital of Germany?")
    assert recalltrace.flush(10)
    first, second = ids
    assert first is not None and second is not None
    assert stored.trace(first).reference == "Paris"
    assert stored.trace(second).reference is None
    recalltrace.set_reference(
        second,
        reference="Berlin",
        reference_contexts=["Berlin is the capital of Germany."],
        reference_context_ids=["doc-9"],
    )
    assert recalltrace.flush(10)
    detail = stored.trace(second)
    assert detail.reference == "Berlin"
    assert list(detail.reference_contexts or ()) == ["Berlin is the capital of Germany."]
    assert list(detail.reference_context_ids or ()) == ["doc-9"]


def test_many_traces_arrive(stored: History, database_url: str) -> None:
    for i in range(60):
        answer(f"question {i}")
    assert recalltrace.flush(20)
    repository = make_repository(create_engine_from_url(database_url))
    try:
        with pytest.raises(TraceNotFound):
            repository.attach_reference(ReferenceUpdate(trace_id="f" * 32, reference="x"))
    finally:
        repository.dispose()
    inputs = {stored.trace(trace_id).user_input for trace_id in _all_trace_ids(database_url)}
    assert inputs == {f"question {i}" for i in range(60)}


class LostAcknowledgement:
    """The real repository, but the first batch's commit is reported as a failure (the
    connection dropped after COMMIT), so the writer writes that batch again."""

    def __init__(self, repository: Repository) -> None:
        self.repository = repository
        self.calls = 0

    def write_traces(self, records: Any) -> None:
        self.calls += 1
        self.repository.write_traces(records)
        if self.calls == 1:
            raise ConnectionError("connection reset after commit")

    def attach_reference(self, update: ReferenceUpdate) -> int:
        return self.repository.attach_reference(update)


def test_retried_batch_is_stored_once(database_url: str) -> None:
    repository = make_repository(create_engine_from_url(database_url))
    sink = LostAcknowledgement(repository)
    recalltrace.configure(
        sink=sink, tracer_provider=TracerProvider(), flush_interval=0.05, retry_backoff=0.01
    )
    try:
        for i in range(20):
            answer(f"question {i}")
        assert recalltrace.flush(20)
        assert sink.calls >= 2
        assert len(_all_trace_ids(database_url)) == 20
        history = make_history(repository.engine)
        for trace_id in _all_trace_ids(database_url):
            metrics = [job.metric for job in history.trace(trace_id).jobs]
            assert len(metrics) == len(set(metrics)), "no duplicate scoring jobs"
    finally:
        recalltrace.shutdown(5)
        repository.dispose()


def _all_trace_ids(url: str) -> list[str]:
    from sqlalchemy import text

    engine = create_engine_from_url(url)
    try:
        with engine.connect() as conn:
            return [row[0] for row in conn.execute(text("SELECT trace_id FROM traces"))]
    finally:
        engine.dispose()


def test_environment_only_short_lived_process_writes_at_exit(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'from-env.db'}"
    script = textwrap.dedent(
        """
        import recalltrace

        @recalltrace.rag("batch-job")
        def answer(question):
            return "done"

        answer("nightly question")
        """
    )
    env = {**os.environ, "RECALLTRACE_DATABASE_URL": url, "OTEL_SERVICE_NAME": "cron"}
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120, env=env, cwd=tmp_path)
    (trace_id,) = _all_trace_ids(url)
    detail = make_history(create_engine_from_url(url)).trace(trace_id)
    assert (detail.app_name, detail.service_name, detail.user_input) == (
        "batch-job",
        "cron",
        "nightly question",
    )


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_worker_writes_with_its_own_connections(stored: History, database_url: str) -> None:
    ids: list[str | None] = []

    @recalltrace.rag("forking-app")
    def ask(question: str) -> str:
        ids.append(recalltrace.current_trace_id())
        return "ok"

    ask("parent before fork")
    assert recalltrace.flush(10)  # the parent's writer holds open connections now
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            ask("child")
            code = 0 if recalltrace.flush(20) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    ask("parent after fork")  # the parent's connections survived the child's exit
    assert recalltrace.flush(10)
    inputs = sorted(
        stored.trace(trace_id).user_input or "" for trace_id in _all_trace_ids(database_url)
    )
    assert inputs == ["child", "parent after fork", "parent before fork"]
