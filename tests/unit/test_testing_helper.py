"""The public testing helper: what an application's own test suite would write."""

from __future__ import annotations

import pytest

import recalltrace
from recalltrace.storage.contracts import TraceNotFound
from recalltrace.storage.records import ReferenceUpdate
from recalltrace.testing import MemorySink, capture


@recalltrace.retrieval
def _search(query: str) -> list[dict[str, str]]:
    return [
        {"id": "kb-12", "content": "Reset your password from the sign-in page."},
        {"id": "kb-7", "content": "Passwords expire after 90 days."},
    ]


@recalltrace.rag
def _answer(question: str) -> str:
    docs = _search(question)
    return f"{docs[0]['content']} (api_key=sk-live-abcdefabcdefabcdefabcdef)"


def test_capture_gives_the_records_the_database_would_get() -> None:
    with capture(service_name="help-desk") as traced:
        assert _answer("How do I reset my password?").startswith("Reset")
        record = traced.record()
        assert record.user_input == "How do I reset my password?"
        assert [c.id for c in record.retrieved_contexts] == ["kb-12", "kb-7"]
        assert record.service_name == "help-desk"
        assert "sk-live-abcdef" not in (record.response or "")  # scrubbed, as stored
        assert {span.name for span in traced.spans()} >= {"_answer", "_search"}


def test_capture_counts_every_request_and_shuts_the_tracer_down() -> None:
    with capture() as traced:
        for index in range(3):
            _answer(f"question {index}")
        assert len(traced.records()) == 3
    with (
        pytest.raises(AssertionError, match="expected one traced request, got 0"),
        capture() as empty,
    ):
        empty.record()


def test_memory_sink_applies_references_and_refuses_unknown_ids() -> None:
    sink = MemorySink()
    with capture(sink=sink) as traced:
        _answer("q")
        (record,) = traced.records()
    assert sink.attach_reference(ReferenceUpdate(record.trace_id, reference="ref")) == 1
    assert sink.by_id(record.trace_id).reference == "ref"
    with pytest.raises(TraceNotFound):
        sink.attach_reference(ReferenceUpdate("0" * 32, reference="x"))
    sink.clear()
    assert sink.records == []
