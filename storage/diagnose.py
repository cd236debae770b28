"""``scores diagnose``: from "recall dropped" to which requests, which documents, which claims.

Three sections over one metric's scored results in one window (and the history's filters):

- **slices**: each value of a request attribute (release, environment, tag, app, service, and
  user id and session id when they are not the clusters) and of the retrieved documents'
  metadata (a key such as ``source``, ``index`` or ``collection``; a trace is in the slice
  ``document.source=wiki`` when any document it retrieved has that metadata) is tested against
  the rest of the window: its mean, the difference from the rest's mean with a 95% interval, a
  two-sided p-value, and the Benjamini-Hochberg control of the false-discovery rate across
  every slice tested (:mod:`storage.diagnose_slices`). Ranked by impact, the requests' worth
  of recall the slice loses: ``count x (rest mean - slice mean)``.

  Dependent requests: when the window's traces carry user or session ids, a trace's cluster is
  its user, else its session, else itself (:mod:`storage.diagnose_clusters`), and each test is
  cluster-robust (CR1, Student's t on the clusters' degrees of freedom); the user and session
  ids are then not slices (each value lies within one cluster), nor is any slice or rest within
  a single cluster. Without any id, Welch's test over independent traces.

  Every value of every family is tested when it has enough traces, however many values the
  family has; a slice or a rest with fewer than ``min_count`` scored traces is not tested
  (named, the largest first). The traces without an attribute are part of every rest, not a
  slice. Metadata values longer than :data:`MAX_METADATA_CHARS` and nested values are left out.

- **missed references**: per reference document id (``id_based_context_recall``, from the
  ``found_ids``/``missing_ids`` evidence) or reference context (``non_llm_context_recall``,
  from its ``matches``), how many scored requests needed it and how many retrieved it, with a
  Wilson interval of the share retrieved; only references missed at least once, the most
  missed first.

- **unsupported claims** (``llm_context_recall``): per claim statement (case and surrounding
  space ignored), how often it was judged and how often not supported, with the reference it
  came from and the reference documents that should have supported it (from example traces).

On Postgres every section is summed from hourly rollups where the filters allow (app, release,
environment): release, environment and tag from ``History.group_summaries``' rollups, the other
attributes, the documents' metadata, the references and the claims from
:mod:`storage.diagnose_rollups` (hours the workers stored, the others computed by the same
per-hour statements). Elsewhere (SQLite, or filters by tag, user, session or service) each
section is one aggregate query over the window's scores, with the backend's JSON functions
(``Dialect.json_*``). Filter values travel as bound parameters.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ColumnElement,
    case,
    cast,
    func,
    literal,
    select,
    true,
    tuple_,
    union_all,
)
from sqlalchemy.engine import Connection

from recalltrace.storage import diagnose_clusters, diagnose_rollups, diagnose_slices
from recalltrace.storage.diagnose_rollups import (
    DOCUMENT_PREFIX,
    MAX_METADATA_CHARS,
    Hours,
    RolledSlices,
)
from recalltrace.storage.diagnose_rows import (
    Diagnosis,
    MissedReference,
    SliceRow,
    UnsupportedClaim,
)
from recalltrace.storage.diagnose_scope import _ON_TRACES, REQUEST_ATTRIBUTES, Scope
from recalltrace.storage.diagnose_stats import (
    DEFAULT_Q,
    MIN_SLICE_COUNT,
    ClusterSums,
    wilson,
)
from recalltrace.storage.history.selection import Selection, scope_key
from recalltrace.storage.history_rows import GroupSums
from recalltrace.storage.models import RetrievedContext, Score, Trace

if TYPE_CHECKING:
    from recalltrace.storage.history import History

DEFAULT_LIMIT = 10
"""Rows per section unless asked otherwise."""

EXAMPLES = 3
"""Example trace ids per row."""

MISSED_REFERENCE_METRICS = ("id_based_context_recall", "non_llm_context_recall")
CLAIM_METRICS = ("llm_context_recall",)


@contextmanager
def _reading(history: History) -> Iterator[Connection]:
    """A connection for the diagnosis' aggregates, tuned for them by the dialect."""
    with history.engine.begin() as conn:
        history.dialect.tune_for_aggregates(conn)
        yield conn


