"""The read caches' one pattern, and the summary cache kept with it.

History reads of a long window are dominated by buckets that can no longer change, so their
rows are computed once and kept in cache tables (Postgres only): per-bucket statistics of
complete buckets in ``summary_cache`` (count, mean, percentiles, skipped and failed counts, read
here) and the hourly rollups of group sums and judge cost (``storage.rollups``). All three are
read the same way, :func:`read_through`, and kept true by the same lock:

- every writer of scores works inside :func:`score_writes`: it takes the lock *shared* and,
  before its transaction commits, drops the cached rows of whatever it changed in one call
  (:func:`invalidate`);
- a fill takes it *exclusively* (``Dialect.lock_for_fill``) while it computes and stores rows,
  so no score can be committed into a bucket between the computation and the row being stored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, TypeVar

from sqlalchemy import Engine, select, tuple_
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from recalltrace.storage._dialect import Dialect, ScoreChanges, as_utc, hour_of
from recalltrace.storage._postgres import SUMMARY_LOCK_KEY
from recalltrace.storage.access import read_only
from recalltrace.storage.db import is_read_only_error, note_read_only
from recalltrace.storage.history_rows import Bucket, SummaryRow
from recalltrace.storage.models import SummaryCache

__all__ = [
    "SUMMARY_LOCK_KEY",
    "CachedRead",
    "ScoreChanges",
    "as_utc",
    "hour_of",
    "invalidate",
    "read",
    "read_through",
    "score_writes",
    "store",
]

_STORED_COLUMNS = (
    "n_scored",
    "mean",
    "p10",
    "p50",
    "p90",
    "n_skipped",
    "n_failed",
    "computed_at",
)

Key = TypeVar("Key")
Row = TypeVar("Row")


# -- the writers' half ----------------------------------------------------------------------------
@contextmanager
def score_writes(conn: Connection, dialect: Dialect) -> Iterator[ScoreChanges]:
    """Around every write or delete of scores, in its transaction: takes the lock the writers
    share with the fills, yields the :class:`ScoreChanges` for the writer to fill in, and drops
    the cached rows they make stale, in one :func:`invalidate` call before the commit."""
    dialect.lock_score_writes(conn)
    changes = ScoreChanges()
    yield changes
    if changes:
        invalidate(conn, dialect, changes)


def invalidate(conn: Connection, dialect: Dialect, changes: ScoreChanges) -> None:
    """Drop the cached rows ``changes`` make stale: the summaries of the hour and day buckets
    of the touched (metric, trace start) pairs and the group sums of their hour, the judge-cost
    hours the results are or were stored at (every hour from the earliest replaced trace's
    start on), and after a retention delete everything before its cutoff (every cost hour).
    One round trip for the common case: the scoring hot path pays it once a batch."""
    dialect.drop_cached(conn, changes)


# -- the readers' half ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CachedRead(Generic[Key, Row]):
    """How one cache is read and filled, by keys of what it holds (a bucket, an hour).

    ``read`` returns the stored rows of some keys and which of those keys are stored (a key can
    be stored without rows: an ended bucket without results); ``compute`` aggregates rows of
    keys from the scores, for storing; ``store`` stores the computed rows of keys (marking the
    keys without rows); ``live`` aggregates the rows shown for keys not cached (default:
    ``compute``); ``stored``, only which keys are stored (default: ``read``'s second half).
    """

    read: Callable[[Connection, list[Key]], tuple[list[Row], set[Key]]]
    compute: Callable[[Connection, list[Key]], list[Row]]
    store: Callable[[Connection, list[Key], list[Row]], None]
    live: Callable[[Connection, list[Key]], list[Row]] | None = None
    stored: Callable[[Connection, list[Key]], set[Key]] | None = None


def read_through(
    engine: Engine,
    dialect: Dialect,
    cache: CachedRead[Key, Row],
    complete: Sequence[Key],
    partial: Sequence[Key] = (),
    *,
    conn: Connection | None = None,
    fill_only: bool = False,
) -> list[Row]:
    """Rows of ``complete`` keys (ended, wholly in the window) from the cache, the missing ones
    computed and stored under the fill lock; rows of ``partial`` keys computed live. The reads
    use ``conn`` when given. With ``fill_only``, only store what is missing and return what was
    computed (a background pass). On a read-only database (:func:`storage.db.read_only`) the
    missing rows are computed and not stored: the same rows, nothing written (a ``fill_only``
    pass then does nothing)."""
    wanted = list(complete)
    cached: list[Row] = []
    live: list[Row] = []

    def look(reader: Connection) -> set[Key]:
        nonlocal cached, live
        if fill_only:
            stored = cache.stored or (lambda c, keys: cache.read(c, keys)[1])
            seen = stored(reader, wanted) if wanted else set()
        else:
            cached, seen = cache.read(reader, wanted) if wanted else ([], set())
            if partial:
                live = (cache.live or cache.compute)(reader, list(partial))
        return seen

    if conn is not None:
        seen = look(conn)
    else:
        with engine.connect() as reader:
            seen = look(reader)
            reader.rollback()
    missing = [key for key in wanted if key not in seen]
    fresh: list[Row] = []
    if missing and not read_only(engine):
        try:
            with engine.begin() as fill:
                dialect.lock_for_fill(fill)
                fresh = cache.compute(fill, missing)
                cache.store(fill, missing, fresh)
            return cached + fresh + live
        except DBAPIError as exc:
            # A database that became read-only (a primary turned standby) after it was asked:
            # the fill's transaction is rolled back, and the rows are computed as below.
            if not is_read_only_error(exc):
                raise
            note_read_only(engine)
    if missing and not fill_only:
        # A read-only database (a standby, ``default_transaction_read_only``): the same rows,
        # computed and not stored; nothing is written.
        if conn is not None:
            fresh = cache.compute(conn, missing)
        else:
            with engine.connect() as reader:
                fresh = cache.compute(reader, missing)
                reader.rollback()
    return cached + fresh + live


# -- the summary cache's rows ---------------------------------------------------------------------
def read(
    conn: Connection,
    bucket: Bucket,
    app_key: str,
    versions: Mapping[str, str],
    starts: Sequence[datetime],
) -> dict[tuple[datetime, str], SummaryRow]:
    """Cached rows of ``starts``, keyed by (bucket start, metric)."""
    wanted = sorted(starts)
    if not wanted:
        return {}
    cached: dict[tuple[datetime, str], SummaryRow] = {}
    for r in conn.execute(
        select(SummaryCache).where(
            SummaryCache.bucket == bucket,
            SummaryCache.app_name == app_key,
            tuple_(SummaryCache.metric, SummaryCache.version).in_(list(versions.items())),
            SummaryCache.bucket_start.in_(wanted),
        )
    ):
        start = as_utc(r.bucket_start)
        cached[(start, r.metric)] = SummaryRow(
            bucket_start=start,
            metric=r.metric,
            version=r.version,
            count=r.n_scored,
            mean=r.mean,
            p10=r.p10,
            p50=r.p50,
            p90=r.p90,
            skipped=r.n_skipped,
            failed=r.n_failed,
        )
    return cached


def store(
    conn: Connection,
    dialect: Dialect,
    bucket: Bucket,
    app_key: str,
    rows: Sequence[SummaryRow],
    computed_at: datetime,
) -> None:
    """Store (or refresh) rows of complete buckets; call under the fill lock."""
    dialect.upsert(
        conn,
        SummaryCache.__table__,
        [
            {
                "bucket": bucket,
                "bucket_start": r.bucket_start,
                "metric": r.metric,
                "version": r.version,
                "app_name": app_key,
                "n_scored": r.count,
                "mean": r.mean,
                "p10": r.p10,
                "p50": r.p50,
                "p90": r.p90,
                "n_skipped": r.skipped,
                "n_failed": r.failed,
                "computed_at": computed_at,
            }
            for r in rows
        ],
        keys=("bucket", "bucket_start", "metric", "version", "app_name"),
        replace=_STORED_COLUMNS,
    )
