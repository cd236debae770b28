"""The bounded queue and the background thread that writes trace records to storage.

The request path only appends a finished trace's state to a deque under a short lock; when the
queue (plus whatever the writer still holds for a retry) reaches its bound, the record is dropped
and counted instead, so the caller never waits. A daemon thread wakes when a batch is full, on a
timer, or on a flush; it assembles and scrubs the records, writes them in batches, retries with
back-off while storage fails, and delivers late references. After ``fork`` the child rebuilds
this state and starts its own thread on first use.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from recalltrace.storage.errors import is_database_unavailable, is_schema_missing
from recalltrace.tracer._internal import FORK_WRITERS, at_fork_in_child
from recalltrace.tracer._metrics import TracerStats
from recalltrace.tracer._plain import PlainTrace
from recalltrace.tracer._signals import keep_off_this_thread
from recalltrace.tracer._state import TraceState, merge_reference_into_record

if TYPE_CHECKING:
    from recalltrace.storage.records import ReferenceUpdate, TraceRecord
    from recalltrace.tracer._config import TraceSink

logger = logging.getLogger("recalltrace.tracer")

# Retries while storage is down stay this close together, so traces flow again within
# seconds of storage coming back (each retry is one connection attempt).
_MAX_BACKOFF = 5.0
# Longest stretch of record assembly before the writer offers the GIL to the application.
_SLICE = 0.001
_MAX_REFERENCE_BACKOFF = 5.0


def is_trace_not_found(exc: BaseException) -> bool:
    """Whether a sink's exception means "this trace is not stored (yet)"."""
    if isinstance(exc, LookupError):
        return True
    return any(cls.__name__ == "TraceNotFound" for cls in type(exc).__mro__)


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


# Work handed to the writer thread by other parts of the tracer (span capture finds the
# requests in finished spans there): each hook runs at the start of every writer cycle and of
# every flush, in the thread running it, so what it offers is queued before a flush counts.
_cycle_hooks: list[Callable[[], None]] = []


# Every writer of this process, reset in a forked child by the tracer's one fork hook.
_writers: weakref.WeakSet[BatchWriter] = weakref.WeakSet()


def add_cycle_hook(hook: Callable[[], None]) -> None:
    """Run ``hook`` at the start of every writer cycle and flush (once, however often added)."""
    if hook not in _cycle_hooks:
        _cycle_hooks.append(hook)


def _run_cycle_hooks() -> None:
    for hook in list(_cycle_hooks):
        try:
            hook()
        except Exception:
            logger.exception("recalltrace writer: handing over finished work failed")


def _reset_writers_in_child() -> None:
    # The parent's queue is the parent's to store; its thread does not exist here.
    for writer in list(_writers):
        writer._after_fork_in_child()