# -- the diagnosis -----------------------------------------------------------------------------
def diagnose(
    history: History,
    *,
    metric: str,
    since: datetime | None = None,
    until: datetime | None = None,
    app: str | None = None,
    version: str | None = None,
    where: Sequence[tuple[str, str]] = (),
    q: float = DEFAULT_Q,
    min_count: int = MIN_SLICE_COUNT,
    all_slices: bool = False,
    limit: int = DEFAULT_LIMIT,
) -> Diagnosis:
    """Diagnose ``metric`` (at its current version, or ``version``) over ``[since, until)``
    among the traces of ``app`` matching every ``(attribute, value)`` of ``where``.

    Slices are tested (two-sided) at false-discovery rate ``q``; only the significant ones
    below the rest are returned unless ``all_slices`` (then every slice tested, better ones
    too). Each section holds at most ``limit`` rows. ``app`` and ``where`` come checked
    (``History.diagnose``: text the database can hold)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must lie strictly between 0 and 1, not {q!r}")
    if min_count < 2:
        raise ValueError("min_count must be at least 2")
    if limit < 1:
        raise ValueError("limit must be at least 1")
    metric_version = history.metric_versions(metric, version)[metric]
    where = tuple(where)
    scope = Scope(metric, metric_version, since, until, app, where)

    def groups(by: str) -> Mapping[str | None, GroupSums]:
        return history.group_summaries(
            metric=metric,
            by=by,
            since=since,
            until=until,
            app=app,
            version=version,
            where=where,
            max_values=0,
        )

    by_release = groups("release")
    total = (
        sum(g.count for g in by_release.values()),
        sum(g.total for g in by_release.values()),
        sum(g.total_squares for g in by_release.values()),
    )
    empty = Diagnosis(
        metric=metric,
        version=metric_version,
        since=since,
        until=until,
        app=app,
        where=where,
        scored=total[0],
        mean=None,
        q=q,
        min_count=min_count,
        tested=0,
        skipped_small=0,
        skipped_attributes={},
        significant=0,
        significant_below=0,
        slices=[],
        missed=None,
        missed_total=0,
        claims=None,
    )
    if total[0] == 0:
        return empty

    rolled = _rolled_hours(history, metric, metric_version, since, until, app, where)

    # -- slices
    filtered = {name for name, _value in where}
    distinct = _trace_cardinalities(
        history, [a for a in _ON_TRACES if a not in filtered], since, until, app
    )
    keys = diagnose_clusters.choose_keys(sorted(filtered), distinct)
    if keys:
        tests, clustering, skipped_attributes = _clustered_tests(
            history, scope, keys, filtered, distinct, min_count
        )
        rolled_slices: RolledSlices | None = None
    else:
        rolled_slices = None
        if rolled is not None:
            with _reading(history) as conn:
                rolled_slices = diagnose_rollups.slices(conn, rolled)
        candidates, rolled_slices = _independent_candidates(
            history, scope, groups, by_release, filtered, distinct, rolled_slices
        )
        tests = diagnose_slices.run(candidates, total, min_count, None)
        clustering = diagnose_clusters.Clustering(()).describe()
        skipped_attributes = {}
    rows: list[SliceRow] = []
    for t in tests.tested:
        mean = t.total / t.count
        rest_count = total[0] - t.count
        rest_mean = (total[1] - t.total) / rest_count
        significant = t.q_value <= q
        if not all_slices and not (significant and t.difference < 0):
            continue
        rows.append(
            SliceRow(
                attribute=t.attribute,
                value=t.value,
                count=t.count,
                mean=mean,
                rest_count=rest_count,
                rest_mean=rest_mean,
                difference=t.difference,
                interval=t.interval,
                p_value=t.p_value,
                q_value=t.q_value,
                significant=significant,
                impact=t.count * (rest_mean - mean),
                where=None
                if t.attribute.startswith(DOCUMENT_PREFIX)
                else (*where, (t.attribute, t.value)),
            )
        )
    rows.sort(key=lambda r: (-r.impact, r.attribute, r.value))
    rows = _with_document_examples(history, scope, rows[:limit], rolled_slices)

    missed: list[MissedReference] | None = None
    missed_total = 0
    if metric in MISSED_REFERENCE_METRICS:
        missed, missed_total = _missed_references(history, scope, metric, total[0], limit, rolled)
    claims = _unsupported_claims(history, scope, limit, rolled) if metric in CLAIM_METRICS else None
    return Diagnosis(
        **{
            **empty.__dict__,
            "mean": total[1] / total[0],
            "tested": len(tests.tested),
            "skipped_small": len(tests.small),
            "small_slices": tests.small[:limit],
            "skipped_one_cluster": len(tests.one_cluster),
            "one_cluster_slices": tests.one_cluster[:limit],
            "skipped_attributes": skipped_attributes,
            "clustering": clustering,
            "significant": sum(1 for t in tests.tested if t.q_value <= q),
            "significant_below": sum(
                1 for t in tests.tested if t.q_value <= q and t.difference < 0
            ),
            "slices": rows,
            "missed": missed,
            "missed_total": missed_total,
            "claims": claims,
        }
    )


def _clustered_tests(
    history: History,
    scope: Scope,
    keys: tuple[str, ...],
    filtered: set[str],
    distinct: Mapping[str, int],
    min_count: int,
) -> tuple[diagnose_slices.Tests, str, dict[str, int]]:
    """The slice tests on sums per cluster (:mod:`storage.diagnose_clusters`), one statement
    over the window's scores; the line saying how traces were clustered; and the key attributes
    not sliced (each of their values lies within one cluster), with their number of values."""
    attributes = [
        a
        for a in ("release", "environment", "tag", "app", "service")
        if a not in filtered and not (a == "service" and distinct.get("service", 0) < 2)
    ]
    totals, sums, keyed = diagnose_clusters.slice_sums(
        history, scope, keys, attributes, documents=True
    )
    every = (totals.count, totals.total, 0.0)
    candidates: dict[str, Mapping[str | None, ClusterSums]] = {
        a: dict(sums.get(a, {})) for a in attributes
    }
    for attribute, values in sorted(sums.items()):
        if attribute.startswith(DOCUMENT_PREFIX):
            candidates[attribute] = dict(values)
    tests = diagnose_slices.run(candidates, every, min_count, totals)
    clustering = diagnose_clusters.Clustering(keys, totals.clusters, totals.count, keyed)
    unsliced = {
        name: distinct[name]
        for name in ("user_id", "session_id")
        if name not in filtered and distinct.get(name, 0) > 0
    }
    return tests, clustering.describe(), unsliced


def _independent_candidates(
    history: History,
    scope: Scope,
    groups: Any,
    by_release: Mapping[str | None, GroupSums],
    filtered: set[str],
    distinct: Mapping[str, int],
    rolled_slices: RolledSlices | None,
) -> tuple[dict[str, Mapping[str | None, GroupSums]], RolledSlices | None]:
    """Every family's values' sums for independent traces (from the rollups where kept), and
    the rollups when the documents' examples can come from them too."""
    candidates: dict[str, Mapping[str | None, GroupSums]] = {}
    for attribute in REQUEST_ATTRIBUTES:
        if attribute in filtered:
            continue  # one value: nothing to compare
        if attribute in distinct and distinct[attribute] < (2 if attribute == "service" else 1):
            continue  # no value, or one service (never missing): no slice to test, no join
        if attribute == "release":
            candidates[attribute] = by_release
        elif rolled_slices is not None and _rolled_attribute(rolled_slices, attribute):
            candidates[attribute] = rolled_slices.sums.get(attribute, {})
        else:
            candidates[attribute] = groups(attribute)
    if rolled_slices is not None and not any(
        key.startswith(DOCUMENT_PREFIX) for key in rolled_slices.overflow
    ):
        # Every key, however many values: each is tested on its values with enough traces.
        documents, _none = diagnose_rollups.documents(rolled_slices, sys.maxsize)
    else:
        documents = _document_slices(history, scope)
        rolled_slices = None  # the documents' examples too come from the scores
    for key, sums in documents.items():
        candidates[DOCUMENT_PREFIX + key] = sums
    return candidates, rolled_slices


