"""The differences between Postgres and SQLite, in one place.

Postgres is the production store: its clock decides who owns a job (workers on hosts with
skewed clocks still agree), ``pg_notify`` wakes idle workers, ``COPY`` writes trace batches,
``FOR UPDATE SKIP LOCKED`` lets workers claim side by side, and the read caches (summaries,
hourly rollups) are kept there, guarded by an advisory lock. SQLite, the embedded default, uses
the local clock, has no one to notify, writes row by row and keeps no cache.

:class:`Dialect` is the portable behaviour (what SQLite gets); :class:`PostgresDialect`
overrides what Postgres does differently, with the statements of :mod:`._postgres`. Callers
ask :func:`dialect_of` for an engine's dialect and call its methods instead of testing which
backend they run on.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, bindparam, delete, func, literal, select, text
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import Connection

from recalltrace.storage import _postgres
from recalltrace.storage.contracts import NOTIFY_CHANNEL
from recalltrace.storage.db import is_postgres
from recalltrace.storage.models import (
    CostCache,
    DiagnoseCache,
    GroupCache,
    SummaryCache,
    UTCDateTime,
)

if TYPE_CHECKING:
    from recalltrace.storage.records import TraceRecord


def utcnow() -> datetime:
    """The local clock, timezone-aware in UTC."""
    return datetime.now(timezone.utc)


def as_utc(value: datetime) -> datetime:
    """``value`` in UTC; a naive time (as SQLite returns) is taken to be UTC already."""
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def hour_of(moment: datetime) -> datetime:
    """The start of the UTC hour holding ``moment``."""
    return as_utc(moment).replace(minute=0, second=0, microsecond=0)


@dataclass
class ScoreChanges:
    """What a writer of scores changed in one transaction, for the caches to forget.

    ``touched``: (metric, trace start) of every score written or deleted; ``scored``: the times
    those results are or were stored at; ``replaced_from``: the earliest trace start of a result
    an upsert replaced (its old scoring time is unknown); ``deleted_before``: traces started
    before this were deleted (with their scores).
    """

    touched: list[tuple[str, datetime]] = field(default_factory=list)
    scored: list[datetime] = field(default_factory=list)
    replaced_from: datetime | None = None
    deleted_before: datetime | None = None

    def __bool__(self) -> bool:
        return bool(self.touched or self.scored) or (
            self.replaced_from is not None or self.deleted_before is not None
        )


class Dialect:
    """What a backend does, for one engine: the portable behaviour, which SQLite gets."""

    __slots__ = ()

    postgres: bool = False
    """Whether this is Postgres (for :attr:`JobStore.is_postgres`; do not branch on it)."""

    keeps_caches: bool = False
    """Whether history keeps read caches (summaries, hourly rollups) on this backend."""

    migrates_on_open: bool = True
    """Whether opening a repository runs the migrations by default: the embedded default
    just works; on a server, ``recalltrace db upgrade`` is a deliberate deployment step."""

    # -- time ------------------------------------------------------------------------------
    def refuses_writes(self, engine: Engine) -> bool:
        """Whether the database refuses writes (SQLite: the file is not writable)."""
        path = engine.url.database
        return bool(
            path
            and path != ":memory:"
            and not str(path).startswith("file:")
            and os.path.exists(path)
            and not os.access(path, os.W_OK)
        )

    def now(self) -> Any:
        """The database's clock on Postgres; the local UTC clock on SQLite."""
        return utcnow()

    def clock(self, conn: Connection) -> datetime:
        """The time that decides when work happens, as a value: the database's ``now()`` (the
        start of ``conn``'s transaction) on Postgres, whatever the writing process's clock says;
        the writing process's clock on SQLite (the processes sharing a file share a host)."""
        return utcnow()

    def now_sql(self, offset: timedelta = timedelta(0)) -> Any:
        """Like :meth:`now` plus ``offset``, always as a SQL expression (for SELECTs)."""
        return literal(utcnow() + offset, UTCDateTime())

    def utc_day(self, column: Any) -> Any:
        """The UTC day holding the timestamp ``column`` (an ISO string on SQLite)."""
        return func.substr(column, 1, 10)

    # -- writes ----------------------------------------------------------------------------
    def insert(self, table: Any) -> Any:
        """An INSERT that supports ``on_conflict_do_*`` and ``returning`` on this backend."""
        return sqlite_dialect.insert(table)

    def upsert(
        self,
        conn: Connection,
        table: Any,
        values: Sequence[dict[str, Any]],
        keys: Sequence[str],
        replace: Sequence[str],
    ) -> None:
        """Insert ``values``; a row whose ``keys`` exist gets the ``replace`` columns."""
        for start in range(0, len(values), 1000):
            stmt = self.insert(table).values(list(values[start : start + 1000]))
            conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=list(keys), set_={k: stmt.excluded[k] for k in replace}
                )
            )

    def replaced_marker(self) -> tuple[Any, ...]:
        """Columns an upsert's ``RETURNING`` adds to say whether it replaced a row (none: this
        backend cannot say)."""
        return ()

    def write_traces(
        self,
        batch: Sequence[TraceRecord],
        *,
        by_rows: Callable[[Sequence[TraceRecord]], set[str]],
        by_copy: Callable[[Sequence[TraceRecord]], set[str]],
    ) -> set[str]:
        """Write a batch of new traces: row by row here, by ``COPY`` on Postgres. Returns the
        ids of the records found stored already (not written now)."""
        return by_rows(batch)

    # -- the queue -------------------------------------------------------------------------
    def skip_locked(self, stmt: Any) -> Any:
        """``stmt`` (a SELECT of due jobs) made safe for claimers working side by side."""
        return stmt

    def notify(self, conn: Connection) -> None:
        """Wake idle workers (Postgres); nothing to do on SQLite."""

    def notify_dsn(self, engine: Engine) -> str | None:
        """The libpq connection string workers ``LISTEN`` on (Postgres); ``None`` here."""
        return None

    # -- the read caches -------------------------------------------------------------------
    def lock_score_writes(self, conn: Connection) -> None:
        """Take the lock every writer of scores shares with the cache fills (Postgres)."""

    def lock_for_fill(self, conn: Connection) -> None:
        """Hold the lock no writer of scores can share while a cache fill computes and stores."""

    def drop_cached(self, conn: Connection, changes: ScoreChanges) -> None:
        """Drop the cached rows ``changes`` make stale (no cache kept here)."""

    def tune_for_aggregates(self, conn: Connection) -> None:
        """Settings of this transaction for a few large aggregates over a window (none)."""

    # -- JSON in aggregates ----------------------------------------------------------------
    def json_elements(self, column: Any, key: str) -> Any:
        """The elements of the JSON array ``column[key]`` as a table with a ``value`` column
        (text for strings, a JSON object for objects)."""
        return func.json_each(column, f"$.{key}").table_valued("value")

    def json_field(self, element: Any, key: str) -> Any:
        """``element[key]`` of a JSON object element (its SQL value here, text on Postgres)."""
        return func.json_extract(element, f"$.{key}")

    def json_text(self, element: Any) -> Any:
        """A JSON string element (of :meth:`json_elements`) as text."""
        return element

    def json_is(self, field: Any, value: bool | int) -> Any:
        """Whether a field of :meth:`json_field` holds the JSON ``value``."""
        return field == value

    def json_item(self, column: Any, index: Any) -> Any:
        """The JSON array ``column``'s item at ``index`` (a string item as text)."""
        return func.json_extract(column, func.printf("$[%d]", index))

    def json_scalar_pairs(self, column: Any) -> tuple[Any, Any]:
        """The (key, value) pairs of the JSON object ``column`` as a table, and the condition
        keeping the scalar values (strings, numbers, booleans)."""
        pairs = func.json_each(column).table_valued("key", "value", "type")
        return pairs, pairs.c.type.in_(("text", "integer", "real", "true", "false"))

    def recent_first(self, trace_id: Any, started: Any, when: Any, count: int) -> Any | None:
        """An aggregate of the ``count`` most recent trace ids among a group's rows where
        ``when`` holds, where the backend has one (Postgres); ``None``: rank them in a second
        query."""
        return None

    def distinct_values(self, conn: Connection, column: Any, limit: int) -> list[Any]:
        """Up to ``limit`` distinct non-null values of the table column ``column``, in order."""
        return list(
            conn.scalars(
                select(column).distinct().where(column.is_not(None)).order_by(column).limit(limit)
            )
        )


