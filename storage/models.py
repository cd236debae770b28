"""SQLAlchemy 2.0 typed models: traces, retrieved contexts, scoring jobs and scores.

Timestamps are stored in UTC and always read back timezone-aware, on SQLite as on Postgres.
JSON columns are JSONB on Postgres.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

JSONType = JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")
# Arrays where the caches are kept (Postgres); JSON elsewhere, where no row is ever stored.
TextArray = JSON(none_as_null=True).with_variant(ARRAY(Text), "postgresql")
FloatArray = JSON(none_as_null=True).with_variant(ARRAY(Float), "postgresql")
# SQLite only auto-increments INTEGER PRIMARY KEY columns, not BIGINT ones.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every backend."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: timestamps must be timezone-aware")
        value = value.astimezone(timezone.utc)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


class Base(DeclarativeBase):
    """Declarative base of every recalltrace table."""


class JobStatus:
    """Values of ``scoring_jobs.status``."""

    WAITING = "waiting"
    """Needs a reference that has not arrived yet; ``expires_at`` bounds the wait."""
    QUEUED = "queued"
    """Due at ``run_at``."""
    RUNNING = "running"
    """Claimed by ``locked_by`` until ``lease_expires_at``."""
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"
    """Ended by ``recalltrace jobs cancel``: never scored, no longer pending."""

    ALL = (WAITING, QUEUED, RUNNING, DONE, FAILED, SKIPPED, CANCELLED)


class Trace(Base):
    """One finished RAG request. ``trace_id`` is the record's own id (one per request); the
    OpenTelemetry trace and span ids it ran under are kept beside it for linking."""

    __tablename__ = "traces"

    trace_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    app_name: Mapped[str] = mapped_column(String(200))
    service_name: Mapped[str] = mapped_column(String(200))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    duration_ms: Mapped[float] = mapped_column(Float)
    user_input: Mapped[str | None] = mapped_column(Text)
    response: Mapped[str | None] = mapped_column(Text)
    reference: Mapped[str | None] = mapped_column(Text)
    reference_contexts: Mapped[list[str] | None] = mapped_column(JSONType)
    reference_context_ids: Mapped[list[str] | None] = mapped_column(JSONType)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSONType)
    error: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    notes: Mapped[list[str]] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    otel_trace_id: Mapped[str | None] = mapped_column(String(32))
    """The OpenTelemetry trace id the request ran in; several records may share one."""
    otel_span_id: Mapped[str | None] = mapped_column(String(16))
    """The span id of the request's root span."""
    release: Mapped[str | None] = mapped_column(String(200))
    """The application's release (version) that served the request."""
    environment: Mapped[str | None] = mapped_column(String(200))
    """The deployment environment (``production``, ``staging``)."""
    user_id: Mapped[str | None] = mapped_column(String(200))
    session_id: Mapped[str | None] = mapped_column(String(200))
    tags: Mapped[list[str] | None] = mapped_column(JSONType)
    """The request's tags (also one row each in ``trace_tags``, for filtering)."""

    __table_args__ = (
        Index("ix_traces_started_at", "started_at"),
        Index("ix_traces_app_started_at", "app_name", "started_at"),
        Index("ix_traces_otel_trace_id", "otel_trace_id"),
        Index("ix_traces_release_started_at", "release", "started_at"),
        Index("ix_traces_environment_started_at", "environment", "started_at"),
        Index("ix_traces_user_id_started_at", "user_id", "started_at"),
        Index("ix_traces_session_id_started_at", "session_id", "started_at"),
        # Counting the traces that asked one question (``scores worst --per-question``); a
        # hash index holds questions of any length.
        Index("ix_traces_user_input", "user_input", postgresql_using="hash"),
    )


class TraceTag(Base):
    """One tag of a trace (the tags are also a list on the trace)."""

    __tablename__ = "trace_tags"

    # Written only with its trace; deleted with it by a trigger (migration 0010), not a
    # foreign key, which would look the trace up and lock it again for every row written.
    trace_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tag: Mapped[str] = mapped_column(String(200), primary_key=True)

    __table_args__ = (Index("ix_trace_tags_tag", "tag", "trace_id"),)