def _rolled_hours(
    history: History,
    metric: str,
    version: str,
    since: datetime | None,
    until: datetime | None,
    app: str | None,
    where: Sequence[tuple[str, str]],
) -> Hours | None:
    """The window's hours for the rollups (``storage.diagnose_rollups``) where the caches are
    kept, the filters are ones the rollups are kept for (app, release, environment) and at
    least half the window's hours are stored; ``None``: every section reads the scores."""
    if not history.dialect.keeps_caches:
        return None
    scoped = Selection({metric: version}, since, until, app, tuple(where)).scope()
    if scoped is None:
        return None
    scoped_app, attributes = scoped
    hours = diagnose_rollups.window_hours(
        history.engine,
        history.dialect,
        metric=metric,
        version=version,
        scope=scope_key(scoped_app, attributes),
        app=scoped_app,
        attributes=attributes,
        since=since,
        until=until,
    )
    # Hour by hour, the scores cost more than in one pass over the window: a window mostly
    # not rolled up (no worker running, an app or release scope) is read in one pass.
    return hours if hours is not None and len(hours.live) <= len(hours.cached) else None


def _rolled_attribute(rolled: RolledSlices, attribute: str) -> bool:
    """Whether the rollups hold every value of ``attribute`` in the window."""
    return attribute in diagnose_rollups.ROLLED_ATTRIBUTES and attribute not in rolled.overflow


