"""Times ahead of the database's clock: traces stamped by a clock that runs ahead, and queued
jobs parked by one (``recalltrace doctor`` reports them and releases the parked jobs)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from sqlalchemy import (
    Engine,
    func,
    select,
    update,
)

from recalltrace.storage._dialect import dialect_of
from recalltrace.storage.models import JobStatus, ScoringJob, Trace

TRACES_AHEAD_AFTER = timedelta(minutes=5)
"""A trace that started more than this after the database's now was stamped by a clock that
runs ahead (a host or container with a bad clock)."""

JOBS_DUE_AFTER = timedelta(hours=1)
"""A queued job due more than this after the database's now is parked: no retry waits that long,
so its due time came from a clock that runs ahead (an older recalltrace took due times from the
application's clock)."""


@dataclass(frozen=True, slots=True)
class AheadCount:
    """How many rows lie ahead of the database's clock, and the farthest one (seconds)."""

    count: int
    most_s: float


@dataclass(frozen=True, slots=True)
class ClockReport:
    """Times ahead of the database's clock: traces per app, and parked queued jobs."""

    traces_ahead: dict[str, AheadCount]
    jobs_parked: AheadCount


def _seconds_ahead(latest: datetime | None, now: datetime) -> float:
    if latest is None:
        return 0.0
    if latest.tzinfo is None:
        latest = latest.replace(tzinfo=timezone.utc)
    return max(0.0, (latest - now).total_seconds())


def clock_report(
    engine: Engine,
    *,
    traces_ahead_after: timedelta = TRACES_AHEAD_AFTER,
    jobs_due_after: timedelta = JOBS_DUE_AFTER,
) -> ClockReport:
    """Traces stamped ahead of the database's clock (per app) and queued jobs due unusually far
    ahead, measured on the database's clock (the local one on SQLite). Two index range scans."""
    dialect = dialect_of(engine)
    with engine.connect() as conn:
        now = dialect.clock(conn)
        traces = {
            app: AheadCount(int(number), _seconds_ahead(latest, now))
            for app, number, latest in conn.execute(
                select(Trace.app_name, func.count(), func.max(Trace.started_at))
                .where(Trace.started_at > now + traces_ahead_after)
                .group_by(Trace.app_name)
            ).tuples()
        }
        number, latest = conn.execute(
            select(func.count(), func.max(ScoringJob.run_at)).where(
                ScoringJob.status == JobStatus.QUEUED, ScoringJob.run_at > now + jobs_due_after
            )
        ).one()
    return ClockReport(traces, AheadCount(int(number or 0), _seconds_ahead(latest, now)))


def release_parked_jobs(engine: Engine, *, jobs_due_after: timedelta = JOBS_DUE_AFTER) -> int:
    """Make queued jobs due more than ``jobs_due_after`` ahead due now (on the database's clock);
    returns how many."""
    dialect = dialect_of(engine)
    with engine.begin() as conn:
        now = dialect.clock(conn)
        released = (
            conn.execute(
                update(ScoringJob)
                .where(
                    ScoringJob.status == JobStatus.QUEUED,
                    ScoringJob.run_at > now + jobs_due_after,
                )
                .values(run_at=now, updated_at=now)
            ).rowcount
            or 0
        )
        if released:
            dialect.notify(conn)
    return released
