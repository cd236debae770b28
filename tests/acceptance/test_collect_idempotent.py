"""``recalltrace collect`` stores a request once however often its spans arrive: an OTLP
exporter (or a Collector) that lost the response to an export sends the same body again, once
while the trace is still waiting for late spans, once after its requests were stored, and once
to another collect; and a request that two instrumentors traced, each in a trace of its own."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult
from sqlalchemy import Engine, func, select

from recalltrace.storage.models import RetrievedContext, Trace
from tests.acceptance.test_collect import start_collect, wait_for_records
from tests.support.capture import ANSWERS, CORPUS, QUESTIONS, ranked, stored

PROTOBUF = "application/x-protobuf"


class RecordingExporter(OTLPSpanExporter):
    """The SDK's OTLP/HTTP exporter, remembering the spans of every export it sent."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(endpoint=endpoint)
        self.sent: list[list[ReadableSpan]] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.sent.append(list(spans))
        return super().export(spans)


def make_requests(exporter: OTLPSpanExporter) -> None:
    """One request per question as OpenInference spans (a chain, its retriever with two
    documents, its model call with 30 + 5 tokens), exported in one batch."""
    provider = TracerProvider(resource=Resource.create({"service.name": "python-rag"}))
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=60_000))
    tracer = provider.get_tracer("app")
    for question in QUESTIONS:
        with tracer.start_as_current_span("answer") as root:
            root.set_attribute("openinference.span.kind", "CHAIN")
            root.set_attribute("input.value", question)
            with tracer.start_as_current_span("search") as retriever:
                retriever.set_attribute("openinference.span.kind", "RETRIEVER")
                for index, doc_id in enumerate(ranked(question)):
                    prefix = f"retrieval.documents.{index}.document."
                    retriever.set_attribute(prefix + "id", doc_id)
                    retriever.set_attribute(prefix + "content", CORPUS[doc_id])
            with tracer.start_as_current_span("generate") as llm:
                llm.set_attribute("openinference.span.kind", "LLM")
                llm.set_attribute("llm.model_name", "gpt-test")
                llm.set_attribute("llm.output_messages.0.message.content", ANSWERS[question])
                llm.set_attribute("llm.token_count.prompt", 30)
                llm.set_attribute("llm.token_count.completion", 5)
    provider.shutdown()


def count(engine: Engine, table: Any) -> int:
    with engine.connect() as conn:
        return int(conn.scalar(select(func.count()).select_from(table)) or 0)


@pytest.mark.postgres
def test_an_export_sent_again_after_a_lost_response_is_stored_once(
    postgres_url: str, pg_engine: Engine
) -> None:
    service = start_collect(postgres_url, "--trace-idle", "1")
    try:
        exporter = RecordingExporter(service.url)
        make_requests(exporter)
        assert len(exporter.sent) == 1  # one export request held every span
        body = encode_spans(exporter.sent[0]).SerializePartialToString()
        # The retry of an export whose response was lost: the same protobuf body, at once
        # (its traces are still waiting for late spans in collect) ...
        status, _, _ = service.post(body, PROTOBUF)
        assert status == 200
        first = wait_for_records(pg_engine, len(QUESTIONS))
        assert len(first) == len(QUESTIONS)
        # ... and once more after its requests were stored.
        status, _, _ = service.post(body, PROTOBUF)
        assert status == 200
    finally:
        summary = service.stop()
    assert "18 span(s) received" in summary, summary
    # A collect that never saw it (restarted, or another replica behind a load balancer) gets
    # the retry: the record it builds has the same id, and the stored one is kept as it is.
    replica = start_collect(postgres_url, "--trace-idle", "1")
    try:
        status, _, _ = replica.post(body, PROTOBUF)
        assert status == 200
    finally:
        summary = replica.stop()
    assert "2 request(s) found" in summary, summary
    records = stored(pg_engine)
    assert [r.user_input for r in records] == list(QUESTIONS)
    for record in records:
        question = record.user_input
        assert question is not None
        assert record.ids == ranked(question)
        assert record.contents == [CORPUS[i] for i in ranked(question)]
        assert record.response == ANSWERS[question]
        assert record.metadata["llm"] == [
            {"model": "gpt-test", "prompt_tokens": 30, "completion_tokens": 5, "total_tokens": 35}
        ]
    assert count(pg_engine, Trace) == len(QUESTIONS)
    assert count(pg_engine, RetrievedContext) == 2 * len(QUESTIONS)


def make_request_twice(exporter: OTLPSpanExporter, question: str) -> None:
    """One request traced by two instrumentors at once, each in a trace of its own: an
    OpenInference chain and an OpenLLMetry workflow, each with its retrieval and model call."""
    provider = TracerProvider(resource=Resource.create({"service.name": "python-rag"}))
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=60_000))
    tracer = provider.get_tracer("app")
    ids = ranked(question)
    with tracer.start_as_current_span("RunnableSequence") as oi_root:
        oi_root.set_attribute("openinference.span.kind", "CHAIN")
        oi_root.set_attribute("input.value", question)
        with tracer.start_as_current_span(
            "RunnableSequence.workflow",
            context=trace_api.set_span_in_context(trace_api.INVALID_SPAN),
        ) as oll_root:
            oll_root.set_attribute("traceloop.span.kind", "workflow")
            oll_root.set_attribute("traceloop.entity.input", json.dumps({"inputs": question}))
            with tracer.start_as_current_span("retrieve") as oll_retriever:
                oll_retriever.set_attribute("traceloop.span.kind", "task")
                oll_retriever.set_attribute("gen_ai.operation.name", "vector_db_retrieve")
                oll_retriever.set_attribute(
                    "traceloop.entity.output",
                    json.dumps([{"id": i, "page_content": CORPUS[i]} for i in ids]),
                )
            with tracer.start_as_current_span("completion") as oll_llm:
                oll_llm.set_attribute("llm.request.type", "completion")
                oll_llm.set_attribute("gen_ai.completion.0.content", ANSWERS[question])
        with tracer.start_as_current_span("search") as retriever:
            retriever.set_attribute("openinference.span.kind", "RETRIEVER")
            for index, doc_id in enumerate(ids):
                prefix = f"retrieval.documents.{index}.document."
                retriever.set_attribute(prefix + "id", doc_id)
                retriever.set_attribute(prefix + "content", CORPUS[doc_id])
        with tracer.start_as_current_span("generate") as llm:
            llm.set_attribute("openinference.span.kind", "LLM")
            llm.set_attribute("llm.model_name", "gpt-test")
            llm.set_attribute("llm.output_messages.0.message.content", ANSWERS[question])
            llm.set_attribute("llm.token_count.prompt", 30)
            llm.set_attribute("llm.token_count.completion", 5)
    provider.shutdown()


@pytest.mark.postgres
def test_a_request_traced_by_two_instrumentors_is_stored_once(
    postgres_url: str, pg_engine: Engine
) -> None:
    service = start_collect(postgres_url, "--trace-idle", "1")
    try:
        for question in QUESTIONS:
            make_request_twice(OTLPSpanExporter(endpoint=service.url), question)
        wait_for_records(pg_engine, len(QUESTIONS))
    finally:
        service.stop()
    records = stored(pg_engine)
    assert [r.user_input for r in records] == list(QUESTIONS)
    for record in records:
        assert record.ids == ranked(record.user_input or "")
        assert record.metadata["span_convention"] == "openinference"
        assert record.metadata["llm"] == [
            {"model": "gpt-test", "prompt_tokens": 30, "completion_tokens": 5, "total_tokens": 35}
        ]
