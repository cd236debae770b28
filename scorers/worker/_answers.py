"""The worker's judge answers kept in its database: each job's calls are stored before they are
used, read back when the job is taken again after a crash, and forgotten once the job's result
is stored (or a failed result sends it round again); rows nobody forgot go after a week."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import timedelta
from typing import Any, Protocol, runtime_checkable

from recalltrace.scorers._cache import JudgeCallScope
from recalltrace.scorers.worker._presence import describe
from recalltrace.storage.contracts import ClaimedJob

logger = logging.getLogger("recalltrace.scorers.worker")

DbCall = Callable[..., Awaitable[Any]]

RETENTION = timedelta(days=7)
"""How long an answer whose job never had its result stored is kept (a job cancelled or its
trace deleted meanwhile, a worker killed between storing a result and forgetting)."""


@runtime_checkable
class JudgeAnswerTable(Protocol):
    """What a job store offers to keep judge answers (the repository does); a store without
    it leaves the worker as it was: answers are not kept."""

    def find_judge_answer(self, key: str) -> tuple[str, dict[str, Any]] | None: ...
    def keep_judge_answer(self, key: str, scope: str, answer: dict[str, Any]) -> bool: ...
    def forget_judge_answers(self, scopes: Iterable[str]) -> int: ...
    def purge_judge_answers(self, older_than: timedelta) -> int: ...


PURGE_EVERY_S = 3600.0
"""How often a worker deletes the stored answers older than the retention."""


def scope_of(job: ClaimedJob) -> str:
    """Who pays for a job's judge calls: the job, named so a reused id is another scope."""
    return f"job:{job.id}:{job.metric}:{job.version}:{job.trace_id}"[:200]


class StoredAnswers:
    """A :class:`~recalltrace.scorers._cache.AnswerStore` over the job store's judge answers,
    reached through the worker's database threads."""

    def __init__(
        self, store: JudgeAnswerTable, db_call: DbCall, retention: timedelta = RETENTION
    ) -> None:
        self._store = store
        self._db_call = db_call
        self.retention = retention
        self._purged_at: float | None = None

    async def find(self, key: str) -> tuple[str, dict[str, Any]] | None:
        found: tuple[str, dict[str, Any]] | None = await self._db_call(
            self._store.find_judge_answer, key
        )
        return found

    async def keep(self, key: str, scope: str, answer: dict[str, Any]) -> None:
        await self._db_call(self._store.keep_judge_answer, key, scope, answer)

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
            await self._db_call(self._store.forget_judge_answers, scopes)
        except Exception as exc:
            logger.warning("forgetting stored judge answers failed (%s)", describe(exc))

    async def purge_when_due(self) -> None:
        """Delete answers older than the retention, at most every :data:`PURGE_EVERY_S`."""
        now = time.monotonic()
        if self._purged_at is not None and now - self._purged_at < PURGE_EVERY_S:
            return
        self._purged_at = now
        try:
            removed = await self._db_call(self._store.purge_judge_answers, self.retention)
        except Exception as exc:
            logger.warning("deleting old stored judge answers failed (%s)", describe(exc))
            return
        if removed:
            logger.info("deleted %d stored judge answers older than %s", removed, self.retention)
