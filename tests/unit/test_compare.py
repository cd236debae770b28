"""Comparisons with known distributions: real differences found, equal distributions left
alone, small groups refused, and the interval formulas against hand-computed examples."""

from __future__ import annotations

import random
import statistics

import pytest

from recalltrace.compare import (
    BASELINE,
    BETTER,
    METHOD_BOOTSTRAP,
    METHOD_NEWCOMBE,
    METHOD_PPI,
    METHOD_WILSON,
    SAME,
    TOO_FEW,
    WORSE,
    compare_groups,
    difference_interval,
    mean_interval,
    prediction_powered,
    wilson,
)


def claims(rng: random.Random, p: float, n: int, k: int = 4) -> list[float]:
    """Recall of ``n`` traces of ``k`` claims, each attributed with probability ``p``."""
    return [sum(rng.random() < p for _ in range(k)) / k for _ in range(n)]


def test_a_drop_of_a_tenth_over_400_traces_is_found() -> None:
    found = 0
    for seed in range(20):
        rng = random.Random(seed)
        result = compare_groups(
            {"2.4.1": claims(rng, 0.7, 400), "2.5.0": claims(rng, 0.6, 400)}, baseline="2.4.1"
        )
        new = result.groups[1]
        assert new.group == "2.5.0" and new.difference is not None
        found += new.verdict == WORSE
    assert found == 20


def test_equal_distributions_show_no_difference_in_at_least_95_percent() -> None:
    quiet = 0
    repetitions = 100
    for seed in range(repetitions):
        rng = random.Random(1_000 + seed)
        result = compare_groups(
            {"2.4.1": claims(rng, 0.7, 400), "2.5.0": claims(rng, 0.7, 400)}, baseline="2.4.1"
        )
        quiet += result.groups[1].verdict == SAME
    assert quiet / repetitions >= 0.95


def test_groups_of_five_are_too_few() -> None:
    rng = random.Random(7)
    result = compare_groups(
        {"2.4.1": claims(rng, 0.7, 400), "canary": claims(rng, 0.2, 5)}, baseline="2.4.1"
    )
    base, canary = result.groups
    assert base.verdict == BASELINE and base.interval is not None
    assert canary.verdict == TOO_FEW and canary.interval is None and canary.difference is None
    assert canary.traces == 5
    # A baseline that is too small leaves every comparison undecided.
    small = compare_groups({"old": [1.0] * 5, "new": [0.0] * 300}, baseline="old")
    assert [g.verdict for g in small.groups] == [TOO_FEW, TOO_FEW]


def test_wilson_and_newcombe_match_the_published_examples() -> None:
    # Newcombe (1998), method 10: 56/70 against 48/80, difference 0.2000, 95% CI
    # 0.0524 to 0.3339; the Wilson interval of 81/263 is 0.2553 to 0.3662.
    (low, high), method = difference_interval([1.0] * 56 + [0.0] * 14, [1.0] * 48 + [0.0] * 32)
    assert method == METHOD_NEWCOMBE
    assert (round(low, 4), round(high, 4)) == (0.0524, 0.3339)
    low, high = wilson(81, 263)
    assert (round(low, 4), round(high, 4)) == (0.2553, 0.3662)
    assert mean_interval([1.0] * 81 + [0.0] * 182)[1] == METHOD_WILSON


def test_bootstrap_is_close_to_the_normal_interval_and_repeatable() -> None:
    rng = random.Random(3)
    values = claims(rng, 0.6, 400)
    (low, high), method = mean_interval(values)
    assert method == METHOD_BOOTSTRAP
    half = 1.96 * statistics.stdev(values) / 20
    mean = statistics.fmean(values)
    assert abs(low - (mean - half)) < 0.01 and abs(high - (mean + half)) < 0.01
    assert mean_interval(values) == ((low, high), method)


def test_the_default_baseline_is_the_first_group_given() -> None:
    rng = random.Random(5)
    groups = {"2.5.0": claims(rng, 0.7, 100), "2.4.1": claims(rng, 0.7, 300)}
    assert compare_groups(groups, order=["2.4.1", "2.5.0"]).baseline == "2.4.1"
    assert compare_groups(groups).baseline == "2.4.1"  # without an order: the largest


