"""Tests that hold on a loaded machine: a clock the test moves by hand, and waits that only
turn a hang into a failure.

No test asserts how long something took (speed is measured by the scripts in ``benchmarks/``).
Where the product waits on a clock, the test gives it a :class:`ManualClock` and moves it; where
something must happen "eventually", the test waits for it at most :data:`HANG_GUARD_S`, which
is not a bound on speed: on the slowest host it is reached only when the thing never happens.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

HANG_GUARD_S = 60.0
"""How long a test waits for what must happen before calling it a hang (never a speed bound)."""


class ManualClock:
    """A monotonic clock, in seconds, that moves only when :meth:`advance` is called."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start

    def __call__(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward."""
        self._now += seconds


class VirtualTime(ManualClock):
    """A clock that moves only when something waits on it: :meth:`sleep` moves it the whole
    wait at once (and lets the event loop run), so a wait costs no real time and its length is
    known exactly (:attr:`waits`)."""

    def __init__(self, start: float = 1000.0) -> None:
        super().__init__(start)
        self.waits: list[float] = []
        """Every wait asked for, in seconds, in order."""

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` on this clock."""
        self.waits.append(seconds)
        # A real wait always takes a little time; without it, a wait of a rounding error
        # would be followed by the same wait again, for ever.
        self.advance(max(seconds, 1e-6))
        await asyncio.sleep(0)


def wait_until(condition: Callable[[], object], what: str, guard_s: float = HANG_GUARD_S) -> None:
    """Return once ``condition()`` is true; fail, saying ``what`` never happened, when it is
    still false after ``guard_s`` seconds (a hang, not slowness)."""
    deadline = time.monotonic() + guard_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {guard_s:g} s (it hangs)")
        time.sleep(0.005)


def finishes(call: Callable[[], T], what: str, guard_s: float = HANG_GUARD_S) -> T:
    """``call()``'s result, run on a daemon thread; fail when it has not returned after
    ``guard_s`` seconds (it hangs, or waits for something that never comes)."""
    done = threading.Event()
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:
            error.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="test-finishes", daemon=True).start()
    if not done.wait(guard_s):
        raise AssertionError(f"{what}: still waiting after {guard_s:g} s (it hangs)")
    if error:
        raise error[0]
    return result[0]
