"""Span capture keeps the application's tracer provider whole: with Arize Phoenix's
``phoenix.otel.register()`` and with Pydantic Logfire (both real packages, both exporting to a
local OTLP receiver), ``configure(capture_spans=True)`` in either order stores every request AND
every span still reaches the provider's own exporter; a provider that drops its processors
anyway is said, with the number."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from typing import Any

import pytest
from opentelemetry.sdk.trace import SpanProcessor, SynchronousMultiSpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import Engine

from recalltrace.tracer import SpanCapture
from recalltrace.tracer._capture import add_keeping_others
from tests.support import ROOT
from tests.support.capture import QUESTIONS, check_requests, stored
from tests.support.otlp_receiver import OTLPReceiver

APP = """
import json, sys
from typing import Any
from langchain_core.documents import Document
from langchain_core.language_models.fake import FakeListLLM
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import PromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnablePassthrough
from openinference.instrumentation.langchain import LangChainInstrumentor
from opentelemetry import trace
import recalltrace
from tests.support.capture import ANSWERS, CORPUS, QUESTIONS, ranked

viewer, order, endpoint, url = sys.argv[1:5]


class KnowledgeBase(BaseRetriever):
    def _get_relevant_documents(self, query: str, *, run_manager: Any = None) -> list[Document]:
        return [Document(page_content=CORPUS[i], metadata={"id": i}) for i in ranked(query)]


def viewer_setup():
    if viewer == "phoenix":
        from phoenix.otel import register

        register(endpoint=endpoint + "/v1/traces", protocol="http/protobuf", batch=False,
                 verbose=False, project_name="capture-test")
    else:
        import logfire
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor

        logfire.configure(
            send_to_logfire=False, console=False, service_name="capture-test",
            additional_span_processors=[
                SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint + "/v1/traces"))
            ],
        )


def recalltrace_setup():
    recalltrace.configure(database_url=url, capture_spans=True, flush_interval=0.05,
                          handle_signals=False, auto_migrate=False)


steps = {
    "viewer-first": [viewer_setup, recalltrace_setup],
    "recalltrace-first": [recalltrace_setup, viewer_setup],
    # configured again after recalltrace (Logfire swaps the provider behind its proxy)
    "viewer-again": [viewer_setup, recalltrace_setup, viewer_setup],
}[order]
for step in steps:
    step()
recalltrace.flush(5)  # span capture follows a swapped provider at the writer's next cycle
LangChainInstrumentor().instrument()
llm = FakeListLLM(responses=[ANSWERS[q] for q in QUESTIONS])
prompt = PromptTemplate.from_template("Context:\\n{context}\\n\\nQuestion: {question}")
context = KnowledgeBase() | (lambda docs: "\\n".join(d.page_content for d in docs))
chain = {"context": context, "question": RunnablePassthrough()} | prompt | llm | StrOutputParser()
for question in QUESTIONS:
    assert chain.invoke(question) == ANSWERS[question]
assert recalltrace.flush(10)
assert trace.get_tracer_provider().force_flush(10000)
print(json.dumps({"provider": type(trace.get_tracer_provider()).__module__}))
"""


def run_app(viewer: str, order: str, endpoint: str, url: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", APP, viewer, order, endpoint, url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def exported(receiver: OTLPReceiver) -> list[tuple[str, str]]:
    """(trace id, span name) of every span the receiver got."""
    return [
        (span.trace_id.hex(), span.name)
        for request in receiver.requests["/v1/traces"]
        for resource_spans in request.resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    ]


@pytest.mark.postgres
@pytest.mark.realsystem  # apps with Phoenix's and Logfire's providers, each a process of its own
@pytest.mark.parametrize(
    ("viewer", "order"),
    [
        ("phoenix", "viewer-first"),
        ("phoenix", "recalltrace-first"),
        ("phoenix", "viewer-again"),
        ("logfire", "viewer-first"),
        ("logfire", "recalltrace-first"),
        ("logfire", "viewer-again"),
    ],
)
def test_the_viewers_exporter_keeps_every_span_and_every_request_is_stored(
    viewer: str, order: str, postgres_url: str, pg_engine: Engine
) -> None:
    with OTLPReceiver() as receiver:
        shown = run_app(viewer, order, receiver.endpoint, postgres_url)
        spans = exported(receiver)
    assert shown["provider"].split(".")[0] == viewer
    # Both requests reached the viewer, whole: each with its chain, retriever and model span.
    roots = {trace_id for trace_id, name in spans if name == "RunnableSequence"}
    assert len(roots) == len(QUESTIONS), spans
    for trace_id in roots:
        names = {name for other, name in spans if other == trace_id}
        assert {"KnowledgeBase", "FakeListLLM", "PromptTemplate", "StrOutputParser"} <= names
    records = stored(pg_engine)
    check_requests(records, app_name="RunnableSequence")


class ReplacingProvider(TracerProvider):
    """A provider whose add_span_processor replaces what it holds and offers no way not to."""

    def add_span_processor(self, span_processor: SpanProcessor) -> None:
        self._active_span_processor = SynchronousMultiSpanProcessor()
        super().add_span_processor(span_processor)


def test_a_provider_that_drops_its_processors_anyway_is_said_with_the_number(
    caplog: pytest.LogCaptureFixture,
) -> None:
    provider = ReplacingProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    with caplog.at_level(logging.WARNING, logger="recalltrace.tracer"):
        add_keeping_others(provider, SpanCapture())
    assert "made ReplacingProvider drop 1 span processor(s)" in caplog.text
