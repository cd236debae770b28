"""A LangChain app instrumented by OpenInference, with no recalltrace decorator: span capture
stores one record per request (question, retrieved ids and contents in rank order, answer), and
a real ``recalltrace worker --once`` scores them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.language_models.fake import FakeListLLM
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import PromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnablePassthrough
from openinference.instrumentation.langchain import LangChainInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from sqlalchemy import Engine

import recalltrace
from tests.support import ROOT
from tests.support.capture import (
    ANSWERS,
    CORPUS,
    QUESTIONS,
    check_requests,
    ranked,
    run_worker,
    stored,
)
from tests.support.cli import run_cli
from tests.support.judge_server import JudgeServer


class KnowledgeBase(BaseRetriever):
    """Returns the corpus documents ranked for the question (ids on the documents only)."""

    def _get_relevant_documents(self, query: str, *, run_manager: Any = None) -> list[Document]:
        return [Document(page_content=CORPUS[i], id=i) for i in ranked(query)]


def build_chain() -> Any:
    llm = FakeListLLM(responses=[ANSWERS[q] for q in QUESTIONS])
    prompt = PromptTemplate.from_template("Context:\n{context}\n\nQuestion: {question}")
    context = KnowledgeBase() | (lambda docs: "\n".join(d.page_content for d in docs))
    return (
        {"context": context, "question": RunnablePassthrough()} | prompt | llm | StrOutputParser()
    )


@pytest.fixture
def provider(postgres_url: str, pg_engine: Engine) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    recalltrace.configure(
        database_url=postgres_url,
        tracer_provider=provider,
        capture_spans=True,
        service_name="langchain-app",
        flush_interval=0.05,
        handle_signals=False,
    )
    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    yield provider
    instrumentor.uninstrument()
    recalltrace.shutdown(5.0)


@pytest.mark.postgres
def test_langchain_requests_are_stored_and_scored(
    provider: TracerProvider, postgres_url: str, pg_engine: Engine
) -> None:
    chain = build_chain()
    for question in QUESTIONS:
        assert chain.invoke(question) == ANSWERS[question]
    assert recalltrace.flush(10.0)

    records = stored(pg_engine)
    check_requests(records, app_name="RunnableSequence")
    assert all(r.notes == [] for r in records)
    for record in records:
        question = record.user_input
        assert question is not None
        recalltrace.set_reference(
            record.trace_id,
            reference=ANSWERS[question],
            reference_contexts=[CORPUS[ranked(question)[0]]],
            reference_context_ids=[ranked(question)[0]],
        )
    assert recalltrace.flush(10.0)

    with JudgeServer() as judge:
        done = run_worker(postgres_url, judge)
    assert done.returncode == 0, done.stderr
    for record in stored(pg_engine):
        assert len(record.scores) == 6
        assert set(record.scores.values()) == {"scored"}, record.scores


@pytest.mark.postgres
def test_documents_without_ids_are_noted_and_the_id_variant_is_skipped(
    provider: TracerProvider, postgres_url: str, pg_engine: Engine
) -> None:
    class NoIds(BaseRetriever):
        def _get_relevant_documents(self, query: str, *, run_manager: Any = None) -> Any:
            return [Document(page_content=CORPUS[i]) for i in ranked(query)]

    llm = FakeListLLM(responses=["Paris."])
    chain = NoIds() | (lambda docs: docs[0].page_content) | llm
    question = next(iter(QUESTIONS))
    chain.invoke(question)
    assert recalltrace.flush(10.0)
    (record,) = stored(pg_engine)
    assert record.ids == [None, None]
    assert record.contents == [CORPUS[i] for i in ranked(question)]
    assert any("carry no document ids" in note for note in record.notes)
    recalltrace.set_reference(record.trace_id, reference_context_ids=["d1"], reference="Paris.")
    assert recalltrace.flush(10.0)
    with JudgeServer() as judge:
        done = run_worker(postgres_url, judge)
    assert done.returncode == 0, done.stderr
    (record,) = stored(pg_engine)
    assert record.scores["id_based_context_recall"] == "skipped"
    assert record.scores["llm_context_recall"] == "scored"


@pytest.mark.postgres
def test_documents_without_content_are_noted_and_the_text_variants_are_skipped(
    provider: TracerProvider, postgres_url: str, pg_engine: Engine
) -> None:
    class IdsOnly(BaseRetriever):
        def _get_relevant_documents(self, query: str, *, run_manager: Any = None) -> Any:
            return [Document(page_content="", id=i) for i in ranked(query)]

    llm = FakeListLLM(responses=["Paris."])
    chain = IdsOnly() | (lambda docs: "no text") | llm
    question = next(iter(QUESTIONS))
    chain.invoke(question)
    assert recalltrace.flush(10.0)
    (record,) = stored(pg_engine)
    assert record.ids == ranked(question)
    assert any("carry no document content" in note for note in record.notes)
    recalltrace.set_reference(
        record.trace_id,
        reference="Paris is the capital.",
        reference_contexts=[CORPUS["d1"]],
        reference_context_ids=["d1"],
    )
    assert recalltrace.flush(10.0)
    with JudgeServer() as judge:
        done = run_worker(postgres_url, judge)
    assert done.returncode == 0, done.stderr
    (record,) = stored(pg_engine)
    assert record.scores["id_based_context_recall"] == "scored"
    assert record.scores["llm_context_recall"] == "skipped"
    assert record.scores["non_llm_context_recall"] == "skipped"


@pytest.mark.postgres
def test_doctor_reports_the_fields_the_spans_lacked_per_app(
    provider: TracerProvider, postgres_url: str, pg_engine: Engine
) -> None:
    class NoIds(BaseRetriever):
        def _get_relevant_documents(self, query: str, *, run_manager: Any = None) -> Any:
            return [Document(page_content=CORPUS[i]) for i in ranked(query)]

    build_chain().invoke(next(iter(QUESTIONS)))
    (NoIds() | (lambda docs: docs[0].page_content)).invoke(list(QUESTIONS)[1])
    assert recalltrace.flush(10.0)
    done = run_cli("doctor", "--database-url", postgres_url, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "RunnableSequence: 2 record(s), 2 captured from spans" in done.stdout
    assert "retrieved_context_ids      missing in 1 of 2" in done.stdout
    assert "user_input                 carried by all" in done.stdout
