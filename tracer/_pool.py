"""Pools: a deeper or other retrieval run for sampled requests, off the request path.

``@retrieval(pool=fn)`` gives a retriever a pool: ``fn`` takes the retriever's own arguments
and returns documents in any shape the retriever may return (the same search with a larger
``k``, a BM25 search beside a vector one, a hybrid). After the decorated retriever returns in a
sampled request, the call's arguments are queued for the retriever's :class:`PoolRunner`
(a generator retriever queues them when it is called); nothing else happens on the request
path. The runner's own operating-system threads call ``fn`` and hand the documents to the
writer thread as a late update of the request's record (as ``set_reference`` does), so they are
scrubbed and stored with the trace. ``pooled_context_recall`` scores against them.

The runner is bounded: ``pool_queue_size`` calls wait at most (a call that finds the queue
full is dropped and counted), ``pool_concurrency`` threads run them, ``pool_share`` of the
sampled requests get a pool. A pool that raises, or returns nothing readable, is counted and
logged once; the request never sees it. Pools still queued when the process ends are not run.
Every outcome is counted in :class:`~._metrics.TracerStats` (``ledger().pool``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import os
import random
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from recalltrace.tracer import _threads
from recalltrace.tracer._extract import read_documents, to_text

logger = logging.getLogger("recalltrace.tracer")

MAX_POOL_DOCUMENTS = 200
"""Documents of one pool kept (the first ones, in the pool's order)."""

#: The counters of ``ledger().pool``.
POOL_COUNTERS = (
    "queued",
    "calls",
    "failed",
    "timed_out",
    "empty",
    "dropped_queue_full",
    "skipped_share",
)

_runners: list[PoolRunner] = []
_runners_lock = _threads.Lock()


def check_pool_options(
    pool: Any, share: Any, concurrency: Any, queue_size: Any, timeout: Any = None
) -> None:
    """Refuse bad ``@retrieval`` pool options at decoration time, in one line each."""
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0
    ):
        raise ValueError(f"pool_timeout must be a positive number of seconds, got {timeout!r}")
    if not callable(pool):
        raise TypeError(f"pool must be a callable taking the retriever's arguments, not {pool!r}")
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
        raise ValueError(f"pool_share must be a number from 0 to 1, got {share!r}")
    for name, value in (("pool_concurrency", concurrency), ("pool_queue_size", queue_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


class PoolRunner:
    """The queue and threads of one pooled retriever (see the module)."""

    def __init__(
        self,
        pool: Callable[..., Any],
        name: str,
        *,
        share: float = 1.0,
        concurrency: int = 1,
        queue_size: int = 64,
        timeout: float | None = 30.0,
        extractor: Callable[[Any], Any] | None = None,
    ) -> None:
        check_pool_options(pool, share, concurrency, queue_size, timeout)
        self.timeout = timeout
        self.pool = pool
        self.name = name
        self.share = float(share)
        self.concurrency = concurrency
        self.queue_size = queue_size
        self.extractor = extractor
        self._lock = _threads.Lock()
        self._ready = _threads.Condition(self._lock)  # threads wait here for calls
        self._idle = _threads.Condition(self._lock)  # wait_idle waits here
        self._queue: deque[tuple[Any, tuple[Any, ...], dict[str, Any]]] = deque()
        self._threads: list[_threads.Thread] = []
        self._busy = 0
        self._pid = os.getpid()
        self._said_full = False
        self._said_failed = False
        self._said_late = False
        self._random = random.Random()
        with _runners_lock:
            _runners.append(self)

    # -- the request path ------------------------------------------------------------------
    def submit(self, state: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        """Queue a pool call for ``state``'s request (a sampled one); never raises, never
        waits for more than a lock."""
        try:
            self._submit(state, args, dict(kwargs))
        except Exception:
            # The request must not see the pool's machinery fail; say it once.
            from recalltrace.tracer._internal import user_code_error

            user_code_error(f"queueing the pool of {self.name}")

    def _submit(self, state: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        stats = _stats()
        if self.share < 1.0 and self._random.random() >= self.share:
            stats.pool_count("skipped_share")
            return
        with self._lock:
            if self._pid != os.getpid():
                self._after_fork()
            if len(self._queue) >= self.queue_size:
                full = True
            else:
                full = False
                self._queue.append((state, args, kwargs))
                self._start_threads()
                self._ready.notify()
            say = full and not self._said_full
            if say:
                self._said_full = True
        if full:
            stats.pool_count("dropped_queue_full")
            if say:
                logger.warning(
                    "recalltrace: the pool of %s is behind (%d calls waiting); further pool "
                    "calls are dropped while it is full (said once; counted in "
                    "ledger().pool['dropped_queue_full']). Raise pool_concurrency or "
                    "pool_queue_size, or lower pool_share",
                    self.name,
                    self.queue_size,
                )
            return
        stats.pool_count("queued")

    def _after_fork(self) -> None:
        """In a forked child: the parent's threads and queue are not this process's."""
        self._pid = os.getpid()
        self._queue.clear()
        self._threads = []
        self._busy = 0

    def _start_threads(self) -> None:
        alive = [t for t in self._threads if t.is_alive()]
        self._threads = alive
        if len(alive) < self.concurrency and len(alive) <= self._busy:
            thread = _threads.Thread(self._run, name=f"recalltrace-pool-{self.name}")
            self._threads.append(thread)
            thread.start()

    # -- the pool's threads ------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue:
                    if not self._ready.wait(60.0) and not self._queue:
                        me = [t for t in self._threads if t.is_current()]
                        for thread in me:
                            self._threads.remove(thread)
                        return  # idle for a minute: the next call starts a thread again
                state, args, kwargs = self._queue.popleft()
                self._busy += 1
            try:
                self._call(state, args, kwargs)
            finally:
                with self._lock:
                    self._busy -= 1
                    if not self._queue and self._busy == 0:
                        self._idle.notify_all()

    def _call(self, state: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        stats = _stats()
        started = time.perf_counter()
        try:
            result = self.pool(*args, **kwargs)
            if inspect.isawaitable(result):
                result = asyncio.run(_awaited(result))
            if self.extractor is not None:
                result = list(self.extractor(result))
            documents = pool_documents(result)
        except Exception as exc:
            stats.pool_count("calls")
            stats.pool_count("failed")
            stats.pool_seconds(time.perf_counter() - started)
            if not self._said_failed:
                self._said_failed = True
                logger.warning(
                    "recalltrace: the pool of %s raised %s: %s (said once; the request was not "
                    "affected; counted in ledger().pool['failed'])",
                    self.name,
                    type(exc).__name__,
                    exc,
                )
            return
        took = time.perf_counter() - started
        stats.pool_count("calls")
        stats.pool_seconds(took)
        if self.timeout is not None and took > self.timeout:
            # A thread cannot be stopped: a pool past its time is let finish, and its late
            # documents are not stored (the request's record has long been written).
            stats.pool_count("timed_out")
            if not self._said_late:
                self._said_late = True
                logger.warning(
                    "recalltrace: the pool of %s took %.1f s, more than pool_timeout (%g s); its "
                    "documents are not stored (said once; counted in ledger().pool['timed_out'])",
                    self.name,
                    took,
                    self.timeout,
                )
            return
        if not documents:
            stats.pool_count("empty")  # nothing to judge against: no pool is stored
            return
        deliver(state, documents, self.name)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until nothing is queued or running (at most ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(min(left, 0.05))
        return True


async def _awaited(value: Any) -> Any:
    return await value


def pool_documents(result: Any) -> list[Any]:
    """A pool's return value as ``ContextRecord`` values (text, id, score), the first
    :data:`MAX_POOL_DOCUMENTS`; documents without text are left out."""
    from recalltrace.storage.records import ContextRecord

    documents = []
    for doc in read_documents(result):
        text = to_text(doc.content) if not isinstance(doc.content, str) else doc.content
        if not text or not text.strip():
            continue
        score: float | None = None
        if isinstance(doc.score, (int, float)) and not isinstance(doc.score, bool):
            score = float(doc.score) if math.isfinite(doc.score) else None
        documents.append(
            ContextRecord(
                content=text,
                id=None if doc.id is None else str(doc.id),
                score=None if score is None else float(score),
            )
        )
        if len(documents) >= MAX_POOL_DOCUMENTS:
            break
    return documents


def deliver(state: Any, documents: list[Any], source: str) -> None:
    """Hand a pool to the writer as a late update of ``state``'s record (merged while the
    record is in memory, attached to the stored trace otherwise)."""
    from recalltrace.storage.records import ReferenceUpdate
    from recalltrace.tracer import _runtime

    runtime = _runtime.current
    if runtime is None:
        return
    limit = getattr(runtime.config, "max_text_length", None)
    if limit is not None:
        for doc in documents:
            doc.content = doc.content[:limit]
    update = ReferenceUpdate(trace_id=state.hex_id(), pool_contexts=documents, pool_source=source)
    runtime.writer.merge_reference(update, state)


def wait_for_pools(timeout: float = 30.0) -> bool:
    """Wait until every pool of this process has run what was queued (at most ``timeout``
    seconds); ``False`` when time ran out. Call ``flush()`` after it to store what they
    returned."""
    deadline = time.monotonic() + timeout
    with _runners_lock:
        runners = list(_runners)
    return all(runner.wait_idle(max(deadline - time.monotonic(), 0.0)) for runner in runners)


def _stats() -> Any:
    from recalltrace.tracer import _runtime

    return _runtime.stats()


def _queue_for_request(runner: PoolRunner, args: tuple[Any, ...], kwargs: Any) -> None:
    """Queue a pool call when the current request is sampled (else nothing)."""
    from recalltrace.tracer import _runtime

    state = _runtime.current_state()
    if state is not None and state.sampled and not state.closed:
        runner.submit(state, args, kwargs)


def with_pool(traced: Any, fn: Any, runner: PoolRunner) -> Any:
    """``traced`` (the decorated retriever ``fn``) queueing ``runner``'s pool after each call
    of a sampled request: after it returns (a function or coroutine function, even when it
    raised) or when it is called (a generator function)."""
    import functools

    if isinstance(traced, (staticmethod, classmethod)):
        return type(traced)(with_pool(traced.__func__, fn.__func__, runner))
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):

        @functools.wraps(traced)
        def at_call(*args: Any, **kwargs: Any) -> Any:
            _queue_for_request(runner, args, kwargs)
            return traced(*args, **kwargs)

        return at_call
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(traced)
        async def after_await(*args: Any, **kwargs: Any) -> Any:
            try:
                return await traced(*args, **kwargs)
            finally:
                _queue_for_request(runner, args, kwargs)

        return after_await

    @functools.wraps(traced)
    def after_return(*args: Any, **kwargs: Any) -> Any:
        try:
            return traced(*args, **kwargs)
        finally:
            _queue_for_request(runner, args, kwargs)

    return after_return
