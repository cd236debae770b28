"""The statistics of ``scores diagnose``: a slice against the rest, proportions, and the
Benjamini-Hochberg control of the false-discovery rate.

- A slice's mean against the rest's: Welch's difference of two means
  (``t = d / sqrt(var1/n1 + var2/n2)``), from each side's count, sum and sum of squares, so the
  database aggregates and nothing is resampled; the p-value and the interval use Student's t
  with the Welch-Satterthwaite degrees of freedom (the plain normal approximation named more
  slices than the stated rate in traffic without a cause, with slices of 30 to 60 traces).
- With requests in clusters (the same user's or session's requests are easier or harder
  together), the same difference with a cluster-robust variance (:func:`clustered`): the
  sandwich of the difference of two means over per-cluster residual sums, each side scaled by
  ``G/(G-1)`` for its ``G`` clusters (CR1), the covariance of the two sides within shared
  clusters subtracted, and Student's t on the Welch-Satterthwaite degrees of freedom of the two
  sides' effective cluster counts (:func:`effective_df`: ``G - 1`` for clusters of one size,
  fewer when a few large clusters weigh most; with ``G - 1`` alone, sessions of exponentially
  spread sizes named a slice 1.5 to 3 times as often as the level says). With every cluster a
  single trace this is exactly Welch's test above. A side within a single cluster cannot be
  told from that cluster's own level: it is not tested.
- A proportion (how often a needed document was retrieved, how often a claim was supported):
  the Wilson score interval.
- The slices tested in one diagnosis are one family: their two-sided p-values go through the
  Benjamini-Hochberg step-up procedure at level ``q``; a slice is significant when its
  adjusted p-value (q-value) is at most ``q``. Under no cause at all, the chance of naming any
  slice is then at most ``q``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

MIN_SLICE_COUNT = 30
"""Slices (and their rests) with fewer scored traces than this are not tested."""

DEFAULT_Q = 0.05
"""The default false-discovery rate."""

CONFIDENCE = 0.95
"""The level of every interval shown."""

_NORMAL = NormalDist()


def z_of(confidence: float = CONFIDENCE) -> float:
    """The two-sided normal quantile of ``confidence`` (1.96 for 0.95)."""
    return _NORMAL.inv_cdf(0.5 + confidence / 2)


def mean_and_variance(count: int, total: float, squares: float) -> tuple[float, float]:
    """The mean and the sample variance of ``count`` values from their sum and sum of squares
    (the variance is 0 for one value, and never negative from rounding)."""
    mean = total / count
    if count < 2:
        return mean, 0.0
    return mean, max(0.0, (squares - count * mean * mean) / (count - 1))


def welch(
    slice_: tuple[int, float, float], rest: tuple[int, float, float], confidence: float = CONFIDENCE
) -> tuple[float, tuple[float, float], float]:
    """The slice's mean minus the rest's, its normal-approximation interval and the two-sided
    p-value, from ``(count, sum, sum of squares)`` of each side.

    Two sides without any spread have a standard error of 0: a difference is then certain
    (p = 0) and no difference is none (p = 1)."""
    n1, n2 = slice_[0], rest[0]
    if n1 < 2 or n2 < 2:
        raise ValueError("each side needs at least two values")
    m1, v1 = mean_and_variance(*slice_)
    m2, v2 = mean_and_variance(*rest)
    difference = m1 - m2
    a, b = v1 / n1, v2 / n2
    se = math.sqrt(a + b)
    if se == 0.0:
        return difference, (difference, difference), (1.0 if difference == 0.0 else 0.0)
    df = (a + b) ** 2 / ((a * a / (n1 - 1) if a else 0.0) + (b * b / (n2 - 1) if b else 0.0))
    half = t_quantile(0.5 + confidence / 2, df) * se
    p = t_two_sided(abs(difference) / se, df)
    return difference, (difference - half, difference + half), min(1.0, p)


@dataclass(frozen=True)
class ClusterSums:
    """A slice's sums over the clusters it has traces in: per cluster ``g`` its count ``n`` and
    sum ``t`` in the slice, and the cluster's own count ``N`` and sum ``T``."""

    clusters: int
    """Clusters with a trace in the slice."""
    whole: int
    """Of those, the clusters wholly in the slice."""
    count: int
    total: float
    tt: float
    """``Σ t²``."""
    tn: float
    """``Σ t n``."""
    nn: float
    """``Σ n²``."""
    t_t: float
    """``Σ t T``."""
    t_n: float
    """``Σ t N``."""
    n_t: float
    """``Σ n T``."""
    n_n: float
    """``Σ n N``."""
    n4: float = 0.0
    """``Σ n⁴``."""
    n_N3: float = 0.0
    """``Σ n N³``."""
    n2_N2: float = 0.0
    """``Σ n² N²``."""
    n3_N: float = 0.0
    """``Σ n³ N``."""


@dataclass(frozen=True)
class ClusterTotals:
    """The window's clusters: their number, traces, sum, and ``Σ T²``, ``Σ T N``, ``Σ N²``."""

    clusters: int
    count: int
    total: float
    tt: float
    tn: float
    nn: float
    n4: float = 0.0
    """``Σ N⁴``."""


