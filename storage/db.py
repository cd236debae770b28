"""Engine setup from one database URL (SQLite file by default, Postgres in production)."""

from __future__ import annotations

import logging
import os
import weakref
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DisconnectionError

logger = logging.getLogger("recalltrace.storage")

_ENGINE_NOTES: weakref.WeakKeyDictionary[Engine, dict[str, Any]] = weakref.WeakKeyDictionary()


def engine_notes(engine: Engine) -> dict[str, Any]:
    """What storage remembers about ``engine`` (SQLite file changes, schema permission)."""
    notes = _ENGINE_NOTES.get(engine)
    if notes is None:
        notes = _ENGINE_NOTES[engine] = {}
    return notes


DEFAULT_DATABASE_URL = "sqlite:///./recalltrace.db"
"""The embedded default: a SQLite file in the working directory."""

DATABASE_URL_ENV = "RECALLTRACE_DATABASE_URL"

VERSION_TABLE = "recalltrace_alembic_version"
"""The table holding the schema's migration revision (Alembic's, under recalltrace's name)."""


class DatabaseURLError(ValueError):
    """The database URL cannot be used; the message never contains the password."""


def resolve_database_url(url: str | None = None) -> str:
    """Return ``url``, else ``$RECALLTRACE_DATABASE_URL``, else the SQLite default.

    Plain ``postgresql://`` and ``postgres://`` URLs are mapped to the psycopg 3 driver.
    """
    chosen = url or os.environ.get(DATABASE_URL_ENV) or DEFAULT_DATABASE_URL
    if chosen.startswith("postgres://"):
        chosen = "postgresql+psycopg://" + chosen[len("postgres://") :]
    elif chosen.startswith("postgresql://"):
        chosen = "postgresql+psycopg://" + chosen[len("postgresql://") :]
    return chosen


def redact_url(url: str) -> str:
    """Render a URL for messages and logs with its password hidden."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):  # ValueError: e.g. a port that is not a number
        return "<unparsable database URL>"


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # WAL lets the app's writer thread and a worker process share the file; a busy timeout
    # turns brief lock contention into waiting instead of "database is locked" errors.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def create_engine_from_url(url: str | None = None, **kwargs: Any) -> Engine:
    """Create an engine for ``url`` (see :func:`resolve_database_url`).

    Raises :class:`DatabaseURLError` with a password-free message when the URL is malformed or
    names a backend other than SQLite or Postgres.
    """
    resolved = resolve_database_url(url)
    if "://" not in resolved:
        # A bare path: say how to write it as a URL (a path is not a secret, so it is shown).
        raise DatabaseURLError(
            f"{resolved!r} is not a database URL; for a SQLite file give sqlite:///{resolved}, "
            "for Postgres e.g. postgresql+psycopg://user@host:5432/db"
        )
    try:
        parsed = make_url(resolved)
    except (ArgumentError, ValueError):  # ValueError: e.g. a port that is not a number
        raise DatabaseURLError(
            "could not parse the database URL; expected e.g. "
            "postgresql+psycopg://user@host:5432/db or sqlite:///./recalltrace.db"
        ) from None
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise DatabaseURLError(
            f"unsupported database backend {backend!r} in {redact_url(resolved)}; "
            "use postgresql+psycopg:// or sqlite:///"
        )
    if backend == "postgresql" and parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    options: dict[str, Any] = {"future": True}
    if backend == "postgresql":
        options.update(pool_pre_ping=True, pool_size=5, max_overflow=10)
        options.setdefault("connect_args", {}).setdefault("connect_timeout", 10)
    else:
        options.setdefault("connect_args", {}).update(check_same_thread=False, timeout=10)
    options.update(kwargs)
    try:
        engine = create_engine(parsed, **options)
    except Exception as exc:  # driver import errors and bad arguments
        raise DatabaseURLError(
            f"cannot use database {redact_url(resolved)}: {type(exc).__name__}: {exc}"
        ) from None
    if backend == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
        path = parsed.database
        if path and path != ":memory:" and not str(path).startswith("file:"):
            _watch_sqlite_file(engine, str(path))
    return engine


def _file_identity(path: str) -> tuple[int, int] | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return (status.st_dev, status.st_ino)


def _watch_sqlite_file(engine: Engine, path: str) -> None:
    """Reopen the file when it is deleted or replaced while in use.

    An open SQLite connection keeps writing into the file it opened, even after that file was
    deleted or another was moved to its path: everything written after that is lost, and
    nothing says so. Each connection remembers the file it opened; before a connection is
    handed out, the path is checked (one ``stat``), and a connection to a file that is no longer
    at the path is discarded, so the next one opens what is there now. Said once per change;
    ``engine_notes(engine)["sqlite_reopened"]`` counts the changes seen.
    """

    def remember(dbapi_connection: Any, record: Any) -> None:
        record.info["sqlite_file"] = _file_identity(path)

    def check(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        opened = record.info.get("sqlite_file")
        current = _file_identity(path)
        if current == opened:
            return
        notes = engine_notes(engine)
        said = notes.setdefault("sqlite_changes_said", set())
        if (opened, current) not in said:
            said.add((opened, current))
            notes["sqlite_reopened"] = notes.get("sqlite_reopened", 0) + 1
            logger.warning(
                "the SQLite file %s was %s while in use; reopening it: what is written from now "
                "on goes to the file now at that path",
                path,
                "deleted" if current is None else "replaced",
            )
        raise DisconnectionError(f"the SQLite file {path} was deleted or replaced")

    event.listen(engine, "connect", remember)
    event.listen(engine, "checkout", check)


def is_postgres(engine: Engine) -> bool:
    """True when ``engine`` talks to Postgres."""
    return engine.dialect.name == "postgresql"


READ_ONLY_SQLSTATE = "25006"
"""Postgres' ``read_only_sql_transaction``: a write in a read-only transaction or on a standby."""


def is_read_only_error(exc: BaseException) -> bool:
    """Whether ``exc`` (a SQLAlchemy or driver error) is the database refusing a write because
    it is read-only: a Postgres database or session with ``default_transaction_read_only``, a
    hot standby, or a SQLite file that cannot be written."""
    orig = getattr(exc, "orig", None) or exc
    if getattr(orig, "sqlstate", None) == READ_ONLY_SQLSTATE:
        return True
    text = str(orig)
    return "read-only transaction" in text or "attempt to write a readonly database" in text


def note_read_only(engine: Engine) -> None:
    """Remember that the database behind ``engine`` refused a write as read-only."""
    engine_notes(engine)["read_only"] = True
