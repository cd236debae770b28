"""Asserting the tracer's ledger against what a database holds.

``recalltrace.ledger()`` counts every request the tracer saw since the process started; a test
takes a :class:`LedgerCheck` before it traces and asserts afterwards that what it traced since
then is accounted for: ``seen = stored + sampled_out + dropped + pending``, and ``stored`` equals
the rows the database gained.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from sqlalchemy import bindparam, text

import recalltrace
from recalltrace.storage.db import create_engine_from_url
from recalltrace.tracer import Ledger

__all__ = ["LedgerCheck", "stored_rows"]


def stored_rows(database_url: str, apps: Iterable[str] | None = None) -> int:
    """Rows in the ``traces`` table (of the given apps only, when named)."""
    engine = create_engine_from_url(database_url)
    try:
        with engine.connect() as conn:
            if apps is None:
                return int(conn.execute(text("SELECT count(*) FROM traces")).scalar_one())
            query = text("SELECT count(*) FROM traces WHERE app_name IN :apps").bindparams(
                bindparam("apps", expanding=True)
            )
            return int(conn.execute(query, {"apps": list(apps)}).scalar_one())
    finally:
        engine.dispose()


class LedgerCheck:
    """The ledger's counts from the moment this was made."""

    def __init__(self) -> None:
        self.start = recalltrace.ledger()

    def since(self) -> Ledger:
        """What the ledger gained since the start."""
        return recalltrace.ledger() - self.start

    def assert_balanced(self, *, flush_timeout: float = 120.0) -> Ledger:
        """Flush, then assert that every request seen since the start has exactly one outcome
        and none is still pending; returns the counts."""
        assert recalltrace.flush(flush_timeout), "flush timed out"
        counts = self.since()
        assert counts.pending == 0, f"records still pending after a flush: {counts}"
        accounted = counts.stored + counts.sampled_out + counts.dropped_total + counts.pending
        assert counts.seen == accounted, f"the ledger does not balance: {counts}"
        return counts

    def assert_matches_database(
        self,
        database_url: str,
        *,
        rows_before: int = 0,
        apps: Iterable[str] | None = None,
        flush_timeout: float = 120.0,
    ) -> Ledger:
        """:meth:`assert_balanced`, and the rows the database gained (of ``apps``, when named)
        are exactly the records the ledger says were stored."""
        counts = self.assert_balanced(flush_timeout=flush_timeout)
        rows = stored_rows(database_url, apps) - rows_before
        assert counts.stored == rows, (
            f"the ledger says {counts.stored} stored, the database gained {rows} rows: {counts}"
        )
        return counts


_SAID = re.compile(
    r"recalltrace dropped (\d+) trace record"
    r"|recalltrace at exit: \d+ request\(s\) seen: [^;]*? (\d+) dropped"
)


def said_dropped(stderr: str) -> int:
    """The records a process said it dropped, from its drop lines and its ledger line at exit
    (what an exit drain gives up is said in the ledger line only)."""
    return sum(int(during or at_exit) for during, at_exit in _SAID.findall(stderr))


LOST_LINE = re.compile(r"process (\d+) ended holding (\d+) record\(s\)")
"""What a tracer process says about another that ended without running its exit code (killed:
SIGKILL, the OOM killer) holding records it had accepted and not stored: the process id, then
how many records."""


def said_lost(stderr: str) -> int:
    """The records processes were said to have ended holding (every ``LOST_LINE`` summed): a
    process that could not say its own losses, said by the next tracer process."""
    return sum(int(held) for _, held in LOST_LINE.findall(stderr))


def said_lost_by_process(stderr: str) -> dict[int, int]:
    """``{pid: records}`` of the ``LOST_LINE`` lines (a process said twice adds up)."""
    lost: dict[int, int] = {}
    for pid, held in LOST_LINE.findall(stderr):
        lost[int(pid)] = lost.get(int(pid), 0) + int(held)
    return lost
