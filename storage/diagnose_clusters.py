"""Per-cluster sums for ``scores diagnose`` and ``scores compare``: requests of one user (or one
session) are easier or harder together, so their slices are tested on sums per cluster.

A trace's cluster is its user when it has one, else its session, else the trace alone (the
coarsest key first: sessions belong to users). An attribute that is itself a key (``user_id``,
``session_id``), or that a filter pins, is not a clustering key: within one user the clusters
are the sessions, within one session the traces.

The database adds up, per slice (attribute value) and cluster ``g``, the slice's count
``n_gs`` and sum ``T_gs``, joins each to its cluster's own count ``n_g`` and sum ``T_g``, and
returns per slice the sums over clusters of their products (:class:`ClusterSums`): what the
cluster-robust variance (:func:`storage.diagnose_stats.clustered`) needs, whatever the number
of clusters. One aggregate statement, the same on SQLite and Postgres.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Select, case, cast, func, literal, select, true, union_all
from sqlalchemy.engine import Connection

from recalltrace.storage.diagnose_rollups import DOCUMENT_PREFIX, MAX_METADATA_CHARS
from recalltrace.storage.diagnose_scope import Scope
from recalltrace.storage.diagnose_stats import ClusterSums, ClusterTotals
from recalltrace.storage.models import RetrievedContext, Score, Trace, TraceTag

if TYPE_CHECKING:
    from recalltrace.storage.history import History

USER, SESSION = "user", "session"
"""The clustering keys, coarsest first."""

KEY_ATTRIBUTES = {USER: "user_id", SESSION: "session_id"}
"""The request attribute of each key."""

_COLUMNS: dict[str, Any] = {
    "release": Score.release,
    "environment": Score.environment,
    "app": Score.app_name,
    "service": Trace.service_name,
    "user_id": Trace.user_id,
    "session_id": Trace.session_id,
}


@dataclass(frozen=True)
class Clustering:
    """How one diagnosis or comparison groups its traces."""

    keys: tuple[str, ...]
    """The keys used, coarsest first (``("user", "session")``); empty: independent traces."""
    clusters: int = 0
    """Clusters in the window (a trace without a key is a cluster of its own)."""
    traces: int = 0
    keyed: int = 0
    """Traces with one of the keys."""

    @property
    def independent(self) -> bool:
        """No key: every trace counts on its own (Welch's test)."""
        return not self.keys

    def describe(self) -> str:
        """One line: what the intervals and p-values treat as independent."""
        if self.independent:
            return "traces treated as independent (no user or session ids in the window)"
        names = " or ".join(self.keys)
        alone = self.traces - self.keyed
        text = (
            f"clustered by {names} ({self.clusters:,} clusters of {self.traces:,} traces"
            + (f"; {alone:,} without a {names} id counted alone" if alone else "")
            + "): cluster-robust intervals (CR1), Student's t"
        )
        return text


def choose_keys(pinned: Sequence[str], present: dict[str, int]) -> tuple[str, ...]:
    """The keys to cluster on: those with values in the window (``present``: attribute ->
    distinct values), coarser than any pinned by a filter or a grouping (one user pinned: its
    sessions; one session pinned: its traces)."""
    if "session_id" in pinned:
        return ()
    keys = (SESSION,) if "user_id" in pinned else (USER, SESSION)
    return tuple(k for k in keys if present.get(KEY_ATTRIBUTES[k], 0) > 0)


def cluster_key(keys: Sequence[str]) -> Any:
    """The cluster of a trace (needs ``traces`` joined): its first key present, else itself."""
    parts: list[Any] = []
    for key in keys:
        column = Trace.user_id if key == USER else Trace.session_id
        parts.append(literal(key[0] + ":").concat(column))
    parts.append(literal("t:").concat(Score.trace_id))
    return func.coalesce(*parts) if len(parts) > 1 else parts[0]


def _member_sums(members: Any, clusters: Any) -> Select[Any]:
    """Per (attribute, value) of ``members`` (``a``, ``v``, ``c``, ``y``) the sums over its
    clusters (:class:`ClusterSums`' fields, in order)."""
    per = (
        select(
            members.c.a,
            members.c.v,
            members.c.c,
            func.count().label("n"),
            func.sum(members.c.y).label("t"),
        )
        .group_by(members.c.a, members.c.v, members.c.c)
        .cte("per_cluster")
    )
    n, t = per.c.n * 1.0, per.c.t
    return (
        select(
            per.c.a,
            per.c.v,
            func.count(),
            func.sum(case((per.c.n == clusters.c.n, 1), else_=0)),
            func.sum(per.c.n),
            func.sum(t),
            func.sum(t * t),
            func.sum(t * n),
            func.sum(n * n),
            func.sum(t * clusters.c.t),
            func.sum(t * clusters.c.n),
            func.sum(n * clusters.c.t),
            func.sum(n * clusters.c.n),
            func.sum(n * n * n * n),
            func.sum(n * clusters.c.n * clusters.c.n * clusters.c.n),
            func.sum(n * n * clusters.c.n * clusters.c.n),
            func.sum(n * n * n * clusters.c.n),
        )
        .select_from(per)
        .join(clusters, clusters.c.c == per.c.c)
        .group_by(per.c.a, per.c.v)
    )


def _clusters_and_totals(scored: Any) -> tuple[Any, Select[Any]]:
    clusters = (
        select(scored.c.c, func.count().label("n"), func.sum(scored.c.y).label("t"))
        .group_by(scored.c.c)
        .cte("clusters")
    )
    n, t = clusters.c.n * 1.0, clusters.c.t
    totals = select(
        func.count(),
        func.sum(clusters.c.n),
        func.sum(t),
        func.sum(t * t),
        func.sum(t * n),
        func.sum(n * n),
        func.sum(n * n * n * n),
        # Traces with a key: their clusters are named u:... or s:..., a lone trace's t:...
        func.sum(case((clusters.c.c.startswith("t:"), 0), else_=clusters.c.n)),
    ).select_from(clusters)
    return clusters, totals


def _totals(row: Any) -> ClusterTotals:
    return ClusterTotals(
        clusters=int(row[0] or 0),
        count=int(row[1] or 0),
        total=float(row[2] or 0.0),
        tt=float(row[3] or 0.0),
        tn=float(row[4] or 0.0),
        nn=float(row[5] or 0.0),
        n4=float(row[6] or 0.0),
    )


def _sums(row: Any) -> ClusterSums:
    return ClusterSums(int(row[2]), int(row[3] or 0), int(row[4]), *(float(x) for x in row[5:]))


def slice_sums(
    history: History,
    scope: Any,
    keys: Sequence[str],
    attributes: Sequence[str],
    documents: bool,
) -> tuple[ClusterTotals, dict[str, dict[str | None, ClusterSums]], int]:
    """Every value of ``attributes`` (request attributes, ``tag``) and, when ``documents``, of
    the retrieved documents' metadata (``document.KEY``) among ``scope``'s scored traces (a
    ``storage.diagnose`` scope), with its sums over clusters of ``keys``; and the window's
    totals and how many traces have a key."""
    key = cluster_key(keys)
    columns = [Score.trace_id.label("trace_id"), Score.value.label("y"), key.label("c")]
    columns += [_COLUMNS[a].label(a) for a in attributes if a in _COLUMNS]
    scored = scope.select(*columns, trace=True).cte("scored")
    clusters, totals_stmt = _clusters_and_totals(scored)
    parts: list[Any] = []
    for attribute in attributes:
        if attribute == "tag":
            parts.append(
                select(
                    literal("tag").label("a"),
                    TraceTag.tag.label("v"),
                    scored.c.c,
                    scored.c.y,
                )
                .select_from(scored)
                .join(TraceTag, TraceTag.trace_id == scored.c.trace_id)
            )
        else:
            column = scored.c[attribute]
            parts.append(
                select(
                    literal(attribute).label("a"), column.label("v"), scored.c.c, scored.c.y
                ).where(column.is_not(None))
            )
    if documents:
        pairs, scalar = history.dialect.json_scalar_pairs(RetrievedContext.metadata_)
        value = cast(pairs.c.value, RetrievedContext.context_id.type)
        distinct = (
            select(
                scored.c.trace_id,
                scored.c.c,
                scored.c.y,
                literal(DOCUMENT_PREFIX).concat(pairs.c.key).label("a"),
                value.label("v"),
            )
            .select_from(scored)
            .join(RetrievedContext, RetrievedContext.trace_id == scored.c.trace_id)
            .join(pairs, true())
            .where(scalar, func.length(value) <= MAX_METADATA_CHARS)
            .distinct()
            .subquery("document_pairs")
        )
        parts.append(select(distinct.c.a, distinct.c.v, distinct.c.c, distinct.c.y))
    out: dict[str, dict[str | None, ClusterSums]] = {}
    with history.engine.begin() as conn:
        history.dialect.tune_for_aggregates(conn)
        row = conn.execute(totals_stmt).one()
        totals, with_key = _totals(row), int(row[7] or 0)
        if parts:
            members = union_all(*parts).subquery("members")
            for each in conn.execute(_member_sums(members, clusters)):
                out.setdefault(str(each[0]), {})[str(each[1])] = _sums(each)
    return totals, out, with_key


@dataclass(frozen=True)
class PairSums:
    """Two groups' per-cluster sums over their shared clusters: ``Σ t₁ t₂``, ``Σ t₁ n₂``,
    ``Σ n₁ t₂``, ``Σ n₁ n₂``."""

    tt: float = 0.0
    tn: float = 0.0
    nt: float = 0.0
    nn: float = 0.0


@dataclass(frozen=True)
class GroupClusters:
    """Per group of one attribute (``scores compare --by``) its sums over clusters, and per
    pair of groups their cross sums: what a cluster-robust difference of two groups needs."""

    clustering: Clustering
    sums: dict[str, ClusterSums]
    cross: dict[tuple[str, str], PairSums]


def group_clusters(
    history: History,
    *,
    metric: str,
    by: str,
    since: datetime | None = None,
    until: datetime | None = None,
    app: str | None = None,
    version: str | None = None,
    where: Sequence[tuple[str, str]] = (),
) -> GroupClusters:
    """The groups of ``by`` (as ``History.group_summaries``) with their sums over the clusters
    of the window's traces (users, else sessions; coarser than ``by`` and the filters' keys);
    no clusters when the traces carry no key (then the groups are independent traces)."""
    if by not in _COLUMNS and by != "tag":
        raise ValueError(f"cannot group by {by!r}")
    metric_version = history.metric_versions(metric, version)[metric]
    scope = Scope(metric, metric_version, since, until, app, tuple(where))
    with history.engine.begin() as conn:
        history.dialect.tune_for_aggregates(conn)
        users, sessions, traces = conn.execute(
            scope.select(
                func.count(Trace.user_id), func.count(Trace.session_id), func.count(), trace=True
            )
        ).one()
        pinned = sorted({by, *(name for name, _value in where)})
        keys = choose_keys(pinned, {"user_id": int(users), "session_id": int(sessions)})
        if not keys:
            return GroupClusters(Clustering(()), {}, {})
        sums, cross, clusters = group_sums(conn, scope, keys, by)
        keyed_by = [Trace.user_id if k == USER else Trace.session_id for k in keys]
        either = func.coalesce(*keyed_by) if len(keyed_by) > 1 else keyed_by[0]
        keyed = conn.execute(scope.select(func.count(either), trace=True)).scalar_one()
    return GroupClusters(Clustering(keys, clusters, int(traces), int(keyed or 0)), sums, cross)


def group_sums(
    conn: Connection,
    scope: Any,
    keys: Sequence[str],
    by: str,
) -> tuple[dict[str, ClusterSums], dict[tuple[str, str], PairSums], int]:
    """Per value of the attribute ``by`` among ``scope``'s scored traces: its sums over
    clusters of ``keys``; per pair of values their cross sums over shared clusters; and the
    number of clusters."""
    key = cluster_key(keys)
    value_of = TraceTag.tag if by == "tag" else _COLUMNS[by]
    stmt = scope.select(
        Score.value.label("y"), key.label("c"), value_of.label("v"), trace=True
    ).where(value_of.is_not(None))
    if by == "tag":
        stmt = stmt.join(TraceTag, TraceTag.trace_id == Score.trace_id)
    scored = stmt.cte("scored")
    members = select(literal(by).label("a"), scored.c.v, scored.c.c, scored.c.y).subquery()
    clusters, totals_stmt = _clusters_and_totals(scored)
    per = (
        select(members.c.v, members.c.c, func.count().label("n"), func.sum(members.c.y).label("t"))
        .group_by(members.c.v, members.c.c)
        .cte("per_group")
    )
    other = per.alias("other")
    n1, n2 = per.c.n * 1.0, other.c.n * 1.0
    pairs = (
        select(
            per.c.v,
            other.c.v,
            func.sum(per.c.t * other.c.t),
            func.sum(per.c.t * n2),
            func.sum(n1 * other.c.t),
            func.sum(n1 * n2),
        )
        .select_from(per)
        .join(other, (other.c.c == per.c.c) & (other.c.v != per.c.v))
        .group_by(per.c.v, other.c.v)
    )
    sums = {str(row[1]): _sums(row) for row in conn.execute(_member_sums(members, clusters))}
    cross = {
        (str(r[0]), str(r[1])): PairSums(*(float(x) for x in r[2:])) for r in conn.execute(pairs)
    }
    return sums, cross, _totals(conn.execute(totals_stmt).one()).clusters
