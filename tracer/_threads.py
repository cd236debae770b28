"""Operating-system threads and locks for the tracer's own work, whatever patches ``threading``.

gevent and eventlet replace the standard library's locks and thread start with cooperative
versions when they patch it, and a server may patch only after the tracer made its locks (a
gunicorn ``--preload`` master configures the tracer; gevent patches each worker after the fork).
Mixed, the two hang a process: a greenlet waiting on a lock made before the patch blocks the
whole operating-system thread, and with it the greenlet that holds the lock.

So the tracer never uses the patched names. Its writer, readers and helpers are operating-system
threads, and its locks, conditions, events and thread-local counts are the operating system's:
the originals a green-thread library saved when it patched (``gevent.monkey.get_original``,
``eventlet.patcher.original``), else ``_thread`` as it was when this module was imported. A
greenlet takes these locks only around work that never switches to another greenlet (no I/O,
no wait), so it cannot hold one across a switch; a wait (``flush()``) blocks its operating-system
thread until the writer, which runs beside it, has done what is waited for.

A thread started here knows the process that started it: in a process copied by ``fork`` (with
or without Python's at-fork hooks, which a server forking from C never runs) it is not alive.
"""

from __future__ import annotations

import _thread
import importlib
import os
import sys
from collections import deque
from collections.abc import Callable
from typing import Any

_NAMES = ("allocate_lock", "start_new_thread", "get_ident", "RLock", "_local")
# What this module found when it was imported: the originals, unless a library patched first.
_IMPORTED = tuple(getattr(_thread, name) for name in _NAMES)


def _originals() -> tuple[Any, ...]:
    """``_thread``'s functions as the operating system provides them."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None:
        try:
            found = tuple(monkey.get_original("_thread", name) for name in _NAMES)
        except Exception:
            found = ()
        if len(found) == len(_NAMES):
            return found
    patcher = sys.modules.get("eventlet.patcher")
    if patcher is not None:
        try:
            original = patcher.original("_thread")
            return tuple(getattr(original, name) for name in _NAMES)
        except Exception:
            return _IMPORTED
    return _IMPORTED


_allocate_lock, _start_new_thread, get_ident, _RLock, _Local = _originals()


def refresh() -> None:
    """Look for the originals again (a green-thread library was imported after this module,
    having patched before: its saved originals are the real ones)."""
    global _allocate_lock, _start_new_thread, get_ident, _RLock, _Local
    _allocate_lock, _start_new_thread, get_ident, _RLock, _Local = _originals()


def original(module: str, name: str) -> Any:
    """``module.name`` as the standard library has it, not a green-thread library's version
    (``time.sleep``, ``select.select``, ``subprocess.Popen`` used on the tracer's own threads)."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None:
        try:
            return monkey.get_original(module, name)
        except Exception:
            pass  # gevent never patched it: the standard library's, below, is the original
    patcher = sys.modules.get("eventlet.patcher")
    if patcher is not None:
        try:
            return getattr(patcher.original(module), name)
        except Exception:
            pass  # eventlet has no original of it: the standard library's, below, is the one
    return getattr(importlib.import_module(module), name)


def Lock() -> Any:
    """A new operating-system lock."""
    return _allocate_lock()


def RLock() -> Any:
    """A new operating-system re-entrant lock."""
    return _RLock()


def local() -> Any:
    """Storage local to each operating-system thread (not to each greenlet)."""
    return _Local()


class Condition:
    """A condition variable over a :func:`Lock` (not re-entrant), like ``threading.Condition``."""

    __slots__ = ("_lock", "_waiters")

    def __init__(self, lock: Any) -> None:
        self._lock = lock
        self._waiters: deque[Any] = deque()

    def __enter__(self) -> bool:
        return bool(self._lock.acquire())

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        """Release the lock, wait for a notification (at most ``timeout`` seconds), take the
        lock again; True when notified."""
        waiter = _allocate_lock()
        waiter.acquire()
        self._waiters.append(waiter)
        self._lock.release()
        notified = False
        try:
            notified = bool(waiter.acquire(True, -1 if timeout is None else max(timeout, 0.0)))
        finally:
            self._lock.acquire()
            if not notified:
                try:
                    self._waiters.remove(waiter)
                except ValueError:
                    notified = True  # notified between the timeout and taking the lock
        return notified

    def notify(self) -> None:
        """Wake one waiter (the caller holds the lock)."""
        if self._waiters:
            self._waiters.popleft().release()

    def notify_all(self) -> None:
        """Wake every waiter (the caller holds the lock)."""
        waiters, self._waiters = self._waiters, deque()
        for waiter in waiters:
            waiter.release()


class Event:
    """A flag threads wait for, like ``threading.Event``."""

    __slots__ = ("_condition", "_flag")

    def __init__(self) -> None:
        self._condition = Condition(_allocate_lock())
        self._flag = False

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        with self._condition:
            self._flag = True
            self._condition.notify_all()

    def clear(self) -> None:
        with self._condition:
            self._flag = False

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the flag is set, at most ``timeout`` seconds; returns the flag."""
        with self._condition:
            if not self._flag:
                self._condition.wait(timeout)
            return self._flag


class Thread:
    """An operating-system thread running ``target`` (never joined at interpreter exit)."""

    __slots__ = ("_done", "_pid", "_target", "ident", "name")

    def __init__(self, target: Callable[[], object], name: str) -> None:
        self._target = target
        self.name = name
        self.ident: int | None = None
        self._done: Any = None
        self._pid = 0

    def start(self) -> None:
        """Start the thread; ``RuntimeError`` when none can start (the interpreter is ending)."""
        done = _allocate_lock()
        done.acquire()
        self._done = done
        self._pid = os.getpid()
        _start_new_thread(self._run, ())

    def _run(self) -> None:
        self.ident = get_ident()
        try:
            self._target()
        finally:
            self._done.release()

    def is_alive(self) -> bool:
        """Started in this process and not finished (a copy made by ``fork`` is not alive)."""
        done = self._done
        return done is not None and self._pid == os.getpid() and done.locked()

    def is_current(self) -> bool:
        """Whether the calling code runs on this thread."""
        return self.ident is not None and self.ident == get_ident() and self.is_alive()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread to finish, at most ``timeout`` seconds; True when it did."""
        if not self.is_alive():
            return True
        done = self._done
        if done.acquire(True, -1 if timeout is None else max(timeout, 0.0)):
            done.release()
            return True
        return False
