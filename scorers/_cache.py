"""A cache for judge work that depends only on the reference (its claims or its entities).

A golden reference is usually seen on many traces; splitting the work so that the reference's
part is asked once per (text, model, prompt version) pays for it once. Concurrent requests for
the same key share one judge call.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


def cache_key(kind: str, model: str, prompt_version: str, text: str) -> str:
    """A stable key: a SHA-256 over the task, the model, the prompt version and the text."""
    digest = hashlib.sha256()
    for part in (kind, model, prompt_version, text):
        digest.update(part.encode("utf-8"))
        digest.update(b"\x00")
    return digest.hexdigest()


class ReferenceCache:
    """An in-memory LRU of reference-only judge results, shared by the scorers of a process."""

    def __init__(self, max_entries: int = 10_000) -> None:
        """Keep at most ``max_entries`` results, dropping the least recently used."""
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._data: OrderedDict[str, Any] = OrderedDict()
        self._in_flight: dict[str, asyncio.Future[Any]] = {}
        self.hits = 0
        """Lookups answered from the cache (including waits on an identical call in flight)."""
        self.misses = 0
        """Lookups that called the judge."""

    def __len__(self) -> int:
        return len(self._data)

    def clear(self) -> None:
        """Drop every entry and reset the counters."""
        self._data.clear()
        self.hits = self.misses = 0

    def peek(self, key: str) -> Any | None:
        """The cached value of ``key`` without computing it, or ``None``."""
        return self._data.get(key)

    async def get_or_compute(self, key: str, compute: Callable[[], Awaitable[T]]) -> tuple[T, bool]:
        """Return ``(value, was_cached)``; ``compute`` runs only on a miss.

        A failing ``compute`` caches nothing and raises to every caller waiting on it.
        """
        if key in self._data:
            self._data.move_to_end(key)
            self.hits += 1
            return self._data[key], True
        loop = asyncio.get_running_loop()
        pending = self._in_flight.get(key)
        if pending is not None and pending.get_loop() is loop:
            try:
                value = await asyncio.shield(pending)
            except asyncio.CancelledError:
                if not pending.cancelled():
                    raise  # this caller was cancelled
                # The caller that owned the computation was cancelled: compute it here.
            else:
                self.hits += 1
                return value, True
        self.misses += 1
        future: asyncio.Future[Any] = loop.create_future()
        self._in_flight[key] = future
        try:
            value = await compute()
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # mark it retrieved: nobody may be waiting
            raise
        else:
            future.set_result(value)
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)
            return value, False
        finally:
            if self._in_flight.get(key) is future:
                del self._in_flight[key]


#: The cache the scorers use unless given another one.
DEFAULT_CACHE = ReferenceCache()
