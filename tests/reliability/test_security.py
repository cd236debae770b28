"""Security: secrets scrubbed everywhere before storage and before the judge, the database
password never shown, and hostile filter values handled as data by every command."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

import recalltrace
from recalltrace.scorers import JudgeConfig
from recalltrace.scorers.worker import Worker, WorkerOptions
from recalltrace.storage.db import create_engine_from_url
from tests.reliability.secrets_corpus import ANSWER, DOCUMENTS, METADATA, QUESTION, SECRETS
from tests.support.factories import make_repository
from tests.support.judge_server import JudgeServer
from tests.support.tracer_helpers import make_traced

TABLES = ("traces", "retrieved_contexts", "scoring_jobs", "scores")


def dump_database(url: str) -> str:
    """Every row of every table as text (JSON columns included)."""
    engine = create_engine_from_url(url)
    parts = []
    with engine.connect() as conn:
        for table in TABLES:
            for row in conn.execute(text(f"SELECT * FROM {table}")):
                parts.append(json.dumps([str(value) for value in row], ensure_ascii=False))
    engine.dispose()
    return "\n".join(parts)


def leaked(haystack: str) -> list[str]:
    return [name for name, secret in SECRETS.items() if secret in haystack]


@recalltrace.retrieval
def search(query: str) -> list[dict[str, Any]]:
    return [
        {"id": f"doc-{i}", "content": content, "metadata": dict(METADATA) if i == 0 else {}}
        for i, content in enumerate(DOCUMENTS)
    ]


@recalltrace.rag("secure-app", reference_param="reference", metadata={"tenant": "acme"})
def answer(question: str, reference: str) -> str:
    search(question)
    return ANSWER


@pytest.fixture
def stored_secret_trace(database_url: str) -> Iterator[str]:
    make_traced(open_storage=True, database_url=database_url, flush_interval=30.0)
    try:
        assert answer(QUESTION, f"Rotate {SECRETS['stripe']} first.") == ANSWER
        assert recalltrace.flush(15.0)
    finally:
        recalltrace.shutdown(5.0)
    yield database_url


def test_stored_records_hold_no_secret(stored_secret_trace: str) -> None:
    dump = dump_database(stored_secret_trace)
    assert "secure-app" in dump
    assert leaked(dump) == []
    for kind in ("api_key", "bearer_token", "password", "email", "card_number", "sensitive_key"):
        assert f"scrubbed {kind} in" in dump, kind
    # What is not secret is kept.
    assert "To call the API use the key [REDACTED]" in dump
    assert "svc" in dump  # the user name next to the redacted password


@pytest.mark.postgres
def test_the_judge_never_receives_what_scrubbing_removed(postgres_url: str) -> None:
    engine = create_engine_from_url(postgres_url)
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE scores, scoring_jobs, retrieved_contexts, traces"))
    engine.dispose()
    make_traced(open_storage=True, database_url=postgres_url, flush_interval=30.0)
    try:
        answer(QUESTION, f"Rotate {SECRETS['stripe']} first; contexts mention keys.")
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
