"""Reading user objects with a time bound, so that one object cannot stop the writer.

Assembling a record reads what the application handed over: questions and references that are
not strings, documents past what a span holds (through extractors and ``__str__``), metadata
values. Such code can raise (handled where it runs: the value is left out with a note), be
slow, or never return. Records whose state holds only strings and plain values are assembled on
the writer thread itself; the others are assembled on a reader thread, and the writer waits at
most ``timeout`` seconds. A record whose reading did not finish in time is stored without the
application's objects, with a note saying so; the stuck thread is abandoned (it is a daemon) and
a new one takes the next record. After ``MAX_ABANDONED`` stuck threads the reader stops running
application code at all and every such record is stored without those objects.
"""

from __future__ import annotations

import copy
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("recalltrace.tracer")

MAX_ABANDONED = 8
_PLAIN = frozenset({str, int, float, bool, type(None)})


class _Job:
    __slots__ = ("arg", "done", "error", "fn", "result")

    def __init__(self, fn: Callable[[Any], Any], arg: Any) -> None:
        self.fn = fn
        self.arg = arg
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class BoundedReader:
    """Runs ``fn(arg)`` on a reader thread and waits at most ``timeout`` seconds for it."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.abandoned = 0
        self.timed_out = 0
        self._jobs: queue.SimpleQueue[_Job] | None = None
        self._lock = threading.Lock()

    def _start(self) -> queue.SimpleQueue[_Job]:
        jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()

        def serve() -> None:
            while True:
                job = jobs.get()
                try:
                    job.result = job.fn(job.arg)
                except BaseException as exc:  # handed back to the writer, which decides
                    job.error = exc
                job.done.set()

        threading.Thread(target=serve, name="recalltrace-reader", daemon=True).start()
        return jobs

    def run(self, fn: Callable[[Any], Any], arg: Any) -> tuple[bool, Any]:
        """``(True, fn(arg))``, or ``(False, None)`` when it did not finish in time (or too
        many readers are stuck already). Re-raises what ``fn`` raised."""
        with self._lock:
            if self.abandoned >= MAX_ABANDONED:
                return False, None
            if self._jobs is None:
                self._jobs = self._start()
            jobs = self._jobs
        job = _Job(fn, arg)
        jobs.put(job)
        if not job.done.wait(self.timeout):
            with self._lock:
                self.abandoned += 1
                self.timed_out += 1
                self._jobs = None  # the stuck thread keeps its queue; a new one starts
            return False, None
        if job.error is not None:
            raise job.error
        return True, job.result


def needs_reading(state: Any) -> bool:
    """Whether assembling ``state`` may run application code (anything but strings and plain
    values in the question, references, documents and metadata)."""
    if type(state.user_input) not in _PLAIN or type(state.reference) not in _PLAIN:
        return True
    for field in (state.reference_contexts, state.reference_context_ids):
        if field is not None and (
            type(field) not in (list, tuple) or any(type(i) is not str for i in field)
        ):
            return True
    for item in state.contexts:
        if not isinstance(item, tuple):
            return True  # documents read later, through extractors
        if item[3] and not _plain_mapping(item[3]):
            return True
    return bool(state.metadata) and not _plain_mapping(state.metadata)


def _plain_mapping(value: Any) -> bool:
    return type(value) is dict and all(
        type(k) is str and type(v) in _PLAIN for k, v in value.items()
    )


def without_application_objects(state: Any) -> Any:
    """A copy of ``state`` keeping only strings and plain values: what can be stored when
    reading the rest did not finish."""
    clone = copy.copy(state)
    if type(clone.user_input) not in _PLAIN:
        clone.user_input = None
    if type(clone.reference) not in _PLAIN:
        clone.reference = None
    for field in ("reference_contexts", "reference_context_ids"):
        value = getattr(clone, field)
        if value is not None and (
            type(value) not in (list, tuple) or any(type(i) is not str for i in value)
        ):
            setattr(clone, field, None)
    clone.contexts = [
        (item[0], item[1], item[2], item[3] if _plain_mapping(item[3]) else {})
        for item in state.contexts
        if isinstance(item, tuple) and type(item[0]) is str
    ]
    clone.metadata = {
        k: v for k, v in state.metadata.items() if type(k) is str and type(v) in _PLAIN
    }
    clone.notes = list(state.notes)
    return clone
