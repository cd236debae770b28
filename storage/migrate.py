"""Run the shipped Alembic migrations programmatically (no alembic.ini needed).

On Postgres every migration run holds one advisory lock (:data:`MIGRATION_LOCK_KEY`) for its
whole transaction: ``recalltrace db upgrade``, the tracer's and the worker's own migrations, and
``alembic upgrade`` through the shipped environment all take it, so runners started together
migrate one after the other (the later ones find the schema at head and do nothing). A runner
waits for it at most :data:`MIGRATION_LOCK_WAIT` seconds, then raises :class:`MigrationLocked`.

Alembic's INFO lines (``Context impl PostgresqlImpl.``, ``Will assume transactional DDL.``,
``Running upgrade ...``, and one per plugin when Alembic is first imported) are not passed on
from a run that is not a migration command (see :func:`alembic_quiet`): an application whose
root logger is at INFO and that only traces does not see them; ``recalltrace db upgrade`` shows
them with ``--verbose``.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from sqlalchemy import Connection, Engine, func, inspect, select, text

from recalltrace.storage.db import VERSION_TABLE, create_engine_from_url, redact_url

if TYPE_CHECKING:
    from alembic.config import Config

__all__ = [
    "INTO_EXISTING_ENV",
    "MIGRATION_LOCK_KEY",
    "MIGRATION_LOCK_WAIT",
    "VERSION_TABLE",
    "ForeignTablesError",
    "MigrationLocked",
    "SchemaState",
    "alembic_config",
    "alembic_quiet",
    "create_schema_if_missing",
    "current_revision",
    "current_revision_of",
    "head_revision",
    "hold_migration_lock",
    "is_known_revision",
    "refuse_foreign_tables",
    "schema_state",
    "shipped_revisions",
    "upgrade",
    "upgrade_engine",
]

MIGRATION_LOCK_KEY = 0x72745F6D6967  # "rt_mig"
"""The Postgres advisory lock (``pg_advisory_xact_lock``) every migration run holds."""

MIGRATION_LOCK_WAIT = 300.0
"""Seconds a migration run waits for another one to finish before giving up."""


class MigrationLocked(TimeoutError):
    """Another process held the migration lock for longer than the wait allowed."""


def hold_migration_lock(conn: Connection, wait: float = MIGRATION_LOCK_WAIT) -> None:
    """Take the migration lock for the rest of ``conn``'s transaction (Postgres; nothing to do
    on SQLite, whose writers are serialised by the file lock). Waits at most ``wait`` seconds,
    then raises :class:`MigrationLocked`. Taken again on the same connection, it is already
    held (advisory locks are re-entrant)."""
    if conn.dialect.name != "postgresql":
        return
    deadline = time.monotonic() + wait
    delay = 0.05
    while not conn.scalar(select(func.pg_try_advisory_xact_lock(MIGRATION_LOCK_KEY))):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise MigrationLocked(
                "the database is already being upgraded by another process (waited "
                f"{wait:g} s for it); run `recalltrace db current` to see when it is done"
            )
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 1.0)


_quiet_lock = threading.Lock()
_quiet_runs = 0
_quiet_set_level = False


@contextmanager
def alembic_quiet(quiet: bool = True) -> Iterator[None]:
    """Within it (with ``quiet``), Alembic's INFO lines are not passed on: the ``alembic``
    logger is raised to WARNING while it runs, then put back. An ``alembic`` logger that has a
    level of its own (an application that asked for Alembic's lines) is left as it is, and so
    are Alembic's warnings. Runs on several threads at once share one change of the level."""
    global _quiet_runs, _quiet_set_level
    if not quiet:
        yield
        return
    alembic_logger = logging.getLogger("alembic")
    with _quiet_lock:
        if _quiet_runs == 0 and alembic_logger.level == logging.NOTSET:
            alembic_logger.setLevel(logging.WARNING)
            _quiet_set_level = True
        _quiet_runs += 1
    try:
        yield
    finally:
        with _quiet_lock:
            _quiet_runs -= 1
            if _quiet_runs == 0 and _quiet_set_level:
                alembic_logger.setLevel(logging.NOTSET)
                _quiet_set_level = False


def alembic_config(engine: Engine | None = None) -> Config:
    """An Alembic config pointing at the migrations package installed beside this one."""
    with alembic_quiet():
        return _config(engine)


def _config(engine: Engine | None = None) -> Config:
    # Importing Alembic logs a line per plugin: callers decide whether that is quiet.
    from alembic.config import Config

    from recalltrace import migrations

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    if engine is not None:
        cfg.set_main_option(
            "sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%")
        )
    return cfg


