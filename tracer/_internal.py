"""Guarding the caller against the tracer's own failures.

A failure inside the tracer is logged once per place and swallowed, so the decorated function
behaves as if it were not decorated. While pytest runs (``PYTEST_CURRENT_TEST`` is set) a failure
of the tracer's own code is raised instead, so that bugs surface in tests; set
``RECALLTRACE_RAISE_INTERNAL_ERRORS=0`` to turn that off. Failures of user-supplied code
(extractors, scrubbing callbacks) and of storage are never raised.

It also keeps the tracer's state to the process it belongs to: a process copied by ``fork``
makes the state its own (:func:`own_process`), with or without Python's at-fork hooks.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from recalltrace.tracer import _threads

logger = logging.getLogger("recalltrace.tracer")

_logged: set[str] = set()
_logged_lock = _threads.Lock()

# The steps that make a copied process its own, lowest first: the runtime's own lock and counts,
# then the writers' queues and threads, then span capture, then what makes the child's exit
# drain its queue. Modules add their step on import. They run when the tracer finds itself in a
# process other than the one its state was made in: at once through Python's fork hook, and
# otherwise at the next request, flush or configure (see :func:`own_process`), which is what a
# process forked from C (uWSGI's workers) or by a library that skips the hooks gets.
FORK_RUNTIME = 20
FORK_WRITERS = 30
FORK_CAPTURE = 40
FORK_EXIT = 50

_fork_steps: list[tuple[int, Callable[[], None]]] = []


def at_fork_in_child(order: int, step: Callable[[], None]) -> None:
    """Run ``step`` in every forked child, at its place ``order`` (once, however often added)."""
    if any(existing is step for _, existing in _fork_steps):
        return
    _fork_steps.append((order, step))
    _fork_steps.sort(key=lambda item: item[0])


_pid = os.getpid()
"""The process the tracer's state belongs to."""
# One lock per process that adopts the state, made without taking any lock the parent may have
# held (``dict.setdefault`` is one step under the GIL).
_adopting: dict[int, Any] = {}


def own_process() -> None:
    """Make the tracer's state this process's own if it was copied from another process.

    Called where a request starts, where span capture sees a span, and by ``flush``,
    ``shutdown`` and ``configure``: one system call (``getpid``). Invariant: no queue, thread,
    lock, count or connection of another process is used here, however this process was made.
    """
    pid = os.getpid()
    if pid != _pid:
        _adopt(pid)


def _adopt(pid: int) -> None:
    lock = _adopting.setdefault(pid, _threads.Lock())
    with lock:
        if _pid != pid:
            _after_fork_in_child()


def _after_fork_in_child() -> None:
    # A lock held by one of the parent's threads at the moment of the fork would never be
    # released here. The process is marked as adopted only once every step ran: a thread that
    # comes meanwhile waits for the adopting one (see _adopt).
    global _logged_lock, _pid
    _logged_lock = _threads.Lock()
    for _, step in list(_fork_steps):
        try:
            step()
        except Exception:
            if _first_time("fork"):
                logger.exception(
                    "recalltrace: resetting the tracer in a forked child failed (logged once)"
                )
    _pid = os.getpid()


# What a process does just before Python's os.fork() copies it (not before a fork from C):
# registered by the modules that do it, on import.
_before_fork_steps: list[Callable[[], None]] = []


def before_fork(step: Callable[[], None]) -> None:
    """Run ``step`` in the parent just before every ``os.fork()`` (once, however often added)."""
    if not any(existing is step for existing in _before_fork_steps):
        _before_fork_steps.append(step)


def _before_fork() -> None:
    for step in list(_before_fork_steps):
        try:
            step()
        except Exception:
            if _first_time("before fork"):
                logger.exception("recalltrace: preparing a fork failed (logged once)")


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


# What else follows a new tracer configuration (span capture attaches itself to the provider
# the runtime uses): registered by the modules that do it, on import, and run by ``configure``
# with the new runtime, so the runtime needs no import of them.
_configure_steps: list[Callable[[Any], None]] = []


def on_configure(step: Callable[[Any], None]) -> None:
    """Run ``step(runtime)`` after every ``configure`` (once, however often added)."""
    if not any(existing is step for existing in _configure_steps):
        _configure_steps.append(step)


def configured(runtime: Any) -> None:
    """Run the steps added with :func:`on_configure` for the new ``runtime``."""
    for step in list(_configure_steps):
        step(runtime)


def _first_time(where: str) -> bool:
    with _logged_lock:
        if where in _logged:
            return False
        _logged.add(where)
        return True


def _raise_in_tests() -> bool:
    if os.environ.get("RECALLTRACE_RAISE_INTERNAL_ERRORS", "") == "0":
        return False
    return "PYTEST_CURRENT_TEST" in os.environ


def internal_error(where: str) -> None:
    """Call from an ``except`` block around tracer code: log once, re-raise under pytest."""
    if _raise_in_tests():
        raise
    if _first_time(where):
        logger.exception("recalltrace: internal error in %s (logged once; continuing)", where)


def user_code_error(where: str) -> None:
    """Call from an ``except`` block around user-supplied code or user data: log once."""
    if _first_time(where):
        logger.exception("recalltrace: %s raised (logged once; the value is not captured)", where)


# Work handed to the writer thread by other parts of the tracer (span capture finds the
# requests in finished spans there): each hook runs at the start of every writer cycle and of
# every flush, in the thread running it, so what it offers is queued before a flush counts.
_cycle_hooks: list[Callable[[], None]] = []


def add_cycle_hook(hook: Callable[[], None]) -> None:
    """Run ``hook`` at the start of every writer cycle and flush (once, however often added)."""
    if hook not in _cycle_hooks:
        _cycle_hooks.append(hook)


def run_cycle_hooks() -> None:
    """Run every hook added with :func:`add_cycle_hook` (each failure logged)."""
    for hook in list(_cycle_hooks):
        try:
            hook()
        except Exception:
            logger.exception("recalltrace writer: handing over finished work failed")
