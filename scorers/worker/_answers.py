"""The worker's judge answers kept in its database: each job's calls are stored before they are
used, read back when the job is taken again after a crash, and forgotten once the job's result
is stored (or a failed result sends it round again); rows nobody forgot go after a week."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import timedelta
from typing import Any

from recalltrace.scorers._cache import JudgeCallScope
from recalltrace.scorers.worker._presence import describe
from recalltrace.storage.contracts import ClaimedJob
from recalltrace.storage.judge_calls import DEFAULT_RETENTION, JudgeCallStore

logger = logging.getLogger("recalltrace.scorers.worker")

DbCall = Callable[..., Awaitable[Any]]

PURGE_EVERY_S = 3600.0
"""How often a worker deletes the stored answers older than the retention."""


def scope_of(job: ClaimedJob) -> str:
    """Who pays for a job's judge calls: the job, named so a reused id is another scope."""
    return f"job:{job.id}:{job.metric}:{job.version}:{job.trace_id}"[:200]


class StoredAnswers:
    """A :class:`~recalltrace.scorers._cache.AnswerStore` over ``judge_calls``, reached
    through the worker's database threads."""

    def __init__(
        self, store: JudgeCallStore, db_call: DbCall, retention: timedelta = DEFAULT_RETENTION
    ) -> None:
        self._store = store
        self._db_call = db_call
        self.retention = retention
        self._purged_at: float | None = None
        self.replayed = 0
        """Answers read back instead of calling the judge, over the worker's run."""

    async def find(self, key: str) -> tuple[str, dict[str, Any]] | None:
        found = await self._db_call(self._store.find, key)
        return None if found is None else (found.scope, found.answer)

    async def keep(self, key: str, scope: str, answer: dict[str, Any]) -> None:
        await self._db_call(self._store.keep, key, scope, answer)

    def scope(self, job: ClaimedJob) -> JudgeCallScope:
        """The scope one run of ``job`` keeps its judge calls in."""
        return JudgeCallScope(self, scope_of(job))

    async def forget(self, jobs: Iterable[ClaimedJob]) -> None:
        """Delete the stored answers of ``jobs`` (their result is stored, or they go round
        again after a failed result); a failure is logged, the retention deletes them later."""
        scopes = [scope_of(job) for job in jobs]
        if not scopes:
            return
        try:
            await self._db_call(self._store.forget, scopes)
        except Exception as exc:
            logger.warning("forgetting stored judge answers failed (%s)", describe(exc))

    async def purge_when_due(self) -> None:
        """Delete answers older than the retention, at most every :data:`PURGE_EVERY_S`."""
        now = time.monotonic()
        if self._purged_at is not None and now - self._purged_at < PURGE_EVERY_S:
            return
        self._purged_at = now
        try:
            removed = await self._db_call(self._store.purge, self.retention)
        except Exception as exc:
            logger.warning("deleting old stored judge answers failed (%s)", describe(exc))
            return
        if removed:
            logger.info("deleted %d stored judge answers older than %s", removed, self.retention)
