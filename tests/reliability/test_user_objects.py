"""Objects the application hands over are read once, off the request path, with a time bound:
one whose ``__str__`` raises, hangs or is slow never stops storage nor slows the request, and
what is stored is what the values were when the call happened (a snapshot)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

import recalltrace
from tests.support.tracer_helpers import Traced, make_traced


@pytest.fixture
def traced() -> Iterator[Traced]:
    state = make_traced()
    yield state
    recalltrace.shutdown(5.0)


class Raising:
    def __str__(self) -> str:
        raise RuntimeError("no printing")

    __repr__ = __str__


class Hanging:
    def __str__(self) -> str:
        time.sleep(3600)
        return "never"

    __repr__ = __str__


class Slow:
    threads: ClassVar[list[int]] = []

    def __str__(self) -> str:
        Slow.threads.append(threading.get_ident())
        time.sleep(0.3)
        return "slow but fine"

    __repr__ = __str__


@recalltrace.retrieval
def search(query: Any) -> list[dict[str, Any]]:
    return [{"id": "doc-1", "content": "Paris is the capital of France.",
             "metadata": {"source": "kb/1.md", "owner": Raising()}}]  # fmt: skip


@recalltrace.rag("objects", input_param="question")
def answer(question: Any) -> str:
    search(question)
    return "Paris."


def test_a_raising_str_leaves_the_value_out_with_a_note(traced: Traced) -> None:
    answer(Raising())
    assert recalltrace.flush(10.0)
    (record,) = traced.sink.records
    assert record.user_input is None
    assert any("user_input not captured" in note for note in record.notes)
    assert record.retrieved_contexts[0].content == "Paris is the capital of France."
    assert "not printable" in str(record.retrieved_contexts[0].metadata["owner"])


def test_a_hanging_str_does_not_stop_storage(traced: Traced) -> None:
    answer(Hanging())
    answer("What is the capital of France?")
    started = time.monotonic()
    assert recalltrace.flush(15.0)
    assert time.monotonic() - started < 10.0
    hung, fine = traced.sink.records
    assert hung.user_input is None and hung.response == "Paris."
    assert any("did not finish within 2 s" in note for note in hung.notes)
    assert fine.user_input == "What is the capital of France?"
    # The next records are read as usual: the stuck reader was replaced.
    answer("And of Spain?")
    assert recalltrace.flush(10.0)
    assert traced.sink.records[-1].user_input == "And of Spain?"


def test_a_slow_str_runs_off_the_request_path(traced: Traced) -> None:
    Slow.threads.clear()
    started = time.perf_counter()
    answer(Slow())
    elapsed = time.perf_counter() - started
    assert recalltrace.flush(10.0)
    assert Slow.threads and threading.get_ident() not in Slow.threads
    assert elapsed < 0.3, "the request waited for __str__"
    (record,) = traced.sink.records
    assert "slow but fine" in (record.user_input or "")


def test_records_are_snapshots_of_the_call(traced: Traced) -> None:
    question = {"text": "What is the capital of France?", "filters": ["geo"]}
    document_metadata = {"source": "kb/1.md", "tags": ["capital"]}

    @recalltrace.retrieval
    def lookup(query: Any) -> list[dict[str, Any]]:
        return [{"id": "d1", "content": "Paris.", "metadata": document_metadata}]

    @recalltrace.rag("snapshots", input_param="q")
    def ask(q: Any) -> str:
        lookup(q)
        return "Paris."

    ask(question)
    # The application reuses its objects right after the call, before the writer runs.
    question["text"] = "CHANGED"
    question["filters"].append("CHANGED")
    document_metadata["source"] = "CHANGED"
    document_metadata["tags"].clear()
    assert recalltrace.flush(10.0)
    (record,) = traced.sink.records
    assert "CHANGED" not in (record.user_input or "")
    assert "What is the capital of France?" in (record.user_input or "")
    assert record.retrieved_contexts[0].metadata == {"source": "kb/1.md", "tags": ["capital"]}
