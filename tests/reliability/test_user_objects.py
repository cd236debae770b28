"""Objects the application hands over are read once, off the request path, with a time bound:
one whose ``__str__`` raises, hangs or is slow never stops storage nor slows the request, and
what is stored is what the values were when the call happened (a snapshot). Plain values are
never cut, however many readers are stuck, and every value that cannot be read or stored as it
is keeps its record, with a note."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from sqlalchemy import text

import recalltrace
from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.history import History
from recalltrace.tracer import _reader, _runtime
from tests.support.clocks import HANG_GUARD_S, wait_until
from tests.support.factories import make_history
from tests.support.ledger import LedgerCheck
from tests.support.tracer_helpers import Traced, make_traced


@pytest.fixture
def traced() -> Iterator[Traced]:
    state = make_traced()
    yield state
    recalltrace.shutdown(HANG_GUARD_S)


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
    """Printing waits until the test says so (``release``), then succeeds."""

    threads: ClassVar[list[int]] = []
    release = threading.Event()

    def __str__(self) -> str:
        Slow.threads.append(threading.get_ident())
        Slow.release.wait(HANG_GUARD_S)
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
    assert recalltrace.flush(HANG_GUARD_S)
    (record,) = traced.sink.records
    assert record.user_input is None
    assert any("user_input not captured" in note for note in record.notes)
    assert record.retrieved_contexts[0].content == "Paris is the capital of France."
    assert "not printable" in str(record.retrieved_contexts[0].metadata["owner"])


def test_a_hanging_str_does_not_stop_storage(traced: Traced) -> None:
    answer(Hanging())
    answer("What is the capital of France?")
    # Hanging never returns (an hour): the flush ends only if storage goes on without it.
    assert recalltrace.flush(HANG_GUARD_S)
    hung, fine = traced.sink.records
    assert hung.user_input is None and hung.response == "Paris."
    (note,) = [note for note in hung.notes if "did not finish" in note]
    assert "within the 2 s budget (user_input hangs or is very slow)" in note
    # The document's metadata value, not read yet when the budget ran out, is named too.
    assert "left out: user_input, retrieved_contexts[0].metadata" in note
    assert hung.retrieved_contexts[0].content == "Paris is the capital of France."
    assert fine.user_input == "What is the capital of France?"
    # The next records are read as usual: the stuck reader was replaced.
    answer("And of Spain?")
    assert recalltrace.flush(HANG_GUARD_S)
    assert traced.sink.records[-1].user_input == "And of Spain?"


def test_a_slow_str_runs_off_the_request_path(traced: Traced) -> None:
    Slow.threads.clear()
    Slow.release.clear()
    assert _runtime.current is not None
    _runtime.current.reader.budget = HANG_GUARD_S  # slow, not hanging: it is waited for
    # __str__ returns only once the call has returned: a request that printed the value itself
    # would wait here until the guard ran out, on its own thread.
    answer(Slow())
    Slow.release.set()
    assert recalltrace.flush(HANG_GUARD_S)
    assert Slow.threads and threading.get_ident() not in Slow.threads
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
    assert recalltrace.flush(HANG_GUARD_S)
    (record,) = traced.sink.records
    assert "CHANGED" not in (record.user_input or "")
    assert "What is the capital of France?" in (record.user_input or "")
    assert record.retrieved_contexts[0].metadata == {"source": "kb/1.md", "tags": ["capital"]}


class Blocking:
    """Printing blocks until ``release`` is set (a hanging ``__str__`` that eventually returns)."""

    release = threading.Event()

    def __str__(self) -> str:
        Blocking.release.wait(120)
        return "released"

    __repr__ = __str__


class Readable:
    def __str__(self) -> str:
        return "readable again"

    __repr__ = __str__


def _plain_documents(count: int) -> list[dict[str, Any]]:
    return [
        {"id": f"d{i}", "content": f"Document {i}.", "metadata": {"rank": i, "tags": ["a"]}}
        for i in range(count)
    ]


class HangingDocument:
    """A document whose text property never returns."""

    @property
    def page_content(self) -> str:
        Blocking.release.wait(120)
        return "released"


def test_a_hanging_document_is_left_out_in_its_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_runtime, "READ_TIMEOUT_S", 0.5)
    Blocking.release.clear()
    traced = make_traced()
    check = LedgerCheck()

    @recalltrace.retrieval
    def lookup(query: str) -> list[Any]:
        documents: list[Any] = _plain_documents(300)
        if query == "q":
            documents[200] = HangingDocument()
        return documents

    @recalltrace.rag("hanging-document")
    def ask(question: str) -> str:
        lookup(question)
        return "ok"

    try:
        ask("q")
        ask("the next request")
        assert recalltrace.flush(HANG_GUARD_S)
        hung, after = traced.sink.records
        assert [c.content for c in hung.retrieved_contexts] == [
            "" if i == 200 else f"Document {i}." for i in range(300)
        ]
        (note,) = [note for note in hung.notes if "did not finish" in note]
        assert "(retrieved_contexts[200] hangs or is very slow); left out: " in note
        assert not [note for note in hung.notes if "raising when read" in note]
        assert len(after.retrieved_contexts) == 300 and after.notes == []
        counts = check.assert_balanced()
        assert counts.stored == 2 and counts.values_not_read == {"read_timeout": 1}
    finally:
        Blocking.release.set()
        recalltrace.shutdown(HANG_GUARD_S)


def test_stuck_readers_never_cut_plain_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_runtime, "READ_TIMEOUT_S", 0.3)
    monkeypatch.setattr(_reader, "MAX_ABANDONED", 2)
    Blocking.release.clear()
    traced = make_traced()
    check = LedgerCheck()

    @recalltrace.retrieval
    def lookup(query: Any) -> list[dict[str, Any]]:
        return _plain_documents(300)

    @recalltrace.rag("stuck", input_param="question")
    def ask(question: Any, owner: Any = None) -> str:
        lookup(question)
        if owner is not None:
            recalltrace.set_attributes(metadata={"owner": owner, "plain": {"n": [1, 2]}})
        return "ok"

    try:
        for _ in range(2):
            ask(Blocking())  # each leaves a reader stuck
        assert recalltrace.flush(HANG_GUARD_S)
        assert traced.config is not None and _runtime.current is not None
        assert _runtime.current.reader.stuck == 2
        ask("plain question", owner=Blocking())  # no reader left for the application object
        ask("all plain")
        assert recalltrace.flush(HANG_GUARD_S)
        records = traced.sink.records
        assert len(records) == 4
        for record in records:
            assert len(record.retrieved_contexts) == 300, "plain documents were cut"
            assert record.retrieved_contexts[299].metadata == {"rank": 299, "tags": ["a"]}
        capped = records[2]
        assert capped.user_input == "plain question"
        assert capped.metadata["plain"] == {"n": [1, 2]}
        assert "owner" not in capped.metadata
        assert any(
            "too many readers are stuck" in note and "metadata['owner']" in note
            for note in capped.notes
        ), capped.notes
        assert records[3].notes == []
        counts = check.since()
        assert counts.values_not_read == {"read_timeout": 2, "readers_stuck": 1}
        # The hanging objects return: their readers end, and objects are read again.
        Blocking.release.set()
        reader = _runtime.current.reader
        wait_until(lambda: reader.stuck == 0, "the released readers never ended")
        reader.budget = HANG_GUARD_S  # the readable object is read however busy the host is
        ask(Readable())
        assert recalltrace.flush(HANG_GUARD_S)
        assert "readable again" in (traced.sink.records[-1].user_input or "")
        counts = check.assert_balanced()
        assert counts.seen == counts.stored == len(traced.sink.records) == 5
    finally:
        Blocking.release.set()
        recalltrace.shutdown(HANG_GUARD_S)


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise ValueError("no message")


def test_an_exception_that_cannot_be_printed_keeps_its_record(traced: Traced) -> None:
    check = LedgerCheck()

    @recalltrace.retrieval
    def lookup(query: str) -> list[str]:
        raise UnprintableError()

    @recalltrace.rag("unprintable-error")
    def ask(question: str) -> str:
        lookup(question)
        return "never"

    with pytest.raises(UnprintableError):
        ask("What fails?")
    (record,) = traced.records()
    assert record.error is True
    assert record.user_input == "What fails?"
    assert any(
        "raised UnprintableError, whose message could not be printed (its __str__ raised "
        "ValueError)" in note
        for note in record.notes
    ), record.notes
    (event,) = traced.span("lookup").events
    assert event.attributes is not None
    assert event.attributes["exception.message"] == (
        "<UnprintableError message not printable: ValueError>"
    )
    assert check.assert_balanced().stored == 1


class UnprintableId:
    def __str__(self) -> str:
        raise RuntimeError("no id")


def test_a_reference_id_that_cannot_be_printed_is_left_out(traced: Traced) -> None:
    check = LedgerCheck()

    @recalltrace.rag("bad-ids", reference_context_ids_param="ids")
    def ask(question: str, ids: Any) -> str:
        return "ok"

    ask("q", ["doc-1", UnprintableId(), 7])
    (record,) = traced.records()
    assert record.reference_context_ids == ["doc-1", "7"]
    assert "reference_context_ids[1] left out: its value raised RuntimeError when printed" in (
        record.notes
    )
    assert check.assert_balanced().stored == 1


def test_a_reference_id_that_cannot_be_printed_in_a_generator_is_noted(traced: Traced) -> None:
    """Ids given as a set or a generator are read on the reader thread as a whole: one that
    cannot be printed is left out with a note, like one in a list."""
    check = LedgerCheck()

    @recalltrace.rag("bad-id-generator", reference_context_ids_param="ids")
    def ask(question: str, ids: Any) -> str:
        return "ok"

    ask("q", (item for item in ["doc-1", UnprintableId(), "doc-3"]))
    (record,) = traced.records()
    assert record.reference_context_ids == ["doc-1", "doc-3"]
    assert "reference_context_ids: 1 id(s) left out: printing them raised" in record.notes, (
        record.notes
    )
    assert check.assert_balanced().stored == 1


@recalltrace.retrieval
def nan_search(query: str) -> list[dict[str, Any]]:
    return [
        {"id": "d1", "content": "One.", "score": float("nan"), "metadata": {"w": float("-inf")}},
        {"id": "d2", "content": "Two.", "score": 0.5, "metadata": {"w": 1.0}},
    ]


@recalltrace.rag("non-finite")
def nan_answer(question: str) -> str:
    nan_search(question)
    recalltrace.set_attributes(metadata={"ratio": float("nan"), "limits": [float("inf"), 1.5]})
    return "ok"


def test_nan_and_infinity_are_stored_alike_with_a_note(database_url: str) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    check = LedgerCheck()
    recalltrace.configure(
        database_url=database_url,
        tracer_provider=TracerProvider(),
        service_name="nan",
        flush_interval=0.05,
        shutdown_timeout=5.0,
    )
    engine = create_engine_from_url(database_url)
    try:
        nan_answer("q")
        check.assert_matches_database(database_url, apps=["non-finite"])
        history: History = make_history(engine)
        with engine.connect() as conn:
            (trace_id,) = conn.execute(
                text("SELECT trace_id FROM traces WHERE app_name = 'non-finite'")
            ).scalars()
        detail = history.trace(trace_id)
        assert detail.metadata["ratio"] == "NaN"
        assert detail.metadata["limits"] == ["Infinity", 1.5]
        first, second = detail.contexts
        assert first.score is None and first.metadata == {"w": "-Infinity"}
        assert second.score == 0.5 and second.metadata == {"w": 1.0}
        (note,) = [note for note in detail.notes if "NaN or infinite" in note]
        assert note.startswith("4 value(s) were NaN or infinite")
        assert "retrieved_contexts[0].score" in note and "metadata.ratio" in note
    finally:
        recalltrace.shutdown(HANG_GUARD_S)
        engine.dispose()


def test_a_forked_child_reads_application_objects(traced: Traced) -> None:
    @recalltrace.rag("forked", input_param="question")
    def ask(question: Any) -> str:
        return "ok"

    ask(Readable())  # the parent's reader thread now exists, idle
    assert recalltrace.flush(HANG_GUARD_S)
    assert "readable again" in (traced.sink.records[-1].user_input or "")
    pid = os.fork()
    if pid == 0:  # the child: the parent's reader thread is not here
        code = 1
        try:
            ask(Readable())
            if recalltrace.flush(HANG_GUARD_S):
                record = traced.sink.records[-1]
                read = "readable again" in (record.user_input or "")
                code = 0 if read and not record.notes else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_set_reference_with_an_unprintable_id_keeps_the_others(
    traced: Traced, caplog: pytest.LogCaptureFixture
) -> None:
    @recalltrace.rag("late-ids")
    def ask(question: str) -> str:
        trace_id = recalltrace.current_trace_id()
        recalltrace.set_reference(trace_id, reference_context_ids=["doc-1", UnprintableId()])
        return "ok"

    assert ask("q") == "ok"
    (record,) = traced.records()
    assert record.reference_context_ids == ["doc-1"]
    assert any(
        "reference_context_ids[1] left out: its value raised RuntimeError" in r.getMessage()
        for r in caplog.records
    )


def test_set_attributes_with_unprintable_values_keeps_the_request(traced: Traced) -> None:
    check = LedgerCheck()

    @recalltrace.rag("bad-attributes")
    def ask(question: str) -> str:
        recalltrace.set_attributes(
            user_id=UnprintableId(), session_id="s-1", tags=["a", UnprintableId()]
        )
        return "ok"

    assert ask("q") == "ok"
    (record,) = traced.records()
    assert record.user_id is None and record.session_id == "s-1" and record.tags == ["a"]
    assert "user_id not captured: its value raised RuntimeError when printed" in record.notes
    assert "tags[1] not captured: its value raised RuntimeError when printed" in record.notes
    assert check.assert_balanced().stored == 1


def test_an_idle_reader_thread_ends(traced: Traced, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_reader, "_IDLE_S", 0.2)

    @recalltrace.rag("idle-reader", input_param="question")
    def ask(question: Any) -> str:
        return "ok"

    def readers() -> int:
        return sum(1 for t in threading.enumerate() if t.name == "recalltrace-reader")

    before = readers()
    ask(Readable())
    assert recalltrace.flush(HANG_GUARD_S)
    wait_until(lambda: readers() <= before, "the idle reader thread never ended")
    ask(Readable())  # a new reader starts for the next object
    assert recalltrace.flush(HANG_GUARD_S)
    assert all("readable again" in (r.user_input or "") for r in traced.sink.records)
