"""``recalltrace scores worst``: the lowest scored results with their reasons."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from recalltrace.cli._args import (
    EXIT_OK,
    MAX_ROWS,
    _add_common,
    _add_format,
    _add_where,
    _data_window,
    _database,
    _history,
    _metric_version,
    _piped,
    _window,
    int_range,
)
from recalltrace.cli._render import (
    _console,
    _num,
    _print_csv,
    _print_json,
    _safe,
    _short_when,
    _shorten,
    _window_text,
)
from recalltrace.cli._scores_query import nothing_hint

if TYPE_CHECKING:
    from recalltrace.storage.history import WorstRow


def register(scores_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``scores worst``."""
    worst = scores_sub.add_parser(
        "worst",
        help="the lowest-scoring traces with their reasons",
        description="The lowest scored results in the window, lowest first, with their reasons.",
    )
    _add_common(worst, metric_help="only this metric (default: the lowest of every metric)")
    _add_where(worst)
    worst.add_argument(
        "--per-question",
        action="store_true",
        help="one row per question (its lowest trace, and how many traces asked it), so the "
        "same question does not fill the list",
    )
    worst.add_argument(
        "--limit",
        type=int_range(1, MAX_ROWS),
        default=10,
        metavar="N",
        help=f"rows (default: 10, at most {MAX_ROWS})",
    )
    _add_format(worst)
    worst.set_defaults(handler=_piped(_cmd_worst))


#: ``scores worst`` shows each row as a block instead of a table when the reason column would
#: be narrower than this.
_MIN_REASON_WIDTH = 24


WORST_FIELDS = (
    "value",
    "metric",
    "trace_id",
    "app_name",
    "trace_started_at",
    "reason",
    "version",
    "scored_at",
)


def _cmd_worst(args: argparse.Namespace) -> int:
    metric, version = _metric_version(args)
    since, until = _window(args)
    with _database(args) as engine:
        bounded = _data_window(engine, since, until)
        rows = _history(engine).worst(
            metric=metric,
            limit=args.limit,
            since=bounded[0],
            until=bounded[1],
            app=args.app,
            version=version,
            where=args.where,
            per_question=args.per_question,
        )
        hint = "" if rows else nothing_hint(args, engine)
    if args.format == "json":
        _print_json([r.as_dict() for r in rows])
    elif args.format == "csv":
        fields = WORST_FIELDS + (("question", "traces_with_question") if args.per_question else ())
        _print_csv(fields, [r.as_dict() for r in rows])
    if hint and args.format != "table":
        print(f"recalltrace: {hint}", file=sys.stderr)
    if args.format == "table":
        from rich.table import Table

        console = _console()
        window = _window_text(since, until)
        if not rows:
            console.print(
                f"No scored traces for {window}." + (f" Note: {_safe(hint)}." if hint else "")
            )
            return EXIT_OK
        title = f"Lowest scores, {window}"
        # Every column but the reason has a fixed width; the reason gets the rest (rich left to
        # itself overshoots the console by a column or two and crops the right border).
        metric_width = max(len(r.metric) for r in rows)
        fixed = (5, metric_width, 32, 16)
        reason_width = console.width - sum(fixed) - 2 * (len(fixed) + 1) - (len(fixed) + 2)
        if reason_width < _MIN_REASON_WIDTH:
            # Too narrow for the reason beside the other columns: each row as a short block.
            console.print(title)
            grid = Table.grid(padding=(0, 2, 0, 0))
            grid.add_column(justify="right")
            grid.add_column()
            for index, r in enumerate(rows):
                if index:
                    grid.add_row("", "")  # a blank line between rows
                grid.add_row(
                    _num(r.value),
                    f"[bold]{r.metric}[/bold] (version {_safe(r.version)})\n"
                    f"{r.trace_id}  [dim]{_safe(r.app_name)}  "
                    f"{_short_when(r.trace_started_at)} UTC[/dim]\n{_worst_text(r)}",
                )
            console.print(grid)
            return EXIT_OK
        table = Table(title=title, title_justify="left", show_lines=True)
        table.add_column("value", justify="right", width=fixed[0])
        table.add_column("metric", width=fixed[1])
        table.add_column("trace id / app", width=fixed[2])
        table.add_column("started (UTC)", width=fixed[3], no_wrap=True)
        longest = max(len("reason"), *(len(_worst_text(r)) for r in rows))
        table.add_column("reason", width=min(reason_width, longest))
        for r in rows:
            table.add_row(
                _num(r.value),
                r.metric,
                f"{r.trace_id}\n[dim]{_safe(r.app_name)}[/dim]",
                _short_when(r.trace_started_at),
                _worst_text(r),
            )
        console.print(table)
    return EXIT_OK


def _worst_text(row: WorstRow) -> str:
    """The reason, after the question and how many traces asked it (``--per-question``)."""
    if row.traces_with_question is None:
        return _safe(row.reason)
    question = _safe(_shorten(row.question or "(no question)", 80))
    return f"[bold]{question}[/bold] ({row.traces_with_question} traces)\n{_safe(row.reason)}"