class BatchWriter:
    """Owns the queue, the writer thread and the sink."""

    clock: Callable[[], float]
    """The monotonic clock, in seconds, the writer schedules its own work on: when a failed
    write is retried, how long a late reference waits for its record, how often a failure is
    logged. ``time.monotonic`` unless given (a test drives a clock by hand, then calls
    :meth:`wake`); the timeouts of :meth:`flush` and :meth:`shutdown` are always real seconds."""

    def __init__(
        self,
        *,
        sink_factory: Callable[[], TraceSink],
        assemble: Callable[[TraceState], TraceRecord | PlainTrace],
        stats: TracerStats,
        max_queue_size: int,
        max_batch_size: int,
        flush_interval: float,
        max_write_attempts: int,
        retry_backoff: float,
        reference_wait: float,
        close_sink: Callable[[TraceSink], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        prepare_reference: Callable[[ReferenceUpdate], ReferenceUpdate] | None = None,
    ) -> None:
        self.clock = clock
        # Applied on this thread to each late reference before it is merged or stored (the
        # scrubber's, where records are scrubbed in this process).
        self._prepare_reference = prepare_reference
        self._sink_factory = sink_factory
        self._close_sink = close_sink
        self._assemble = assemble
        self._stats = stats
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
        self._lock = threading.Lock()
        self._progress = threading.Condition(self._lock)
        self._wake = threading.Event()
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
        self._thread: threading.Thread | None = None
        self._sink: TraceSink | None = None
        # Owned by whichever thread runs the cycles (the writer thread, or a flush at exit).
        self._ready: list[_Pending] = []
        self._orphans: list[_Orphan] = []
        self._next_attempt = 0.0
        self._backoff = 0.0
        self._last_failure_log = 0.0
        self._last_error: str | None = None
        self._schema_missing = False
        self._eager = False

    def _after_fork_in_child(self) -> None:
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

    def offer(self, state: TraceState) -> bool:
        """Queue a finished, sampled trace; never blocks. False when it was dropped."""
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

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued before this call is stored or dropped; False when the
        timeout passed first (e.g. storage is down)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        _run_cycle_hooks()
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
        flushed = self.flush(timeout)
        with self._lock:
            self._stopping = True
            thread = self._thread
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            thread.join(remaining)
        self._drop_leftovers("shutdown", report=report)
        sink, self._sink = self._sink, None
        if (
            sink is not None
            and self._close_sink is not None
            and not (thread is not None and thread.is_alive())
        ):
            try:
                self._close_sink(sink)
            except Exception:
                logger.debug("closing the storage connection failed", exc_info=True)
        return flushed

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
            self._stats.drop(reason, state.app_name, report=False)
        if references:
            self._stats.drop(reason, "", references, report=False)
        # Records the writer holds (being assembled, awaiting a retry while storage is down)
        # are lost with the process too. A writer thread still stuck in a write is abandoned:
        # what it holds is counted now rather than never.
        for pending in ready:
            if pending.dropped_as is None:  # counted once, however often this runs
                pending.dropped_as = reason
                self._stats.drop(reason, pending.record.app_name, report=False)
        if orphans:
            self._stats.drop(reason, "", len(orphans), report=False)
        if not thread_alive:
            self._ready = []
            self._orphans = []
        with self._lock:
            self._completed = self._accepted
            self._held = 0
            self._progress.notify_all()
        if report:
            self._stats.report_drops()
        lost = len(states) + len(assembling) + references + len(ready) + len(orphans)
        if lost and self._schema_missing:
            # The line above says how many; this one says what to run.
            logger.warning(
                "recalltrace: the %d record(s) dropped (%s) were not stored because the database "
                "has no recalltrace tables: run `recalltrace db upgrade --database-url URL` (or "
                "configure auto_migrate=True)",
                lost,
                reason,
            )

    # -- the writer thread -----------------------------------------------------------------

    def _ensure_thread(self) -> bool:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return True
            if self._stopping:
                return False
            thread = threading.Thread(target=self._run, name="recalltrace-writer", daemon=True)
            try:
                thread.start()
            except RuntimeError:
                # The interpreter is shutting down and refuses new threads.
                return False
            self._thread = thread
            return True

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
                time.sleep(0.1)
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
            time.sleep(max(wait, 0.01))

    def _complete(self, count: int, held: int = 0) -> None:
        with self._lock:
            self._completed += count
            self._held -= held
            self._progress.notify_all()

    def wake(self, now: bool = False) -> None:
        """Make sure the writer thread runs (and cycles at once when ``now``); cheap when it
        does and nothing is urgent."""
        if self._thread is None:
            self._ensure_thread()
        if now and not self._wake.is_set():
            self._wake.set()

    def _cycle(self) -> None:
        _run_cycle_hooks()
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
                record = self._assemble(state)
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
            time.sleep(0)

    def _take_references(self) -> None:
        with self._lock:
            updates = list(self._references)
            self._references.clear()
        now = self.clock()
        for update in updates:
            if self._prepare_reference is not None:
                update = self._prepare_reference(update)
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
            try:
                # Any: the storage process's sink, the one given plain traces, answers which
                # of them it could not assemble; every other sink returns None.
                sink: Any = self._get_sink()
                unassembled = sink.write_traces([pending.record for pending in chunk])
            except Exception as exc:
                self._write_failed(chunk, exc)
                return
            del self._ready[: len(chunk)]
            stored = chunk
            if unassembled:
                # A sink that assembles plain traces (a storage process) names those it could
                # not assemble: the rest of the batch is stored, these are counted.
                failed = set(unassembled)
                stored = [p for p in chunk if p.record.trace_id not in failed]
                for pending in chunk:
                    if pending.record.trace_id in failed and pending.dropped_as is None:
                        self._stats.drop("assembly_error", pending.record.app_name)
            self._stats.records_stored(pending.record.app_name for pending in stored)
            for pending in stored:
                if pending.dropped_as is not None:
                    # Counted as dropped when shutdown gave up on it, then stored after all.
                    self._stats.drop_withdrawn(pending.dropped_as, pending.record.app_name)
            self._backoff = 0.0
            self._last_error = None
            self._schema_missing = False
            self._complete(len(chunk), held=len(chunk))

    def _write_failed(self, chunk: list[_Pending], exc: Exception) -> None:
        now = self.clock()
        first_line = (str(exc).strip().splitlines() or [""])[0][:300]
        name = type(exc).__name__
        self._last_error = f"{name}: {first_line}" if first_line else name
        schema_missing = is_schema_missing(exc)
        self._schema_missing = schema_missing
        if now - self._last_failure_log >= 30.0:
            self._last_failure_log = now
            if schema_missing:
                logger.warning(
                    "recalltrace writer: the database has no recalltrace tables; run "
                    "`recalltrace db upgrade --database-url URL` (or configure "
                    "auto_migrate=True). %d record(s) are kept, up to max_queue_size, until "
                    "the tables exist",
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
                pending.attempts += 1
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
