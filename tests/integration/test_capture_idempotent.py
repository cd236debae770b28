"""Span capture stores a request once however often its spans reach it: a SpanCapture added
twice to a provider sees every span start and end twice; a SpanCapture added by hand next to
``configure(capture_spans=True)`` sees the whole request a second time. Requests that merely
share ids (a process that seeded ``random``) are still each stored."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider

import recalltrace
from tests.support.capture import ANSWERS, CORPUS, QUESTIONS, ranked
from tests.support.tracer_helpers import Traced, dropped, make_traced

LLM_USAGE = [{"model": "m", "prompt_tokens": 30, "completion_tokens": 5, "total_tokens": 35}]


def run_request(provider: TracerProvider, question: str) -> None:
    """One request as OpenInference spans: a chain, a retriever with its documents and a model
    call with 30 + 5 tokens."""
    tracer = provider.get_tracer("vendor")
    with tracer.start_as_current_span(
        "chain", attributes={"openinference.span.kind": "CHAIN", "input.value": question}
    ):
        attributes: dict[str, str] = {"openinference.span.kind": "RETRIEVER"}
        for index, doc_id in enumerate(ranked(question)):
            attributes[f"retrieval.documents.{index}.document.id"] = doc_id
            attributes[f"retrieval.documents.{index}.document.content"] = CORPUS[doc_id]
        with tracer.start_as_current_span("retrieve", attributes=attributes):
            pass
        with tracer.start_as_current_span(
            "llm",
            attributes={
                "openinference.span.kind": "LLM",
                "llm.model_name": "m",
                "llm.output_messages.0.message.content": ANSWERS[question],
                "llm.token_count.prompt": 30,
                "llm.token_count.completion": 5,
            },
        ):
            pass


def check_once_each(traced: Traced, questions: list[str]) -> None:
    records = traced.records()
    assert sorted(r.user_input or "" for r in records) == sorted(questions)
    for record in records:
        question = record.user_input or ""
        assert [c.id for c in record.retrieved_contexts] == ranked(question)
        assert record.response == ANSWERS[question]
        assert record.metadata["llm"] == LLM_USAGE


@pytest.fixture
def traced() -> Iterator[Traced]:
    state = make_traced()
    yield state
    recalltrace.shutdown(2.0)


def test_a_span_capture_added_twice_sees_every_span_twice_and_stores_once(
    traced: Traced,
) -> None:
    capture = recalltrace.SpanCapture()
    traced.provider.add_span_processor(capture)
    traced.provider.add_span_processor(capture)
    before = dropped("capture_duplicate")
    for question in QUESTIONS:
        run_request(traced.provider, question)
    check_once_each(traced, list(QUESTIONS))
    # The retriever and the model span of each request ended twice; the repeats are counted.
    assert dropped("capture_duplicate") - before == 2 * len(QUESTIONS)


def test_a_span_capture_added_by_hand_next_to_capture_spans_stores_once() -> None:
    traced = make_traced(capture_spans=True)
    try:
        traced.provider.add_span_processor(recalltrace.SpanCapture())
        for question in QUESTIONS:
            run_request(traced.provider, question)
        check_once_each(traced, list(QUESTIONS))
    finally:
        recalltrace.shutdown(2.0)


def test_requests_with_the_same_ids_in_a_seeded_process_are_each_stored() -> None:
    traced = make_traced(capture_spans=True)
    try:
        ids = set()
        question = next(iter(QUESTIONS))
        for _ in range(5):
            random.seed(1234)  # the SDK draws the same trace and span ids every time
            tracer = traced.provider.get_tracer("vendor")
            with tracer.start_as_current_span("server") as server:
                ids.add((server.get_span_context().trace_id, server.get_span_context().span_id))
                run_request(traced.provider, question)
        assert len(ids) == 1
        records = traced.records()
        assert len(records) == 5
        assert len({r.trace_id for r in records}) == 5
        assert all(r.metadata["llm"] == LLM_USAGE for r in records)
    finally:
        recalltrace.shutdown(2.0)
