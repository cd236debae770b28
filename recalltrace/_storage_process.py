"""Storing trace records from a separate process (the tracer's ``storage_process`` option).

The tracer's writer thread assembles each record in the application's process as always; with
``storage_process=True`` it then hands every batch to a child process over a pipe (one frame
per batch) and waits for the child's answer, instead of talking to the database itself. The
child scrubs the records (with the tracer's scrubbing options; a scrubbing ``callback`` is the
application's code, so with one the writer thread scrubs as before) and stores them: the
scrubbing rules and the database driver's work (row encoding, COPY, the round trips of a
transaction) run on the child's interpreter, not between the application's threads, and a busy
web server keeps its GIL for its requests. Nothing is stored unscrubbed: the child scrubs a
batch before it writes it.

The writer sees an ordinary sink: ``write_traces`` returns when the child has committed the
batch, and raises what the writer already knows how to handle when it could not (storage
unreachable: retried as it is; tables missing: kept until they exist; refused: counted against
the record's attempts). The ledger is kept in the application's process, so every record still
ends in exactly one counted outcome.

The child is started on the first write, with the application's interpreter and its
``sys.path`` (``python -c "... from recalltrace._storage_process import main; main()"``, where
``python`` is :func:`python_interpreter`), and started again when it is gone; when it cannot be
started at all, the tracer stores from its writer thread instead. It
ignores SIGINT and SIGTERM: it ends when its pipe closes (the application exits, or the tracer
shuts down after draining its queue), so a signal sent to the whole process group does not end
it before the application has handed over what it holds. A child that does not answer within
``reply_timeout`` seconds is killed and the batch retried (writes are idempotent on trace id).

Once its first request has been served, the child hands what it has built so far (the database
driver, SQLAlchemy's modules and statement caches, the scrubbing rules: tens of thousands of
objects) to the garbage collector's permanent generation (``gc.freeze()``): they live as long
as the process, and every later full collection would scan them all again. The child's own
process only; the application's heap is left as it is.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import json
import logging
import marshal
import operator
import os
import pickle
import signal
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import fields
from datetime import datetime
from typing import Any

from recalltrace.storage.records import ContextRecord, TraceRecord, WriteResult
from recalltrace.tracer import ScrubbingOptions
from recalltrace.tracer._plain import AssemblyOptions, PlainTrace, assemble_plain
from recalltrace.tracer._state import scrub_with_pool
from recalltrace.tracer._threads import original

logger = logging.getLogger(__name__)

# The writer thread's pipe to the child runs on an operating-system thread: a green-thread
# library's versions would wait on a hub of that thread's own, and its ``subprocess`` would
# start and reap the child from the hub's loop. The child is started with ``posix_spawn`` and
# waited for with the operating system's ``waitpid``.
_select = original("select", "select")
_waitpid = original("os", "waitpid")
_posix_spawn = original("os", "posix_spawn")
_close = original("os", "close")
_sleep = original("time", "sleep")


def _inheritable_descriptors() -> list[int]:
    """This process's descriptors above stderr that a spawned program would inherit (a server's
    pipes and sockets made without close-on-exec: uWSGI's)."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return []
    found = []
    for name in names:
        fd = int(name)
        if fd > 2:
            with contextlib.suppress(OSError):
                if os.get_inheritable(fd):
                    found.append(fd)
    return found


