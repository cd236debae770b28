"""Run the shipped Alembic migrations programmatically (no alembic.ini needed)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from recalltrace.storage.db import VERSION_TABLE, create_engine_from_url

__all__ = [
    "VERSION_TABLE",
    "alembic_config",
    "current_revision",
    "current_revision_of",
    "head_revision",
    "upgrade",
    "upgrade_engine",
]


def alembic_config(engine: Engine | None = None) -> Config:
    """An Alembic config pointing at the migrations package installed beside this one."""
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
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise RuntimeError("no migrations are shipped with this package")
    return head


def upgrade_engine(engine: Engine, revision: str = "head") -> None:
    """Upgrade the database behind ``engine`` to ``revision``."""
    cfg = alembic_config(engine)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def upgrade(url: str | None = None, revision: str = "head") -> None:
    """Upgrade the database at ``url`` to ``revision`` (default: the newest)."""
    engine = create_engine_from_url(url)
    try:
        upgrade_engine(engine, revision)
    finally:
        engine.dispose()


def current_revision_of(engine: Engine) -> str | None:
    """The revision the database is at, or ``None`` when it was never migrated."""
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
