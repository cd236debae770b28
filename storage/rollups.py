"""Per-hour rollups of the scores that ``scores compare`` and ``scores cost`` read (Postgres).

Both answers are sums, so a window is the sum of its hours: the hours that have ended and lie
wholly inside the window are read from a cache table (computed once, by the first query or by a
worker's background pass), and only the partial hours at the window's edges are computed live.
At ten million scores that turns a scan of every score of a week into a few thousand cached
rows and two hour-long index ranges.

- ``group_cache`` holds, per hour of trace start, variant version, scope and grouping attribute
  (release, environment, tag), each group's count, sum, sum of squares and count of values
  other than 0 and 1. It changes exactly where the summary cache does (a score written or
  deleted in that hour, traces deleted before a cutoff), so
  :func:`storage.summary_cache.invalidate` drops both.
- ``cost_cache`` holds, per hour of *scoring*, scope (app, and release or environment
  filters), variant and judge model, the count, tokens and money. A score written or deleted
  drops the hour it is or was stored in (:func:`storage.summary_cache.invalidate`), and one
  replaced by an upsert the hours from its trace's start on (:func:`invalidate_cost_from`).

Fills take the summary cache's exclusive lock, so no score can land in an hour between its
rollup being computed and stored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection

from recalltrace.storage import summary_cache
from recalltrace.storage._dialect import Dialect
from recalltrace.storage.models import CostCache, GroupCache

HOUR = timedelta(hours=1)

#: Attributes whose groups are rolled up (kept on the score rows, or tags).
GROUPED = ("release", "environment", "tag")

MAX_ROLLED_TAGS = 200
"""Tags are rolled up only while traces carry at most this many distinct ones."""


def split_window(
    lower: datetime, upper: datetime, now: datetime
) -> tuple[list[datetime], list[datetime]]:
    """The hours of ``[lower, upper)``: those wholly inside it and ended before ``now``
    (cacheable), and the others (partial or still filling, computed live)."""
    complete: list[datetime] = []
    partial: list[datetime] = []
    cursor = summary_cache.hour_of(lower)
    while cursor < upper:
        whole = cursor >= lower and cursor + HOUR <= upper and cursor + HOUR <= now
        (complete if whole else partial).append(cursor)
        cursor += HOUR
    return complete, partial


# -- groups ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class GroupHour:
    """One group's sums over one hour of trace starts."""

    bucket_start: datetime
    group: str | None
    count: int
    total: float
    total_squares: float
    fractional: int
    first_started: datetime


def _group_sql(by: str, attributes: Sequence[str], with_app: bool) -> Any:
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


def _aggregate_groups(
    conn: Connection,
    starts: Sequence[datetime],
    *,
    metric: str,
    version: str,
    by: str,
    app: str | None,
    attributes: Mapping[str, str],
    lower: datetime,
    upper: datetime,
) -> list[GroupHour]:
    if not starts:
        return []
    conn.execute(text("SET LOCAL jit = off"))
    rows = conn.execute(
        _group_sql(by, sorted(attributes), app is not None),
        {
            "starts": list(starts),
            "metric": metric,
            "version": version,
            "app": app,
            "lower": lower,
            "upper": upper,
            **{f"attr_{name}": value for name, value in attributes.items()},
        },
    ).all()
    return [
        GroupHour(
            summary_cache.as_utc(r.bucket_start),
            r.grp,
            int(r.n),
            float(r.total or 0.0),
            float(r.total_sq or 0.0),
            int(r.fractional),
            summary_cache.as_utc(r.first_started),
        )
        for r in rows
    ]


def group_hours(
    engine: Any,
    *,
    metric: str,
    version: str,
    by: str,
    scope: str,
    app: str | None,
    attributes: Mapping[str, str],
    lower: datetime,
    upper: datetime,
    now: datetime,
    fill_only: bool = False,
) -> list[GroupHour]:
    """Every group's sums per hour over ``[lower, upper)``: ended whole hours from the cache
    (computing and storing the missing ones), the others live. With ``fill_only``, only
    store the missing hours and return what was computed (a background pass)."""
    complete, partial = split_window(lower, upper, now)
    if fill_only:
        partial = []
    params: dict[str, Any] = {
        "metric": metric,
        "version": version,
        "by": by,
        "app": app,
        "attributes": attributes,
        "lower": lower,
        "upper": upper,
    }
    with engine.connect() as conn:
        cached: list[GroupHour] = []
        if fill_only:
            seen = _stored_hours(conn, metric, version, scope, by, complete)
        else:
            cached, seen = _read_groups(conn, metric, version, scope, by, complete)
        live = _aggregate_groups(conn, partial, **params)
        conn.rollback()
    missing = sorted(set(complete) - seen)
    fresh: list[GroupHour] = []
    if missing:
        with engine.begin() as fill:
            summary_cache.lock_for_fill(fill)
            fresh = _aggregate_groups(fill, missing, **params)
            _store_groups(fill, metric, version, scope, by, missing, fresh, now)
    return cached + fresh + live


