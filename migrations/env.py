"""Alembic environment: runs on the connection handed in by ``storage.migrate``."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import hold_migration_lock
from recalltrace.storage.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    # Runs started together (replicas of one deployment) migrate one after the other; the
    # lock is re-entrant, so a caller that already holds it (storage.migrate) holds it still.
    hold_migration_lock(connection)
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        version_table="recalltrace_alembic_version",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine_from_url(config.get_main_option("sqlalchemy.url") or None)
    # One transaction, committed at the end: the migration lock is held until then.
    with engine.begin() as conn:
        _run(conn)
    engine.dispose()


if context.is_offline_mode():
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        version_table="recalltrace_alembic_version",
    )
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
