"""Storing finished jobs: scores wait in a list, are written in batches together with their
jobs' new status, and are retried until stored; a batch storage refuses (the database answers
but will not take it) is stored score by score, and a score it refuses fails its job with the
reason."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from recalltrace.scorers._result import ScoreResult
from recalltrace.scorers.worker._presence import describe
from recalltrace.scorers.worker._stats import Finished
from recalltrace.storage.contracts import ClaimedJob, JobStore
from recalltrace.storage.errors import is_database_unavailable

logger = logging.getLogger("recalltrace.scorers.worker")

ISOLATE_AFTER = 3
"""Failed writes of one batch before its scores are stored one by one (when the database is
reachable but refuses the batch)."""

DbCall = Callable[..., Awaitable[Any]]


def failed_result(job: ClaimedJob, reason: str) -> ScoreResult:
    """The ``failed`` score a job ends with when no scorer result can be stored."""
    return ScoreResult(
        metric=job.metric,
        value=None,
        status="failed",
        reason=reason,
        details={"error": reason},
        version=job.version,
    )


class ScoreWriter:
    """The finished jobs of one worker on their way to storage."""

    def __init__(
        self,
        repo: JobStore,
        db_call: DbCall,
        *,
        batch_size: int,
        grace_period_s: float,
        on_stored: Callable[[list[Finished]], None],
        on_not_stored: Callable[[Finished], None],
        after_written: Callable[[list[ClaimedJob]], Awaitable[None]] | None = None,
    ) -> None:
        self._repo = repo
        self._db_call = db_call
        self._batch_size = batch_size
        self._grace_period_s = grace_period_s
        self._on_stored = on_stored
        self._on_not_stored = on_not_stored
        self._after_written = after_written
        self.pending: list[Finished] = []
        """Finished jobs not stored yet."""
        self.reset()

    def reset(self) -> None:
        """Start a run (the lock and event belong to its event loop)."""
        self._lock = asyncio.Lock()
        self._now = asyncio.Event()
        self.closing = False

    def add(self, finished: Finished) -> None:
        """Queue a finished job; a full batch is written at once."""
        self.pending.append(finished)
        if len(self.pending) >= self._batch_size:
            self._now.set()

    def outstanding(self) -> bool:
        """Whether scores wait to be written or are being written."""
        return bool(self.pending) or self._lock.locked()

    def flush_soon(self) -> None:
        """Have the pending scores written now rather than at the next tick."""
        self._now.set()

    def close_soon(self) -> None:
        """Write what is pending, then let :meth:`run` return."""
        self.closing = True
        self._now.set()

    async def run(self) -> None:
        """Write pending scores every 50 ms (or at once when asked) until closed and empty."""
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._now.wait(), timeout=0.05)
            self._now.clear()
            if self.pending:
                await self.flush()
            if self.closing and not self.pending:
                return

    async def flush(self) -> None:
        """Write every pending score, batch by batch (stops at a batch given up on)."""
        async with self._lock:
            while self.pending:
                batch = self.pending[: self._batch_size]
                del self.pending[: len(batch)]
                if not await self._write_batch(batch):
                    return

    async def _write_batch(self, batch: list[Finished]) -> bool:
        outcomes = [(entry.job, entry.result) for entry in batch]
        delay = 0.5
        give_up_at: float | None = None
        failures = 0
        while True:
            try:
                written: list[bool] = await self._db_call(self._repo.finish_jobs, outcomes)
                # Each of these jobs has its result stored now (by this worker or another):
                # its stored judge answers are no longer needed.
                await self._written([entry.job for entry in batch])
                # Counted are the scores stored now: not those of traces deleted while they
                # were scored, nor a second finish of a job another worker already stored.
                for entry, new in zip(batch, written, strict=True):
                    if not new:
                        self._on_not_stored(entry)
                batch = [entry for entry, new in zip(batch, written, strict=True) if new]
                break
            except Exception as exc:
                failures += 1
                if failures >= ISOLATE_AFTER and not is_database_unavailable(exc):
                    # Storage refuses something this batch holds (it is not down): retrying
                    # the batch as it is would hold every score behind it forever.
                    batch = await self._write_one_by_one(batch)
                    break
                now = time.monotonic()
                if self.closing:
                    give_up_at = give_up_at or now + self._grace_period_s
                    if now >= give_up_at:
                        # The leases expire and another worker scores these again; the
                        # unique key keeps that from doubling anything.
                        logger.error(
                            "could not store %d scores before exit (%s)",
                            len(batch),
                            describe(exc),
                        )
                        return False
                logger.error("storing scores failed (%s); retrying", describe(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
        self._on_stored(batch)
        return True

    async def _written(self, jobs: list[ClaimedJob]) -> None:
        if self._after_written is not None:
            await self._after_written(jobs)

    async def _write_one_by_one(self, batch: list[Finished]) -> list[Finished]:
        """Store a refused batch score by score; a score storage refuses fails its job with
        the reason. Returns the scores stored; if the database goes away meanwhile, the rest
        goes back to the pending scores."""
        stored: list[Finished] = []
        for index, entry in enumerate(batch):
            job = entry.job
            try:
                if (await self._db_call(self._repo.finish_jobs, [(job, entry.result)]))[0]:
                    stored.append(entry)
                await self._written([job])
                continue
            except Exception as exc:
                if is_database_unavailable(exc):
                    self.pending[:0] = batch[index:]
                    return stored
                reason = f"The score could not be stored: {describe(exc)}"
            logger.error("job %s (%s): %s", job.id, job.metric, reason)
            failed = failed_result(job, reason)
            try:
                if (await self._db_call(self._repo.finish_jobs, [(job, failed)]))[0]:
                    stored.append(Finished(job, failed, entry.app_name, entry.duration_s))
                await self._written([job])
            except Exception:
                try:
                    await self._db_call(self._repo.fail_job, job, reason)
                except Exception as fail_exc:
                    logger.error(
                        "could not fail job %s (%s); its lease will expire",
                        job.id,
                        describe(fail_exc),
                    )
        return stored
