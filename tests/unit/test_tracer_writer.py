"""The bounded queue and the writer: batching, storage outages, drops, flush, references,
failures inside the tracer, fork and exit."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import recalltrace
from recalltrace.storage.records import TraceRecord
from recalltrace.tracer._runtime import stats
from tests.support import ROOT
from tests.support.clocks import HANG_GUARD_S, ManualClock, finishes, wait_until
from tests.support.tracer_helpers import (
    FileSink,
    FlakySink,
    MemorySink,
    Traced,
    dropped,
    make_traced,
    traced_session,
)


@pytest.fixture
def traced() -> Iterator[Traced]:
    yield from traced_session()


@recalltrace.retrieval
def search(query: str) -> list[str]:
    return [f"doc for {query}"]


@recalltrace.rag
def answer(question: str) -> str:
    search(question)
    return f"answer to {question}"


class BlockingSink(MemorySink):
    """Blocks every write until ``release`` is set (a very slow database); nothing is stored
    before that (short of a hang)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.entered = threading.Event()

    def write_traces(self, records: Sequence[TraceRecord]) -> None:
        self.entered.set()
        self.release.wait(HANG_GUARD_S)
        super().write_traces(records)


class MissingSink(MemorySink):
    """Counts the references it was asked to attach to a record it does not hold."""

    def __init__(self) -> None:
        super().__init__()
        self.missed = 0

    def attach_reference(self, update: Any) -> int:
        try:
            return super().attach_reference(update)
        except LookupError:
            self.missed += 1
            raise


def _wait_for(condition: Any) -> None:
    wait_until(condition, "the writer did not get there")


def _manual_clock() -> ManualClock:
    """The writer's clock, moved by hand from now on."""
    from recalltrace.tracer import _runtime

    assert _runtime.current is not None
    clock = ManualClock()
    _runtime.current.writer.clock = clock
    return clock


def _wake_writer() -> None:
    from recalltrace.tracer import _runtime

    assert _runtime.current is not None
    _runtime.current.writer.wake(now=True)


def _dropped_points(state: Traced) -> dict[tuple[str, str], float]:
    return {
        (a["reason"], a.get("rag.app", "")): v for a, v in state.metric_points("rag.traces.dropped")
    }


# -- batching -------------------------------------------------------------------------------------


def test_records_are_written_in_batches() -> None:
    state = make_traced(max_batch_size=16, flush_interval=5.0)
    try:
        for i in range(100):
            answer(f"q{i}")
        assert recalltrace.flush(5)
        records = state.sink.records
        assert sorted(r.user_input for r in records) == sorted(f"q{i}" for i in range(100))
        assert max(state.sink.batches) <= 16
        assert sum(state.sink.batches) == 100
    finally:
        recalltrace.shutdown(1)


def test_flush_interval_writes_without_a_full_batch(traced: Traced) -> None:
    answer("lonely")
    _wait_for(lambda: len(traced.sink.records) == 1)


# -- the queue never blocks and never grows past its bound ----------------------------------------


def test_full_queue_drops_without_blocking_and_counts(caplog: pytest.LogCaptureFixture) -> None:
    sink = BlockingSink()
    state = make_traced(sink=sink, max_queue_size=5, max_batch_size=2, flush_interval=0.01)
    # The drop lines are spaced on this clock: it stands still, so one line says all 46.
    stats().clock = ManualClock()
    stats()._last_drop_log = 0.0
    before = dropped("queue_full")
    try:
        answer("first")
        assert sink.entered.wait(HANG_GUARD_S)  # the writer is now stuck inside the sink
        sizes = []
        with caplog.at_level(logging.WARNING, logger="recalltrace.tracer"):
            for i in range(50):
                assert answer(f"q{i}") == f"answer to q{i}"
                sizes.append(state.metric_points("rag.tracer.queue.size")[0][1])
        # Every call returned while the writer was still inside its first write, which ends
        # only when the test releases it: none of them waited for the writer.
        assert sink.records == [] and not sink.release.is_set()
        assert max(sizes) <= 5
        lost = dropped("queue_full") - before
        assert lost == 50 - 4  # "first" is held by the writer, four more fit in the bound
        assert _dropped_points(state)[("queue_full", "answer")] >= lost
        warnings = [r for r in caplog.records if "dropped" in r.getMessage()]
        assert len(warnings) == 1, "drops are logged at a limited rate"
    finally:
        stats().clock = time.monotonic
        sink.release.set()
        recalltrace.shutdown(HANG_GUARD_S)
    assert len(sink.records) == 5


