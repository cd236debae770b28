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

Set ``handle_signals=False`` (``RECALLTRACE_HANDLE_SIGNALS=0``) to leave signals alone; then
call ``recalltrace.shutdown()`` from the framework's own hook (FastAPI's lifespan, gunicorn's
``worker_exit``).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

logger = logging.getLogger("recalltrace.tracer")

HANDLED = (signal.SIGTERM, signal.SIGINT)

_previous: dict[int, Any] = {}
_drain: Callable[[str, bool], None] | None = None
_eager: Callable[[], None] | None = None
_watching = False


def install(drain: Callable[[str, bool], None], eager: Callable[[], None]) -> bool:
    """Put the draining handler in front of SIGTERM's and SIGINT's current handlers.

    ``drain(why, final)`` empties the queue (``final``: the process is about to end); ``eager()``
    makes the writer write records as soon as they are queued. Returns False when signals
    cannot be handled here (not the main thread). Installing again keeps the handlers already
    chained to and only refreshes the callbacks.
    """
    global _drain, _eager
    _drain, _eager = drain, eager
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


def uninstall() -> None:
    """Give each signal back the handler it had before :func:`install`, if ours is still set."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum, previous in list(_previous.items()):
        if signal.getsignal(signum) is _handle:
            signal.signal(signum, previous)
        del _previous[signum]


def _handle(signum: int, frame: FrameType | None) -> None:
    previous = _previous.get(signum, signal.SIG_DFL)
    name = signal.Signals(signum).name
    if previous is signal.SIG_IGN:
        return
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
    import os

    endings = (*_ENDINGS, os.kill, os._exit, os.abort)

    def watch(frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call" and any(arg is ending for ending in endings):
            sys.setprofile(None)
            _run_drain("the process is ending after a signal", final=True)

    _watching = True
    sys.setprofile(watch)
