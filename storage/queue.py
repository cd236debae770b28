"""The job queue: scoring jobs are created, claimed under a lease, finished or failed.

Postgres is the queue that coordinates any number of workers on any number of hosts: a claim is
one ``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED)`` statement, so two workers
never take the same job. SQLite is correct for one worker. Times that decide who owns a job (due
times, leases) come from the database clock on Postgres (see :mod:`._dialect`).

Which jobs exist is decided by the :class:`~.contracts.JobSpec` values the repository is given:
one job per (trace, metric, version); a job whose spec waits for a reference the trace does not
have yet is ``waiting`` until ``attach_reference`` brings it or its time-to-live runs out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Engine,
    and_,
    case,
    delete,
    func,
    literal,
    or_,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.sql.elements import TextClause

from recalltrace.storage import summary_cache
from recalltrace.storage._dialect import NOTIFY_CHANNEL, Dialect, dialect_of, utcnow
from recalltrace.storage._storable import MODEL_LIMIT, json_safe, storable_json, storable_text
from recalltrace.storage.contracts import (
    ClaimedJob,
    JobSpec,
    QueueStats,
    ScoreLike,
    SkippedJob,
    TraceInputs,
    TraceNotFound,
    check_metric,
)
from recalltrace.storage.models import JobStatus, RetrievedContext, Score, ScoringJob, Trace
from recalltrace.storage.records import ContextRecord, ReferenceUpdate, TraceRecord

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

DEFAULT_REFERENCE_TTL = timedelta(hours=24)
DEFAULT_MAX_ATTEMPTS = 3


def initial_status(spec: JobSpec, record: TraceRecord | Trace) -> str:
    """``waiting`` when a reference-type input the spec needs is absent, else ``queued``.

    An empty string counts as present: only ``None`` means "not given yet"."""
    if any(getattr(record, name) is None for name in spec.waits_for):
        return JobStatus.WAITING
    return JobStatus.QUEUED


def job_rows(
    specs: Iterable[JobSpec],
    batch: Iterable[TraceRecord | Trace],
    now: datetime,
    reference_ttl: timedelta,
) -> list[dict[str, Any]]:
    """The ``scoring_jobs`` rows of freshly written traces, one per (trace, spec)."""
    expires = now + reference_ttl
    specs = list(specs)
    rows = []
    for r in batch:
        for spec in specs:
            status = initial_status(spec, r)
            rows.append(
                {
                    "trace_id": r.trace_id,
                    "metric": spec.metric,
                    "version": spec.version,
                    "status": status,
                    "attempts": 0,
                    "run_at": now,
                    "expires_at": expires if status == JobStatus.WAITING else None,
                    "created_at": now,
                    "updated_at": now,
                }
            )
    return rows


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


class JobQueue:
    """Scoring jobs and scores (mixed into :class:`~.repository.Repository`)."""

    engine: Engine
    dialect: Dialect
    specs: Mapping[str, JobSpec]
    metrics: list[JobSpec]
    reference_ttl: timedelta
    max_attempts: int
    _score_upsert: Any

    def spec(self, metric: str) -> JobSpec:
        """The job specification of ``metric``; raises ``UnknownMetric`` naming the known."""
        return self.specs[check_metric(metric, self.specs)]

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

    def create_jobs(
        self,
        *,
        metrics: Sequence[str] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        app_name: str | None = None,
        trace_ids: Sequence[str] | None = None,
    ) -> int:
        """Create missing jobs for stored traces (a backfill); returns how many were created.

        Jobs are keyed by (trace, metric, version), so after a variant's version changes this
        creates the new version's jobs and leaves the old scores in place. A trace that already
        has a result of the variant's current version gets no job: a job queued before the
        version changed is scored by the new version, so its result is there already.
        """
        infos = [self.spec(k) for k in metrics] if metrics is not None else self.metrics
        created = 0
        with self.engine.begin() as conn:
            for info in infos:
                now = self.dialect.now_sql()
                missing = [Trace.__table__.c[name].is_(None) for name in info.waits_for]
                waiting = or_(*missing) if missing else literal(False)
                status_expr = case((waiting, JobStatus.WAITING), else_=JobStatus.QUEUED)
                expires_expr = case((waiting, self.dialect.now_sql(self.reference_ttl)), else_=None)
                # SQLite needs a WHERE before ON CONFLICT in INSERT ... SELECT to parse it.
                scored_already = (
                    select(Score.id)
                    .where(
                        Score.trace_id == Trace.trace_id,
                        Score.metric == info.metric,
                        Score.version == info.version,
                    )
                    .exists()
                )
                conditions: list[ColumnElement[bool] | TextClause] = [
                    text("1 = 1"),
                    ~scored_already,
                ]
                if since is not None:
                    conditions.append(Trace.started_at >= since)
                if until is not None:
                    conditions.append(Trace.started_at < until)
                if app_name is not None:
                    conditions.append(Trace.app_name == app_name)
                if trace_ids is not None:
                    conditions.append(Trace.trace_id.in_(list(trace_ids)))
                source = select(
                    Trace.trace_id,
                    literal(info.metric),
                    literal(info.version),
                    status_expr,
                    literal(0),
                    now,
                    expires_expr,
                    now,
                    now,
                ).where(*conditions)
                stmt = (
                    self.dialect.insert(ScoringJob.__table__)
                    .from_select(
                        [
                            "trace_id",
                            "metric",
                            "version",
                            "status",
                            "attempts",
                            "run_at",
                            "expires_at",
                            "created_at",
                            "updated_at",
                        ],
                        source,
                    )
                    .on_conflict_do_nothing()
                    .returning(ScoringJob.__table__.c.id)
                )
                created += len(conn.execute(stmt).all())
            if created:
                self.dialect.notify(conn)
        return created

    def attach_reference(self, update_: ReferenceUpdate) -> int:
        """Attach late ground truth to a stored trace; returns how many jobs it released.

        Fields left ``None`` in the update keep their stored value. Jobs waiting for the
        reference become due; jobs that were skipped because the reference came too late are
        queued again. Raises :class:`TraceNotFound` when the trace is not stored.
        """
        values: dict[str, Any] = {}
        if update_.reference is not None:
            values["reference"] = update_.reference
        if update_.reference_contexts is not None:
            values["reference_contexts"] = [str(c) for c in update_.reference_contexts]
        if update_.reference_context_ids is not None:
            values["reference_context_ids"] = [str(i) for i in update_.reference_context_ids]
        with self.engine.begin() as conn:
            if values:
                result = conn.execute(
                    update(Trace).where(Trace.trace_id == update_.trace_id).values(**values)
                )
                found = result.rowcount > 0
            else:
                found = (
                    conn.scalar(select(Trace.trace_id).where(Trace.trace_id == update_.trace_id))
                    is not None
                )
            if not found:
                raise TraceNotFound(f"no trace is stored with id {update_.trace_id!r}")
            trace = conn.execute(
                select(
                    Trace.trace_id,
                    Trace.reference,
                    Trace.reference_contexts,
                    Trace.reference_context_ids,
                ).where(Trace.trace_id == update_.trace_id)
            ).one()
            ready = [
                info.metric
                for info in self.specs.values()
                if info.needs_reference
                and all(getattr(trace, n) is not None for n in info.waits_for)
            ]
            if not ready:
                return 0
            now = self.dialect.now()
            released = conn.execute(
                update(ScoringJob)
                .where(
                    ScoringJob.trace_id == update_.trace_id,
                    ScoringJob.metric.in_(ready),
                    or_(
                        ScoringJob.status == JobStatus.WAITING,
                        and_(
                            ScoringJob.status == JobStatus.SKIPPED,
                            ScoringJob.last_error.like("reference_ttl:%"),
                        ),
                    ),
                )
                .values(
                    status=JobStatus.QUEUED,
                    run_at=now,
                    expires_at=None,
                    last_error=None,
                    updated_at=now,
                )
            ).rowcount
            if released:
                self.dialect.notify(conn)
            return released or 0

    def expire_waiting_jobs(self, older_than: timedelta | None = None) -> int:
        """Skip jobs whose reference did not arrive in time; returns how many (see
        :meth:`skip_expired_waits`)."""
        return len(self.skip_expired_waits(older_than))

    def skip_expired_waits(self, older_than: timedelta | None = None) -> list[SkippedJob]:
        """Skip jobs whose reference did not arrive in time; returns them.

        A waiting job expires at the deadline it was created with (``reference_ttl`` of the
        repository that wrote it) or, when ``older_than`` is given, once it is older than that.
        Each gets a ``skipped`` score saying so, so the history shows why nothing was scored.
        A reference that arrives later still queues the job again.
        """
        now = self.dialect.now()
        expired: ColumnElement[bool] = ScoringJob.expires_at <= now
        if older_than is not None:
            expired = or_(expired, ScoringJob.created_at <= now - older_than)
        with self.engine.begin() as conn, summary_cache.score_writes(conn, self.dialect) as changes:
            rows = conn.execute(
                update(ScoringJob)
                .where(ScoringJob.status == JobStatus.WAITING, expired)
                .values(
                    status=JobStatus.SKIPPED,
                    last_error="reference_ttl: no reference arrived before the time-to-live",
                    updated_at=now,
                )
                .returning(ScoringJob.trace_id, ScoringJob.metric, ScoringJob.version)
            ).all()
            if not rows:
                return []
            traces = {
                t.trace_id: t
                for t in conn.execute(
                    select(
                        Trace.trace_id,
                        Trace.app_name,
                        Trace.started_at,
                        Trace.otel_trace_id,
                        Trace.otel_span_id,
                        Trace.release,
                        Trace.environment,
                    ).where(Trace.trace_id.in_({r.trace_id for r in rows}))
                )
            }
            ttl = older_than if older_than is not None else self.reference_ttl
            ttl_hours = ttl.total_seconds() / 3600
            reason = (
                "No reference arrived within the reference time-to-live "
                f"({ttl_hours:g} h), so there was nothing to compare against."
            )
            scored_at = utcnow()
            conn.execute(
                self.dialect.insert(Score.__table__).on_conflict_do_nothing(),
                [
                    {
                        "trace_id": r.trace_id,
                        "metric": r.metric,
                        "version": r.version,
                        "app_name": traces[r.trace_id].app_name,
                        "trace_started_at": traces[r.trace_id].started_at,
                        "release": traces[r.trace_id].release,
                        "environment": traces[r.trace_id].environment,
                        "status": "skipped",
                        "value": None,
                        "reason": reason,
                        "details": {"skipped_by": "reference_ttl"},
                        "scored_at": scored_at,
                    }
                    for r in rows
                ],
            )
            changes.touched.extend((r.metric, traces[r.trace_id].started_at) for r in rows)
            return [
                SkippedJob(
                    r.trace_id,
                    r.metric,
                    r.version,
                    traces[r.trace_id].app_name,
                    reason,
                    traces[r.trace_id].otel_trace_id,
                    traces[r.trace_id].otel_span_id,
                )
                for r in rows
            ]

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
            traces = {
                t.trace_id: t
                for t in conn.execute(
                    select(
                        Trace.trace_id,
                        Trace.app_name,
                        Trace.started_at,
                        Trace.otel_trace_id,
                        Trace.otel_span_id,
                        Trace.release,
                        Trace.environment,
                    ).where(Trace.trace_id.in_(trace_ids))
                )
            }
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

    # -- reading --------------------------------------------------------------------------
    def load_inputs(self, trace_ids: Iterable[str]) -> dict[str, TraceInputs]:
        """Load the traces behind a batch of jobs, shaped as scorer inputs (two queries)."""
        ids = sorted(set(trace_ids))
        if not ids:
            return {}
        with self.engine.connect() as conn:
            traces = conn.execute(
                select(
                    Trace.trace_id,
                    Trace.app_name,
                    Trace.started_at,
                    Trace.user_input,
                    Trace.response,
                    Trace.reference,
                    Trace.reference_contexts,
                    Trace.reference_context_ids,
                    Trace.otel_trace_id,
                    Trace.otel_span_id,
                ).where(Trace.trace_id.in_(ids))
            ).all()
            contexts = conn.execute(
                select(
                    RetrievedContext.trace_id,
                    RetrievedContext.context_id,
                    RetrievedContext.content,
                    RetrievedContext.score,
                    RetrievedContext.metadata_,
                )
                .where(RetrievedContext.trace_id.in_(ids))
                .order_by(RetrievedContext.trace_id, RetrievedContext.position)
            ).all()
        by_trace: dict[str, list[ContextRecord]] = {}
        for c in contexts:
            by_trace.setdefault(c.trace_id, []).append(
                ContextRecord(content=c.content, id=c.context_id, score=c.score, metadata=c[4])
            )
        result = {}
        for t in traces:
            ctx = by_trace.get(t.trace_id, [])
            ids_known = [c.id for c in ctx if c.id is not None]
            # No contexts at all is an empty retrieval (recall 0); contexts without ids mean
            # the retriever gives no ids, so the id-based variant has nothing to compare.
            retrieved_ids: list[str] | None = ids_known if (ids_known or not ctx) else None
            # Contexts that all lack text (a span that gave ids only) are no contexts to read:
            # the variants needing them skip the trace instead of scoring empty documents 0.
            texts: list[str] | None = [c.content for c in ctx]
            if ctx and not any(texts or ()):
                texts = None
            result[t.trace_id] = TraceInputs(
                trace_id=t.trace_id,
                app_name=t.app_name,
                started_at=t.started_at,
                user_input=t.user_input,
                response=t.response,
                retrieved_contexts=texts,
                retrieved_context_ids=retrieved_ids,
                reference=t.reference,
                reference_contexts=t.reference_contexts,
                reference_context_ids=t.reference_context_ids,
                otel_trace_id=t.otel_trace_id,
                otel_span_id=t.otel_span_id,
            )
        return result

    def queue_stats_by_metric(self) -> dict[str, QueueStats]:
        """:meth:`queue_stats` per metric, for every metric with jobs and every known one (at
        zero): the queue as a property of the database, whichever workers run."""
        states = [JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.WAITING, JobStatus.FAILED]
        counts: dict[str, dict[str, int]] = {metric: {} for metric in self.specs}
        oldest: dict[str, Any] = {}
        with self.engine.connect() as conn:
            for metric, status, number in conn.execute(
                select(ScoringJob.metric, ScoringJob.status, func.count())
                .where(ScoringJob.status.in_(states))
                .group_by(ScoringJob.metric, ScoringJob.status)
            ).tuples():
                counts.setdefault(metric, {})[status] = int(number)
            # Ages are measured on the clock that set the due times (the database's, on
            # Postgres), so a worker whose own clock is off reports the real lag.
            current = self.dialect.clock(conn)
            for metric, first in conn.execute(
                select(ScoringJob.metric, func.min(ScoringJob.run_at))
                .where(ScoringJob.status == JobStatus.QUEUED, ScoringJob.run_at <= current)
                .group_by(ScoringJob.metric)
            ).tuples():
                oldest[metric] = first
        result = {}
        for metric, by_state in counts.items():
            due_since: datetime | None = oldest.get(metric)
            age = None
            if due_since is not None:
                if due_since.tzinfo is None:
                    due_since = due_since.replace(tzinfo=timezone.utc)
                age = max(0.0, (current - due_since).total_seconds())
            result[metric] = QueueStats(
                due=by_state.get(JobStatus.QUEUED, 0),
                running=by_state.get(JobStatus.RUNNING, 0),
                waiting=by_state.get(JobStatus.WAITING, 0),
                failed=by_state.get(JobStatus.FAILED, 0),
                oldest_due_age_s=age,
            )
        return result

    def judge_spend(self, model: str, since: datetime) -> tuple[int, float]:
        """Prompt plus completion tokens, and US dollars, of the results judged by ``model``
        and stored since ``since`` (by every worker)."""
        with self.engine.connect() as conn:
            tokens, usd = conn.execute(
                select(
                    func.coalesce(
                        func.sum(
                            func.coalesce(Score.prompt_tokens, 0)
                            + func.coalesce(Score.completion_tokens, 0)
                        ),
                        0,
                    ),
                    func.coalesce(func.sum(Score.cost_usd), 0.0),
                ).where(Score.model == model, Score.scored_at >= since)
            ).one()
        return int(tokens or 0), float(usd or 0.0)

    def queue_stats(self, metrics: Sequence[str] | None = None) -> QueueStats:
        """Counts of due, running, waiting and failed jobs, and the oldest due job's age.

        ``metrics`` limits the figures to those variants (a worker reports the lag of what it
        scores, not of variants nobody is configured to score).
        """
        only: list[ColumnElement[bool]] = []
        if metrics is not None:
            only.append(ScoringJob.metric.in_(list(metrics)))
        with self.engine.connect() as conn:
            counts: dict[str, int] = {}
            for status, number in conn.execute(
                select(ScoringJob.status, func.count())
                .where(
                    ScoringJob.status.in_(
                        [
                            JobStatus.QUEUED,
                            JobStatus.RUNNING,
                            JobStatus.WAITING,
                            JobStatus.FAILED,
                        ]
                    ),
                    *only,
                )
                .group_by(ScoringJob.status)
            ).tuples():
                counts[status] = int(number)
            current = self.dialect.clock(conn)
            oldest = conn.scalar(
                select(func.min(ScoringJob.run_at)).where(
                    ScoringJob.status == JobStatus.QUEUED, ScoringJob.run_at <= current, *only
                )
            )
        age = None
        if oldest is not None:
            if oldest.tzinfo is None:
                oldest = oldest.replace(tzinfo=timezone.utc)
            age = max(0.0, (current - oldest).total_seconds())
        return QueueStats(
            due=int(counts.get(JobStatus.QUEUED, 0)),
            running=int(counts.get(JobStatus.RUNNING, 0)),
            waiting=int(counts.get(JobStatus.WAITING, 0)),
            failed=int(counts.get(JobStatus.FAILED, 0)),
            oldest_due_age_s=age,
        )


# -- clocks -------------------------------------------------------------------------------------

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
