"""History queries over stored scores: summaries, worst traces, one trace in full, job health.

Every query filters on ``scores.trace_started_at`` (when the request happened, not when it was
scored), optionally by app and metric, and never joins ``traces``: the score rows carry the
app name and start time for that reason. Each metric is read at one version: the catalog's
current one unless another is asked for. After a version change, a backfill stores the new
version's scores beside the old ones, and the two are never pooled.

Postgres does the statistics itself: percentiles with ``percentile_cont(...) WITHIN GROUP
(ORDER BY value)``, one small aggregate per UTC hour or day bucket (see :func:`_summary_sql`
for why not one GROUP BY), read by index-only scans of ``ix_scores_metric_version_started``.
SQLite has no ordered-set aggregates, so there the rows of the window are fetched and the same
statistics (linear interpolation between the closest ranks, as ``percentile_cont`` does) are
computed in Python; that is fine for the laptop-sized databases SQLite is meant for.

All filter values travel as bound parameters.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from typing import Any, Literal

from sqlalchemy import ColumnElement, Engine, and_, func, or_, select, text, tuple_, union_all
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import TextClause

from recalltrace.scorers.catalog import CATALOG
from recalltrace.storage.db import is_postgres
from recalltrace.storage.models import (
    JobStatus,
    RetrievedContext,
    Score,
    ScoringJob,
    SummaryCache,
    Trace,
)
from recalltrace.storage.repository import SUMMARY_LOCK_KEY, UNSTORABLE_TEXT, TraceNotFound

__all__ = [
    "BUCKETS",
    "DEFAULT_STUCK_AFTER",
    "Bucket",
    "ContextRow",
    "History",
    "JobRow",
    "ScoreDetail",
    "SummaryRow",
    "TimeSpecError",
    "TraceDetail",
    "TraceNotFound",
    "UnknownMetric",
    "WindowStats",
    "WorstRow",
    "check_filter_text",
    "check_metric",
    "group_by_metric",
    "metric_versions",
    "parse_duration",
    "parse_time",
    "percentile",
    "unstorable_character",
]

Bucket = Literal["hour", "day"]
BUCKETS: tuple[Bucket, ...] = ("hour", "day")

DEFAULT_STUCK_AFTER = timedelta(minutes=15)
"""A queued job due for longer than this is reported as stuck (no worker is taking it)."""

PERCENTILES = (0.1, 0.5, 0.9)


class TimeSpecError(ValueError):
    """A ``--since``/``--until`` value is neither a duration nor a timestamp."""


class UnknownMetric(ValueError):
    """A metric key that is not in the catalog; the message lists the known keys."""


# -- time specifications -----------------------------------------------------------------------

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_TIME_HELP = "use a duration like 30m, 1h, 7d, 2w or a timestamp like 2026-11-01T10:00:00Z"


def parse_duration(text: str) -> timedelta:
    """Parse ``30s``, ``30m``, ``1h``, ``7d`` or ``2w`` into a positive ``timedelta``."""
    match = _DURATION.match(text)
    if match is None:
        raise TimeSpecError(f"invalid duration {text!r}: use e.g. 30m, 1h, 7d or 2w")
    amount = float(match.group(1))
    if amount <= 0:
        raise TimeSpecError(f"invalid duration {text!r}: it must be positive")
    return timedelta(seconds=amount * _UNIT_SECONDS[match.group(2).lower()])


def parse_time(text: str, *, now: datetime | None = None) -> datetime:
    """Turn ``now``, a duration (``7d``: that long before now) or an ISO timestamp into UTC.

    Timestamps without an offset, and plain dates (midnight), are taken as UTC. Raises
    :class:`TimeSpecError` naming the bad value.
    """
    stripped = text.strip()
    if stripped.lower() == "now":
        return (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    if _DURATION.match(stripped):
        reference = now or datetime.now(timezone.utc)
        return reference.astimezone(timezone.utc) - parse_duration(stripped)
    iso = stripped[:-1] + "+00:00" if stripped[-1:] in ("Z", "z") else stripped
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", iso):
            day = date.fromisoformat(iso)
            parsed = datetime(day.year, day.month, day.day, tzinfo=timezone.utc)
        else:
            parsed = datetime.fromisoformat(iso)
    except ValueError:
        raise TimeSpecError(f"invalid time {text!r}: {_TIME_HELP}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.astimezone(timezone.utc)


def check_metric(metric: str) -> str:
    """Return ``metric`` if the catalog knows it, else raise :class:`UnknownMetric`."""
    if metric not in CATALOG:
        known = ", ".join(sorted(CATALOG))
        raise UnknownMetric(f"unknown metric {metric!r}; known metrics: {known}")
    return metric


def unstorable_character(value: str) -> str | None:
    """What in ``value`` no stored text can hold, and where, or ``None`` if nothing.

    The repository replaces NUL and lone surrogates before storing text (Postgres refuses
    them), so a filter containing one could never match, on either backend.
    """
    match = UNSTORABLE_TEXT.search(value)
    if match is None:
        return None
    char = match.group()
    if char == "\x00":
        what = "a NUL character"
    elif "\udc80" <= char <= "\udcff":  # how Python decodes a non-UTF-8 byte of argv or a file
        what = f"the byte 0x{ord(char) - 0xDC00:02x} (not UTF-8)"
    else:
        what = f"a lone surrogate (U+{ord(char):04X})"
    return (
        f"{value!r} holds {what} at position {match.start()}; stored text never holds such a "
        "character, so nothing could match"
    )


def check_filter_text(name: str, value: str) -> str:
    """Return ``value``, or raise ``ValueError`` if it holds a character no stored text holds."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, not {type(value).__name__}")
    problem = unstorable_character(value)
    if problem is not None:
        raise ValueError(f"{name} {problem}")
    return value