def _trace_cardinalities(
    history: History,
    attributes: Sequence[str],
    since: datetime | None,
    until: datetime | None,
    app: str | None,
) -> dict[str, int]:
    """Distinct values of the traces' own ``attributes`` among the window's traces (one scan of
    the window's traces, before any join to the scores)."""
    if not attributes:
        return {}
    conditions: list[ColumnElement[bool]] = []
    if since is not None:
        conditions.append(Trace.started_at >= since)
    if until is not None:
        conditions.append(Trace.started_at < until)
    if app is not None:
        conditions.append(Trace.app_name == app)
    stmt = select(*(func.count(_ON_TRACES[a].distinct()) for a in attributes)).where(*conditions)
    with _reading(history) as conn:
        counts = conn.execute(stmt).one()
    return {a: int(n or 0) for a, n in zip(attributes, counts, strict=True)}


def _metadata_pairs(history: History, scope: Scope) -> Any:
    """The distinct (trace, value, metadata key, metadata value) of the scope's scored traces'
    retrieved documents, as a CTE (scalar values of at most MAX_METADATA_CHARS only)."""
    scored = scope.select(Score.trace_id.label("trace_id"), Score.value.label("score")).cte(
        "scored"
    )
    pairs, scalar = history.dialect.json_scalar_pairs(RetrievedContext.metadata_)
    value = cast(pairs.c.value, RetrievedContext.context_id.type)
    return (
        select(
            scored.c.trace_id,
            scored.c.score,
            pairs.c.key.label("k"),
            value.label("v"),
        )
        .select_from(scored)
        .join(RetrievedContext, RetrievedContext.trace_id == scored.c.trace_id)
        .join(pairs, true())
        .where(scalar, func.length(value) <= MAX_METADATA_CHARS)
        .distinct()
        .cte("pairs")
    )


