"""Reading a finished request's values on the writer thread; application objects within a time
budget, plain values in full.

Assembling a record reads what the application handed over: the question and references,
documents past what a span holds, metadata values. Strings, numbers, booleans, ``None`` and
dicts (with string keys), lists and tuples of them run no application code when read: they are
read in full on the writer thread, however long that takes on a busy host. Anything else (an
object whose ``__str__``, ``__iter__``, a property or a mapping method is the application's)
can raise, be slow, or never return: such objects are read on a reader thread, and the writer
waits for all of one record's objects at most ``budget`` seconds. An object that raises is
left out (or kept empty in its place) with a note; one still being read when the budget runs
out is left out with a note naming its position, as is every object of that record not read
yet, and each is counted. The budget is per record: the next record starts with a full one.

A reader stuck in an object is abandoned (it is a daemon thread) and a new one serves the next
record; it ends by itself if the object ever returns. While ``max_abandoned`` readers are stuck
no new one is started: application objects are then left out (counted, noted), plain values are
still read in full.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

from recalltrace.tracer import _threads
from recalltrace.tracer._extract import (
    Doc,
    read_document,
    to_text,
    unreadable,
)
from recalltrace.tracer._internal import FORK_WRITERS, at_fork_in_child
from recalltrace.tracer._state import LEFT_OUT_ID, json_safe

MAX_ABANDONED = 8
"""Most reader threads left stuck in an application object at once."""

_PLAIN_LEAVES = frozenset({str, int, float, bool, type(None)})
_IDLE_S = 60.0
"""An idle reader thread ends after this long (a new one starts with the next object)."""
_PLAIN_LIMIT = 1_000_000
"""Most containers walked to decide whether a value is plain (past it, it is read as an
application value would be)."""

# Why an application value was not read.
TIMED_OUT = "read_timeout"
READERS_STUCK = "readers_stuck"
NO_THREAD = "reader_unavailable"
_NO_THREAD: Any = object()


def is_plain(value: Any) -> bool:
    """Whether ``value`` is strings, numbers, booleans and ``None`` in dicts (string keys),
    lists and tuples only, at any depth (a value seen twice, e.g. a cycle, is walked once):
    reading it runs no application code."""
    kind = type(value)
    if kind in _PLAIN_LEAVES:
        return True
    if kind is not dict and kind is not list and kind is not tuple:
        return False
    try:
        if kind is dict:
            # The common case, a flat dict of plain values (a document's metadata): no walk.
            for key, inner in value.items():
                if type(key) is not str or type(inner) not in _PLAIN_LEAVES:
                    break
            else:
                return True
        return _walk_plain(value)
    except RuntimeError:  # changed by the application while walked: read it as its object
        return False


def _walk_plain(value: Any) -> bool:
    seen: set[int] = set()
    stack = [value]
    walked = 0
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind in _PLAIN_LEAVES:
            continue
        if kind is dict:
            if id(item) in seen:
                continue
            seen.add(id(item))
            for key in item:
                if type(key) is not str:
                    return False
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            if id(item) in seen:
                continue
            seen.add(id(item))
            stack.extend(item)
        else:
            return False
        walked += 1
        if walked > _PLAIN_LIMIT:
            return False
    return True


class _Job:
    """Application values of one record, read in order; results appear as they are read."""

    __slots__ = ("abandoned", "done", "results", "tasks")

    def __init__(self, tasks: Sequence[Callable[[], Any]]) -> None:
        self.tasks = tasks
        self.results: list[tuple[bool, Any]] = []
        self.done = _threads.Event()
        self.abandoned = False


_readers: weakref.WeakSet[BoundedReader] = weakref.WeakSet()


def _reset_readers_in_child() -> None:
    for reader in list(_readers):
        reader._after_fork_in_child()


class BoundedReader:
    """Runs application code on reader threads; the writer waits at most a budget for it."""

    def __init__(self, budget: float, max_abandoned: int | None = None) -> None:
        self.budget = budget
        self.max_abandoned = MAX_ABANDONED if max_abandoned is None else max_abandoned
        self.stuck = 0  # reader threads abandoned and still inside an application object
        self._lock = _threads.Lock()
        self._idle: list[_Reader] = []
        _readers.add(self)

    def _after_fork_in_child(self) -> None:
        # The parent's reader threads do not exist in the child (nor do its stuck ones).
        self._lock = _threads.Lock()
        self._idle = []
        self.stuck = 0

    def read(self, tasks: Sequence[Callable[[], Any]]) -> tuple[list[tuple[bool, Any]], str]:
        """Run ``tasks`` in order within one budget: ``(results, why)``, one result per task
        that finished (``(True, value)`` or ``(False, exception)``), in order; ``why`` says why
        the rest were not run (``""`` when all were)."""
        if not tasks:
            return [], ""
        reader = self._reader()
        if reader is None:
            return [], READERS_STUCK
        if reader is _NO_THREAD:
            return [], NO_THREAD
        job = _Job(tasks)
        reader.give(job)
        finished = job.done.wait(self.budget)
        with self._lock:
            # Decided under the lock the reader takes when it finishes: a job is either
            # complete or abandoned, never both.
            if not finished and not job.done.is_set():
                job.abandoned = True
                self.stuck += 1
                return list(job.results), TIMED_OUT
            self._idle.append(reader)
        return list(job.results), ""

    def _reader(self) -> Any:
        with self._lock:
            if self._idle:
                return self._idle.pop()
            if self.stuck >= self.max_abandoned:
                return None
        try:
            return _Reader(self)
        except RuntimeError:  # the interpreter is shutting down and refuses new threads
            return _NO_THREAD

    def _released(self) -> None:
        """A stuck reader's object finally returned: that reader ends."""
        with self._lock:
            self.stuck -= 1


