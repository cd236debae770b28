"""Drain the queue when the process is told to stop, without changing what stopping does.

``atexit`` does not run when a process dies of a signal, and servers such as uvicorn catch
SIGTERM for a graceful shutdown and then raise it again with the default action restored, so
the records still queued at that moment would be lost. ``install`` puts a handler in front of
whatever handles SIGTERM and SIGINT when ``configure()`` runs (main thread only):

- **Default action** (no one else handles the signal): drain the queue within
  ``shutdown_timeout``, then restore the default and raise the signal again, so the process ends
  exactly as it would have (exit status included).
- **SIGINT's default** (``KeyboardInterrupt``): flush within ``shutdown_timeout``, then raise
  ``KeyboardInterrupt`` as before.
- **Ignored**: still ignored; the queue is not touched.
- **The application's or server's own handler**: it runs first, unchanged; it decides when the
  process ends (a graceful shutdown may still finish requests). From then on the writer writes
  each record as soon as it is queued, and if the server later raises the signal again with the
  default action (as uvicorn does), the queue is drained just before, in the main thread.

A stopping signal that arrives while the process's last drain runs (a pool worker told to stop
while it drains at its exit) takes effect as soon as that drain ends, which ``shutdown_timeout``
bounds.

A handler runs in the main thread between two of its instructions, wherever that thread is. When
it finds the thread inside the tracer (queuing a record, holding a lock the drain needs), it does
nothing yet and has the signal sent to the main thread again a moment later, until the thread
has left the tracer (for at most about a second; then it goes ahead, and the drain on its helper
thread is bounded by ``shutdown_timeout``).

A gunicorn worker replaces every signal handler right after the fork (``init_signals``), so a
worker of a ``--preload`` application would lose ours; in a forked child of a gunicorn master the
worker classes' ``init_signals`` are wrapped to put the handler back in front once they ran.

Set ``handle_signals=False`` (``RECALLTRACE_HANDLE_SIGNALS=0``) to leave signals alone; then
call ``recalltrace.shutdown()`` from the framework's own hook (FastAPI's lifespan, gunicorn's
``worker_exit``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from recalltrace.tracer import _threads

logger = logging.getLogger("recalltrace.tracer")
_sleep = _threads.original("time", "sleep")
# A green-thread library's os.close defers closing a pipe to its loop, which may never run.
_close = _threads.original("os", "close")

HANDLED = (signal.SIGTERM, signal.SIGINT)

_previous: dict[int, Any] = {}
_drain: Callable[[str, bool], None] | None = None
_eager: Callable[[], None] | None = None
_watching = False
_enabled = False
# Set while the process's last drain runs; stopping signals received meanwhile wait in _deferred.
_final_running = False
_deferred: list[int] = []
# The gunicorn ``init_signals`` methods already wrapped (in this process).
_wrapped: set[Any] = set()
# Set when _handle first runs; the write end of the wakeup pipe watched for missed signals.
_handling = _threads.Event()
_wakeup_fd = -1
_RESENDS = 5
# The tracer's own source files: a handler interrupting one of them waits until it is left.
_TRACER_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# The standard library's folder (``os`` lives in it); installed packages under it are not.
_STDLIB_DIR = os.path.dirname(os.path.abspath(os.__file__)) + os.sep
_PACKAGE_FOLDERS = ("site-packages" + os.sep, "dist-packages" + os.sep)
# Redelivery of a signal that found the main thread inside the tracer: a pipe written from the
# handler (a plain system call, no lock) and read by one thread per process.
_REDELIVER_AFTER_S = 0.002
_MAX_REDELIVERIES = 500
_redeliver_pipe: tuple[int, int, int] | None = None  # (read end, write end, owning pid)
_redeliveries: dict[int, int] = {}


def install(drain: Callable[[str, bool], None], eager: Callable[[], None]) -> bool:
    """Put the draining handler in front of SIGTERM's and SIGINT's current handlers.

    ``drain(why, final)`` empties the queue (``final``: the process is about to end); ``eager()``
    makes the writer write records as soon as they are queued. Returns False when signals
    cannot be handled here (not the main thread). Installing again keeps the handlers already
    chained to and only refreshes the callbacks.
    """
    global _drain, _eager, _enabled
    _drain, _eager = drain, eager
    _enabled = True
    if threading.current_thread() is not threading.main_thread():
        return False
    for signum in HANDLED:
        current = signal.getsignal(signum)
        if current is _handle or current is None:
            # Ours already, or set outside Python (then it cannot be chained to): leave it.
            continue
        _previous[signum] = current
        signal.signal(signum, _handle)
    return True


def keep_off_this_thread() -> None:
    """Block SIGTERM and SIGINT in the calling thread (one of the tracer's own).

    Python runs signal handlers in the main thread only. A signal sent to the process may be
    delivered by the kernel to any thread that does not block it; delivered to one of the
    tracer's threads, it would leave a main thread waiting in a C call (a pool worker waiting
    for its next task) uninterrupted, and the process would not stop. Blocked here, it goes to
    the main thread."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, set(HANDLED))