def _document_slices(history: History, scope: Scope) -> dict[str, dict[str | None, GroupSums]]:
    """Per metadata key: each value's sums (over distinct traces)."""
    pairs = _metadata_pairs(history, scope)
    stmt = select(
        pairs.c.k,
        pairs.c.v,
        func.count().label("n"),
        func.sum(pairs.c.score).label("s"),
        func.sum(pairs.c.score * pairs.c.score).label("ss"),
    ).group_by(pairs.c.k, pairs.c.v)
    slices: dict[str, dict[str | None, GroupSums]] = {}
    with _reading(history) as conn:
        for row in conn.execute(stmt):
            slices.setdefault(row.k, {})[str(row.v)] = GroupSums(
                int(row.n), float(row.s), float(row.ss), 0
            )
    # A key some traces' documents lack: those traces are in every rest (never a slice).
    return {k: {**v, None: GroupSums(0, 0.0, 0.0, 0)} for k, v in sorted(slices.items())}


def _with_document_examples(
    history: History, scope: Scope, rows: list[SliceRow], rolled: RolledSlices | None
) -> list[SliceRow]:
    """``rows`` with the lowest-scoring traces of each document-metadata slice (from the
    rollups when the slices came from there)."""
    wanted = [
        (r.attribute.removeprefix(DOCUMENT_PREFIX), r.value)
        for r in rows
        if r.attribute.startswith(DOCUMENT_PREFIX)
    ]
    if not wanted:
        return rows
    examples: dict[tuple[str, str], list[str]] = {}
    if rolled is not None:
        examples = {(k, v): rolled.examples.get((DOCUMENT_PREFIX + k, v), []) for k, v in wanted}
        return _named_examples(rows, examples)
    pairs = _metadata_pairs(history, scope)
    ranked = (
        select(
            pairs.c.k,
            pairs.c.v,
            pairs.c.trace_id,
            func.row_number()
            .over(partition_by=(pairs.c.k, pairs.c.v), order_by=(pairs.c.score, pairs.c.trace_id))
            .label("rank"),
        )
        .where(tuple_(pairs.c.k, pairs.c.v).in_(wanted))
        .subquery()
    )
    with _reading(history) as conn:
        stmt = select(ranked.c.k, ranked.c.v, ranked.c.trace_id).where(ranked.c.rank <= EXAMPLES)
        for k, v, trace_id in conn.execute(stmt.order_by(ranked.c.k, ranked.c.v, ranked.c.rank)):
            examples.setdefault((k, str(v)), []).append(trace_id)
    return _named_examples(rows, examples)


def _named_examples(
    rows: list[SliceRow], examples: Mapping[tuple[str, str], list[str]]
) -> list[SliceRow]:
    out = []
    for r in rows:
        if r.attribute.startswith(DOCUMENT_PREFIX):
            found = examples.get((r.attribute.removeprefix(DOCUMENT_PREFIX), r.value), [])
            r = SliceRow(**{**r.__dict__, "example_trace_ids": tuple(found)})
        out.append(r)
    return out


# -- missed references -------------------------------------------------------------------------
def _reference_hits(history: History, scope: Scope, metric: str) -> Any:
    """``(ref, hit, trace_id, started)`` per reference of each scored result's evidence, as a
    subquery: ``hit`` 1 when the request retrieved it."""
    dialect = history.dialect
    if metric == "id_based_context_recall":
        parts = []
        for key, flag in (("found_ids", 1), ("missing_ids", 0)):
            element = dialect.json_elements(Score.details, key)
            parts.append(
                scope.select(
                    dialect.json_text(element.c.value).label("ref"),
                    literal(flag).label("hit"),
                    Score.trace_id.label("trace_id"),
                    Score.trace_started_at.label("started"),
                ).join(element, true())
            )
        return union_all(*parts).subquery()
    element = dialect.json_elements(Score.details, "matches")
    index = dialect.json_field(element.c.value, "reference_index")
    found = dialect.json_field(element.c.value, "found")
    return (
        scope.select(
            dialect.json_item(Trace.reference_contexts, index).label("ref"),
            case((dialect.json_is(found, True), 1), else_=0).label("hit"),
            Score.trace_id.label("trace_id"),
            Score.trace_started_at.label("started"),
            trace=True,
        )
        .join(element, true())
        .subquery()
    )