def _cached_rows(
    metric: str, version: str, scope: str, by: str, starts: Sequence[datetime]
) -> list[Any]:
    """The conditions on ``group_cache`` of one variant, scope and attribute over the hours
    from the first of ``starts`` to the last."""
    return [
        GroupCache.metric == metric,
        GroupCache.version == version,
        GroupCache.scope == scope,
        GroupCache.attribute == by,
        GroupCache.bucket_start >= min(starts),
        GroupCache.bucket_start <= max(starts),
    ]


def _stored_hours(
    conn: Connection,
    metric: str,
    version: str,
    scope: str,
    by: str,
    starts: Sequence[datetime],
) -> set[datetime]:
    if not starts:
        return set()
    stmt = (
        select(GroupCache.bucket_start)
        .distinct()
        .where(*_cached_rows(metric, version, scope, by, starts))
    )
    return {summary_cache.as_utc(start) for start in conn.execute(stmt).scalars()} & set(starts)


def _read_groups(
    conn: Connection,
    metric: str,
    version: str,
    scope: str,
    by: str,
    starts: Sequence[datetime],
) -> tuple[list[GroupHour], set[datetime]]:
    if not starts:
        return [], set()
    stmt = select(GroupCache.__table__).where(*_cached_rows(metric, version, scope, by, starts))
    wanted = set(starts)
    rows: list[GroupHour] = []
    seen: set[datetime] = set()
    for r in conn.execute(stmt):
        start = summary_cache.as_utc(r.bucket_start)
        if start not in wanted:
            continue
        seen.add(start)
        if r.n:  # not the mark of an hour without results
            rows.append(
                GroupHour(
                    start,
                    None if r.missing else r.group_value,
                    r.n,
                    r.total,
                    r.total_sq,
                    r.fractional,
                    summary_cache.as_utc(r.first_started),
                )
            )
    return rows, seen


def recent_groups(conn: Connection, by: str, since: datetime, limit: int) -> list[str]:
    """The ``limit`` values of ``by`` seen most recently since ``since`` (every app, any
    variant), from the rolled-up hours."""
    if limit < 1:
        return []
    rows = conn.execute(
        select(GroupCache.group_value)
        .where(
            GroupCache.attribute == by,
            GroupCache.scope == "",
            GroupCache.missing.is_(False),
            GroupCache.bucket_start >= since,
        )
        .group_by(GroupCache.group_value)
        .order_by(func.max(GroupCache.bucket_start).desc(), GroupCache.group_value)
        .limit(limit)
    )
    return list(rows.scalars())


# An hour without any scored result is stored as a row with no results (a real group has at
# least one), under a key no group has (the group of traces without the attribute has an
# empty value), so that it is not computed again on every query.
_EMPTY_HOUR = "(no results)"


def _store_groups(
    conn: Connection,
    metric: str,
    version: str,
    scope: str,
    by: str,
    hours: Sequence[datetime],
    rows: Sequence[GroupHour],
    computed_at: datetime,
) -> None:
    found = {r.bucket_start for r in rows}
    empty = [
        GroupHour(hour, _EMPTY_HOUR, 0, 0.0, 0.0, 0, hour) for hour in hours if hour not in found
    ]
    values = [
        {
            "bucket_start": r.bucket_start,
            "metric": metric,
            "version": version,
            "scope": scope,
            "attribute": by,
            "missing": r.group is None or r.count == 0,
            "group_value": r.group or "",
            "n": r.count,
            "total": r.total,
            "total_sq": r.total_squares,
            "fractional": r.fractional,
            "first_started": r.first_started,
            "computed_at": computed_at,
        }
        for r in [*rows, *empty]
    ]
    for start in range(0, len(values), 1000):
        _upsert_groups(conn, values[start : start + 1000])


def _upsert_groups(conn: Connection, values: list[dict[str, Any]]) -> None:
    stmt = pg_insert(GroupCache).values(values)
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=[
                "bucket_start",
                "metric",
                "version",
                "scope",
                "attribute",
                "missing",
                "group_value",
            ],
            set_={
                k: stmt.excluded[k]
                for k in ("n", "total", "total_sq", "fractional", "first_started", "computed_at")
            },
        )
    )


# -- judge cost -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CostHour:
    """Judge spend of one variant and model over one hour of scoring."""

    hour: datetime
    metric: str
    model: str
    count: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None
    unpriced: int


def _cost_sql(with_app: bool, with_metric: bool, attributes: Sequence[str]) -> Any:
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


