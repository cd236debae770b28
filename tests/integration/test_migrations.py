"""Migrations are the only way the schema changes: head must equal the models exactly."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import VERSION_TABLE, current_revision, head_revision, upgrade
from recalltrace.storage.models import Base
from tests.support.postgres import empty_database as empty_database_on_server


@pytest.fixture
def empty_postgres_url() -> Iterator[str]:
    with empty_database_on_server("rt_migr") as url:
        yield url


def _diff(url: str) -> list[object]:
    engine = create_engine_from_url(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn, opts={"compare_type": True, "version_table": VERSION_TABLE}
            )
            return list(compare_metadata(ctx, Base.metadata))
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_upgrade_empty_postgres_to_head_matches_models(empty_postgres_url: str) -> None:
    assert current_revision(empty_postgres_url) is None
    upgrade(empty_postgres_url)
    assert current_revision(empty_postgres_url) == head_revision()
    assert _diff(empty_postgres_url) == []
    engine = create_engine_from_url(empty_postgres_url)
    indexes = {i["name"] for i in inspect(engine).get_indexes("scoring_jobs")}
    engine.dispose()
    assert {"ix_scoring_jobs_due", "ix_scoring_jobs_leases"} <= indexes


def test_upgrade_empty_sqlite_to_head_matches_models(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/fresh.db"
    upgrade(url)
    assert current_revision(url) == head_revision()
    assert _diff(url) == []


def test_upgrade_is_repeatable(sqlite_url: str) -> None:
    upgrade(sqlite_url)
    upgrade(sqlite_url)
    assert current_revision(sqlite_url) == head_revision()
