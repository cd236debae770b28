"""What the command line and the web UI both read and say: a window narrowed to the days that
hold traces, the reference documents' ranks and matches of one trace, and the one line a user
can act on for a database error. Neither front end imports the other."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from recalltrace.storage.history import TraceDetail


# Evidence keys shown first, in this order (trace show, the web UI); every other key follows,
# so nothing is hidden.
DETAIL_ORDER = (
    "claims",
    "evaluated_chunks",
    "missing_information",
    "missing_ids",
    "found_ids",
    "reference_entities",
    "context_entities",
    "found_entities",
    "missing_entities",
    "matches",
    "judge_reason",
)


def data_window(
    engine: Engine, since: datetime | None, until: datetime | None
) -> tuple[datetime | None, datetime | None]:
    """``since``/``until`` narrowed to the days holding stored traces: the history's hourly
    rollups walk every hour of a window, and ``--since 0001-01-01`` (or ``--until 9999-12-31``)
    would walk millions of empty ones. The traces selected are the same; what is printed as
    the window stays the one asked for."""
    from datetime import timedelta

    from sqlalchemy import func, select

    from recalltrace.storage.models import Trace

    with engine.connect() as conn:
        first, last = conn.execute(
            select(func.min(Trace.started_at), func.max(Trace.started_at))
        ).one()
    now = datetime.now(timezone.utc)
    if first is None or last is None:
        # Nothing stored: an empty day before now selects the same nothing.
        first = last = now
    day = timedelta(days=1)
    lower = _as_utc(first).replace(hour=0, minute=0, second=0, microsecond=0)
    upper = max(_as_utc(last), now).replace(hour=0, minute=0, second=0, microsecond=0) + day
    if since is None or since < lower:
        since = lower
    if until is not None and until > upper:
        until = upper
    if until is not None and since >= until:
        since = until - day
    return since, until


def _as_utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment


def reference_ranks(detail: TraceDetail) -> list[tuple[str, int | None]]:
    """Each distinct reference document id and the rank (1 = first) at which it was first
    retrieved, ``None`` when it was not retrieved."""
    ranks: dict[str, int] = {}
    for rank, context in enumerate(sorted(detail.contexts, key=lambda c: c.position), 1):
        if context.context_id is not None:
            ranks.setdefault(context.context_id, rank)
    return [(doc, ranks.get(doc)) for doc in dict.fromkeys(detail.reference_context_ids or ())]


def context_matches(detail: TraceDetail) -> dict[int, str] | None:
    """Per reference context index, the retrieved context that matched it (from the stored
    ``non_llm_context_recall`` evidence); ``None`` without that evidence."""
    for score in detail.scores:
        matches = score.details.get("matches") if score.metric == "non_llm_context_recall" else None
        if isinstance(matches, list):
            return {
                m["reference_index"]: f"matched retrieved #{m['retrieved_index']}"
                for m in matches
                if isinstance(m, dict) and m.get("found") and m.get("retrieved_index") is not None
            }
    return None


def read_only_refusal(command: str) -> str:
    """The one line a command that must write says on a read-only database."""
    return (
        f"the database is read-only: {command} needs to write; point it at the primary "
        "(a writable database)"
    )


def database_problem(exc: BaseException, command: str = "this command") -> str | None:
    """The one line a user can act on for a database (or judge back end) error, or ``None``
    for a real bug."""
    from recalltrace.scorers._judge import JudgeBackendMissing
    from recalltrace.storage.db import DatabaseURLError, is_read_only_error
    from recalltrace.storage.migrate import ForeignTablesError

    if isinstance(exc, (DatabaseURLError, ForeignTablesError, JudgeBackendMissing)):
        return str(exc)
    try:
        from sqlalchemy.exc import OperationalError, ProgrammingError
    except ImportError:  # pragma: no cover - SQLAlchemy is a dependency
        return None
    from sqlalchemy.exc import DatabaseError

    if isinstance(exc, DatabaseError) and is_read_only_error(exc):
        return read_only_refusal(command)
    if isinstance(exc, DatabaseError) and "file is not a database" in str(exc.orig):
        return "the database file is not a SQLite database (or it is damaged): check --database-url"
    if isinstance(exc, OperationalError):
        detail = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        if "no such table" in detail or ("does not exist" in detail and "relation" in detail):
            return "the database is not migrated: run `recalltrace db upgrade` first"
        return f"cannot reach the database: {detail}"
    if isinstance(exc, ProgrammingError):
        detail = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        if "does not exist" in detail:
            return "the database is not migrated: run `recalltrace db upgrade` first"
        return f"database error: {detail}"
    return None