def metric_versions(metric: str | None = None, version: str | None = None) -> dict[str, str]:
    """Which version of which metric a history query reads, as ``{metric: version}``.

    Without ``version``: every catalog metric (or just ``metric``) at its current version.
    ``version`` reads another one, an older version after a backfill to a new one, say; it
    needs ``metric``, since versions are numbered per metric.
    """
    if version is None:
        keys = [check_metric(metric)] if metric is not None else list(CATALOG)
        return {key: CATALOG[key].version for key in keys}
    if metric is None:
        raise ValueError("a version belongs to one metric: give the metric as well")
    if not check_filter_text("version", version).strip():
        raise ValueError("version must not be empty")
    return {check_metric(metric): version}


def percentile(sorted_values: Sequence[float], fraction: float) -> float | None:
    """The ``fraction`` percentile of ascending ``sorted_values``, as ``percentile_cont``.

    Linear interpolation between the two closest ranks; ``None`` for no values.
    """
    if not sorted_values:
        return None
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must lie in [0, 1], not {fraction!r}")
    position = fraction * (len(sorted_values) - 1)
    lower = math.floor(position)
    upper = min(lower + 1, len(sorted_values) - 1)
    weight = position - lower
    return sorted_values[lower] + (sorted_values[upper] - sorted_values[lower]) * weight


