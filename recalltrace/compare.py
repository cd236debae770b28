"""Compare groups of scored traces (releases, environments, tags, users) with honest
uncertainty: each group's mean with a 95% confidence interval, and each group against a
baseline, the difference with its 95% interval and a verdict.

Intervals are taken over traces (each scored trace counts once):

- groups whose scores are all 0 or 1 (an ID match, a judge that answers yes/no): the Wilson
  score interval for the mean, and Newcombe's hybrid score interval for a difference;
- other groups of up to ``MAX_BOOTSTRAP_TRACES`` traces: the percentile bootstrap, resampling
  traces ``RESAMPLES`` times (seeded from the data, so the same scores give the same output);
- larger groups: the normal approximation (the bootstrap adds nothing at that size).

**Dependent requests.** Requests of one user or session are easier or harder together: when
the traces carry user or session ids (``clusters``, from
:func:`recalltrace.storage.diagnose_clusters.group_clusters`), a difference is judged with a
cluster-robust interval instead (the CR1 sandwich over per-cluster sums, with the covariance of
the two groups within shared clusters, Student's t on the effective clusters' degrees of
freedom; :func:`recalltrace.storage.diagnose_stats.robust_difference`). A group within a single
cluster cannot be told from that cluster's own level: its difference is not judged.

A group with fewer than ``min_traces`` scored traces is reported as too few to judge rather
than guessed at. The verdict is ``worse`` or ``better`` when the difference's 95% interval
lies wholly below or above zero, else ``no detectable difference``.

**Corrected by people's labels.** When a group holds at least ``min_labels`` traces that people
labelled, its mean is corrected by prediction-powered inference (Angelopoulos et al., 2023):
the judge's mean over all the group's scored traces plus the mean of (label - judge score) over
the labelled ones, with the variance of each part added (``var(judge)/N + var(label -
judge)/n``) for a normal 95% interval. A judge that is biased on one release and not on another
then no longer decides the verdict; a difference is corrected when both its groups are.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from recalltrace.storage.diagnose_stats import effective_df, robust_difference
from recalltrace.storage.diagnose_stats import wilson as _wilson

if TYPE_CHECKING:
    from recalltrace.storage.diagnose_clusters import GroupClusters

#: Resamples of the bootstrap.
RESAMPLES = 1000
#: Groups larger than this use the normal approximation (the bootstrap adds nothing there).
MAX_BOOTSTRAP_TRACES = 1000
#: The default least number of scored traces a group needs to be judged.
MIN_TRACES = 30
#: The default least number of labelled traces a group needs for its mean to be corrected.
MIN_LABELS = 30
_Z = 1.959963984540054  # the 97.5th percentile of the standard normal

WORSE, BETTER, SAME, TOO_FEW, BASELINE = (
    "worse",
    "better",
    "no detectable difference",
    "too few traces",
    "baseline",
)

METHOD_WILSON = "Wilson score interval (0/1 scores)"
METHOD_BOOTSTRAP = f"percentile bootstrap over traces ({RESAMPLES} resamples)"
METHOD_NORMAL = "normal approximation (large group)"
METHOD_NEWCOMBE = "Newcombe hybrid score interval (0/1 scores)"
METHOD_CLUSTERED = "cluster-robust (CR1, Student's t) by {keys}"
METHOD_ONE_CLUSTER = "not judged: the group or the baseline lies within one {keys}"
METHOD_PPI = "prediction-powered: the judge's mean corrected by people's labels (normal)"


@dataclass
class GroupComparison:
    """One group's figures."""

    group: str | None
    """The attribute's value; ``None`` for traces without it."""
    traces: int
    mean: float
    interval: tuple[float, float] | None
    """The mean's 95% interval; ``None`` for a group with too few traces."""
    method: str | None
    verdict: str
    """``baseline``, ``worse``, ``better``, ``no detectable difference`` or
    ``too few traces``."""
    difference: float | None = None
    """Mean minus the baseline's mean."""
    difference_interval: tuple[float, float] | None = None
    difference_method: str | None = None
    labels: int = 0
    """Labelled traces of the group (people's labels beside the judge's scores)."""
    corrected: bool = False
    """The mean (and the difference, when the baseline's is too) is corrected by the labels."""
    judge_mean: float | None = None
    """The judge's own mean, when ``mean`` is the corrected one."""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary."""
        return {
            "group": self.group,
            "traces": self.traces,
            "labels": self.labels,
            "corrected": self.corrected,
            "judge_mean": self.judge_mean,
            "mean": self.mean,
            "ci95": list(self.interval) if self.interval else None,
            "method": self.method,
            "difference": self.difference,
            "difference_ci95": list(self.difference_interval) if self.difference_interval else None,
            "difference_method": self.difference_method,
            "verdict": self.verdict,
        }


@dataclass
class Comparison:
    """Every group of one metric against the baseline."""

    baseline: str | None
    groups: list[GroupComparison] = field(default_factory=list)
    clustering: str = ""
    """One line: what the differences treat as independent (users' or sessions' clusters, or
    independent traces); empty when no clusters were given."""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary."""
        return {
            "baseline": self.baseline,
            "clustering": self.clustering,
            "groups": [g.as_dict() for g in self.groups],
        }