class _Reader:
    """One daemon thread running jobs handed to it, one at a time."""

    def __init__(self, owner: BoundedReader) -> None:
        self._owner = owner
        self._job: _Job | None = None
        self._ready = _threads.Condition(_threads.Lock())
        _threads.Thread(self._serve, "recalltrace-reader").start()

    def give(self, job: _Job) -> None:
        with self._ready:
            self._job = job
            self._ready.notify()

    def _next_job(self) -> _Job | None:
        """The next job; None when this reader sat idle for ``_IDLE_S`` (it then ends, and a
        new one is started when needed)."""
        while True:
            with self._ready:
                if self._job is None:
                    self._ready.wait(_IDLE_S)
                if self._job is not None:
                    job, self._job = self._job, None
                    return job
            with self._owner._lock:
                if self in self._owner._idle:
                    self._owner._idle.remove(self)
                    return None
            # Not idle: the writer took this reader just now and its job is on the way.

    def _serve(self) -> None:
        while True:
            job = self._next_job()
            if job is None:
                return
            for task in job.tasks:
                try:
                    job.results.append((True, task()))
                except BaseException as exc:  # the application's; handed to the writer
                    job.results.append((False, exc))
                if job.abandoned:
                    break
            with self._owner._lock:
                abandoned = job.abandoned
                job.done.set()
            if abandoned:
                self._owner._released()
                return


class ReadValues:
    """What reading one record's values left out, for its notes and the counts."""

    def __init__(self) -> None:
        self.left_out: list[str] = []  # positions of application values not read
        self.why = ""
        self.hanging: str | None = None  # the position being read when the budget ran out

    def notes(self, budget: float) -> list[str]:
        notes: list[str] = []
        if self.left_out:
            shown = ", ".join(self.left_out[:10]) + (" ..." if len(self.left_out) > 10 else "")
            if self.why == TIMED_OUT:
                notes.append(
                    f"reading {len(self.left_out)} application object(s) did not finish "
                    f"within the {budget:g} s budget ({self.hanging} hangs or is very slow); "
                    f"left out: {shown}"
                )
            elif self.why == READERS_STUCK:
                notes.append(
                    f"{len(self.left_out)} application object(s) not read, too many readers "
                    f"are stuck in earlier objects; left out: {shown}"
                )
            else:
                notes.append(
                    f"{len(self.left_out)} application object(s) not read, no reader thread "
                    f"could be started (the interpreter is exiting); left out: {shown}"
                )
        return notes


class _Pending:
    """Application values of a record waiting to be read: (position, read, place)."""

    def __init__(self) -> None:
        self.items: list[tuple[str, Callable[[], Any], Callable[[bool, Any], None]]] = []

    def add(
        self, position: str, read: Callable[[], Any], place: Callable[[bool, Any], None]
    ) -> None:
        self.items.append((position, read, place))