class _Child:
    """The storage process: started with ``posix_spawn``, its stdin and stdout the two pipes,
    its stderr the application's; it holds none of the application's other descriptors (a
    copy of a server's pipe kept it open: uWSGI's threaded workers waited on its end)."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        to_read, to_write = os.pipe()
        from_read, from_write = os.pipe()
        try:
            self.pid = _posix_spawn(
                argv[0],
                argv,
                env,
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, to_read, 0),
                    (os.POSIX_SPAWN_DUP2, from_write, 1),
                    *((os.POSIX_SPAWN_CLOSE, fd) for fd in _inheritable_descriptors()),
                ],
            )
        except BaseException:
            for fd in (to_read, to_write, from_read, from_write):
                _close(fd)
            raise
        _close(to_read)
        _close(from_write)
        self.to_child = to_write
        self.from_child = from_read
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit code once the child ended (and was reaped here), else ``None``."""
        if self.returncode is None:
            try:
                pid, status = _waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -1  # reaped by someone else (a green-thread library's loop)
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the child to end, at most ``timeout`` seconds; its exit code, or ``None``
        when it is still running."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.001
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                return None
            _sleep(delay)
            delay = min(delay * 2, 0.05)
        return self.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


_HEADER = struct.Struct("!Q")
_PIPE_SIZE = 1 << 20
"""Pipe capacity asked for (Linux), so that a batch is usually one write."""
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_PATH_VARIABLE = "RECALLTRACE_STORAGE_PROCESS_PATH"
_BOOTSTRAP = (
    # What the child got of the application's descriptors besides its pipes and stderr (one
    # opened by another thread while it was spawned) is closed before anything else.
    "import json, os, sys; os.closerange(3, os.sysconf('SC_OPEN_MAX')); "
    f"sys.path[:] = json.loads(os.environ.pop({_PATH_VARIABLE!r})); "
    "from recalltrace._storage_process import main; main()"
)


class StorageProcessLost(ConnectionError):
    """The storage process exited, or did not answer in time; the batch is retried."""


class StorageProcessCannotStart(StorageProcessLost):
    """The storage process could not be started (no Python interpreter to start it with, or it
    ended or stayed silent while starting): the tracer stores from its writer thread instead."""

    cannot_start = True
    """What the tracer's record pipeline looks for (it does not import this module)."""


class StorageProcessUnavailable(ConnectionError):
    """The storage process could not reach the database."""


class StorageProcessTraceNotFound(LookupError):
    """The storage process found no stored trace for a late reference."""


class StorageProcessUndefinedTable(RuntimeError):
    """The database the storage process writes to has no recalltrace tables."""


class StorageProcessRefused(RuntimeError):
    """The database refused what the storage process wrote."""


# -- framing -------------------------------------------------------------------------------


def _write_all(fd: int, data: bytes, deadline: float | None) -> None:
    view = memoryview(data)
    while view:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the storage process did not take a batch in time")
            _select([], [fd], [], left)
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            continue
        view = view[written:]


def _read_exact(fd: int, size: int, deadline: float | None) -> bytes:
    parts: list[bytes] = []
    while size:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the storage process did not answer in time")
            ready, _, _ = _select([fd], [], [], left)
            if not ready:
                continue
        try:
            chunk = os.read(fd, min(size, _PIPE_SIZE))
        except BlockingIOError:
            continue
        if not chunk:
            raise EOFError("the storage process closed its pipe")
        parts.append(chunk)
        size -= len(chunk)
    return b"".join(parts)


def _send(fd: int, payload: bytes, deadline: float | None) -> None:
    _write_all(fd, _HEADER.pack(len(payload)) + payload, deadline)


def _receive(fd: int, deadline: float | None) -> Any:
    (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
    return pickle.loads(_read_exact(fd, size, deadline))


def _grow_pipe(fd: int) -> None:
    # A smaller pipe only means more writes per batch.
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, _F_SETPIPE_SZ, _PIPE_SIZE)


# -- the application's side ----------------------------------------------------------------


def python_interpreter() -> str | None:
    """The Python interpreter to start the storage process with: ``sys.executable`` when it is
    one. A server that embeds Python (uWSGI, mod_wsgi) sets ``sys.executable`` to its own
    program, which would read ``-c`` as its own option; then the interpreter of this Python
    version in the environment's ``bin`` (a virtualenv's), else in the installation's.
    ``None`` when none is found."""
    major, minor = sys.version_info[:2]
    candidates = [sys.executable]
    for prefix in dict.fromkeys((sys.prefix, sys.exec_prefix, sys.base_prefix)):
        for name in (f"python{major}.{minor}", f"python{major}"):
            candidates.append(os.path.join(prefix, "bin", name))
    candidates.append(getattr(sys, "_base_executable", ""))
    for path in candidates:
        name = os.path.basename(path or "")
        if name.startswith(("python", "pypy")) and os.access(path, os.X_OK):
            return path
    return None


