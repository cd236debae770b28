"""The cluster-robust difference of ``scores diagnose`` (``storage.diagnose_stats.clustered``)
from the sums the database returns, against the same sandwich computed cluster by cluster, and
Welch's test when every cluster is one trace."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from recalltrace.storage.diagnose_stats import (
    ClusterSums,
    ClusterTotals,
    clustered,
    effective_df,
    welch,
)


def sums(data: list[tuple[int, float]], inside: list[bool]) -> tuple[ClusterSums, ClusterTotals]:
    """What storage.diagnose_clusters adds up, computed here in Python."""
    whole: dict[int, list[float]] = {}
    for c, y in data:
        whole.setdefault(c, [0, 0.0])
        whole[c][0] += 1
        whole[c][1] += y
    part: dict[int, list[float]] = {}
    for (c, y), s in zip(data, inside, strict=True):
        if s:
            part.setdefault(c, [0, 0.0])
            part[c][0] += 1
            part[c][1] += y

    def over(f: Callable[[float, float, float, float], float]) -> float:
        return sum(f(p[0], p[1], whole[c][0], whole[c][1]) for c, p in part.items())

    return (
        ClusterSums(
            clusters=len(part),
            whole=sum(1 for c, p in part.items() if p[0] == whole[c][0]),
            count=int(sum(p[0] for p in part.values())),
            total=sum(p[1] for p in part.values()),
            tt=over(lambda n, t, N, T: t * t),
            tn=over(lambda n, t, N, T: t * n),
            nn=over(lambda n, t, N, T: n * n),
            t_t=over(lambda n, t, N, T: t * T),
            t_n=over(lambda n, t, N, T: t * N),
            n_t=over(lambda n, t, N, T: n * T),
            n_n=over(lambda n, t, N, T: n * N),
            n4=over(lambda n, t, N, T: n**4),
            n_N3=over(lambda n, t, N, T: n * N**3),
            n2_N2=over(lambda n, t, N, T: n * n * N * N),
            n3_N=over(lambda n, t, N, T: n**3 * N),
        ),
        ClusterTotals(
            clusters=len(whole),
            count=len(data),
            total=sum(y for _c, y in data),
            tt=sum(g[1] ** 2 for g in whole.values()),
            tn=sum(g[1] * g[0] for g in whole.values()),
            nn=sum(g[0] ** 2 for g in whole.values()),
            n4=sum(g[0] ** 4 for g in whole.values()),
        ),
    )


def test_one_trace_per_cluster_is_welch() -> None:
    rng = random.Random(1)
    data = [(i, rng.random()) for i in range(200)]
    inside = [rng.random() < 0.3 for _ in data]
    part, every = sums(data, inside)
    found = clustered(part, every)
    assert found is not None
    one = [y for (_c, y), s in zip(data, inside, strict=True) if s]
    rest = [y for (_c, y), s in zip(data, inside, strict=True) if not s]
    expected = welch(
        (len(one), sum(one), sum(y * y for y in one)),
        (len(rest), sum(rest), sum(y * y for y in rest)),
    )
    assert found[0] == pytest.approx(expected[0])
    assert found[1] == pytest.approx(expected[1])
    assert found[2] == pytest.approx(expected[2])


def test_the_sums_give_the_sandwich_of_the_clusters() -> None:
    """Slice and rest sharing clusters (a release within users): the variance from the sums is
    the CR1 sandwich summed cluster by cluster, covariance included."""
    rng = random.Random(2)
    data = [(rng.randrange(40), rng.random()) for _ in range(400)]
    inside = [rng.random() < 0.3 for _ in data]
    part, every = sums(data, inside)
    one = [y for (_c, y), s in zip(data, inside, strict=True) if s]
    rest = [y for (_c, y), s in zip(data, inside, strict=True) if not s]
    m, r = sum(one) / len(one), sum(rest) / len(rest)
    a: dict[int, float] = {}
    b: dict[int, float] = {}
    for (c, y), s in zip(data, inside, strict=True):
        if s:
            a[c] = a.get(c, 0.0) + y - m
        else:
            b[c] = b.get(c, 0.0) + y - r
    f1, f2 = len(a) / (len(a) - 1), len(b) / (len(b) - 1)
    variance = sum(
        (math.sqrt(f1) * a.get(c, 0.0) / len(one) - math.sqrt(f2) * b.get(c, 0.0) / len(rest)) ** 2
        for c in set(a) | set(b)
    )
    found = clustered(part, every)
    assert found is not None
    difference, (low, high), p = found
    assert difference == pytest.approx(m - r)
    half = (high - low) / 2
    # The interval is the standard error times a t quantile of a few dozen degrees of freedom.
    assert 1.96 < half / math.sqrt(variance) < 2.1
    assert 0.0 <= p <= 1.0


def test_a_slice_within_one_cluster_is_not_tested() -> None:
    data = [(0, 0.1)] * 40 + [(c, 0.9) for c in range(1, 80)]
    part, every = sums(data, [i < 40 for i in range(len(data))])
    assert clustered(part, every) is None


def test_few_large_clusters_have_few_degrees_of_freedom() -> None:
    assert effective_df(10, 10 * 25.0, 10 * 625.0) == pytest.approx(9.0)
    # Nine clusters of one trace and one of 100: about one cluster's worth.
    assert effective_df(10, 9 + 100**2, 9 + 100**4) < 1.0
