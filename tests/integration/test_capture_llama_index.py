"""A LlamaIndex query engine (MockLLM, MockEmbedding, in-memory vector index) instrumented by
OpenInference, with no recalltrace decorator: one record per query, with the question, the
retrieved node ids and texts in the engine's rank order and the answer, scored by a real
``recalltrace worker --once``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from llama_index.core import Settings, VectorStoreIndex
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms import MockLLM
from llama_index.core.schema import TextNode
from openinference.instrumentation.llama_index import LlamaIndexInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from sqlalchemy import Engine

import recalltrace
from tests.support.capture import CORPUS, QUESTIONS, run_worker, stored
from tests.support.judge_server import JudgeServer


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
    Settings.llm = MockLLM(max_tokens=6)
    Settings.embed_model = MockEmbedding(embed_dim=8)
    instrumentor = LlamaIndexInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    yield provider
    instrumentor.uninstrument()
    recalltrace.shutdown(5.0)


@pytest.mark.postgres
def test_llama_index_queries_are_stored_and_scored(
    provider: TracerProvider, postgres_url: str, pg_engine: Engine
) -> None:
    nodes = [TextNode(id_=doc_id, text=text) for doc_id, text in CORPUS.items()]
    index = VectorStoreIndex(nodes)  # building the index is no request: nothing is stored
    assert recalltrace.flush(10.0)
    assert stored(pg_engine) == []

    engine = index.as_query_engine(similarity_top_k=2)
    expected = []
    for question in QUESTIONS:
        response = engine.query(question)
        ranked = [(n.node.node_id, n.node.get_content()) for n in response.source_nodes]
        expected.append((question, ranked, str(response)))
    assert recalltrace.flush(10.0)

    records = stored(pg_engine)
    assert len(records) == len(QUESTIONS)
    for record, (question, ranked, answer) in zip(records, expected, strict=True):
        assert record.user_input == question
        assert list(zip(record.ids, record.contents, strict=True)) == ranked
        assert record.response == answer and answer.strip()
        assert record.app_name == "RetrieverQueryEngine.query"
        assert record.notes == []
        recalltrace.set_reference(
            record.trace_id,
            reference=ranked[0][1],
            reference_contexts=[ranked[0][1]],
            reference_context_ids=[ranked[0][0]],
        )
    assert recalltrace.flush(10.0)

    with JudgeServer() as judge:
        done = run_worker(postgres_url, judge)
    assert done.returncode == 0, done.stderr
    for record in stored(pg_engine):
        assert len(record.scores) == 6
        assert set(record.scores.values()) == {"scored"}, record.scores