class StorageProcessSink:
    """A trace sink that stores through a child process (see the module's documentation)."""

    def __init__(
        self,
        database_url: str | None,
        *,
        create_schema: bool | None = None,
        reply_timeout: float = 120.0,
        start_timeout: float = 120.0,
        scrubbing: ScrubbingOptions | None = None,
        assembly: AssemblyOptions | None = None,
        nice: int = 0,
        metrics: Sequence[str] | None = None,
    ) -> None:
        if scrubbing is not None and scrubbing.callback is not None:
            raise ValueError("a scrubbing callback runs in the application: scrub there")
        self._database_url = database_url
        self._create_schema = create_schema
        self._scrubbing = scrubbing
        self._assembly = assembly
        self._nice = nice
        self._metrics = None if metrics is None else list(metrics)
        self._reply_timeout = reply_timeout
        self._start_timeout = start_timeout
        self._proc: _Child | None = None
        self._to_child = -1
        self._from_child = -1
        self._owner = os.getpid()

    def write_traces(self, records: Sequence[TraceRecord | PlainTrace]) -> WriteResult:
        """Store a batch through the child; returns once it is committed, saying what was
        stored (the plain traces the child could not assemble are not: it logged why)."""
        result = self._call("write", encode_batch(records, self._assembly))
        if not isinstance(result, WriteResult):
            raise StorageProcessRefused(f"the storage process answered {result!r} to a write")
        return result

    def stored_ids(self, trace_ids: Sequence[str]) -> set[str]:
        """Which of ``trace_ids`` are stored (looked up by the child)."""
        return set(self._call("stored", pickle.dumps(list(trace_ids), pickle.HIGHEST_PROTOCOL)))

    @property
    def helper_pid(self) -> int:
        """The pid of the storage process (0 while none runs)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.returncode is None else 0

    def attach_reference(self, update: Any) -> int:
        """Attach a late reference through the child."""
        return int(self._call("reference", pickle.dumps(update, pickle.HIGHEST_PROTOCOL)))

    def status(self) -> dict[str, int]:
        """The child's process id and its garbage collector's counts: ``frozen`` (objects in
        the permanent generation) and ``tracked`` (objects its collections scan)."""
        return dict(self._call("status", b""))

    def dispose(self) -> None:
        """Close the pipe and let the child finish its last batch and exit."""
        proc = self._proc
        self._proc = None
        if proc is None or os.getpid() != self._owner:
            return
        self._close_pipes()
        if proc.wait(timeout=10) is None:
            logger.warning("recalltrace: the storage process did not exit; killing it")
            proc.kill()
            proc.wait()

    def release_after_fork(self) -> None:
        """In a forked child: drop the parent's pipes without touching its process."""
        self._close_pipes()
        self._proc = None

    # -- internals -------------------------------------------------------------------------

    def _start(self) -> None:
        # The child imports what this process imports: it starts with this process's sys.path.
        env = dict(os.environ)
        env[_PATH_VARIABLE] = json.dumps(sys.path)
        python = python_interpreter()
        if python is None:
            raise StorageProcessCannotStart(
                f"the storage process cannot be started: this process's program "
                f"({sys.executable or 'unknown'}) is not a Python interpreter, and none of "
                f"Python {sys.version_info[0]}.{sys.version_info[1]} was found in {sys.prefix} "
                f"or {sys.base_prefix}"
            )
        try:
            proc = _Child([python, "-c", _BOOTSTRAP], env)
        except OSError as exc:
            raise StorageProcessCannotStart(
                f"the storage process could not be started with {python} ({exc})"
            ) from exc
        self._to_child = proc.to_child
        self._from_child = proc.from_child
        _grow_pipe(self._to_child)
        os.set_blocking(self._to_child, False)
        self._proc = proc
        self._owner = os.getpid()
        config = {
            "database_url": self._database_url,
            "create_schema": self._create_schema,
            "scrubbing": self._scrubbing,
            "assembly": self._assembly,
            "nice": self._nice,
            "metrics": self._metrics,
        }
        # Starting (an interpreter, SQLAlchemy and the driver imported) has its own bound, so
        # that a slow start on a busy host is not taken for a write that hangs.
        deadline = time.monotonic() + self._start_timeout
        try:
            _send(self._to_child, pickle.dumps(config), deadline)
            ready = _receive(self._from_child, deadline)
        except TimeoutError as exc:
            raise self._lost(
                f"did not start within {self._start_timeout:g} s", StorageProcessCannotStart
            ) from exc
        except (OSError, EOFError) as exc:
            raise self._lost(
                f"exited while starting ({exc}; started as {python} -c ...)",
                StorageProcessCannotStart,
            ) from exc
        if ready != "ready":
            raise self._lost(f"answered {ready!r} while starting", StorageProcessCannotStart)

    def _close_pipes(self) -> None:
        for fd in (self._to_child, self._from_child):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    _close(fd)
        self._to_child = self._from_child = -1

    def _lost(
        self, why: str, kind: type[StorageProcessLost] = StorageProcessLost
    ) -> StorageProcessLost:
        proc = self._proc
        self._proc = None
        self._close_pipes()
        code = None
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            code = proc.wait()
        return kind(f"the storage process {why} (exit code {code})")

    def _call(self, op: str, payload: bytes) -> Any:
        if self._proc is not None and os.getpid() == self._owner and self._proc.poll() is not None:
            raise self._lost("exited")
        if self._proc is None or os.getpid() != self._owner:
            self._start()
        deadline = time.monotonic() + self._reply_timeout
        try:
            _send(self._to_child, op.encode() + b"\0" + payload, deadline)
            status, value, lines = _receive(self._from_child, deadline)
        except TimeoutError as exc:
            raise self._lost(f"did not answer within {self._reply_timeout:g} s") from exc
        except (OSError, EOFError) as exc:
            raise self._lost(f"exited ({exc})") from exc
        _say_again(lines)
        if status == "ok":
            return value
        raise _remote_error(value)


