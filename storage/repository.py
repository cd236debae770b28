"""The repository: write traces, create and claim scoring jobs, write scores.

Postgres is the production store and the queue that coordinates any number of workers: a claim
is one ``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED)`` statement, so two workers
never take the same job. SQLite is correct for one worker.

Times that decide who owns a job (due times, leases) come from the database clock on Postgres,
so workers on hosts with skewed clocks still agree; SQLite uses the local clock.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from sqlalchemy import (
    ColumnElement,
    Engine,
    and_,
    case,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import TextClause

from recalltrace.scorers.catalog import CATALOG, REFERENCE_INPUTS, MetricInfo, metric_info
from recalltrace.storage.db import create_engine_from_url, is_postgres
from recalltrace.storage.models import (
    JobStatus,
    RetrievedContext,
    Score,
    ScoringJob,
    SummaryCache,
    Trace,
    UTCDateTime,
)
from recalltrace.storage.records import ContextRecord, ReferenceUpdate, TraceRecord

logger = logging.getLogger("recalltrace.storage")

NOTIFY_CHANNEL = "recalltrace_jobs"
"""Postgres channel on which new due jobs are announced to idle workers."""

SUMMARY_LOCK_KEY = 0x7265_6361_6C6C
"""Postgres advisory lock between score writers (shared) and summary-cache fills (exclusive).

A fill computes and stores bucket summaries while holding it exclusively, so no score can be
committed into a bucket between the computation and the row being stored."""

DEFAULT_REFERENCE_TTL = timedelta(hours=24)
DEFAULT_MAX_ATTEMPTS = 3


class TraceNotFound(LookupError):
    """No trace is stored under the given id."""


class ScoreLike(Protocol):
    """What :meth:`Repository.finish_job` needs of a score (``scorers.ScoreResult`` fits)."""

    @property
    def metric(self) -> str: ...
    @property
    def value(self) -> float | None: ...
    @property
    def status(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def details(self) -> Mapping[str, Any]: ...
    @property
    def model(self) -> str | None: ...
    @property
    def prompt_tokens(self) -> int | None: ...
    @property
    def completion_tokens(self) -> int | None: ...
    @property
    def cost_usd(self) -> float | None: ...
    @property
    def latency_ms(self) -> float | None: ...
    @property
    def version(self) -> str: ...


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job a worker holds a lease on."""

    id: int
    trace_id: str
    metric: str
    version: str
    attempts: int
    first_transient_at: datetime | None
    created_at: datetime


@dataclass(slots=True)
class TraceInputs:
    """A stored trace, shaped as scorer inputs."""

    trace_id: str
    app_name: str
    started_at: datetime
    user_input: str | None
    response: str | None
    retrieved_contexts: list[str]
    retrieved_context_ids: list[str] | None
    reference: str | None
    reference_contexts: list[str] | None
    reference_context_ids: list[str] | None

    def scorer_inputs(self) -> dict[str, Any]:
        """Keyword inputs for ``Scorer.ascore`` (the spec's names)."""
        return {
            "user_input": self.user_input,
            "response": self.response,
            "retrieved_contexts": self.retrieved_contexts,
            "retrieved_context_ids": self.retrieved_context_ids,
            "reference": self.reference,
            "reference_contexts": self.reference_contexts,
            "reference_context_ids": self.reference_context_ids,
        }


