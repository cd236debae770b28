"""The Postgres the tests and benchmarks share: where it is, how to reach it, how to empty it.

Reached at ``$RECALLTRACE_TEST_DATABASE_URL`` (default: the local server's ``test`` database).
When it is unreachable, Postgres tests are skipped, except under ``CI=true`` where that is an
error.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from recalltrace.storage.db import create_engine_from_url

DEFAULT_TEST_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _tables() -> tuple[str, ...]:
    """Every recalltrace table, the ones others refer to last (so that SQLite's deletes keep
    its foreign keys): read from the models, so that a table a migration adds is emptied too."""
    from recalltrace.storage.models import Base

    return tuple(table.name for table in reversed(Base.metadata.sorted_tables))


TABLES = _tables()


def base_url() -> str:
    return os.environ.get("RECALLTRACE_TEST_DATABASE_URL", DEFAULT_TEST_URL)


def admin_engine() -> Engine:
    return create_engine_from_url(
        make_url(base_url()).set(database="postgres").render_as_string(hide_password=False),
        isolation_level="AUTOCOMMIT",
        pool_size=1,
    )


def _postgres_reachable() -> str | None:
    try:
        engine = admin_engine()
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def require_postgres() -> None:
    """Skip the calling test when Postgres is unreachable; fail it instead under CI=true."""
    problem = _postgres_reachable()
    if problem is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"Postgres is required under CI=true but unreachable: {problem}")
        pytest.skip(f"Postgres unreachable: {problem}")


def truncate_all(engine: Engine) -> None:
    """Empty every recalltrace table."""
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY CASCADE"))
        else:
            for table in TABLES:
                conn.execute(text(f"DELETE FROM {table}"))


@contextmanager
def empty_database(prefix: str = "rt_empty") -> Iterator[str]:
    """The URL of a new, empty database on the test server (no tables), dropped afterwards."""
    require_postgres()
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = admin_engine()
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(base_url()).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