# A batch travels as plain values (marshal: several times cheaper than pickling the
# dataclasses, on the application's side): a record as the list of its fields, a plain trace
# as the tuple of its values; a record holding a value marshal cannot carry sends its batch
# pickled instead.
_TRACE_FIELDS = tuple(f.name for f in fields(TraceRecord))
_CONTEXT_FIELDS = tuple(f.name for f in fields(ContextRecord))
_trace_values = operator.attrgetter(*_TRACE_FIELDS)
_context_values = operator.attrgetter(*_CONTEXT_FIELDS)
_STARTED = _TRACE_FIELDS.index("started_at")
_CONTEXTS = _TRACE_FIELDS.index("retrieved_contexts")


def encode_batch(
    records: Sequence[TraceRecord | PlainTrace], assembly: AssemblyOptions | None = None
) -> bytes:
    """``records`` as one frame's payload (:func:`decode_batch` reads it back)."""
    rows: list[Any] = []
    for record in records:
        if type(record) is PlainTrace:
            rows.append(tuple(record.values))
            continue
        row = list(_trace_values(record))
        row[_STARTED] = row[_STARTED].isoformat()
        row[_CONTEXTS] = [_context_values(context) for context in row[_CONTEXTS]]
        rows.append(row)
    try:
        return b"M" + marshal.dumps(rows)
    except ValueError:
        return b"P" + _pickled_batch(records, assembly)