# -- storage down ---------------------------------------------------------------------------------


def test_storage_down_records_kept_while_the_bound_allows_then_dropped_and_counted() -> None:
    sink = FlakySink(down=True)
    state = make_traced(
        sink=sink, max_queue_size=10, max_write_attempts=3, retry_backoff=0.05, flush_interval=0.01
    )
    storage_errors = dropped("storage_error")
    queue_full = dropped("queue_full")
    try:
        for i in range(40):
            assert answer(f"q{i}") == f"answer to q{i}"
        assert recalltrace.flush(0.1) is False  # nothing can be stored while the database is down
        # Far more failed writes than max_write_attempts: an unreachable database does not
        # use up attempts, so the ten records that fit in the bound are kept.
        _wait_for(lambda: sink.failures >= 5)
        assert dropped("storage_error") - storage_errors == 0
        assert dropped("queue_full") - queue_full == 30
        assert _dropped_points(state)[("queue_full", "answer")] >= 30
        # The database comes back: what was kept is stored, and new traces too.
        sink.down = False
        assert recalltrace.flush(10)  # the next retry stores the ten records that were kept
        answer("after the outage")
        assert recalltrace.flush(5)
        stored = sorted(r.user_input or "" for r in sink.records)
        assert stored == sorted([*(f"q{i}" for i in range(10)), "after the outage"])
    finally:
        recalltrace.shutdown(2)


def test_records_storage_refuses_are_dropped_after_max_attempts() -> None:
    class RefusingSink(FlakySink):
        def write_traces(self, records: Any) -> None:
            self.failures += 1
            raise ValueError("value too long for type character varying(200)")

    sink = RefusingSink()
    make_traced(sink=sink, max_write_attempts=3, retry_backoff=0.01, flush_interval=0.01)
    before = dropped("storage_error")
    try:
        answer("q")
        _wait_for(lambda: dropped("storage_error") - before == 1)
        assert sink.failures == 3
    finally:
        recalltrace.shutdown(1)


def test_short_outage_loses_nothing() -> None:
    sink = FlakySink(down=True)
    make_traced(sink=sink, max_write_attempts=50, retry_backoff=0.01, flush_interval=0.01)
    before = dropped()
    try:
        for i in range(10):
            answer(f"q{i}")
        _wait_for(lambda: sink.failures >= 2)
        sink.down = False
        assert recalltrace.flush(5)
        assert sorted(r.user_input for r in sink.records) == sorted(f"q{i}" for i in range(10))
        assert dropped() == before
    finally:
        recalltrace.shutdown(2)


def test_storage_that_cannot_even_open_is_survived() -> None:
    def broken_factory() -> Any:
        raise OSError("no such database")

    state = make_traced(max_write_attempts=2, flush_interval=0.01)
    from recalltrace.tracer import _runtime

    assert _runtime.current is not None
    _runtime.current.writer._sink_factory = broken_factory
    _runtime.current.writer._sink = None
    before = dropped("storage_error")
    try:
        assert answer("q") == "answer to q"
        _wait_for(lambda: dropped("storage_error") > before)
        assert state.sink.records == []
    finally:
        recalltrace.shutdown(1)


# -- flush and shutdown ---------------------------------------------------------------------------


def test_shutdown_drains_and_later_traces_are_dropped() -> None:
    state = make_traced(flush_interval=60.0)  # only flush/shutdown make the writer write
    for i in range(5):
        answer(f"q{i}")
    assert state.sink.records == []
    assert recalltrace.shutdown(5)
    assert len(state.sink.records) == 5
    before = dropped("shutdown")
    assert answer("late") == "answer to late"
    assert dropped("shutdown") == before + 1


def test_flush_with_nothing_queued_returns_at_once(traced: Traced) -> None:
    answer("stored")
    assert recalltrace.flush(HANG_GUARD_S)
    # Nothing is queued now: a flush with an hour to wait returns True without using it.
    assert finishes(lambda: recalltrace.flush(3600), "flush with nothing queued")


