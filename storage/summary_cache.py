"""The summary cache: per-bucket statistics of complete buckets, and the lock that keeps it true.

History reads of a long window are dominated by buckets that can no longer change, so their
rows (count, mean, percentiles, skipped and failed counts) are computed once and kept in
``summary_cache`` (Postgres only). Both halves of the one lock that keeps a cached row equal to
what the scores say live here:

- every writer of scores takes :data:`SUMMARY_LOCK_KEY` *shared* (:func:`lock_for_score_writes`)
  and drops the cached rows of the buckets it touched (:func:`invalidate`, which also drops
  the hourly rollups' rows, see ``storage.rollups``) in its transaction;
- a fill takes it *exclusively* (:func:`lock_for_fill`) while it computes and stores rows, so no
  score can be committed into a bucket between the computation and the row being stored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone

from sqlalchemy import delete, func, select, text, tuple_
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection

from recalltrace.storage._dialect import Dialect
from recalltrace.storage.history_rows import Bucket, SummaryRow
from recalltrace.storage.models import GroupCache, SummaryCache

SUMMARY_LOCK_KEY = 0x7265_6361_6C6C
"""Postgres advisory lock between score writers (shared) and summary-cache fills (exclusive)."""

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


def as_utc(value: datetime) -> datetime:
    """``value`` in UTC; a naive time (as SQLite returns) is taken to be UTC already."""
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def hour_of(moment: datetime) -> datetime:
    """The start of the UTC hour holding ``moment``."""
    return as_utc(moment).replace(minute=0, second=0, microsecond=0)


def bucket_starts(moment: datetime) -> list[tuple[Bucket, datetime]]:
    """The hour and day buckets (UTC) that contain ``moment``."""
    hour = hour_of(moment)
    return [("hour", hour), ("day", hour.replace(hour=0))]


# -- the writers' half ----------------------------------------------------------------------------
def lock_for_score_writes(conn: Connection, dialect: Dialect) -> None:
    """Shared side of :data:`SUMMARY_LOCK_KEY`: take it before writing or deleting scores."""
    if dialect.postgres:
        conn.execute(select(func.pg_advisory_xact_lock_shared(SUMMARY_LOCK_KEY)))


_INVALIDATE = text(
    """
    WITH summaries AS (
        DELETE FROM summary_cache
        WHERE (bucket, bucket_start, metric) IN (
            SELECT * FROM unnest(CAST(:buckets AS text[]), CAST(:starts AS timestamptz[]),
                                 CAST(:metrics AS text[])))
    ), groups AS (
        DELETE FROM group_cache
        WHERE (metric, bucket_start) IN (
            SELECT * FROM unnest(CAST(:hour_metrics AS text[]), CAST(:hours AS timestamptz[])))
    )
    DELETE FROM cost_cache WHERE hour = ANY(CAST(:scored_hours AS timestamptz[]))
    """
)


def invalidate(
    conn: Connection,
    dialect: Dialect,
    touched: Iterable[tuple[str, datetime]],
    scored: Iterable[datetime] = (),
) -> None:
    """Drop the cached rows that scores just written or deleted change, in one statement (the
    scoring hot path pays one round trip a batch): for the (metric, trace start) pairs
    ``touched``, the summaries of their hour and day buckets and the group sums of their hour;
    and the judge-cost hours holding ``scored``, the times those results are or were stored
    at (``storage.rollups``; the cost hours of results an upsert replaced:
    :func:`storage.rollups.invalidate_cost_from`)."""
    if not dialect.postgres:
        return  # the caches are only used on Postgres
    buckets = sorted(
        {(b, start, metric) for metric, moment in touched for b, start in bucket_starts(moment)}
    )
    hours = [(metric, start) for b, start, metric in buckets if b == "hour"]
    conn.execute(
        _INVALIDATE,
        {
            "buckets": [b for b, _s, _m in buckets],
            "starts": [start for _b, start, _m in buckets],
            "metrics": [metric for _b, _s, metric in buckets],
            "hour_metrics": [metric for metric, _h in hours],
            "hours": [hour for _m, hour in hours],
            "scored_hours": sorted({hour_of(moment) for moment in scored}),
        },
    )


def invalidate_before(conn: Connection, dialect: Dialect, cutoff: datetime) -> None:
    """Drop every cached row whose bucket starts before ``cutoff`` (traces were deleted)."""
    if dialect.postgres:
        conn.execute(delete(SummaryCache).where(SummaryCache.bucket_start <= cutoff))
        conn.execute(delete(GroupCache).where(GroupCache.bucket_start <= cutoff))


# -- the fill's half ------------------------------------------------------------------------------
def lock_for_fill(conn: Connection) -> None:
    """Exclusive side of :data:`SUMMARY_LOCK_KEY`: hold it while computing rows to store."""
    conn.execute(select(func.pg_advisory_xact_lock(SUMMARY_LOCK_KEY)))


def read(
    conn: Connection,
    bucket: Bucket,
    app_key: str,
    versions: Mapping[str, str],
    starts: Iterable[datetime],
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
    bucket: Bucket,
    app_key: str,
    rows: Sequence[SummaryRow],
    computed_at: datetime,
) -> None:
    """Store (or refresh) rows of complete buckets; call under :func:`lock_for_fill`."""
    if not rows:
        return
    stmt = pg_insert(SummaryCache).values(
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
        ]
    )
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=["bucket", "bucket_start", "metric", "version", "app_name"],
            set_={k: stmt.excluded[k] for k in _STORED_COLUMNS},
        )
    )
