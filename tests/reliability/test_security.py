"""Security: secrets scrubbed everywhere before storage and before the judge, the database
password never shown, and hostile filter values handled as data by every command."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import inspect, text

import recalltrace
from recalltrace.scorers import JudgeConfig
from recalltrace.scorers.worker import Worker, WorkerOptions
from recalltrace.storage.db import create_engine_from_url
from tests.reliability.secrets_corpus import (
    ANSWER,
    DOCUMENTS,
    EXCEPTION_MESSAGE,
    METADATA,
    QUESTION,
    SECRET_DOC_ID,
    SECRET_METADATA_KEY,
    SECRET_REFERENCE_ID,
    SECRETS,
)
from tests.support.factories import make_repository
from tests.support.judge_server import JudgeServer
from tests.support.tracer_helpers import make_traced


def dump_database(url: str) -> str:
    """Every row of every table the database holds, as text (JSON columns included)."""
    engine = create_engine_from_url(url)
    parts = []
    tables = inspect(engine).get_table_names()
    assert {"traces", "retrieved_contexts", "scoring_jobs", "scores"} <= set(tables)
    with engine.connect() as conn:
        for table in tables:
            for row in conn.execute(text(f'SELECT * FROM "{table}"')):
                parts.append(json.dumps([str(value) for value in row], ensure_ascii=False))
    engine.dispose()
    return "\n".join(parts)


def leaked(haystack: str) -> list[str]:
    """The secrets found in ``haystack``, whole or in part (any 12 characters of one: a rule
    that redacts only the end of a secret leaks the rest)."""
    found = []
    for name, secret in SECRETS.items():
        windows = [secret[i : i + 12] for i in range(max(1, len(secret) - 11))]
        if any(window in haystack for window in windows):
            found.append(name)
    return found


@recalltrace.retrieval
def search(query: str) -> list[dict[str, Any]]:
    documents = [
        {"id": f"doc-{i}", "content": content, "metadata": dict(METADATA) if i == 0 else {}}
        for i, content in enumerate(DOCUMENTS)
    ]
    documents[1]["id"] = SECRET_DOC_ID
    documents[1]["metadata"] = {SECRET_METADATA_KEY: "see the runbook"}
    return documents


@recalltrace.rag("secure-app", reference_param="reference", metadata={"tenant": "acme"})
def answer(question: str, reference: str) -> str:
    search(question)
    recalltrace.set_reference(None, reference_context_ids=["doc-0", SECRET_REFERENCE_ID])
    return ANSWER


@recalltrace.rag("secure-app")
def failing(question: str) -> str:
    search(question)
    raise RuntimeError(EXCEPTION_MESSAGE)


def run_requests() -> None:
    """One request with every secret in its inputs and outputs, one that raises with one."""
    assert answer(QUESTION, f"Rotate {SECRETS['stripe']} first.") == ANSWER
    with pytest.raises(RuntimeError):
        failing(QUESTION)


@pytest.fixture
def stored_secret_trace(database_url: str) -> Iterator[str]:
    make_traced(open_storage=True, database_url=database_url, flush_interval=30.0)
    try:
        run_requests()
        assert recalltrace.flush(15.0)
    finally:
        recalltrace.shutdown(5.0)
    yield database_url


def test_stored_records_hold_no_secret(stored_secret_trace: str) -> None:
    dump = dump_database(stored_secret_trace)
    assert "secure-app" in dump
    assert leaked(dump) == []
    kinds = (
        *("api_key", "bearer_token", "password", "email", "card_number", "sensitive_key"),
        *("gitlab_token", "webhook_url", "azure_key", "azure_sas", "aws_secret_key"),
        *("url_password", "authorization", "env_secret", "iban", "ssn", "phone_number"),
    )
    for kind in kinds:
        assert f"scrubbed {kind} in" in dump, kind
    # What is not secret is kept.
    assert "To call the API use the key [REDACTED]" in dump
    assert "svc" in dump  # the user name next to the redacted password


@pytest.mark.postgres
def test_the_judge_never_receives_what_scrubbing_removed(postgres_url: str) -> None:
    engine = create_engine_from_url(postgres_url)
    with engine.begin() as conn:
        conn.execute(
            text("TRUNCATE scores, scoring_jobs, retrieved_contexts, trace_tags, labels, traces")
        )
    engine.dispose()
    make_traced(open_storage=True, database_url=postgres_url, flush_interval=30.0)
    try:
        run_requests()
        assert recalltrace.flush(15.0)
    finally:
        recalltrace.shutdown(5.0)
    llm_metrics = ["llm_context_recall", "context_entity_recall", "chunk_context_recall",
                   "judge_context_recall"]  # fmt: skip
    with JudgeServer() as server:
        worker = Worker(
            WorkerOptions(
                metrics=llm_metrics,
                judge=JudgeConfig(
                    model="openai/test-judge",
                    api_base=server.base_url,
                    api_key="test",
                    timeout_s=5.0,
                    max_retries=1,
                ),
                poll_interval_s=0.05,
                listen=False,
            ),
            repository=make_repository(create_engine_from_url(postgres_url)),
        )
        try:
            stats = asyncio.run(worker.run(once=True))
        finally:
            worker.close()
        bodies = json.dumps(server.requests, ensure_ascii=False)
    assert stats.scored == len(llm_metrics), stats
    assert server.call_count >= len(llm_metrics)
    assert "[REDACTED]" in bodies  # the judge saw the scrubbed documents...
    assert leaked(bodies) == []  # ...and none of what was removed


def test_scrubbed_spans_and_logs_hold_no_secret(caplog: pytest.LogCaptureFixture) -> None:
    """With span scrubbing on, no exported span carries a secret: attributes (document ids,
    contents and metadata with its keys), exception events (message and stack trace) and
    status descriptions; nor does anything the tracer logs."""
    caplog.set_level(logging.DEBUG)
    traced = make_traced(
        scrubbing=recalltrace.ScrubbingOptions(scrub_span_attributes=True), flush_interval=30.0
    )
    try:
        run_requests()
        assert recalltrace.flush(15.0)
        spans = traced.exporter.get_finished_spans()
        records = list(traced.sink.records)
    finally:
        recalltrace.shutdown(5.0)
    assert {span.name for span in spans} == {"search", "secure-app"}
    exported = []
    for span in spans:
        exported.append(json.dumps(dict(span.attributes or {}), ensure_ascii=False, default=str))
        exported.append(str(span.status.description))
        for event in span.events:
            exported.append(event.name)
            exported.append(json.dumps(dict(event.attributes or {}), default=str))
    everything = "\n".join(exported)
    assert "[REDACTED]" in everything
    assert any(e.name == "exception" for s in spans for e in s.events)
    assert leaked(everything) == []
    assert records and leaked(repr(records)) == []
    assert leaked(caplog.text) == []
