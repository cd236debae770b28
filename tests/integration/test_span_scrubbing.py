"""With span scrubbing on, no secret reaches an exporter in any field of a span: name (also
one set by ``update_name``), attributes, events (names and attributes, exceptions recorded by
the application), links' attributes and status description; for the tracer's spans and for
the instrumentations' spans span capture sees. Real SDK providers and in-memory exporters,
with exporting processors added before ``configure`` and after it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

import recalltrace
from recalltrace.testing import MemorySink

GITHUB = "ghp_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5"
AWS = "AKIAZ7QX4LM2RT6WPB5N"
CARD = "4539148803436467"
EMAIL = "jane.doe@example.org"
SECRETS = (GITHUB, AWS, CARD, EMAIL)
TEXT = f"token {GITHUB} key {AWS} card {CARD} mail {EMAIL}"


def _texts(span: ReadableSpan) -> list[str]:
    """Every text an exporter reads from ``span`` (the resource excluded)."""
    out = [span.name]

    def values(attributes: Any) -> None:
        for key, value in (attributes or {}).items():
            out.append(str(key))
            if isinstance(value, (tuple, list)):
                out.extend(str(item) for item in value)
            else:
                out.append(str(value))

    values(span.attributes)
    for event in span.events:
        out.append(event.name)
        values(event.attributes)
    for link in span.links:
        values(link.attributes)
    if span.status.description:
        out.append(span.status.description)
    return out


def _assert_clean(spans: list[ReadableSpan]) -> None:
    assert spans
    for span in spans:
        for text in _texts(span):
            for secret in SECRETS:
                assert secret not in text, (span.name, text)


class Boom(Exception):
    pass


def _decorate_and_touch(provider: TracerProvider) -> Any:
    """A decorated request whose code changes its spans through the OpenTelemetry API."""
    other = provider.get_tracer("app").start_span("linked")
    other.end()

    @recalltrace.retrieval
    def search(query: str) -> list[str]:
        span = otel_trace.get_current_span()
        span.add_event(f"looked up {EMAIL}", {"note": TEXT, "list": [GITHUB, "plain"]})
        span.add_link(other.get_span_context(), {"why": TEXT})
        span.update_name(f"search for {EMAIL}")
        try:
            raise Boom(TEXT)
        except Boom as exc:
            span.record_exception(exc, {"extra": AWS})
        span.set_status(Status(StatusCode.ERROR, TEXT))
        return ["a document"]

    @recalltrace.rag("support-bot")
    def answer(question: str) -> str:
        search(question)
        root = otel_trace.get_current_span()
        root.set_status(Status(StatusCode.ERROR, f"failed for {EMAIL} {CARD}"))
        root.add_event(f"card {CARD}")
        return "ok"

    return answer


def _instrumented(tracer: Any) -> None:
    """An instrumentation's request (OpenInference attributes), changed by the application."""
    linked = tracer.start_span("elsewhere")
    linked.end()
    with tracer.start_as_current_span(
        "chain", attributes={"openinference.span.kind": "CHAIN", "input.value": "question?"}
    ) as chain:
        with tracer.start_as_current_span(
            "retrieve", attributes={"openinference.span.kind": "RETRIEVER"}
        ) as retrieve:
            retrieve.set_attribute("retrieval.documents.0.document.id", "d1")
            retrieve.set_attribute("retrieval.documents.0.document.content", "text")
            retrieve.add_event(f"event {GITHUB}", {"detail": TEXT})
            retrieve.add_link(linked.get_span_context(), {"from": TEXT})
            retrieve.update_name(f"retrieve {AWS}")
        try:
            raise Boom(TEXT)
        except Boom as exc:
            chain.record_exception(exc)
        chain.set_status(Status(StatusCode.ERROR, TEXT))
        chain.set_attribute("output.value", "answer")


@pytest.fixture()
def providers() -> Iterator[tuple[TracerProvider, list[InMemorySpanExporter]]]:
    """A provider with exporters added before configure (simple and batch)."""
    provider = TracerProvider()
    early = InMemorySpanExporter()
    batched = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(early))
    provider.add_span_processor(BatchSpanProcessor(batched, schedule_delay_millis=10))
    yield provider, [early, batched]
    recalltrace.shutdown(2.0)
    provider.shutdown()


def _configure(provider: TracerProvider, **options: Any) -> MemorySink:
    sink = MemorySink()
    recalltrace.configure(
        tracer_provider=provider,
        sink=sink,
        service_name="span-scrub",
        flush_interval=0.05,
        shutdown_timeout=2.0,
        handle_signals=False,
        scrubbing=recalltrace.ScrubbingOptions(scrub_span_attributes=True),
        **options,
    )
    return sink


def _exported(provider: TracerProvider, exporters: list[InMemorySpanExporter]) -> list[Any]:
    provider.force_flush()
    return [span for exporter in exporters for span in exporter.get_finished_spans()]


def test_tracer_spans_changed_by_the_application_are_scrubbed(
    providers: tuple[TracerProvider, list[InMemorySpanExporter]],
) -> None:
    provider, exporters = providers
    _configure(provider)
    late = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(late))
    answer = _decorate_and_touch(provider)
    answer("what is due?")
    spans = [
        span
        for span in _exported(provider, [*exporters, late])
        if span.instrumentation_scope and span.instrumentation_scope.name == "recalltrace"
    ]
    assert {"support-bot"} <= {span.name for span in spans}
    assert len(spans) == 6  # two spans, three exporters
    _assert_clean(spans)
    search = next(span for span in spans if span.name.startswith("search for"))
    assert [event.name for event in search.events][-1] == "exception"
    assert search.links and search.status.status_code is StatusCode.ERROR


def test_instrumentation_spans_are_scrubbed_with_span_capture(
    providers: tuple[TracerProvider, list[InMemorySpanExporter]],
) -> None:
    provider, exporters = providers
    sink = _configure(provider, capture_spans=True)
    late = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(late))
    _instrumented(provider.get_tracer("openinference.instrumentation.test"))
    spans = _exported(provider, [*exporters, late])
    assert {span.name for span in spans} >= {"chain", "elsewhere"}
    _assert_clean(spans)
    chain = next(span for span in spans if span.name == "chain")
    assert chain.events[0].name == "exception"
    assert chain.status.description and "[REDACTED]" in chain.status.description
    recalltrace.flush(5.0)
    assert sink.records, "the captured request is still stored"


def test_spans_are_left_alone_without_span_scrubbing() -> None:
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    recalltrace.configure(
        tracer_provider=provider,
        sink=MemorySink(),
        handle_signals=False,
        capture_spans=True,
        shutdown_timeout=2.0,
    )
    try:
        tracer = provider.get_tracer("app")
        with tracer.start_as_current_span("work") as span:
            span.add_event(f"mail {EMAIL}")
            span.update_name(f"work {EMAIL}")
        (exported,) = exporter.get_finished_spans()
        assert EMAIL in exported.name and EMAIL in exported.events[0].name
    finally:
        recalltrace.shutdown(2.0)
        provider.shutdown()