def read_values(state: Any, reader: BoundedReader) -> ReadValues:
    """Replace every value of ``state`` with plain values: plain ones are kept (read in full
    here), application objects are read within the reader's budget. ``state.notes`` gets a
    note for what was left out; the returned summary says what and why."""
    summary = ReadValues()
    pending = _Pending()
    notes: list[str] = state.notes

    def text_field(name: str) -> None:
        value = getattr(state, name)
        if is_plain(value):
            return

        def place(ok: bool, result: Any) -> None:
            if ok and result is not _LEFT_OUT:
                setattr(state, name, result)
            elif not ok:
                notes.append(
                    f"{name} not captured: its value raised {type(result).__name__} when printed"
                )

        setattr(state, name, None)
        pending.add(name, _bind(to_text, value), place)

    text_field("user_input")
    text_field("reference")
    _read_reference_contexts(state, pending, notes)
    _read_reference_ids(state, pending, notes)
    _read_contexts(state, pending)
    finish: list[Callable[[], None]] = []
    _read_metadata(state, pending, finish)

    if pending.items:
        results, why = reader.read([read for _, read, _ in pending.items])
        for (_position, _read, place), (ok, result) in zip(pending.items, results, strict=False):
            place(ok, result)
        if why:
            rest = pending.items[len(results) :]
            summary.why = why
            summary.left_out = [position for position, _, _ in rest]
            if why == TIMED_OUT and rest:
                summary.hanging = rest[0][0]
            for _position, _read, place in rest:
                place(True, _LEFT_OUT)
            notes.extend(summary.notes(reader.budget))
    for done in finish:
        done()
    return summary


class _LeftOut:
    """Stands for an application value that was not read."""


_LEFT_OUT: Any = _LeftOut()


def _bind(fn: Callable[[Any], Any], value: Any) -> Callable[[], Any]:
    return lambda: fn(value)


def _read_reference_contexts(state: Any, pending: _Pending, notes: list[str]) -> None:
    value = state.reference_contexts
    if value is None or type(value) is str:
        return
    if type(value) not in (list, tuple):
        if is_plain(value):
            state.reference_contexts = [to_text(value) or ""]
            return
        state.reference_contexts = None

        def place_all(ok: bool, result: Any) -> None:
            if ok and result is not _LEFT_OUT:
                state.reference_contexts = result
            elif not ok:
                notes.append(
                    f"reference_contexts not captured: reading them raised {type(result).__name__}"
                )

        pending.add("reference_contexts", _bind(_text_list, value), place_all)
        return
    texts: list[str | None] = []
    for index, item in enumerate(value):
        if type(item) is str:
            texts.append(item)
        elif is_plain(item):
            texts.append(_plain_content(item))
        else:
            texts.append(None)
            pending.add(
                f"reference_contexts[{index}]",
                _bind(_content_of, item),
                _placer(texts, index, f"reference_contexts[{index}]", notes, ""),
            )
    state.reference_contexts = texts


def _text_list(value: Any) -> list[str]:
    if isinstance(value, (list, tuple)):
        return [item if isinstance(item, str) else _content_of(item) for item in value]
    return [str(value)]


def _content_of(item: Any) -> str:
    return read_document(item).content


def _plain_content(item: Any) -> str:
    try:
        return read_document(item).content
    except Exception:
        return to_text(item) or ""


def _placer(
    target: list[Any], index: int, position: str, notes: list[str], empty: Any
) -> Callable[[bool, Any], None]:
    def place(ok: bool, result: Any) -> None:
        if ok and result is not _LEFT_OUT:
            target[index] = result
            return
        target[index] = empty
        if not ok:
            notes.append(f"{position} kept empty: reading it raised {type(result).__name__}")

    return place


def _read_reference_ids(state: Any, pending: _Pending, notes: list[str]) -> None:
    value = state.reference_context_ids
    if value is None:
        return
    if type(value) in (str, int, float, bool):
        state.reference_context_ids = [str(value)]
        return
    items = list(value) if type(value) in (list, tuple) else None
    if items is None:
        # A set, a generator or another object: iterating it is the application's code.
        state.reference_context_ids = None

        def place_all(ok: bool, result: Any) -> None:
            if ok and result is not _LEFT_OUT:
                state.reference_context_ids, unprintable = result
                if unprintable:
                    notes.append(
                        f"reference_context_ids: {unprintable} id(s) left out: printing them raised"
                    )
            elif not ok:
                notes.append(
                    f"reference_context_ids not captured: reading them raised "
                    f"{type(result).__name__}"
                )

        pending.add("reference_context_ids", _bind(_id_list, value), place_all)
        return
    ids: list[Any] = []
    for index, item in enumerate(items):
        if type(item) in _PLAIN_LEAVES and item is not None:
            ids.append(item if type(item) is str else str(item))
        elif item is None:
            ids.append(LEFT_OUT_ID)
            notes.append(f"reference_context_ids[{index}] left out: it is None")
        else:
            ids.append(LEFT_OUT_ID)
            pending.add(
                f"reference_context_ids[{index}]",
                _bind(str, item),
                _id_placer(ids, index, notes),
            )
    state.reference_context_ids = ids


