"""The same LangChain app instrumented by OpenLLMetry (``opentelemetry-instrumentation-
langchain``) instead of OpenInference, with no recalltrace decorator: its ``workflow`` span is
the request, its ``vector_db_retrieve`` span the retrieval (ids from the documents' metadata),
its ``text_completion`` span the answer; a real ``recalltrace worker --once`` scores them."""

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
from opentelemetry.instrumentation.langchain import LangchainInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from sqlalchemy import Engine

import recalltrace
from tests.support.capture import (
    ANSWERS,
    CORPUS,
    QUESTIONS,
    check_requests,
    ranked,
    run_worker,
    stored,
)
from tests.support.judge_server import JudgeServer


class KnowledgeBase(BaseRetriever):
    """A vector store's documents: the id is in the metadata."""

    def _get_relevant_documents(self, query: str, *, run_manager: Any = None) -> list[Document]:
        return [Document(page_content=CORPUS[i], metadata={"id": i}) for i in ranked(query)]


@pytest.fixture
def provider(postgres_url: str, pg_engine: Engine) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    recalltrace.configure(
        database_url=postgres_url,
        tracer_provider=provider,
        capture_spans=True,
        flush_interval=0.05,
        handle_signals=False,
    )
    instrumentor = LangchainInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    yield provider
    instrumentor.uninstrument()
    recalltrace.shutdown(5.0)


@pytest.mark.postgres
def test_openllmetry_requests_are_stored_and_scored(
    provider: TracerProvider, postgres_url: str, pg_engine: Engine
) -> None:
    llm = FakeListLLM(responses=[ANSWERS[q] for q in QUESTIONS])
    prompt = PromptTemplate.from_template("Context:\n{context}\n\nQuestion: {question}")
    context = KnowledgeBase() | (lambda docs: "\n".join(d.page_content for d in docs))
    chain = (
        {"context": context, "question": RunnablePassthrough()} | prompt | llm | StrOutputParser()
    )
    for question in QUESTIONS:
        assert chain.invoke(question) == ANSWERS[question]
    assert recalltrace.flush(10.0)

    records = stored(pg_engine)
    check_requests(records, app_name="RunnableSequence")
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
        assert set(record.scores.values()) == {"scored"}, record.scores
        assert len(record.scores) == 6
