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
    # Lines also differ by dash pattern and marker, so a series drawn over another with the
    # same values stays visible.
    dashes = {m: _DASHES[i % len(_DASHES)] for i, m in enumerate(series)}
    same_as: dict[str, str] = {}
    seen: dict[tuple[tuple[datetime, float | None], ...], str] = {}
    for metric, points in series.items():
        key = tuple((p.bucket_start, p.mean) for p in points)
        if key in seen:
            same_as[metric] = seen[key]
        else:
            seen[key] = metric
    for series_index, (metric, points) in enumerate(series.items()):
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
                f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"'
                f"{_dash_attr(dashes[metric])}/>"
            )
        for x, p in coords:
            tip = (
                f"{metric}, {_bucket_text(p.bucket_start, bucket)}: mean {_num(p.mean)}, "
                f"p10 {_num(p.p10)}, p50 {_num(p.p50)}, p90 {_num(p.p90)}, "
                f"{p.count} scored, {p.skipped} skipped, {p.failed} failed"
            )
            # Later series get smaller markers, so every one of several equal points shows.
            radius = max(1.5, 4.5 - 1.0 * series_index)
            out.append(
                f'<circle cx="{x:.1f}" cy="{y_value(p.mean or 0.0):.1f}" r="{radius:g}" '
                f'fill="{colour}" stroke="#ffffff" stroke-width="0.5"><title>{e(tip)}</title>'
                "</circle>"
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
    # Time axis labels, thinned by their measured width so that they never overlap. Hourly
    # labels are the hour, with the date under the first one of each day shown (or dates
    # alone when hours no longer fit).
    step, daily = _label_step(slot, bucket)
    last_date_right = -math.inf
    for i, b in enumerate(slots):
        if i % step:
            continue
        label = b.strftime("%H:00") if bucket == "hour" and not daily else b.strftime("%Y-%m-%d")
        out.append(
            f'<text x="{x_of[b]:.1f}" y="{bar_y + bar_h + 18}" text-anchor="middle" '
            f'font-size="{_LABEL_FONT}">{e(label)}</text>'
        )
        date_half = 10 * _CHAR_W / 2
        first_of_day = i == 0 or b.date() != slots[i - step].date()
        if (
            bucket == "hour"
            and not daily
            and first_of_day
            and x_of[b] - date_half > last_date_right + _LABEL_GAP
        ):
            last_date_right = x_of[b] + date_half
            out.append(
                f'<text x="{x_of[b]:.1f}" y="{bar_y + bar_h + 32}" text-anchor="middle" '
                f'font-size="{_LABEL_FONT}" fill="#555555">{b.strftime("%Y-%m-%d")}</text>'
            )
    # Legend: each series is one metric read at one version; a series with exactly the values
    # of one drawn before it (its line lies on that one) says so.
    versions = {r.metric: r.version for r in rows}
    for i, metric in enumerate(series):
        y = top_y + 10 + i * 20
        x = left + plot_w + 20
        out.append(
            f'<line x1="{x}" y1="{y - 3}" x2="{x + 14}" y2="{y - 3}" stroke="{colours[metric]}" '
            f'stroke-width="3"{_dash_attr(dashes[metric])}/>'
        )
        text = f"{metric} v{versions[metric]}"
        if metric in same_as:
            text += f" (= {same_as[metric]})"
        out.append(f'<text x="{x + 18}" y="{y + 1}">{e(text)}</text>')
    out.append("</svg>")
    return "\n".join(out)


_DASHES = ("", "7 4", "2 3", "10 3 2 3", "4 2", "1 4", "12 6", "6 2 2 2")
_LABEL_FONT = 11
# Average width of a digit at the label font size, in pixels, plus the gap kept between labels.
_CHAR_W = 0.62 * _LABEL_FONT
_LABEL_GAP = 10.0


def _dash_attr(pattern: str) -> str:
    return f' stroke-dasharray="{pattern}"' if pattern else ""


def _label_step(slot: float, bucket: str) -> tuple[int, bool]:
    """Every how many slots a time label fits (its width and a gap, rounded up to a step that
    reads naturally: hours that divide a day, whole days or weeks), and whether hourly labels
    must be dates (when even one hour label a day does not fit)."""

    def fits(chars: int, natural: tuple[int, ...]) -> int:
        needed = math.ceil((chars * _CHAR_W + _LABEL_GAP) / max(slot, 0.001))
        for step in natural:
            if step >= needed:
                return step
        return natural[-1] * math.ceil(needed / natural[-1])

    if bucket == "hour":
        step = fits(5, (1, 2, 3, 4, 6, 12))  # "13:00"
        if step <= 12:
            return step, False
        return fits(10, (24, 48, 168, 336)), True  # "2026-11-24" every day or more
    return fits(10, (1, 2, 7, 14, 28)), False


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
                *(() if r.by is None else ("(none)" if r.group is None else r.group,)),
                r.metric,
                r.version,
                *_summary_stat_cells(r),
            )
        )
        + "</tr>"
        for r in rows
    )
    by = next((r.by for r in rows if r.by is not None), None)
    header = "".join(
        f"<th>{e(name)}</th>"
        # The time column is named after the bucket, a group column after its attribute.
        for name in (bucket, *(() if by is None else (by,)), *SUMMARY_FIELDS[1:])
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