class RetrievedContext(Base):
    """One retrieved context of a trace, in retrieval order."""

    __tablename__ = "retrieved_contexts"

    # Written only with its trace; deleted with it by a trigger (migration 0010).
    trace_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    context_id: Mapped[str | None] = mapped_column(String(500))
    content: Mapped[str] = mapped_column(Text)
    score: Mapped[float | None] = mapped_column(Float)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSONType)


class ScoringJob(Base):
    """One (trace, metric, version) to score; also the queue that coordinates workers."""

    __tablename__ = "scoring_jobs"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    # Deleted with its trace by a trigger (migration 0010); written with it, or for a stored
    # trace (a late reference, a rescore).
    trace_id: Mapped[str] = mapped_column(String(32))
    metric: Mapped[str] = mapped_column(String(64))
    version: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    run_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    first_transient_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    locked_by: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        UniqueConstraint("trace_id", "metric", "version", name="uq_scoring_jobs_trace_metric"),
        # Partial indexes keep the claim and the lease sweep cheap however many finished jobs
        # the table holds.
        Index(
            "ix_scoring_jobs_due",
            "run_at",
            "id",
            postgresql_where=text("status = 'queued'"),
            sqlite_where=text("status = 'queued'"),
        ),
        Index(
            "ix_scoring_jobs_leases",
            "lease_expires_at",
            postgresql_where=text("status = 'running'"),
            sqlite_where=text("status = 'running'"),
        ),
        Index(
            "ix_scoring_jobs_waiting",
            "expires_at",
            postgresql_where=text("status = 'waiting'"),
            sqlite_where=text("status = 'waiting'"),
        ),
        Index(
            "ix_scoring_jobs_failed",
            "updated_at",
            postgresql_where=text("status = 'failed'"),
            sqlite_where=text("status = 'failed'"),
        ),
    )


class Score(Base):
    """One variant's result on one trace; unique on (trace, metric, version)."""

    __tablename__ = "scores"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    trace_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("traces.trace_id", ondelete="CASCADE")
    )
    metric: Mapped[str] = mapped_column(String(64))
    version: Mapped[str] = mapped_column(String(32))
    # Copied from the trace so that history queries never need a join at 10M rows.
    app_name: Mapped[str] = mapped_column(String(200))
    trace_started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    status: Mapped[str] = mapped_column(String(16))
    value: Mapped[float | None] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(Text)
    details: Mapped[dict[str, Any]] = mapped_column(JSONType)
    model: Mapped[str | None] = mapped_column(String(200))
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    cost_usd: Mapped[float | None] = mapped_column(Float)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    scored_at: Mapped[datetime] = mapped_column(UTCDateTime())
    release: Mapped[str | None] = mapped_column(String(200))
    """The trace's release, copied when the score is written (for comparing releases)."""
    environment: Mapped[str | None] = mapped_column(String(200))
    """The trace's environment, copied likewise."""

    __table_args__ = (
        UniqueConstraint("trace_id", "metric", "version", name="uq_scores_trace_metric_version"),
        # The history queries read (metric, version, time range) and need only these columns,
        # so on Postgres they are answered by index-only scans.
        Index(
            "ix_scores_metric_version_started",
            "metric",
            "version",
            "trace_started_at",
            postgresql_include=["app_name", "status", "value"],
        ),
        Index(
            "ix_scores_app_metric_version_started",
            "app_name",
            "metric",
            "version",
            "trace_started_at",
        ),
        Index(
            "ix_scores_metric_version_value",
            "metric",
            "version",
            "value",
            postgresql_where=text("status = 'scored'"),
            sqlite_where=text("status = 'scored'"),
        ),
        # A judge budget sums the spend of one model since the period began.
        Index("ix_scores_model_scored_at", "model", "scored_at"),
        # The live edges of a judge-cost window (its ended hours come from ``cost_cache``).
        Index("ix_scores_scored_at", "scored_at"),
        # Comparing releases or environments reads this index only (Postgres).
        Index(
            "ix_scores_metric_version_started_attrs",
            "metric",
            "version",
            "trace_started_at",
            postgresql_include=["release", "environment", "status", "value"],
        ),
    )


