"""Time specifications and percentiles of the history queries (no database needed)."""

from __future__ import annotations

import statistics
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recalltrace.storage.history import TimeSpecError, parse_duration, parse_time, percentile

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


def test_chart_keeps_time_linear_and_breaks_lines_at_gaps() -> None:
    import xml.etree.ElementTree as ET

    from recalltrace.cli._charts import render_svg
    from recalltrace.storage.history import SummaryRow

    def row(day: int, mean: float | None, count: int) -> SummaryRow:
        return SummaryRow(
            bucket_start=datetime(2026, 11, day, tzinfo=timezone.utc),
            metric="llm_context_recall",
            version="1",
            count=count,
            mean=mean,
            p10=mean,
            p50=mean,
            p90=mean,
            skipped=0 if count else 3,
            failed=0,
        )

    # Days 1-2 scored, day 3 only skipped, day 4 scored, day 5 absent, day 6 scored.
    rows = [row(1, 0.5, 4), row(2, 0.7, 6), row(3, None, 0), row(4, 0.9, 2), row(6, 0.4, 1)]
    svg = ET.fromstring(render_svg(rows, bucket="day", title="t", subtitle="s"))
    ns = "{http://www.w3.org/2000/svg}"
    lines = svg.findall(f"{ns}polyline")
    assert len(lines) == 1  # only days 1-2 are neighbours with a mean
    assert len(lines[0].attrib["points"].split()) == 2
    xs = sorted(float(c.attrib["cx"]) for c in svg.findall(f"{ns}circle"))
    assert len(xs) == 4
    # Six day slots from day 1 to day 6: equal spacing, so day 6 sits five steps from day 1.
    step = xs[1] - xs[0]
    assert xs[2] - xs[0] == pytest.approx(3 * step, abs=0.5)
    assert xs[3] - xs[0] == pytest.approx(5 * step, abs=0.5)
    labels = [t.text for t in svg.findall(f"{ns}text")]
    assert "6" in labels and "2" in labels  # scored results per bucket are written out
