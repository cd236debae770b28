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
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ColumnElement,
    Engine,
    and_,
    case,
    func,
    literal,
    or_,
    select,
    text,
    union_all,
)
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import TextClause

from recalltrace.storage import rollups, summary_cache
from recalltrace.storage._dialect import Dialect
from recalltrace.storage._storable import UNSTORABLE_TEXT
from recalltrace.storage.contracts import TraceNotFound, UnknownMetric, check_metric
from recalltrace.storage.history_rows import (
    BUCKETS,
    PERCENTILES,
    Bucket,
    ContextRow,
    CostRow,
    GroupSums,
    JobCounts,
    JobRow,
    ScoreDetail,
    SummaryRow,
    TraceDetail,
    WindowStats,
    WorstRow,
    group_by_metric,
    percentile,
)
from recalltrace.storage.models import (
    JobStatus,
    Label,
    RetrievedContext,
    Score,
    ScoringJob,
    Trace,
    TraceTag,
    WorkerSeen,
)
from recalltrace.storage.summary_cache import as_utc
from recalltrace.storage.timespec import TimeSpecError, parse_duration, parse_time
from recalltrace.storage.workers import SERVED_WITHIN

if TYPE_CHECKING:
    from recalltrace.storage.diagnose import Diagnosis

__all__ = [
    "ATTRIBUTES",
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

DEFAULT_STUCK_AFTER = timedelta(minutes=15)
"""A queued job due for longer than this is reported as stuck (no worker is taking it)."""


# -- filters -----------------------------------------------------------------------------------


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


def metric_versions(
    current: Mapping[str, str], metric: str | None = None, version: str | None = None
) -> dict[str, str]:
    """Which version of which metric a history query reads, as ``{metric: version}``.

    ``current`` maps every known metric to its current version (the caller's catalog). Without
    ``version``: every metric (or just ``metric``) at its current version. ``version`` reads
    another one, an older version after a backfill to a new one, say; it needs ``metric``,
    since versions are numbered per metric.
    """
    if version is None:
        keys = [check_metric(metric, current)] if metric is not None else list(current)
        return {key: current[key] for key in keys}
    if metric is None:
        raise ValueError("a version belongs to one metric: give the metric as well")
    if not check_filter_text("version", version).strip():
        raise ValueError("version must not be empty")
    return {check_metric(metric, current): version}


# -- queries -----------------------------------------------------------------------------------


def _truncate(value: datetime, bucket: Bucket) -> datetime:
    value = as_utc(value)
    if bucket == "day":
        return value.replace(hour=0, minute=0, second=0, microsecond=0)
    return value.replace(minute=0, second=0, microsecond=0)


# The score columns a ``worst`` row is built from (:func:`_worst_row`).
_WORST_COLUMNS = (
    Score.trace_id,
    Score.metric,
    Score.version,
    Score.value,
    Score.reason,
    Score.app_name,
    Score.trace_started_at,
    Score.scored_at,
)


def _worst_row(r: Any, **extra: Any) -> WorstRow:
    """A :class:`WorstRow` from a result row of the score columns ``worst`` selects."""
    return WorstRow(
        trace_id=r.trace_id,
        metric=r.metric,
        version=r.version,
        value=float(r.value),
        reason=r.reason,
        app_name=r.app_name,
        trace_started_at=as_utc(r.trace_started_at),
        scored_at=as_utc(r.scored_at),
        **extra,
    )


# Attributes the scores keep themselves (copied from the trace when written).
_ON_SCORES: dict[str, Any] = {
    "release": Score.release,
    "environment": Score.environment,
    "app": Score.app_name,
}


#: The request attributes history can filter and group by.
ATTRIBUTES: tuple[str, ...] = (
    "release",
    "environment",
    "user_id",
    "session_id",
    "tag",
    "app",
    "service",
)


def _attribute_column(name: str) -> Any:
    """The column of attribute ``name``; ``ValueError`` naming the known ones."""
    columns = {
        "release": Trace.release,
        "environment": Trace.environment,
        "user_id": Trace.user_id,
        "session_id": Trace.session_id,
        "app": Trace.app_name,
        "service": Trace.service_name,
    }
    if name not in columns:
        raise ValueError(f"unknown attribute {name!r}; use one of: {', '.join(ATTRIBUTES)}")
    return columns[name]


# Attributes kept on the score rows that a cached summary can be scoped by (app is the
# cache's own column).
_SCOPED = ("release", "environment")


def _joins_traces(by: str | None, where: Sequence[tuple[str, str]]) -> bool:
    """Whether grouping by ``by`` and filtering by ``where`` needs the traces' own columns
    (user, session, service), not only the scores' and the tags'."""
    names = [name for name, _value in where] + ([by] if by is not None else [])
    return any(name not in _ON_SCORES and name != "tag" for name in names)


def _scope(
    app: str | None, where: Sequence[tuple[str, str]]
) -> tuple[str | None, dict[str, str]] | None:
    """``(app, {release/environment: value})`` when every ``where`` filter is on the score rows
    (each attribute once, app agreeing with ``app``); ``None`` when a summary must join the
    traces instead."""
    attributes: dict[str, str] = {}
    for name, value in where:
        value = check_filter_text(name, value)
        if name == "app":
            if app is not None and app != value:
                return None
            app = value
        elif name in _SCOPED and name not in attributes:
            attributes[name] = value
        else:
            return None
    return app, attributes


def _scope_key(app: str | None, attributes: Mapping[str, str | None]) -> str:
    """The summary cache's key of a scope: the app name ("" for all apps), then each
    attribute filter; a key too long for the column is replaced by a digest of it."""
    key = app or ""
    for name, value in sorted(attributes.items()):
        # No value (the traces without the attribute) has no "=": no value collides with it.
        key += f"\x1f{name}" if value is None else f"\x1f{name}={value}"
    if len(key) <= 200:
        return key
    import hashlib

    return "#" + hashlib.sha256(key.encode("utf-8")).hexdigest()


MAX_SUMMARY_GROUPS = 50
"""The most groups a summary split by an attribute shows."""


def _empty_row(bucket_start: datetime, metric: str, version: str) -> SummaryRow:
    """What the summary cache stores for an ended bucket without any result (never shown)."""
    return SummaryRow(bucket_start, metric, version, 0, None, None, None, None, 0, 0)


def _distinct_values(table: str, column: str) -> str:
    """Postgres: a recursive ``WITH`` naming ``v(val)``, the distinct values of ``column`` in
    ``table`` in order (a last ``NULL`` ends it), for a query to follow. One probe of an index
    led by ``column`` per value (a skip scan), where ``DISTINCT`` reads every row."""
    return f"""
        WITH RECURSIVE v(val) AS (
            (SELECT {column} FROM {table} WHERE {column} IS NOT NULL ORDER BY {column} LIMIT 1)
            UNION ALL
            SELECT (SELECT {column} FROM {table} WHERE {column} > v.val
                    ORDER BY {column} LIMIT 1)
            FROM v WHERE v.val IS NOT NULL
        )"""


def _window_bounds(
    conn: Connection,
    column: Any,
    since: datetime | None,
    until: datetime | None,
    conditions: Sequence[ColumnElement[bool]],
) -> tuple[datetime, tuple[datetime, datetime] | None]:
    """The database's time, and ``[since, until)`` with an open end closed at the first or
    last ``column`` of the rows matching ``conditions`` (two index probes); ``None`` for an
    empty window."""
    now = as_utc(conn.execute(select(func.now())).scalar_one())
    lower, upper = since, until
    if lower is None or upper is None:
        first, last = conn.execute(
            select(func.min(column), func.max(column)).where(*conditions)
        ).one()
        if first is None:
            return now, None
        lower = lower if lower is not None else as_utc(first)
        upper = upper if upper is not None else as_utc(last) + timedelta(microseconds=1)
    return now, ((lower, upper) if lower < upper else None)


def _group_order(group: str | None) -> tuple[bool, str]:
    """Groups in name order, the group without the attribute last."""
    return (group is None, group or "")


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


_BUCKET_STEP: dict[str, timedelta] = {"hour": timedelta(hours=1), "day": timedelta(hours=24)}


def _summary_sql(
    *, with_app: bool, attributes: Sequence[str] = (), missing: Sequence[str] = ()
) -> TextClause:
    """The Postgres summary of chosen (bucket, metric) pairs: one small aggregate each.

    Each lateral aggregate is an index-only range scan of ``ix_scores_metric_version_started``, so
    the only sorts are the small per-bucket ones ``percentile_cont`` needs anyway. A plain
    ``GROUP BY`` first sorts every row of the window by its group (three times slower for a
    week of scores), and ``date_trunc(..., 'UTC')`` adds a time-zone lookup per row. Buckets
    are fixed steps from a UTC-truncated start, the same boundaries ``date_trunc(..., 'UTC')``
    gives.
    """
    app_filter = "AND sc.app_name = :app" if with_app else ""
    # Release and environment are on the score rows (and in the covering index): filtering
    # by them keeps the scan index-only. Only these two names reach here (see _scope).
    for name in attributes:
        app_filter += f" AND sc.{name} = :attr_{name}"
    for name in missing:
        app_filter += f" AND sc.{name} IS NULL"
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

    def __init__(self, engine: Engine, versions: Mapping[str, str]) -> None:
        self.engine = engine
        self.versions = dict(versions)
        self.dialect = Dialect(engine)

    def check_metric(self, metric: str) -> str:
        """Return ``metric`` if it is known, else raise :class:`UnknownMetric` listing them."""
        return check_metric(metric, self.versions)

    def metric_versions(
        self, metric: str | None = None, version: str | None = None
    ) -> dict[str, str]:
        """The ``{metric: version}`` pairs a query reads (see :func:`metric_versions`)."""
        return metric_versions(self.versions, metric, version)

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
        where: Sequence[tuple[str, str]] = (),
        by: str | None = None,
    ) -> list[SummaryRow]:
        """Per bucket and metric: scored count, mean, p10/p50/p90, skipped and failed counts.

        ``where`` keeps the traces whose request attributes have the given values (see
        :data:`ATTRIBUTES`). On Postgres, filters on ``release``, ``environment`` and ``app``
        (kept on the score rows) are summarised like the unfiltered ones, ended buckets from
        the summary cache; other attributes are computed from the scores each time.

        Each metric is read at its current catalog version, or at ``version`` (which needs
        ``metric``; see :func:`metric_versions`). Rows come ordered by bucket, then metric;
        buckets without any result are absent, and so are metrics no longer in the catalog. A
        window starting mid-bucket makes its first bucket partial.

        With ``by`` (one of :data:`ATTRIBUTES`), each bucket and metric is split by the value
        of that attribute (rows carry ``by`` and ``group``; ``None`` is the group of traces
        without it; a trace with several tags is in each tag's group), groups in name order,
        the group without the attribute last. On Postgres, grouping by release, environment or
        app reads each group's summary like a filter on it, from the summary cache; at most
        ``MAX_SUMMARY_GROUPS`` groups are shown (more is a ``ValueError`` saying so).
        """
        if bucket not in BUCKETS:
            raise ValueError(f"bucket must be one of {', '.join(BUCKETS)}, not {bucket!r}")
        versions = self.metric_versions(metric, version)
        conditions = self._score_filters(since, until, app, versions)
        if by is not None:
            return self._summary_by(bucket, since, until, app, versions, where, by, conditions)
        scope = _scope(app, where) if self.dialect.postgres else None
        if scope is not None:
            scoped_app, attributes = scope
            return self._summary_postgres(bucket, since, until, scoped_app, versions, attributes)
        if where:
            self._attribute_filters(None, where, conditions)
            joins = _joins_traces(None, where)
            return self._summary_python(bucket, conditions, versions, join_traces=joins)
        return self._summary_python(bucket, conditions, versions)

    def _summary_by(
        self,
        bucket: Bucket,
        since: datetime | None,
        until: datetime | None,
        app: str | None,
        versions: Mapping[str, str],
        where: Sequence[tuple[str, str]],
        by: str,
        conditions: list[ColumnElement[bool]],
    ) -> list[SummaryRow]:
        if by not in ATTRIBUTES:
            raise ValueError(f"unknown attribute {by!r}; use one of: {', '.join(ATTRIBUTES)}")
        scope = _scope(app, where) if self.dialect.postgres else None
        if scope is not None and by in (*_SCOPED, "app") and by not in scope[1]:
            scoped_app, attributes = scope
            if by == "app" and scoped_app is not None:
                groups: list[str | None] = [scoped_app]
            else:
                groups = self._groups_in_window(by, since, until)
            rows: list[SummaryRow] = []
            for group in groups:
                if by == "app":
                    part = self._summary_postgres(bucket, since, until, group, versions, attributes)
                else:
                    part = self._summary_postgres(
                        bucket, since, until, scoped_app, versions, {**attributes, by: group}
                    )
                rows.extend(replace(r, by=by, group=group) for r in part)
            rows.sort(key=lambda r: (r.bucket_start, r.metric, *_group_order(r.group)))
            return rows
        column = self._attribute_filters(by, where, conditions)
        return self._summary_python(
            bucket,
            conditions,
            versions,
            join_traces=_joins_traces(by, where),
            group=column,
            by=by,
        )

    def _few_tags(self) -> bool:
        """Whether traces carry few enough distinct tags (``rollups.MAX_ROLLED_TAGS``) for
        per-hour sums by tag: with one tag per customer, say, those would hold a row per tag
        per hour and outgrow the scores they sum, so such tags are summed from the scores."""
        stmt = text(
            _distinct_values("trace_tags", "tag")
            + " SELECT count(*) FROM (SELECT val FROM v WHERE val IS NOT NULL LIMIT :most) AS f"
        )
        with self.engine.connect() as conn:
            found = conn.execute(stmt, {"most": rollups.MAX_ROLLED_TAGS + 1}).scalar_one()
        return int(found) <= rollups.MAX_ROLLED_TAGS

    def _groups_in_window(
        self, by: str, since: datetime | None, until: datetime | None
    ) -> list[str | None]:
        """The values of ``by`` (release, environment or app) that traces started in the
        window have, the missing value (``None``) included when some trace lacks it: a skip
        scan of the (attribute, start) index, one probe per distinct value."""
        table, column, started = {
            "release": ("traces", "release", "started_at"),
            "environment": ("traces", "environment", "started_at"),
            "app": ("scores", "app_name", "trace_started_at"),
        }[by]
        window = ""
        if since is not None:
            window += f" AND w.{started} >= :since"
        if until is not None:
            window += f" AND w.{started} < :until"
        stmt = text(
            _distinct_values(table, column)
            + f"""
            SELECT val FROM v
            WHERE val IS NOT NULL
              AND EXISTS (SELECT 1 FROM {table} AS w WHERE w.{column} = v.val {window})
            LIMIT :most
            """
        )
        params = {"since": since, "until": until, "most": MAX_SUMMARY_GROUPS + 1}
        with self.engine.connect() as conn:
            values: list[str | None] = list(conn.execute(stmt, params).scalars())
            if len(values) > MAX_SUMMARY_GROUPS:
                raise ValueError(
                    f"more than {MAX_SUMMARY_GROUPS} values of {by} in the window; narrow it "
                    "with --since/--until or --where"
                )
            if by != "app":
                missing = text(
                    f"SELECT EXISTS (SELECT 1 FROM {table} AS w WHERE w.{column} IS NULL{window})"
                )
                if conn.execute(missing, params).scalar_one():
                    values.append(None)
        return values

    def warm_summaries(
        self,
        *,
        days: int = 31,
        hours: int = 48,
        apps: int = 20,
        releases: int = 5,
        environments: int = 5,
        now: datetime | None = None,
    ) -> int:
        """Compute and store the summary rows of complete buckets that are not stored yet, so
        no user query pays for them: day buckets of the last ``days`` days and hour buckets of
        the last ``hours`` hours, for every app together and for each of (at most ``apps``)
        apps, every metric at its version; the hourly rollups of the last ``days`` days that
        ``scores compare`` by release, environment or tag and ``scores cost`` read (every app
        together); and the summaries and costs filtered by each of the ``releases`` releases
        and ``environments`` environments seen most recently. Postgres only (elsewhere nothing is
        cached; returns 0). Returns how many summary rows those windows hold plus the rollup
        rows it computed. Workers call this in the background; when everything is stored
        already it reads the stored rows and a few index probes per scope."""
        if not self.dialect.postgres:
            return 0
        if now is None:
            with self.engine.connect() as conn:
                now = as_utc(conn.execute(select(func.now())).scalar_one())
        scopes: list[str | None] = [None, *self.app_names(limit=apps)]
        looked = 0
        windows: tuple[tuple[Bucket, int], ...] = (("day", days), ("hour", hours))
        for bucket, count in windows:
            step = _BUCKET_STEP[bucket]
            until = _truncate(as_utc(now), bucket)  # every bucket before it has ended
            since = until - count * step
            for app in scopes:
                looked += len(self._summary_postgres(bucket, since, until, app, self.versions))
        # The hourly rollups of ``scores compare`` (every app, grouped by release, environment
        # and tag) and of ``scores cost``, over the same days.
        until = _truncate(as_utc(now), "hour")
        since = until - timedelta(days=days)
        grouped = [by for by in rollups.GROUPED if by != "tag" or self._few_tags()]
        for key, key_version in self.versions.items():
            for by in grouped:
                looked += len(
                    rollups.group_hours(
                        self.engine,
                        metric=key,
                        version=key_version,
                        by=by,
                        scope="",
                        app=None,
                        attributes={},
                        lower=since,
                        upper=until,
                        now=now,
                        fill_only=True,
                    )
                )

        def cost_of(attributes: Mapping[str, str]) -> int:
            hours = rollups.cost_hours(
                self.engine,
                scope=_scope_key(None, attributes),
                app=None,
                attributes=attributes,
                metric=None,
                lower=since,
                upper=until,
                now=now,
            )
            return len(hours)

        looked += cost_of({})
        # Summaries filtered by the releases and environments seen most recently (read from
        # the rollups just filled), the filters people use.
        with self.engine.connect() as conn:
            recent = {
                name: rollups.recent_groups(conn, name, since, most)
                for name, most in (("release", releases), ("environment", environments))
            }
        for name, values in recent.items():
            for value in values:
                looked += cost_of({name: value})
                for bucket, count in windows:
                    step = _BUCKET_STEP[bucket]
                    end = _truncate(as_utc(now), bucket)
                    looked += len(
                        self._summary_postgres(
                            bucket, end - count * step, end, None, self.versions, {name: value}
                        )
                    )
        return looked

    def _summary_postgres(
        self,
        bucket: Bucket,
        since: datetime | None,
        until: datetime | None,
        app: str | None,
        versions: Mapping[str, str],
        attributes: Mapping[str, str | None] | None = None,
    ) -> list[SummaryRow]:
        """Cached rows for complete buckets in the past, live aggregates for the rest (of the
        scores with the given ``attributes``: release and environment values, ``None`` for
        the scores of traces without it).

        A bucket is complete when the window covers all of it and it has ended; its rows are
        computed once, stored in ``summary_cache`` and dropped by the repository whenever a
        score of that bucket is written or deleted. The bucket still filling up and the
        partial buckets at the window's edges are always computed live.
        """
        metrics = list(versions)
        step = _BUCKET_STEP[bucket]
        attributes = dict(attributes or {})
        app_key = _scope_key(app, attributes)
        with self.engine.connect() as conn:
            # Per metric, the first and last start time in the window: two index probes each.
            # Not narrowed by the attributes: a release absent from most of the window would
            # make each probe walk that part of the index. Buckets without its scores are
            # stored empty once they have ended, so they cost nothing the next time.
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
            now = as_utc(conn.execute(select(func.now())).scalar_one())
            starts: list[datetime] = []
            cursor = _truncate(as_utc(first), bucket)
            while cursor <= as_utc(last):
                starts.append(cursor)
                cursor += step
            complete = {
                start
                for start in starts
                if (since is None or start >= since)
                and (until is None or start + step <= until)
                and start + step <= now
            }
            cached = summary_cache.read(conn, bucket, app_key, versions, complete)
            wanted = [(b, m) for b in starts for m in metrics if (b, m) not in cached]
            params = {
                "step": step,
                "lower": since if since is not None else first,
                "upper": until if until is not None else last + timedelta(microseconds=1),
                "app": app,
                "fractions": list(PERCENTILES),
                **{f"attr_{name}": value for name, value in attributes.items()},
            }
            fresh: list[SummaryRow] = []
            if wanted and any(b in complete for b, _m in wanted):
                # Filling the cache: hold the lock score writers share, so nothing can land
                # in these buckets between computing them and storing the rows.
                with self.engine.begin() as fill:
                    summary_cache.lock_for_fill(fill)
                    fresh = self._aggregate(fill, wanted, versions, params, app, attributes)
                    found = {(r.bucket_start, r.metric) for r in fresh}
                    storable = [r for r in fresh if r.bucket_start in complete] + [
                        _empty_row(b, m, versions[m])
                        for b, m in wanted
                        if b in complete and (b, m) not in found
                    ]
                    summary_cache.store(fill, bucket, app_key, storable, now)
            elif wanted:
                fresh = self._aggregate(conn, wanted, versions, params, app, attributes)
        rows = [r for r in cached.values() if r.count or r.skipped or r.failed] + fresh
        rows.sort(key=lambda r: (r.bucket_start, r.metric))
        return rows

    @staticmethod
    def _aggregate(
        conn: Connection,
        pairs: list[tuple[datetime, str]],
        versions: Mapping[str, str],
        params: dict[str, Any],
        app: str | None,
        attributes: Mapping[str, str | None] | None = None,
    ) -> list[SummaryRow]:
        """Live aggregates of (bucket, metric) pairs, each metric at the version ``versions``
        gives; pairs without any result are left out."""
        # A plan this size crosses the default JIT threshold on big tables, and compiling
        # costs more than the query itself.
        conn.execute(text("SET LOCAL jit = off"))
        rows = conn.execute(
            _summary_sql(
                with_app=app is not None,
                attributes=sorted(k for k, v in (attributes or {}).items() if v is not None),
                missing=sorted(k for k, v in (attributes or {}).items() if v is None),
            ),
            {
                **params,
                "starts": [b for b, _m in pairs],
                "metrics": [m for _b, m in pairs],
                "versions": [versions[m] for _b, m in pairs],
            },
        ).all()
        return [
            SummaryRow(
                bucket_start=as_utc(r.bucket_start),
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
        join_traces: bool = False,
        group: Any = None,
        by: str | None = None,
    ) -> list[SummaryRow]:
        """The summary computed from the score rows; with ``group`` (the column of attribute
        ``by``), per group too."""
        stmt = select(
            Score.trace_started_at,
            Score.metric,
            Score.status,
            Score.value,
            literal(None) if group is None else group,
        ).select_from(Score)
        if join_traces:
            stmt = stmt.join(Trace, Trace.trace_id == Score.trace_id)
        if by == "tag":
            stmt = stmt.outerjoin(TraceTag, TraceTag.trace_id == Score.trace_id)
        stmt = stmt.where(*conditions)
        groups: dict[tuple[datetime, str, str | None], tuple[list[float], list[int]]] = {}
        with self.engine.connect() as conn:
            for started_at, metric, status, value, name in conn.execute(stmt):
                values, counts = groups.setdefault(
                    (_truncate(started_at, bucket), metric, name), ([], [0, 0])
                )
                # The same rules as the Postgres query: a value means a scored result.
                if value is not None:
                    values.append(float(value))
                if status == "skipped":
                    counts[0] += 1
                elif status == "failed":
                    counts[1] += 1
        if group is not None and len({key[2] for key in groups}) > MAX_SUMMARY_GROUPS:
            raise ValueError(
                f"more than {MAX_SUMMARY_GROUPS} values of {by} in the window; narrow it "
                "with --since/--until or --where"
            )
        result = []
        ordered = sorted(groups.items(), key=lambda item: (*item[0][:2], *_group_order(item[0][2])))
        for (bucket_start, metric, name), (values, (skipped, failed)) in ordered:
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
                    by=by,
                    group=name,
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
        versions = self.metric_versions(metric, version)
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

    # -- by request attribute --------------------------------------------------------------
    def group_summaries(
        self,
        *,
        metric: str,
        by: str,
        since: datetime | None = None,
        until: datetime | None = None,
        app: str | None = None,
        version: str | None = None,
        where: Sequence[tuple[str, str]] = (),
        max_values: int = 1000,
    ) -> dict[str | None, GroupSums]:
        """The scored values of ``metric`` (one per trace) grouped by the request attribute
        ``by`` (one of :data:`ATTRIBUTES`; ``None`` is the group of traces without it; a trace
        with several tags is in each tag's group), among the traces matching every
        ``(attribute, value)`` of ``where``, aggregated in the database: per group the count,
        the sum and the sum of squares of the values and how many are neither 0 nor 1, with
        the values themselves only for groups of at most ``max_values`` (for a bootstrap).
        Groups come in the order of their first trace in the window."""
        conditions, column, joins = self._grouping(metric, by, since, until, app, version, where)
        scope = _scope(app, where) if self.dialect.postgres and by in rollups.GROUPED else None
        if scope is not None and (by != "tag" or self._few_tags()):
            sums = self._rolled_group_sums(metric, by, since, until, version, *scope)
            return self._with_small_values(
                sums, conditions, column, joins, by, max_values, since, until
            )
        fractional = func.sum(case((Score.value.in_((0.0, 1.0)), 0), else_=1))
        stmt = (
            select(
                column,
                func.count(),
                func.sum(Score.value),
                func.sum(Score.value * Score.value),
                fractional,
                func.min(Score.trace_started_at),
            )
            .select_from(Score)
            .where(*conditions)
            .group_by(column)
        )
        if joins:
            stmt = stmt.join(Trace, Trace.trace_id == Score.trace_id)
        if by == "tag":
            stmt = stmt.outerjoin(TraceTag, TraceTag.trace_id == Score.trace_id)
        with self.engine.connect() as conn:
            rows = sorted(conn.execute(stmt).all(), key=lambda r: as_utc(r[5]))
            sums = {
                r[0]: GroupSums(int(r[1]), float(r[2] or 0.0), float(r[3] or 0.0), int(r[4] or 0))
                for r in rows
            }
        return self._with_small_values(
            sums, conditions, column, joins, by, max_values, since, until
        )

    def _rolled_group_sums(
        self,
        metric: str,
        by: str,
        since: datetime | None,
        until: datetime | None,
        version: str | None,
        app: str | None,
        attributes: Mapping[str, str],
    ) -> dict[str | None, GroupSums]:
        """:meth:`group_summaries`' sums from the hourly rollups (``storage.rollups``):
        ended hours from ``group_cache``, the window's partial edges live."""
        key_version = self.metric_versions(metric, version)[metric]
        # Bounds not narrowed by the attributes (see _summary_postgres): empty hours are
        # stored as such.
        conditions = self._score_filters(since, until, app, {metric: key_version})
        with self.engine.connect() as conn:
            now, window = _window_bounds(conn, Score.trace_started_at, since, until, conditions)
        if window is None:
            return {}
        lower, upper = window
        hours = rollups.group_hours(
            self.engine,
            metric=metric,
            version=key_version,
            by=by,
            scope=_scope_key(app, attributes),
            app=app,
            attributes=attributes,
            lower=lower,
            upper=upper,
            now=now,
        )
        merged: dict[str | None, list[Any]] = {}
        for hour in hours:
            into = merged.setdefault(hour.group, [0, 0.0, 0.0, 0, hour.first_started])
            into[0] += hour.count
            into[1] += hour.total
            into[2] += hour.total_squares
            into[3] += hour.fractional
            into[4] = min(into[4], hour.first_started)
        ordered = sorted(merged.items(), key=lambda item: (item[1][4], str(item[0])))
        return {
            group: GroupSums(n, total, squares, frac)
            for group, (n, total, squares, frac, _f) in ordered
        }

    def _with_small_values(
        self,
        sums: dict[str | None, GroupSums],
        conditions: list[ColumnElement[bool]],
        column: Any,
        joins: bool,
        by: str,
        max_values: int,
        since: datetime | None,
        until: datetime | None,
    ) -> dict[str | None, GroupSums]:
        """``sums`` with the values of each group of at most ``max_values`` (for a bootstrap),
        read in trace order so the same values come in the same order every time."""
        with self.engine.connect() as conn:
            small = [group for group, g in sums.items() if g.count <= max_values]
            if small:
                named = [group for group in small if group is not None]
                matches = [column.in_(named)] if named else []
                if None in small:
                    matches.append(column.is_(None))
                values = (
                    select(column, Score.value)
                    .select_from(Score)
                    .where(*conditions, or_(*matches))
                    .order_by(Score.trace_id)  # the same values in the same order every time
                )
                if by in ("release", "environment") and not joins:
                    # A canary's few hundred traces among millions: find them by the traces'
                    # (attribute, start) index, not by reading every score of the window. The
                    # scores keep their trace's value, so the groups are the same.
                    on_trace = _attribute_column(by)
                    found = [on_trace.in_(named)] if named else []
                    if None in small:
                        found.append(on_trace.is_(None))
                    window = [Trace.started_at >= since] if since is not None else []
                    if until is not None:
                        window.append(Trace.started_at < until)
                    values = (
                        values.select_from(Trace)
                        .join(Score, Score.trace_id == Trace.trace_id)
                        .where(or_(*found), *window)
                    )
                elif joins:
                    values = values.join(Trace, Trace.trace_id == Score.trace_id)
                if by == "tag":
                    values = values.outerjoin(TraceTag, TraceTag.trace_id == Score.trace_id)
                collected: dict[str | None, list[float]] = {group: [] for group in small}
                for group, value in conn.execute(values):
                    collected[group].append(float(value))
                for group, found in collected.items():
                    sums[group] = replace(sums[group], values=tuple(found))
        return sums

    def group_labels(
        self,
        *,
        metric: str,
        by: str,
        since: datetime | None = None,
        until: datetime | None = None,
        app: str | None = None,
        version: str | None = None,
        where: Sequence[tuple[str, str]] = (),
    ) -> dict[str | None, list[tuple[float, float]]]:
        """Per group of :meth:`group_summaries` (the same traces, grouped the same way): the
        (people's label, judge score) pair of every scored trace people labelled for
        ``metric``, the label being the mean of its labellers' labels."""
        conditions, column, joins = self._grouping(metric, by, since, until, app, version, where)
        stmt = (
            select(column, Score.trace_id, Score.value, func.avg(Label.value))
            .select_from(Score)
            .join(Label, (Label.trace_id == Score.trace_id) & (Label.metric == Score.metric))
            .where(*conditions)
            .group_by(column, Score.trace_id, Score.value)
            .order_by(Score.trace_id)
        )
        if joins:
            stmt = stmt.join(Trace, Trace.trace_id == Score.trace_id)
        if by == "tag":
            stmt = stmt.outerjoin(TraceTag, TraceTag.trace_id == Score.trace_id)
        groups: dict[str | None, list[tuple[float, float]]] = {}
        with self.engine.connect() as conn:
            for group, _trace, score, label in conn.execute(stmt):
                groups.setdefault(group, []).append((float(label), float(score)))
        return groups

    def _grouping(
        self,
        metric: str,
        by: str,
        since: datetime | None,
        until: datetime | None,
        app: str | None,
        version: str | None,
        where: Sequence[tuple[str, str]],
    ) -> tuple[list[ColumnElement[bool]], Any, bool]:
        """The conditions on the scored results of ``metric``, the column to group by, and
        whether the query must join the scores to their traces."""
        versions = self.metric_versions(metric, version)
        conditions = self._score_filters(since, until, app, versions)
        conditions.append(Score.status == "scored")
        column = self._attribute_filters(by, where, conditions)
        return conditions, column, _joins_traces(by, where)

    @staticmethod
    def _attribute_filters(
        by: str | None,
        where: Sequence[tuple[str, str]],
        conditions: list[ColumnElement[bool]],
    ) -> Any:
        """Add the ``where`` conditions; the column to group by (``None`` for no grouping).

        Release, environment and app are kept on the scores too, and tags have their own
        table: grouping and filtering by them reads no trace (an index on Postgres), so the
        traces are joined only for the other attributes (see :func:`_joins_traces`)."""
        for name, value in where:
            if name == "tag":
                conditions.append(
                    Score.trace_id.in_(
                        select(TraceTag.trace_id).where(
                            TraceTag.tag == check_filter_text("tag", value)
                        )
                    )
                )
            else:
                on_scores = _ON_SCORES.get(name)
                column = on_scores if on_scores is not None else _attribute_column(name)
                conditions.append(column == check_filter_text(name, value))
        if by is None:
            return None
        if by == "tag":
            return TraceTag.tag
        column = _ON_SCORES.get(by)
        return column if column is not None else _attribute_column(by)

    # -- judge cost --------------------------------------------------------------------------
    def cost(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        app: str | None = None,
        metric: str | None = None,
        where: Sequence[tuple[str, str]] = (),
        by: str | None = None,
    ) -> list[CostRow]:
        """Judge tokens and money per UTC day (when the results were stored), variant and
        judge model, over the results stored in ``[since, until)`` of the traces matching
        ``where``; ordered by day, variant, model. With ``by`` (one of :data:`ATTRIBUTES`),
        also per value of that attribute (rows carry ``by`` and ``group``), at most
        ``MAX_SUMMARY_GROUPS`` values.

        On Postgres, without ``by`` and with ``where`` on release, environment or app only,
        the ended hours come from ``cost_cache`` (see ``storage.rollups``)."""
        if by is not None and by not in ATTRIBUTES:
            raise ValueError(f"unknown attribute {by!r}; use one of: {', '.join(ATTRIBUTES)}")
        conditions: list[ColumnElement[bool]] = [Score.model.is_not(None)]
        if since is not None:
            conditions.append(Score.scored_at >= since)
        if until is not None:
            conditions.append(Score.scored_at < until)
        if app is not None:
            conditions.append(Score.app_name == check_filter_text("app", app))
        if metric is not None:
            conditions.append(Score.metric == self.check_metric(metric))
        scope = _scope(app, where) if self.dialect.postgres and by is None else None
        if scope is not None:
            scoped_app, attributes = scope
            return self._rolled_cost(conditions, since, until, scoped_app, metric, attributes)
        group = self._attribute_filters(by, where, conditions)
        if self.dialect.postgres:
            day: Any = func.date_trunc("day", func.timezone("UTC", Score.scored_at))
        else:
            day = func.substr(Score.scored_at, 1, 10)
        keys = [day, Score.metric, Score.model, literal(None) if group is None else group]
        stmt = (
            select(
                *keys,
                func.count(),
                func.coalesce(func.sum(Score.prompt_tokens), 0),
                func.coalesce(func.sum(Score.completion_tokens), 0),
                func.sum(Score.cost_usd),
                func.count().filter(Score.cost_usd.is_(None)),
            )
            .select_from(Score)
            .where(*conditions)
            .group_by(*keys[:3], *keys[3:] if group is not None else ())
        )
        if _joins_traces(by, where):
            stmt = stmt.join(Trace, Trace.trace_id == Score.trace_id)
        if by == "tag":
            stmt = stmt.outerjoin(TraceTag, TraceTag.trace_id == Score.trace_id)
        rows = []
        with self.engine.connect() as conn:
            for when, key, model, name, n, prompt, completion, cost, unpriced in conn.execute(stmt):
                if isinstance(when, str):
                    when = datetime.fromisoformat(when[:10]).replace(tzinfo=timezone.utc)
                else:
                    when = when.replace(tzinfo=timezone.utc)
                rows.append(
                    CostRow(
                        when,
                        key,
                        model,
                        int(n),
                        int(prompt),
                        int(completion),
                        None if cost is None else float(cost),
                        int(unpriced or 0),
                        by=by,
                        group=name,
                    )
                )
        if by is not None and len({r.group for r in rows}) > MAX_SUMMARY_GROUPS:
            raise ValueError(
                f"more than {MAX_SUMMARY_GROUPS} values of {by} in the window; narrow it "
                "with --since/--until or --where"
            )
        rows.sort(key=lambda r: (r.day, r.metric, r.model, *_group_order(r.group)))
        return rows

    def _rolled_cost(
        self,
        conditions: list[ColumnElement[bool]],
        since: datetime | None,
        until: datetime | None,
        app: str | None,
        metric: str | None,
        attributes: Mapping[str, str],
    ) -> list[CostRow]:
        """:meth:`cost` from the hourly rollups (``storage.rollups``): ended hours of scoring
        from ``cost_cache``, the window's partial edges live, summed into UTC days."""
        with self.engine.connect() as conn:
            now, window = _window_bounds(conn, Score.scored_at, since, until, conditions)
        if window is None:
            return []
        lower, upper = window
        days: dict[tuple[datetime, str, str], list[Any]] = {}
        for hour in rollups.cost_hours(
            self.engine,
            scope=_scope_key(app, attributes),
            app=app,
            attributes=attributes,
            metric=metric,
            lower=lower,
            upper=upper,
            now=now,
        ):
            day = hour.hour.replace(hour=0)
            into = days.setdefault((day, hour.metric, hour.model), [0, 0, 0, None, 0])
            into[0] += hour.count
            into[1] += hour.prompt_tokens
            into[2] += hour.completion_tokens
            if hour.cost_usd is not None:
                into[3] = (into[3] or 0.0) + hour.cost_usd
            into[4] += hour.unpriced
        return [
            CostRow(day, key, model, n, prompt, completion, cost, unpriced)
            for (day, key, model), (n, prompt, completion, cost, unpriced) in sorted(days.items())
        ]

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
        where: Sequence[tuple[str, str]] = (),
        per_question: bool = False,
    ) -> list[WorstRow]:
        """The ``limit`` lowest scored results, lowest first, with their reasons (among the
        traces whose request attributes match ``where``). With ``per_question``, one row per
        question (its lowest trace, with how many scored traces asked it), so one question
        asked a hundred times does not fill the list.

        Each metric is read at its current catalog version, or at ``version`` (which needs
        ``metric``). With no ``metric`` the lowest of every catalog metric are merged; each
        metric's part is read in value order from the partial index on (metric, version,
        value).
        """
        if limit < 1:
            raise ValueError("limit must be at least 1")
        versions = self.metric_versions(metric, version)
        if per_question:
            return self._worst_per_question(versions, limit, since, until, app, where)
        columns = _WORST_COLUMNS
        parts = []
        for key, key_version in versions.items():
            conditions = self._score_filters(since, until, app, {key: key_version})
            part = select(*columns).select_from(Score)
            if where:
                self._attribute_filters(None, where, conditions)
                if _joins_traces(None, where):
                    part = part.join(Trace, Trace.trace_id == Score.trace_id)
            parts.append(
                part.where(Score.status == "scored", *conditions)
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
        return [_worst_row(r) for r in rows]

    def _worst_per_question(
        self,
        versions: Mapping[str, str],
        limit: int,
        since: datetime | None,
        until: datetime | None,
        app: str | None,
        where: Sequence[tuple[str, str]],
    ) -> list[WorstRow]:
        """Per metric: read the lowest results in value order (the partial value index),
        a few times ``limit`` at a time and eight times more each round, until ``limit``
        questions are found; then count each found question's scored traces through the
        hash index on the question. Only what the answer needs is read, however many results
        the window holds."""
        rows: list[WorstRow] = []
        for key, key_version in versions.items():
            conditions = self._score_filters(since, until, app, {key: key_version})
            self._attribute_filters(None, where, conditions)
            conditions.append(Score.status == "scored")
            lowest = (
                select(*_WORST_COLUMNS, Trace.user_input.label("question"))
                .select_from(Score)
                .join(Trace, Trace.trace_id == Score.trace_id)
                .where(*conditions)
                .order_by(Score.value, Score.trace_started_at.desc(), Score.trace_id)
            )
            fetch = 4 * limit
            with self.engine.connect() as conn:
                while True:
                    batch = conn.execute(lowest.limit(fetch)).all()
                    first: dict[str, Any] = {}
                    for r in batch:
                        # A trace without a question and one with an empty question are the
                        # same "question".
                        first.setdefault(r.question or "", r)
                        if len(first) == limit:
                            break
                    if len(first) == limit or len(batch) < fetch:
                        break
                    fetch *= 8
                asked = self._count_questions(conn, conditions, list(first))
            rows.extend(
                _worst_row(r, question=r.question, traces_with_question=asked.get(question, 0))
                for question, r in first.items()
            )
        rows.sort(key=lambda r: (r.value, -r.trace_started_at.timestamp(), r.trace_id, r.metric))
        return rows[:limit]

    @staticmethod
    def _count_questions(
        conn: Connection, conditions: Sequence[ColumnElement[bool]], questions: list[str]
    ) -> dict[str, int]:
        """How many results matching ``conditions`` belong to traces asking each question
        (``""`` stands for no question)."""
        counted: dict[str, int] = {}
        asked = [q for q in questions if q]
        if asked:
            counted.update(
                (question, int(n))
                for question, n in conn.execute(
                    select(Trace.user_input, func.count())
                    .select_from(Score)
                    .join(Trace, Trace.trace_id == Score.trace_id)
                    .where(*conditions, Trace.user_input.in_(asked))
                    .group_by(Trace.user_input)
                )
            )
        if "" in questions:
            counted[""] = int(
                conn.execute(
                    select(func.count())
                    .select_from(Score)
                    .join(Trace, Trace.trace_id == Score.trace_id)
                    .where(*conditions, or_(Trace.user_input.is_(None), Trace.user_input == ""))
                ).scalar_one()
            )
        return counted

    # -- what exists, for hints ---------------------------------------------------------------
    def app_names(self, limit: int = 50) -> list[str]:
        """Names of apps with stored scores (at most ``limit``), for "did you mean" hints."""
        with self.engine.connect() as conn:
            if self.dialect.postgres:
                # DISTINCT would read every score (most of a second at ten million).
                stmt = text(
                    _distinct_values("scores", "app_name")
                    + " SELECT val FROM v WHERE val IS NOT NULL LIMIT :limit"
                )
                return list(conn.scalars(stmt, {"limit": limit}))
            return list(
                conn.scalars(
                    select(Score.app_name).distinct().order_by(Score.app_name).limit(limit)
                )
            )

    def versions_of(self, metric: str, limit: int = 50) -> list[str]:
        """Versions of ``metric`` with stored scores (at most ``limit``)."""
        with self.engine.connect() as conn:
            return list(
                conn.scalars(
                    select(Score.version)
                    .distinct()
                    .where(Score.metric == self.check_metric(metric))
                    .order_by(Score.version)
                    .limit(limit)
                )
            )

    # -- one trace -------------------------------------------------------------------------
    def record_ids_starting_with(self, prefix: str, limit: int = 20) -> list[str]:
        """Stored record ids that start with ``prefix`` (lowercase hex), at most ``limit``."""
        check_filter_text("prefix", prefix)
        if not prefix or any(c not in "0123456789abcdef" for c in prefix):
            raise ValueError(f"{prefix!r} is not the start of a record id (lowercase hex)")
        with self.engine.connect() as conn:
            return list(
                conn.scalars(
                    select(Trace.trace_id)
                    .where(Trace.trace_id >= prefix, Trace.trace_id < prefix + "g")
                    .order_by(Trace.trace_id)
                    .limit(limit)
                )
            )

    def records_of_otel_trace(self, otel_trace_id: str) -> list[str]:
        """The ids of the records stored for one OpenTelemetry trace id, oldest first (a
        trace may hold several requests)."""
        check_filter_text("otel_trace_id", otel_trace_id)
        with self.engine.connect() as conn:
            return list(
                conn.scalars(
                    select(Trace.trace_id)
                    .where(Trace.otel_trace_id == otel_trace_id)
                    .order_by(Trace.started_at, Trace.trace_id)
                )
            )

    def diagnose(self, *, metric: str, **options: Any) -> Diagnosis:
        """Which slices, reference documents and claims lose ``metric``'s recall in a window:
        see :func:`storage.diagnose.diagnose` for the options (window, app, version, where,
        q, min_count, max_values, all_slices, limit)."""
        from recalltrace.storage.diagnose import diagnose

        where = options.get("where") or ()
        options["where"] = tuple((name, check_filter_text(name, value)) for name, value in where)
        if options.get("app") is not None:
            check_filter_text("app", options["app"])
        return diagnose(self, metric=metric, **options)

    def trace(self, trace_id: str) -> TraceDetail:
        """Everything stored about one record, by its id or by the OpenTelemetry trace id it
        ran in when that trace holds this one record; raises :class:`TraceNotFound` if there
        is none, naming the records when the trace id matches several."""
        check_filter_text("trace_id", trace_id)
        with self.engine.connect() as conn:
            found = conn.scalar(select(Trace.trace_id).where(Trace.trace_id == trace_id))
        if found is None:
            records = self.records_of_otel_trace(trace_id)
            if len(records) > 1:
                raise TraceNotFound(
                    f"the OpenTelemetry trace {trace_id} holds {len(records)} requests; show "
                    f"one of their records: {', '.join(records)}"
                )
            if records:
                trace_id = records[0]
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
                    Trace.otel_trace_id,
                    Trace.otel_span_id,
                    Trace.release,
                    Trace.environment,
                    Trace.user_id,
                    Trace.session_id,
                    Trace.tags,
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
            started_at=as_utc(trace.started_at),
            duration_ms=float(trace.duration_ms),
            user_input=trace.user_input,
            response=trace.response,
            reference=trace.reference,
            reference_contexts=trace.reference_contexts,
            reference_context_ids=trace.reference_context_ids,
            metadata=trace[10] or {},
            error=bool(trace.error),
            notes=trace.notes or [],
            otel_trace_id=trace.otel_trace_id,
            otel_span_id=trace.otel_span_id,
            attributes={
                name: value
                for name, value in (
                    ("release", trace.release),
                    ("environment", trace.environment),
                    ("user_id", trace.user_id),
                    ("session_id", trace.session_id),
                    ("tags", trace.tags),
                )
                if value
            },
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
                    scored_at=as_utc(s.scored_at),
                )
                for s in scores
            ),
            jobs=tuple(jobs),
        )

    # -- jobs ------------------------------------------------------------------------------
    def _now(self, conn: Connection) -> datetime:
        """The database clock on Postgres (it decides leases there), else the local clock."""
        if self.dialect.postgres:
            now: datetime = conn.execute(select(func.now())).scalar_one()
            return as_utc(now)
        return datetime.now(timezone.utc)

    def _job_rows(self, conn: Connection, stmt: Any, *, stuck_after: timedelta) -> list[JobRow]:
        now = self._now(conn)
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
            rows = self._job_rows(conn, stmt, stuck_after=stuck_after)
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
            now = self._now(conn)
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
        return "overdue"  # or "unserved", decided by problem_jobs from the workers table
    if status == JobStatus.WAITING and expires_at is not None and expires_at < now:
        return "reference_expired"
    return None
