"""``scores plot``'s charts: a self-contained SVG, or an HTML page around it."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from recalltrace.cli._render import SUMMARY_FIELDS, _bucket_text, _num, _summary_stat_cells

if TYPE_CHECKING:
    from recalltrace.storage.history import SummaryRow

_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")


def render_svg(rows: Sequence[SummaryRow], *, bucket: str, title: str, subtitle: str) -> str:
    """An SVG chart: mean per metric over time on top, scored results per bucket below."""
    from recalltrace.storage.history import group_by_metric

    width, left, right = 960, 60, 200
    top_y, top_h = 70, 300
    bar_y, bar_h = top_y + top_h + 60, 140
    height = bar_y + bar_h + 50
    plot_w = width - left - right
    e = html.escape

    buckets = sorted({r.bucket_start for r in rows})
    # Every bucket between the first and the last gets a slot, so the time axis stays linear
    # and a stretch without scores shows as a gap rather than being squeezed out.
    slots = _bucket_range(buckets, bucket)
    series = group_by_metric(rows)
    colours = {m: _PALETTE[i % len(_PALETTE)] for i, m in enumerate(series)}
    slot = plot_w / max(len(slots), 1)
    x_of = {b: left + slot * (i + 0.5) for i, b in enumerate(slots)}
    index_of = {b: i for i, b in enumerate(slots)}

    def y_value(v: float) -> float:
        return top_y + top_h * (1.0 - v)

    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{left}" y="28" font-size="18" font-weight="bold">{e(title)}</text>',
        f'<text x="{left}" y="48" fill="#555555">{e(subtitle)}</text>',
    ]
    # Recall axis: 0 to 1 with grid lines.
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = y_value(tick)
        out.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#dddddd"/>'
        )
        out.append(f'<text x="{left - 8}" y="{y + 4:.1f}" text-anchor="end">{tick:g}</text>')
    out.append(
        f'<text x="16" y="{top_y + top_h / 2:.1f}" transform="rotate(-90 16 '
        f'{top_y + top_h / 2:.1f})" text-anchor="middle">mean recall</text>'
    )
    if not buckets:
        out.append(
            f'<text x="{left + plot_w / 2}" y="{top_y + top_h / 2}" text-anchor="middle" '
            'fill="#555555">no scores in this window</text>'
        )
    for metric, points in series.items():
        colour = colours[metric]
        coords = [(x_of[p.bucket_start], p) for p in points if p.mean is not None]
        # The line joins neighbouring buckets only; a bucket without a mean breaks it.
        segments: list[list[tuple[float, SummaryRow]]] = []
        previous = -2
        for x, p in coords:
            position = index_of[p.bucket_start]
            if position != previous + 1:
                segments.append([])
            segments[-1].append((x, p))
            previous = position
        for segment in segments:
            if len(segment) < 2:
                continue
            path = " ".join(f"{x:.1f},{y_value(p.mean or 0.0):.1f}" for x, p in segment)
            out.append(
                f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>'
            )
        for x, p in coords:
            tip = (
                f"{metric}, {_bucket_text(p.bucket_start, bucket)}: mean {_num(p.mean)}, "
                f"p10 {_num(p.p10)}, p50 {_num(p.p50)}, p90 {_num(p.p90)}, "
                f"{p.count} scored, {p.skipped} skipped, {p.failed} failed"
            )
            out.append(
                f'<circle cx="{x:.1f}" cy="{y_value(p.mean or 0.0):.1f}" r="3.5" '
                f'fill="{colour}"><title>{e(tip)}</title></circle>'
            )
    # Scored results per bucket, stacked by metric.
    counts = {(r.bucket_start, r.metric): r.count for r in rows}
    totals = dict.fromkeys(buckets, 0)
    for r in rows:
        totals[r.bucket_start] += r.count
    peak = max(totals.values(), default=0) or 1
    out.append(
        f'<text x="{left}" y="{bar_y - 12}" fill="#333333">scored results per {bucket} '
        f"(highest: {max(totals.values(), default=0)})</text>"
    )
    out.append(
        f'<line x1="{left}" y1="{bar_y + bar_h}" x2="{left + plot_w}" y2="{bar_y + bar_h}" '
        'stroke="#999999"/>'
    )
    bar_w = max(slot * 0.7, 0.5)
    for b in buckets:
        base = float(bar_y + bar_h)
        for metric in series:
            count = counts.get((b, metric), 0)
            if not count:
                continue
            h = bar_h * count / peak
            base -= h
            out.append(
                f'<rect x="{x_of[b] - bar_w / 2:.1f}" y="{base:.1f}" width="{bar_w:.1f}" '
                f'height="{h:.1f}" fill="{colours[metric]}" fill-opacity="0.75">'
                f"<title>{e(metric)}, {_bucket_text(b, bucket)}: {count} scored</title></rect>"
            )
        if len(slots) <= 40:
            out.append(
                f'<text x="{x_of[b]:.1f}" y="{base - 4:.1f}" text-anchor="middle" '
                f'font-size="10">{totals[b]}</text>'
            )
    # Time axis labels, thinned so they never overlap.
    step = max(1, math.ceil(len(slots) / 12))
    for i, b in enumerate(slots):
        if i % step:
            continue
        out.append(
            f'<text x="{x_of[b]:.1f}" y="{bar_y + bar_h + 18}" text-anchor="middle" '
            f'font-size="11">{e(_bucket_text(b, bucket))}</text>'
        )
    # Legend: each series is one metric read at one version.
    versions = {r.metric: r.version for r in rows}
    for i, metric in enumerate(series):
        y = top_y + 10 + i * 20
        x = left + plot_w + 20
        out.append(f'<rect x="{x}" y="{y - 9}" width="12" height="12" fill="{colours[metric]}"/>')
        out.append(f'<text x="{x + 18}" y="{y + 1}">{e(metric)} v{e(versions[metric])}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _bucket_range(buckets: Sequence[datetime], bucket: str) -> list[datetime]:
    """Every bucket start from the first to the last of ``buckets``."""
    if not buckets:
        return []
    step = timedelta(hours=1) if bucket == "hour" else timedelta(days=1)
    slots = [buckets[0]]
    while slots[-1] < buckets[-1]:
        slots.append(slots[-1] + step)
    return slots


def render_html(
    rows: Sequence[SummaryRow], *, svg: str, bucket: str, title: str, subtitle: str
) -> str:
    """A self-contained page: the SVG chart, the data as a table and as embedded JSON."""
    e = html.escape
    data = json.dumps(
        {"bucket": bucket, "rows": [r.as_dict() for r in rows]},
        ensure_ascii=False,
        allow_nan=False,
    ).replace("</", "<\\/")
    body_rows = "\n".join(
        "<tr>"
        + "".join(
            f"<td>{e(cell)}</td>"
            for cell in (
                _bucket_text(r.bucket_start, bucket),
                r.metric,
                r.version,
                *_summary_stat_cells(r),
            )
        )
        + "</tr>"
        for r in rows
    )
    header = "".join(
        f"<th>{name}</th>"
        for name in (bucket, *SUMMARY_FIELDS[1:])  # the time column is named after the bucket
    )
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{e(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 24px; color: #222222; }}
table {{ border-collapse: collapse; margin-top: 24px; }}
th, td {{ border: 1px solid #cccccc; padding: 3px 8px; text-align: right; }}
th:nth-child(-n+3), td:nth-child(-n+3) {{ text-align: left; }}
</style>
</head>
<body>
{svg}
<table>
<thead><tr>{header}</tr></thead>
<tbody>
{body_rows}
</tbody>
</table>
<script type="application/json" id="recalltrace-data">{data}</script>
</body>
</html>
"""