@dataclass(frozen=True)
class _Stats:
    """What the intervals need of a group."""

    n: int
    mean: float
    variance: float
    binary: bool
    ones: float
    values: Sequence[float] | None

    @classmethod
    def of(cls, data: Any) -> _Stats:
        """From a list of values, or from sums (``count``, ``total``, ``total_squares``,
        ``fractional`` and optionally ``values``, as ``History.group_summaries`` gives)."""
        if isinstance(data, (list, tuple)):
            values = [float(v) for v in data]
            n = len(values)
            mean = statistics.fmean(values) if values else math.nan
            variance = statistics.variance(values) if n > 1 else 0.0
            return cls(n, mean, variance, _binary(values), math.fsum(values), values)
        n = int(data.count)
        mean = data.total / n if n else math.nan
        variance = max((data.total_squares - n * mean * mean) / (n - 1), 0.0) if n > 1 else 0.0
        given = getattr(data, "values", None)
        return cls(n, mean, variance, data.fractional == 0, float(data.total), given)


def compare_groups(
    groups: Mapping[str | None, Any],
    *,
    baseline: str | None = None,
    min_traces: int = MIN_TRACES,
    order: Sequence[str | None] | None = None,
    labelled: Mapping[str | None, Sequence[tuple[float, float]]] | None = None,
    min_labels: int = MIN_LABELS,
    clusters: GroupClusters | None = None,
) -> Comparison:
    """Compare every group with ``baseline`` (default: the first of ``order``, else the
    largest group). A group is its values, or their sums as ``History.group_summaries`` gives
    them (large groups then need no values). ``labelled`` gives, per group, the (label, judge
    score) pairs of its labelled traces: groups with at least ``min_labels`` are corrected (see
    the module's notes). ``clusters``: the groups' sums over the users' or sessions' clusters,
    for cluster-robust differences (see the module's notes). Raises ``KeyError`` for a
    baseline that is not a group."""
    if not groups:
        return Comparison(baseline=baseline)
    stats = {name: _Stats.of(data) for name, data in groups.items()}
    names = list(order) if order is not None else sorted(stats, key=lambda g: -stats[g].n)
    names += [name for name in stats if name not in names]
    if baseline is None:
        baseline = names[0]
    elif baseline not in stats:
        raise KeyError(baseline)
    base = stats[baseline]
    pairs = labelled or {}
    corrected = {
        name: prediction_powered(stats[name], pairs[name])
        for name in stats
        if stats[name].n >= min_traces and len(pairs.get(name, ())) >= min_labels
    }
    result = Comparison(baseline=baseline)
    if clusters is not None:
        result.clustering = clusters.clustering.describe()
    for name in [baseline, *(n for n in names if n != baseline)]:
        group = stats[name]
        labels = len(pairs.get(name, ()))
        if group.n < min_traces:
            result.groups.append(
                GroupComparison(name, group.n, group.mean, None, None, TOO_FEW, labels=labels)
            )
            continue
        interval, method = _mean_interval(group)
        entry = GroupComparison(name, group.n, group.mean, interval, method, BASELINE)
        entry.labels = labels
        if name in corrected:
            estimate, variance = corrected[name]
            half = _Z * math.sqrt(variance)
            entry.judge_mean, entry.mean, entry.corrected = group.mean, estimate, True
            entry.interval = (max(0.0, estimate - half), min(1.0, estimate + half))
            entry.method = METHOD_PPI
        if name != baseline:
            if base.n < min_traces:
                entry.verdict = TOO_FEW
            elif name in corrected and baseline in corrected:
                estimate, variance = corrected[name]
                base_estimate, base_variance = corrected[baseline]
                d = estimate - base_estimate
                half = _Z * math.sqrt(variance + base_variance)
                entry.difference, entry.difference_interval = d, (d - half, d + half)
                entry.difference_method = METHOD_PPI
                entry.verdict = WORSE if d + half < 0 else BETTER if d - half > 0 else SAME
            elif clusters is not None and clusters.sums:
                _clustered_entry(entry, clusters, name, baseline)
            else:
                # Uncorrected on at least one side: the difference stays the judge's own.
                (low, high), entry.difference_method = _difference_interval(group, base)
                entry.difference = group.mean - base.mean
                entry.difference_interval = (low, high)
                entry.verdict = WORSE if high < 0 else BETTER if low > 0 else SAME
        result.groups.append(entry)
    return result


