"""Migrations are the only way the schema changes: head must equal the models exactly."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, inspect

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import (
    VERSION_TABLE,
    alembic_config,
    current_revision,
    head_revision,
    hold_migration_lock,
    upgrade,
    upgrade_engine,
)
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


def _judge_calls_down_and_up(url: str) -> None:
    """0011 adds ``judge_calls`` on top of 0010 and its downgrade removes exactly that."""
    engine: Engine = create_engine_from_url(url)
    try:
        upgrade_engine(engine, "0010")
        assert "judge_calls" not in inspect(engine).get_table_names()
        upgrade_engine(engine, "0011")
        inspector = inspect(engine)
        assert "judge_calls" in inspector.get_table_names()
        indexes = {i["name"] for i in inspector.get_indexes("judge_calls")}
        assert {"ix_judge_calls_scope", "ix_judge_calls_created_at"} <= indexes
        cfg = alembic_config(engine)
        with engine.begin() as conn:
            hold_migration_lock(conn, 30)
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0010")
        assert "judge_calls" not in inspect(engine).get_table_names()
        upgrade_engine(engine)
    finally:
        engine.dispose()
    assert current_revision(url) == head_revision()
    assert _diff(url) == []


@pytest.mark.postgres
def test_judge_calls_migration_up_down_up_on_postgres(empty_postgres_url: str) -> None:
    _judge_calls_down_and_up(empty_postgres_url)


def test_judge_calls_migration_up_down_up_on_sqlite(tmp_path: object) -> None:
    _judge_calls_down_and_up(f"sqlite:///{tmp_path}/judge_calls.db")
