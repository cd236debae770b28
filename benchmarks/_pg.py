"""Shared set-up for the benchmarks: a scratch Postgres database created and dropped per run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import text
from sqlalchemy.engine import make_url

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import upgrade

BASE_URL = os.environ.get(
    "RECALLTRACE_BENCH_DATABASE_URL",
    os.environ.get(
        "RECALLTRACE_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    ),
)


@contextmanager
def scratch_database(name: str, *, keep: bool = False) -> Iterator[str]:
    """Create database ``name`` on the benchmark server, migrate it, yield its URL, drop it.

    With ``keep``, an existing database of that name is reused (migrated) and nothing is
    dropped, so a long fill can serve several runs.
    """
    admin = create_engine_from_url(
        make_url(BASE_URL).set(database="postgres").render_as_string(hide_password=False),
        isolation_level="AUTOCOMMIT",
    )
    with admin.connect() as conn:
        exists = conn.execute(
            text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": name}
        ).first()
        if not (keep and exists):
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(BASE_URL).set(database=name).render_as_string(hide_password=False)
    upgrade(url)
    try:
        yield url
    finally:
        if not keep:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
