"""Every statement only Postgres runs, in one place.

The read caches (summaries, hourly rollups of groups and judge cost) are kept on Postgres only,
and so are the statements that read them fast there: one small lateral aggregate per bucket
(``percentile_cont`` has no SQLite counterpart), skip scans by recursive ``WITH``, the advisory
lock between score writers and cache fills, ``COPY`` for trace batches and ``pg_notify``.
:class:`~storage._dialect.PostgresDialect` and the cached read paths use these; nothing here
decides *whether* to run them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import TextClause, func, literal_column, select, text

SUMMARY_LOCK_KEY = 0x7265_6361_6C6C
"""Postgres advisory lock between score writers (shared) and cache fills (exclusive)."""

JIT_OFF = text("SET LOCAL jit = off")
"""Run before a cache aggregate: a plan this size crosses the default JIT threshold on big
tables, and compiling costs more than the query itself."""


def lock_shared() -> Any:
    """The shared side of :data:`SUMMARY_LOCK_KEY`, taken by every writer of scores."""
    return select(func.pg_advisory_xact_lock_shared(SUMMARY_LOCK_KEY))


def lock_exclusive() -> Any:
    """The exclusive side of :data:`SUMMARY_LOCK_KEY`, held by a cache fill."""
    return select(func.pg_advisory_xact_lock(SUMMARY_LOCK_KEY))


def notify(channel: str) -> Any:
    """Wake the workers listening on ``channel``."""
    return select(func.pg_notify(channel, ""))


def replaced_column() -> Any:
    """In an upsert's ``RETURNING``: whether the row replaced one (an updated row version
    carries the writing transaction in ``xmax``, an inserted one 0)."""
    return literal_column("xmax::text <> '0'").label("replaced")


def utc_day(column: Any) -> Any:
    """The UTC day holding the timestamp ``column``."""
    return func.date_trunc("day", func.timezone("UTC", column))


INVALIDATE = text(
    """
    WITH summaries AS (
        DELETE FROM summary_cache
        WHERE (bucket, bucket_start, metric) IN (
            SELECT * FROM unnest(CAST(:buckets AS text[]), CAST(:starts AS timestamptz[]),
                                 CAST(:metrics AS text[])))
    ), groups AS (
        DELETE FROM group_cache
        WHERE (metric, bucket_start) IN (
            SELECT * FROM unnest(CAST(:hour_metrics AS text[]), CAST(:hours AS timestamptz[])))
    )
    DELETE FROM cost_cache WHERE hour = ANY(CAST(:scored_hours AS timestamptz[]))
    """
)
"""Drop the summaries of (bucket, start, metric), the group sums of (metric, hour) and the
cost rows of scoring hours, in one round trip."""


def distinct_values(table: str, column: str) -> str:
    """A recursive ``WITH`` naming ``v(val)``, the distinct values of ``column`` in ``table`` in
    order (a last ``NULL`` ends it), for a query to follow. One probe of an index led by
    ``column`` per value (a skip scan), where ``DISTINCT`` reads every row."""
    return f"""
        WITH RECURSIVE v(val) AS (
            (SELECT {column} FROM {table} WHERE {column} IS NOT NULL ORDER BY {column} LIMIT 1)
            UNION ALL
            SELECT (SELECT {column} FROM {table} WHERE {column} > v.val
                    ORDER BY {column} LIMIT 1)
            FROM v WHERE v.val IS NOT NULL
        )"""


def values_in_window(
    table: str, column: str, started: str, since: bool, until: bool
) -> tuple[TextClause, TextClause]:
    """The distinct values of ``column`` in ``table`` among rows whose ``started`` lies in the
    window (``:since``/``:until`` when given), at most ``:most`` (a skip scan of the
    (attribute, start) index, one probe per value); and whether some row there lacks one."""
    window = ""
    if since:
        window += f" AND w.{started} >= :since"
    if until:
        window += f" AND w.{started} < :until"
    values = text(
        distinct_values(table, column)
        + f"""
        SELECT val FROM v
        WHERE val IS NOT NULL
          AND EXISTS (SELECT 1 FROM {table} AS w WHERE w.{column} = v.val {window})
        LIMIT :most
        """
    )
    missing = text(f"SELECT EXISTS (SELECT 1 FROM {table} AS w WHERE w.{column} IS NULL{window})")
    return values, missing


def count_distinct_upto(table: str, column: str) -> TextClause:
    """How many distinct values ``column`` has in ``table``, counted up to ``:most``."""
    return text(
        distinct_values(table, column)
        + " SELECT count(*) FROM (SELECT val FROM v WHERE val IS NOT NULL LIMIT :most) AS f"
    )


def summary_sql(
    *, with_app: bool, attributes: Sequence[str] = (), missing: Sequence[str] = ()
) -> TextClause:
    """The summary of chosen (bucket, metric) pairs: one small aggregate each.

    Each lateral aggregate is an index-only range scan of ``ix_scores_metric_version_started``, so
    the only sorts are the small per-bucket ones ``percentile_cont`` needs anyway. A plain
    ``GROUP BY`` first sorts every row of the window by its group (three times slower for a
    week of scores), and ``date_trunc(..., 'UTC')`` adds a time-zone lookup per row. Buckets
    are fixed steps from a UTC-truncated start, the same boundaries ``date_trunc(..., 'UTC')``
    gives.
    """
    app_filter = "AND sc.app_name = :app" if with_app else ""
    # Release and environment are on the score rows (and in the covering index): filtering
    # by them keeps the scan index-only. Only these two names reach here (see Selection.scope).
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


def group_sql(by: str, attributes: Sequence[str], with_app: bool) -> TextClause:
    """Each group's count, sum, sum of squares, non-0/1 count and first start per hour of
    ``:starts`` (``by``: release, environment or tag)."""
    if by == "tag":
        source = "scores AS sc LEFT JOIN trace_tags AS tt ON tt.trace_id = sc.trace_id"
        column = "tt.tag"
    elif by in ("release", "environment"):
        source, column = "scores AS sc", f"sc.{by}"
    else:
        raise ValueError(f"no rollup by {by!r}")
    filters = " AND sc.app_name = :app" if with_app else ""
    for name in attributes:  # only release and environment reach here
        filters += f" AND sc.{name} = :attr_{name}"
    return text(
        f"""
        SELECT p.bucket_start, g.grp, g.n, g.total, g.total_sq, g.fractional, g.first_started
        FROM unnest(CAST(:starts AS timestamptz[])) AS p(bucket_start)
        CROSS JOIN LATERAL (
            SELECT {column} AS grp, count(*) AS n, sum(sc.value) AS total,
                   sum(sc.value * sc.value) AS total_sq,
                   count(*) FILTER (WHERE sc.value <> 0 AND sc.value <> 1) AS fractional,
                   min(sc.trace_started_at) AS first_started
            FROM {source}
            WHERE sc.metric = :metric AND sc.version = :version AND sc.status = 'scored'
              AND sc.trace_started_at >= p.bucket_start
              AND sc.trace_started_at < p.bucket_start + interval '1 hour'
              AND sc.trace_started_at >= :lower AND sc.trace_started_at < :upper
              {filters}
            GROUP BY 1
        ) AS g
        """
    )


def cost_sql(with_app: bool, with_metric: bool, attributes: Sequence[str]) -> TextClause:
    """Judge spend per variant and model in each scoring hour of ``:starts``."""
    filters = (" AND sc.app_name = :app" if with_app else "") + (
        " AND sc.metric = :metric" if with_metric else ""
    )
    for name in attributes:  # only release and environment reach here
        filters += f" AND sc.{name} = :attr_{name}"
    return text(
        f"""
        SELECT p.hour, c.metric, c.model, c.n, c.prompt, c.completion, c.cost, c.unpriced
        FROM unnest(CAST(:starts AS timestamptz[])) AS p(hour)
        CROSS JOIN LATERAL (
            SELECT sc.metric, sc.model, count(*) AS n,
                   coalesce(sum(sc.prompt_tokens), 0) AS prompt,
                   coalesce(sum(sc.completion_tokens), 0) AS completion,
                   sum(sc.cost_usd) AS cost,
                   count(*) FILTER (WHERE sc.cost_usd IS NULL) AS unpriced
            FROM scores AS sc
            WHERE sc.scored_at >= p.hour AND sc.scored_at < p.hour + interval '1 hour'
              AND sc.scored_at >= :lower AND sc.scored_at < :upper
              AND sc.model IS NOT NULL {filters}
            GROUP BY sc.metric, sc.model
        ) AS c
        """
    )


# -- COPY of a trace batch (binary; the column types in order) -------------------------------
COPY_TRACES = (
    "COPY traces (trace_id, app_name, service_name, started_at, duration_ms,"
    " user_input, response, reference, reference_contexts,"
    " reference_context_ids, metadata, error, notes, created_at,"
    " otel_trace_id, otel_span_id, release, environment, user_id, session_id,"
    " tags)"
    " FROM STDIN (FORMAT BINARY)"
)
COPY_CONTEXTS = (
    "COPY retrieved_contexts (trace_id, position, context_id, content, score,"
    " metadata) FROM STDIN (FORMAT BINARY)"
)
COPY_TAGS = "COPY trace_tags (trace_id, tag) FROM STDIN"
COPY_JOBS = (
    "COPY scoring_jobs (trace_id, metric, version, status, attempts, run_at,"
    " expires_at, created_at, updated_at) FROM STDIN (FORMAT BINARY)"
)
# Column types of the binary COPY statements above, in column order.
TRACE_COPY_TYPES = [
    "varchar", "varchar", "varchar", "timestamptz", "float8", "text", "text", "text",
    "jsonb", "jsonb", "jsonb", "bool", "jsonb", "timestamptz", "varchar", "varchar",
    "varchar", "varchar", "varchar", "varchar", "jsonb",
]  # fmt: skip
CONTEXT_COPY_TYPES = ["varchar", "int4", "varchar", "text", "float8", "jsonb"]
JOB_COPY_TYPES = [
    "varchar", "varchar", "varchar", "varchar", "int4",
    "timestamptz", "timestamptz", "timestamptz", "timestamptz",
]  # fmt: skip
NOTIFY_RAW = "SELECT pg_notify(%s, '')"
"""``pg_notify`` on a raw psycopg cursor (inside a COPY batch)."""