def effective_df(clusters: int, squares: float, fourths: float) -> float:
    """The degrees of freedom of one side's cluster-robust variance: ``G - 1`` for ``G``
    clusters of equal size, fewer when a few large clusters weigh most (each cluster's share of
    the variance taken as its size squared, Satterthwaite: ``(Σ n²)² / Σ n⁴``, times
    ``(G - 1) / G``). One trace per cluster gives Welch's ``n - 1``."""
    if fourths <= 0.0:
        return max(clusters - 1.0, 0.5)
    return max(squares * squares / fourths * (clusters - 1) / clusters, 0.5)


def clustered(
    part: ClusterSums, every: ClusterTotals, confidence: float = CONFIDENCE
) -> tuple[float, tuple[float, float], float] | None:
    """The slice's mean minus the rest's with a cluster-robust interval and two-sided p-value
    (see the module's notes); ``None`` when the slice or the rest lies within one cluster (or
    has fewer than two traces)."""
    n1, n2 = part.count, every.count - part.count
    g1, g2 = part.clusters, every.clusters - part.whole
    if n1 < 2 or n2 < 2 or g1 < 2 or g2 < 2:
        return None
    m, r = part.total / n1, (every.total - part.total) / n2
    a2 = part.tt - 2 * m * part.tn + m * m * part.nn
    u2 = every.tt - 2 * r * every.tn + r * r * every.nn
    uw = part.t_t - r * part.t_n - r * part.n_t + r * r * part.n_n
    w2 = part.tt - 2 * r * part.tn + r * r * part.nn
    au = part.t_t - r * part.t_n - m * part.n_t + m * r * part.n_n
    aw = part.tt - (m + r) * part.tn + m * r * part.nn
    rest_squares = every.nn - 2 * part.n_n + part.nn
    rest_fourths = every.n4 - (4 * part.n_N3 - 6 * part.n2_N2 + 4 * part.n3_N - part.n4)
    df = (effective_df(g1, part.nn, part.n4), effective_df(g2, rest_squares, rest_fourths))
    return robust_difference(
        m - r, (a2, u2 - 2 * uw + w2, au - aw), (n1, n2), (g1, g2), df, confidence
    )


def robust_difference(
    difference: float,
    squares: tuple[float, float, float],
    counts: tuple[int, int],
    clusters: tuple[int, int],
    dfs: tuple[float, float],
    confidence: float = CONFIDENCE,
) -> tuple[float, tuple[float, float], float]:
    """``difference`` of two means with its CR1 interval and p-value, from each side's sum over
    clusters of its squared residual sums and their cross sum (``squares``), each side's traces
    (``counts``), clusters (``clusters``, at least two each) and degrees of freedom (``dfs``,
    :func:`effective_df`), combined as Welch-Satterthwaite's."""
    (q1, q2, q12), (n1, n2), (g1, g2) = squares, counts, clusters
    f1, f2 = g1 / (g1 - 1), g2 / (g2 - 1)
    v1, v2 = f1 * max(q1, 0.0) / (n1 * n1), f2 * max(q2, 0.0) / (n2 * n2)
    variance = v1 + v2 - 2 * math.sqrt(f1 * f2) * q12 / (n1 * n2)
    # Rounding can leave a tiny negative or near-zero variance for two spreadless sides.
    se = math.sqrt(variance) if variance > 1e-15 * max(v1 + v2, 1e-300) else 0.0
    if se == 0.0:
        return difference, (difference, difference), (1.0 if abs(difference) < 1e-12 else 0.0)
    df = (v1 + v2) ** 2 / ((v1 * v1 / dfs[0]) + (v2 * v2 / dfs[1]))
    half = t_quantile(0.5 + confidence / 2, df) * se
    p = t_two_sided(abs(difference) / se, df)
    return difference, (difference - half, difference + half), min(1.0, p)


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (Lentz's method)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for numerator in (
            m * (b - m) * x / ((a + m2 - 1) * (a + m2)),
            -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-12:
            break
    return h


def regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), the regularized incomplete beta function."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def t_two_sided(t: float, df: float) -> float:
    """P(|T| >= t) for Student's t with ``df`` degrees of freedom."""
    return regularized_beta(df / (df + t * t), df / 2.0, 0.5)


def t_quantile(probability: float, df: float) -> float:
    """The ``probability`` quantile (above 0.5) of Student's t, by bisection."""
    low, high = 0.0, 1.0
    while t_two_sided(high, df) / 2 > 1.0 - probability:
        high *= 2.0
    for _ in range(100):
        middle = (low + high) / 2
        if t_two_sided(middle, df) / 2 > 1.0 - probability:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def wilson(successes: float, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The Wilson score interval of ``successes`` out of ``n``."""
    if n <= 0:
        raise ValueError("a proportion needs at least one trial")
    z = z_of(confidence)
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def benjamini_hochberg(p_values: Sequence[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (q-values), in the order given: a test is a
    discovery at false-discovery rate ``q`` when its q-value is at most ``q``."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [1.0] * m
    running = 1.0
    for rank in range(m, 0, -1):
        index = order[rank - 1]
        running = min(running, p_values[index] * m / rank)
        adjusted[index] = min(1.0, running)
    return adjusted
