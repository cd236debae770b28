"""Bad input where it enters: the user's call is never disturbed, the worker never crashes, and
every odd value is either stored (with a note saying what was changed) or counted as a drop.

The tracer writes to real storage (SQLite and Postgres) through the writer thread; nothing is
mocked. Under pytest the tracer raises its *own* internal errors into the caller, so a value that
trips the tracer's code fails these tests instead of being logged.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select

import recalltrace
from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.models import RetrievedContext, Trace
from tests.support.tracer_helpers import dropped, make_traced


class Unprintable:
    """An object whose ``__str__`` and ``__repr__`` raise."""

    def __str__(self) -> str:
        raise RuntimeError("this object cannot be printed")

    __repr__ = __str__


def nested(depth: int) -> dict[str, Any]:
    root: dict[str, Any] = {}
    node = root
    for _ in range(depth):
        node["child"] = {}
        node = node["child"]
    return root


@pytest.fixture
def storage_tracer(database_url: str) -> Iterator[str]:
    """The tracer writing to a fresh database of each backend (one batch per flush)."""
    make_traced(
        open_storage=True,
        database_url=database_url,
        flush_interval=30.0,
        max_batch_size=256,
        max_write_attempts=2,
    )
    yield database_url
    recalltrace.shutdown(5.0)


def stored(url: str) -> dict[str, dict[str, Any]]:
    """Stored traces by app name, with their contexts."""
    engine = create_engine_from_url(url)
    with engine.connect() as conn:
        traces = conn.execute(select(Trace)).mappings().all()
        contexts = (
            conn.execute(select(RetrievedContext).order_by(RetrievedContext.position))
            .mappings()
            .all()
        )
    engine.dispose()
    by_app: dict[str, dict[str, Any]] = {}
    for row in traces:
        record = dict(row)
        record["contexts"] = [dict(c) for c in contexts if c["trace_id"] == row["trace_id"]]
        by_app[row["app_name"]] = record
    return by_app


def traced_call(app: str, documents: Any, answer: Any, question: Any = "question?") -> Any:
    @recalltrace.retrieval
    def search(query: Any) -> Any:
        return documents

    @recalltrace.rag(app, input_param="question")
    def respond(question: Any) -> Any:
        search(question)
        return answer

    return respond(question)


def test_unstorable_text_does_not_poison_the_batch(storage_tracer: str) -> None:
    """NUL characters, lone surrogates (non-UTF-8 bytes decoded with surrogateescape) and
    over-long names and ids are cleaned and noted; the good records of the same batch and the
    odd ones are all stored, nothing is dropped."""
    before = dropped()
    non_utf8 = b"caf\xe9 au lait \xff".decode("utf-8", "surrogateescape")
    traced_call("nul", ["a\x00b"], "answer with a NUL \x00 inside")
    traced_call("surrogates", [non_utf8], non_utf8)
    traced_call("nul-metadata", [{"content": "c", "metadata": {"k\x00": "v\x00"}}], "ok")
    traced_call("long-id", [{"content": "c", "id": "doc/" + "x" * 600}], "ok")
    traced_call("n" * 300, ["c"], "ok")
    for index in range(5):
        traced_call(f"good-{index}", ["Paris is the capital of France."], "Paris.")
    assert recalltrace.flush(20.0)
    assert dropped() == before
    rows = stored(storage_tracer)
    assert {f"good-{index}" for index in range(5)} <= set(rows)
    nul = rows["nul"]
    assert "\x00" not in nul["response"] and nul["response"].startswith("answer with a NUL")
    assert nul["contexts"][0]["content"] == "a\ufffdb"
    assert any("unstorable character" in note and "response" in note for note in nul["notes"])
    surrogates = rows["surrogates"]
    assert surrogates["response"] == "caf\ufffd au lait \ufffd"
    assert any("retrieved_contexts[0].content" in note for note in surrogates["notes"])
    assert rows["nul-metadata"]["contexts"][0]["metadata"] == {"k\ufffd": "v\ufffd"}
    long_id = rows["long-id"]
    assert len(long_id["contexts"][0]["context_id"]) == 500
    assert any("truncated retrieved_contexts[0].id" in note for note in long_id["notes"])
    long_name = rows["n" * 200]
    assert any("truncated app_name from 300 to 200" in note for note in long_name["notes"])


def test_odd_values_never_reach_the_caller_and_are_stored(storage_tracer: str) -> None:
    """Each decorated call returns exactly what the function returned, and each trace is
    stored; what could not be kept as it was is noted on the record."""
    before = dropped()
    circular: dict[str, Any] = {"name": "loop"}
    circular["self"] = circular
    unprintable = Unprintable()
    cases: dict[str, tuple[Any, Any, Any]] = {
        # app: (documents, answer, question)
        "returns-none": (["doc"], None, "q"),
        "huge-document": (["x" * 3_000_000, "small"], "ok", "q"),
        "binary-document": ([b"\x89PNG\r\n\x1a\n\x00\xff"], "ok", "q"),
        "deep-metadata": ([{"content": "deep", "metadata": nested(5000)}], "ok", "q"),
        "circular-metadata": ([{"content": "circle", "metadata": circular}], "ok", "q"),
        "unprintable-metadata": ([{"content": "m", "metadata": {"k": unprintable}}], "ok", "q"),
        "unprintable-document": ([unprintable], "ok", "q"),
        "unprintable-question": (["doc"], "ok", unprintable),
        "unprintable-answer": (["doc"], unprintable, "q"),
    }
    for app, (documents, answer, question) in cases.items():
        assert traced_call(app, documents, answer, question) is answer, app
    assert recalltrace.flush(20.0)
    assert dropped() == before
    rows = stored(storage_tracer)
    assert set(cases) <= set(rows)
    assert rows["returns-none"]["response"] is None
    huge = rows["huge-document"]
    assert len(huge["contexts"][0]["content"]) == 100_000
    assert huge["contexts"][1]["content"] == "small"
    assert "truncated retrieved_contexts[0] from 3000000 to 100000 characters" in huge["notes"]
    assert "PNG" in rows["binary-document"]["contexts"][0]["content"]
    deep = rows["deep-metadata"]["contexts"]
    assert [c["content"] for c in deep] == ["deep"]
    json.dumps(deep[0]["metadata"])  # stored as JSON, depth bounded
    assert [c["content"] for c in rows["circular-metadata"]["contexts"]] == ["circle"]
    metadata = rows["unprintable-metadata"]["contexts"]
    assert [c["content"] for c in metadata] == ["m"]
    assert metadata[0]["metadata"] == {"k": "<Unprintable not printable: RuntimeError>"}
    # A document that cannot be read at all is kept empty in its place with a note (and logged
    # once); the trace is kept.
    unreadable = rows["unprintable-document"]
    assert [(c["content"], c["context_id"]) for c in unreadable["contexts"]] == [("", None)]
    assert any(
        "could not be read" in note and "position 0 (RuntimeError)" in note
        for note in unreadable["notes"]
    )
    question = rows["unprintable-question"]
    assert question["user_input"] is None
    assert any("user_input" in note for note in question["notes"])