def decode_batch(payload: bytes) -> list[TraceRecord | PlainTrace]:
    """The records and plain traces of a payload made by :func:`encode_batch`."""
    if payload[:1] == b"P":
        return list(pickle.loads(payload[1:]))
    records: list[TraceRecord | PlainTrace] = []
    for row in marshal.loads(payload[1:]):
        if type(row) is tuple:
            values = list(row)
            records.append(PlainTrace(format(values[0], "032x"), values[3], values))
            continue
        row[_STARTED] = datetime.fromisoformat(row[_STARTED])
        row[_CONTEXTS] = [ContextRecord(*values) for values in row[_CONTEXTS]]
        records.append(TraceRecord(*row))
    return records


def _pickled_batch(records: Sequence[Any], assembly: AssemblyOptions | None) -> bytes:
    try:
        return pickle.dumps(list(records), pickle.HIGHEST_PROTOCOL)
    except Exception:
        # A value in some record pickle cannot carry (nested deeper than it recurses, say):
        # those records go as the storable copy the database would get anyway (values made
        # JSON-safe, nesting cut); a plain trace is assembled here first, unscrubbed, and the
        # storage process scrubs it as it scrubs every record it is given.
        from recalltrace.storage._storable import storable_record

        options = assembly if assembly is not None else AssemblyOptions(None, None, None)
        safe = []
        for record in records:
            try:
                pickle.dumps(record, pickle.HIGHEST_PROTOCOL)
                safe.append(record)
            except Exception:
                if type(record) is PlainTrace:
                    record = assemble_plain(record.values, None, options)
                safe.append(storable_record(record))
        return pickle.dumps(safe, pickle.HIGHEST_PROTOCOL)


def _remote_error(info: dict[str, Any]) -> Exception:
    text = f"{info['type']}: {info['message']}"
    if info.get("not_found"):
        return StorageProcessTraceNotFound(text)
    if info.get("unavailable"):
        return StorageProcessUnavailable(text)
    if info.get("schema_missing"):
        return StorageProcessUndefinedTable(text)
    return StorageProcessRefused(text)


# -- the child's side ----------------------------------------------------------------------


def _describe(exc: BaseException) -> dict[str, Any]:
    from recalltrace.storage.errors import (
        is_database_unavailable,
        is_schema_missing,
        is_trace_not_found,
    )

    return {
        "type": type(exc).__name__,
        "message": (str(exc).strip().splitlines() or [""])[0][:500],
        "not_found": is_trace_not_found(exc),
        "unavailable": is_database_unavailable(exc),
        "schema_missing": is_schema_missing(exc),
    }


def _say_again(lines: list[tuple[str, int, str]]) -> None:
    """Log in the application what the storage process logged (its warnings and errors): the
    application's own logging setup says them, not only the child's stderr."""
    for _, level, text in lines:
        logger.log(level, "%s", text)


