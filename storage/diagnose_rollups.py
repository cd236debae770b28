"""Per-hour rollups of what ``scores diagnose`` reads (Postgres).

Every section of a diagnosis is a sum over the window's scored results, and every result lies in
one hour of trace start, so a window is the sum of its hours: per hour, variant and scope (app
and release or environment filters, as ``group_cache``) ``diagnose_cache`` keeps

- per value of the request attributes kept on the traces (``app``, ``service``, ``user_id``,
  ``session_id``) and of the retrieved documents' metadata (``document.KEY``) the scored count,
  sum and sum of squares (what Welch's test needs), and a document value's three lowest-scoring
  traces; an attribute with more than :data:`MAX_ROLLED_VALUES` values in an hour is kept as an
  ``overflow`` mark instead (its values would outnumber the results they sum), and a diagnosis
  that slices it reads it from the scores;
- per reference document id (``id_based_context_recall``) or reference context
  (``non_llm_context_recall``) how many requests needed it and retrieved it, with the three
  most recent that missed it;
- per claim (``llm_context_recall``) how often it was judged and not supported, its first
  statement, and the three most recent traces where it was not.

The workers' background pass (``History.warm_summaries``) stores the ended hours of the last
days for every variant, all apps together; a diagnosis reads those and computes the others (the
window's partial edges, the newest hour, any hour not stored yet) with the same per-hour
statements, so stored and computed hours are summed alike (``storage.diagnose`` reads a window
mostly not stored, such as every window of another scope, from the scores in one pass). A
score written, replaced or deleted drops its hour (``storage.summary_cache.invalidate``, with
the other caches'), and fills hold the same exclusive lock as the other caches' fills. The
statements are Postgres's (:mod:`storage._postgres`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, delete, select
from sqlalchemy.engine import Connection

from recalltrace.storage import _postgres
from recalltrace.storage._dialect import Dialect, as_utc
from recalltrace.storage.access import read_only
from recalltrace.storage.history.selection import Selection, window_bounds
from recalltrace.storage.history_rows import GroupSums
from recalltrace.storage.models import DiagnoseCache, Score
from recalltrace.storage.rollups import HOUR, split_window

DOCUMENT_PREFIX = "document."
"""Slices of retrieved documents' metadata are named ``document.KEY``."""

MAX_METADATA_CHARS = 200
"""Document metadata values longer than this are not slice values."""

MAX_ROLLED_VALUES = 200
"""An attribute (or metadata key) with more values than this in one hour is not rolled up for
that hour: a diagnosis slicing it reads it from the scores."""

FILL_HOURS = 24
"""Hours computed and stored per fill transaction (the fill lock is held that long)."""

ROLLED_ATTRIBUTES = ("app", "service", "user_id", "session_id")
"""The request attributes rolled up here (release, environment and tag are ``group_cache``'s)."""

REFERENCE_KINDS = {"id_based_context_recall": "id", "non_llm_context_recall": "context"}
"""The variants whose evidence names references, and the kind of reference."""

CLAIM_METRICS = ("llm_context_recall",)
"""The variants whose evidence judges claims."""


@dataclass(frozen=True)
class Hours:
    """The hours of one diagnosis' window: stored ones read from ``diagnose_cache``, the
    others computed by the per-hour statements, and the parameters of both."""

    metric: str
    attributes: tuple[str, ...]
    with_app: bool
    cached: list[datetime]
    live: list[datetime]
    params: dict[str, Any] = field(default_factory=dict)

    def bind(self, **more: Any) -> dict[str, Any]:
        """The statements' parameters."""
        return {**self.params, "cached": self.cached, "starts": self.live, **more}


def _bindings(
    metric: str,
    version: str,
    scope: str,
    app: str | None,
    attributes: Mapping[str, str],
    lower: datetime,
    upper: datetime,
) -> dict[str, Any]:
    return {
        "metric": metric,
        "version": version,
        "scope": scope,
        "app": app,
        "lower": lower,
        "upper": upper,
        **{f"attr_{name}": value for name, value in attributes.items()},
    }


def _stored_hours(
    conn: Connection, metric: str, version: str, scope: str, starts: Sequence[datetime]
) -> set[datetime]:
    if not starts:
        return set()
    stmt = select(DiagnoseCache.bucket_start).where(
        DiagnoseCache.metric == metric,
        DiagnoseCache.version == version,
        DiagnoseCache.scope == scope,
        DiagnoseCache.section == "hour",
        DiagnoseCache.bucket_start >= min(starts),
        DiagnoseCache.bucket_start <= max(starts),
    )
    return {as_utc(start) for start in conn.execute(stmt).scalars()} & set(starts)


