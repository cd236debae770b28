"""Compare groups of scored traces (releases, environments, tags, users) with honest
uncertainty: each group's mean with a 95% confidence interval, and each group against a
baseline, the difference with its 95% interval and a verdict.

Intervals are taken over traces (each scored trace counts once):

- groups whose scores are all 0 or 1 (an ID match, a judge that answers yes/no): the Wilson
  score interval for the mean, and Newcombe's hybrid score interval for a difference;
- other groups of up to ``MAX_BOOTSTRAP_TRACES`` traces: the percentile bootstrap, resampling
  traces ``RESAMPLES`` times (seeded from the data, so the same scores give the same output);
- larger groups: the normal approximation (the bootstrap adds nothing at that size).

A group with fewer than ``min_traces`` scored traces is reported as too few to judge rather
than guessed at. The verdict is ``worse`` or ``better`` when the difference's 95% interval
lies wholly below or above zero, else ``no detectable difference``.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Resamples of the bootstrap.
RESAMPLES = 1000
#: Groups larger than this use the normal approximation (the bootstrap adds nothing there).
MAX_BOOTSTRAP_TRACES = 1000
#: The default least number of scored traces a group needs to be judged.
MIN_TRACES = 30
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

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary."""
        return {
            "group": self.group,
            "traces": self.traces,
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

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary."""
        return {"baseline": self.baseline, "groups": [g.as_dict() for g in self.groups]}


def compare_groups(
    groups: Mapping[str | None, Sequence[float]],
    *,
    baseline: str | None = None,
    min_traces: int = MIN_TRACES,
    order: Sequence[str | None] | None = None,
) -> Comparison:
    """Compare every group with ``baseline`` (default: the first of ``order``, else the
    largest group). Raises ``KeyError`` for a baseline that is not a group."""
    if not groups:
        return Comparison(baseline=baseline)
    names = list(order) if order is not None else sorted(groups, key=lambda g: -len(groups[g]))
    names += [name for name in groups if name not in names]
    if baseline is None:
        baseline = names[0]
    elif baseline not in groups:
        raise KeyError(baseline)
    base = list(groups[baseline])
    result = Comparison(baseline=baseline)
    for name in [baseline, *(n for n in names if n != baseline)]:
        values = list(groups[name])
        mean = statistics.fmean(values) if values else math.nan
        if len(values) < min_traces:
            result.groups.append(GroupComparison(name, len(values), mean, None, None, TOO_FEW))
            continue
        interval, method = mean_interval(values)
        entry = GroupComparison(name, len(values), mean, interval, method, BASELINE)
        if name != baseline:
            if len(base) < min_traces:
                entry.verdict = TOO_FEW
            else:
                (low, high), entry.difference_method = difference_interval(values, base)
                entry.difference = mean - statistics.fmean(base)
                entry.difference_interval = (low, high)
                entry.verdict = WORSE if high < 0 else BETTER if low > 0 else SAME
        result.groups.append(entry)
    return result


def _binary(values: Sequence[float]) -> bool:
    return all(value in (0.0, 1.0) for value in values)


def _rng(*groups: Sequence[float]) -> random.Random:
    """A generator seeded from the data: the same scores give the same intervals."""
    seed = 0
    for values in groups:
        seed = (seed * 1_000_003 + len(values) * 7919 + round(math.fsum(values) * 1e6)) % 2**61
    return random.Random(seed)


def wilson(successes: float, n: int) -> tuple[float, float]:
    """The Wilson score 95% interval of a proportion."""
    p = successes / n
    denominator = 1 + _Z * _Z / n
    centre = (p + _Z * _Z / (2 * n)) / denominator
    half = _Z * math.sqrt(p * (1 - p) / n + _Z * _Z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_interval(values: Sequence[float]) -> tuple[tuple[float, float], str]:
    """The 95% interval of the mean of ``values`` and the method used."""
    n = len(values)
    if _binary(values):
        return wilson(sum(values), n), METHOD_WILSON
    mean = statistics.fmean(values)
    if n > MAX_BOOTSTRAP_TRACES:
        half = _Z * statistics.stdev(values) / math.sqrt(n)
        return (max(0.0, mean - half), min(1.0, mean + half)), METHOD_NORMAL
    means = sorted(total / n for total in _resample_sums(values, _rng(values)))
    return (_quantile(means, 0.025), _quantile(means, 0.975)), METHOD_BOOTSTRAP


def difference_interval(
    values: Sequence[float], base: Sequence[float]
) -> tuple[tuple[float, float], str]:
    """The 95% interval of ``mean(values) - mean(base)`` and the method used."""
    n, m = len(values), len(base)
    if _binary(values) and _binary(base):
        p1, p2 = sum(values) / n, sum(base) / m
        l1, u1 = wilson(sum(values), n)
        l2, u2 = wilson(sum(base), m)
        d = p1 - p2
        low = d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
        high = d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
        return (low, high), METHOD_NEWCOMBE
    if max(n, m) > MAX_BOOTSTRAP_TRACES:
        d = statistics.fmean(values) - statistics.fmean(base)
        se = math.sqrt(statistics.variance(values) / n + statistics.variance(base) / m)
        return (d - _Z * se, d + _Z * se), METHOD_NORMAL
    rng = _rng(values, base)
    differences = sorted(
        a / n - b / m
        for a, b in zip(_resample_sums(values, rng), _resample_sums(base, rng), strict=True)
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
