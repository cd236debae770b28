"""Guarding the caller against the tracer's own failures.

A failure inside the tracer is logged once per place and swallowed, so the decorated function
behaves as if it were not decorated. While pytest runs (``PYTEST_CURRENT_TEST`` is set) a failure
of the tracer's own code is raised instead, so that bugs surface in tests; set
``RECALLTRACE_RAISE_INTERNAL_ERRORS=0`` to turn that off. Failures of user-supplied code
(extractors, scrubbing callbacks) and of storage are never raised.
"""

from __future__ import annotations

import logging
import os
import threading

logger = logging.getLogger("recalltrace.tracer")

_logged: set[str] = set()
_logged_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _logged_lock
    _logged_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


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