def head_revision() -> str:
    """The newest migration shipped with this version of the package."""
    with alembic_quiet():
        from alembic.script import ScriptDirectory

        head = ScriptDirectory.from_config(_config()).get_current_head()
    if head is None:
        raise RuntimeError("no migrations are shipped with this package")
    return head


def is_known_revision(revision: str) -> bool:
    """Whether ``revision`` is one of the migrations shipped with this version (a database at
    another one was migrated by a newer recalltrace)."""
    with alembic_quiet():
        from alembic.script import ScriptDirectory

        scripts = ScriptDirectory.from_config(_config())
        return any(script.revision == revision for script in scripts.walk_revisions())


INTO_EXISTING_ENV = "RECALLTRACE_INTO_EXISTING"
"""Set to 1 (true, yes, on) to let recalltrace add its tables to a SQLite file that holds
another application's tables (what ``recalltrace db upgrade --into-existing`` does once)."""


class ForeignTablesError(RuntimeError):
    """The SQLite file holds another application's tables and no recalltrace schema, and adding
    recalltrace's tables to it was not asked for (:data:`INTO_EXISTING_ENV`)."""

    storage_refusal = True
    """Retrying does not help (``storage.errors.is_storage_refusal``): the tracer's writer
    says so once and counts the records as not stored."""


def _into_existing_from_env() -> bool:
    return os.environ.get(INTO_EXISTING_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def refuse_foreign_tables(engine: Engine, into_existing: bool | None = None) -> None:
    """Raise :class:`ForeignTablesError` when the SQLite file behind ``engine`` holds tables,
    none of them recalltrace's, unless ``into_existing`` (default: :data:`INTO_EXISTING_ENV`).
    Postgres databases are not checked (a deployment's database, migrated on purpose)."""
    if engine.dialect.name != "sqlite":
        return
    if into_existing is None:
        into_existing = _into_existing_from_env()
    if into_existing:
        return
    from recalltrace.storage.models import Base

    with engine.connect() as conn:
        names = sorted(
            name for name in inspect(conn).get_table_names() if not name.startswith("sqlite_")
        )
    if not names or VERSION_TABLE in names or set(names) & set(Base.metadata.tables):
        return
    listed = ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")
    raise ForeignTablesError(
        f"{redact_url(engine.url.render_as_string(hide_password=False))} holds another "
        f"application's tables ({listed}) and no recalltrace schema: recalltrace does not add "
        "its tables to it unasked; give recalltrace a database file of its own, or allow it "
        f"with {INTO_EXISTING_ENV}=1 (or once: `recalltrace db upgrade --into-existing`)"
    )


def upgrade_engine(
    engine: Engine,
    revision: str = "head",
    *,
    wait: float = MIGRATION_LOCK_WAIT,
    quiet: bool = True,
    into_existing: bool | None = None,
) -> None:
    """Upgrade the database behind ``engine`` to ``revision``, holding the migration lock (at
    most ``wait`` seconds spent waiting for it; see :func:`hold_migration_lock`). With
    ``quiet`` (the default) Alembic's INFO lines are not passed on (:func:`alembic_quiet`).
    A SQLite file holding only another application's tables is refused
    (:func:`refuse_foreign_tables`) unless ``into_existing`` (default: the environment's
    :data:`INTO_EXISTING_ENV`)."""
    refuse_foreign_tables(engine, into_existing)
    with alembic_quiet(quiet):
        from alembic import command

        cfg = _config(engine)
        with engine.begin() as conn:
            hold_migration_lock(conn, wait)
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)


def upgrade(
    url: str | None = None,
    revision: str = "head",
    *,
    wait: float = MIGRATION_LOCK_WAIT,
    quiet: bool = True,
    into_existing: bool | None = None,
) -> None:
    """Upgrade the database at ``url`` to ``revision`` (default: the newest); ``quiet`` and
    ``into_existing`` as for :func:`upgrade_engine` (``recalltrace db upgrade`` passes
    ``quiet=False``)."""
    engine = create_engine_from_url(url)
    try:
        upgrade_engine(engine, revision, wait=wait, quiet=quiet, into_existing=into_existing)
    finally:
        engine.dispose()