class Label(Base):
    """A person's judgement of one trace for one variant: the score they would give, and
    optionally their verdict on each claim, with a note."""

    __tablename__ = "labels"

    trace_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("traces.trace_id", ondelete="CASCADE"), primary_key=True
    )
    metric: Mapped[str] = mapped_column(String(64), primary_key=True)
    labeller: Mapped[str] = mapped_column(String(200), primary_key=True)
    value: Mapped[float] = mapped_column(Float)
    claims: Mapped[list[Any] | None] = mapped_column(JSONType)
    note: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (Index("ix_labels_metric", "metric", "trace_id"),)


class WorkerSeen(Base):
    """A worker process and the variants it scores, as it last reported itself.

    Workers refresh their row while they run, so "which variants does any worker serve" is a
    fact of the database, true across hosts; rows of stopped workers stay (their
    ``last_seen_at`` says when they last ran) until they are older than a week.
    """

    __tablename__ = "workers"

    worker_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    host: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column(Integer)
    metrics: Mapped[list[str]] = mapped_column(JSONType)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime())
    stopped: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    """True once the worker stopped cleanly (a cron ``--once`` run, a drained shutdown)."""


class SummaryCache(Base):
    """Summary rows of complete buckets, so long windows read a few rows, not every score.

    A row is removed whenever a score of its bucket and metric (any version) is written or
    deleted; only buckets wholly in the past are cached.
    """

    __tablename__ = "summary_cache"

    bucket: Mapped[str] = mapped_column(String(8), primary_key=True)
    bucket_start: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    metric: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[str] = mapped_column(String(32), primary_key=True)
    app_name: Mapped[str] = mapped_column(String(200), primary_key=True)
    """The app filter the row was computed for; empty for every app."""
    n_scored: Mapped[int] = mapped_column(Integer)
    mean: Mapped[float | None] = mapped_column(Float)
    p10: Mapped[float | None] = mapped_column(Float)
    p50: Mapped[float | None] = mapped_column(Float)
    p90: Mapped[float | None] = mapped_column(Float)
    n_skipped: Mapped[int] = mapped_column(Integer)
    n_failed: Mapped[int] = mapped_column(Integer)
    computed_at: Mapped[datetime] = mapped_column(UTCDateTime())


class GroupCache(Base):
    """Per ended hour of trace start, variant version, scope and grouping attribute: each
    group's scored count, sum, sum of squares and count of values other than 0 and 1 (Postgres
    only), the additive sums ``scores compare`` reads.

    ``scope`` is the filter the row was computed for (see ``storage.history._scope_key``);
    ``missing`` marks the group of traces without the attribute (``group_value`` is then
    empty). Rows are removed with the summary cache's (see :class:`SummaryCache`).
    """

    __tablename__ = "group_cache"

    bucket_start: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    metric: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[str] = mapped_column(String(32), primary_key=True)
    scope: Mapped[str] = mapped_column(String(200), primary_key=True)
    attribute: Mapped[str] = mapped_column(String(32), primary_key=True)
    missing: Mapped[bool] = mapped_column(Boolean, primary_key=True)
    group_value: Mapped[str] = mapped_column(String(200), primary_key=True)
    n: Mapped[int] = mapped_column(Integer)
    total: Mapped[float] = mapped_column(Float)
    total_sq: Mapped[float] = mapped_column(Float)
    fractional: Mapped[int] = mapped_column(Integer)
    first_started: Mapped[datetime] = mapped_column(UTCDateTime())
    computed_at: Mapped[datetime] = mapped_column(UTCDateTime())


