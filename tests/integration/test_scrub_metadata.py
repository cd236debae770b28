"""Scrubbing of what the record's and documents' metadata hold beyond text, stored in real
SQLite and Postgres: card numbers kept as numbers (int or float) are redacted as their text
would be, timestamps are not taken for cards, and a secret held under a sensitive key never
reaches the notes (which name metadata keys)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

import recalltrace
from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.history import History
from tests.support.factories import make_history

CARD = 4539148803436467  # Luhn-valid
AMEX = 378282246310005  # Luhn-valid, 15 digits
EPOCH_MS = 1732873123456  # a 13-digit epoch millisecond timestamp that passes Luhn
EPOCH_NS = 1732873123456789012
PASSWORD = "correcthorsebatterystaple"
GITHUB = "ghp_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5"


@pytest.fixture(params=["thread", "process"])
def stored(database_url: str, request: pytest.FixtureRequest) -> Iterator[History]:
    """The tracer storing from its writer thread or through a storage process (where the
    records are assembled and scrubbed in the child)."""
    recalltrace.configure(
        database_url=database_url,
        storage_process=request.param == "process",
        tracer_provider=TracerProvider(),
        service_name="metadata",
        flush_interval=0.05,
        shutdown_timeout=5.0,
        handle_signals=False,
    )
    engine = create_engine_from_url(database_url)
    yield make_history(engine)
    recalltrace.shutdown(5)
    engine.dispose()


def _ask(metadata: dict[str, Any], doc_metadata: dict[str, Any]) -> str:
    ids: list[str | None] = []

    @recalltrace.retrieval
    def search(query: str) -> list[dict[str, Any]]:
        return [{"id": "d1", "content": "Refunds take 30 days.", "metadata": doc_metadata}]

    @recalltrace.rag("numbers-bot")
    def answer(question: str) -> str:
        ids.append(recalltrace.current_trace_id())
        recalltrace.set_attributes(metadata=metadata)
        search(question)
        return "ok"

    answer("refund?")
    assert recalltrace.flush(10)
    (trace_id,) = ids
    assert trace_id is not None
    return trace_id


def test_card_numbers_held_as_numbers_are_redacted(stored: History) -> None:
    trace_id = _ask(
        {"card": CARD, "amex": float(AMEX), "cards": [CARD], "count": 42, "price": 4.5},
        {"card": CARD, "payer": {"amount_cents": 1999, "pan": float(CARD)}},
    )
    detail = stored.trace(trace_id)
    text = json.dumps([detail.metadata, [dict(c.metadata) for c in detail.contexts]])
    for number in (CARD, AMEX):
        assert str(number) not in text
    assert detail.metadata["card"] == "[REDACTED]"
    assert detail.metadata["amex"] == "[REDACTED]"
    assert detail.metadata["cards"] == ["[REDACTED]"]
    assert detail.metadata["count"] == 42 and detail.metadata["price"] == 4.5
    doc = dict(detail.contexts[0].metadata)
    assert doc["card"] == "[REDACTED]"
    assert doc["payer"] == {"amount_cents": 1999, "pan": "[REDACTED]"}
    assert "scrubbed card_number in metadata.card" in detail.notes
    assert "scrubbed card_number in retrieved_contexts[0].metadata.card" in detail.notes


def test_timestamps_and_ordinary_numbers_are_kept(stored: History) -> None:
    trace_id = _ask(
        {"sent_at_ms": EPOCH_MS, "sent_at_ns": EPOCH_NS, "ms_float": float(EPOCH_MS)},
        {"indexed_at": EPOCH_MS, "page": 7, "size": 123456789},
    )
    detail = stored.trace(trace_id)
    assert detail.metadata["sent_at_ms"] == EPOCH_MS
    assert detail.metadata["sent_at_ns"] == EPOCH_NS
    assert detail.metadata["ms_float"] == float(EPOCH_MS)
    assert dict(detail.contexts[0].metadata) == {
        "indexed_at": EPOCH_MS,
        "page": 7,
        "size": 123456789,
    }
    assert not any("card_number" in note for note in detail.notes)


def test_notes_never_quote_what_a_sensitive_key_holds(stored: History) -> None:
    trace_id = _ask(
        {"password": {PASSWORD: float("nan")}, "auth": {"token": {GITHUB: float("inf")}}},
        {"api_key": {PASSWORD: float("nan")}, "ok": float("nan")},
    )
    detail = stored.trace(trace_id)
    stored_text = json.dumps(
        [detail.notes, detail.metadata, [dict(c.metadata) for c in detail.contexts]]
    )
    assert PASSWORD not in stored_text
    assert GITHUB not in stored_text
    assert detail.metadata["password"] == "[REDACTED]"
    assert any("NaN or infinite" in note for note in detail.notes), detail.notes
    assert any("retrieved_contexts[0].metadata.ok" in note for note in detail.notes)
