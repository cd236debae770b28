"""Security: secrets scrubbed everywhere before storage and before the judge, the database
password never shown, and hostile filter values handled as data by every command."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from sqlalchemy import inspect, text

import recalltrace
from recalltrace.scorers import JudgeConfig
from recalltrace.scorers.worker import Worker, WorkerOptions
from recalltrace.storage.db import create_engine_from_url
from tests.reliability.secret_kinds import all_kinds, leaked_kinds
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
from tests.support.postgres import truncate_all
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


@pytest.mark.parametrize("storage_process", [False, True], ids=["thread", "process"])
def test_a_late_reference_is_scrubbed_before_it_is_stored(
    database_url: str, storage_process: bool
) -> None:
    """Ground truth set after the request ended (``set_reference(trace_id, ...)``) is text like
    any other: scrubbed whether its trace is stored already or still waits to be written."""
    make_traced(
        open_storage=True,
        database_url=database_url,
        flush_interval=30.0,
        storage_process=storage_process,
    )
    ids: list[str | None] = []

    @recalltrace.rag("late-reference")
    def ask(question: str) -> str:
        ids.append(recalltrace.current_trace_id())
        return ANSWER

    late = {
        "reference": f"Rotate {SECRETS['stripe']} first.",
        "reference_contexts": [f"The token is {SECRETS['github']}."],
        "reference_context_ids": [SECRET_REFERENCE_ID],
    }
    try:
        ask(QUESTION)
        assert recalltrace.flush(15.0)  # stored: the reference is attached in the database
        recalltrace.set_reference(ids[0], **late)
        ask(QUESTION)  # queued, not written yet: the reference joins the record in memory
        recalltrace.set_reference(ids[1], **late)
        assert recalltrace.flush(15.0)
    finally:
        recalltrace.shutdown(5.0)
    dump = dump_database(database_url)
    assert dump.count("Rotate [REDACTED] first.") == 2, dump[-2000:]
    assert leaked(dump) == []


@pytest.mark.postgres
def test_the_judge_never_receives_what_scrubbing_removed(postgres_url: str) -> None:
    engine = create_engine_from_url(postgres_url)
    truncate_all(engine)
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


# -- every kind of the secrets corpus, in every field --------------------------------------------

KINDS = all_kinds()


@recalltrace.retrieval
def kind_search(query: str, kind_text: str) -> list[dict[str, Any]]:
    # Attributes the application sets on the tracer's spans itself are text like any other.
    trace.get_current_span().set_attribute("app.lookup", f"looked up {kind_text}")
    trace.get_current_span().set_attribute("app.lookups", [kind_text, "plain"])
    return [
        {"id": "doc-plain", "content": f"Runbook: {kind_text} (rotate quarterly).", "metadata": {}},
        {"id": f"kb/{kind_text}", "content": "ok", "metadata": {f"note {kind_text}": kind_text}},
    ]


@recalltrace.rag("kinds-app", reference_param="reference")
def kind_answer(question: str, reference: str, kind_text: str) -> str:
    kind_search(question, kind_text)
    recalltrace.set_reference(None, reference_context_ids=["doc-plain", f"ref/{kind_text}"])
    return f"Done; the value was {kind_text}."


@recalltrace.rag("kinds-app")
def kind_failing(question: str, kind_text: str) -> str:
    kind_search(question, kind_text)
    raise RuntimeError(f"upstream refused {kind_text}")


def run_kind_requests() -> None:
    """For each kind: one request with it in the question, a document's content, id and
    metadata key and value, the answer, the reference and a reference id; one that raises
    with it in the exception."""
    for kind in KINDS:
        question = f"Why does {kind.text} fail?"
        kind_answer(question, f"Rotate {kind.text} first.", kind.text)
        with pytest.raises(RuntimeError):
            kind_failing(question, kind.text)


def test_no_kind_of_the_corpus_is_stored_from_any_field(database_url: str) -> None:
    """275 kinds (every shipped rule-file rule's own format and the variants a list misses:
    split, encoded, wrapped, full-width, other languages) in every field: none stored."""
    make_traced(open_storage=True, database_url=database_url, flush_interval=30.0)
    try:
        run_kind_requests()
        assert recalltrace.flush(60.0)
    finally:
        recalltrace.shutdown(10.0)
    dump = dump_database(database_url)
    assert dump.count("kinds-app") >= 2 * len(KINDS)
    assert leaked_kinds(dump, KINDS) == []


@pytest.mark.postgres
def test_the_judge_receives_no_kind_of_the_corpus(postgres_url: str) -> None:
    engine = create_engine_from_url(postgres_url)
    truncate_all(engine)
    engine.dispose()
    make_traced(open_storage=True, database_url=postgres_url, flush_interval=30.0)
    try:
        for kind in KINDS:
            kind_answer(f"Why does {kind.text} fail?", f"Rotate {kind.text} first.", kind.text)
        assert recalltrace.flush(60.0)
    finally:
        recalltrace.shutdown(10.0)
    with JudgeServer() as server:
        worker = Worker(
            WorkerOptions(
                metrics=["llm_context_recall"],
                judge=JudgeConfig(
                    model="openai/test-judge",
                    api_base=server.base_url,
                    api_key="test",
                    timeout_s=10.0,
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
    assert stats.scored == len(KINDS), stats
    assert "[REDACTED]" in bodies
    assert leaked_kinds(bodies, KINDS) == []


def test_no_kind_of_the_corpus_is_on_a_span_with_span_scrubbing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    traced = make_traced(
        scrubbing=recalltrace.ScrubbingOptions(scrub_span_attributes=True), flush_interval=30.0
    )
    try:
        run_kind_requests()
        assert recalltrace.flush(60.0)
        spans = traced.exporter.get_finished_spans()
        records = list(traced.sink.records)
    finally:
        recalltrace.shutdown(10.0)
    exported = []
    for span in spans:
        exported.append(span.name)
        exported.append(json.dumps(dict(span.attributes or {}), ensure_ascii=False, default=str))
        exported.append(str(span.status.description))
        for event in span.events:
            exported.append(event.name)
            exported.append(json.dumps(dict(event.attributes or {}), ensure_ascii=False))
    everything = "\n".join(exported)
    assert len(spans) == 4 * len(KINDS)
    assert leaked_kinds(everything, KINDS) == []
    assert len(records) == 2 * len(KINDS)
    assert leaked_kinds(repr(records), KINDS) == []
    assert leaked_kinds(caplog.text, KINDS) == []


@pytest.mark.postgres
def test_collect_stores_no_kind_from_span_names_or_resource_attributes(
    postgres_url: str,
) -> None:
    """A collector receives whatever the sending services put in span names (the app name)
    and resource attributes (service name, release, environment): scrubbed like any field."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from tests.acceptance.test_collect import start_collect, wait_for_records

    engine = create_engine_from_url(postgres_url)
    truncate_all(engine)
    service = start_collect(postgres_url, "--trace-idle", "1")
    resource_kinds = KINDS[:3]
    try:
        provider = TracerProvider(
            resource=Resource.create(
                {
                    "service.name": f"svc {resource_kinds[0].text}",
                    "service.version": f"3.1 {resource_kinds[1].text}",
                    "deployment.environment.name": f"prod {resource_kinds[2].text}",
                }
            )
        )
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=service.url)))
        tracer = provider.get_tracer("app")
        for kind in KINDS:
            with tracer.start_as_current_span(f"answer {kind.text}") as root:
                root.set_attribute("openinference.span.kind", "CHAIN")
                root.set_attribute("input.value", f"Why does {kind.text} fail?")
                with tracer.start_as_current_span(f"search {kind.text}") as retriever:
                    retriever.set_attribute("openinference.span.kind", "RETRIEVER")
                    retriever.set_attribute("retrieval.documents.0.document.id", "d1")
                    retriever.set_attribute("retrieval.documents.0.document.content", "text")
                root.set_attribute("output.value", "done")
        provider.shutdown()
        assert len(wait_for_records(engine, len(KINDS))) == len(KINDS)
    finally:
        summary = service.stop()
        engine.dispose()
    dump = dump_database(postgres_url)
    assert leaked_kinds(dump, KINDS) == []
    assert leaked_kinds(summary, KINDS) == []


