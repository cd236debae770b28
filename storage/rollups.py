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
  drops the hour it is or was stored in, and one replaced by an upsert the hours from its
  trace's start on (the same :func:`storage.summary_cache.invalidate`).

Both are read through :func:`storage.summary_cache.read_through`, whose fills take the
exclusive lock, so no score can land in an hour between its rollup being computed and stored.
The aggregates are Postgres statements (:mod:`storage._postgres`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial as bind
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.engine import Connection

from recalltrace.storage import _postgres
from recalltrace.storage._dialect import Dialect, as_utc, hour_of
from recalltrace.storage.models import CostCache, GroupCache
from recalltrace.storage.summary_cache import CachedRead, read_through

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
    cursor = hour_of(lower)
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
    conn.execute(_postgres.JIT_OFF)
    rows = conn.execute(
        _postgres.group_sql(by, sorted(attributes), app is not None),
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
            as_utc(r.bucket_start),
            r.grp,
            int(r.n),
            float(r.total or 0.0),
            float(r.total_sq or 0.0),
            int(r.fractional),
            as_utc(r.first_started),
        )
        for r in rows
    ]


def group_hours(
    engine: Engine,
    dialect: Dialect,
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
    compute = bind(
        _aggregate_groups,
        metric=metric,
        version=version,
        by=by,
        app=app,
        attributes=attributes,
        lower=lower,
        upper=upper,
    )
    cache: CachedRead[datetime, GroupHour] = CachedRead(
        read=bind(_read_groups, metric=metric, version=version, scope=scope, by=by),
        compute=compute,
        store=bind(
            _store_groups, dialect, metric=metric, version=version, scope=scope, by=by, now=now
        ),
        stored=bind(_stored_hours, metric=metric, version=version, scope=scope, by=by),
    )
    return read_through(
        engine, dialect, cache, complete, [] if fill_only else partial, fill_only=fill_only
    )


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
    starts: Sequence[datetime],
    *,
    metric: str,
    version: str,
    scope: str,
    by: str,
) -> set[datetime]:
    if not starts:
        return set()
    stmt = (
        select(GroupCache.bucket_start)
        .distinct()
        .where(*_cached_rows(metric, version, scope, by, starts))
    )
    return {as_utc(start) for start in conn.execute(stmt).scalars()} & set(starts)


def _read_groups(
    conn: Connection,
    starts: Sequence[datetime],
    *,
    metric: str,
    version: str,
    scope: str,
    by: str,
) -> tuple[list[GroupHour], set[datetime]]:
    if not starts:
        return [], set()
    stmt = select(GroupCache.__table__).where(*_cached_rows(metric, version, scope, by, starts))
    wanted = set(starts)
    rows: list[GroupHour] = []
    seen: set[datetime] = set()
    for r in conn.execute(stmt):
        start = as_utc(r.bucket_start)
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
                    as_utc(r.first_started),
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
    dialect: Dialect,
    conn: Connection,
    hours: Sequence[datetime],
    rows: Sequence[GroupHour],
    *,
    metric: str,
    version: str,
    scope: str,
    by: str,
    now: datetime,
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
            "computed_at": now,
        }
        for r in [*rows, *empty]
    ]
    dialect.upsert(
        conn,
        GroupCache.__table__,
        values,
        keys=(
            "bucket_start",
            "metric",
            "version",
            "scope",
            "attribute",
            "missing",
            "group_value",
        ),
        replace=("n", "total", "total_sq", "fractional", "first_started", "computed_at"),
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
    conn.execute(_postgres.JIT_OFF)
    rows = conn.execute(
        _postgres.cost_sql(app is not None, metric is not None, sorted(attributes)),
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
            as_utc(r.hour),
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
    engine: Engine,
    dialect: Dialect,
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
    cache: CachedRead[datetime, CostHour] = CachedRead(
        read=bind(_read_cost, scope=scope),
        compute=bind(_aggregate_cost, metric=None, **window),
        store=bind(_store_cost, dialect, scope=scope, now=now),
        live=bind(_aggregate_cost, metric=metric, **window),
    )
    rows = read_through(engine, dialect, cache, complete, partial)
    # The cached hours hold every variant of the scope (the live ones only ``metric``'s).
    return rows if metric is None else [r for r in rows if r.metric == metric]


# An hour without any judge call is stored as this row, so it is not computed again.
_NO_CALLS = ""


def _read_cost(
    conn: Connection, starts: Sequence[datetime], *, scope: str
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
        hour = as_utc(r.hour)
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
    dialect: Dialect,
    conn: Connection,
    hours: Sequence[datetime],
    rows: Sequence[CostHour],
    *,
    scope: str,
    now: datetime,
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
            "computed_at": now,
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
            "computed_at": now,
        }
        for hour in hours
        if hour not in spent
    ]
    dialect.upsert(
        conn,
        CostCache.__table__,
        values,
        keys=("hour", "scope", "metric", "model"),
        replace=("n", "prompt_tokens", "completion_tokens", "cost_usd", "unpriced", "computed_at"),
    )
