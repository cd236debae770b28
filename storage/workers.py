"""Which workers run, and which variants they score: a fact of the database, across hosts.

Each worker process keeps a row in ``workers`` fresh while it runs (:meth:`report_worker`) and
marks it stopped when it ends cleanly. A variant is *served* while some worker that scores it
was seen recently; jobs of a variant no worker has served within that window are *unserved*,
which ``recalltrace jobs list`` and the workers themselves report by name instead of calling
them late.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Engine, delete, func, select, update

from recalltrace.storage._dialect import Dialect, utcnow
from recalltrace.storage.models import JobStatus, ScoringJob, WorkerSeen

__all__ = ["FORGET_AFTER", "SERVED_WITHIN", "Coverage", "WorkerRegistry"]

SERVED_WITHIN = timedelta(minutes=2)
"""A running worker refreshes its row at least this often; a row older than this is stale."""

FORGET_AFTER = timedelta(days=7)
"""Rows of workers not seen for this long are deleted."""


@dataclass(frozen=True, slots=True)
class Coverage:
    """Who serves one variant."""

    live_workers: int
    """Workers that score it and were seen within :data:`SERVED_WITHIN` and have not stopped."""
    last_seen_at: datetime | None
    """When any worker scoring it was last seen (``None``: never, or over a week ago)."""

    @property
    def served(self) -> bool:
        """True while a worker runs it."""
        return self.live_workers > 0


class WorkerRegistry:
    """The ``workers`` table (a mixin of :class:`~.repository.Repository`)."""

    engine: Engine
    dialect: Dialect

    def report_worker(
        self,
        worker_id: str,
        *,
        host: str,
        pid: int,
        metrics: Sequence[str],
        started_at: datetime,
        stopped: bool = False,
    ) -> None:
        """Create or refresh the row of ``worker_id`` (its variants, now as last seen)."""
        now = utcnow()
        values = {
            "worker_id": worker_id[:200],
            "host": host[:200],
            "pid": pid,
            "metrics": sorted(set(metrics)),
            "started_at": started_at,
            "last_seen_at": now,
            "stopped": stopped,
        }
        stmt = self.dialect.insert(WorkerSeen).values(values)
        stmt = stmt.on_conflict_do_update(
            index_elements=[WorkerSeen.worker_id],
            set_={k: stmt.excluded[k] for k in ("metrics", "last_seen_at", "stopped")},
        )
        with self.engine.begin() as conn:
            conn.execute(stmt)
            conn.execute(delete(WorkerSeen).where(WorkerSeen.last_seen_at < now - FORGET_AFTER))

    def worker_stopped(self, worker_id: str) -> None:
        """Mark ``worker_id`` stopped: its variants are no longer served by it."""
        with self.engine.begin() as conn:
            conn.execute(
                update(WorkerSeen)
                .where(WorkerSeen.worker_id == worker_id[:200])
                .values(stopped=True, last_seen_at=utcnow())
            )

    def coverage(self, within: timedelta = SERVED_WITHIN) -> dict[str, Coverage]:
        """Per variant any worker ever reported: how many serve it now, and when last seen."""
        now = utcnow()
        live: dict[str, int] = {}
        last: dict[str, datetime] = {}
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(WorkerSeen.metrics, WorkerSeen.last_seen_at, WorkerSeen.stopped)
            ).tuples()
            for metrics, seen, stopped in rows:
                for metric in metrics or ():
                    if metric not in last or seen > last[metric]:
                        last[metric] = seen
                    if not stopped and seen >= now - within:
                        live[metric] = live.get(metric, 0) + 1
                    else:
                        live.setdefault(metric, 0)
        return {m: Coverage(live_workers=live.get(m, 0), last_seen_at=last[m]) for m in last}

    def unserved_due(self, metrics_served_here: Sequence[str]) -> dict[str, int]:
        """Due jobs per variant that neither this worker (``metrics_served_here``) nor any
        other live worker scores: they will wait until someone starts a worker for them."""
        served = {m for m, c in self.coverage().items() if c.served} | set(metrics_served_here)
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(ScoringJob.metric, func.count())
                .where(ScoringJob.status == JobStatus.QUEUED)
                .group_by(ScoringJob.metric)
            ).tuples()
            return {m: int(n) for m, n in rows if m not in served}