def window_hours(
    engine: Engine,
    dialect: Dialect,
    *,
    metric: str,
    version: str,
    scope: str,
    app: str | None,
    attributes: Mapping[str, str],
    since: datetime | None,
    until: datetime | None,
) -> Hours | None:
    """The hours of ``[since, until)`` (an open end closed at the first or last result), split
    into the stored ones and the ones to compute; ``None`` for a window without results."""
    window = Selection({metric: version}, since, until, app)
    with engine.connect() as conn:
        now, bounds = window_bounds(
            conn, dialect, Score.trace_started_at, since, until, window.score_conditions()
        )
        if bounds is None:
            return None
        lower, upper = bounds
        complete, partial = split_window(lower, upper, now)
        stored = _stored_hours(conn, metric, version, scope, complete)
    return Hours(
        metric=metric,
        attributes=tuple(sorted(attributes)),
        with_app=app is not None,
        cached=sorted(stored),
        live=sorted([*partial, *(h for h in complete if h not in stored)]),
        params=_bindings(metric, version, scope, app, attributes, lower, upper),
    )


# -- the fill -------------------------------------------------------------------------------------
def fill(
    engine: Engine,
    dialect: Dialect,
    *,
    versions: Mapping[str, str],
    lower: datetime,
    upper: datetime,
    now: datetime,
) -> int:
    """Store the ended hours of ``[lower, upper)`` not stored yet for each variant of
    ``versions`` (metric: version), every app together, newest first, :data:`FILL_HOURS` hours
    per transaction under the fill lock. Returns how many (variant, hour) pairs it stored
    (none on a read-only database: :func:`storage.db.read_only`)."""
    if read_only(engine):
        return 0
    complete, _partial = split_window(lower, upper, now)
    missing: dict[datetime, set[str]] = {}
    with engine.connect() as conn:
        for metric, version in versions.items():
            stored = _stored_hours(conn, metric, version, "", complete)
            for hour in complete:
                if hour not in stored:
                    missing.setdefault(hour, set()).add(metric)
    done = _mark_empty(engine, dialect, versions, missing)
    # Newest first: a diagnosis of the last days is served by the first batches, and a pass cut
    # short (a worker stopped) has stored what is asked most.
    hours = sorted(missing, reverse=True)
    for first in range(0, len(hours), FILL_HOURS):
        batch = hours[first : first + FILL_HOURS]
        metrics = sorted(set().union(*(missing[h] for h in batch)))
        with engine.begin() as conn:
            dialect.lock_for_fill(conn)
            dialect.tune_for_aggregates(conn)
            _store(conn, {m: versions[m] for m in metrics}, batch)
        done += sum(len(missing[h]) for h in batch)
    return done


def _mark_empty(
    engine: Engine,
    dialect: Dialect,
    versions: Mapping[str, str],
    missing: dict[datetime, set[str]],
) -> int:
    """Mark stored, in one transaction, the missing (hour, variant) pairs without a score (a
    new database, a quiet night), and take them out of ``missing``: their sums are empty, and
    computing them costs a round of statements per hour. Returns how many it marked."""
    if not missing:
        return 0
    metrics = sorted(set().union(*missing.values()))
    by_metric: dict[str, list[datetime]] = {}
    with engine.begin() as conn:
        # Probed and marked in one transaction under the fill lock, as a fill computes and
        # stores its hours.
        dialect.lock_for_fill(conn)
        empty = conn.execute(
            _postgres.DIAGNOSE_EMPTY_HOURS, {"starts": sorted(missing), "metrics": metrics}
        ).all()
        for hour, metric in empty:
            hour = as_utc(hour)
            if metric in missing.get(hour, ()):
                by_metric.setdefault(metric, []).append(hour)
        for metric, hours in by_metric.items():
            # Replaced, not doubled, when another fill marked or stored them meanwhile.
            conn.execute(
                delete(DiagnoseCache).where(
                    DiagnoseCache.metric == metric,
                    DiagnoseCache.scope == "",
                    DiagnoseCache.bucket_start.in_(hours),
                )
            )
            conn.execute(
                _postgres.DIAGNOSE_STORED_HOURS,
                {
                    "scope": "",
                    "starts": hours,
                    "metrics": [metric],
                    "versions": [versions[metric]],
                },
            )
    for metric, hours in by_metric.items():
        for hour in hours:
            missing[hour].discard(metric)
            if not missing[hour]:
                del missing[hour]
    return sum(len(hours) for hours in by_metric.values())


