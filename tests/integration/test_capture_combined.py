"""Span capture with hand-written spans of each convention, decorators and instrumentors in one
request (each call recorded once), and configure() before or after the application's own
provider."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.language_models.fake import FakeListLLM
from langchain_core.retrievers import BaseRetriever
from openinference.instrumentation.langchain import LangChainInstrumentor

import recalltrace
from tests.support import ROOT
from tests.support.capture import CORPUS, ranked
from tests.support.tracer_helpers import Traced, dropped, make_traced

QUESTION = "What is the capital of France?"


@pytest.fixture
def traced() -> Iterator[Traced]:
    state = make_traced(capture_spans=True)
    yield state
    recalltrace.shutdown(2.0)


def test_genai_spans_make_one_record(traced: Traced) -> None:
    tracer = traced.provider.get_tracer("vendor")
    documents = [{"id": i, "score": 0.9, "content": CORPUS[i]} for i in ranked(QUESTION)]
    with tracer.start_as_current_span(
        "invoke_agent",
        attributes={
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "helper",
            "gen_ai.input.messages": json.dumps(
                [{"role": "user", "parts": [{"type": "text", "content": QUESTION}]}]
            ),
        },
    ):
        with tracer.start_as_current_span(
            "retrieval",
            attributes={
                "gen_ai.operation.name": "retrieval",
                "gen_ai.data_source.id": "kb",
                "gen_ai.retrieval.query.text": QUESTION,
                "gen_ai.retrieval.documents": json.dumps(documents),
            },
        ):
            pass
        with tracer.start_as_current_span(
            "chat",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "m",
                "gen_ai.usage.input_tokens": 10,
                "gen_ai.usage.output_tokens": 2,
                "gen_ai.output.messages": json.dumps(
                    [{"role": "assistant", "parts": [{"type": "text", "content": "Paris."}]}]
                ),
            },
        ):
            pass
    record = traced.record()
    assert record.app_name == "helper"
    assert record.user_input == QUESTION
    assert [c.id for c in record.retrieved_contexts] == ranked(QUESTION)
    assert record.response == "Paris."
    assert record.metadata["llm"] == [
        {"model": "m", "prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
    ]
    assert record.service_name == "test-service"
    assert record.metadata["data_source_ids"] == ["kb"]


def test_reranked_documents_are_the_contexts(traced: Traced) -> None:
    tracer = traced.provider.get_tracer("vendor")
    with tracer.start_as_current_span("rag") as root:
        root.set_attribute("openinference.span.kind", "CHAIN")
        root.set_attribute("input.value", json.dumps({"question": QUESTION}))
        root.set_attribute("input.mime_type", "application/json")
        with tracer.start_as_current_span("retrieve") as retriever:
            retriever.set_attribute("openinference.span.kind", "RETRIEVER")
            for index, doc_id in enumerate(["d3", "d2", "d1"]):
                retriever.set_attribute(f"retrieval.documents.{index}.document.id", doc_id)
                retriever.set_attribute(
                    f"retrieval.documents.{index}.document.content", CORPUS[doc_id]
                )
        with tracer.start_as_current_span("rerank") as reranker:
            reranker.set_attribute("openinference.span.kind", "RERANKER")
            for index, doc_id in enumerate(["d1", "d2"]):
                prefix = f"reranker.output_documents.{index}.document."
                reranker.set_attribute(prefix + "id", doc_id)
                reranker.set_attribute(prefix + "content", CORPUS[doc_id])
                reranker.set_attribute(prefix + "score", 0.9 - index / 10)
        root.set_attribute("output.value", "Paris.")
    record = traced.record()
    assert record.user_input == QUESTION
    assert [c.id for c in record.retrieved_contexts] == ["d1", "d2"]
    assert [c.score for c in record.retrieved_contexts] == [0.9, 0.8]
    assert record.response == "Paris."  # no model span: the root's output
    assert any("reranker span 'rerank'" in note for note in record.notes)


def test_openllmetry_vector_db_events_and_completion_attributes(traced: Traced) -> None:
    tracer = traced.provider.get_tracer("vendor")
    with tracer.start_as_current_span(
        "ask.workflow",
        attributes={
            "traceloop.span.kind": "workflow",
            "traceloop.workflow.name": "ask",
            "traceloop.entity.input": json.dumps({"inputs": {"question": QUESTION}}),
        },
    ):
        with tracer.start_as_current_span("chroma.query", attributes={"db.system": "chroma"}) as db:
            for index, doc_id in enumerate(ranked(QUESTION)):
                db.add_event(
                    "db.query.result",
                    {
                        "db.query.result.id": doc_id,
                        "db.query.result.document": CORPUS[doc_id],
                        "db.query.result.distance": 0.1 * (index + 1),
                    },
                )
        with tracer.start_as_current_span(
            "openai.chat",
            attributes={
                "llm.request.type": "chat",
                "gen_ai.completion.0.role": "assistant",
                "gen_ai.completion.0.content": "Paris.",
                "gen_ai.usage.prompt_tokens": 12,
                "gen_ai.usage.completion_tokens": 3,
            },
        ):
            pass
    record = traced.record()
    assert record.app_name == "ask"
    assert record.user_input == QUESTION
    assert [(c.id, c.content) for c in record.retrieved_contexts] == [
        (i, CORPUS[i]) for i in ranked(QUESTION)
    ]
    assert record.retrieved_contexts[0].metadata == {"distance": pytest.approx(0.1)}
    assert record.response == "Paris."


def test_a_retrieval_outside_any_request_makes_no_record(traced: Traced) -> None:
    tracer = traced.provider.get_tracer("vendor")
    before = dropped("capture_outside_request")
    with tracer.start_as_current_span(
        "retrieve",
        attributes={
            "openinference.span.kind": "RETRIEVER",
            "retrieval.documents.0.document.content": "x",
        },
    ):
        pass
    with tracer.start_as_current_span("embed", attributes={"openinference.span.kind": "EMBEDDING"}):
        pass
    assert traced.records() == []
    assert dropped("capture_outside_request") == before + 1


class KnowledgeBase(BaseRetriever):
    def _get_relevant_documents(self, query: str, *, run_manager: Any = None) -> list[Document]:
        return [Document(page_content=CORPUS[i], id=i) for i in ranked(query)]


@pytest.fixture
def langchain(traced: Traced) -> Iterator[None]:
    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=traced.provider)
    yield
    instrumentor.uninstrument()


def test_an_instrumented_chain_inside_a_decorated_request_joins_its_record(
    traced: Traced, langchain: None
) -> None:
    chain = KnowledgeBase() | (lambda docs: docs[0].page_content) | FakeListLLM(responses=["P."])

    @recalltrace.rag("support")
    def answer(question: str) -> str:
        return str(chain.invoke(question)) + "!"

    assert answer(QUESTION) == "P.!"
    (record,) = traced.records()  # one record: the decorator's, not a second from the spans
    assert record.app_name == "support"
    assert record.user_input == QUESTION
    assert record.response == "P.!"
    assert [c.id for c in record.retrieved_contexts] == ranked(QUESTION)


def test_a_decorated_retriever_inside_an_instrumented_one_is_recorded_once(
    traced: Traced, langchain: None
) -> None:
    class Decorated(BaseRetriever):
        @recalltrace.retrieval
        def _get_relevant_documents(self, query: str, *, run_manager: Any = None) -> Any:
            return [Document(page_content=CORPUS[i], id=i) for i in ranked(query)]

    @recalltrace.rag
    def answer(question: str) -> str:
        Decorated().invoke(question)
        return "Paris."

    answer(QUESTION)
    (record,) = traced.records()
    assert [c.id for c in record.retrieved_contexts] == ranked(QUESTION)


def test_a_decorated_call_inside_an_instrumentor_span_of_the_same_call_adds_no_span(
    traced: Traced,
) -> None:
    vendor = traced.provider.get_tracer("vendor")

    @recalltrace.retrieval
    def search(query: str) -> list[dict[str, str]]:
        return [{"id": i, "content": CORPUS[i]} for i in ranked(query)]

    @recalltrace.rag
    def answer(question: str) -> str:
        attributes = {"gen_ai.operation.name": "retrieval"}
        with vendor.start_as_current_span("vector search", attributes=attributes) as span:
            docs = search(question)
            span.set_attribute("gen_ai.retrieval.documents", json.dumps(docs))
        return "Paris."

    answer(QUESTION)
    (record,) = traced.records()
    assert [c.id for c in record.retrieved_contexts] == ranked(QUESTION)
    assert [s.name for s in traced.spans()] == ["vector search", "answer"]


SCRIPT = """
import json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
import recalltrace
from recalltrace.testing import MemorySink

