"""``scores plot``'s SVG read as a viewer sees it: time labels that never overlap, and series
that stay visible when they have the same values."""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone

import pytest

from recalltrace.cli._charts import _CHAR_W, render_svg
from recalltrace.storage.history_rows import SummaryRow

SVG = "{http://www.w3.org/2000/svg}"
START = datetime(2026, 11, 22, tzinfo=timezone.utc)


def rows(hours: int, metrics: list[str], bucket: str = "hour") -> list[SummaryRow]:
    step = timedelta(hours=1) if bucket == "hour" else timedelta(days=1)
    return [
        SummaryRow(
            bucket_start=START + i * step,
            metric=metric,
            version="1",
            count=10,
            mean=0.5 + 0.4 * ((i % 5) / 5),
            p10=0.1,
            p50=0.5,
            p90=0.9,
            skipped=0,
            failed=0,
        )
        for i in range(hours)
        for metric in metrics
    ]


@pytest.mark.parametrize(("count", "bucket"), [(48, "hour"), (24 * 30, "hour"), (90, "day")])
def test_time_labels_never_overlap(count: int, bucket: str) -> None:
    svg = render_svg(
        rows(count, ["llm_context_recall"], bucket), bucket=bucket, title="t", subtitle="s"
    )
    root = ET.fromstring(svg)
    by_row: dict[float, list[tuple[float, float]]] = {}
    for t in root.iter(f"{SVG}text"):
        if t.get("font-size") == "11" and t.get("text-anchor") == "middle":
            x = float(t.get("x", 0))
            half = len(t.text or "") * _CHAR_W / 2
            by_row.setdefault(float(t.get("y", 0)), []).append((x - half, x + half))
    assert by_row
    labels = sum(len(v) for v in by_row.values())
    assert labels >= 3, "the axis must still say when"
    for spans in by_row.values():
        spans.sort()
        for (_, right), (left, _) in itertools.pairwise(spans):
            assert right < left, spans


def test_two_days_of_hours_name_each_day_once() -> None:
    svg = render_svg(rows(48, ["llm_context_recall"]), bucket="hour", title="t", subtitle="s")
    texts = [t.text for t in ET.fromstring(svg).iter(f"{SVG}text")]
    assert texts.count("2026-11-22") == 1 and texts.count("2026-11-23") == 1
    assert "00:00" in texts


def test_identical_series_stay_apart() -> None:
    svg = render_svg(
        rows(12, ["id_based_context_recall", "non_llm_context_recall"]),
        bucket="hour",
        title="t",
        subtitle="s",
    )
    root = ET.fromstring(svg)
    lines = list(root.iter(f"{SVG}polyline"))
    assert len(lines) == 2
    assert lines[0].get("points") == lines[1].get("points")  # the same values...
    assert lines[0].get("stroke-dasharray") != lines[1].get("stroke-dasharray")  # ...drawn apart
    radii = {c.get("fill"): c.get("r") for c in root.iter(f"{SVG}circle")}
    assert len(set(radii.values())) == 2  # the later markers are smaller, so both show
    legend = [t.text or "" for t in root.iter(f"{SVG}text")]
    assert "non_llm_context_recall v1 (= id_based_context_recall)" in legend
