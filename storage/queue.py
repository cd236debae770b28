"""The job queue: scoring jobs are created, claimed under a lease, finished or failed.

Postgres is the queue that coordinates any number of workers on any number of hosts: a claim is
one ``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED)`` statement, so two workers
never take the same job. SQLite is correct for one worker. Times that decide who owns a job (due
times, leases) come from the database clock on Postgres (see :mod:`._dialect`).

What comes in (jobs created, released by a late reference, skipped) is :mod:`.queue_intake`;
what workers read besides their jobs (inputs, depth, spend) is :mod:`.queue_reads`; clocks
that run ahead are :mod:`.queue_clock`. :class:`JobQueue` is all of it; this module keeps the
claims, the leases and the outcomes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import (
    Engine,
    and_,
    delete,
    or_,
    select,
    tuple_,
    update,
)

from recalltrace.storage import summary_cache
from recalltrace.storage._dialect import NOTIFY_CHANNEL, Dialect, utcnow
from recalltrace.storage._storable import MODEL_LIMIT, json_safe, storable_json, storable_text
from recalltrace.storage.contracts import (
    ClaimedJob,
    JobSpec,
    QueueStats,
    ScoreLike,
    TraceInputs,
)
from recalltrace.storage.models import JobStatus, Score, ScoringJob, Trace
from recalltrace.storage.queue_clock import (
    JOBS_DUE_AFTER,
    TRACES_AHEAD_AFTER,
    AheadCount,
    ClockReport,
    clock_report,
    release_parked_jobs,
)
from recalltrace.storage.queue_intake import (
    DEFAULT_REFERENCE_TTL,
    JobIntake,
    job_rows,
    trace_rows,
)
from recalltrace.storage.queue_reads import QueueReads

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_REFERENCE_TTL",
    "JOBS_DUE_AFTER",
    "NOTIFY_CHANNEL",
    "TRACES_AHEAD_AFTER",
    "AheadCount",
    "ClaimedJob",
    "ClockReport",
    "JobQueue",
    "QueueStats",
    "TraceInputs",
    "clock_report",
    "job_rows",
    "release_parked_jobs",
]

DEFAULT_MAX_ATTEMPTS = 3


_REPLACEABLE_SCORE_COLUMNS = (
    "status",
    "value",
    "reason",
    "details",
    "model",
    "prompt_tokens",
    "completion_tokens",
    "cost_usd",
    "latency_ms",
    "scored_at",
)


class JobQueue(JobIntake, QueueReads):
    """Scoring jobs and scores (mixed into :class:`~.repository.Repository`)."""

    engine: Engine
    dialect: Dialect
    specs: Mapping[str, JobSpec]
    metrics: list[JobSpec]
    reference_ttl: timedelta
    max_attempts: int
    _score_upsert: Any

    def _build_score_upsert(self) -> Any:
        """INSERT of a score; returns the rows written.

        An existing ``scored`` result is final. A ``skipped`` or ``failed`` one is replaced by a
        result of another status: a late reference made the trace scoreable, or another run of
        the same job (its lease ran out while it ran) got further. The same status again changes
        nothing, so a job finished twice is stored once. (:meth:`retry_jobs` deletes the failed
        results of the jobs it queues again, so their next result is stored whatever it is.)
        """
        insert = self.dialect.insert(Score.__table__)
        stored = Score.__table__.c.status
        return insert.on_conflict_do_update(
            index_elements=["trace_id", "metric", "version"],
            set_={k: insert.excluded[k] for k in _REPLACEABLE_SCORE_COLUMNS},
            # Plain comparisons: an IN list would be an expanding parameter, which the
            # executemany this statement runs as cannot take.
            where=and_(
                or_(stored == "skipped", stored == "failed"), insert.excluded.status != stored
            ),
        ).returning(
            Score.__table__.c.trace_id,
            Score.__table__.c.metric,
            Score.__table__.c.version,
            # On Postgres, whether the row replaced one: an updated row version carries the
            # writing transaction in xmax, an inserted one 0.
            *self.dialect.replaced_marker(),
        )

    # -- jobs: claiming and leases ------------------------------------------------------
    def claim_jobs(
        self,
        worker_id: str,
        *,
        limit: int,
        lease: timedelta,
        metrics: Sequence[str] | None = None,
        exclude: Sequence[int] = (),
    ) -> list[ClaimedJob]:
        """Claim up to ``limit`` due jobs for ``worker_id`` with a lease of ``lease``, none of
        the ids in ``exclude``.

        On Postgres this is one statement with ``FOR UPDATE SKIP LOCKED``: any number of
        workers on any number of hosts never take the same job.
        """
        if limit < 1:
            return []
        now = self.dialect.now()
        due = (
            select(ScoringJob.id)
            .where(ScoringJob.status == JobStatus.QUEUED, ScoringJob.run_at <= now)
            .order_by(ScoringJob.run_at, ScoringJob.id)
            .limit(limit)
        )
        if metrics is not None:
            due = due.where(ScoringJob.metric.in_(list(metrics)))
        if exclude:
            due = due.where(ScoringJob.id.not_in(list(exclude)))
        due = self.dialect.skip_locked(due)
        stmt = (
            update(ScoringJob)
            .where(ScoringJob.id.in_(due.scalar_subquery()))
            .values(
                status=JobStatus.RUNNING,
                locked_by=worker_id,
                lease_expires_at=now + lease,
                updated_at=now,
            )
            .returning(
                ScoringJob.id,
                ScoringJob.trace_id,
                ScoringJob.metric,
                ScoringJob.version,
                ScoringJob.attempts,
                ScoringJob.first_transient_at,
                ScoringJob.created_at,
            )
        )
        # On SQLite the single UPDATE ... RETURNING statement holds the database's write lock
        # for its whole run, which is what makes it safe for one worker.
        with self.engine.begin() as conn:
            rows = conn.execute(stmt).all()
        jobs = [
            ClaimedJob(
                id=r.id,
                trace_id=r.trace_id,
                metric=r.metric,
                version=r.version,
                attempts=r.attempts,
                first_transient_at=r.first_transient_at,
                created_at=r.created_at,
            )
            for r in rows
        ]
        jobs.sort(key=lambda j: j.id)
        return jobs

    def extend_leases(self, worker_id: str, job_ids: Sequence[int], lease: timedelta) -> int:
        """Push the leases of ``worker_id``'s running jobs forward; returns how many it holds."""
        if not job_ids:
            return 0
        now = self.dialect.now()
        with self.engine.begin() as conn:
            return (
                conn.execute(
                    update(ScoringJob)
                    .where(
                        ScoringJob.id.in_(list(job_ids)),
                        ScoringJob.locked_by == worker_id,
                        ScoringJob.status == JobStatus.RUNNING,
                    )
                    .values(lease_expires_at=now + lease, updated_at=now)
                ).rowcount
                or 0
            )

    def requeue_expired_leases(self) -> int:
        """Give back jobs whose worker died or stalled past its lease; returns how many."""
        now = self.dialect.now()
        with self.engine.begin() as conn:
            count = (
                conn.execute(
                    update(ScoringJob)
                    .where(
                        ScoringJob.status == JobStatus.RUNNING,
                        ScoringJob.lease_expires_at < now,
                    )
                    .values(
                        status=JobStatus.QUEUED,
                        locked_by=None,
                        lease_expires_at=None,
                        run_at=now,
                        updated_at=now,
                    )
                ).rowcount
                or 0
            )
            if count:
                self.dialect.notify(conn)
            return count

    def release_jobs(self, worker_id: str, job_ids: Sequence[int]) -> int:
        """Give back jobs ``worker_id`` holds but will not finish (graceful shutdown)."""
        if not job_ids:
            return 0
        now = self.dialect.now()
        with self.engine.begin() as conn:
            count = (
                conn.execute(
                    update(ScoringJob)
                    .where(
                        ScoringJob.id.in_(list(job_ids)),
                        ScoringJob.locked_by == worker_id,
                        ScoringJob.status == JobStatus.RUNNING,
                    )
                    .values(
                        status=JobStatus.QUEUED,
                        locked_by=None,
                        lease_expires_at=None,
                        run_at=now,
                        updated_at=now,
                    )
                ).rowcount
                or 0
            )
            if count:
                self.dialect.notify(conn)
            return count

    # -- jobs: outcomes -----------------------------------------------------------------
    def finish_job(self, job: ClaimedJob, score: ScoreLike) -> bool:
        """Write ``score`` and close ``job`` in one transaction; returns True if it was new.

        Unique on (trace, metric, version): writing the same score twice changes nothing. A
        ``scored`` result is final; a ``skipped`` one (e.g. a reference that came too late) or a
        ``failed`` one (another run of the same job) is replaced by a result of another status.
        """
        return self.finish_jobs([(job, score)])[0]

    def finish_jobs(self, outcomes: Sequence[tuple[ClaimedJob, ScoreLike]]) -> list[bool]:
        """Write several scores and close their jobs in one transaction.

        Returns, per outcome, whether its score row was new. Every job's score and its job
        status change commit together or not at all. An outcome whose trace was deleted in the
        meantime (its job went with it) is left out and reported as not new.
        """
        if not outcomes:
            return []
        for _, score in outcomes:
            if score.value is not None and not math.isfinite(score.value):
                raise ValueError(f"score value must be finite, got {score.value!r}")
        scored_at = utcnow()
        with self.engine.begin() as conn, summary_cache.score_writes(conn, self.dialect) as changes:
            trace_ids = {job.trace_id for job, _ in outcomes}
            traces = trace_rows(conn, trace_ids)
            # A trace deleted (by retention) while its job ran took the job with it: there is
            # nothing left to close, and raising would block the other scores of the batch.
            kept = [(job, score) for job, score in outcomes if job.trace_id in traces]
            if not kept:
                return [False] * len(outcomes)
            rows = [
                {
                    "trace_id": job.trace_id,
                    "metric": job.metric,
                    "version": score.version,
                    "app_name": traces[job.trace_id].app_name,
                    "trace_started_at": traces[job.trace_id].started_at,
                    "release": traces[job.trace_id].release,
                    "environment": traces[job.trace_id].environment,
                    "status": score.status,
                    "value": score.value,
                    # A judge's answer may carry characters no backend stores (NUL).
                    "reason": storable_text(score.reason)[0],
                    "details": storable_json(json_safe(dict(score.details)))[0],
                    # Cut to the column: a long deployment name must not block every score.
                    "model": (
                        None if score.model is None else storable_text(score.model)[0][:MODEL_LIMIT]
                    ),
                    "prompt_tokens": score.prompt_tokens,
                    "completion_tokens": score.completion_tokens,
                    "cost_usd": score.cost_usd,
                    "latency_ms": score.latency_ms,
                    "scored_at": scored_at,
                }
                for job, score in kept
            ]
            # One statement for any number of rows, executed with the rows as parameters:
            # SQLAlchemy sends them as multi-row VALUES ("insertmanyvalues") with RETURNING and
            # compiles the statement once per batch, not once per row count. (The PostgreSQL
            # dialect's INSERT never enters SQLAlchemy's compiled cache.)
            returned = conn.execute(self._score_upsert, rows).all()
            written = {tuple(r)[:3] for r in returned}
            changes.touched.extend((job.metric, traces[job.trace_id].started_at) for job, _ in kept)
            changes.scored.append(scored_at)
            # A result replaced (a skipped or failed one, Postgres says which) leaves the
            # judge-cost hour it had been stored in.
            replaced = [traces[r[0]].started_at for r in returned if len(r) > 3 and r[3]]
            if replaced:
                changes.replaced_from = min(replaced)
            now = self.dialect.now()
            by_status: dict[str, list[int]] = {}
            failed_reasons: dict[int, str] = {}
            for job, score in kept:
                status = {"skipped": JobStatus.SKIPPED, "failed": JobStatus.FAILED}.get(
                    score.status, JobStatus.DONE
                )
                by_status.setdefault(status, []).append(job.id)
                if status == JobStatus.FAILED:
                    failed_reasons[job.id] = storable_text(score.reason)[0]
            for status, ids in by_status.items():
                values: dict[str, Any] = {
                    "status": status,
                    "locked_by": None,
                    "lease_expires_at": None,
                    "updated_at": now,
                }
                if status != JobStatus.FAILED:
                    values["last_error"] = None
                    conn.execute(update(ScoringJob).where(ScoringJob.id.in_(ids)).values(values))
                else:
                    # The try that failed counts as an attempt, as when retries run out.
                    for job_id in ids:
                        conn.execute(
                            update(ScoringJob)
                            .where(ScoringJob.id == job_id)
                            .values(
                                {
                                    **values,
                                    "last_error": failed_reasons[job_id],
                                    "attempts": ScoringJob.attempts + 1,
                                }
                            )
                        )
        return [(job.trace_id, job.metric, score.version) in written for job, score in outcomes]

    def reschedule_job(
        self,
        job: ClaimedJob,
        *,
        delay: timedelta,
        error: str,
        consume_attempt: bool,
        max_attempts: int | None = None,
    ) -> str:
        """Put ``job`` back in the queue after ``delay``; returns its new status.

        A consumed attempt that reaches ``max_attempts`` (the repository's unless given) fails
        the job instead, keeping ``error``. Transient errors (``consume_attempt=False``)
        remember when they started, so the worker can bound their total age.
        """
        attempts = job.attempts + (1 if consume_attempt else 0)
        if attempts >= (self.max_attempts if max_attempts is None else max_attempts):
            self.fail_job(job, error, attempts=attempts)
            return JobStatus.FAILED
        now = self.dialect.now()
        values: dict[str, Any] = {
            "status": JobStatus.QUEUED,
            "attempts": attempts,
            "run_at": now + delay,
            "locked_by": None,
            "lease_expires_at": None,
            "last_error": storable_text(error)[0],
            "updated_at": now,
        }
        if not consume_attempt and job.first_transient_at is None:
            values["first_transient_at"] = now
        with self.engine.begin() as conn:
            conn.execute(
                update(ScoringJob)
                .where(ScoringJob.id == job.id, ScoringJob.status == JobStatus.RUNNING)
                .values(**values)
            )
        return JobStatus.QUEUED

    def fail_job(self, job: ClaimedJob, error: str, *, attempts: int | None = None) -> None:
        """Mark ``job`` failed for good, keeping ``error``."""
        now = self.dialect.now()
        with self.engine.begin() as conn:
            conn.execute(
                update(ScoringJob)
                .where(ScoringJob.id == job.id)
                .values(
                    status=JobStatus.FAILED,
                    # The try that failed counts: a job that failed on its first try
                    # shows one attempt.
                    attempts=job.attempts + 1 if attempts is None else attempts,
                    locked_by=None,
                    lease_expires_at=None,
                    last_error=storable_text(error)[0],
                    updated_at=now,
                )
            )

    def retry_jobs(self, *, job_ids: Sequence[int] | None = None, metric: str | None = None) -> int:
        """Queue failed jobs again with fresh attempts; returns how many.

        The failed results those jobs stored are deleted in the same transaction, so the next
        run's result is stored whatever it is: a score, or a new failure with its own reason.
        Until then the trace has no result of that variant, and the job is queued.
        """
        now = self.dialect.now()
        stmt = update(ScoringJob).where(ScoringJob.status == JobStatus.FAILED)
        if job_ids is not None:
            stmt = stmt.where(ScoringJob.id.in_(list(job_ids)))
        if metric is not None:
            stmt = stmt.where(ScoringJob.metric == metric)
        stmt = stmt.values(
            status=JobStatus.QUEUED,
            attempts=0,
            first_transient_at=None,
            run_at=now,
            updated_at=now,
        ).returning(ScoringJob.trace_id, ScoringJob.metric, ScoringJob.version)
        with self.engine.begin() as conn:
            requeued = [tuple(row) for row in conn.execute(stmt)]
            if not requeued:
                return 0
            with summary_cache.score_writes(conn, self.dialect) as changes:
                for start in range(0, len(requeued), 500):
                    dropped = (
                        conn.execute(
                            delete(Score)
                            .where(
                                tuple_(Score.trace_id, Score.metric, Score.version).in_(
                                    requeued[start : start + 500]
                                ),
                                Score.status == "failed",
                            )
                            .returning(Score.metric, Score.trace_started_at, Score.scored_at)
                        )
                        .tuples()
                        .all()
                    )
                    changes.touched.extend((m, started) for m, started, _s in dropped)
                    changes.scored.extend(stored for _m, _t, stored in dropped)
            self.dialect.notify(conn)
            return len(requeued)

    def cancel_jobs(
        self,
        *,
        metric: str | None = None,
        job_ids: Sequence[int] | None = None,
        trace_ids_of_app: str | None = None,
    ) -> dict[str, int]:
        """End waiting, queued and failed jobs without scoring them; returns counts per metric.

        Running jobs are left to finish. Cancelled jobs no longer count as pending anywhere
        (queue gauges, ``jobs list``); ``recalltrace backfill`` creates nothing for them again
        (their (trace, metric, version) row stays, cancelled).
        """
        now = self.dialect.now()
        stmt = update(ScoringJob).where(
            ScoringJob.status.in_([JobStatus.WAITING, JobStatus.QUEUED, JobStatus.FAILED])
        )
        if metric is not None:
            stmt = stmt.where(ScoringJob.metric == metric)
        if job_ids is not None:
            stmt = stmt.where(ScoringJob.id.in_(list(job_ids)))
        if trace_ids_of_app is not None:
            stmt = stmt.where(
                ScoringJob.trace_id.in_(
                    select(Trace.trace_id).where(Trace.app_name == trace_ids_of_app)
                )
            )
        stmt = stmt.values(
            status=JobStatus.CANCELLED,
            locked_by=None,
            lease_expires_at=None,
            updated_at=now,
        ).returning(ScoringJob.metric)
        counts: dict[str, int] = {}
        with self.engine.begin() as conn:
            for (name,) in conn.execute(stmt).tuples():
                counts[name] = counts.get(name, 0) + 1
        return counts