class DiagnoseCache(Base):
    """Per ended hour of trace start, variant version and scope (app and release or
    environment filters, as ``GroupCache.scope``): what ``scores diagnose`` sums (Postgres
    only, see ``storage.diagnose_rollups``).

    ``section`` says what a row holds: ``slice`` (``key`` an attribute such as ``app`` or
    ``document.source``, ``value`` one of its values, NULL for the traces without it: the
    scored count, sum and sum of squares, and for documents the lowest-scoring traces),
    ``reference`` (``key`` ``id`` or ``context``, ``value`` the reference: how many requests
    needed it, how many retrieved it, recent ones that missed it), ``claim`` (``value`` the
    claim as grouped, ``label`` its first statement: judged, unsupported, recent unsupported
    traces), ``overflow`` (``key`` a slice attribute with too many values that hour to keep:
    read from the scores) and ``hour`` (the hour is stored). Example traces come with their
    sort keys (``example_keys``, ascending), so hours merge into the window's order. Rows are
    removed with the summary cache's (see :class:`SummaryCache`).
    """

    __tablename__ = "diagnose_cache"
    __table_args__ = (
        Index("ix_diagnose_cache_hour", "metric", "version", "scope", "section", "bucket_start"),
        Index("ix_diagnose_cache_metric_hour", "metric", "bucket_start"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    bucket_start: Mapped[datetime] = mapped_column(UTCDateTime())
    metric: Mapped[str] = mapped_column(String(64))
    version: Mapped[str] = mapped_column(String(32))
    scope: Mapped[str] = mapped_column(String(200))
    section: Mapped[str] = mapped_column(String(16))
    key: Mapped[str] = mapped_column(Text)
    value: Mapped[str | None] = mapped_column(Text)
    label: Mapped[str | None] = mapped_column(Text)
    n: Mapped[int] = mapped_column(BigInteger)
    total: Mapped[float] = mapped_column(Float)
    total_sq: Mapped[float] = mapped_column(Float)
    example_ids: Mapped[list[str] | None] = mapped_column(TextArray)
    example_keys: Mapped[list[float] | None] = mapped_column(FloatArray)
    computed_at: Mapped[datetime] = mapped_column(UTCDateTime())


class CostCache(Base):
    """Per ended hour of scoring, scope (app and filters, as ``GroupCache.scope``), variant
    and judge model: the results' count, tokens and money (Postgres only), what ``scores
    cost`` reads.

    Rows are removed in the transaction that writes, replaces or deletes a score stored in
    their hour, and all of them when retention deletes traces.
    """

    __tablename__ = "cost_cache"

    hour: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    scope: Mapped[str] = mapped_column(String(200), primary_key=True)
    metric: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    n: Mapped[int] = mapped_column(Integer)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    completion_tokens: Mapped[int] = mapped_column(BigInteger)
    cost_usd: Mapped[float | None] = mapped_column(Float)
    unpriced: Mapped[int] = mapped_column(Integer)
    computed_at: Mapped[datetime] = mapped_column(UTCDateTime())


class JudgeCall(Base):
    """A judge call's answer, stored before the worker uses it, so a job retried after its
    worker died does not pay for the same call again (``storage.judge_calls``).

    ``key`` is the caller's digest of the request, ``scope`` names who paid for it (opaque to
    storage), ``answer`` the caller's JSON. Rows go when their scope is forgotten (its job's
    result is stored) or when they are older than the retention.
    """

    __tablename__ = "judge_calls"
    __table_args__ = (
        Index("ix_judge_calls_scope", "scope"),
        Index("ix_judge_calls_created_at", "created_at"),
    )

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    scope: Mapped[str] = mapped_column(String(200))
    answer: Mapped[dict[str, Any]] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class PoolDocument(Base):
    """One document of a trace's pool (a deeper or other retrieval, run after the request), in
    the pool's rank order; ``source`` names the pool. Written late, like a reference."""

    __tablename__ = "pool_documents"

    trace_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("traces.trace_id", ondelete="CASCADE"), primary_key=True
    )
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    context_id: Mapped[str | None] = mapped_column(String(500))
    content: Mapped[str] = mapped_column(Text)
    score: Mapped[float | None] = mapped_column(Float)
    source: Mapped[str | None] = mapped_column(String(200))


class Judgment(Base):
    """A judge answer that depends only on its inputs, kept by the caller's digest of them
    (opaque JSON to storage), so the same inputs never cost a second call."""

    __tablename__ = "judgments"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    answer: Mapped[dict[str, Any]] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
