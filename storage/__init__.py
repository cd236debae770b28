"""Storage of traces, scoring jobs and scores on SQLAlchemy 2.0 (Postgres or SQLite).

The names below are imported lazily so that ``import storage.records`` (used on the tracer's
path) never pays for importing SQLAlchemy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recalltrace.storage.records import ContextRecord, ReferenceUpdate, TraceRecord

if TYPE_CHECKING:
    from recalltrace.storage.db import (
        DEFAULT_DATABASE_URL,
        create_engine_from_url,
        resolve_database_url,
    )
    from recalltrace.storage.migrate import current_revision, upgrade
    from recalltrace.storage.repository import (
        ClaimedJob,
        Repository,
        TraceNotFound,
        open_repository,
    )

__all__ = [
    "DEFAULT_DATABASE_URL",
    "ClaimedJob",
    "ContextRecord",
    "ReferenceUpdate",
    "Repository",
    "TraceNotFound",
    "TraceRecord",
    "create_engine_from_url",
    "current_revision",
    "open_repository",
    "resolve_database_url",
    "upgrade",
]

_LAZY = {
    "DEFAULT_DATABASE_URL": "recalltrace.storage.db",
    "create_engine_from_url": "recalltrace.storage.db",
    "resolve_database_url": "recalltrace.storage.db",
    "current_revision": "recalltrace.storage.migrate",
    "upgrade": "recalltrace.storage.migrate",
    "ClaimedJob": "recalltrace.storage.repository",
    "Repository": "recalltrace.storage.repository",
    "TraceNotFound": "recalltrace.storage.repository",
    "open_repository": "recalltrace.storage.repository",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'storage' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value
