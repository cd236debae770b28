"""Time specifications and percentiles of the history queries (no database needed)."""

from __future__ import annotations

import statistics
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage.history import TimeSpecError, parse_duration, parse_time, percentile

NOW = datetime(2026, 11, 22, 5, 30, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("text", "delta"),
    [
        ("30s", timedelta(seconds=30)),
        ("30m", timedelta(minutes=30)),
        ("1h", timedelta(hours=1)),
        ("1.5h", timedelta(minutes=90)),
        ("7d", timedelta(days=7)),
        ("2w", timedelta(days=14)),
        (" 12H ", timedelta(hours=12)),
    ],
)
def test_durations_count_back_from_now(text: str, delta: timedelta) -> None:
    assert parse_duration(text) == delta
    assert parse_time(text, now=NOW) == NOW - delta


def test_now_is_now() -> None:
    assert parse_time("now", now=NOW) == NOW


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-01", datetime(2026, 11, 1, tzinfo=timezone.utc)),
        ("2026-11-01T10:00:00Z", datetime(2026, 11, 1, 10, tzinfo=timezone.utc)),
        ("2026-11-01T10:00", datetime(2026, 11, 1, 10, tzinfo=timezone.utc)),
        ("2026-11-01 10:00:00+02:00", datetime(2026, 11, 1, 8, tzinfo=timezone.utc)),
    ],
)
def test_timestamps_are_read_as_utc(text: str, expected: datetime) -> None:
    parsed = parse_time(text, now=NOW)
    assert parsed == expected
    assert parsed.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    "text", ["", "7", "d7", "3 fortnights", "0h", "-1d", "2026-13-01", "nowish"]
)
def test_bad_specifications_name_the_value(text: str) -> None:
    with pytest.raises(TimeSpecError) as caught:
        parse_time(text, now=NOW)
    assert repr(text) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_percentile_of_nothing_is_none_and_fraction_is_checked() -> None:
    assert percentile([], 0.5) is None
    assert percentile([0.3], 0.9) == 0.3
    with pytest.raises(ValueError):
        percentile([0.1, 0.2], 1.5)


@given(st.lists(st.floats(min_value=0, max_value=1), min_size=2, max_size=50))
def test_percentile_matches_inclusive_quantiles(values: list[float]) -> None:
    ordered = sorted(values)
    deciles = statistics.quantiles(ordered, n=10, method="inclusive")
    assert percentile(ordered, 0.1) == pytest.approx(deciles[0], abs=1e-12)
    assert percentile(ordered, 0.5) == pytest.approx(statistics.median(ordered), abs=1e-12)
    assert percentile(ordered, 0.9) == pytest.approx(deciles[8], abs=1e-12)
    assert percentile(ordered, 0.0) == ordered[0]
    assert percentile(ordered, 1.0) == ordered[-1]