def test_flush_at_exit_in_a_short_lived_process(tmp_path: Path) -> None:
    out = tmp_path / "records.jsonl"
    script = textwrap.dedent(
        f"""
        import recalltrace
        from tests.support.tracer_helpers import FileSink

        recalltrace.configure(
            sink=FileSink({str(out)!r}), flush_interval=3600, tracer_provider="own"
        )

        @recalltrace.retrieval
        def search(query):
            return ["doc one", "doc two"]

        @recalltrace.rag
        def answer(question):
            search(question)
            return "bye"

        answer("one-shot job")
        # no flush: the exit hook drains the queue
        """
    )
    # Run from the repository root, where ``tests.support`` is importable as a package.
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60, cwd=ROOT)
    lines = FileSink(out).lines()
    assert len(lines) == 1
    assert lines[0]["user_input"] == "one-shot job"
    assert lines[0]["contexts"] == ["doc one", "doc two"]


# -- references -----------------------------------------------------------------------------------


def test_reference_set_inside_the_trace_is_merged(traced: Traced) -> None:
    @recalltrace.rag
    def answer_with_gold(question: str) -> str:
        recalltrace.set_reference(recalltrace.current_trace_id(), reference="gold")
        recalltrace.set_reference(None, reference_context_ids=["d1", 2])
        return "a"

    answer_with_gold("q")
    record = traced.record()
    assert record.reference == "gold"
    assert record.reference_context_ids == ["d1", "2"]
    assert traced.sink.references == []


def test_reference_for_a_queued_trace_is_merged_before_writing() -> None:
    sink = BlockingSink()
    make_traced(sink=sink, flush_interval=0.01)
    try:
        ids = []

        @recalltrace.rag
        def remember(question: str) -> str:
            ids.append(recalltrace.current_trace_id())
            return "a"

        remember("first")
        assert sink.entered.wait(5)
        remember("queued")  # waits behind the blocked write
        recalltrace.set_reference(ids[1], reference="late gold", reference_contexts=["ctx"])
        sink.release.set()
        assert recalltrace.flush(5)
        record = sink.by_id(ids[1])
        assert (record.reference, record.reference_contexts) == ("late gold", ["ctx"])
        assert sink.references == []
    finally:
        sink.release.set()
        recalltrace.shutdown(2)


def test_reference_after_the_trace_was_stored_goes_to_storage(traced: Traced) -> None:
    ids = []

    @recalltrace.rag
    def remember(question: str) -> str:
        ids.append(recalltrace.current_trace_id())
        return "a"

    remember("q")
    assert recalltrace.flush(5)
    recalltrace.set_reference(ids[0].upper(), reference="arrived a day later")
    assert recalltrace.flush(5)
    assert traced.sink.by_id(ids[0]).reference == "arrived a day later"
    assert [u.trace_id for u in traced.sink.references] == ids


def test_reference_waits_for_a_trace_still_in_flight() -> None:
    sink = MissingSink()
    make_traced(sink=sink, reference_wait=2.0)
    clock = _manual_clock()  # reference_wait never passes unless the test moves the clock
    trace_id = "ab" * 16
    recalltrace.set_reference(trace_id, reference="gold")
    _wait_for(lambda: sink.missed == 1)  # the writer tried and got TraceNotFound
    record = TraceRecord(
        trace_id=trace_id,
        app_name="other-process",
        service_name="svc",
        started_at=__import__("datetime").datetime.now(__import__("datetime").timezone.utc),
        duration_ms=1.0,
    )
    try:
        sink.write_traces([record])  # stored meanwhile, e.g. by another process
        # flush() does not wait for it (the record might never come), but the writer keeps
        # trying: its next try is due a moment later, well within reference_wait.
        assert recalltrace.flush(HANG_GUARD_S)
        assert sink.by_id(trace_id).reference is None
        clock.advance(1.0)
        _wake_writer()
        _wait_for(lambda: sink.by_id(trace_id).reference == "gold")
        assert sink.missed == 1
    finally:
        recalltrace.shutdown(HANG_GUARD_S)