class PostgresDialect(Dialect):
    """Postgres: the database's clock, ``COPY``, ``SKIP LOCKED``, notifications, the caches."""

    __slots__ = ()

    postgres = True
    keeps_caches = True
    migrates_on_open = False

    def now(self) -> Any:
        return func.now()

    def refuses_writes(self, engine: Engine) -> bool:
        # On for default_transaction_read_only and on a hot standby.
        with engine.connect() as conn:
            answer = str(conn.execute(text("SHOW transaction_read_only")).scalar()) == "on"
            conn.rollback()
        return answer

    def clock(self, conn: Connection) -> datetime:
        value: datetime = conn.execute(select(func.now())).scalar_one()
        return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)

    def now_sql(self, offset: timedelta = timedelta(0)) -> Any:
        return func.now() + offset if offset else func.now()

    def utc_day(self, column: Any) -> Any:
        return _postgres.utc_day(column)

    def insert(self, table: Any) -> Any:
        return pg_dialect.insert(table)

    def replaced_marker(self) -> tuple[Any, ...]:
        return (_postgres.replaced_column(),)

    def write_traces(
        self,
        batch: Sequence[TraceRecord],
        *,
        by_rows: Callable[[Sequence[TraceRecord]], set[str]],
        by_copy: Callable[[Sequence[TraceRecord]], set[str]],
    ) -> set[str]:
        return by_copy(batch)

    def skip_locked(self, stmt: Any) -> Any:
        return stmt.with_for_update(skip_locked=True)

    def notify(self, conn: Connection) -> None:
        conn.execute(_postgres.notify(NOTIFY_CHANNEL))

    def notify_dsn(self, engine: Engine) -> str | None:
        url = engine.url.set(drivername="postgresql")
        return url.render_as_string(hide_password=False)

    def lock_score_writes(self, conn: Connection) -> None:
        conn.execute(_postgres.lock_shared())

    def lock_for_fill(self, conn: Connection) -> None:
        conn.execute(_postgres.lock_exclusive())

    def drop_cached(self, conn: Connection, changes: ScoreChanges) -> None:
        if changes.touched or changes.scored:
            buckets = sorted(
                {
                    (b, start, metric)
                    for metric, moment in changes.touched
                    for b, start in (("hour", hour_of(moment)), ("day", _day_of(moment)))
                }
            )
            hours = [(metric, start) for b, start, metric in buckets if b == "hour"]
            conn.execute(
                _postgres.INVALIDATE,
                {
                    "buckets": [b for b, _s, _m in buckets],
                    "starts": [start for _b, start, _m in buckets],
                    "metrics": [metric for _b, _s, metric in buckets],
                    "hour_metrics": [metric for metric, _h in hours],
                    "hours": [hour for _m, hour in hours],
                    "scored_hours": sorted({hour_of(moment) for moment in changes.scored}),
                },
            )
        if changes.replaced_from is not None:
            # Every hour from the one holding it on: a result is stored after its trace
            # started, so the hours the replaced results had been stored in are among these.
            conn.execute(delete(CostCache).where(CostCache.hour >= hour_of(changes.replaced_from)))
        if changes.deleted_before is not None:
            cutoff = changes.deleted_before
            conn.execute(delete(SummaryCache).where(SummaryCache.bucket_start <= cutoff))
            conn.execute(delete(GroupCache).where(GroupCache.bucket_start <= cutoff))
            conn.execute(delete(DiagnoseCache).where(DiagnoseCache.bucket_start <= cutoff))
            conn.execute(delete(CostCache))  # scores stored at any time went

    def tune_for_aggregates(self, conn: Connection) -> None:
        # JIT compilation costs more than these queries save from it (about 100 ms each at a
        # million scores); room to hash a window's distinct pairs in memory, not sort on disk.
        conn.exec_driver_sql("SET LOCAL jit = off")
        conn.exec_driver_sql("SET LOCAL work_mem = '64MB'")

    def json_elements(self, column: Any, key: str) -> Any:
        return _postgres.json_elements(column, key)

    def json_field(self, element: Any, key: str) -> Any:
        return _postgres.json_field(element, key)

    def json_text(self, element: Any) -> Any:
        return _postgres.json_text(element)

    def json_is(self, field: Any, value: bool | int) -> Any:
        return _postgres.json_is(field, value)

    def json_item(self, column: Any, index: Any) -> Any:
        return _postgres.json_item(column, index)

    def json_scalar_pairs(self, column: Any) -> tuple[Any, Any]:
        return _postgres.json_scalar_pairs(column)

    def recent_first(self, trace_id: Any, started: Any, when: Any, count: int) -> Any | None:
        return _postgres.recent_first(trace_id, started, when, count)

    def distinct_values(self, conn: Connection, column: Any, limit: int) -> list[Any]:
        # DISTINCT would read every row (most of a second at ten million scores).
        stmt = text(
            _postgres.distinct_values(column.table.name, column.name)
            + " SELECT val FROM v WHERE val IS NOT NULL LIMIT :limit"
        ).bindparams(bindparam("limit"))
        return list(conn.scalars(stmt, {"limit": limit}))


def _day_of(moment: datetime) -> datetime:
    return hour_of(moment).replace(hour=0)


def dialect_of(engine: Engine) -> Dialect:
    """The dialect of ``engine``'s backend."""
    return PostgresDialect() if is_postgres(engine) else Dialect()