def _schema_absent(conn: Connection) -> bool:
    """No recalltrace table and no migration revision: a database nobody migrated."""
    from recalltrace.storage.models import Base

    names = set(inspect(conn).get_table_names())
    return VERSION_TABLE not in names and not names & set(Base.metadata.tables)


def create_schema_if_missing(
    engine: Engine, *, wait: float = MIGRATION_LOCK_WAIT, quiet: bool = True
) -> bool:
    """Create the schema at head when the database has none of it (no recalltrace table, no
    revision), under the migration lock; returns whether it did. A database at any revision,
    older ones included, or holding some recalltrace tables, is left as it is. ``quiet`` as
    for :func:`upgrade_engine`. A database that has the schema is recognised without loading
    Alembic (every process that stores opens the database this way)."""
    with engine.connect() as conn:
        if not _schema_absent(conn):
            return False
    with alembic_quiet(quiet):
        from alembic import command

        cfg = _config(engine)
        with engine.begin() as conn:
            if not _schema_absent(conn):
                return False
            hold_migration_lock(conn, wait)
            # Looked at again under the lock: another process may have just created it.
            if not _schema_absent(conn):
                return False
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
    return True


def current_revision_of(engine: Engine) -> str | None:
    """The revision the database is at, or ``None`` when it was never migrated."""
    with alembic_quiet():
        from alembic.runtime.migration import MigrationContext

        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            return ctx.get_current_revision()


def current_revision(url: str | None = None) -> str | None:
    """The revision the database at ``url`` is at, or ``None`` when never migrated."""
    engine = create_engine_from_url(url)
    try:
        return current_revision_of(engine)
    finally:
        engine.dispose()


_REVISION_LINE = re.compile(r"""^(down_revision|revision)\s*=\s*['"]?([^'"\s]*)['"]?\s*$""", re.M)


@cache
def shipped_revisions() -> tuple[str, ...]:
    """The revisions of the migrations shipped with this version, oldest first, read from the
    scripts' ``revision``/``down_revision`` lines (without loading Alembic: every command that
    opens the database asks, see :func:`schema_state`)."""
    from recalltrace import migrations

    parent: dict[str, str | None] = {}
    for script in sorted((Path(migrations.__file__).parent / "versions").glob("*.py")):
        found = dict((key, value) for key, value in _REVISION_LINE.findall(script.read_text()))
        if found.get("revision"):
            down = found.get("down_revision")
            parent[found["revision"]] = None if down in (None, "", "None") else down
    order: list[str] = []
    following = {down: revision for revision, down in parent.items()}
    current = following.get(None)
    while current is not None and current not in order:
        order.append(current)
        current = following.get(current)
    return tuple(order)


class SchemaNewerError(RuntimeError):
    """The database's recalltrace schema is at a revision this version does not know: a newer
    recalltrace migrated it, and this one cannot migrate it further."""

    storage_refusal = True
    """Retrying does not help (``storage.errors.is_storage_refusal``)."""

    def __init__(self, engine: Engine, state: SchemaState) -> None:
        shown = redact_url(engine.url.render_as_string(hide_password=False))
        super().__init__(
            f"{shown} holds a recalltrace schema newer than this recalltrace (revision "
            f"{state.revision}; this one knows up to {state.head}): a newer recalltrace "
            "migrated it; run the newer recalltrace here, or point this one at its own database"
        )


@dataclass(frozen=True)
class SchemaState:
    """Where a database's schema stands against this version of recalltrace.

    ``state`` is ``"absent"`` (never migrated), ``"current"`` (at this version's newest
    revision), ``"behind"`` (at an older one: ``recalltrace db upgrade`` brings it up) or
    ``"newer"`` (at a revision this version does not know: a newer recalltrace migrated it).
    """

    state: Literal["absent", "current", "behind", "newer"]
    revision: str | None
    head: str


def schema_state(engine: Engine) -> SchemaState:
    """The :class:`SchemaState` of the database behind ``engine``: one query of the revision
    table, without Alembic."""
    revisions = shipped_revisions()
    head = revisions[-1]
    with engine.connect() as conn:
        revision = None
        if inspect(conn).has_table(VERSION_TABLE):
            revision = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()
        conn.rollback()
    if revision is None:
        return SchemaState("absent", None, head)
    revision = str(revision)
    if revision == head:
        return SchemaState("current", revision, head)
    if revision in revisions:
        return SchemaState("behind", revision, head)
    return SchemaState("newer", revision, head)
