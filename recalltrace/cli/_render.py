"""Rendering shared by the command groups: times, numbers, rich tables, JSON and CSV output."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from recalltrace.storage.history import SummaryRow


def _when(value: datetime | None) -> str:
    if value is None:
        return "now"
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _short_when(value: datetime) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M")


def _window_text(since: datetime | None, until: datetime | None) -> str:
    start = "the beginning" if since is None else _when(since)
    return f"traces started from {start} to {_when(until)}"


def _bucket_text(value: datetime, bucket: str) -> str:
    return value.strftime("%Y-%m-%d" if bucket == "day" else "%Y-%m-%d %H:00")


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _console() -> Console:
    from rich.console import Console

    # Piped output gets a generous fixed width instead of rich's 80-column default, so
    # tables are not squeezed when redirected to a file ($COLUMNS still wins).
    console = Console(highlight=False, soft_wrap=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(highlight=False, soft_wrap=False, width=120)
    return console


def _print_json(document: Any) -> None:
    sys.stdout.write(
        inert_json(json.dumps(document, indent=2, ensure_ascii=False, allow_nan=False))
    )
    sys.stdout.write("\n")


# What json.dumps leaves raw but a terminal acts on: DEL, C1 controls, bidirectional controls
# (C0 controls it already writes as \u00XX).
_UNSAFE_IN_JSON = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def inert_json(text: str) -> str:
    """JSON text with the characters a terminal would act on written as escapes (``\\u001b``):
    the same JSON value, nothing a terminal acts on (they can only occur inside strings)."""
    return _UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


# Characters that can act on a terminal or reorder what is shown: C0 controls but newline and
# tab (ESC starts every escape sequence), DEL, C1 controls (CSI and OSC have one-byte forms),
# and the bidirectional overrides and isolates.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def inert(text: str) -> str:
    """``text`` with every character that could act on a terminal shown instead as its escape
    (``\x1b`` for ESC): questions, documents and judge reasons come from users and models."""
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def known_names(name: str, names: Sequence[str]) -> str:
    """The names there are (the first ten, and how many more) and the closest to ``name``,
    for a one-line error about a name nothing has: ``"a, b (and 3 more); did you mean a?"``."""
    import difflib

    close = difflib.get_close_matches(name, names, n=1)
    known = ", ".join(inert(n) for n in names[:10]) or "none yet"
    more = f" (and {len(names) - 10} more)" if len(names) > 10 else ""
    guess = f"; did you mean {inert(close[0])}?" if close else ""
    return f"{known}{more}{guess}"


def _safe(text: str) -> str:
    """Untrusted text for rich: inert, and with rich's markup escaped."""
    from rich.markup import escape

    return escape(inert(text))


# A cell starting with one of these is a formula to a spreadsheet (OWASP, CSV injection).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return value
    if isinstance(value, float):
        # Twelve significant digits: a mean of 0.1 prints as 0.1, not 0.10000000000000009.
        return f"{value:.12g}"
    if isinstance(value, int):
        return value
    return csv_text(str(value))


def csv_text(text: str) -> str:
    """Text for a CSV cell: what a terminal would act on escaped (:func:`inert`), and a value a
    spreadsheet would run as a formula (``=HYPERLINK(...)``, ``+cmd|...``, ``@SUM(...)``,
    ``-2+3``) prefixed with ``'`` so that it is shown as text."""
    text = inert(text)
    if text.startswith(_FORMULA_START):
        return "'" + text
    return text


def _print_csv(fields: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> None:
    writer = csv.DictWriter(sys.stdout, fieldnames=list(fields), lineterminator="\n")
    writer.writerow({k: csv_text(k) for k in fields})
    for row in rows:
        writer.writerow({k: _csv_cell(row[k]) for k in fields})


def _shorten(text: str, max_chars: int) -> str:
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    return text[:max_chars].rstrip() + f" … ({len(text) - max_chars} more characters)"


def _label(key: str) -> str:
    return key.replace("_", " ")


def _plain(value: Any) -> str:
    """One line of text for a detail value (lists comma-joined, objects as JSON)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    if isinstance(value, list):
        if not value:
            return "(none)"
        if all(isinstance(v, list) for v in value):
            return " | ".join(_plain(v) for v in value)
        return ", ".join(_plain(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    return str(value)


def _records_table(title: str, records: Sequence[Mapping[str, Any]]) -> RenderableType:
    from rich.markup import escape
    from rich.table import Table

    columns: list[str] = []
    for record in records:
        columns.extend(k for k in record if k not in columns)
    table = Table(title=_safe(title), title_justify="left", show_lines=False)
    for column in columns:
        table.add_column(
            escape(_label(column)), ratio=1 if _is_text_column(records, column) else None
        )
    for record in records:
        cells = []
        for column in columns:
            value = record.get(column)
            if column in _VERDICT_KEYS and isinstance(value, (bool, int)):
                cells.append("yes" if value else "no")
            else:
                cells.append(_safe(_plain(value)))
        table.add_row(*cells)
    return table


def _is_text_column(records: Sequence[Mapping[str, Any]], column: str) -> bool:
    return any(isinstance(r.get(column), str) and len(r[column]) > 20 for r in records)


SUMMARY_FIELDS = (
    "bucket_start",
    "metric",
    "version",
    "count",
    "mean",
    "p10",
    "p50",
    "p90",
    "skipped",
    "failed",
)


def _summary_stat_cells(r: SummaryRow) -> list[str]:
    """A summary row's statistics as text, in the order of ``SUMMARY_FIELDS[3:]``."""
    values = (r.mean, r.p10, r.p50, r.p90)
    return [str(r.count), *(_num(v) for v in values), str(r.skipped), str(r.failed)]


_VERDICT_KEYS = frozenset({"attributed", "is_relevant", "is_included", "found"})


def print_keyed(console: Console, table: Any, keys: Sequence[str]) -> None:
    """Print ``table`` without ever cutting a cell of its key columns (those whose header is in
    ``keys``: a day, a release, a metric). As a table when it fits the console (with lighter
    borders if that is what it takes); otherwise each row as a block: its keys on one line,
    then ``header: value`` lines. No cell is hidden behind an ellipsis either way."""
    from rich import box
    from rich.text import Text

    unbounded = console.options.update_width(10_000)
    if console.measure(table, options=unbounded).maximum <= console.width:
        console.print(table)
        return
    table.box = box.SIMPLE_HEAD
    table.pad_edge = False
    if console.measure(table, options=unbounded).maximum <= console.width:
        console.print(table)
        return
    columns = list(table.columns)
    rows = [list(column.cells) for column in columns]
    if table.title:
        console.print(table.title)
    for index in range(table.row_count):
        cells = [(str(column.header), rows[n][index]) for n, column in enumerate(columns)]
        head = "  ".join(str(cell) for name, cell in cells if name in keys)
        console.print(Text.from_markup(head, style="bold"), soft_wrap=True)
        for name, cell in cells:
            if name not in keys:
                console.print(Text.assemble(f"  {name}: ", Text.from_markup(str(cell))))
