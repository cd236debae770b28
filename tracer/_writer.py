"""The queue engine between finished requests and storage, shaped like OpenTelemetry's batch
processor: ``emit`` on the request path, a background thread that exports batches, ``force_flush``
and ``shutdown`` with a deadline, drops counted, and a process check on ``emit``.

The request path only appends a finished trace's state to a deque under a short lock; when the
queue (plus whatever the writer still holds for a retry) reaches its bound, the record is dropped
and counted instead, so the caller never waits. A thread of the operating system (see
:mod:`._threads`) wakes when a batch is full, on a timer, or on a flush; it runs the pipeline's
writer-thread stages on each record (see :mod:`._pipeline`), writes them in batches to the sink,
which answers with a :class:`~recalltrace.storage.records.WriteResult`, retries with back-off
while storage fails, and delivers late references.

Every record the writer holds is also counted in this process's ledger file (see
:mod:`._process_ledger`), so that a process that ends without running its exit code leaves the
number behind. A process copied by ``fork`` (with Python's hooks or without, as uWSGI forks)
rebuilds this state on its first ``emit`` and starts its own thread.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recalltrace.storage.errors import (
    is_database_unavailable,
    is_schema_missing,
    is_storage_refusal,
    is_trace_not_found,
)
from recalltrace.tracer import _threads
from recalltrace.tracer._internal import (
    FORK_WRITERS,
    at_fork_in_child,
    own_process,
    run_cycle_hooks,
)
from recalltrace.tracer._metrics import TracerStats
from recalltrace.tracer._pipeline import DEFAULT_SCHEMA_HINT
from recalltrace.tracer._plain import PlainTrace
from recalltrace.tracer._process_ledger import ProcessLedger, look_for_ended, open_ledger
from recalltrace.tracer._signals import keep_off_this_thread
from recalltrace.tracer._state import TraceState, merge_reference_into_record

if TYPE_CHECKING:
    from recalltrace.storage.records import ReferenceUpdate, TraceRecord, WriteResult
    from recalltrace.tracer._config import TraceSink
    from recalltrace.tracer._pipeline import Exporter

logger = logging.getLogger("recalltrace.tracer")

# Retries while storage is down stay this close together, so traces flow again within
# seconds of storage coming back (each retry is one connection attempt).
_MAX_BACKOFF = 5.0
# Longest stretch of record assembly before the writer offers the GIL to the application.
_SLICE = 0.001
_MAX_REFERENCE_BACKOFF = 5.0
# How often the writer looks for ledger files of processes that ended without removing theirs,
# and how long after it starts it looks first (a process ending sooner looks at its end).
_LOOK_FOR_ENDED_EVERY = 60.0
_FIRST_LOOK_AFTER = 2.0
_sleep = _threads.original("time", "sleep")


@dataclass(slots=True)
class _Pending:
    record: TraceRecord | PlainTrace
    """The record, or its plain values where the sink assembles it (a storage process)."""
    attempts: int = 0
    dropped_as: str | None = None
    """The reason it was counted as dropped while a stuck writer thread still held it."""


@dataclass(slots=True)
class _Orphan:
    update: ReferenceUpdate
    deadline: float
    next_try: float
    delay: float
    released: bool = False
    """No longer holds flush(): its record was not found once (it may be another process's,
    still on its way); it is retried in the background until ``deadline``."""


# Every writer of this process, reset in a forked child by the tracer's one fork hook.
_writers: weakref.WeakSet[BatchWriter] = weakref.WeakSet()


def _reset_writers_in_child() -> None:
    # The parent's queue is the parent's to store; its thread does not exist here.
    for writer in list(_writers):
        writer._after_fork_in_child()


class BatchWriter:
    """Owns the queue, the writer thread, the sink and this process's ledger file."""

    clock: Callable[[], float]
    """The monotonic clock, in seconds, the writer schedules its own work on: when a failed
    write is retried, how long a late reference waits for its record, how often a failure is
    logged. ``time.monotonic`` unless given (a test drives a clock by hand, then calls
    :meth:`wake`); the timeouts of :meth:`flush` and :meth:`shutdown` are always real seconds."""

    def __init__(
        self,
        exporter: Exporter,
        *,
        stats: TracerStats,
        max_queue_size: int,
        max_batch_size: int,
        flush_interval: float,
        max_write_attempts: int,
        retry_backoff: float,
        reference_wait: float,
        run_dir: Path | None = None,
        describe: Callable[[], dict[str, Any]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self._exporter = exporter
        self._sink_factory: Callable[[], TraceSink] = exporter.open_sink
        self._stats = stats
        self._run_dir = run_dir
        """Where this process's ledger file is kept (``None``: no file)."""
        self._describe = describe or dict
        self._max_queue_size = max_queue_size
        self._max_batch_size = max_batch_size
        self._flush_interval = flush_interval
        self._max_write_attempts = max_write_attempts
        self._retry_backoff = retry_backoff
        self._reference_wait = reference_wait
        # Sinks of a parent process, kept referenced in a forked child so that their
        # connections (shared with the parent) are never closed from here.
        self._inherited_sinks: list[Any] = []
        self._reset()
        stats.queue_size = self.queue_size
        _writers.add(self)

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = _threads.Lock()
        self._progress = _threads.Condition(self._lock)
        self._wake = _threads.Event()
        self._queue: deque[TraceState] = deque()
        self._unwritten: dict[int, TraceState] = {}  # by record id
        self._references: deque[ReferenceUpdate] = deque()
        self._held = 0  # records the writer holds (assembling, in flight, awaiting a retry)
        # Taken from the queue and not assembled yet (in order); what a shutdown counted as
        # dropped while they were, by id of the state, so each is counted once.
        self._assembling: deque[TraceState] = deque()
        self._assembling_dropped: dict[int, str] = {}
        self._accepted = 0
        self._completed = 0
        self._flush_waiters = 0
        self._stopping = False
        self.ending = False
        """Set when the process drains for its end (its first write may be its last)."""
        self._thread: _threads.Thread | None = None
        self._sink: TraceSink | None = None
        self._file: ProcessLedger | None = None
        self._file_refused = False
        # The first look comes a little after the writer starts, past a process's first burst
        # of requests (each of its system calls gives up the GIL a busy application holds).
        self._next_look = time.monotonic() + _FIRST_LOOK_AFTER
        self._looked = False
        # Owned by whichever thread runs the cycles (the writer thread, or a flush at exit).
        self._ready: list[_Pending] = []
        self._orphans: list[_Orphan] = []
        self._next_attempt = 0.0
        self._backoff = 0.0
        self._last_failure_log = 0.0
        self._last_error: str | None = None
        self._refusal_said: str | None = None  # storage's refusal, said once
        self._schema_missing = False
        self._eager = False

    def _after_fork_in_child(self) -> None:
        if self._file is not None:
            self._file.release()  # the parent's file: it keeps counting there
        if self._sink is not None:
            self._inherited_sinks.append(self._sink)
            release = getattr(self._sink, "release_after_fork", None)
            if callable(release):
                release()
            engine = getattr(self._sink, "engine", None)
            dispose = getattr(engine, "dispose", None)
            if callable(dispose):
                try:
                    dispose(close=False)
                except Exception:
                    logger.debug("could not release the parent's connection pool", exc_info=True)
        self._reset()

    # -- request path ----------------------------------------------------------------------

    def write_eagerly(self) -> None:
        """Write each record as soon as it is queued (the process is stopping)."""
        self._eager = True
        self._wake.set()

    def last_failure_text(self) -> str:
        """``" (last storage error: ...)"`` when a write failed since the last success."""
        return f" (last storage error: {self._last_error})" if self._last_error else ""

    def emit(self, state: TraceState) -> bool:
        """Queue a finished, sampled trace; never blocks. False when it was dropped."""
        if self._pid != os.getpid():
            own_process()  # a copy of another process's writer: make it this process's
        if self._file is None and not self._file_refused:
            self._open_file()
        reason = None
        with self._lock:
            if self._stopping:
                reason = "shutdown"
            elif len(self._queue) + self._held >= self._max_queue_size:
                reason = "queue_full"
            else:
                self._queue.append(state)
                self._unwritten[state.trace_id] = state
                self._accepted += 1
                queued = len(self._queue)
                if self._file is not None:
                    self._file.accepted(queued + self._held)
        if reason is not None:
            self._stats.drop(reason, state.app_name)
            return False
        if self._thread is None:
            self._ensure_thread()
        if queued >= self._max_batch_size or self._eager:
            self._wake.set()
        return True

    def merge_reference(self, update: ReferenceUpdate, open_state: TraceState | None) -> None:
        """Apply ground truth to a trace that is still in memory, else queue it for storage."""
        if self._pid != os.getpid():
            own_process()
        with self._lock:
            state = open_state if open_state is not None and not open_state.closed else None
            if state is None:
                state = self._unwritten.get(_record_number(update.trace_id))
            if state is not None:
                state.merge_reference(update)
                return
            if self._stopping:
                reason = "shutdown"
            elif len(self._references) >= self._max_queue_size:
                reason = "queue_full"
            else:
                self._references.append(update)
                self._accepted += 1
                reason = None
        if reason is not None:
            self._stats.drop(reason, "")
            return
        self._ensure_thread()
        self._wake.set()

    def queue_size(self) -> int:
        """Records waiting in memory (queued or held by the writer)."""
        with self._lock:
            return len(self._queue) + self._held

    # -- flush and shutdown ----------------------------------------------------------------

    def force_flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued before this call is stored or dropped; False when the
        timeout passed first (e.g. storage is down)."""
        if self._pid != os.getpid():
            own_process()
        deadline = None if timeout is None else time.monotonic() + timeout
        run_cycle_hooks()
        with self._lock:
            target = self._accepted
            if self._completed >= target:
                return True
            self._flush_waiters += 1
        try:
            if not self._ensure_thread():
                return self._drain_inline(target, deadline)
            self._wake.set()
            with self._lock:
                while self._completed < target:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    self._progress.wait(remaining if remaining is not None else 1.0)
            return True
        finally:
            with self._lock:
                self._flush_waiters -= 1

    def shutdown(self, timeout: float | None = None, *, report: bool = True) -> bool:
        """Flush, stop the thread, and count what could not be stored as dropped (said in one
        line; ``report=False`` leaves the line to the caller, who says it with the ledger)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        flushed = self.force_flush(timeout)
        with self._lock:
            self._stopping = True
            thread = self._thread
        self._wake.set()
        if thread is not None and not thread.is_current():
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            thread.join(remaining)
        self._drop_leftovers("shutdown", report=report)
        stuck = thread is not None and thread.is_alive() and not thread.is_current()
        if not stuck and self._accepted:
            self._look_for_ended(at_end=True)
        sink, self._sink = self._sink, None
        if sink is not None and self._exporter.owns_sink and not stuck:
            dispose = getattr(sink, "dispose", None)
            try:
                if callable(dispose):
                    dispose()
            except Exception:
                logger.debug("closing the storage connection failed", exc_info=True)
        if not stuck:
            self._close_file()
        return flushed

    # -- this process's ledger file ----------------------------------------------------------

    def _open_file(self) -> None:
        """Start this process's ledger file (on its first record); said once if it cannot be."""
        with self._lock:
            if self._file is not None or self._file_refused:
                return
            self._file_refused = True  # until made: a record racing this one goes without
        made = open_ledger(self._run_dir, self._describe, self._max_batch_size)
        if made is None:
            return
        with self._lock:
            made.set_pending(len(self._queue) + self._held)
            self._file = made
            self._file_refused = False

    def holds_records(self) -> bool:
        """Whether this process's writer holds anything not stored yet (records or late
        references; a copy of another process's writer holds nothing of this process)."""
        if self._pid != os.getpid():
            return False
        with self._lock:
            return bool(
                self._queue or self._held or self._references or self._ready or self._orphans
            )

    def forget_file(self) -> None:
        """Remove this process's ledger file if nothing is held (the process ends now)."""
        if self._pid == os.getpid():
            self._close_file()

    def _close_file(self) -> None:
        with self._lock:
            file, self._file = self._file, None
            pending = len(self._queue) + self._held
        if file is not None:
            if pending:
                file.release()  # still holding records: the file says so if this process dies
            else:
                file.close()

    def _look_for_ended(self, *, at_end: bool = False) -> None:
        """Say what processes that ended without running their exit code held (every minute
        on the writer thread, and at the end of a process that never looked), looking up their
        batch in write through this sink (used by one thread at a time: the writer thread, or
        the shutdown once that thread ended)."""
        now = time.monotonic()
        if self._run_dir is None or (now < self._next_look and not (at_end and not self._looked)):
            return
        self._next_look = now + _LOOK_FOR_ENDED_EVERY
        self._looked = True

        def look_up(ids: list[str]) -> set[str] | None:
            stored_ids = getattr(self._get_sink(), "stored_ids", None)
            return None if stored_ids is None else set(stored_ids(ids))

        for ended in look_for_ended(self._run_dir, self._describe().get("database"), look_up):
            logger.warning("%s", ended.line())
            self._stats.lost_by_ended_process(ended.lost)

    def _drop_leftovers(self, reason: str, *, report: bool = True) -> None:
        with self._lock:
            states = list(self._queue)
            self._queue.clear()
            self._unwritten.clear()
            references = len(self._references)
            self._references.clear()
            thread_alive = self._thread is not None and self._thread.is_alive()
            # Read together under the lock the writer moves a record from one to the other
            # with: a record being assembled when the drain gives up is counted exactly once.
            assembling = [s for s in self._assembling if id(s) not in self._assembling_dropped]
            for state in assembling:
                self._assembling_dropped[id(state)] = reason
            ready, orphans = list(self._ready), list(self._orphans)
        for state in states + assembling:
            self._stats.drop(reason, state.app_name, report=False, said_by_caller=not report)
        if references:
            self._stats.drop(reason, "", references, report=False, said_by_caller=not report)
        # Records the writer holds (being assembled, awaiting a retry while storage is down)
        # are lost with the process too. A writer thread still stuck in a write is abandoned:
        # what it holds is counted now rather than never.
        newly_dropped = 0
        for pending in ready:
            if pending.dropped_as is None:  # counted once, however often this runs
                pending.dropped_as = reason
                newly_dropped += 1
                self._stats.drop(
                    reason, pending.record.app_name, report=False, said_by_caller=not report
                )
        if orphans:
            self._stats.drop(reason, "", len(orphans), report=False, said_by_caller=not report)
        if not thread_alive:
            self._ready = []
            self._orphans = []
        with self._lock:
            self._completed = self._accepted
            self._held = 0
            if self._file is not None:
                self._file.set_pending(len(self._queue))
            self._progress.notify_all()
        if report:
            self._stats.report_drops()
        lost = len(states) + len(assembling) + references + newly_dropped + len(orphans)
        if lost and self._schema_missing:
            # The line above says how many; this one says what to run.
            logger.warning(
                "recalltrace: the %d record(s) dropped (%s) were not stored because the database "
                "has no recalltrace tables: %s",
                lost,
                reason,
                self._schema_hint(),
            )

    def _schema_hint(self) -> str:
        """What to do about missing tables (the exporter may say it in its own terms)."""
        return str(getattr(self._exporter, "schema_hint", DEFAULT_SCHEMA_HINT))

    # -- the writer thread -----------------------------------------------------------------

    def _ensure_thread(self) -> bool:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return True
            if self._stopping:
                return False
            thread = _threads.Thread(self._run, "recalltrace-writer")
            try:
                thread.start()
            except RuntimeError:
                # The interpreter is shutting down and refuses new threads.
                return False
            self._thread = thread
            return True

    def on_writer_thread(self) -> bool:
        """Whether the calling code runs on this writer's thread."""
        thread = self._thread
        return thread is not None and thread.is_current()

    def _run(self) -> None:
        keep_off_this_thread()
        while True:
            timeout = self._next_timeout()
            if timeout > 0:
                self._wake.wait(timeout)
            self._wake.clear()
            with self._lock:
                stopping = self._stopping
            try:
                self._cycle()
            except Exception:
                logger.exception("recalltrace writer: unexpected error; continuing")
                _sleep(0.1)
            if stopping:
                return

    def _next_timeout(self) -> float:
        now = self.clock()
        timeout = self._flush_interval
        if self._ready:
            timeout = min(timeout, self._next_attempt - now)
        if self._orphans:
            timeout = min(timeout, min(orphan.next_try for orphan in self._orphans) - now)
        with self._lock:
            if (self._flush_waiters or self._stopping or self._eager) and (
                self._queue or self._references
            ):
                return 0.0
        return max(timeout, 0.0)

    def _drain_inline(self, target: int, deadline: float | None) -> bool:
        """Run writer cycles in the calling thread (used when no thread can be started)."""
        while True:
            self._cycle()
            with self._lock:
                if self._completed >= target:
                    return True
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return False
            wait = self._next_timeout()
            if deadline is not None:
                wait = min(wait, deadline - now)
            _sleep(max(wait, 0.01))

    def _complete(self, count: int, held: int = 0) -> None:
        with self._lock:
            self._completed += count
            self._held -= held
            if held and self._file is not None:
                self._file.set_pending(len(self._queue) + self._held)
            self._progress.notify_all()

    def wake(self, now: bool = False) -> None:
        """Make sure the writer thread runs (and cycles at once when ``now``); cheap when it
        does and nothing is urgent."""
        if self._thread is None:
            self._ensure_thread()
        if now and not self._wake.is_set():
            self._wake.set()

    def _cycle(self) -> None:
        if not self._exporter.decided:
            self._exporter.decide(ending=self.ending)
        self._look_for_ended()
        run_cycle_hooks()
        self._take_traces()
        self._take_references()
        if self._ready and self.clock() >= self._next_attempt:
            self._write_ready()
        if self._orphans:
            self._deliver_orphans()
        self._stats.report_drops_when_due()

    def _take_traces(self) -> None:
        with self._lock:
            states = list(self._queue)
            self._queue.clear()
            for state in states:
                self._unwritten.pop(state.trace_id, None)
            self._held += len(states)
            self._assembling.extend(states)
        orphans = {orphan.update.trace_id: orphan for orphan in self._orphans}
        slice_end = time.perf_counter() + _SLICE
        for state in states:
            if time.perf_counter() >= slice_end:
                self._yield_to_requests()
                slice_end = time.perf_counter() + _SLICE
            try:
                record = self._exporter.prepare(state)
            except Exception:
                logger.exception("recalltrace writer: could not assemble trace %s", state.hex_id())
                if self._assembled(state) is None:  # else already counted by a shutdown
                    self._stats.drop("assembly_error", state.app_name)
                self._complete(1, held=1)
                continue
            orphan = orphans.pop(record.trace_id, None)
            if orphan is not None:
                _merge(record, orphan.update)
                self._orphans.remove(orphan)
                self._complete(1)
            self._assembled(state, _Pending(record))

    def _assembled(self, state: TraceState, pending: _Pending | None = None) -> str | None:
        """``state`` (the oldest being assembled) is done: move it to the ready records as
        ``pending`` (none when assembling it failed). Returns the reason a shutdown counted it
        as dropped meanwhile, if one did."""
        with self._lock:
            self._assembling.popleft()
            dropped_as = (
                self._assembling_dropped.pop(id(state), None) if self._assembling_dropped else None
            )
            if pending is not None:
                pending.dropped_as = dropped_as
                self._ready.append(pending)
        return dropped_as

    def _yield_to_requests(self) -> None:
        """Let the application's threads have the GIL, unless the backlog is so large that
        records would soon be dropped.

        Without this, the writer keeps the GIL for a whole switch interval (5 ms by default)
        whenever the application's threads are busy, and the request that was running waits
        that long. Yielding every ``_SLICE`` bounds such a wait to about one slice."""
        with self._lock:
            backlog = len(self._queue) + self._held
        if backlog < self._max_queue_size // 2:
            _sleep(0)

    def _take_references(self) -> None:
        with self._lock:
            updates = list(self._references)
            self._references.clear()
        now = self.clock()
        for update in updates:
            update = self._exporter.prepare_reference(update)
            if self._merge_into_ready(update):
                self._complete(1)
                continue
            self._orphans.append(_Orphan(update, now + self._reference_wait, now, 0.05))
        excess = len(self._orphans) - self._max_queue_size
        if excess > 0:
            dropped, self._orphans = self._orphans[:excess], self._orphans[excess:]
            self._stats.drop("queue_full", "", excess)
            self._complete(sum(1 for orphan in dropped if not orphan.released))

    def _merge_into_ready(self, update: ReferenceUpdate) -> bool:
        for pending in self._ready:
            if pending.record.trace_id == update.trace_id:
                _merge(pending.record, update)
                return True
        return False

    def _get_sink(self) -> TraceSink:
        if self._sink is None:
            self._sink = self._sink_factory()
        return self._sink

    def _write_ready(self) -> None:
        first = True
        while self._ready:
            if not first:
                self._yield_to_requests()
            first = False
            chunk = self._ready[: self._max_batch_size]
            file = self._file
            try:
                sink: Any = self._get_sink()
                if file is not None:
                    file.set_helper(int(getattr(sink, "helper_pid", 0) or 0))
                    file.set_in_write([pending.record.trace_id for pending in chunk])
                result = sink.write_traces([pending.record for pending in chunk])
            except Exception as exc:
                self._write_failed(chunk, exc)
                return
            finally:
                if file is not None:
                    file.set_in_write([])
                    file.set_helper(int(getattr(self._sink, "helper_pid", 0) or 0))
            del self._ready[: len(chunk)]
            stored = self._refused(chunk, result)
            self._stats.records_stored(pending.record.app_name for pending in stored)
            for pending in stored:
                if pending.dropped_as is not None:
                    # Counted as dropped when shutdown gave up on it, then stored after all.
                    self._stats.drop_withdrawn(pending.dropped_as, pending.record.app_name)
            self._backoff = 0.0
            self._last_error = None
            self._schema_missing = False
            self._complete(len(chunk), held=len(chunk))

    def _refused(self, chunk: list[_Pending], result: WriteResult | None) -> list[_Pending]:
        """The records of ``chunk`` the sink stored; those it refused (another request stored
        under the same id, a plain trace the storage process could not assemble) are counted
        as dropped, a conflict said at once as the error it is."""
        if result is None or not (result.conflicts or result.unassembled):
            return chunk
        conflicts, unassembled = set(result.conflicts), set(result.unassembled)
        stored = []
        for pending in chunk:
            trace_id = pending.record.trace_id
            if trace_id in conflicts:
                reason = "id_conflict"
            elif trace_id in unassembled:
                reason = "assembly_error"
            else:
                stored.append(pending)
                continue
            if pending.dropped_as is None:
                self._stats.drop(reason, pending.record.app_name)
        if conflicts:
            logger.error(
                "recalltrace writer: %d record(s) were NOT stored because another request is "
                "stored under the same record id (%s): two processes drew the same id, or a "
                "record was changed and sent again; counted as dropped (id_conflict)",
                len(conflicts),
                ", ".join(sorted(conflicts)[:3]) + (" ..." if len(conflicts) > 3 else ""),
            )
        return stored

    def _fell_back(self, exc: Exception) -> bool:
        """Whether the stages moved here (a storage process that cannot start); what this
        thread holds is prepared again for them."""
        if not self._exporter.fall_back(exc):
            return False
        self._sink = None
        for pending in self._ready:
            pending.record = self._exporter.redo(pending.record)
        for orphan in self._orphans:
            orphan.update = self._exporter.redo_reference(orphan.update)
        return True

    def _write_failed(self, chunk: list[_Pending], exc: Exception) -> None:
        if self._fell_back(exc):
            return
        now = self.clock()
        first_line = (str(exc).strip().splitlines() or [""])[0][:300]
        name = type(exc).__name__
        self._last_error = f"{name}: {first_line}" if first_line else name
        schema_missing = is_schema_missing(exc)
        self._schema_missing = schema_missing
        # A refusal by storage (until someone acts): said once, whole; the records not retried.
        said = (str(exc).strip().splitlines() or [name])[0]
        if (refused := is_storage_refusal(exc)) and self._refusal_said != said:
            self._refusal_said = said
            logger.warning("recalltrace writer: %s; the trace records are not stored "
                           "(counted as dropped, storage_error)", said)  # fmt: skip
        elif not refused and now - self._last_failure_log >= 30.0:
            self._last_failure_log = now
            if schema_missing:
                logger.warning(
                    "recalltrace writer: the database has no recalltrace tables; %s. %d "
                    "record(s) are kept, up to max_queue_size, until the tables exist",
                    self._schema_hint(),
                    len(self._ready),
                )
            else:
                logger.warning(
                    "recalltrace writer: storing %d trace record(s) failed (%s); will retry",
                    len(chunk),
                    self._last_error,
                )
        given_up = []
        # While storage is unreachable the records keep their place (they count against the
        # queue bound, so new traces are dropped as queue_full instead); only failures where
        # storage refused the records use up attempts.
        if not (is_database_unavailable(exc) or schema_missing):
            for pending in chunk:
                pending.attempts = self._max_write_attempts if refused else pending.attempts + 1
                if pending.attempts >= self._max_write_attempts:
                    given_up.append(pending)
        if given_up:
            for pending in given_up:
                self._ready.remove(pending)
                self._stats.drop("storage_error", pending.record.app_name)
            self._complete(len(given_up), held=len(given_up))
        self._backoff = min(
            _MAX_BACKOFF, self._backoff * 2 if self._backoff else self._retry_backoff
        )
        self._next_attempt = now + self._backoff

    def _deliver_orphans(self) -> None:
        now = self.clock()
        for orphan in list(self._orphans):
            if now < orphan.next_try:
                continue
            if self._merge_into_ready(orphan.update):
                self._orphans.remove(orphan)
                self._finish_orphan(orphan)
                continue
            try:
                self._get_sink().attach_reference(orphan.update)
            except Exception as exc:
                if self._fell_back(exc):
                    continue
                if not is_trace_not_found(exc):
                    logger.debug("attaching a reference failed; will retry", exc_info=True)
                if now >= orphan.deadline:
                    self._orphans.remove(orphan)
                    self._stats.drop("reference_not_found", "")
                    self._finish_orphan(orphan)
                else:
                    if is_trace_not_found(exc) and not orphan.released:
                        # flush() does not wait reference_wait for a record that may never
                        # come; the reference keeps being retried, and is counted if it never
                        # finds its record.
                        orphan.released = True
                        self._complete(1)
                    orphan.delay = min(orphan.delay * 2, _MAX_REFERENCE_BACKOFF)
                    orphan.next_try = min(now + orphan.delay, orphan.deadline)
                continue
            self._orphans.remove(orphan)
            self._finish_orphan(orphan)

    def _finish_orphan(self, orphan: _Orphan) -> None:
        if not orphan.released:
            self._complete(1)


at_fork_in_child(FORK_WRITERS, _reset_writers_in_child)


def _merge(record: TraceRecord | PlainTrace, update: ReferenceUpdate) -> None:
    if type(record) is PlainTrace:
        record.merge_reference(update)
    else:
        merge_reference_into_record(record, update)  # type: ignore[arg-type]


def _record_number(hex_id: str) -> int:
    """A record id given as hex digits, as the number it is (-1 when it is not one)."""
    try:
        return int(hex_id, 16)
    except (TypeError, ValueError):
        return -1