@dataclass(frozen=True, slots=True)
class QueueStats:
    """The lag a user alerts on."""

    due: int
    running: int
    waiting: int
    failed: int
    oldest_due_age_s: float | None


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _json_safe(value: Any) -> Any:
    """Make ``value`` JSON-serialisable; NaN and infinities become ``None``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_json_safe(v) for v in value]
    return str(value)


# Characters no backend can store in text: Postgres refuses NUL in text and JSON, and lone
# surrogates (non-UTF-8 bytes decoded with ``surrogateescape``) cannot be encoded as UTF-8.
UNSTORABLE_TEXT = re.compile("[\x00\ud800-\udfff]")
_UNSTORABLE_REPLACEMENT = "\ufffd"


def _storable_text(text: str) -> tuple[str, int]:
    """``text`` with unstorable characters replaced by U+FFFD, and how many there were."""
    if "\x00" not in text and (text.isascii() or UNSTORABLE_TEXT.search(text) is None):
        return text, 0
    return UNSTORABLE_TEXT.subn(_UNSTORABLE_REPLACEMENT, text)


def _storable_json(value: Any) -> tuple[Any, int]:
    """A JSON-safe ``value`` whose strings (keys included) are all storable."""
    if isinstance(value, str):
        return _storable_text(value)
    if isinstance(value, dict):
        replaced = 0
        result: dict[str, Any] = {}
        for key, item in value.items():
            key_text, key_count = _storable_text(str(key))
            item_value, item_count = _storable_json(item)
            result[key_text] = item_value
            replaced += key_count + item_count
        return (result, replaced) if replaced else (value, 0)
    if isinstance(value, list):
        items = [_storable_json(item) for item in value]
        replaced = sum(count for _, count in items)
        return ([item for item, _ in items], replaced) if replaced else (value, 0)
    return value, 0


# Lengths of the bounded text columns a record fills (storage.models).
_NAME_LIMITS = {"app_name": 200, "service_name": 200}
_CONTEXT_ID_LIMIT = 500
_MODEL_LIMIT = 200


def _storable_record(record: TraceRecord) -> TraceRecord:
    """``record`` with every character a backend cannot store replaced, and over-long names
    and ids cut to their column's length, each change noted on the record.

    One unstorable value would otherwise fail the whole batch's transaction on every retry, and
    the good records written with it would be dropped too.
    """
    notes = list(record.notes)
    changes: dict[str, Any] = {}

    def clean(value: Any, where: str) -> tuple[Any, bool]:
        cleaned, count = _storable_json(value)
        if count:
            notes.append(
                f"replaced {count} unstorable character(s) (NUL, lone surrogates) in {where}"
            )
        return cleaned, bool(count)

    for name in ("app_name", "service_name", "user_input", "response", "reference"):
        value = getattr(record, name)
        if value is not None:
            cleaned, changed = clean(value, name)
            limit = _NAME_LIMITS.get(name)
            if limit is not None and len(cleaned) > limit:
                notes.append(f"truncated {name} from {len(cleaned)} to {limit} characters")
                cleaned, changed = cleaned[:limit], True
            if changed:
                changes[name] = cleaned
    for name in ("reference_contexts", "reference_context_ids"):
        value = getattr(record, name)
        if value is not None:
            cleaned, changed = clean(list(value), name)
            if changed:
                changes[name] = cleaned
    if record.metadata:
        cleaned, changed = clean(_json_safe(record.metadata), "metadata")
        if changed:
            changes["metadata"] = cleaned
    contexts = []
    contexts_changed = False
    for index, context in enumerate(record.retrieved_contexts):
        where = f"retrieved_contexts[{index}]"
        content, content_changed = clean(context.content, f"{where}.content")
        context_id, id_changed = (
            (None, False) if context.id is None else clean(str(context.id), f"{where}.id")
        )
        if context_id is not None and len(context_id) > _CONTEXT_ID_LIMIT:
            notes.append(
                f"truncated {where}.id from {len(context_id)} to {_CONTEXT_ID_LIMIT} characters"
            )
            context_id, id_changed = context_id[:_CONTEXT_ID_LIMIT], True
        metadata, metadata_changed = (
            clean(_json_safe(context.metadata), f"{where}.metadata")
            if context.metadata
            else (context.metadata, False)
        )
        if content_changed or id_changed or metadata_changed:
            contexts_changed = True
            context = dataclasses.replace(
                context, content=content, id=context_id, metadata=metadata
            )
        contexts.append(context)
    if contexts_changed:
        changes["retrieved_contexts"] = contexts
    cleaned_notes, notes_changed = _storable_json(notes)
    if notes_changed or len(notes) != len(record.notes):
        changes["notes"] = cleaned_notes
    return dataclasses.replace(record, **changes) if changes else record


def _has_input(name: str, record: TraceRecord | Trace) -> bool:
    """Whether a reference-type input is present (empty strings count as present)."""
    return getattr(record, name) is not None


def _initial_status(info: MetricInfo, record: TraceRecord | Trace) -> str:
    missing_reference = [
        n for n in info.needs if n in REFERENCE_INPUTS and not _has_input(n, record)
    ]
    return JobStatus.WAITING if missing_reference else JobStatus.QUEUED


def _bucket_starts(moment: datetime) -> list[tuple[str, datetime]]:
    """The hour and day buckets (UTC) that contain ``moment``."""
    utc = moment.astimezone(timezone.utc)
    hour = utc.replace(minute=0, second=0, microsecond=0)
    return [("hour", hour), ("day", hour.replace(hour=0))]


class Repository:
    """Traces, scoring jobs and scores on one database.

    ``metrics`` are the variants jobs are created for when traces are written (default: all).
    ``reference_ttl`` bounds how long a job waits for a late reference before it is skipped.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        metrics: Sequence[str] | None = None,
        reference_ttl: timedelta = DEFAULT_REFERENCE_TTL,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> None:
        self.engine = engine
        self.is_postgres = is_postgres(engine)
        keys = list(metrics) if metrics is not None else list(CATALOG)
        self.metrics: list[MetricInfo] = [metric_info(k) for k in keys]
        if reference_ttl <= timedelta(0):
            raise ValueError("reference_ttl must be positive")
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.reference_ttl = reference_ttl
        self.max_attempts = max_attempts
        self._score_upsert = self._build_score_upsert()

    # -- clock --------------------------------------------------------------------------
    def _db_now(self) -> Any:
        """The database's clock on Postgres; the local UTC clock on SQLite."""
        if self.is_postgres:
            return func.now()
        return _utcnow()

    def _db_now_sql(self, offset: timedelta = timedelta(0)) -> Any:
        """Like :meth:`_db_now` plus ``offset``, always as a SQL expression (for SELECTs)."""
        if self.is_postgres:
            return func.now() + offset if offset else func.now()
        return literal(_utcnow() + offset, UTCDateTime())

    def _insert(self, table: Any) -> Any:
        return (pg_dialect.insert if self.is_postgres else sqlite_dialect.insert)(table)

    def _build_score_upsert(self) -> Any:
        """INSERT of a score; returns the rows written.

        An existing ``scored`` result is final. A ``skipped`` or ``failed`` one is replaced by a
        result of another status: a late reference made the trace scoreable, or another run of
        the same job (its lease ran out while it ran) got further. The same status again changes
        nothing, so a job finished twice is stored once. (:meth:`retry_jobs` deletes the failed
        results of the jobs it queues again, so their next result is stored whatever it is.)
        """
        insert = self._insert(Score.__table__)
        stored = Score.__table__.c.status
        return insert.on_conflict_do_update(
            index_elements=["trace_id", "metric", "version"],
            set_={k: insert.excluded[k] for k in _REPLACEABLE_SCORE_COLUMNS},
            # Plain comparisons: an IN list would be an expanding parameter, which the
            # executemany this statement runs as cannot take.
            where=and_(
                or_(stored == "skipped", stored == "failed"), insert.excluded.status != stored
            ),
        ).returning(Score.__table__.c.trace_id, Score.__table__.c.metric, Score.__table__.c.version)

    # -- writing traces -----------------------------------------------------------------
    def write_traces(self, records: Sequence[TraceRecord]) -> None:
        """Write a batch of trace records, their contexts and their jobs in one transaction.

        Idempotent on ``trace_id``: a record already stored is left as it is, so a writer may
        resend a batch whose commit it could not confirm.
        """
        if not records:
            return
        unique: dict[str, TraceRecord] = {}
        for record in records:
            unique.setdefault(record.trace_id, record)
        batch = [_storable_record(record) for record in unique.values()]
        now = _utcnow()
        if self.is_postgres:
            self._write_traces_postgres(batch, now)
        else:
            self._write_traces_rows(batch, now)

    def _trace_rows(self, batch: Sequence[TraceRecord], now: datetime) -> list[dict[str, Any]]:
        return [
            {
                "trace_id": r.trace_id,
                "app_name": r.app_name,
                "service_name": r.service_name,
                "started_at": r.started_at,
                "duration_ms": r.duration_ms,
                "user_input": r.user_input,
                "response": r.response,
                "reference": r.reference,
                "reference_contexts": r.reference_contexts,
                "reference_context_ids": r.reference_context_ids,
                "metadata": _json_safe(r.metadata),
                "error": r.error,
                "notes": list(r.notes),
                "created_at": now,
            }
            for r in batch
        ]

    @staticmethod
    def _context_rows(batch: Sequence[TraceRecord]) -> list[dict[str, Any]]:
        return [
            {
                "trace_id": r.trace_id,
                "position": i,
                "context_id": None if c.id is None else str(c.id),
                "content": c.content,
                "score": c.score if c.score is None or math.isfinite(c.score) else None,
                "metadata": _json_safe(c.metadata),
            }
            for r in batch
            for i, c in enumerate(r.retrieved_contexts)
        ]

    def _job_rows(
        self, batch: Iterable[TraceRecord | Trace], now: datetime
    ) -> list[dict[str, Any]]:
        expires = now + self.reference_ttl
        rows = []
        for r in batch:
            for info in self.metrics:
                status = _initial_status(info, r)
                rows.append(
                    {
                        "trace_id": r.trace_id,
                        "metric": info.key,
                        "version": info.version,
                        "status": status,
                        "attempts": 0,
                        "run_at": now,
                        "expires_at": expires if status == JobStatus.WAITING else None,
                        "created_at": now,
                        "updated_at": now,
                    }
                )
        return rows

    def _write_traces_postgres(self, batch: Sequence[TraceRecord], now: datetime) -> None:
        try:
            self._copy_batch(batch, now)
        except _DuplicateTrace:
            # Some of the batch is stored already (a resend): write the rest row by row
            # through INSERT ... ON CONFLICT, which skips what exists.
            self._write_traces_rows(batch, now)

    def _copy_batch(self, batch: Sequence[TraceRecord], now: datetime) -> None:
        from psycopg import errors as pg_errors
        from psycopg.types.json import Jsonb

        def jsonb(value: Any) -> Any:
            return None if value is None else Jsonb(value)

        job_rows = self._job_rows(batch, now)
        with self.engine.begin() as conn:
            cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
            try:
                with cursor.copy(
                    "COPY traces (trace_id, app_name, service_name, started_at, duration_ms,"
                    " user_input, response, reference, reference_contexts,"
                    " reference_context_ids, metadata, error, notes, created_at)"
                    " FROM STDIN (FORMAT BINARY)"
                ) as copy:
                    copy.set_types(_TRACE_COPY_TYPES)
                    for r in batch:
                        copy.write_row(
                            (
                                r.trace_id,
                                r.app_name,
                                r.service_name,
                                r.started_at,
                                float(r.duration_ms),
                                r.user_input,
                                r.response,
                                r.reference,
                                jsonb(r.reference_contexts),
                                jsonb(r.reference_context_ids),
                                Jsonb(_json_safe(r.metadata)),
                                bool(r.error),
                                Jsonb(list(r.notes)),
                                now,
                            )
                        )
            except pg_errors.UniqueViolation:
                raise _DuplicateTrace() from None
            with cursor.copy(
                "COPY retrieved_contexts (trace_id, position, context_id, content, score,"
                " metadata) FROM STDIN (FORMAT BINARY)"
            ) as copy:
                copy.set_types(_CONTEXT_COPY_TYPES)
                for c in self._context_rows(batch):
                    copy.write_row(
                        (
                            c["trace_id"],
                            c["position"],
                            c["context_id"],
                            c["content"],
                            c["score"],
                            Jsonb(c["metadata"]),
                        )
                    )
            if job_rows:
                with cursor.copy(
                    "COPY scoring_jobs (trace_id, metric, version, status, attempts, run_at,"
                    " expires_at, created_at, updated_at) FROM STDIN (FORMAT BINARY)"
                ) as copy:
                    copy.set_types(_JOB_COPY_TYPES)
                    for j in job_rows:
                        copy.write_row(
                            (
                                j["trace_id"],
                                j["metric"],
                                j["version"],
                                j["status"],
                                0,
                                j["run_at"],
                                j["expires_at"],
                                j["created_at"],
                                j["updated_at"],
                            )
                        )
                if any(j["status"] == JobStatus.QUEUED for j in job_rows):
                    cursor.execute("SELECT pg_notify(%s, '')", (NOTIFY_CHANNEL,))

    def _write_traces_rows(self, batch: Sequence[TraceRecord], now: datetime) -> None:
        """Row inserts that skip stored trace ids: the SQLite path, and the Postgres path for a
        batch that is partly stored already."""
        with self.engine.begin() as conn:
            inserted = set(
                conn.scalars(
                    self._insert(Trace.__table__)
                    .on_conflict_do_nothing(index_elements=["trace_id"])
                    .returning(Trace.__table__.c.trace_id),
                    self._trace_rows(batch, now),
                )
            )
            fresh = [r for r in batch if r.trace_id in inserted]
            contexts = self._context_rows(fresh)
            if contexts:
                conn.execute(insert(RetrievedContext), contexts)
            jobs = self._job_rows(fresh, now)
            if jobs:
                conn.execute(self._insert(ScoringJob.__table__).on_conflict_do_nothing(), jobs)
                self._notify(conn)

    def _lock_for_score_writes(self, conn: Connection) -> None:
        """Shared side of :data:`SUMMARY_LOCK_KEY`: take it before writing scores."""
        if self.is_postgres:
            conn.execute(select(func.pg_advisory_xact_lock_shared(SUMMARY_LOCK_KEY)))

    def _invalidate_summaries(
        self, conn: Connection, touched: Iterable[tuple[str, datetime]]
    ) -> None:
        """Drop cached summary rows of the (metric, trace start) pairs just written."""
        if not self.is_postgres:
            return  # the cache is only used on Postgres
        keys = {
            (bucket, start, metric)
            for metric, moment in touched
            for bucket, start in _bucket_starts(moment)
        }
        if keys:
            conn.execute(
                delete(SummaryCache).where(
                    tuple_(SummaryCache.bucket, SummaryCache.bucket_start, SummaryCache.metric).in_(
                        sorted(keys)
                    )
                )
            )

    def _notify(self, conn: Connection) -> None:
        if self.is_postgres:
            conn.execute(select(func.pg_notify(NOTIFY_CHANNEL, "")))

    # -- jobs: creation and references --------------------------------------------------
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
        infos = [metric_info(k) for k in metrics] if metrics is not None else self.metrics
        created = 0
        with self.engine.begin() as conn:
            for info in infos:
                now = self._db_now_sql()
                missing = [
                    Trace.__table__.c[name].is_(None)
                    for name in info.needs
                    if name in REFERENCE_INPUTS
                ]
                waiting = or_(*missing) if missing else literal(False)
                status_expr = case((waiting, JobStatus.WAITING), else_=JobStatus.QUEUED)
                expires_expr = case((waiting, self._db_now_sql(self.reference_ttl)), else_=None)
                # SQLite needs a WHERE before ON CONFLICT in INSERT ... SELECT to parse it.
                scored_already = (
                    select(Score.id)
                    .where(
                        Score.trace_id == Trace.trace_id,
                        Score.metric == info.key,
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
                    literal(info.key),
                    literal(info.version),
                    status_expr,
                    literal(0),
                    now,
                    expires_expr,
                    now,
                    now,
                ).where(*conditions)
                stmt = (
                    self._insert(ScoringJob.__table__)
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
                self._notify(conn)
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
                info.key
                for info in CATALOG.values()
                if info.needs_reference
                and all(getattr(trace, n) is not None for n in info.needs if n in REFERENCE_INPUTS)
            ]
            if not ready:
                return 0
            now = self._db_now()
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
                self._notify(conn)
            return released or 0

    def expire_waiting_jobs(self, older_than: timedelta | None = None) -> int:
        """Skip jobs whose reference did not arrive in time; returns how many.

        A waiting job expires at the deadline it was created with (``reference_ttl`` of the
        repository that wrote it) or, when ``older_than`` is given, once it is older than that.
        Each gets a ``skipped`` score saying so, so the history shows why nothing was scored.
        A reference that arrives later still queues the job again.
        """
        now = self._db_now()
        expired: ColumnElement[bool] = ScoringJob.expires_at <= now
        if older_than is not None:
            expired = or_(expired, ScoringJob.created_at <= now - older_than)
        with self.engine.begin() as conn:
            self._lock_for_score_writes(conn)
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
                return 0
            traces = {
                t.trace_id: t
                for t in conn.execute(
                    select(Trace.trace_id, Trace.app_name, Trace.started_at).where(
                        Trace.trace_id.in_({r.trace_id for r in rows})
                    )
                )
            }
            ttl = older_than if older_than is not None else self.reference_ttl
            ttl_hours = ttl.total_seconds() / 3600
            scored_at = _utcnow()
            conn.execute(
                self._insert(Score.__table__).on_conflict_do_nothing(),
                [
                    {
                        "trace_id": r.trace_id,
                        "metric": r.metric,
                        "version": r.version,
                        "app_name": traces[r.trace_id].app_name,
                        "trace_started_at": traces[r.trace_id].started_at,
                        "status": "skipped",
                        "value": None,
                        "reason": (
                            "No reference arrived within the reference time-to-live "
                            f"({ttl_hours:g} h), so there was nothing to compare against."
                        ),
                        "details": {"skipped_by": "reference_ttl"},
                        "scored_at": scored_at,
                    }
                    for r in rows
                ],
            )
            self._invalidate_summaries(
                conn, ((r.metric, traces[r.trace_id].started_at) for r in rows)
            )
            return len(rows)

    # -- jobs: claiming and leases ------------------------------------------------------
    def claim_jobs(
        self,
        worker_id: str,
        *,
        limit: int,
        lease: timedelta,
        metrics: Sequence[str] | None = None,
    ) -> list[ClaimedJob]:
        """Claim up to ``limit`` due jobs for ``worker_id`` with a lease of ``lease``.

        On Postgres this is one statement with ``FOR UPDATE SKIP LOCKED``: any number of
        workers on any number of hosts never take the same job.
        """
        if limit < 1:
            return []
        now = self._db_now()
        due = (
            select(ScoringJob.id)
            .where(ScoringJob.status == JobStatus.QUEUED, ScoringJob.run_at <= now)
            .order_by(ScoringJob.run_at, ScoringJob.id)
            .limit(limit)
        )
        if metrics is not None:
            due = due.where(ScoringJob.metric.in_(list(metrics)))
        if self.is_postgres:
            due = due.with_for_update(skip_locked=True)
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
        now = self._db_now()
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
        now = self._db_now()
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
                self._notify(conn)
            return count

    def release_jobs(self, worker_id: str, job_ids: Sequence[int]) -> int:
        """Give back jobs ``worker_id`` holds but will not finish (graceful shutdown)."""
        if not job_ids:
            return 0
        now = self._db_now()
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
                self._notify(conn)
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
        scored_at = _utcnow()
        with self.engine.begin() as conn:
            self._lock_for_score_writes(conn)
            trace_ids = {job.trace_id for job, _ in outcomes}
            traces = {
                t.trace_id: t
                for t in conn.execute(
                    select(Trace.trace_id, Trace.app_name, Trace.started_at).where(
                        Trace.trace_id.in_(trace_ids)
                    )
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
                    "status": score.status,
                    "value": score.value,
                    # A judge's answer may carry characters no backend stores (NUL).
                    "reason": _storable_text(score.reason)[0],
                    "details": _storable_json(_json_safe(dict(score.details)))[0],
                    # Cut to the column: a long deployment name must not block every score.
                    "model": (
                        None
                        if score.model is None
                        else _storable_text(score.model)[0][:_MODEL_LIMIT]
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
            written = {tuple(r) for r in conn.execute(self._score_upsert, rows)}
            self._invalidate_summaries(
                conn, ((job.metric, traces[job.trace_id].started_at) for job, _ in kept)
            )
            now = self._db_now()
            by_status: dict[str, list[int]] = {}
            failed_reasons: dict[int, str] = {}
            for job, score in kept:
                status = {"skipped": JobStatus.SKIPPED, "failed": JobStatus.FAILED}.get(
                    score.status, JobStatus.DONE
                )
                by_status.setdefault(status, []).append(job.id)
                if status == JobStatus.FAILED:
                    failed_reasons[job.id] = _storable_text(score.reason)[0]
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
                    for job_id in ids:
                        conn.execute(
                            update(ScoringJob)
                            .where(ScoringJob.id == job_id)
                            .values({**values, "last_error": failed_reasons[job_id]})
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
        now = self._db_now()
        values: dict[str, Any] = {
            "status": JobStatus.QUEUED,
            "attempts": attempts,
            "run_at": now + delay,
            "locked_by": None,
            "lease_expires_at": None,
            "last_error": _storable_text(error)[0],
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
        now = self._db_now()
        with self.engine.begin() as conn:
            conn.execute(
                update(ScoringJob)
                .where(ScoringJob.id == job.id)
                .values(
                    status=JobStatus.FAILED,
                    attempts=job.attempts if attempts is None else attempts,
                    locked_by=None,
                    lease_expires_at=None,
                    last_error=_storable_text(error)[0],
                    updated_at=now,
                )
            )

    def retry_jobs(self, *, job_ids: Sequence[int] | None = None, metric: str | None = None) -> int:
        """Queue failed jobs again with fresh attempts; returns how many.

        The failed results those jobs stored are deleted in the same transaction, so the next
        run's result is stored whatever it is: a score, or a new failure with its own reason.
        Until then the trace has no result of that variant, and the job is queued.
        """
        now = self._db_now()
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
            self._lock_for_score_writes(conn)
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
                        .returning(Score.metric, Score.trace_started_at)
                    )
                    .tuples()
                    .all()
                )
                self._invalidate_summaries(conn, dropped)
            self._notify(conn)
            return len(requeued)

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
            result[t.trace_id] = TraceInputs(
                trace_id=t.trace_id,
                app_name=t.app_name,
                started_at=t.started_at,
                user_input=t.user_input,
                response=t.response,
                retrieved_contexts=[c.content for c in ctx],
                retrieved_context_ids=retrieved_ids,
                reference=t.reference,
                reference_contexts=t.reference_contexts,
                reference_context_ids=t.reference_context_ids,
            )
        return result

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
            now = self._db_now()
            oldest = conn.scalar(
                select(func.min(ScoringJob.run_at)).where(
                    ScoringJob.status == JobStatus.QUEUED, ScoringJob.run_at <= now, *only
                )
            )
        age = None
        if oldest is not None:
            if oldest.tzinfo is None:
                oldest = oldest.replace(tzinfo=timezone.utc)
            age = max(0.0, (_utcnow() - oldest).total_seconds())
        return QueueStats(
            due=int(counts.get(JobStatus.QUEUED, 0)),
            running=int(counts.get(JobStatus.RUNNING, 0)),
            waiting=int(counts.get(JobStatus.WAITING, 0)),
            failed=int(counts.get(JobStatus.FAILED, 0)),
            oldest_due_age_s=age,
        )

    def delete_traces_before(self, cutoff: datetime) -> int:
        """Delete traces (and, by cascade, their contexts, jobs and scores) older than cutoff."""
        with self.engine.begin() as conn:
            self._lock_for_score_writes(conn)
            deleted = conn.execute(delete(Trace).where(Trace.started_at < cutoff)).rowcount or 0
            if deleted and self.is_postgres:
                # Every bucket that starts before the cutoff may have lost scores.
                conn.execute(delete(SummaryCache).where(SummaryCache.bucket_start <= cutoff))
            return deleted

    def dispose(self) -> None:
        """Close every pooled connection (call in a forked child or at exit)."""
        self.engine.dispose()


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

# Column types of the binary COPY statements above, in column order.
_TRACE_COPY_TYPES = [
    "varchar", "varchar", "varchar", "timestamptz", "float8", "text", "text", "text",
    "jsonb", "jsonb", "jsonb", "bool", "jsonb", "timestamptz",
]  # fmt: skip
_CONTEXT_COPY_TYPES = ["varchar", "int4", "varchar", "text", "float8", "jsonb"]
_JOB_COPY_TYPES = [
    "varchar", "varchar", "varchar", "varchar", "int4",
    "timestamptz", "timestamptz", "timestamptz", "timestamptz",
]  # fmt: skip


class _DuplicateTrace(Exception):
    """A COPY hit a trace id that is already stored."""


METRICS_ENV = "RECALLTRACE_METRICS"


def metrics_from_env() -> list[str] | None:
    """The variants named by ``$RECALLTRACE_METRICS`` (comma-separated), or ``None``.

    Raises ``ValueError`` naming the unknown key and the known ones.
    """
    raw = os.environ.get(METRICS_ENV, "").strip()
    if not raw:
        return None
    keys = [key.strip() for key in raw.split(",") if key.strip()]
    for key in keys:
        if key not in CATALOG:
            raise ValueError(
                f"{METRICS_ENV} names an unknown metric {key!r}; "
                f"known metrics: {', '.join(CATALOG)}"
            )
    return keys


def open_repository(
    url: str | None = None,
    *,
    metrics: Sequence[str] | None = None,
    reference_ttl: timedelta = DEFAULT_REFERENCE_TTL,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    create_schema: bool | None = None,
) -> Repository:
    """Open a repository on ``url`` (default: ``$RECALLTRACE_DATABASE_URL`` or SQLite).

    ``metrics`` are the variants that stored traces get jobs for: by default those named by
    ``$RECALLTRACE_METRICS``, else all six. ``create_schema`` runs the migrations to head
    first; by default it does so on SQLite (the embedded default just works) and not on
    Postgres, where ``recalltrace db upgrade`` is a deliberate deployment step.
    """
    if metrics is None:
        metrics = metrics_from_env()
    engine = create_engine_from_url(url)
    if create_schema is None:
        create_schema = not is_postgres(engine)
    if create_schema:
        from recalltrace.storage.migrate import upgrade_engine

        upgrade_engine(engine)
    return Repository(
        engine, metrics=metrics, reference_ttl=reference_ttl, max_attempts=max_attempts
    )