def _id_list(value: Any) -> tuple[list[str], int]:
    """Ids of an iterable the application gave (each printed), and how many were left out
    because printing them raised (the caller notes them)."""
    ids: list[str] = []
    unprintable = 0
    for item in value:
        try:
            ids.append(str(item))
        except Exception:
            unprintable += 1
    return ids, unprintable


def _id_placer(ids: list[Any], index: int, notes: list[str]) -> Callable[[bool, Any], None]:
    def place(ok: bool, result: Any) -> None:
        if ok and result is not _LEFT_OUT:
            ids[index] = result
            return
        ids[index] = LEFT_OUT_ID
        if not ok:
            notes.append(
                f"reference_context_ids[{index}] left out: its value raised "
                f"{type(result).__name__} when printed"
            )

    return place


def _read_contexts(state: Any, pending: _Pending) -> None:
    docs: list[Any] = []
    for item in state.contexts:
        if isinstance(item, tuple):
            docs.append(item)
            continue
        docs.extend(item.items)
    read: list[Any] = [None] * len(docs)
    for index, item in enumerate(docs):
        if isinstance(item, Doc):
            if item.metadata and not is_plain(item.metadata):
                read[index] = item
                pending.add(
                    f"retrieved_contexts[{index}].metadata",
                    _bind(json_safe, item.metadata),
                    _metadata_placer(read, index),
                )
            else:
                read[index] = item
        elif is_plain(item):
            try:
                read[index] = read_document(item)
            except Exception as exc:
                read[index] = unreadable(exc)
        else:
            read[index] = None  # placed once read
            pending.add(
                f"retrieved_contexts[{index}]",
                _bind(read_document, item),
                _doc_placer(read, index),
            )
    state.contexts = read


def _doc_placer(read: list[Any], index: int) -> Callable[[bool, Any], None]:
    def place(ok: bool, result: Any) -> None:
        if result is _LEFT_OUT:
            read[index] = unreadable(None)  # not read at all: the reader's note says so
        elif ok:
            read[index] = result
        else:
            read[index] = unreadable(result)

    return place


def _metadata_placer(read: list[Any], index: int) -> Callable[[bool, Any], None]:
    def place(ok: bool, result: Any) -> None:
        doc = read[index]
        metadata = result if ok and result is not _LEFT_OUT else {}
        read[index] = Doc(doc.content, doc.id, doc.score, metadata)

    return place


def _read_metadata(state: Any, pending: _Pending, finish: list[Callable[[], None]]) -> None:
    metadata = state.metadata
    if not metadata or is_plain(metadata):
        return
    # Each entry in its place: (key, value), or a slot an application value is read into.
    entries: list[list[Any]] = []
    for key, value in list(metadata.items()):
        if type(key) is str and is_plain(value):
            entries.append([key, value])
            continue
        position = f"metadata[{key!r}]" if type(key) is str else "a metadata key"
        entry: list[Any] = [_LEFT_OUT, _LEFT_OUT]
        entries.append(entry)

        def place(ok: bool, result: Any, entry: list[Any] = entry, at: str = position) -> None:
            if ok and result is not _LEFT_OUT:
                entry[0], entry[1] = result
            elif not ok:
                state.notes.append(f"{at} left out: reading it raised {type(result).__name__}")

        pending.add(position, _bind(_metadata_item, (key, value)), place)

    def done() -> None:
        state.metadata = {key: value for key, value in entries if key is not _LEFT_OUT}

    finish.append(done)


def _metadata_item(pair: tuple[Any, Any]) -> tuple[str, Any]:
    key, value = pair
    return (key if type(key) is str else str(key)), json_safe(value)


at_fork_in_child(FORK_WRITERS, _reset_readers_in_child)