sink = MemorySink()
exporter = InMemorySpanExporter()

def app_setup():
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

def configure():
    recalltrace.configure(sink=sink, capture_spans=True, handle_signals=False)

steps = [app_setup, configure] if sys.argv[1] == "app-first" else [configure, app_setup]
for step in steps:
    step()

@recalltrace.rag("decorated")
def decorated(question):
    return "yes"

decorated("Is this stored?")
vendor = trace.get_tracer("vendor")
with vendor.start_as_current_span("chain", attributes={
    "openinference.span.kind": "CHAIN", "input.value": "And this?", "output.value": "too"}):
    with vendor.start_as_current_span("retrieve", attributes={
        "openinference.span.kind": "RETRIEVER",
        "retrieval.documents.0.document.id": "d1",
        "retrieval.documents.0.document.content": "text"}):
        pass
recalltrace.flush(5)
print(json.dumps({
    "records": sorted((r.app_name, r.user_input) for r in sink.records),
    "exported": sorted(s.name for s in exporter.get_finished_spans()),
}))
"""


def run_order(order: str, tmp_path: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, order],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "Overriding of current TracerProvider is not allowed" not in done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_configure_before_or_after_the_applications_provider_ends_the_same(
    tmp_path: Path,
) -> None:
    app_first = run_order("app-first", tmp_path)
    recalltrace_first = run_order("recalltrace-first", tmp_path)
    assert app_first == recalltrace_first
    assert app_first["records"] == [["chain", "And this?"], ["decorated", "Is this stored?"]]
    assert app_first["exported"] == ["chain", "decorated", "retrieve"]


def test_open_traces_are_bounded_and_what_is_pushed_out_is_counted() -> None:
    import time

    state = make_traced()
    try:
        capture = recalltrace.SpanCapture(max_open_traces=2, open_trace_timeout=0.05)
        state.provider.add_span_processor(capture)
        tracer = state.provider.get_tracer("vendor")
        from opentelemetry import trace as otel_trace

        attributes = {"openinference.span.kind": "CHAIN", "input.value": "q"}
        found = {"openinference.span.kind": "RETRIEVER", "retrieval.documents.0.document.id": "d"}

        def request(name: str) -> Any:
            root = tracer.start_span(name, attributes=attributes)
            context = otel_trace.set_span_in_context(root)
            tracer.start_span("retrieve", context=context, attributes=found).end()
            return root

        evicted, timed_out = dropped("capture_evicted"), dropped("capture_timeout")
        roots = [request(f"chain-{i}") for i in range(3)]
        assert dropped("capture_evicted") == evicted + 1  # the oldest open trace made room
        for root in roots:
            root.end()
        assert sorted(r.app_name for r in state.records()) == ["chain-1", "chain-2"]

        stale = request("stale")
        time.sleep(1.1)  # past the timeout and the once-a-second sweep
        request("next").end()
        assert dropped("capture_timeout") == timed_out + 1
        stale.end()  # arrives after its trace was dropped: not stored, not counted twice
        assert sorted(r.app_name for r in state.records()) == ["chain-1", "chain-2", "next"]
        assert dropped("capture_timeout") == timed_out + 1
    finally:
        recalltrace.shutdown(2.0)


def test_a_decorated_request_inside_an_instrumented_chain_is_stored_once(
    traced: Traced, langchain: None
) -> None:
    from langchain_core.runnables import RunnableLambda

    @recalltrace.rag("inner")
    def answer(question: str) -> str:
        KnowledgeBase().invoke(question)
        return "Paris."

    outer = RunnableLambda(lambda q: q) | RunnableLambda(answer)
    assert outer.invoke(QUESTION) == "Paris."
    (record,) = traced.records()
    assert record.app_name == "inner"
    assert [c.id for c in record.retrieved_contexts] == ranked(QUESTION)


def oi_request(tracer: Any, question: str) -> None:
    with tracer.start_as_current_span("chain") as root:
        root.set_attribute("openinference.span.kind", "CHAIN")
        root.set_attribute("input.value", question)
        with tracer.start_as_current_span("retrieve") as retriever:
            retriever.set_attribute("openinference.span.kind", "RETRIEVER")
            retriever.set_attribute("retrieval.documents.0.document.id", "d1")
            content = "retrieval.documents.0.document.content"
            retriever.set_attribute(content, "Mail ops@example.com")
        root.set_attribute("output.value", "Ask ops.")


def test_captured_records_are_scrubbed_like_decorated_ones(traced: Traced) -> None:
    oi_request(traced.provider.get_tracer("vendor"), "My key is sk-abcdefghijklmnopqrstuvwx")
    record = traced.record()
    assert "sk-abc" not in (record.user_input or "")
    assert "ops@example.com" not in record.retrieved_contexts[0].content
    assert any(note.startswith("scrubbed api_key in user_input") for note in record.notes)


def test_captured_requests_are_sampled_like_decorated_ones() -> None:
    state = make_traced(capture_spans=True, sample_rate=0.0)
    try:
        oi_request(state.provider.get_tracer("vendor"), QUESTION)
        assert state.records() == []
        from recalltrace.tracer._runtime import stats

        assert stats().snapshot()["captured"].get("chain", 0) >= 1
    finally:
        recalltrace.shutdown(2.0)


def test_finished_traces_waiting_for_a_stuck_writer_are_bounded_and_counted() -> None:
    """The requests in finished spans are found on the writer thread; while it is stuck (in a
    write that hangs), what waits for it is bounded (the spans' starts and ends noted for it,
    then the finished traces), and what is past the bound is counted."""
    import threading

    from opentelemetry import trace as otel_trace

    from recalltrace.testing import MemorySink

    release = threading.Event()
    writing = threading.Event()

    class StuckSink(MemorySink):
        def write_traces(self, records: Any) -> None:
            writing.set()
            release.wait(30)
            super().write_traces(records)

    sink = StuckSink()
    state = make_traced(sink)
    try:
        capture = recalltrace.SpanCapture(max_open_traces=3)
        state.provider.add_span_processor(capture)
        tracer = state.provider.get_tracer("vendor")
        attributes = {"openinference.span.kind": "CHAIN", "input.value": "q"}
        found = {"openinference.span.kind": "RETRIEVER", "retrieval.documents.0.document.id": "d"}

        def request(name: str) -> None:
            root = tracer.start_span(name, attributes=attributes)
            context = otel_trace.set_span_in_context(root)
            tracer.start_span("retrieve", context=context, attributes=found).end()
            root.end()

        request("first")
        assert writing.wait(10)  # the writer thread now hangs in the sink
        before = dropped("capture_backlog")
        for index in range(5):
            request(f"waiting-{index}")
        # Each request notes four events; at six (twice max_open_traces) the application's
        # thread replays them itself: three traces wait, the fourth is past the bound.
        assert len(capture._journal) <= 6
        assert len(capture._finished) == 3
        assert dropped("capture_backlog") == before + 1
        release.set()
        assert recalltrace.flush(10)
        assert dropped("capture_backlog") == before + 2  # the fifth, replayed by the writer
        stored = sorted(r.app_name for r in sink.records)
        assert stored == ["first", "waiting-0", "waiting-1", "waiting-2"]
    finally:
        release.set()
        recalltrace.shutdown(2.0)
