"""History subcommands of ``recalltrace``: ``scores summary|worst|plot``, ``trace show``,
``check`` and ``jobs list|retry``.

Each handler opens the database, runs one query of :mod:`storage.history` and prints the rows
as a table (drawn with rich), as one JSON document, or as CSV with a header row. Problems a
user can fix (a bad duration, an unknown metric or trace id, a missing SQLite file) raise
:class:`recalltrace.cli.CommandError`; database errors go through the shared mapping in
:mod:`recalltrace.cli`.
"""

from __future__ import annotations

import argparse
import csv
import html
import json
import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recalltrace.cli import EXIT_CHECK_FAILED, EXIT_OK, CommandError, _add_database_option

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from sqlalchemy import Engine

    from recalltrace.storage.history import History, ScoreDetail, SummaryRow, TraceDetail

FORMATS = ("table", "json", "csv")
DEFAULT_WINDOW = "7d"

# -- registration --------------------------------------------------------------------------------


def register_history_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``scores``, ``trace``, ``check`` and ``jobs`` to the ``recalltrace`` parser."""
    scores = sub.add_parser("scores", help="query the history of stored scores")
    scores_sub = scores.add_subparsers(dest="scores_command", metavar="ACTION", required=True)

    summary = scores_sub.add_parser(
        "summary",
        help="per time bucket and metric: count, mean, p10/p50/p90, skipped and failed",
        description="Per time bucket and metric: the number of scored traces, the mean, the "
        "10th/50th/90th percentiles, and how many results were skipped or failed.",
    )
    _add_common(summary, metric_help="only this metric (default: every metric)")
    _add_bucket(summary)
    _add_format(summary)
    summary.set_defaults(handler=_piped(_cmd_summary))

    worst = scores_sub.add_parser(
        "worst",
        help="the lowest-scoring traces with their reasons",
        description="The lowest scored results in the window, lowest first, with their reasons.",
    )
    _add_common(worst, metric_help="only this metric (default: the lowest of every metric)")
    worst.add_argument(
        "--limit", type=_positive_int, default=10, metavar="N", help="rows (default: 10)"
    )
    _add_format(worst)
    worst.set_defaults(handler=_piped(_cmd_worst))

    plot = scores_sub.add_parser(
        "plot",
        help="chart recall over time per metric (HTML page or SVG)",
        description="Chart the mean recall per metric over time, with the number of scored "
        "results per bucket, as a self-contained HTML page (.html) or an SVG image (.svg).",
    )
    _add_common(plot, metric_help="only this metric (default: every metric)")
    _add_bucket(plot)
    plot.add_argument(
        "--out", required=True, metavar="FILE", help="output file: FILE.html or FILE.svg"
    )
    plot.set_defaults(handler=_piped(_cmd_plot))

    trace = sub.add_parser("trace", help="inspect one stored trace")
    trace_sub = trace.add_subparsers(dest="trace_command", metavar="ACTION", required=True)
    show = trace_sub.add_parser(
        "show",
        help="a trace's question, contexts, answer, reference and every score with evidence",
    )
    _add_database_option(show)
    show.add_argument(
        "trace_id", type=_stored_text, metavar="TRACE_ID", help="the 32-hex-digit trace id"
    )
    show.add_argument("--format", choices=("table", "json"), default="table", help="output format")
    show.add_argument(
        "--max-chars",
        type=int,
        default=800,
        metavar="N",
        help="shorten each context to N characters in tables (0: never; default: 800)",
    )
    show.set_defaults(handler=_piped(_cmd_trace_show))

    check = sub.add_parser(
        "check",
        help="exit 1 when a metric's mean falls below a threshold (for cron and CI)",
        description="Exit 0 with one OK line when the mean of METRIC over the window is at "
        "least --min over at least --min-count scored traces; otherwise exit 1 with one line "
        "saying why.",
    )
    _add_database_option(check)
    check.add_argument("--metric", required=True, metavar="METRIC", help="the metric to check")
    _add_version(check)
    check.add_argument(
        "--min", dest="minimum", required=True, type=_unit_float, metavar="X", help="lowest mean"
    )
    check.add_argument(
        "--since", default="1h", metavar="WHEN", help="window start (default: 1h; see --help)"
    )
    check.add_argument("--until", default=None, metavar="WHEN", help="window end (default: now)")
    check.add_argument(
        "--app", type=_stored_text, default=None, metavar="NAME", help="only this app"
    )
    check.add_argument(
        "--min-count",
        type=_positive_int,
        default=1,
        metavar="N",
        help="fail when fewer than N traces were scored (default: 1)",
    )
    check.set_defaults(handler=_piped(_cmd_check))

    jobs = sub.add_parser("jobs", help="failed and stuck scoring jobs")
    jobs_sub = jobs.add_subparsers(dest="jobs_command", metavar="ACTION", required=True)
    jobs_list = jobs_sub.add_parser(
        "list",
        help="failed and stuck jobs, most recently changed first",
        description="Failed jobs and stuck ones: running past their lease (the worker died), "
        "queued and due for longer than --stuck-after (no worker is running), or waiting for "
        "a reference past its time-to-live. --since/--until filter on the job's last change.",
    )
    _add_database_option(jobs_list)
    _add_job_filters(jobs_list)
    jobs_list.add_argument("--since", default=None, metavar="WHEN", help="changed since")
    jobs_list.add_argument("--until", default=None, metavar="WHEN", help="changed before")
    jobs_list.add_argument(
        "--stuck-after",
        default="15m",
        metavar="DURATION",
        help="a queued job due for longer than this is stuck (default: 15m)",
    )
    jobs_list.add_argument(
        "--limit", type=_positive_int, default=100, metavar="N", help="rows (default: 100)"
    )
    _add_format(jobs_list)
    jobs_list.set_defaults(handler=_piped(_cmd_jobs_list))

    jobs_retry = jobs_sub.add_parser(
        "retry",
        help="queue failed jobs again (and jobs whose worker died)",
        description="Queue failed jobs again with fresh attempts. Without --id, jobs whose "
        "lease expired (their worker died or stalled) are given back to the queue as well.",
    )
    _add_database_option(jobs_retry)
    _add_job_filters(jobs_retry)
    jobs_retry.add_argument(
        "--id",
        dest="job_ids",
        type=_positive_int,
        action="append",
        metavar="JOB_ID",
        help="only this failed job (repeatable)",
    )
    jobs_retry.set_defaults(handler=_piped(_cmd_jobs_retry))


def _piped(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Run ``handler``; a reader that stops early (``| head``) ends the output quietly."""

    def run(args: argparse.Namespace) -> int:
        try:
            result = handler(args)
            sys.stdout.flush()
            return result
        except BrokenPipeError:
            # Point stdout at /dev/null so the interpreter's final flush does not fail too.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return EXIT_OK

    return run