def uninstall() -> None:
    """Give each signal back the handler it had before :func:`install`, if ours is still set."""
    global _enabled
    _enabled = False
    if threading.current_thread() is not threading.main_thread():
        return
    for signum, previous in list(_previous.items()):
        if signal.getsignal(signum) is _handle:
            signal.signal(signum, previous)
        del _previous[signum]


def _handle(signum: int, frame: FrameType | None) -> None:
    _handling.set()
    previous = _previous.get(signum, signal.SIG_DFL)
    name = signal.Signals(signum).name
    if previous is signal.SIG_IGN:
        return
    if _final_running:
        # The last drain is running (this handler interrupted it): let it finish first.
        _deferred.append(signum)
        return
    if _inside_tracer(frame) and _redeliver_later(signum):
        return
    _redeliveries.pop(signum, None)
    if callable(previous) and previous is not signal.default_int_handler:
        if _eager is not None:
            _eager()
        _watch_for_reraise()
        previous(signum, frame)
        return
    if previous is signal.default_int_handler:
        _run_drain(f"{name} received", final=False)
        previous(signum, frame)
        return
    _run_drain(f"{name} received", final=True)
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)


def _inside_tracer(frame: FrameType | None) -> bool:
    """True when the interrupted thread is running the tracer's own code, directly or through
    the standard library (a ``json`` or ``logging`` call made by the tracer). Not when it runs
    the application's code, even inside a traced call: that is never held up."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(_TRACER_DIR):
            return True
        if not _in_standard_library(filename):
            return False
        frame = frame.f_back
    return False


def _in_standard_library(filename: str) -> bool:
    if filename.startswith("<frozen "):
        return True
    if not filename.startswith(_STDLIB_DIR):
        return False
    inside = filename[len(_STDLIB_DIR) :]
    return not inside.startswith(_PACKAGE_FOLDERS)


def _redeliver_later(signum: int) -> bool:
    """Have ``signum`` sent to the main thread again shortly; False when it was already sent
    again too often (the thread stays inside the tracer: go ahead now)."""
    global _redeliver_pipe
    count = _redeliveries.get(signum, 0)
    if count >= _MAX_REDELIVERIES or not hasattr(signal, "pthread_kill"):
        return False
    pid = os.getpid()
    if _redeliver_pipe is None or _redeliver_pipe[2] != pid:
        main = threading.main_thread().ident
        read_end, write_end = os.pipe()
        try:
            _threads.Thread(lambda: _redeliver(read_end, main), "recalltrace-signals").start()
        except RuntimeError:  # the interpreter is ending: no thread can start
            _close(read_end)
            _close(write_end)
            return False
        _redeliver_pipe = (read_end, write_end, pid)
    try:
        os.write(_redeliver_pipe[1], bytes([signum]))
    except OSError:
        return False
    _redeliveries[signum] = count + 1
    return True


def _received(read_end: int) -> Iterator[bytes]:
    """The signal numbers written to a pipe, as they come, until it closes."""
    while True:
        try:
            received = os.read(read_end, 64)
        except OSError:
            return
        if not received:
            return
        yield received


def _redeliver(read_end: int, main: int | None) -> None:
    keep_off_this_thread()
    for received in _received(read_end):
        if main is None:
            return
        _sleep(_REDELIVER_AFTER_S)
        for signum in dict.fromkeys(received):
            signal.pthread_kill(main, signum)


def _run_drain(why: str, final: bool) -> None:
    if _drain is None:
        return
    try:
        _drain(why, final)
    except Exception:
        logger.exception("recalltrace: draining the queue on %s failed", why)


_ENDINGS: tuple[Any, ...] = (signal.raise_signal,)


def _watch_for_reraise() -> None:
    """Drain in the main thread right before it raises a signal again or kills itself (what a
    server does after its graceful shutdown), by watching its calls of those functions.

    Uses the main thread's profile hook only while the process is stopping, and only when no
    profiler holds it; otherwise the eager writer alone keeps the loss to what is in flight.
    """
    global _watching
    if _watching or sys.getprofile() is not None:
        return

    endings = (*_ENDINGS, os.kill, os._exit, os.abort)

    def watch(frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call" and any(arg is ending for ending in endings):
            sys.setprofile(None)
            _run_drain("the process is ending after a signal", final=True)

    _watching = True
    sys.setprofile(watch)


@contextlib.contextmanager
def final_drain() -> Iterator[None]:
    """Mark the process's last drain: a SIGTERM or SIGINT arriving meanwhile is delivered, as it
    would have been, once the drain is over."""
    global _final_running
    if _final_running:
        yield
        return
    _final_running = True
    try:
        yield
    finally:
        _final_running = False
        pending = list(dict.fromkeys(_deferred))
        _deferred.clear()
        for signum in pending:
            _deliver(signum)


def _deliver(signum: int) -> None:
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, None)
    elif previous is not signal.SIG_IGN:
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)


def after_fork_in_child() -> None:
    """In a forked child: forget the parent's stopping state, and when the parent is a gunicorn
    master, put the handler back in front once the worker set up its own."""
    global _watching, _final_running, _wakeup_fd, _handling
    global _redeliver_pipe
    _watching = False
    _final_running = False
    _deferred.clear()
    _redeliveries.clear()
    if _redeliver_pipe is not None:
        # The parent's: its reading thread is not in this process.
        for end in _redeliver_pipe[:2]:
            with contextlib.suppress(OSError):
                _close(end)
        _redeliver_pipe = None
    _handling = _threads.Event()
    if _wakeup_fd != -1:
        # The parent's pipe: its watcher would take this child's signals for its own.
        if threading.current_thread() is threading.main_thread():
            try:
                if signal.set_wakeup_fd(-1) != _wakeup_fd:
                    signal.set_wakeup_fd(-1)
            except (ValueError, OSError):
                pass
        _wakeup_fd = -1
    if not _enabled:
        return
    base = getattr(sys.modules.get("gunicorn.workers.base"), "Worker", None)
    if isinstance(base, type):
        _follow_worker_signals(base)


def _follow_worker_signals(base: type) -> None:
    classes: list[type] = [base]
    for cls in classes:
        subclasses: list[type] = cls.__subclasses__()
        classes.extend(sub for sub in subclasses if sub not in classes)
    for cls in classes:
        original = cls.__dict__.get("init_signals")
        if original is None or original in _wrapped:
            continue
        wrapper = _after_init_signals(original)
        _wrapped.add(wrapper)
        type.__setattr__(cls, "init_signals", wrapper)


def _after_init_signals(original: Callable[[Any], None]) -> Callable[[Any], None]:
    def init_signals(worker: Any) -> None:
        original(worker)
        if not _enabled or _drain is None or _eager is None:
            return
        server_handles_term = callable(signal.getsignal(signal.SIGTERM))
        install(_drain, _eager)
        if server_handles_term and hasattr(signal, "siginterrupt"):
            # gunicorn keeps SIGTERM from interrupting system calls of running requests;
            # setting a handler resets that, so it is set again.
            signal.siginterrupt(signal.SIGTERM, False)

    return init_signals


def watch_for_missed_signals() -> None:
    """In a multiprocessing child, make sure a SIGTERM or SIGINT reaches the handler.

    CPython runs a Python signal handler only when the main thread returns to Python code. A
    pool worker waits for its next task in a C call that a signal interrupts only once it is
    waiting: a signal arriving just before (``Pool.terminate()`` right after the last task) is
    taken but its handler never runs, and the worker, and the parent joining it, wait forever.
    The signal module writes each signal's number to a wakeup file descriptor; a thread
    watching it sends the signal again to the main thread (now waiting, so interrupted) until
    the handler ran, a few times at most. Nothing is done when the wakeup descriptor is
    someone else's (an event loop's)."""
    global _wakeup_fd
    if not _enabled or _wakeup_fd != -1 or not hasattr(signal, "pthread_kill"):
        return
    if threading.current_thread() is not threading.main_thread():
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    except (ValueError, OSError):
        previous = None
    if previous != -1:
        if previous is not None:
            signal.set_wakeup_fd(previous)
        _close(read_end)
        _close(write_end)
        return
    _wakeup_fd = write_end
    main = threading.main_thread().ident
    _threads.Thread(lambda: _resend_missed(read_end, main), "recalltrace-signals").start()


def _resend_missed(read_end: int, main: int | None) -> None:
    keep_off_this_thread()
    for received in _received(read_end):
        stopping = [signum for signum in received if signum in HANDLED]
        if not stopping or _handling.is_set():
            continue
        signum = stopping[0]
        for _ in range(_RESENDS):
            if _handling.wait(1.0) or signal.getsignal(signum) is not _handle or main is None:
                break
            signal.pthread_kill(main, signum)