def test_captured_span_names_are_scrubbed_in_records_and_metric_labels() -> None:
    """With span capture, a request's app name is its root span's name: in the stored record
    and in the tracer's metric labels it is scrubbed like any text."""
    traced = make_traced(capture_spans=True, flush_interval=30.0)
    tracer = traced.provider.get_tracer("app")
    try:
        for kind in KINDS:
            with tracer.start_as_current_span(f"answer {kind.text}") as root:
                root.set_attribute("openinference.span.kind", "CHAIN")
                root.set_attribute("input.value", "Why does it fail?")
                with tracer.start_as_current_span("search") as retriever:
                    retriever.set_attribute("openinference.span.kind", "RETRIEVER")
                    retriever.set_attribute("retrieval.documents.0.document.content", "text")
                root.set_attribute("output.value", "done")
        assert recalltrace.flush(60.0)
        records = list(traced.sink.records)
        labels = [
            json.dumps(attributes, ensure_ascii=False)
            for name in ("rag.traces.captured", "rag.traces.sampled")
            for attributes, _ in traced.metric_points(name)
        ]
    finally:
        recalltrace.shutdown(10.0)
    assert len(records) == len(KINDS)
    assert leaked_kinds(repr(records), KINDS) == []
    assert labels and leaked_kinds("\n".join(labels), KINDS) == []