def _add_common(parser: argparse.ArgumentParser, *, metric_help: str) -> None:
    _add_database_option(parser)
    parser.add_argument(
        "--since",
        default=DEFAULT_WINDOW,
        metavar="WHEN",
        help=f"window start: a duration before now (30m, 1h, 7d, 2w) or an ISO timestamp "
        f"(2026-11-01, 2026-11-01T10:00:00Z); default: {DEFAULT_WINDOW}",
    )
    parser.add_argument("--until", default=None, metavar="WHEN", help="window end (default: now)")
    parser.add_argument(
        "--app", type=_stored_text, default=None, metavar="NAME", help="only this app"
    )
    parser.add_argument("--metric", default=None, metavar="METRIC", help=metric_help)
    _add_version(parser)


def _add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--version",
        dest="metric_version",
        type=_stored_text,
        default=None,
        metavar="V",
        help="read version V of --metric (default: each metric's current version; the scores "
        "of other versions, kept after a backfill, are never pooled with them)",
    )


def _add_job_filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metric", default=None, metavar="METRIC", help="only this metric")
    parser.add_argument(
        "--app", type=_stored_text, default=None, metavar="NAME", help="only this app's traces"
    )


def _add_bucket(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bucket", choices=("hour", "day"), default="day", help="bucket size (default: day)"
    )


