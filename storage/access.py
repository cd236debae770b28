"""Whether a database takes writes: asked once per engine and remembered, the backend's own
way (``Dialect.refuses_writes``)."""

from __future__ import annotations

from sqlalchemy import Engine

from recalltrace.storage._dialect import dialect_of
from recalltrace.storage.db import engine_notes


def read_only(engine: Engine) -> bool:
    """Whether the database behind ``engine`` refuses writes, asked once per engine and
    remembered (``engine_notes(engine)["read_only"]``): on Postgres ``SHOW
    transaction_read_only`` (on for ``default_transaction_read_only`` and on a hot standby), on
    SQLite whether the file is writable. A database found read-only by a refused write later
    (:func:`note_read_only`) answers ``True`` from then on."""
    notes = engine_notes(engine)
    known = notes.get("read_only")
    if known is not None:
        return bool(known)
    answer = dialect_of(engine).refuses_writes(engine)
    notes["read_only"] = answer
    return answer