def _aggregate_cost(
    conn: Connection,
    starts: Sequence[datetime],
    *,
    app: str | None,
    attributes: Mapping[str, str],
    metric: str | None,
    lower: datetime,
    upper: datetime,
) -> list[CostHour]:
    if not starts:
        return []
    conn.execute(text("SET LOCAL jit = off"))
    rows = conn.execute(
        _cost_sql(app is not None, metric is not None, sorted(attributes)),
        {
            "starts": list(starts),
            "app": app,
            "metric": metric,
            "lower": lower,
            "upper": upper,
            **{f"attr_{name}": value for name, value in attributes.items()},
        },
    ).all()
    return [
        CostHour(
            summary_cache.as_utc(r.hour),
            r.metric,
            r.model,
            int(r.n),
            int(r.prompt),
            int(r.completion),
            None if r.cost is None else float(r.cost),
            int(r.unpriced),
        )
        for r in rows
    ]


def cost_hours(
    engine: Any,
    *,
    scope: str,
    app: str | None,
    attributes: Mapping[str, str],
    metric: str | None,
    lower: datetime,
    upper: datetime,
    now: datetime,
) -> list[CostHour]:
    """Judge spend per hour, variant and model over scoring times in ``[lower, upper)`` of
    the scores of ``app`` with the given ``attributes`` (release, environment), cached under
    ``scope``: ended whole hours from the cache (every variant of the scope; computing and
    storing the missing ones), the others live."""
    complete, partial = split_window(lower, upper, now)
    window: dict[str, Any] = {
        "app": app,
        "attributes": attributes,
        "lower": lower,
        "upper": upper,
    }
    with engine.connect() as conn:
        cached, seen = _read_cost(conn, scope, complete)
        live = _aggregate_cost(conn, partial, metric=metric, **window)
        conn.rollback()
    missing = sorted(set(complete) - seen)
    fresh: list[CostHour] = []
    if missing:
        with engine.begin() as fill:
            summary_cache.lock_for_fill(fill)
            fresh = _aggregate_cost(fill, missing, metric=None, **window)
            _store_cost(fill, scope, missing, fresh, now)
    rows = cached + fresh
    if metric is not None:
        rows = [r for r in rows if r.metric == metric]
    return rows + live


# An hour without any judge call is stored as this row, so it is not computed again.
_NO_CALLS = ""


def _read_cost(
    conn: Connection, scope: str, starts: Sequence[datetime]
) -> tuple[list[CostHour], set[datetime]]:
    if not starts:
        return [], set()
    wanted = set(starts)
    rows: list[CostHour] = []
    seen: set[datetime] = set()
    for r in conn.execute(
        select(CostCache.__table__).where(
            CostCache.scope == scope,
            CostCache.hour >= min(starts),
            CostCache.hour <= max(starts),
        )
    ):
        hour = summary_cache.as_utc(r.hour)
        if hour not in wanted:
            continue
        seen.add(hour)
        if r.metric != _NO_CALLS:
            rows.append(
                CostHour(
                    hour,
                    r.metric,
                    r.model,
                    r.n,
                    r.prompt_tokens,
                    r.completion_tokens,
                    r.cost_usd,
                    r.unpriced,
                )
            )
    return rows, seen


def _store_cost(
    conn: Connection,
    scope: str,
    hours: Sequence[datetime],
    rows: Sequence[CostHour],
    computed_at: datetime,
) -> None:
    values = [
        {
            "hour": r.hour,
            "scope": scope,
            "metric": r.metric,
            "model": r.model,
            "n": r.count,
            "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.completion_tokens,
            "cost_usd": r.cost_usd,
            "unpriced": r.unpriced,
            "computed_at": computed_at,
        }
        for r in rows
    ]
    spent = {r.hour for r in rows}
    values += [
        {
            "hour": hour,
            "scope": scope,
            "metric": _NO_CALLS,
            "model": _NO_CALLS,
            "n": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "cost_usd": None,
            "unpriced": 0,
            "computed_at": computed_at,
        }
        for hour in hours
        if hour not in spent
    ]
    for start in range(0, len(values), 1000):
        stmt = pg_insert(CostCache).values(values[start : start + 1000])
        conn.execute(
            stmt.on_conflict_do_update(
                index_elements=["hour", "scope", "metric", "model"],
                set_={
                    k: stmt.excluded[k]
                    for k in (
                        "n",
                        "prompt_tokens",
                        "completion_tokens",
                        "cost_usd",
                        "unpriced",
                        "computed_at",
                    )
                },
            )
        )


def invalidate_cost_from(conn: Connection, dialect: Dialect, earliest: datetime) -> None:
    """Drop the cost rows of every hour from the one holding ``earliest`` on: results of
    traces started then were replaced, and a result is stored after its trace started, so
    the hours they had been stored in are among these (a rare, bounded over-drop instead of
    reading every result's old time before each write)."""
    if dialect.postgres:
        conn.execute(delete(CostCache).where(CostCache.hour >= summary_cache.hour_of(earliest)))


def invalidate_all_cost(conn: Connection, dialect: Dialect) -> None:
    """Drop every cost row (retention deleted scores stored at any time)."""
    if dialect.postgres:
        conn.execute(delete(CostCache))