def _add_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format", choices=FORMATS, default="table", help="output format (default: table)"
    )


# Largest count or id a command accepts: what a Postgres bigint holds (limits, job ids).
_MAX_INT = 2**63 - 1


def _stored_text(text: str) -> str:
    """An argument compared with stored text: refuse characters stored text never holds (a
    non-UTF-8 byte in the command line arrives as a lone surrogate)."""
    from recalltrace.storage.history import unstorable_character

    problem = unstorable_character(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number of at least 1, got {text!r}")
    if value > _MAX_INT:
        raise argparse.ArgumentTypeError(f"expected a number of at most {_MAX_INT}, got {text!r}")
    return value


def _unit_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return value


# -- shared plumbing -----------------------------------------------------------------------------


@contextmanager
def _database(args: argparse.Namespace) -> Iterator[Engine]:
    """An engine on ``--database-url``; refuses to create a SQLite file that does not exist."""
    from recalltrace.storage.db import create_engine_from_url, redact_url, resolve_database_url

    url = resolve_database_url(args.database_url)
    engine = create_engine_from_url(url)
    try:
        if engine.dialect.name == "sqlite":
            path = engine.url.database
            # SQLite would silently create an empty file for a mistyped path.
            in_file = bool(path) and path != ":memory:" and not str(path).startswith("file:")
            if in_file and not Path(str(path)).exists():
                raise CommandError(
                    f"no database file at {redact_url(url)}: check --database-url, or "
                    "create it with `recalltrace db upgrade`"
                )
        yield engine
    finally:
        engine.dispose()


def _history(engine: Engine) -> History:
    from recalltrace.storage.history import History

    return History(engine)


def _metric(value: str | None) -> str | None:
    from recalltrace.storage.history import UnknownMetric, check_metric

    if value is None:
        return None
    try:
        return check_metric(value)
    except UnknownMetric as exc:
        raise CommandError(str(exc)) from None


def _metric_version(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """``--metric`` and ``--version``, checked by History's own rule, in the flags' words."""
    from recalltrace.storage.history import metric_versions

    metric = _metric(args.metric)
    version: str | None = args.metric_version
    if version is not None and metric is None:
        raise CommandError("--version needs --metric: versions are numbered per metric")
    try:
        metric_versions(metric, version)
    except ValueError as exc:
        raise CommandError(f"--version: {exc}") from None
    return metric, version


def _window(args: argparse.Namespace) -> tuple[datetime | None, datetime | None]:
    """``--since``/``--until`` as UTC times; one clear line for a bad value."""
    from recalltrace.storage.history import TimeSpecError, parse_time

    now = datetime.now(timezone.utc)
    try:
        since = None if args.since is None else parse_time(args.since, now=now)
        until = None if args.until is None else parse_time(args.until, now=now)
    except TimeSpecError as exc:
        raise CommandError(str(exc)) from None
    if since is not None and until is not None and since >= until:
        raise CommandError(f"--since ({_when(since)}) must be before --until ({_when(until)})")
    return since, until


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
    sys.stdout.write(json.dumps(document, indent=2, ensure_ascii=False, allow_nan=False))
    sys.stdout.write("\n")


def _print_csv(fields: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> None:
    writer = csv.DictWriter(sys.stdout, fieldnames=list(fields), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row[k] is None else row[k] for k in fields})


# -- scores summary ------------------------------------------------------------------------------

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


def _summary_rows(args: argparse.Namespace, engine: Engine) -> tuple[list[SummaryRow], str]:
    metric, version = _metric_version(args)
    since, until = _window(args)
    rows = _history(engine).summary(
        bucket=args.bucket, since=since, until=until, app=args.app, metric=metric, version=version
    )
    return rows, _window_text(since, until)


def _cmd_summary(args: argparse.Namespace) -> int:
    with _database(args) as engine:
        rows, window = _summary_rows(args, engine)
    if args.format == "json":
        _print_json([r.as_dict() for r in rows])
    elif args.format == "csv":
        _print_csv(SUMMARY_FIELDS, [r.as_dict() for r in rows])
    else:
        from rich.markup import escape
        from rich.table import Table

        from recalltrace.storage.history import group_by_metric

        console = _console()
        if not rows:
            console.print(f"No scores for {window}.")
            return EXIT_OK
        stats = SUMMARY_FIELDS[3:]
        title = f"Scores by {args.bucket}, {window}"
        table = Table(title=title, title_justify="left")
        for name in (args.bucket, "metric", "v", *stats):
            table.add_column(name, justify="left" if name in (args.bucket, "metric") else "right")
        for r in rows:
            when = _bucket_text(r.bucket_start, args.bucket)
            table.add_row(when, r.metric, escape(r.version), *_summary_stat_cells(r))
        unbounded = console.options.update_width(10_000)
        if console.measure(table, options=unbounded).maximum <= console.width:
            console.print(table)
            return EXIT_OK
        # Too narrow for one table (an 80-column terminal): one table per metric, which needs
        # neither the metric nor the version column.
        console.print(title)
        for metric, series in group_by_metric(rows).items():
            part = Table(
                title=f"{metric} (version {escape(series[0].version)})", title_justify="left"
            )
            for name in (args.bucket, *stats):
                part.add_column(name, justify="left" if name == args.bucket else "right")
            for r in series:
                part.add_row(_bucket_text(r.bucket_start, args.bucket), *_summary_stat_cells(r))
            console.print(part)
    return EXIT_OK


# -- scores worst --------------------------------------------------------------------------------

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
        rows = _history(engine).worst(
            metric=metric, limit=args.limit, since=since, until=until, app=args.app, version=version
        )
    if args.format == "json":
        _print_json([r.as_dict() for r in rows])
    elif args.format == "csv":
        _print_csv(WORST_FIELDS, [r.as_dict() for r in rows])
    else:
        from rich.markup import escape
        from rich.table import Table

        console = _console()
        window = _window_text(since, until)
        if not rows:
            console.print(f"No scored traces for {window}.")
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
                    f"[bold]{r.metric}[/bold] (version {escape(r.version)})\n"
                    f"{r.trace_id}  [dim]{escape(r.app_name)}  "
                    f"{_short_when(r.trace_started_at)} UTC[/dim]\n{escape(r.reason)}",
                )
            console.print(grid)
            return EXIT_OK
        table = Table(title=title, title_justify="left", show_lines=True)
        table.add_column("value", justify="right", width=fixed[0])
        table.add_column("metric", width=fixed[1])
        table.add_column("trace id / app", width=fixed[2])
        table.add_column("started (UTC)", width=fixed[3], no_wrap=True)
        longest = max(len("reason"), *(len(r.reason) for r in rows))
        table.add_column("reason", width=min(reason_width, longest))
        for r in rows:
            table.add_row(
                _num(r.value),
                r.metric,
                f"{r.trace_id}\n[dim]{escape(r.app_name)}[/dim]",
                _short_when(r.trace_started_at),
                escape(r.reason),
            )
        console.print(table)
    return EXIT_OK


# -- trace show ----------------------------------------------------------------------------------

_VERDICT_KEYS = frozenset({"attributed", "is_relevant", "is_included", "found"})
# Evidence keys shown first, in this order; every other key follows, so nothing is hidden.
_DETAIL_ORDER = (
    "claims",
    "evaluated_chunks",
    "missing_information",
    "missing_ids",
    "found_ids",
    "reference_entities",
    "context_entities",
    "found_entities",
    "missing_entities",
    "matches",
    "judge_reason",
)


def _cmd_trace_show(args: argparse.Namespace) -> int:
    from recalltrace.storage.repository import TraceNotFound

    trace_id = args.trace_id.strip().lower()
    with _database(args) as engine:
        try:
            detail = _history(engine).trace(trace_id)
        except TraceNotFound:
            raise CommandError(f"no trace is stored with id {args.trace_id!r}") from None
    if args.format == "json":
        _print_json(detail.as_dict())
        return EXIT_OK
    _render_trace(_console(), detail, max_chars=args.max_chars)
    return EXIT_OK


def _shorten(text: str, max_chars: int) -> str:
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    return text[:max_chars].rstrip() + f" … ({len(text) - max_chars} more characters)"


def _render_trace(console: Console, detail: TraceDetail, *, max_chars: int) -> None:
    from rich.markup import escape
    from rich.panel import Panel
    from rich.table import Table

    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("trace", detail.trace_id)
    head.add_row("app", f"{detail.app_name} (service {detail.service_name})")
    head.add_row("started", f"{_when(detail.started_at)}, took {detail.duration_ms:.0f} ms")
    if detail.error:
        head.add_row("error", "the traced function raised")
    for note in detail.notes:
        head.add_row("note", note)
    if detail.metadata:
        head.add_row("metadata", json.dumps(dict(detail.metadata), ensure_ascii=False))
    console.print(Panel(head, title="Trace", title_align="left"))

    def text_panel(title: str, value: str | None) -> None:
        body = "(none)" if value is None else escape(value) or "(empty)"
        console.print(Panel(body, title=title, title_align="left"))

    text_panel("Question", detail.user_input)

    contexts = Table(title="Retrieved contexts", title_justify="left", show_lines=True)
    contexts.add_column("#", justify="right")
    contexts.add_column("id")
    contexts.add_column("retriever score", justify="right")
    contexts.add_column("content", ratio=1)
    for c in detail.contexts:
        contexts.add_row(
            str(c.position),
            escape(c.context_id or "-"),
            _num(c.score),
            escape(_shorten(c.content, max_chars)),
        )
    if detail.contexts:
        console.print(contexts)
    else:
        console.print(
            Panel("(nothing was retrieved)", title="Retrieved contexts", title_align="left")
        )

    text_panel("Answer", detail.response)
    reference = detail.reference
    if (
        reference is None
        and detail.reference_contexts is None
        and detail.reference_context_ids is None
    ):
        text_panel("Reference", None)
    else:
        ref = Table.grid(padding=(0, 2))
        ref.add_column(style="bold")
        ref.add_column()
        ref.add_row("answer", "(none)" if reference is None else escape(reference))
        if detail.reference_contexts is not None:
            for i, ctx in enumerate(detail.reference_contexts):
                ref.add_row(f"context {i}", escape(_shorten(ctx, max_chars)))
        if detail.reference_context_ids is not None:
            ids = ", ".join(detail.reference_context_ids) or "(none)"
            ref.add_row("context ids", escape(ids))
        console.print(Panel(ref, title="Reference", title_align="left"))

    scored_metrics = {s.metric for s in detail.scores}
    for score in detail.scores:
        console.print(_score_panel(score))
    pending = [j for j in detail.jobs if j.metric not in scored_metrics]
    if pending:
        jobs = Table(title="Not scored yet", title_justify="left")
        jobs.add_column("metric")
        jobs.add_column("job status")
        jobs.add_column("attempts", justify="right")
        jobs.add_column("last error", ratio=1)
        for j in pending:
            status = j.status if j.problem in (None, j.status) else f"{j.status} ({j.problem})"
            jobs.add_row(j.metric, status, str(j.attempts), escape(j.last_error or "-"))
        console.print(jobs)
    if not detail.scores and not pending:
        console.print("No scores and no scoring jobs are stored for this trace.")


def _score_panel(score: ScoreDetail) -> RenderableType:
    from rich.console import Group
    from rich.markup import escape
    from rich.panel import Panel
    from rich.table import Table

    parts: list[RenderableType] = [escape(score.reason)]
    keys = [k for k in _DETAIL_ORDER if k in score.details]
    keys += sorted(k for k in score.details if k not in _DETAIL_ORDER)

    def new_facts() -> Table:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column()
        return grid

    # Evidence keeps its order: runs of plain facts as a grid, lists of records as tables.
    facts = new_facts()
    for key in keys:
        value = score.details[key]
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            if facts.row_count:
                parts.append(facts)
                facts = new_facts()
            parts.append(_records_table(_label(key), value))
        else:
            facts.add_row(escape(_label(key)), escape(_plain(value)))
    accounting = []
    if score.model:
        accounting.append(f"model {score.model}")
    if score.prompt_tokens is not None or score.completion_tokens is not None:
        accounting.append(
            f"tokens {score.prompt_tokens or 0} prompt + {score.completion_tokens or 0} completion"
        )
    if score.cost_usd is not None:
        accounting.append(f"cost ${score.cost_usd:.6f}")
    if score.latency_ms is not None:
        accounting.append(f"{score.latency_ms:.0f} ms")
    accounting.append(f"scored {_when(score.scored_at)}")
    facts.add_row("scoring", escape(", ".join(accounting)))
    parts.append(facts)
    value = "" if score.value is None else f" {score.value:.3f}"
    title = f"{score.metric} v{score.version}: {score.status}{value}"
    return Panel(Group(*parts), title=escape(title), title_align="left")


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
    table = Table(title=escape(title), title_justify="left", show_lines=False)
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
                cells.append(escape(_plain(value)))
        table.add_row(*cells)
    return table


def _is_text_column(records: Sequence[Mapping[str, Any]], column: str) -> bool:
    return any(isinstance(r.get(column), str) and len(r[column]) > 20 for r in records)


# -- scores plot ---------------------------------------------------------------------------------

_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")


def _cmd_plot(args: argparse.Namespace) -> int:
    out = Path(args.out)
    suffix = out.suffix.lower()
    if suffix not in (".html", ".htm", ".svg"):
        if suffix == ".png":
            raise CommandError(
                "PNG output is not supported; write a self-contained page with --out "
                f"{out.with_suffix('.html')} or an image with --out {out.with_suffix('.svg')}"
            )
        raise CommandError(f"cannot tell the chart format from {args.out!r}: use .html or .svg")
    if not out.parent.exists():
        raise CommandError(f"the folder of {args.out!r} does not exist")
    with _database(args) as engine:
        rows, window = _summary_rows(args, engine)
    title = f"Context recall by {args.bucket}" + (f", app {args.app}" if args.app else "")
    svg = render_svg(rows, bucket=args.bucket, title=title, subtitle=window)
    if suffix == ".svg":
        document = '<?xml version="1.0" encoding="UTF-8"?>\n' + svg
    else:
        document = render_html(rows, svg=svg, bucket=args.bucket, title=title, subtitle=window)
    out.write_text(document, encoding="utf-8")
    print(f"wrote {out} ({len(rows)} bucket rows, {window})")
    return EXIT_OK


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


# -- check ---------------------------------------------------------------------------------------


def _cmd_check(args: argparse.Namespace) -> int:
    metric, version = _metric_version(args)
    assert metric is not None  # --metric is required
    since, until = _window(args)
    with _database(args) as engine:
        stats = _history(engine).window(
            metric=metric, since=since, until=until, app=args.app, version=version
        )
    scope = _window_text(since, until) + (f", app {args.app}" if args.app else "")
    if version is not None:
        scope += f", version {version}"
    if stats.count < args.min_count or stats.mean is None:
        print(
            f"FAIL {metric}: {stats.count} scored traces for {scope}, fewer than the "
            f"{args.min_count} required ({stats.skipped} skipped, {stats.failed} failed)",
            file=sys.stderr,
        )
        return EXIT_CHECK_FAILED
    if stats.mean < args.minimum:
        print(
            f"FAIL {metric}: mean {stats.mean:.4f} is below {args.minimum:g} over "
            f"{stats.count} scored traces for {scope}",
            file=sys.stderr,
        )
        return EXIT_CHECK_FAILED
    print(
        f"OK {metric}: mean {stats.mean:.4f} is at least {args.minimum:g} over "
        f"{stats.count} scored traces for {scope}"
    )
    return EXIT_OK


# -- jobs ----------------------------------------------------------------------------------------

JOB_FIELDS = (
    "id",
    "metric",
    "problem",
    "status",
    "attempts",
    "updated_at",
    "trace_id",
    "last_error",
    "version",
    "run_at",
    "locked_by",
    "lease_expires_at",
)


def _cmd_jobs_list(args: argparse.Namespace) -> int:
    from recalltrace.storage.history import TimeSpecError, parse_duration

    metric = _metric(args.metric)
    since, until = _window(args)
    try:
        stuck_after = parse_duration(args.stuck_after)
    except TimeSpecError as exc:
        raise CommandError(str(exc)) from None
    with _database(args) as engine:
        rows = _history(engine).problem_jobs(
            metric=metric,
            app=args.app,
            since=since,
            until=until,
            stuck_after=stuck_after,
            limit=args.limit,
        )
    if args.format == "json":
        _print_json([r.as_dict() for r in rows])
    elif args.format == "csv":
        _print_csv(JOB_FIELDS, [r.as_dict() for r in rows])
    else:
        from rich.markup import escape
        from rich.table import Table

        console = _console()
        if not rows:
            console.print("No failed or stuck jobs.")
            return EXIT_OK
        table = Table(title="Failed and stuck jobs", title_justify="left", show_lines=True)
        table.add_column("id", justify="right", no_wrap=True)
        table.add_column("metric", overflow="fold")
        table.add_column("problem", no_wrap=True)
        table.add_column("attempts", justify="right", no_wrap=True)
        table.add_column("updated (UTC)")
        table.add_column("trace id / last error", ratio=1, min_width=32)
        for r in rows:
            table.add_row(
                str(r.id),
                r.metric,
                r.problem or r.status,
                str(r.attempts),
                _short_when(r.updated_at),
                f"{r.trace_id}\n{escape(r.last_error or '-')}",
            )
        console.print(table)
        console.print(
            "Retry failed jobs and jobs whose worker died with `recalltrace jobs retry`; "
            "overdue jobs need a running worker."
        )
    return EXIT_OK


def _cmd_jobs_retry(args: argparse.Namespace) -> int:
    from recalltrace.storage.repository import Repository

    metric = _metric(args.metric)
    # Expired leases are given back only when no filter narrows the retry.
    everything = args.job_ids is None and args.app is None and metric is None
    with _database(args) as engine:
        repo = Repository(engine)
        job_ids = list(args.job_ids) if args.job_ids else None
        if args.app is not None:
            job_ids = _jobs_of_app(engine, args.app, metric, job_ids)
        failed = 0 if job_ids == [] else repo.retry_jobs(job_ids=job_ids, metric=metric)
        leases = repo.requeue_expired_leases() if everything else 0
    message = f"queued again: {failed} failed job{'s' if failed != 1 else ''}"
    if everything:
        message += f", {leases} job{'s' if leases != 1 else ''} whose lease had expired"
    print(message)
    if args.job_ids and failed < len(set(args.job_ids)):
        missing = len(set(args.job_ids)) - failed
        print(
            f"{missing} of the given job ids {'were' if missing != 1 else 'was'} not failed "
            "(see `recalltrace jobs list`)",
            file=sys.stderr,
        )
    return EXIT_OK


def _jobs_of_app(
    engine: Engine, app: str, metric: str | None, job_ids: list[int] | None
) -> list[int]:
    """Ids of failed jobs whose trace belongs to ``app`` (narrowed to ``job_ids`` if given)."""
    from sqlalchemy import select

    from recalltrace.storage.models import JobStatus, ScoringJob, Trace

    stmt = select(ScoringJob.id).where(
        ScoringJob.status == JobStatus.FAILED,
        ScoringJob.trace_id.in_(select(Trace.trace_id).where(Trace.app_name == app)),
    )
    if metric is not None:
        stmt = stmt.where(ScoringJob.metric == metric)
    if job_ids is not None:
        stmt = stmt.where(ScoringJob.id.in_(job_ids))
    with engine.connect() as conn:
        return list(conn.scalars(stmt))