def _missed_references(
    history: History, scope: Scope, metric: str, scored: int, limit: int, rolled: Hours | None
) -> tuple[list[MissedReference], int]:
    kind = "id" if metric == "id_based_context_recall" else "context"
    examples: dict[str, list[str]] = {}
    with _reading(history) as conn:
        if rolled is not None:
            groups, examples = diagnose_rollups.references(conn, rolled, limit)
        else:
            groups = _scored_references(history, conn, scope, metric, limit, examples)
    groups.sort(key=lambda g: (-(g[1] - g[2]), -g[1], g[0]))
    rows = [
        MissedReference(
            reference=ref,
            kind=kind,
            needed=n,
            retrieved=k,
            needed_share=n / scored,
            retrieved_share=k / n,
            interval=wilson(k, n),
            example_trace_ids=tuple(examples.get(ref, ())),
        )
        for ref, n, k in groups[:limit]
    ]
    return rows, len(groups)


def _recent_examples(
    conn: Connection, rows: Any, key: Any, wanted: Any, keys: list[Any]
) -> dict[Any, list[str]]:
    """The ``EXAMPLES`` latest trace ids per ``key`` value in ``keys`` among the ``rows`` where
    ``wanted`` holds (``rows`` has ``trace_id`` and ``started``): the path for a dialect without
    an aggregate that keeps them (``Dialect.recent_first``)."""
    ranked = (
        select(
            key.label("key"),
            rows.c.trace_id,
            func.row_number()
            .over(partition_by=key, order_by=(rows.c.started.desc(), rows.c.trace_id))
            .label("rank"),
        )
        .where(wanted, key.in_(keys))
        .subquery()
    )
    found: dict[Any, list[str]] = {}
    for value, trace_id in conn.execute(
        select(ranked.c.key, ranked.c.trace_id)
        .where(ranked.c.rank <= EXAMPLES)
        .order_by(ranked.c.key, ranked.c.rank)
    ):
        found.setdefault(value, []).append(trace_id)
    return found


def _scored_references(
    history: History,
    conn: Connection,
    scope: Scope,
    metric: str,
    limit: int,
    examples: dict[str, list[str]],
) -> list[tuple[str, int, int]]:
    """:func:`_missed_references`' groups from the scores, filling ``examples`` for the
    ``limit`` most missed."""
    hits = _reference_hits(history, scope, metric)
    needed = func.count()
    retrieved = func.sum(hits.c.hit)
    columns: list[Any] = [hits.c.ref, needed, retrieved]
    recent = history.dialect.recent_first(
        hits.c.trace_id, hits.c.started, hits.c.hit == 0, EXAMPLES
    )
    if recent is not None:
        columns.append(recent)
    stmt = (
        select(*columns)
        .where(hits.c.ref.is_not(None))
        .group_by(hits.c.ref)
        .having(needed > retrieved)
    )
    groups = []
    for row in conn.execute(stmt):
        groups.append((str(row[0]), int(row[1]), int(row[2])))
        if recent is not None:
            examples[str(row[0])] = list(row[3] or ())
    groups.sort(key=lambda g: (-(g[1] - g[2]), -g[1], g[0]))
    shown = groups[:limit]
    if shown and recent is None:
        for ref, ids in _recent_examples(
            conn, hits, hits.c.ref, hits.c.hit == 0, [g[0] for g in shown]
        ).items():
            examples[str(ref)] = ids
    return groups


