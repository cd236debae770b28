"""Migrated databases for the tests, as copies of a template migrated once.

Running the migrations for every test costs a tenth of a second on SQLite and more on Postgres;
copying a migrated database costs almost nothing. :func:`migrated_sqlite` copies a SQLite file
migrated once per process; :func:`copied_postgres_database` makes a database with
``CREATE DATABASE ... TEMPLATE`` from a template migrated once per server and schema (its name
carries a digest of the migration scripts, so a changed migration gets a template of its own).

Tests about migrating itself (``tests/integration/test_migrations.py``, the fresh-database and
``db upgrade`` tests) keep running the real migrations.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import uuid
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import make_url

from recalltrace.storage.migrate import upgrade
from tests.support.postgres import admin_engine, base_url

__all__ = ["copied_postgres_database", "migrated_sqlite", "schema_digest"]


@cache
def schema_digest() -> str:
    """A short digest of every migration script (what the template's schema depends on)."""
    import recalltrace.migrations as migrations

    digest = hashlib.sha256()
    for folder in migrations.__path__:
        for path in sorted(Path(folder).rglob("*.py")):
            digest.update(path.relative_to(folder).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


@cache
def _sqlite_template() -> Path:
    """A SQLite file migrated to head, once per process (removed with the process's temp
    folder by the operating system's cleaning; it is a few hundred kilobytes)."""
    folder = Path(tempfile.mkdtemp(prefix="rt_sqlite_template_"))
    path = folder / "template.db"
    upgrade(f"sqlite:///{path}")
    leftovers = [p.name for p in folder.iterdir() if p != path]
    if leftovers:  # a journal beside the file would hold part of the schema
        raise RuntimeError(f"the migrated SQLite template left {leftovers} beside it")
    return path


def migrated_sqlite(path: Path | str) -> str:
    """Put a migrated SQLite database at ``path`` (a copy of the template) and return its URL."""
    target = Path(path)
    shutil.copyfile(_sqlite_template(), target)
    return f"sqlite:///{target}"


def _url_of(name: str) -> str:
    return make_url(base_url()).set(database=name).render_as_string(hide_password=False)


def _template_name() -> str:
    return f"rt_template_{schema_digest()}"


def _ensure_postgres_template() -> str:
    """The name of the migrated template database, made by whichever session comes first (the
    others wait on an advisory lock for it)."""
    name = _template_name()
    lock = zlib.crc32(name.encode())
    admin = admin_engine()
    try:
        with admin.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": lock})
            try:
                exists = conn.scalar(
                    text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}
                )
                if not exists:
                    # Migrated under another name, renamed when complete: a session that
                    # failed half-way never leaves a half-migrated template behind.
                    building = f"{name}_build_{uuid.uuid4().hex[:8]}"
                    conn.execute(text(f'CREATE DATABASE "{building}"'))
                    try:
                        upgrade(_url_of(building))
                        conn.execute(text(f'ALTER DATABASE "{building}" RENAME TO "{name}"'))
                    except BaseException:
                        conn.execute(text(f'DROP DATABASE IF EXISTS "{building}" WITH (FORCE)'))
                        raise
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": lock})
    finally:
        admin.dispose()
    return name


@contextmanager
def copied_postgres_database(name: str) -> Iterator[str]:
    """The URL of a new migrated database ``name`` (a copy of the template), dropped after."""
    template = _ensure_postgres_template()
    admin = admin_engine()
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
        try:
            yield _url_of(name)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()
