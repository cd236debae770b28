"""``recalltrace scores summary``: the score history per time bucket and metric, as a table,
JSON or CSV."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from recalltrace.cli._args import (
    ATTRIBUTE_NAMES,
    EXIT_OK,
    _add_bucket,
    _add_common,
    _add_format,
    _add_where,
    _attribute_name,
    _database,
    _piped,
)
from recalltrace.cli._render import (
    SUMMARY_FIELDS,
    _bucket_text,
    _console,
    _print_csv,
    _print_json,
    _safe,
    _summary_stat_cells,
    print_keyed,
)
from recalltrace.cli._scores_query import nothing_hint, summary_rows

if TYPE_CHECKING:
    from recalltrace.storage.history import SummaryRow


def register(scores_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``scores summary``."""
    summary = scores_sub.add_parser(
        "summary",
        help="per time bucket and metric: count, mean, p10/p50/p90, skipped and failed",
        description="Per time bucket and metric: the number of scored traces, the mean, the "
        "10th/50th/90th percentiles, and how many results were skipped or failed.",
    )
    _add_common(summary, metric_help="only this metric (default: every metric)")
    _add_where(summary)
    summary.add_argument(
        "--by",
        type=_attribute_name,
        default=None,
        metavar="ATTR",
        help=f"split each bucket by this attribute: {', '.join(ATTRIBUTE_NAMES)} (the traces "
        "without it form the group (none))",
    )
    _add_bucket(summary)
    _add_format(summary)
    summary.set_defaults(handler=_piped(_cmd_summary))


def _cmd_summary(args: argparse.Namespace) -> int:
    with _database(args) as engine:
        rows, window = summary_rows(args, engine)
        hint = "" if rows else nothing_hint(args, engine)
    by = args.by
    if args.format == "json":
        _print_json([r.as_dict() for r in rows])
    elif args.format == "csv":
        fields = SUMMARY_FIELDS if by is None else (SUMMARY_FIELDS[0], by, *SUMMARY_FIELDS[1:])
        _print_csv(fields, [r.as_dict() for r in rows])
    if hint and args.format != "table":
        print(f"recalltrace: {hint}", file=sys.stderr)
    if args.format == "table":
        from rich.table import Table

        from recalltrace.storage.history import group_by_metric

        console = _console()
        if not rows:
            console.print(f"No scores for {window}." + (f" Note: {_safe(hint)}." if hint else ""))
            return EXIT_OK
        stats = SUMMARY_FIELDS[3:]
        title = f"Scores by {args.bucket}" + ("" if by is None else f" and {by}") + f", {window}"
        table = Table(title=title, title_justify="left")
        group = () if by is None else (by,)
        left = (args.bucket, *group, "metric")
        for name in (*left, "v", *stats):
            table.add_column(name, justify="left" if name in left else "right")

        def group_cell(r: SummaryRow) -> tuple[str, ...]:
            return () if by is None else (_safe("(none)" if r.group is None else r.group),)

        for r in rows:
            when = _bucket_text(r.bucket_start, args.bucket)
            table.add_row(when, *group_cell(r), r.metric, _safe(r.version), *_summary_stat_cells(r))
        unbounded = console.options.update_width(10_000)
        if console.measure(table, options=unbounded).maximum <= console.width:
            console.print(table)
            return EXIT_OK
        # Too narrow for one table (an 80-column terminal): one table per metric, which needs
        # neither the metric nor the version column.
        console.print(title)
        for metric, series in group_by_metric(rows).items():
            part = Table(
                title=f"{metric} (version {_safe(series[0].version)})", title_justify="left"
            )
            for name in (args.bucket, *group, *stats):
                part.add_column(name, justify="left" if name in left else "right")
            for r in series:
                part.add_row(
                    _bucket_text(r.bucket_start, args.bucket),
                    *group_cell(r),
                    *_summary_stat_cells(r),
                )
            print_keyed(console, part, left)
    return EXIT_OK