class _Kept(logging.Handler):
    """In the storage process: keeps the ``recalltrace`` loggers' warnings and errors, sent to
    the application with the next answer (said there once, not on the child's stderr)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[tuple[str, int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.exc_info:
                text += "\n" + logging.Formatter().formatException(record.exc_info)
            self.lines.append((record.name, record.levelno, text))
        except Exception:
            self.handleError(record)

    def take(self) -> list[tuple[str, int, str]]:
        lines, self.lines = self.lines, []
        return lines


def serve(from_parent: int, to_parent: int) -> None:
    """The child's loop: read frames from the parent, store them, answer each."""
    # Registered by ``import recalltrace``, which ``python -m`` ran before this module.
    from recalltrace.tracer._sinks import open_default_sink
    from recalltrace.tracer._state import scrub_reference

    config = _receive(from_parent, None)
    kept = _Kept()
    root = logging.getLogger("recalltrace")
    root.addHandler(kept)
    root.propagate = False  # said by the application, not again on this process's stderr
    if config.get("nice"):
        # Below the application's priority: on a host with no core to spare, the application's
        # requests come first and the records wait in its bounded queue.
        os.nice(config["nice"])
    # What the first write needs, imported (and the scrubber's rules compiled) before saying
    # ready.
    import recalltrace.storage.repository  # noqa: F401

    scrubber = None
    if config.get("scrubbing") is not None:
        from recalltrace.tracer._scrub import build_scrubber

        scrubber = build_scrubber(config["scrubbing"])

    assembly = config.get("assembly")
    _send(to_parent, pickle.dumps("ready"), None)
    sink: Any = None
    frozen = False
    try:
        while True:
            try:
                frame = _read_frame(from_parent)
            except EOFError:
                return
            op, _, payload = frame.partition(b"\0")
            try:
                if sink is None:
                    sink = open_default_sink(
                        config["database_url"],
                        create_schema=config["create_schema"],
                        metrics=config.get("metrics"),
                    )
                value: Any = None
                if op == b"write":
                    records, unassembled = _assembled(decode_batch(payload), scrubber, assembly)
                    written = sink.write_traces(records) or WriteResult(stored=len(records))
                    value = WriteResult(
                        stored=written.stored,
                        conflicts=written.conflicts,
                        unassembled=tuple(unassembled),
                    )
                elif op == b"reference":
                    update = pickle.loads(payload)
                    if scrubber is not None:
                        update = scrub_reference(scrubber, update)
                    value = sink.attach_reference(update)
                elif op == b"stored":
                    value = set(sink.stored_ids(pickle.loads(payload)))
                elif op == b"status":
                    value = {
                        "pid": os.getpid(),
                        "frozen": gc.get_freeze_count(),
                        "tracked": len(gc.get_objects()),
                    }
                else:
                    raise ValueError(f"unknown request {op!r}")
                answer = ("ok", value)
                if not frozen:
                    # Everything this process keeps till it exits now exists (the driver, the
                    # engine, compiled statements): out of every later full collection's scan.
                    gc.collect()
                    gc.freeze()
                    frozen = True
            except Exception as exc:
                answer = ("error", _describe(exc))
            _send(to_parent, pickle.dumps((*answer, kept.take()), pickle.HIGHEST_PROTOCOL), None)
    finally:
        try:
            if sink is not None:
                sink.dispose()
        finally:
            # No answer is left to carry what was said since the last one: the child says it.
            for name, _, text in kept.take():
                sys.stderr.write(f"{name}: {text}\n")


def _assembled(
    items: list[TraceRecord | PlainTrace], scrubber: Any, assembly: AssemblyOptions | None
) -> tuple[list[TraceRecord], list[str]]:
    """The records of a batch, each scrubbed, plain traces assembled; and the ids of the plain
    traces that could not be (each logged; the application counts them as dropped)."""
    records: list[TraceRecord] = []
    unassembled: list[str] = []
    for item in items:
        if type(item) is not PlainTrace:
            if scrubber is not None:
                scrub_with_pool(scrubber, item)  # type: ignore[arg-type]
            records.append(item)  # type: ignore[arg-type]
            continue
        try:
            if assembly is None:
                raise RuntimeError("the storage process was given no assembly options")
            records.append(assemble_plain(item.values, scrubber, assembly))
        except Exception:
            logger.exception(
                "recalltrace storage process: could not assemble trace %s", item.trace_id
            )
            unassembled.append(item.trace_id)
    return records, unassembled


def _read_frame(fd: int) -> bytes:
    (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, None))
    return _read_exact(fd, size, None)


def main() -> None:
    """Entry point of the child (also ``python -m recalltrace._storage_process``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # The protocol owns stdin and stdout; anything printed goes to stderr instead.
    from_parent = os.dup(0)
    to_parent = os.dup(1)
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    serve(from_parent, to_parent)


if __name__ == "__main__":
    main()