def _clustered_entry(
    entry: GroupComparison, clusters: GroupClusters, name: str | None, baseline: str | None
) -> None:
    """Fill ``entry``'s difference from the baseline with its cluster-robust interval."""
    keys = " or ".join(clusters.clustering.keys)
    one = clusters.sums.get(str(name)) if name is not None else None
    two = clusters.sums.get(str(baseline)) if baseline is not None else None
    if one is None or two is None or one.clusters < 2 or two.clusters < 2:
        entry.difference_method = METHOD_ONE_CLUSTER.format(keys=keys)
        entry.verdict = TOO_FEW
        return
    m1, m2 = one.total / one.count, two.total / two.count
    pair = clusters.cross.get((str(name), str(baseline)))
    shared = 0.0
    if pair is not None:
        shared = pair.tt - m2 * pair.tn - m1 * pair.nt + m1 * m2 * pair.nn
    difference, (low, high), _p = robust_difference(
        m1 - m2,
        (
            one.tt - 2 * m1 * one.tn + m1 * m1 * one.nn,
            two.tt - 2 * m2 * two.tn + m2 * m2 * two.nn,
            shared,
        ),
        (one.count, two.count),
        (one.clusters, two.clusters),
        (
            effective_df(one.clusters, one.nn, one.n4),
            effective_df(two.clusters, two.nn, two.n4),
        ),
    )
    entry.difference, entry.difference_interval = difference, (low, high)
    entry.difference_method = METHOD_CLUSTERED.format(keys=keys)
    entry.verdict = WORSE if high < 0 else BETTER if low > 0 else SAME


def prediction_powered(judged: Any, pairs: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """The prediction-powered estimate of a group's true mean and its variance: the judge's
    mean over the group (``judged``: its values, or sums) plus the mean of (label - judge
    score) over the labelled ``pairs``; the variance is ``var(judge)/N + var(rectifier)/n``."""
    group = judged if isinstance(judged, _Stats) else _Stats.of(judged)
    rectifier = [label - score for label, score in pairs]
    n = len(rectifier)
    shift = math.fsum(rectifier) / n
    spread = statistics.variance(rectifier) if n > 1 else 0.0
    return group.mean + shift, group.variance / group.n + spread / n


def _binary(values: Sequence[float]) -> bool:
    return all(value in (0.0, 1.0) for value in values)


def _rng(*groups: Sequence[float]) -> random.Random:
    """A generator seeded from the data: the same scores give the same intervals."""
    seed = 0
    for values in groups:
        seed = (seed * 1_000_003 + len(values) * 7919 + round(math.fsum(values) * 1e6)) % 2**61
    return random.Random(seed)


def wilson(successes: float, n: int) -> tuple[float, float]:
    """The Wilson score 95% interval of a proportion (one implementation, the diagnosis')."""
    return _wilson(successes, n)


def mean_interval(values: Sequence[float]) -> tuple[tuple[float, float], str]:
    """The 95% interval of the mean of ``values`` and the method used."""
    return _mean_interval(_Stats.of(list(values)))


def difference_interval(
    values: Sequence[float], base: Sequence[float]
) -> tuple[tuple[float, float], str]:
    """The 95% interval of ``mean(values) - mean(base)`` and the method used."""
    return _difference_interval(_Stats.of(list(values)), _Stats.of(list(base)))


def _mean_interval(group: _Stats) -> tuple[tuple[float, float], str]:
    n = group.n
    if group.binary:
        return wilson(group.ones, n), METHOD_WILSON
    if group.values is None or n > MAX_BOOTSTRAP_TRACES:
        half = _Z * math.sqrt(group.variance / n)
        return (max(0.0, group.mean - half), min(1.0, group.mean + half)), METHOD_NORMAL
    values = group.values
    means = sorted(total / n for total in _resample_sums(values, _rng(values)))
    return (_quantile(means, 0.025), _quantile(means, 0.975)), METHOD_BOOTSTRAP


def _difference_interval(group: _Stats, base: _Stats) -> tuple[tuple[float, float], str]:
    n, m = group.n, base.n
    if group.binary and base.binary:
        p1, p2 = group.ones / n, base.ones / m
        l1, u1 = wilson(group.ones, n)
        l2, u2 = wilson(base.ones, m)
        d = p1 - p2
        low = d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
        high = d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
        return (low, high), METHOD_NEWCOMBE
    if group.values is None or base.values is None or max(n, m) > MAX_BOOTSTRAP_TRACES:
        d = group.mean - base.mean
        se = math.sqrt(group.variance / n + base.variance / m)
        return (d - _Z * se, d + _Z * se), METHOD_NORMAL
    rng = _rng(group.values, base.values)
    differences = sorted(
        a / n - b / m
        for a, b in zip(
            _resample_sums(group.values, rng), _resample_sums(base.values, rng), strict=True
        )
    )
    return (_quantile(differences, 0.025), _quantile(differences, 0.975)), METHOD_BOOTSTRAP


def _resample_sums(values: Sequence[float], rng: random.Random) -> list[float]:
    """The sums of ``RESAMPLES`` resamples of ``values`` (drawn in one call: the per-call
    overhead of drawing them one resample at a time is most of the cost)."""
    n = len(values)
    drawn = rng.choices(values, k=n * RESAMPLES)
    return [math.fsum(drawn[i : i + n]) for i in range(0, n * RESAMPLES, n)]


def _quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted values, interpolated linearly."""
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