def _store(conn: Connection, versions: Mapping[str, str], hours: list[datetime]) -> None:
    """Compute and store every section of ``hours`` for each variant of ``versions`` (what
    another fill stored meanwhile is replaced, not doubled)."""
    conn.execute(
        delete(DiagnoseCache).where(
            DiagnoseCache.metric.in_(list(versions)),
            DiagnoseCache.scope == "",
            DiagnoseCache.bucket_start.in_(hours),
        )
    )
    every = {
        "scope": "",
        "starts": hours,
        "metrics": list(versions),
        "versions": list(versions.values()),
    }
    slices_sql = _postgres.diagnose_fill_slices_sql(MAX_METADATA_CHARS)
    conn.execute(_postgres.diagnose_store_sql(slices_sql, MAX_ROLLED_VALUES), every)
    for metric, version in versions.items():
        sql = _evidence_sql(metric, (), False)
        if sql is not None:
            window = _bindings(metric, version, "", None, {}, min(hours), max(hours) + HOUR)
            conn.execute(
                _postgres.diagnose_store_sql(_postgres.diagnose_of_variant(sql), MAX_ROLLED_VALUES),
                {**window, "starts": hours},
            )
    conn.execute(_postgres.DIAGNOSE_STORED_HOURS, every)


def _evidence_sql(metric: str, attributes: Sequence[str], with_app: bool) -> str | None:
    """The per-hour statement of ``metric``'s references or claims (``None``: it has
    neither)."""
    if metric in REFERENCE_KINDS:
        return _postgres.diagnose_references_sql(REFERENCE_KINDS[metric], attributes, with_app)
    if metric in CLAIM_METRICS:
        return _postgres.diagnose_claims_sql(attributes, with_app)
    return None


# -- the reads ------------------------------------------------------------------------------------
@dataclass
class RolledSlices:
    """The window's slices from the rollups: per attribute (``document.KEY`` for metadata) each
    value's sums (``None``: the traces without it), the example traces of document values, and
    the attributes some hour held too many values of (read those from the scores)."""

    sums: dict[str, dict[str | None, GroupSums]]
    examples: dict[tuple[str, str], list[str]]
    overflow: set[str]


def slices(conn: Connection, hours: Hours) -> RolledSlices:
    """The window's slices: stored hours summed with the others computed now."""
    sql = _postgres.diagnose_slices_sql(hours.attributes, hours.with_app, MAX_METADATA_CHARS)
    out = RolledSlices({}, {}, set())
    for row in conn.execute(_postgres.diagnose_slices_merge(sql), hours.bind()):
        if row.overflow:
            out.overflow.add(row.key)
            continue
        out.sums.setdefault(row.key, {})[row.value] = GroupSums(
            int(row.n), float(row.total), float(row.total_sq), 0
        )
        if row.ids:
            out.examples[(row.key, row.value)] = list(row.ids)
    return out


def documents(
    rolled: RolledSlices, max_values: int
) -> tuple[dict[str, dict[str | None, GroupSums]], dict[str, int]]:
    """Per metadata key with at most ``max_values`` values in the window: each value's sums
    (and the empty group of the traces without it); and the keys with more, with their
    number of values."""
    slices: dict[str, dict[str | None, GroupSums]] = {}
    too_many: dict[str, int] = {}
    for attribute, sums in sorted(rolled.sums.items()):
        if not attribute.startswith(DOCUMENT_PREFIX):
            continue
        key = attribute.removeprefix(DOCUMENT_PREFIX)
        if len(sums) > max_values:
            too_many[key] = len(sums)
        else:
            slices[key] = {**sums, None: GroupSums(0, 0.0, 0.0, 0)}
    return slices, too_many


def references(
    conn: Connection, hours: Hours, limit: int
) -> tuple[list[tuple[str, int, int]], dict[str, list[str]]]:
    """Every reference of the window missed at least once, ``(reference, needed, retrieved)``,
    and the recent requests that missed each of the ``limit`` most missed."""
    sql = _postgres.diagnose_references_sql(
        REFERENCE_KINDS[hours.metric], hours.attributes, hours.with_app
    )
    groups: list[tuple[str, int, int]] = []
    examples: dict[str, list[str]] = {}
    for row in conn.execute(_postgres.diagnose_references_merge(sql), hours.bind(limit=limit)):
        groups.append((str(row.value), int(row.n), int(row.k)))
        if row.ids:
            examples[str(row.value)] = list(row.ids)
    return groups, examples


def claims(
    conn: Connection, hours: Hours, limit: int
) -> tuple[list[tuple[str, str, int, int]], dict[str, list[str]]]:
    """The ``limit`` claims most often unsupported, ``(claim, first statement, unsupported,
    judged)``, and the recent traces where each was not supported."""
    sql = _postgres.diagnose_claims_sql(hours.attributes, hours.with_app)
    groups: list[tuple[str, str, int, int]] = []
    examples: dict[str, list[str]] = {}
    for row in conn.execute(_postgres.diagnose_claims_merge(sql), hours.bind(limit=limit)):
        groups.append((row.value, str(row.label), int(row.k), int(row.n)))
        examples[row.value] = list(row.ids or ())
    return groups, examples
