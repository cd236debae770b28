"""Job health: failed and stuck jobs, and per variant how many jobs are in each state."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, func, select, union_all
from sqlalchemy.engine import Connection

from recalltrace.storage._dialect import Dialect, as_utc
from recalltrace.storage.history._base import HistoryBase
from recalltrace.storage.history.selection import check_filter_text
from recalltrace.storage.history_rows import JobCounts, JobRow
from recalltrace.storage.models import JobStatus, ScoringJob, Trace, WorkerSeen
from recalltrace.storage.workers import SERVED_WITHIN

DEFAULT_STUCK_AFTER = timedelta(minutes=15)
"""A queued job due for longer than this is reported as stuck (no worker is taking it)."""

JOB_COLUMNS = (
    ScoringJob.id,
    ScoringJob.trace_id,
    ScoringJob.metric,
    ScoringJob.version,
    ScoringJob.status,
    ScoringJob.attempts,
    ScoringJob.last_error,
    ScoringJob.run_at,
    ScoringJob.expires_at,
    ScoringJob.locked_by,
    ScoringJob.lease_expires_at,
    ScoringJob.updated_at,
)
"""The job columns a :class:`JobRow` is built from (:func:`job_rows`)."""


def job_rows(
    conn: Connection, dialect: Dialect, stmt: Any, *, stuck_after: timedelta
) -> list[JobRow]:
    """The :class:`JobRow` of each job ``stmt`` selects (:data:`JOB_COLUMNS`), with its
    problem as of the clock that decides leases."""
    now = as_utc(dialect.clock(conn))
    rows = []
    for r in conn.execute(stmt):
        run_at = as_utc(r.run_at)
        lease = None if r.lease_expires_at is None else as_utc(r.lease_expires_at)
        expires = None if r.expires_at is None else as_utc(r.expires_at)
        problem = _job_problem(r.status, run_at, lease, expires, now, stuck_after)
        rows.append(
            JobRow(
                id=int(r.id),
                trace_id=r.trace_id,
                metric=r.metric,
                version=r.version,
                status=r.status,
                problem=problem,
                attempts=int(r.attempts),
                last_error=r.last_error,
                run_at=run_at,
                locked_by=r.locked_by,
                lease_expires_at=lease,
                updated_at=as_utc(r.updated_at),
            )
        )
    return rows


def _job_problem(
    status: str,
    run_at: datetime,
    lease_expires_at: datetime | None,
    expires_at: datetime | None,
    now: datetime,
    stuck_after: timedelta,
) -> str | None:
    if status == JobStatus.FAILED:
        return "failed"
    if status == JobStatus.RUNNING and lease_expires_at is not None and lease_expires_at < now:
        return "lease_expired"
    if status == JobStatus.QUEUED and run_at < now - stuck_after:
        return "overdue"  # or "unserved", decided by problem_jobs from the workers table
    if status == JobStatus.WAITING and expires_at is not None and expires_at < now:
        return "reference_expired"
    return None


class JobQueries(HistoryBase):
    """:meth:`problem_jobs` and :meth:`job_counts`."""

    def problem_jobs(
        self,
        *,
        metric: str | None = None,
        app: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        stuck_after: timedelta = DEFAULT_STUCK_AFTER,
        limit: int = 100,
    ) -> list[JobRow]:
        """Failed and stuck jobs, most recently changed first.

        Stuck means: running with an expired lease, queued and due for longer than
        ``stuck_after``, or waiting for a reference past its time-to-live. ``since``/``until``
        filter on the job's last change; ``app`` on its trace's app name.
        """
        if limit < 1:
            raise ValueError("limit must be at least 1")
        common: list[ColumnElement[bool]] = []
        if metric is not None:
            common.append(ScoringJob.metric == self.check_metric(metric))
        if app is not None:
            check_filter_text("app", app)
            common.append(
                ScoringJob.trace_id.in_(select(Trace.trace_id).where(Trace.app_name == app))
            )
        if since is not None:
            common.append(ScoringJob.updated_at >= since)
        if until is not None:
            common.append(ScoringJob.updated_at < until)
        with self.engine.connect() as conn:
            now = as_utc(self.dialect.clock(conn))
            # One part per kind of problem, each matching one of the partial indexes on the
            # status, so that a million finished jobs are never scanned.
            kinds: list[ColumnElement[bool]] = [
                ScoringJob.status == JobStatus.FAILED,
                and_(ScoringJob.status == JobStatus.RUNNING, ScoringJob.lease_expires_at < now),
                and_(
                    ScoringJob.status == JobStatus.QUEUED,
                    ScoringJob.run_at < now - stuck_after,
                ),
                and_(ScoringJob.status == JobStatus.WAITING, ScoringJob.expires_at < now),
            ]
            parts = [
                select(*JOB_COLUMNS)
                .where(kind, *common)
                .order_by(ScoringJob.updated_at.desc(), ScoringJob.id.desc())
                .limit(limit)
                .subquery()
                .select()
                for kind in kinds
            ]
            merged = union_all(*parts).subquery()
            stmt = (
                select(merged).order_by(merged.c.updated_at.desc(), merged.c.id.desc()).limit(limit)
            )
            rows = job_rows(conn, self.dialect, stmt, stuck_after=stuck_after)
            if any(r.problem == "overdue" for r in rows):
                # Late jobs of a variant that no worker seen in the window scores are not late:
                # nobody is configured to run them.
                served = self._served_since(conn, now - max(stuck_after, SERVED_WITHIN))
                rows = [
                    replace(r, problem="unserved")
                    if r.problem == "overdue" and r.metric not in served
                    else r
                    for r in rows
                ]
            return rows

    def _served_since(self, conn: Connection, since: datetime) -> set[str]:
        """Variants scored by some worker seen since ``since``."""
        served: set[str] = set()
        for (metrics,) in conn.execute(
            select(WorkerSeen.metrics).where(WorkerSeen.last_seen_at >= since)
        ).tuples():
            served.update(metrics or ())
        return served

    def job_counts(self, *, app: str | None = None) -> list[JobCounts]:
        """Per variant with unfinished or ended-without-score jobs: how many wait for a
        reference, are queued, running, failed and cancelled, and who serves the variant."""
        states = [
            JobStatus.WAITING,
            JobStatus.QUEUED,
            JobStatus.RUNNING,
            JobStatus.FAILED,
            JobStatus.CANCELLED,
        ]
        where: list[ColumnElement[bool]] = [ScoringJob.status.in_(states)]
        if app is not None:
            check_filter_text("app", app)
            where.append(
                ScoringJob.trace_id.in_(select(Trace.trace_id).where(Trace.app_name == app))
            )
        counts: dict[str, dict[str, int]] = {}
        with self.engine.connect() as conn:
            for metric, status, number in conn.execute(
                select(ScoringJob.metric, ScoringJob.status, func.count())
                .where(*where)
                .group_by(ScoringJob.metric, ScoringJob.status)
            ).tuples():
                counts.setdefault(metric, {})[status] = int(number)
            now = as_utc(self.dialect.clock(conn))
            live: dict[str, int] = {}
            last: dict[str, datetime] = {}
            for metrics, seen, stopped in conn.execute(
                select(WorkerSeen.metrics, WorkerSeen.last_seen_at, WorkerSeen.stopped)
            ).tuples():
                seen = as_utc(seen)
                for metric in metrics or ():
                    if metric not in last or seen > last[metric]:
                        last[metric] = seen
                    if not stopped and seen >= now - SERVED_WITHIN:
                        live[metric] = live.get(metric, 0) + 1
        return [
            JobCounts(
                metric=metric,
                waiting=by.get(JobStatus.WAITING, 0),
                queued=by.get(JobStatus.QUEUED, 0),
                running=by.get(JobStatus.RUNNING, 0),
                failed=by.get(JobStatus.FAILED, 0),
                cancelled=by.get(JobStatus.CANCELLED, 0),
                live_workers=live.get(metric, 0),
                last_worker_seen_at=last.get(metric),
            )
            for metric, by in sorted(counts.items())
        ]