# -- unsupported claims ------------------------------------------------------------------------
def _scored_claims(
    history: History, conn: Connection, scope: Scope, limit: int
) -> tuple[list[tuple[str, str, int, int]], dict[str, list[str]]]:
    """The ``limit`` claims most often unsupported, from the scores, with recent traces where
    each was not supported."""
    dialect = history.dialect
    element = dialect.json_elements(Score.details, "claims")
    statement = dialect.json_field(element.c.value, "statement")
    unsupported_flag = dialect.json_is(dialect.json_field(element.c.value, "attributed"), 0)
    claims = (
        scope.select(
            func.lower(func.trim(statement)).label("claim"),
            statement.label("statement"),
            case((unsupported_flag, 1), else_=0).label("unsupported"),
            Score.trace_id.label("trace_id"),
            Score.trace_started_at.label("started"),
        )
        .join(element, true())
        .subquery()
    )
    unsupported = func.sum(claims.c.unsupported)
    columns: list[Any] = [claims.c.claim, func.min(claims.c.statement), unsupported, func.count()]
    recent = dialect.recent_first(
        claims.c.trace_id, claims.c.started, claims.c.unsupported == 1, EXAMPLES
    )
    if recent is not None:
        columns.append(recent)
    stmt = (
        select(*columns)
        .where(claims.c.claim.is_not(None))
        .group_by(claims.c.claim)
        .having(unsupported > 0)
        .order_by(unsupported.desc(), func.count().desc(), claims.c.claim)
        .limit(limit)
    )
    rows = conn.execute(stmt).all()
    groups = [(r[0], str(r[1]), int(r[2]), int(r[3])) for r in rows]
    ids_of: dict[str, list[str]] = {}
    if recent is not None:
        ids_of = {r[0]: list(r[4] or ()) for r in rows}
    elif groups:
        ids_of = _recent_examples(
            conn, claims, claims.c.claim, claims.c.unsupported == 1, [g[0] for g in groups]
        )
    return groups, ids_of


def _unsupported_claims(
    history: History, scope: Scope, limit: int, rolled: Hours | None
) -> list[UnsupportedClaim]:
    examples: dict[str, list[tuple[str, str | None, list[str] | None]]] = {}
    with _reading(history) as conn:
        if rolled is not None:
            groups, ids_of = diagnose_rollups.claims(conn, rolled, limit)
        else:
            groups, ids_of = _scored_claims(history, conn, scope, limit)
        wanted = [t for ids in ids_of.values() for t in ids]
        traces = {
            t: (reference, ids)
            for t, reference, ids in conn.execute(
                select(Trace.trace_id, Trace.reference, Trace.reference_context_ids).where(
                    Trace.trace_id.in_(wanted)
                )
            )
        }
        for claim, ids in ids_of.items():
            examples[claim] = [(t, *traces.get(t, (None, None))) for t in ids]
    out = []
    for claim, first, n_unsupported, judged in groups:
        found = examples.get(claim, [])
        references = Counter(r for _t, r, _i in found if r)
        documents = list(dict.fromkeys(str(d) for _t, _r, ids in found for d in ids or ()))
        out.append(
            UnsupportedClaim(
                claim=first,
                unsupported=n_unsupported,
                judged=judged,
                unsupported_share=n_unsupported / judged,
                interval=wilson(n_unsupported, judged),
                reference=references.most_common(1)[0][0] if references else None,
                expected_documents=tuple(documents),
                example_trace_ids=tuple(t for t, _r, _i in found),
            )
        )
    return out


__all__ = [
    "CLAIM_METRICS",
    "DEFAULT_LIMIT",
    "DOCUMENT_PREFIX",
    "MAX_METADATA_CHARS",
    "MISSED_REFERENCE_METRICS",
    "REQUEST_ATTRIBUTES",
    "Diagnosis",
    "MissedReference",
    "SliceRow",
    "UnsupportedClaim",
    "diagnose",
]