def test_reference_for_an_unknown_trace_is_dropped_after_waiting() -> None:
    sink = MissingSink()
    make_traced(sink=sink, reference_wait=0.5)
    clock = _manual_clock()
    before = dropped("reference_not_found")
    try:
        recalltrace.set_reference("cd" * 16, reference="nobody")
        _wait_for(lambda: sink.missed == 1)
        clock.advance(0.4)  # a retry is due, reference_wait is not over
        _wake_writer()
        _wait_for(lambda: sink.missed == 2)
        assert dropped("reference_not_found") == before
        clock.advance(0.2)  # past reference_wait: the last try, then it is counted
        _wake_writer()
        _wait_for(lambda: dropped("reference_not_found") > before)
        assert dropped("reference_not_found") == before + 1
        assert sink.missed == 3
    finally:
        recalltrace.shutdown(HANG_GUARD_S)


def test_an_unknown_reference_does_not_hold_flush_for_reference_wait() -> None:
    make_traced(reference_wait=30.0)
    _manual_clock()  # stands still: reference_wait never passes
    try:
        recalltrace.set_reference("cd" * 16, reference="nobody")
        assert recalltrace.flush(HANG_GUARD_S)  # it used to wait until reference_wait passed
    finally:
        recalltrace.shutdown(HANG_GUARD_S)


def test_a_malformed_reference_id_says_what_an_id_is() -> None:
    make_traced()
    try:
        with pytest.raises(ValueError, match="'not-a-hex-id' is not a record id: a record"):
            recalltrace.set_reference("not-a-hex-id", reference="x")
    finally:
        recalltrace.shutdown(1)


def test_reference_for_a_trace_no_rate_samples_is_ignored() -> None:
    state = make_traced(sample_rate=0.0)
    try:
        recalltrace.set_reference("ef" * 16, reference="x")
        assert recalltrace.flush(1)
        assert state.sink.references == []
    finally:
        recalltrace.shutdown(1)


def test_malformed_trace_ids_are_refused(traced: Traced) -> None:
    for bad in ("not hex", "", "0" * 32, "1" * 33):
        with pytest.raises(ValueError):
            recalltrace.set_reference(bad, reference="x")
    with pytest.raises(ValueError):
        recalltrace.set_reference(None, reference="x")  # no open trace


# -- failures inside the tracer -------------------------------------------------------------------


def _break_finish(monkeypatch: pytest.MonkeyPatch) -> None:
    from recalltrace.tracer import _runtime

    def broken(state: Any) -> None:
        raise RuntimeError("tracer bug")

    assert _runtime.current is not None
    monkeypatch.setattr(_runtime.current, "finish_trace", broken)