def test_sums_give_the_same_answer_as_values() -> None:
    from recalltrace.storage.history_rows import GroupSums

    rng = random.Random(9)
    small, large = claims(rng, 0.7, 300), claims(rng, 0.6, 3000)

    def sums(values: list[float], keep: bool) -> GroupSums:
        return GroupSums(
            count=len(values),
            total=sum(values),
            total_squares=sum(v * v for v in values),
            fractional=sum(v not in (0.0, 1.0) for v in values),
            values=tuple(values) if keep else None,
        )

    from_values = compare_groups({"a": small, "b": large}, baseline="a")
    from_sums = compare_groups({"a": sums(small, True), "b": sums(large, False)}, baseline="a")
    for left, right in zip(from_values.groups, from_sums.groups, strict=True):
        assert left.verdict == right.verdict and left.method == right.method
        assert left.interval == pytest.approx(right.interval)
        assert left.difference == pytest.approx(right.difference)
    # Large groups need no values: the normal approximation from the sums.
    assert from_sums.groups[1].method == "normal approximation (large group)"
    ones = sums([1.0] * 40 + [0.0] * 60, False)
    (only,) = compare_groups({"x": ones}).groups
    assert only.method == METHOD_WILSON and only.interval == pytest.approx(wilson(40, 100))


def _judged(rng: random.Random, truth: float, bias: float, n: int) -> list[tuple[float, float]]:
    """(true value, judge score) of ``n`` traces: true values spread around ``truth``; the
    judge adds ``bias`` and some noise."""
    pairs = []
    for _ in range(n):
        value = min(max(rng.gauss(truth, 0.12), 0.0), 1.0)
        score = min(max(value + bias + rng.gauss(0.0, 0.05), 0.0), 1.0)
        pairs.append((value, score))
    return pairs


def test_labels_correct_a_judge_biased_towards_the_new_release() -> None:
    """Release B is truly worse by 0.1, but the judge over-scores B by 0.15: on the judge alone
    B looks better; 200 labels per release correct the verdict to worse."""
    rng = random.Random(7)
    a = _judged(rng, 0.7, 0.0, 2000)
    b = _judged(rng, 0.6, 0.15, 2000)
    groups = {"A": [s for _, s in a], "B": [s for _, s in b]}
    judge_only = {g.group: g for g in compare_groups(groups, baseline="A").groups}
    assert judge_only["B"].verdict == BETTER
    labelled = {"A": a[:200], "B": b[:200]}
    result = {g.group: g for g in compare_groups(groups, baseline="A", labelled=labelled).groups}
    b_row = result["B"]
    assert b_row.corrected and b_row.labels == 200 and b_row.method == METHOD_PPI
    assert b_row.verdict == WORSE and b_row.difference_method == METHOD_PPI
    assert b_row.judge_mean == pytest.approx(statistics.fmean(groups["B"]))
    true_b = statistics.fmean(v for v, _ in b)
    assert b_row.interval is not None and b_row.interval[0] <= true_b <= b_row.interval[1]
    assert b_row.difference is not None and -0.14 < b_row.difference < -0.06


def test_the_corrected_interval_covers_the_true_mean_about_95_percent_of_the_time() -> None:
    rng = random.Random(11)
    covered = 0
    for _ in range(200):
        pairs = _judged(rng, 0.6, 0.1, 1000)
        labelled = rng.sample(pairs, 60)
        estimate, variance = prediction_powered([s for _, s in pairs], labelled)
        half = 1.959963984540054 * variance**0.5
        truth = statistics.fmean(v for v, _ in pairs)
        covered += estimate - half <= truth <= estimate + half
    assert covered >= 180, covered  # 95% nominal; 180 of 200 is far below what chance gives


def test_too_few_labels_leave_the_judge_figures_and_say_how_many() -> None:
    rng = random.Random(3)
    a, b = _judged(rng, 0.7, 0.0, 500), _judged(rng, 0.6, 0.15, 500)
    groups = {"A": [s for _, s in a], "B": [s for _, s in b]}
    result = compare_groups(groups, baseline="A", labelled={"A": a[:50], "B": b[:10]})
    rows = {g.group: g for g in result.groups}
    assert rows["A"].corrected and rows["A"].labels == 50
    assert not rows["B"].corrected and rows["B"].labels == 10
    # The difference is the judge's own when either side is not corrected.
    assert rows["B"].difference_method != METHOD_PPI
    assert rows["B"].difference == pytest.approx(
        statistics.fmean(groups["B"]) - statistics.fmean(groups["A"])
    )