# -- rows --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SummaryRow:
    """The scores of one metric in one time bucket."""

    bucket_start: datetime
    """Start of the bucket (UTC, truncated to the hour or the day)."""
    metric: str
    version: str
    """The metric's version these scores were computed by."""
    count: int
    """Number of ``scored`` results; the statistics below are over these."""
    mean: float | None
    p10: float | None
    p50: float | None
    p90: float | None
    skipped: int
    """Results that had nothing to score (a missing input, a reference that never came)."""
    failed: int
    """Results where the judge could not produce a valid answer."""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (the bucket as an ISO 8601 string)."""
        return {
            "bucket_start": self.bucket_start.isoformat(),
            "metric": self.metric,
            "version": self.version,
            "count": self.count,
            "mean": self.mean,
            "p10": self.p10,
            "p50": self.p50,
            "p90": self.p90,
            "skipped": self.skipped,
            "failed": self.failed,
        }


@dataclass(frozen=True, slots=True)
class WorstRow:
    """One low-scoring trace."""

    trace_id: str
    metric: str
    version: str
    value: float
    reason: str
    app_name: str
    trace_started_at: datetime
    scored_at: datetime

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (times as ISO 8601 strings)."""
        return {
            "trace_id": self.trace_id,
            "metric": self.metric,
            "version": self.version,
            "value": self.value,
            "reason": self.reason,
            "app_name": self.app_name,
            "trace_started_at": self.trace_started_at.isoformat(),
            "scored_at": self.scored_at.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class WindowStats:
    """Scores of one metric over one time window (what ``recalltrace check`` tests)."""

    metric: str
    version: str
    """The metric's version these scores were computed by."""
    since: datetime | None
    until: datetime | None
    app: str | None
    count: int
    """Number of ``scored`` results."""
    mean: float | None
    skipped: int
    failed: int


@dataclass(frozen=True, slots=True)
class ContextRow:
    """One retrieved context of a trace, in retrieval order."""

    position: int
    context_id: str | None
    content: str
    score: float | None
    metadata: Mapping[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary."""
        return {
            "position": self.position,
            "context_id": self.context_id,
            "content": self.content,
            "score": self.score,
            "metadata": dict(self.metadata),
        }


@dataclass(frozen=True, slots=True)
class ScoreDetail:
    """One stored result with its reason, evidence and judge accounting."""

    metric: str
    version: str
    status: str
    value: float | None
    reason: str
    details: Mapping[str, Any]
    """The variant's evidence, as stored (see the metrics spec for each variant's keys)."""
    model: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cost_usd: float | None
    latency_ms: float | None
    scored_at: datetime

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary."""
        return {
            "metric": self.metric,
            "version": self.version,
            "status": self.status,
            "value": self.value,
            "reason": self.reason,
            "details": dict(self.details),
            "model": self.model,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost_usd": self.cost_usd,
            "latency_ms": self.latency_ms,
            "scored_at": self.scored_at.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class JobRow:
    """A scoring job, as ``recalltrace jobs list`` shows it."""

    id: int
    trace_id: str
    metric: str
    version: str
    status: str
    """The stored ``scoring_jobs.status``."""
    problem: str | None
    """``failed``, ``lease_expired`` (its worker died or stalled), ``overdue`` (due for long
    and nobody takes it), ``reference_expired`` (the reference wait ran out but nobody closed
    the job), or ``None`` for a healthy job."""
    attempts: int
    last_error: str | None
    run_at: datetime
    locked_by: str | None
    lease_expires_at: datetime | None
    updated_at: datetime

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (times as ISO 8601 strings)."""
        return {
            "id": self.id,
            "trace_id": self.trace_id,
            "metric": self.metric,
            "version": self.version,
            "status": self.status,
            "problem": self.problem,
            "attempts": self.attempts,
            "last_error": self.last_error,
            "run_at": self.run_at.isoformat(),
            "locked_by": self.locked_by,
            "lease_expires_at": (
                None if self.lease_expires_at is None else self.lease_expires_at.isoformat()
            ),
            "updated_at": self.updated_at.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class TraceDetail:
    """One stored trace in full: inputs, contexts, answer, reference, scores and jobs."""

    trace_id: str
    app_name: str
    service_name: str
    started_at: datetime
    duration_ms: float
    user_input: str | None
    response: str | None
    reference: str | None
    reference_contexts: Sequence[str] | None
    reference_context_ids: Sequence[str] | None
    metadata: Mapping[str, Any]
    error: bool
    notes: Sequence[str]
    contexts: tuple[ContextRow, ...]
    scores: tuple[ScoreDetail, ...]
    """Every stored result, by metric then version."""
    jobs: tuple[JobRow, ...]
    """Every scoring job of the trace, including those not finished yet."""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary."""
        return {
            "trace_id": self.trace_id,
            "app_name": self.app_name,
            "service_name": self.service_name,
            "started_at": self.started_at.isoformat(),
            "duration_ms": self.duration_ms,
            "user_input": self.user_input,
            "response": self.response,
            "reference": self.reference,
            "reference_contexts": (
                None if self.reference_contexts is None else list(self.reference_contexts)
            ),
            "reference_context_ids": (
                None if self.reference_context_ids is None else list(self.reference_context_ids)
            ),
            "metadata": dict(self.metadata),
            "error": self.error,
            "notes": list(self.notes),
            "contexts": [c.as_dict() for c in self.contexts],
            "scores": [s.as_dict() for s in self.scores],
            "jobs": [j.as_dict() for j in self.jobs],
        }


# -- queries -----------------------------------------------------------------------------------


def _utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def _truncate(value: datetime, bucket: Bucket) -> datetime:
    value = _utc(value)
    if bucket == "day":
        return value.replace(hour=0, minute=0, second=0, microsecond=0)
    return value.replace(minute=0, second=0, microsecond=0)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


_BUCKET_STEP: dict[str, timedelta] = {"hour": timedelta(hours=1), "day": timedelta(hours=24)}


def _summary_sql(*, with_app: bool) -> TextClause:
    """The Postgres summary of chosen (bucket, metric) pairs: one small aggregate each.

    Each lateral aggregate is an index-only range scan of ``ix_scores_metric_version_started``, so
    the only sorts are the small per-bucket ones ``percentile_cont`` needs anyway. A plain
    ``GROUP BY`` first sorts every row of the window by its group (three times slower for a
    week of scores), and ``date_trunc(..., 'UTC')`` adds a time-zone lookup per row. Buckets
    are fixed steps from a UTC-truncated start, the same boundaries ``date_trunc(..., 'UTC')``
    gives.
    """
    app_filter = "AND sc.app_name = :app" if with_app else ""
    # ``value`` is NULL unless the status is 'scored' (the result contract), and these
    # aggregates skip NULLs, so they need no FILTER: evaluating one per row per aggregate
    # costs a third of the query. One array-valued percentile_cont sorts each bucket once.
    return text(
        f"""
        SELECT p.bucket_start, p.metric, s.n_scored, s.mean, s.percentiles,
               s.n_skipped, s.n_failed
        FROM unnest(
                 CAST(:starts AS timestamptz[]),
                 CAST(:metrics AS text[]),
                 CAST(:versions AS text[])
             ) AS p(bucket_start, metric, version)
        CROSS JOIN LATERAL (
            SELECT count(sc.value) AS n_scored,
                   avg(sc.value) AS mean,
                   percentile_cont(CAST(:fractions AS float8[]))
                       WITHIN GROUP (ORDER BY sc.value) AS percentiles,
                   count(*) FILTER (WHERE sc.status = 'skipped') AS n_skipped,
                   count(*) FILTER (WHERE sc.status = 'failed') AS n_failed
            FROM scores AS sc
            WHERE sc.metric = p.metric
              AND sc.version = p.version
              AND sc.trace_started_at >= p.bucket_start
              AND sc.trace_started_at < p.bucket_start + CAST(:step AS interval)
              AND sc.trace_started_at >= :lower
              AND sc.trace_started_at < :upper
              {app_filter}
        ) AS s
        """
    )


class History:
    """Read-only queries over the scores stored in one database.

    ``since`` is inclusive and ``until`` exclusive; both must be timezone-aware. ``app`` and
    ``metric`` narrow to one app name and one catalog metric.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.is_postgres = is_postgres(engine)

    # -- shared filters --------------------------------------------------------------------
    @staticmethod
    def _score_filters(
        since: datetime | None,
        until: datetime | None,
        app: str | None,
        versions: Mapping[str, str] | None,
    ) -> list[ColumnElement[bool]]:
        """Conditions on scores: the window, the app and the (metric, version) pairs read."""
        if since is not None and until is not None and since >= until:
            raise ValueError(
                f"since ({since.isoformat()}) must be before until ({until.isoformat()})"
            )
        conditions: list[ColumnElement[bool]] = []
        if versions is not None:
            conditions.append(
                or_(
                    *(
                        and_(Score.metric == key, Score.version == version)
                        for key, version in versions.items()
                    )
                )
            )
        if app is not None:
            conditions.append(Score.app_name == check_filter_text("app", app))
        if since is not None:
            conditions.append(Score.trace_started_at >= since)
        if until is not None:
            conditions.append(Score.trace_started_at < until)
        return conditions

    # -- summary ---------------------------------------------------------------------------
    def summary(
        self,
        *,
        bucket: Bucket = "day",
        since: datetime | None = None,
        until: datetime | None = None,
        app: str | None = None,
        metric: str | None = None,
        version: str | None = None,
    ) -> list[SummaryRow]:
        """Per bucket and metric: scored count, mean, p10/p50/p90, skipped and failed counts.

        Each metric is read at its current catalog version, or at ``version`` (which needs
        ``metric``; see :func:`metric_versions`). Rows come ordered by bucket, then metric;
        buckets without any result are absent, and so are metrics no longer in the catalog. A
        window starting mid-bucket makes its first bucket partial.
        """
        if bucket not in BUCKETS:
            raise ValueError(f"bucket must be one of {', '.join(BUCKETS)}, not {bucket!r}")
        versions = metric_versions(metric, version)
        conditions = self._score_filters(since, until, app, versions)
        if self.is_postgres:
            return self._summary_postgres(bucket, since, until, app, versions)
        return self._summary_python(bucket, conditions, versions)

    def _summary_postgres(
        self,
        bucket: Bucket,
        since: datetime | None,
        until: datetime | None,
        app: str | None,
        versions: Mapping[str, str],
    ) -> list[SummaryRow]:
        """Cached rows for complete buckets in the past, live aggregates for the rest.

        A bucket is complete when the window covers all of it and it has ended; its rows are
        computed once, stored in ``summary_cache`` and dropped by the repository whenever a
        score of that bucket is written or deleted. The bucket still filling up and the
        partial buckets at the window's edges are always computed live.
        """
        metrics = list(versions)
        step = _BUCKET_STEP[bucket]
        app_key = app or ""
        with self.engine.connect() as conn:
            # Per metric, the first and last start time in the window: two index probes each.
            parts = [
                select(
                    func.min(Score.trace_started_at).label("first"),
                    func.max(Score.trace_started_at).label("last"),
                ).where(*self._score_filters(since, until, app, {key: version}))
                for key, version in versions.items()
            ]
            bounds = union_all(*parts).subquery()
            first, last = conn.execute(
                select(func.min(bounds.c.first), func.max(bounds.c.last))
            ).one()
            if first is None:
                return []
            now = _utc(conn.execute(select(func.now())).scalar_one())
            starts: list[datetime] = []
            cursor = _truncate(_utc(first), bucket)
            while cursor <= _utc(last):
                starts.append(cursor)
                cursor += step
            complete = {
                start
                for start in starts
                if (since is None or start >= since)
                and (until is None or start + step <= until)
                and start + step <= now
            }
            cached: dict[tuple[datetime, str], SummaryRow] = {}
            if complete:
                for r in conn.execute(
                    select(SummaryCache).where(
                        SummaryCache.bucket == bucket,
                        SummaryCache.app_name == app_key,
                        tuple_(SummaryCache.metric, SummaryCache.version).in_(
                            list(versions.items())
                        ),
                        SummaryCache.bucket_start.in_(sorted(complete)),
                    )
                ):
                    start = _utc(r.bucket_start)
                    cached[(start, r.metric)] = SummaryRow(
                        bucket_start=start,
                        metric=r.metric,
                        version=r.version,
                        count=r.n_scored,
                        mean=r.mean,
                        p10=r.p10,
                        p50=r.p50,
                        p90=r.p90,
                        skipped=r.n_skipped,
                        failed=r.n_failed,
                    )
            wanted = [(b, m) for b in starts for m in metrics if (b, m) not in cached]
            params = {
                "step": step,
                "lower": since if since is not None else first,
                "upper": until if until is not None else last + timedelta(microseconds=1),
                "app": app,
                "fractions": list(PERCENTILES),
            }
            fresh: list[SummaryRow] = []
            if wanted and any(b in complete for b, _m in wanted):
                # Filling the cache: hold the lock score writers share, so nothing can land
                # in these buckets between computing them and storing the rows.
                with self.engine.begin() as fill:
                    fill.execute(select(func.pg_advisory_xact_lock(SUMMARY_LOCK_KEY)))
                    fresh = self._aggregate(fill, wanted, versions, params, app)
                    storable = [r for r in fresh if r.bucket_start in complete]
                    if storable:
                        stmt = pg_insert(SummaryCache).values(
                            [
                                {
                                    "bucket": bucket,
                                    "bucket_start": r.bucket_start,
                                    "metric": r.metric,
                                    "version": r.version,
                                    "app_name": app_key,
                                    "n_scored": r.count,
                                    "mean": r.mean,
                                    "p10": r.p10,
                                    "p50": r.p50,
                                    "p90": r.p90,
                                    "n_skipped": r.skipped,
                                    "n_failed": r.failed,
                                    "computed_at": now,
                                }
                                for r in storable
                            ]
                        )
                        fill.execute(
                            stmt.on_conflict_do_update(
                                index_elements=[
                                    "bucket",
                                    "bucket_start",
                                    "metric",
                                    "version",
                                    "app_name",
                                ],
                                set_={
                                    k: stmt.excluded[k]
                                    for k in (
                                        "n_scored",
                                        "mean",
                                        "p10",
                                        "p50",
                                        "p90",
                                        "n_skipped",
                                        "n_failed",
                                        "computed_at",
                                    )
                                },
                            )
                        )
            elif wanted:
                fresh = self._aggregate(conn, wanted, versions, params, app)
        rows = list(cached.values()) + fresh
        rows.sort(key=lambda r: (r.bucket_start, r.metric))
        return rows

    @staticmethod
    def _aggregate(
        conn: Connection,
        pairs: list[tuple[datetime, str]],
        versions: Mapping[str, str],
        params: dict[str, Any],
        app: str | None,
    ) -> list[SummaryRow]:
        """Live aggregates of (bucket, metric) pairs, each metric at the version ``versions``
        gives; pairs without any result are left out."""
        # A plan this size crosses the default JIT threshold on big tables, and compiling
        # costs more than the query itself.
        conn.execute(text("SET LOCAL jit = off"))
        rows = conn.execute(
            _summary_sql(with_app=app is not None),
            {
                **params,
                "starts": [b for b, _m in pairs],
                "metrics": [m for _b, m in pairs],
                "versions": [versions[m] for _b, m in pairs],
            },
        ).all()
        return [
            SummaryRow(
                bucket_start=_utc(r.bucket_start),
                metric=r.metric,
                version=versions[r.metric],
                count=int(r.n_scored),
                mean=_float(r.mean),
                p10=None if r.percentiles is None else _float(r.percentiles[0]),
                p50=None if r.percentiles is None else _float(r.percentiles[1]),
                p90=None if r.percentiles is None else _float(r.percentiles[2]),
                skipped=int(r.n_skipped),
                failed=int(r.n_failed),
            )
            for r in rows
            if r.n_scored + r.n_skipped + r.n_failed > 0
        ]

    def _summary_python(
        self,
        bucket: Bucket,
        conditions: list[ColumnElement[bool]],
        versions: Mapping[str, str],
    ) -> list[SummaryRow]:
        stmt = select(Score.trace_started_at, Score.metric, Score.status, Score.value).where(
            *conditions
        )
        groups: dict[tuple[datetime, str], tuple[list[float], list[int]]] = {}
        with self.engine.connect() as conn:
            for started_at, metric, status, value in conn.execute(stmt):
                values, counts = groups.setdefault(
                    (_truncate(started_at, bucket), metric), ([], [0, 0])
                )
                # The same rules as the Postgres query: a value means a scored result.
                if value is not None:
                    values.append(float(value))
                if status == "skipped":
                    counts[0] += 1
                elif status == "failed":
                    counts[1] += 1
        result = []
        for (bucket_start, metric), (values, (skipped, failed)) in sorted(groups.items()):
            values.sort()
            p10, p50, p90 = (percentile(values, p) for p in PERCENTILES)
            result.append(
                SummaryRow(
                    bucket_start=bucket_start,
                    metric=metric,
                    version=versions[metric],
                    count=len(values),
                    mean=math.fsum(values) / len(values) if values else None,
                    p10=p10,
                    p50=p50,
                    p90=p90,
                    skipped=skipped,
                    failed=failed,
                )
            )
        return result

    # -- one window --------------------------------------------------------------------------
    def window(
        self,
        *,
        metric: str,
        since: datetime | None = None,
        until: datetime | None = None,
        app: str | None = None,
        version: str | None = None,
    ) -> WindowStats:
        """Count and mean of one metric's scored results over one window (plus skips, fails),
        at the metric's current catalog version or at ``version``."""
        versions = metric_versions(metric, version)
        conditions = self._score_filters(since, until, app, versions)
        scored = Score.status == "scored"
        stmt = select(
            func.count().filter(scored),
            func.avg(Score.value).filter(scored),
            func.count().filter(Score.status == "skipped"),
            func.count().filter(Score.status == "failed"),
        ).where(*conditions)
        with self.engine.connect() as conn:
            count, mean, skipped, failed = conn.execute(stmt).one()
        return WindowStats(
            metric=metric,
            version=versions[metric],
            since=since,
            until=until,
            app=app,
            count=int(count or 0),
            mean=_float(mean) if count else None,
            skipped=int(skipped or 0),
            failed=int(failed or 0),
        )

    # -- worst -----------------------------------------------------------------------------
    def worst(
        self,
        *,
        metric: str | None = None,
        limit: int = 10,
        since: datetime | None = None,
        until: datetime | None = None,
        app: str | None = None,
        version: str | None = None,
    ) -> list[WorstRow]:
        """The ``limit`` lowest scored results, lowest first, with their reasons.

        Each metric is read at its current catalog version, or at ``version`` (which needs
        ``metric``). With no ``metric`` the lowest of every catalog metric are merged; each
        metric's part is read in value order from the partial index on (metric, version,
        value).
        """
        if limit < 1:
            raise ValueError("limit must be at least 1")
        versions = metric_versions(metric, version)
        columns = (
            Score.trace_id,
            Score.metric,
            Score.version,
            Score.value,
            Score.reason,
            Score.app_name,
            Score.trace_started_at,
            Score.scored_at,
        )
        parts = []
        for key, key_version in versions.items():
            parts.append(
                select(*columns)
                .where(
                    Score.status == "scored",
                    *self._score_filters(since, until, app, {key: key_version}),
                )
                .order_by(Score.value, Score.trace_started_at.desc(), Score.trace_id)
                .limit(limit)
            )
        with self.engine.connect() as conn:
            if len(parts) == 1:
                rows = conn.execute(parts[0]).all()
            else:
                merged = union_all(*(p.subquery().select() for p in parts)).subquery()
                rows = conn.execute(
                    select(merged)
                    .order_by(
                        merged.c.value,
                        merged.c.trace_started_at.desc(),
                        merged.c.trace_id,
                        merged.c.metric,
                    )
                    .limit(limit)
                ).all()
        return [
            WorstRow(
                trace_id=r.trace_id,
                metric=r.metric,
                version=r.version,
                value=float(r.value),
                reason=r.reason,
                app_name=r.app_name,
                trace_started_at=_utc(r.trace_started_at),
                scored_at=_utc(r.scored_at),
            )
            for r in rows
        ]

    # -- one trace -------------------------------------------------------------------------
    def trace(self, trace_id: str) -> TraceDetail:
        """Everything stored about one trace; raises :class:`TraceNotFound` if there is none."""
        check_filter_text("trace_id", trace_id)
        with self.engine.connect() as conn:
            trace = conn.execute(
                select(
                    Trace.trace_id,
                    Trace.app_name,
                    Trace.service_name,
                    Trace.started_at,
                    Trace.duration_ms,
                    Trace.user_input,
                    Trace.response,
                    Trace.reference,
                    Trace.reference_contexts,
                    Trace.reference_context_ids,
                    Trace.metadata_,
                    Trace.error,
                    Trace.notes,
                ).where(Trace.trace_id == trace_id)
            ).one_or_none()
            if trace is None:
                raise TraceNotFound(f"no trace is stored with id {trace_id!r}")
            contexts = conn.execute(
                select(
                    RetrievedContext.position,
                    RetrievedContext.context_id,
                    RetrievedContext.content,
                    RetrievedContext.score,
                    RetrievedContext.metadata_,
                )
                .where(RetrievedContext.trace_id == trace_id)
                .order_by(RetrievedContext.position)
            ).all()
            scores = conn.execute(
                select(
                    Score.metric,
                    Score.version,
                    Score.status,
                    Score.value,
                    Score.reason,
                    Score.details,
                    Score.model,
                    Score.prompt_tokens,
                    Score.completion_tokens,
                    Score.cost_usd,
                    Score.latency_ms,
                    Score.scored_at,
                )
                .where(Score.trace_id == trace_id)
                .order_by(Score.metric, Score.version)
            ).all()
            jobs = self._job_rows(
                conn,
                select(*_JOB_COLUMNS)
                .where(ScoringJob.trace_id == trace_id)
                .order_by(ScoringJob.metric, ScoringJob.version),
                stuck_after=DEFAULT_STUCK_AFTER,
            )
        return TraceDetail(
            trace_id=trace.trace_id,
            app_name=trace.app_name,
            service_name=trace.service_name,
            started_at=_utc(trace.started_at),
            duration_ms=float(trace.duration_ms),
            user_input=trace.user_input,
            response=trace.response,
            reference=trace.reference,
            reference_contexts=trace.reference_contexts,
            reference_context_ids=trace.reference_context_ids,
            metadata=trace[10] or {},
            error=bool(trace.error),
            notes=trace.notes or [],
            contexts=tuple(
                ContextRow(
                    position=c.position,
                    context_id=c.context_id,
                    content=c.content,
                    score=c.score,
                    metadata=c[4] or {},
                )
                for c in contexts
            ),
            scores=tuple(
                ScoreDetail(
                    metric=s.metric,
                    version=s.version,
                    status=s.status,
                    value=_float(s.value),
                    reason=s.reason,
                    details=s.details or {},
                    model=s.model,
                    prompt_tokens=s.prompt_tokens,
                    completion_tokens=s.completion_tokens,
                    cost_usd=s.cost_usd,
                    latency_ms=s.latency_ms,
                    scored_at=_utc(s.scored_at),
                )
                for s in scores
            ),
            jobs=tuple(jobs),
        )

    # -- jobs ------------------------------------------------------------------------------
    def _now(self, conn: Connection) -> datetime:
        """The database clock on Postgres (it decides leases there), else the local clock."""
        if self.is_postgres:
            now: datetime = conn.execute(select(func.now())).scalar_one()
            return _utc(now)
        return datetime.now(timezone.utc)

    def _job_rows(self, conn: Connection, stmt: Any, *, stuck_after: timedelta) -> list[JobRow]:
        now = self._now(conn)
        rows = []
        for r in conn.execute(stmt):
            run_at = _utc(r.run_at)
            lease = None if r.lease_expires_at is None else _utc(r.lease_expires_at)
            expires = None if r.expires_at is None else _utc(r.expires_at)
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
                    updated_at=_utc(r.updated_at),
                )
            )
        return rows

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
            common.append(ScoringJob.metric == check_metric(metric))
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
            now = self._now(conn)
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
                select(*_JOB_COLUMNS)
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
            return self._job_rows(conn, stmt, stuck_after=stuck_after)


_JOB_COLUMNS = (
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
        return "overdue"
    if status == JobStatus.WAITING and expires_at is not None and expires_at < now:
        return "reference_expired"
    return None


def group_by_metric(rows: Iterable[SummaryRow]) -> dict[str, list[SummaryRow]]:
    """Summary rows split by metric, each list in bucket order (for charts)."""
    series: dict[str, list[SummaryRow]] = {}
    for row in sorted(rows, key=lambda r: (r.metric, r.bucket_start)):
        series.setdefault(row.metric, []).append(row)
    return series
