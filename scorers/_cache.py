"""What spares the judge a call: answers kept in memory, and answers kept in the database.

:class:`ReferenceCache` keeps judge work that depends only on the reference (its claims or its
entities) in memory. A golden reference is usually seen on many traces; splitting the work so
that the reference's part is asked once per (text, model, prompt version) pays for it once.
Concurrent requests for the same key share one judge call.

:class:`JudgeCallScope` keeps every judge answer of one job in a durable store (the worker's
database) before it is used, keyed by the request (:func:`request_key`), so the same job taken
again after its worker was killed reads the answers instead of paying for the calls again. The
worker sets it around each job with :func:`judge_call_scope`; the judge client consults it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

logger = logging.getLogger(__name__)

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


# ---------------------------------------------------------------------------------------------
# answers kept in the database, per job

#: Request parameters that do not change the answer: how long to wait, how to authenticate,
#: who retries. Everything else of ``litellm.acompletion``'s keywords is part of the key.
_NOT_IN_KEY = frozenset({"timeout", "api_key", "max_retries", "num_retries", "drop_params"})


def request_key(params: Mapping[str, Any]) -> str:
    """A SHA-256 over what decides a judge request's answer: the model, the exact messages
    (the prompt and its version are in them), the answer format and the sampling parameters
    (temperature, seed, token cap, extra parameters, the server)."""
    kept = {k: v for k, v in params.items() if k not in _NOT_IN_KEY}
    text = json.dumps(kept, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class AnswerStore(Protocol):
    """Where a :class:`JudgeCallScope` keeps answers (the worker's database)."""

    async def find(self, key: str) -> tuple[str, dict[str, Any]] | None:
        """The scope that paid for ``key`` and its answer, or ``None``."""
        ...

    async def keep(self, key: str, scope: str, answer: dict[str, Any]) -> None:
        """Store ``answer`` under ``key`` for ``scope`` unless ``key`` is stored already."""
        ...


@dataclass
class JudgeCallScope:
    """The judge calls of one job, kept in ``store`` under ``scope`` (the job that pays).

    A request asked several times in one job (``samples`` > 1 asks the same messages again on
    purpose) gets one key per occurrence, so each sample keeps its own answer.
    """

    store: AnswerStore
    scope: str
    _seen: dict[str, int] = field(default_factory=dict)
    stored: int = 0
    """Answers this scope stored."""
    replayed: int = 0
    """Answers read back instead of calling the judge."""
    store_errors: int = 0
    """Reads or writes of the store that failed (the judge was called, or the answer used
    without being kept)."""

    def key_for(self, params: Mapping[str, Any]) -> str:
        """The key of the next occurrence of this request in this scope.

        The scope is part of the key: a job reads back only the answers it paid for, never
        another job's answer to the same request (two traces judged alike stay two judgments;
        the table survives crashes, it is not a cache shared between jobs)."""
        base = request_key(params)
        occurrence = self._seen.get(base, 0)
        self._seen[base] = occurrence + 1
        return hashlib.sha256(f"{self.scope}\x00{base}\x00{occurrence}".encode()).hexdigest()

    async def recall(self, key: str) -> tuple[bool, dict[str, Any]] | None:
        """The stored answer of ``key`` and whether this scope paid for it, or ``None`` (not
        stored, or the store failed: the judge is called)."""
        try:
            found = await self.store.find(key)
        except Exception as exc:
            self.store_errors += 1
            logger.warning("reading a stored judge answer failed (%s); calling the judge", exc)
            return None
        if found is None or not isinstance(found[1].get("content"), str):
            return None  # nothing stored, or not an answer this client stored: ask the judge
        self.replayed += 1
        paid_by, answer = found
        return paid_by == self.scope, answer

    async def remember(self, key: str, answer: dict[str, Any]) -> None:
        """Store ``answer`` before it is used; a failed write is logged, not raised (the
        answer is still good, it only would not survive a crash)."""
        try:
            await self.store.keep(key, self.scope, answer)
        except Exception as exc:
            self.store_errors += 1
            logger.warning("storing a judge answer failed (%s); using it unstored", exc)
            return
        self.stored += 1


_SCOPE: ContextVar[JudgeCallScope | None] = ContextVar("recalltrace_judge_scope", default=None)


def current_judge_scope() -> JudgeCallScope | None:
    """The scope the running task's judge calls are kept in, if any."""
    return _SCOPE.get()


@contextlib.contextmanager
def judge_call_scope(scope: JudgeCallScope) -> Iterator[JudgeCallScope]:
    """Keep the judge calls made in this context (and the tasks it starts) in ``scope``."""
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)
