"""Jobs coming into the queue: created with their traces (one per trace and metric), released
by a late reference, skipped when none came before its time-to-live.

Which jobs exist is decided by the :class:`~.contracts.JobSpec` values the repository is given:
one job per (trace, metric, version); a job whose spec waits for a reference the trace does not
have yet is ``waiting`` until ``attach_reference`` brings it or its time-to-live runs out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Engine,
    and_,
    case,
    literal,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.sql.elements import TextClause

from recalltrace.storage import summary_cache
from recalltrace.storage._dialect import Dialect, utcnow
from recalltrace.storage.contracts import (
    JobSpec,
    SkippedJob,
    TraceNotFound,
    check_metric,
)
from recalltrace.storage.models import JobStatus, PoolDocument, Score, ScoringJob, Trace
from recalltrace.storage.pools import attach_pool
from recalltrace.storage.records import ReferenceUpdate, TraceRecord

DEFAULT_REFERENCE_TTL = timedelta(hours=24)


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
            if spec.needs_pool and getattr(r, "pool_contexts", None) is None:
                continue  # created when a pool is stored (attach_reference)
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


class JobIntake:
    """Creating jobs and releasing or skipping waiting ones (part of :class:`~.queue.JobQueue`)."""

    engine: Engine
    dialect: Dialect
    specs: Mapping[str, JobSpec]
    metrics: list[JobSpec]
    reference_ttl: timedelta
    max_attempts: int

    def spec(self, metric: str) -> JobSpec:
        """The job specification of ``metric``; raises ``UnknownMetric`` naming the known."""
        return self.specs[check_metric(metric, self.specs)]

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
                if info.needs_pool:
                    conditions.append(
                        select(PoolDocument.trace_id)
                        .where(PoolDocument.trace_id == Trace.trace_id)
                        .exists()
                    )
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
            pooled = 0
            if update_.pool_contexts is not None:
                attach_pool(conn, update_.trace_id, update_.pool_contexts, update_.pool_source)
                pooled = self._create_pool_jobs(conn, update_.trace_id)
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
                return pooled
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
            return (released or 0) + pooled

    def _create_pool_jobs(self, conn: Any, trace_id: str) -> int:
        """The jobs of the configured specs that need a pool, for a trace whose pool was just
        stored (existing ones are kept); returns how many were created. A specification that
        needs both a pool and a reference is not supported (its job would not wait)."""
        specs = [spec for spec in self.metrics if spec.needs_pool and not spec.needs_reference]
        if not specs:
            return 0
        now = self.dialect.clock(conn)
        rows = [
            {
                "trace_id": trace_id,
                "metric": spec.metric,
                "version": spec.version,
                "status": JobStatus.QUEUED,
                "attempts": 0,
                "run_at": now,
                "expires_at": None,
                "created_at": now,
                "updated_at": now,
            }
            for spec in specs
        ]
        created = len(
            conn.execute(
                self.dialect.insert(ScoringJob.__table__)
                .on_conflict_do_nothing()
                .returning(ScoringJob.__table__.c.id),
                rows,
            ).all()
        )
        if created:
            self.dialect.notify(conn)
        return created

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
            traces = trace_rows(conn, {r.trace_id for r in rows})
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


def trace_rows(conn: Any, trace_ids: Iterable[str]) -> dict[str, Any]:
    """The columns a finished or skipped job's score carries from its trace, by trace id."""
    return {
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
            ).where(Trace.trace_id.in_(set(trace_ids)))
        )
    }
