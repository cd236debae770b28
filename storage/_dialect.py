"""The differences between Postgres and SQLite, in one place.

Postgres is the production store: its clock decides who owns a job (workers on hosts with
skewed clocks still agree), ``pg_notify`` wakes idle workers, and ``INSERT ... ON CONFLICT``
comes from its dialect. SQLite, the embedded default, uses the local clock and has no one to
notify.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import Engine, func, literal, select
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import Connection

from recalltrace.storage.contracts import NOTIFY_CHANNEL
from recalltrace.storage.db import is_postgres
from recalltrace.storage.models import UTCDateTime


def utcnow() -> datetime:
    """The local clock, timezone-aware in UTC."""
    return datetime.now(timezone.utc)


class Dialect:
    """What differs between the two backends, for one engine."""

    __slots__ = ("postgres",)

    def __init__(self, engine: Engine) -> None:
        self.postgres = is_postgres(engine)

    def now(self) -> Any:
        """The database's clock on Postgres; the local UTC clock on SQLite."""
        return func.now() if self.postgres else utcnow()

    def clock(self, conn: Connection) -> datetime:
        """The time that decides when work happens, as a value: the database's ``now()`` (the
        start of ``conn``'s transaction) on Postgres, whatever the writing process's clock says;
        the writing process's clock on SQLite (the processes sharing a file share a host)."""
        if self.postgres:
            value: datetime = conn.execute(select(func.now())).scalar_one()
            return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)
        return utcnow()

    def now_sql(self, offset: timedelta = timedelta(0)) -> Any:
        """Like :meth:`now` plus ``offset``, always as a SQL expression (for SELECTs)."""
        if self.postgres:
            return func.now() + offset if offset else func.now()
        return literal(utcnow() + offset, UTCDateTime())

    def insert(self, table: Any) -> Any:
        """An INSERT that supports ``on_conflict_do_*`` and ``returning`` on this backend."""
        return (pg_dialect.insert if self.postgres else sqlite_dialect.insert)(table)

    def notify(self, conn: Connection) -> None:
        """Wake idle workers (Postgres); nothing to do on SQLite."""
        if self.postgres:
            conn.execute(select(func.pg_notify(NOTIFY_CHANNEL, "")))
