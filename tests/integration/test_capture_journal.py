"""Span capture notes spans' starts and ends on the application's thread and replays them on
the writer thread: what the replay finds is what handling each span at once found, every
request is stored once a flush returns, and a forked child never inherits a held lock."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import recalltrace
from tests.support.tracer_helpers import FileSink, make_traced

ATTRIBUTES = {"openinference.span.kind": "CHAIN"}
FOUND = {"openinference.span.kind": "RETRIEVER", "retrieval.documents.0.document.content": "d"}


def _request(tracer: Any, question: str) -> None:
    with tracer.start_as_current_span("chain", attributes=ATTRIBUTES) as root:
        root.set_attribute("input.value", question)
        with tracer.start_as_current_span("retrieve", attributes=FOUND):
            pass
        root.set_attribute("output.value", "an answer")


def _decorated(tracer: Any) -> Callable[[str], str]:
    """A ``@recalltrace.rag`` request whose retrieval an instrumentor traces."""

    @recalltrace.rag("decorated")
    def answer(question: str) -> str:
        with tracer.start_as_current_span("retrieve", attributes=FOUND):
            pass
        return "an answer"

    return answer


def test_the_application_thread_only_notes_spans_and_the_writer_replays_them() -> None:
    state = make_traced(flush_interval=30.0)  # the writer does not cycle by itself
    try:
        capture = recalltrace.SpanCapture()
        state.provider.add_span_processor(capture)
        _request(state.provider.get_tracer("vendor"), "Noted?")
        assert len(capture._journal) == 4  # two starts, two ends, nothing built yet
        assert capture._traces == {} and not capture._finished
        (record,) = state.records()
        assert record.user_input == "Noted?" and record.retrieved_contexts[0].content == "d"
        assert not capture._journal
    finally:
        recalltrace.shutdown(2.0)


def test_a_flush_returns_with_every_request_stored_while_the_writer_replays() -> None:
    """The writer, woken every 512 noted events, replays while the application goes on; a
    flush waits for the writer's own pass to have offered what it took (here held back for a
    moment, as a busy writer thread is)."""
    state = make_traced(flush_interval=30.0)
    try:
        capture = recalltrace.SpanCapture()
        state.provider.add_span_processor(capture)
        tracer = state.provider.get_tracer("vendor")
        inside = threading.Event()
        offer_all = capture.assembler.offer_all

        def slow_offer(candidates: Any) -> None:
            if threading.current_thread() is not threading.main_thread():
                inside.set()
                time.sleep(0.3)
            offer_all(candidates)

        capture.assembler.offer_all = slow_offer  # type: ignore[method-assign]
        before = recalltrace.ledger()
        for index in range(600):
            _request(tracer, f"Question {index}?")
        assert inside.wait(10)  # the writer's pass holds requests it has not offered yet
        assert recalltrace.flush(30.0)
        stored = list(state.sink.records)  # read once, right after the flush
        assert len(stored) == 600
        assert len({r.user_input for r in stored}) == 600
        ledger = recalltrace.ledger()
        assert ledger.seen - before.seen == ledger.stored - before.stored == 600
        assert ledger.pending == 0
    finally:
        recalltrace.shutdown(2.0)


def test_a_request_of_a_decorated_call_still_joins_it_after_noted_spans() -> None:
    """Spans of plain traces wait in the journal; a decorated request's instrumentor call is
    handled at once, after them, and joins the decorated record before the decorator ends."""
    state = make_traced(flush_interval=30.0)
    try:
        state.provider.add_span_processor(recalltrace.SpanCapture())
        tracer = state.provider.get_tracer("vendor")
        answer = _decorated(tracer)

        _request(tracer, "Plain first?")
        answer("Decorated?")
        _request(tracer, "Plain after?")
        records = {r.user_input: r for r in state.records()}
        assert sorted(records) == ["Decorated?", "Plain after?", "Plain first?"]
        assert records["Decorated?"].app_name == "decorated"
        assert [c.content for c in records["Decorated?"].retrieved_contexts] == ["d"]
    finally:
        recalltrace.shutdown(2.0)


def test_a_child_forked_while_the_writer_replays_has_a_free_lock(tmp_path: Any) -> None:
    sink = FileSink(tmp_path / "records.jsonl")
    state = make_traced(sink, flush_interval=30.0)  # type: ignore[arg-type]
    try:
        capture = recalltrace.SpanCapture()
        state.provider.add_span_processor(capture)
        tracer = state.provider.get_tracer("vendor")
        answer = _decorated(tracer)

        held, release = threading.Event(), threading.Event()

        def replaying() -> None:  # as the writer holds the lock while it replays a slice
            with capture._lock:
                held.set()
                release.wait(30)

        holder = threading.Thread(target=replaying)
        holder.start()
        assert held.wait(10)
        pid = os.fork()
        if pid == 0:  # the child: a decorated request takes the capture's lock
            signal.alarm(20)
            try:
                answer("In the child?")
                code = 0 if recalltrace.flush(10) else 3
            except BaseException:
                code = 4
            os._exit(code)
        release.set()
        holder.join()
        deadline = time.monotonic() + 30
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            assert time.monotonic() < deadline, "the forked child hangs"
            time.sleep(0.05)
        assert os.waitstatus_to_exitcode(status) == 0
        assert [line["user_input"] for line in sink.lines()] == ["In the child?"]
    finally:
        recalltrace.shutdown(2.0)


def test_the_replay_lets_the_application_run_between_slices(monkeypatch: Any) -> None:
    """The writer's replay takes the journal a slice at a time and gives the GIL up between
    slices, so a request waits for it at most about one slice, not a whole pass."""
    from recalltrace.tracer import _capture

    # Nothing wakes the writer early: only this thread replays.
    monkeypatch.setattr(_capture, "_WAKE_EVENTS", 1_000_000)
    monkeypatch.setattr(_capture, "_WAKE_AT", 1_000_000)
    state = make_traced(flush_interval=30.0)
    try:
        capture = recalltrace.SpanCapture()
        state.provider.add_span_processor(capture)
        tracer = state.provider.get_tracer("vendor")
        for index in range(300):
            _request(tracer, f"Question {index}?")
        assert len(capture._journal) == 1200
        yields: list[float] = []
        sleep = time.sleep

        def spy(seconds: float) -> None:
            if threading.current_thread() is threading.main_thread():
                yields.append(seconds)
            sleep(seconds)

        monkeypatch.setattr(_capture, "_sleep", spy)
        capture._replay()
        monkeypatch.setattr(_capture, "_sleep", sleep)
        assert not capture._journal
        assert yields.count(0) == -(-1200 // _capture._REPLAY_SLICE)  # once after each slice
        assert len(state.records()) == 300
    finally:
        recalltrace.shutdown(2.0)
