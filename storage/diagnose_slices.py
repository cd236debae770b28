"""The slice tests of ``scores diagnose`` (:mod:`storage.diagnose`): each value of each family
against the rest of the window, with Welch's test for independent traces or the cluster-robust
one for traces in users' or sessions' clusters (:mod:`storage.diagnose_stats`), and the
Benjamini-Hochberg control over every slice tested.

A family is tested on every value with enough traces, however many values it has (a tag family
of 60 tenants beside one ``legacy`` tag is tested on each); the values too small to test are
named, the largest first."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from recalltrace.storage.diagnose_stats import (
    ClusterSums,
    ClusterTotals,
    benjamini_hochberg,
    clustered,
    welch,
)
from recalltrace.storage.history_rows import GroupSums


@dataclass(frozen=True)
class Tested:
    """One slice tested against the rest."""

    attribute: str
    value: str
    count: int
    total: float
    difference: float
    interval: tuple[float, float]
    p_value: float
    q_value: float = 1.0


@dataclass
class Tests:
    """Every slice tested, with its q-value, and what was not tested."""

    tested: list[Tested] = field(default_factory=list)
    hypotheses: int = 0
    """Distinct hypotheses (an attribute whose two values split every trace is one)."""
    small: list[tuple[str, str, int]] = field(default_factory=list)
    """Slices with fewer than ``min_count`` traces in them or in their rest: (attribute,
    value, traces), the most traces first."""
    one_cluster: list[tuple[str, str, int]] = field(default_factory=list)
    """Slices (or rests) within a single cluster: they cannot be told from that cluster's own
    level. (attribute, value, traces), the most traces first."""


def run(
    candidates: Mapping[str, Mapping[str | None, GroupSums]]
    | Mapping[str, Mapping[str | None, ClusterSums]],
    total: tuple[int, float, float],
    min_count: int,
    clusters: ClusterTotals | None,
) -> Tests:
    """Test every value of ``candidates`` (per attribute, its values' sums: :class:`GroupSums`
    for independent traces, :class:`ClusterSums` with ``clusters`` the window's) against the
    window's ``total`` (count, sum, sum of squares), and adjust the p-values together."""
    out = Tests()
    hypotheses: list[tuple[str, str]] = []
    for attribute, sums in candidates.items():
        present = {v: g for v, g in sums.items() if v is not None and g.count}
        if not present or (len(present) == 1 and next(iter(present.values())).count == total[0]):
            continue  # every trace has the same value: no rest to compare with
        # Two values splitting every trace between them: each is the other's rest, one
        # hypothesis (counted twice, it would loosen the control for every other slice).
        mirrored = len(present) == 2 and sum(g.count for g in present.values()) == total[0]
        for value, g in present.items():
            if g.count < min_count or total[0] - g.count < min_count:
                out.small.append((attribute, value, g.count))
                continue
            if isinstance(g, ClusterSums):
                assert clusters is not None
                found = clustered(g, clusters)
                if found is None:
                    out.one_cluster.append((attribute, value, g.count))
                    continue
            else:
                part = (g.count, g.total, g.total_squares)
                rest = (total[0] - g.count, total[1] - g.total, total[2] - g.total_squares)
                found = welch(part, rest)
            difference, interval, p = found
            out.tested.append(Tested(attribute, value, g.count, g.total, difference, interval, p))
            hypotheses.append((attribute, "" if mirrored else value))
    unique = list(dict.fromkeys(hypotheses))
    p_of = {h: t.p_value for h, t in zip(hypotheses, out.tested, strict=True)}
    q_of = dict(zip(unique, benjamini_hochberg([p_of[h] for h in unique]), strict=True))
    out.tested = [
        Tested(**{**t.__dict__, "q_value": q_of[h]})
        for h, t in zip(hypotheses, out.tested, strict=True)
    ]
    out.hypotheses = len(unique)
    out.small.sort(key=lambda s: (-s[2], s[0], s[1]))
    out.one_cluster.sort(key=lambda s: (-s[2], s[0], s[1]))
    return out
