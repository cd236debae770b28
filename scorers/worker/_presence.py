"""What a running worker tells others: its row in ``workers`` (the variants it serves, kept
fresh), a warning naming the due jobs of variants no running worker serves, and a status line
every so often on a long-running worker."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from recalltrace.scorers.worker._stats import WorkerStats
from recalltrace.storage.contracts import JobStore, QueueStats

logger = logging.getLogger("recalltrace.scorers.worker")

T = TypeVar("T")
DbCall = Callable[..., Awaitable[Any]]


class Presence:
    """This worker's row in ``workers`` and the unserved variants it has warned about."""

    def __init__(
        self,
        repo: JobStore,
        db_call: DbCall,
        *,
        worker_id: str,
        metrics: Sequence[str],
        started_at: datetime,
    ) -> None:
        self._repo = repo
        self._db_call = db_call
        self._worker_id = worker_id
        self._metrics = list(metrics)
        self._started_at = started_at
        self._unserved_said: set[str] = set()

    async def report(self, *, stopped: bool = False) -> None:
        """Keep this worker's row fresh (or mark it stopped), and name the due jobs of variants
        no running worker serves, once per variant."""
        try:
            await self._db_call(
                self._repo.report_worker,
                self._worker_id,
                host=socket.gethostname(),
                pid=os.getpid(),
                metrics=self._metrics,
                started_at=self._started_at,
                stopped=stopped,
            )
            if stopped:
                return
            unserved: dict[str, int] = await self._db_call(self._repo.unserved_due, self._metrics)
        except Exception as exc:
            logger.warning("reporting this worker's variants failed (%s)", describe(exc))
            return
        self.warn_unserved(unserved)

    def warn_unserved(self, unserved: dict[str, int]) -> None:
        """One warning naming the variants in ``unserved`` not named before."""
        new = {m: n for m, n in unserved.items() if m not in self._unserved_said}
        if not new:
            return
        self._unserved_said.update(new)
        logger.warning(
            "%d queued job%s of variant%s no running worker serves: %s; %s",
            sum(new.values()),
            "s" if sum(new.values()) != 1 else "",
            "s" if len(new) != 1 else "",
            ", ".join(f"{m} ({n})" for m, n in sorted(new.items())),
            unserved_fix(sorted(new)),
        )


def unserved_fix(metrics: Sequence[str]) -> str:
    """How to serve (or end) the queued jobs of ``metrics``, as commands that run as printed:
    the LLM variants need a judge model, the others only a worker that takes them."""
    from recalltrace.scorers.catalog import CATALOG

    llm = [m for m in metrics if m in CATALOG and CATALOG[m].uses_llm]
    plain = [m for m in metrics if m not in llm]
    fixes = []
    if plain:
        fixes.append("`recalltrace worker " + " ".join(f"--metric {m}" for m in plain) + "`")
    if llm:
        fixes.append(
            "`recalltrace worker --judge-model ollama/llama3.1 "
            + " ".join(f"--metric {m}" for m in llm)
            + "` (or any LiteLLM model string)"
        )
    cancel = "`recalltrace jobs cancel " + " ".join(f"--metric {m}" for m in metrics) + "`"
    return f"score them with {' and '.join(fixes)}, or end them with {cancel}"


class StatusLine:
    """One line every ``interval_s`` on a long-running worker, instead of silence (the first
    queue refresh of a run says nothing: the start line says enough)."""

    def __init__(self, interval_s: float | None) -> None:
        self._interval_s = interval_s
        self._next = 0.0

    def due(self, now: float) -> bool:
        """Whether a line is due at ``now`` (``time.monotonic()``); schedules the next one."""
        interval = self._interval_s
        if interval is None or now < self._next:
            return False
        first = self._next == 0.0
        self._next = now + interval
        return not first

    @staticmethod
    def log(stats: WorkerStats, queue: QueueStats, *, paused: bool) -> None:
        """Log the status line."""
        lag = "-" if queue.oldest_due_age_s is None else f"{queue.oldest_due_age_s:.0f} s"
        logger.info(
            "status: scored %d, skipped %d, failed %d, retried %d since start; queue %d due, "
            "%d running, %d waiting, %d failed; lag %s%s",
            stats.scored,
            stats.skipped,
            stats.failed,
            stats.retried,
            queue.due,
            queue.running,
            queue.waiting,
            queue.failed,
            lag,
            "; judge paused" if paused else "",
        )


def combined(parts: Sequence[QueueStats]) -> QueueStats:
    """The queue of several variants from theirs: counts add up, the lag is the oldest."""
    ages = [q.oldest_due_age_s for q in parts if q.oldest_due_age_s is not None]
    return QueueStats(
        due=sum(q.due for q in parts),
        running=sum(q.running for q in parts),
        waiting=sum(q.waiting for q in parts),
        failed=sum(q.failed for q in parts),
        oldest_due_age_s=max(ages) if ages else None,
    )


def describe(exc: BaseException) -> str:
    """An exception in one line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
