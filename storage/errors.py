"""Telling a database that cannot be reached from one that refuses the data.

Imports nothing heavy: the tracer's writer uses it without loading SQLAlchemy for it.
"""

from __future__ import annotations

# Class names rather than classes, so that no driver or SQLAlchemy import is needed here.
_UNAVAILABLE_NAMES = frozenset(
    {"OperationalError", "InterfaceError", "DisconnectionError", "ConnectionError"}
)


def is_database_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) means the database could not be
    reached: connection refused or lost, a server restarting, a pool or lock timeout.

    Such failures are worth retrying as they are; any other failure means the database
    refused what it was given.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (ConnectionError, TimeoutError)):
            return True
        if getattr(current, "connection_invalidated", False):
            return True
        if any(cls.__name__ in _UNAVAILABLE_NAMES for cls in type(current).__mro__):
            return True
        current = current.__cause__ or current.__context__
    return False


def is_schema_missing(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) says the recalltrace tables do not
    exist: a database nobody ran ``recalltrace db upgrade`` on. Worth keeping the records for:
    they can be written once the schema is there."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        if "UndefinedTable" in type(current).__name__ or "no such table" in text:
            return True
        if "relation" in text and "does not exist" in text:
            return True
        current = current.__cause__ or current.__context__
    return False


def is_trace_not_found(exc: BaseException) -> bool:
    """Whether a sink's exception means "this trace is not stored (yet)"."""
    if isinstance(exc, LookupError):
        return True
    return any(cls.__name__ == "TraceNotFound" for cls in type(exc).__mro__)


def is_storage_refusal(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) is storage refusing the database until
    someone acts (e.g. ``storage.migrate.ForeignTablesError``: another application's SQLite
    file): retrying the same records changes nothing, so they are not stored."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if getattr(current, "storage_refusal", False):
            return True
        current = current.__cause__ or current.__context__
    return False
