"""Storage of traces, scoring jobs and scores on SQLAlchemy 2.0 (Postgres or SQLite).

Storage imports nothing else of recalltrace: the job specifications it needs are handed to it
(:class:`JobSpec`), and what it offers its callers is declared in :mod:`.contracts`. The names
below are imported lazily so that ``import recalltrace.storage.records`` (used on the tracer's
path) never pays for importing SQLAlchemy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recalltrace.storage.contracts import (
    REFERENCE_INPUTS,
    ClaimedJob,
    JobSpec,
    JobStore,
    QueueStats,
    ScoreLike,
    TraceInputs,
    TraceNotFound,
    UnknownMetric,
)
from recalltrace.storage.records import ContextRecord, ReferenceUpdate, TraceRecord

if TYPE_CHECKING:
    from recalltrace.storage.db import (
        DEFAULT_DATABASE_URL,
        create_engine_from_url,
        resolve_database_url,
    )
    from recalltrace.storage.history import History
    from recalltrace.storage.migrate import current_revision, upgrade
    from recalltrace.storage.repository import Repository, open_repository

__all__ = [
    "DEFAULT_DATABASE_URL",
    "REFERENCE_INPUTS",
    "ClaimedJob",
    "ContextRecord",
    "History",
    "JobSpec",
    "JobStore",
    "QueueStats",
    "ReferenceUpdate",
    "Repository",
    "ScoreLike",
    "TraceInputs",
    "TraceNotFound",
    "TraceRecord",
    "UnknownMetric",
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
    "History": "recalltrace.storage.history",
    "Repository": "recalltrace.storage.repository",
    "open_repository": "recalltrace.storage.repository",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'recalltrace.storage' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value