def test_internal_failure_never_reaches_the_caller_in_production(
    traced: Traced, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("RECALLTRACE_RAISE_INTERNAL_ERRORS", "0")
    _break_finish(monkeypatch)
    with caplog.at_level(logging.ERROR, logger="recalltrace.tracer"):
        assert answer("q") == "answer to q"
        assert answer("again") == "answer to q".replace("q", "again")
    messages = [r.getMessage() for r in caplog.records if "internal error" in r.getMessage()]
    assert len(messages) == 1, "logged once, not per call"


def test_internal_failure_is_raised_under_pytest(
    traced: Traced, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RECALLTRACE_RAISE_INTERNAL_ERRORS", raising=False)
    _break_finish(monkeypatch)
    with pytest.raises(RuntimeError, match="tracer bug"):
        answer("q")


def test_failure_opening_the_span_runs_the_function_plainly(
    traced: Traced, monkeypatch: pytest.MonkeyPatch
) -> None:
    from recalltrace.tracer import _runtime

    monkeypatch.setenv("RECALLTRACE_RAISE_INTERNAL_ERRORS", "0")
    assert _runtime.current is not None

    class BrokenTracer:
        def start_span(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("provider bug")

    monkeypatch.setattr(_runtime.current, "otel_tracer", BrokenTracer())
    assert answer("q") == "answer to q"
    assert traced.spans() == []


# -- fork -----------------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_gets_a_working_writer(tmp_path: Path) -> None:
    sink = FileSink(tmp_path / "records.jsonl")
    make_traced(sink=sink)  # type: ignore[arg-type]
    try:
        answer("in the parent")
        assert recalltrace.flush(5)  # the parent's writer thread is running
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 1
            try:
                answer("in the child")
                code = 0 if recalltrace.flush(5) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        answer("in the parent again")
        assert recalltrace.flush(5)
        inputs = sorted(line["user_input"] for line in sink.lines())
        assert inputs == ["in the child", "in the parent", "in the parent again"]
    finally:
        recalltrace.shutdown(2)


# -- the storage the tracer opens itself ----------------------------------------------------------


class DisposableSink(MemorySink):
    def __init__(self) -> None:
        super().__init__()
        self.disposed = 0

    def dispose(self) -> None:
        self.disposed += 1


def test_repository_opened_by_the_tracer_is_closed_at_shutdown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from recalltrace.tracer import _sinks

    opened: list[tuple[str | None, DisposableSink]] = []

    def open_repository(url: str | None = None, **options: Any) -> DisposableSink:
        opened.append((url, DisposableSink()))
        return opened[-1][1]

    monkeypatch.setattr(_sinks, "_factory", open_repository)
    make_traced(open_storage=True, database_url="sqlite:///unused.db")
    answer("q")
    assert recalltrace.flush(5)
    ((url, repository),) = opened
    assert url == "sqlite:///unused.db"
    assert [r.user_input for r in repository.records] == ["q"]
    recalltrace.shutdown(2)
    assert repository.disposed == 1


def test_a_sink_passed_in_is_left_open() -> None:
    sink = DisposableSink()
    make_traced(sink=sink)
    answer("q")
    recalltrace.shutdown(2)
    assert sink.records and sink.disposed == 0


def test_writer_yields_the_gil_while_its_backlog_is_small(monkeypatch: pytest.MonkeyPatch) -> None:
    import recalltrace.tracer._writer as writer_module

    state = make_traced(max_queue_size=100, flush_interval=60.0)
    sleeps: list[float] = []
    real_sleep = time.sleep

    def recording_sleep(seconds: float) -> None:
        if seconds == 0:
            sleeps.append(seconds)
        real_sleep(seconds)

    try:
        monkeypatch.setattr(writer_module, "_SLICE", 0.0)  # offer the GIL after every record
        monkeypatch.setattr(writer_module, "_sleep", recording_sleep)
        for i in range(10):
            answer(f"q{i}")
        assert recalltrace.flush(5)
        assert len(state.sink.records) == 10
        assert len(sleeps) >= 9
        # With a backlog of at least half the bound the writer works through it instead.
        sleeps.clear()
        for i in range(60):
            answer(f"b{i}")
        assert recalltrace.flush(5)
        assert len(state.sink.records) == 70
        assert len(sleeps) <= 10
    finally:
        recalltrace.shutdown(2)


def test_a_record_whose_id_holds_another_request_is_a_counted_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Two requests under one id (two processes that drew the same id): the second is never
    counted as stored; it is dropped as ``id_conflict`` and said at ERROR."""
    from recalltrace.testing import MemorySink as ConflictingSink
    from recalltrace.tracer import _calls

    monkeypatch.setattr(_calls, "new_record_id", lambda: 0xABC)
    sink = ConflictingSink()
    make_traced(sink=sink, flush_interval=0.01)  # type: ignore[arg-type]
    before = recalltrace.ledger()
    try:
        answer("first")
        assert recalltrace.flush(5)
        with caplog.at_level(logging.ERROR, logger="recalltrace"):
            answer("second")
            assert recalltrace.flush(5)
        counts = recalltrace.ledger() - before
    finally:
        recalltrace.shutdown(2)
    assert [r.user_input for r in sink.records] == ["first"]
    assert counts.stored == 1 and counts.dropped == {"id_conflict": 1}, counts
    assert counts.unaccounted == 0
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "NOT stored" in line and format(0xABC, "032x") in line


def test_an_unattached_reference_is_said_as_a_reference_not_a_dropped_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``set_reference`` for a trace that never arrives loses no record: the line says a late
    reference could not be attached, not that a trace record was dropped."""
    from recalltrace.tracer import _runtime

    sink = MissingSink()
    make_traced(sink=sink, reference_wait=0.1)
    try:
        with caplog.at_level("WARNING", logger="recalltrace.tracer"):
            before = dropped("reference_not_found")
            recalltrace.set_reference("ef" * 16, reference="nobody")
            _wait_for(lambda: dropped("reference_not_found") > before)
            _runtime.get().stats.report_drops()  # said now, unless a writer cycle said it
        lines = [r.getMessage() for r in caplog.records]
        assert any("could not attach 1 late reference(s)" in line for line in lines), lines
        assert not any("trace record(s)" in line for line in lines), lines
    finally:
        recalltrace.shutdown(HANG_GUARD_S)
