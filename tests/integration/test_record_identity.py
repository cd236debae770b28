"""A stored record is one RAG request, not one OpenTelemetry trace id.

The real cases: an application span (an agent, a batch job, a handler) around several requests;
requests arriving with one upstream ``traceparent`` (the OTel SDK's own propagation); a process
that called ``random.seed()``, after which the OTel SDK draws the same trace and span ids again.
Each request must be stored, on both backends, and keep its own reference.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from sqlalchemy import func, select

import recalltrace
from recalltrace.cli import main
from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.history import History
from recalltrace.storage.models import Trace
from recalltrace.storage.repository import TraceNotFound
from tests.support.factories import make_history

PROVIDER = TracerProvider()


@pytest.fixture
def stored(database_url: str) -> Iterator[tuple[str, History]]:
    recalltrace.configure(
        database_url=database_url,
        tracer_provider=PROVIDER,
        sample_rate=1.0,
        flush_interval=0.05,
        reference_wait=5.0,
    )
    engine = create_engine_from_url(database_url)
    yield database_url, make_history(engine)
    recalltrace.shutdown(5)
    engine.dispose()


@recalltrace.retrieval
def search(query: str) -> list[dict[str, Any]]:
    return [{"id": f"doc-{query}", "content": f"About {query}."}]


@recalltrace.rag
def answer(question: str) -> str:
    search(question)
    recalltrace.set_reference(recalltrace.current_trace_id(), reference_context_ids=[question])
    return f"answer to {question}"


def stored_count(url: str) -> int:
    engine = create_engine_from_url(url)
    with engine.connect() as conn:
        count = conn.scalar(select(func.count()).select_from(Trace))
    engine.dispose()
    return int(count or 0)


def test_several_requests_inside_one_application_span(stored: tuple[str, History]) -> None:
    url, history = stored
    tracer = PROVIDER.get_tracer("app")
    ids = []
    with tracer.start_as_current_span("agent") as agent:
        for question in ("alpha", "beta", "gamma"):
            answer(question)
    assert recalltrace.flush(10)
    assert stored_count(url) == 3
    otel_id = format(agent.get_span_context().trace_id, "032x")
    ids = history.records_of_otel_trace(otel_id)
    assert len(ids) == 3
    details = [history.trace(record_id) for record_id in ids]
    # Each request kept its own question and its own late reference.
    assert sorted((d.user_input, tuple(d.reference_context_ids or ())) for d in details) == [
        ("alpha", ("alpha",)),
        ("beta", ("beta",)),
        ("gamma", ("gamma",)),
    ]
    assert {d.otel_trace_id for d in details} == {otel_id}
    assert len({d.otel_span_id for d in details}) == 3
    with pytest.raises(TraceNotFound, match="holds 3 requests"):
        history.trace(otel_id)


def test_requests_sharing_an_upstream_traceparent(stored: tuple[str, History]) -> None:
    url, history = stored
    upstream = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    propagator = TraceContextTextMapPropagator()
    for index in range(200):
        ctx = propagator.extract({"traceparent": upstream})
        token = otel_context.attach(ctx)
        try:
            answer(f"q{index}")
        finally:
            otel_context.detach(token)
    assert recalltrace.flush(20)
    assert stored_count(url) == 200
    assert len(history.records_of_otel_trace("4bf92f3577b34da6a3ce929d0e0e4736")) == 200


def test_a_process_that_seeded_random(stored: tuple[str, History]) -> None:
    url, _ = stored
    tracer = PROVIDER.get_tracer("app")
    otel_ids = set()
    for index in range(5):
        random.seed(1234)  # what a worker process does at start, or a test fixture
        with tracer.start_as_current_span("request") as span:
            otel_ids.add(span.get_span_context().trace_id)
            answer(f"seeded {index}")
    assert len(otel_ids) == 1  # the SDK drew the same ids every time
    assert recalltrace.flush(10)
    assert stored_count(url) == 5


def test_trace_show_takes_the_opentelemetry_id_of_a_one_request_trace(
    stored: tuple[str, History], capsys: pytest.CaptureFixture[str]
) -> None:
    url, history = stored
    tracer = PROVIDER.get_tracer("app")
    with tracer.start_as_current_span("handler") as handler:
        answer("solo")
    assert recalltrace.flush(10)
    otel_id = format(handler.get_span_context().trace_id, "032x")
    (record_id,) = history.records_of_otel_trace(otel_id)
    assert main(["trace", "show", otel_id, "--database-url", url, "--format", "json"]) == 0
    shown = capsys.readouterr().out
    assert record_id in shown and otel_id in shown
    assert otel_trace.get_current_span() is otel_trace.INVALID_SPAN
