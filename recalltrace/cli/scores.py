"""``recalltrace scores summary|worst|plot`` and ``recalltrace check``: the score history.

Each handler opens the database, runs one query of :mod:`recalltrace.storage.history` and
prints the rows as a table, one JSON document, or CSV with a header row."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recalltrace.cli._args import (
    ATTRIBUTE_NAMES,
    EXIT_CHECK_FAILED,
    EXIT_OK,
    MAX_ROWS,
    CommandError,
    _add_bucket,
    _add_common,
    _add_database_option,
    _add_format,
    _add_version,
    _add_where,
    _attribute_filter,
    _attribute_name,
    _data_window,
    _database,
    _history,
    _metric,
    _metric_version,
    _piped,
    _positive_int,
    _stored_text,
    _unit_float,
    _window,
    int_range,
)
from recalltrace.cli._charts import render_html, render_svg
from recalltrace.cli._render import (
    SUMMARY_FIELDS,
    _bucket_text,
    _console,
    _num,
    _print_csv,
    _print_json,
    _safe,
    _short_when,
    _shorten,
    _summary_stat_cells,
    _window_text,
    inert,
    print_keyed,
)
from recalltrace.cli.diagnose import register as register_diagnose
from recalltrace.cli.worker import add_judge_arguments, judge_config_from_args
from recalltrace.compare import MIN_LABELS, MIN_TRACES, compare_groups

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy import Engine

    from recalltrace.compare import Comparison, GroupComparison
    from recalltrace.storage.history import SummaryRow, WorstRow


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``scores summary|worst|plot`` and ``check``."""
    scores = sub.add_parser("scores", help="query the history of stored scores")
    scores_sub = scores.add_subparsers(dest="scores_command", metavar="ACTION", required=True)

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

    plot = scores_sub.add_parser(
        "plot",
        help="chart recall over time per metric (HTML page or SVG)",
        description="Chart the mean recall per metric over time, with the number of scored "
        "results per bucket, as a self-contained HTML page (.html) or an SVG image (.svg).",
    )
    _add_common(plot, metric_help="only this metric (default: every metric)")
    _add_where(plot)
    plot.add_argument(
        "--by",
        type=_attribute_name,
        default=None,
        metavar="ATTR",
        help="one line per value of this attribute (and metric), e.g. --by release",
    )
    _add_bucket(plot)
    plot.add_argument(
        "--out", required=True, metavar="FILE", help="output file: FILE.html or FILE.svg"
    )
    plot.set_defaults(handler=_piped(_cmd_plot))

    compare = scores_sub.add_parser(
        "compare",
        help="mean recall per release/environment/tag/... with 95%% intervals, each against a "
        "baseline with a verdict",
        description="For each group of traces (by --by), the number of scored traces and the "
        "mean of METRIC with its 95%% confidence interval; for each group against the baseline, "
        "the difference with its 95%% interval and a verdict: worse, better, no detectable "
        "difference, or too few traces. The interval method is named in the output.",
    )
    _add_common(compare, metric_help="the metric to compare (required)")
    compare.add_argument(
        "--by",
        required=True,
        type=_attribute_name,
        metavar="ATTR",
        help=f"group by this attribute: {', '.join(ATTRIBUTE_NAMES)}",
    )
    compare.add_argument(
        "--baseline",
        type=_stored_text,
        default=None,
        metavar="VALUE",
        help="the group the others are compared with (default: the group whose first trace "
        "in the window came first, e.g. the older release)",
    )
    _add_where(compare)
    compare.add_argument(
        "--min-traces",
        type=_positive_int,
        default=MIN_TRACES,
        metavar="N",
        help=f"groups with fewer scored traces are reported as too few (default: {MIN_TRACES})",
    )
    compare.add_argument(
        "--min-labels",
        type=_positive_int,
        default=MIN_LABELS,
        metavar="N",
        help="a group with at least N traces people labelled (recalltrace labels import) has "
        f"its mean corrected by the labels (default: {MIN_LABELS})",
    )
    _add_format(compare)
    compare.set_defaults(handler=_piped(_cmd_compare))
    register_diagnose(scores_sub)

    cost = scores_sub.add_parser(
        "cost",
        help="judge tokens and money per day, variant and judge model",
        description="Per UTC day (when the results were stored), variant and judge model: the "
        "results that called the judge, their prompt and completion tokens, and their cost in "
        "US dollars from LiteLLM's price list (results it had no price for are counted apart).",
    )
    _add_database_option(cost)
    cost.add_argument(
        "--since", default="30d", metavar="WHEN", help="stored from (default: 30d; see --help)"
    )
    cost.add_argument("--until", default=None, metavar="WHEN", help="stored until (default: now)")
    cost.add_argument(
        "--app", type=_stored_text, default=None, metavar="NAME", help="only this app"
    )
    cost.add_argument("--metric", default=None, metavar="METRIC", help="only this metric")
    _add_where(cost)
    cost.add_argument(
        "--by",
        type=_attribute_name,
        default=None,
        metavar="ATTR",
        help=f"split each day by this attribute: {', '.join(ATTRIBUTE_NAMES)}",
    )
    _add_format(cost)
    cost.set_defaults(handler=_piped(_cmd_cost))

    agree = scores_sub.add_parser(
        "agreement",
        help="how far the judge is from human labels (recalltrace labels import)",
        description="Per judge model and variant version, over the labelled traces: mean "
        "absolute error, Pearson and Spearman correlation, Cohen's kappa at --threshold with "
        "its confusion table, and the worst disagreements with the judge's reason and the "
        "labeller's note. With --judge-model, the labelled traces are also scored now by that "
        "model (nothing is stored) and its figures are shown beside the stored judge's, with "
        "the traces it could not score and what the calls cost: compare judges before "
        "switching.",
    )
    _add_database_option(agree)
    agree.add_argument("--metric", required=True, metavar="METRIC", help="the variant")
    agree.add_argument(
        "--since", default="90d", metavar="WHEN", help="traces started from (default: 90d)"
    )
    agree.add_argument("--until", default=None, metavar="WHEN", help="window end (default: now)")
    agree.add_argument(
        "--threshold",
        type=_unit_float,
        default=0.5,
        metavar="X",
        help="a score at or above X passes, for kappa and the confusion table (default: 0.5)",
    )
    agree.add_argument(
        "--worst",
        type=int_range(1, MAX_ROWS),
        default=5,
        metavar="N",
        help="disagreements shown (5)",
    )
    agree.add_argument("--format", choices=("table", "json"), default="table")
    agree.add_argument(
        "--concurrency",
        type=int_range(1, 1024),
        default=4,
        metavar="N",
        help="judge calls in flight when re-scoring with --judge-model (default: 4)",
    )
    add_judge_arguments(agree)
    agree.set_defaults(handler=_piped(_cmd_agreement))

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
        "--min",
        dest="minimum",
        default=None,
        type=_unit_float,
        metavar="X",
        help="lowest mean (required unless --compare-to is given)",
    )
    _add_where(check)
    check.add_argument(
        "--compare-to",
        type=_attribute_filter,
        default=None,
        metavar="ATTR=VALUE",
        help="also fail when the traces selected (by --where) are detectably worse than those "
        "with this attribute value, e.g. --where release=2.5.0 --compare-to release=2.4.1",
    )
    check.add_argument(
        "--min-traces",
        type=_positive_int,
        default=MIN_TRACES,
        metavar="N",
        help="with --compare-to: fail when either side has fewer scored traces "
        f"(default: {MIN_TRACES})",
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


def _nothing_hint(args: argparse.Namespace, engine: Engine) -> str:
    """Why a filtered query may have found nothing: an --app or --version that has no scores
    at all, with the names that do (and the closest one). Empty when the filters exist."""
    import difflib

    history = _history(engine)
    hints = []
    app = getattr(args, "app", None)
    if app is not None:
        apps = history.app_names()
        if app not in apps:
            close = difflib.get_close_matches(app, apps, n=1)
            known = ", ".join(inert(a) for a in apps[:10]) or "none yet"
            more = f" (and {len(apps) - 10} more)" if len(apps) > 10 else ""
            guess = f"; did you mean {inert(close[0])}?" if close else ""
            hints.append(
                f"no app {inert(app)!r} has scores; apps with scores: {known}{more}{guess}"
            )
    version = getattr(args, "metric_version", None)
    metric = getattr(args, "metric", None)
    if version is not None and metric:
        versions = history.versions_of(metric)
        if version not in versions:
            known = ", ".join(inert(v) for v in versions) or "none yet"
            hints.append(f"{metric} has no scores of version {inert(version)!r}; versions: {known}")
    return "; ".join(hints)


def _summary_rows(args: argparse.Namespace, engine: Engine) -> tuple[list[SummaryRow], str]:
    metric, version = _metric_version(args)
    since, until = _window(args)
    bounded = _data_window(engine, since, until)
    try:
        rows = _history(engine).summary(
            bucket=args.bucket,
            since=bounded[0],
            until=bounded[1],
            app=args.app,
            metric=metric,
            version=version,
            where=args.where,
            by=getattr(args, "by", None),
        )
    except ValueError as exc:  # too many groups for --by
        raise CommandError(str(exc)) from None
    return rows, _window_text(since, until)


def _cmd_summary(args: argparse.Namespace) -> int:
    with _database(args) as engine:
        rows, window = _summary_rows(args, engine)
        hint = "" if rows else _nothing_hint(args, engine)
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
        hint = "" if rows else _nothing_hint(args, engine)
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
    try:
        is_folder, parent_exists = out.is_dir(), out.parent.is_dir()
    except OSError as exc:  # a name too long for the file system, say
        raise CommandError(f"cannot write {args.out!r}: {exc.strerror or exc}") from None
    if is_folder:
        raise CommandError(f"{args.out!r} is a folder: give a file name ending in .html or .svg")
    if not parent_exists:
        raise CommandError(f"the folder of {args.out!r} does not exist")
    with _database(args) as engine:
        rows, window = _summary_rows(args, engine)
        hint = "" if rows else _nothing_hint(args, engine)
    if hint:
        print(f"recalltrace: {hint}", file=sys.stderr)
    title = f"Context recall by {args.bucket}" + (f", app {args.app}" if args.app else "")
    lines = rows
    if args.by is not None:
        title += f" and {args.by}"
        # One series per (metric, group): the legend names both.
        lines = [
            replace(r, metric=f"{r.metric} {'(none)' if r.group is None else r.group}")
            for r in rows
        ]
    svg = render_svg(lines, bucket=args.bucket, title=title, subtitle=window)
    if suffix == ".svg":
        document = '<?xml version="1.0" encoding="UTF-8"?>\n' + svg
    else:
        document = render_html(rows, svg=svg, bucket=args.bucket, title=title, subtitle=window)
    try:
        out.write_text(document, encoding="utf-8")
    except OSError as exc:
        raise CommandError(f"cannot write {args.out!r}: {exc.strerror or exc}") from None
    print(f"wrote {out} ({len(rows)} bucket rows, {window})")
    return EXIT_OK


def _compare(
    engine: Engine,
    args: argparse.Namespace,
    metric: str,
    version: str | None,
    since: Any,
    until: Any,
) -> Comparison:
    history = _history(engine)
    selection: dict[str, Any] = {
        "metric": metric,
        "by": args.by,
        "since": since,
        "until": until,
        "app": args.app,
        "version": version,
        "where": args.where,
    }
    try:
        groups = history.group_summaries(**selection)
        labelled = history.group_labels(**selection)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    if args.baseline is not None and args.baseline not in groups:
        known = ", ".join(inert(str(g)) for g in groups if g is not None) or "none"
        raise CommandError(
            f"--baseline {inert(args.baseline)!r}: no scored traces have {args.by}="
            f"{inert(args.baseline)} in the window; groups: {known}"
        )
    return compare_groups(
        groups,
        baseline=args.baseline,
        min_traces=args.min_traces,
        order=list(groups),
        labelled=labelled,
        min_labels=args.min_labels,
    )


def _cmd_compare(args: argparse.Namespace) -> int:
    metric, version = _metric_version(args)
    if metric is None:
        raise CommandError("scores compare needs --metric")
    since, until = _window(args)
    with _database(args) as engine:
        result = _compare(engine, args, metric, version, *_data_window(engine, since, until))
        hint = "" if result.groups else _nothing_hint(args, engine)
    window = _window_text(since, until)
    filters = "".join(f", {name}={value}" for name, value in args.where)
    if args.format == "json":
        document = {
            "metric": metric,
            "by": args.by,
            "window": window,
            "where": dict(args.where),
            "min_traces": args.min_traces,
            "min_labels": args.min_labels,
            **result.as_dict(),
        }
        _print_json(document)
    elif args.format == "csv":
        _print_csv(COMPARE_FIELDS, [_compare_csv_row(g) for g in result.groups])
    if hint and args.format != "table":
        print(f"recalltrace: {hint}", file=sys.stderr)
    if args.format != "table":
        return EXIT_OK
    from rich.table import Table

    console = _console()
    if not result.groups:
        console.print(
            f"No scored traces of {metric} for {window}{filters}."
            + (f" Note: {_safe(hint)}." if hint else "")
        )
        return EXIT_OK
    baseline = "(none)" if result.baseline is None else result.baseline
    table = Table(
        title=f"{metric} by {args.by}, {window}{_safe(filters)}; baseline {_safe(baseline)}",
        title_justify="left",
    )
    labelled = any(g.labels for g in result.groups)
    columns = [args.by, "traces", *(["labels"] if labelled else []), "mean", "95% CI"]
    for name in (*columns, "vs baseline", "95% CI ", "verdict"):
        table.add_column(name, justify="left" if name in (args.by, "verdict") else "right")
    methods: list[str] = []
    for g in result.groups:
        for method in (g.method, g.difference_method):
            if method and method not in methods:
                methods.append(method)
        verdict = g.verdict
        if verdict == "too few traces":
            verdict = f"too few traces (< {args.min_traces})"
        table.add_row(
            _safe("(none)" if g.group is None else g.group),
            str(g.traces),
            *([f"{g.labels}{'*' if g.corrected else ''}"] if labelled else []),
            _num(g.mean),
            _interval(g.interval),
            "-" if g.difference is None else f"{g.difference:+.3f}",
            _interval(g.difference_interval),
            verdict,
        )
    print_keyed(console, table, (args.by,))
    console.print("Intervals: " + "; ".join(methods) if methods else "")
    if labelled:
        console.print(_labels_line(result, args.min_labels))
    return EXIT_OK


def _labels_line(result: Comparison, min_labels: int) -> str:
    """Which groups people's labels corrected, and which have too few for it."""

    def name(g: GroupComparison) -> str:
        return _safe("(none)" if g.group is None else g.group)

    corrected = [
        f"{name(g)} ({g.judge_mean:.3f} by the judge alone)" for g in result.groups if g.corrected
    ]
    short = [f"{name(g)} ({g.labels})" for g in result.groups if g.labels and not g.corrected]
    parts = []
    if corrected:
        parts.append(
            "* corrected by people's labels (prediction-powered inference): " + ", ".join(corrected)
        )
    if short:
        parts.append(
            f"too few labelled traces to correct (at least {min_labels} needed): "
            + ", ".join(short)
        )
    return "\n".join(parts)


COMPARE_FIELDS = (
    "group",
    "traces",
    "mean",
    "ci95_low",
    "ci95_high",
    "method",
    "difference",
    "difference_ci95_low",
    "difference_ci95_high",
    "difference_method",
    "verdict",
    "labels",
    "corrected",
    "judge_mean",
)


def _compare_csv_row(g: GroupComparison) -> dict[str, Any]:
    interval = g.interval or (None, None)
    difference = g.difference_interval or (None, None)
    return {
        "group": g.group,
        "traces": g.traces,
        "labels": g.labels,
        "corrected": g.corrected,
        "judge_mean": g.judge_mean,
        "mean": g.mean,
        "ci95_low": interval[0],
        "ci95_high": interval[1],
        "method": g.method,
        "difference": g.difference,
        "difference_ci95_low": difference[0],
        "difference_ci95_high": difference[1],
        "difference_method": g.difference_method,
        "verdict": g.verdict,
    }


def _interval(interval: tuple[float, float] | None) -> str:
    return "-" if interval is None else f"[{interval[0]:.3f}, {interval[1]:.3f}]"


def _cmd_agreement(args: argparse.Namespace) -> int:
    from recalltrace.agreement import agreement
    from recalltrace.storage.labels import LabelStore

    metric = _metric(args.metric)
    assert metric is not None
    since, until = _window(args)
    judge = judge_config_from_args(args, args.concurrency)
    if judge is not None:
        from recalltrace.scorers.catalog import metric_info

        if not metric_info(metric).uses_llm:
            raise CommandError(
                f"{metric} does not use a judge: --judge-model re-scores an LLM variant "
                "(llm_context_recall, chunk_context_recall, judge_context_recall...)"
            )
    rescoring = None
    with _database(args) as engine:
        lower, upper = _data_window(engine, since, until)
        pairs = LabelStore(engine).agreement_pairs(metric, since=lower, until=upper)
        if judge is not None:
            rescoring = _rescore(engine, metric, judge, lower, upper, args.concurrency)
    reports = agreement(pairs, threshold=args.threshold, worst=args.worst)
    if rescoring is not None:
        for report in agreement(rescoring.pairs, threshold=args.threshold, worst=args.worst):
            report.rescored = True
            reports.append(report)
    if args.format == "json":
        document: dict[str, Any] = {"metric": metric, "reports": [r.as_dict() for r in reports]}
        if rescoring is not None:
            document["rescoring"] = rescoring.as_dict()
        _print_json(document)
        return EXIT_OK
    console = _console()
    window = _window_text(since, until)
    if rescoring is not None:
        console.print(_rescoring_line(rescoring, window))
    if not reports:
        console.print(
            f"No labelled traces of {metric} with a judge score for {window}: import labels "
            "with recalltrace labels import FILE --labeller NAME"
        )
        return EXIT_OK
    from rich.table import Table

    for r in reports:
        name = _safe(r.model or "-")
        fresh = ", re-scored now (not stored)" if r.rescored else ""
        title = f"{metric} v{_safe(r.version)}, judge {name}{fresh}: {r.labelled} labelled traces"
        table = Table(title=title, title_justify="left", show_header=False)
        table.add_column()
        table.add_column(justify="right")
        table.add_row("mean absolute error", f"{r.mae:.3f}")
        table.add_row("Pearson", _num_or_dash(r.pearson))
        table.add_row("Spearman", _num_or_dash(r.spearman))
        table.add_row(f"Cohen's kappa at {r.threshold:g}", _num_or_dash(r.kappa))
        c = r.confusion
        table.add_row(
            "judge pass / fail when labelled pass",
            f"{c['judge_pass_label_pass']} / {c['judge_fail_label_pass']}",
        )
        table.add_row(
            "judge pass / fail when labelled fail",
            f"{c['judge_pass_label_fail']} / {c['judge_fail_label_fail']}",
        )
        console.print(table)
        for p in r.worst:
            console.print(
                f"  {p.trace_id}: judge {p.score:.2f}, {_safe(p.labeller)} {p.label:.2f}\n"
                f"    judge: {_safe(p.reason)}\n    {_safe(p.labeller)}: {_safe(p.note or '-')}"
            )
    return EXIT_OK


def _rescore(
    engine: Any,
    metric: str,
    judge: Any,
    since: datetime | None,
    until: datetime | None,
    concurrency: int,
) -> Any:
    import asyncio

    from recalltrace.rescore import rescore_labelled
    from recalltrace.scorers._judge import load_judge_backend

    load_judge_backend(litellm_http=True)  # as the worker calls the judge
    return asyncio.run(
        rescore_labelled(engine, metric, judge, since=since, until=until, concurrency=concurrency)
    )


def _rescoring_line(rescoring: Any, window: str) -> str:
    """What the re-scoring rests on and cost, in one line (and one per reason not scored)."""
    scored = len({p.trace_id for p in rescoring.pairs})
    tokens = rescoring.calls_prompt_tokens + rescoring.calls_completion_tokens
    cost = "" if rescoring.cost_usd is None else f", ${rescoring.cost_usd:.4f}"
    line = (
        f"Re-scored {scored} of {rescoring.labelled_traces} labelled traces with "
        f"{_safe(rescoring.model)} for {window} ({tokens} tokens{cost}; nothing stored)"
    )
    for reason, count in rescoring.not_scored.most_common():
        line += f"\n  not scored: {count} ({_safe(reason)})"
    return line


def _num_or_dash(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _cmd_cost(args: argparse.Namespace) -> int:
    since, until = _window(args)
    with _database(args) as engine:
        bounded = _data_window(engine, since, until)
        try:
            rows = _history(engine).cost(
                since=bounded[0],
                until=bounded[1],
                app=args.app,
                metric=_metric(args.metric),
                where=args.where,
                by=args.by,
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
    if args.format == "json":
        _print_json([r.as_dict() for r in rows])
        return EXIT_OK
    if args.format == "csv":
        import dataclasses

        from recalltrace.storage.history_rows import CostRow

        fields = [f.name for f in dataclasses.fields(CostRow) if f.name not in ("by", "group")]
        if args.by is not None:
            fields.insert(1, args.by)
        _print_csv(fields, [r.as_dict() for r in rows])
        return EXIT_OK
    from rich.table import Table

    console = _console()
    window = _window_text(since, until).replace("traces started", "results stored")
    if not rows:
        console.print(f"No judge calls for {window}.")
        return EXIT_OK
    by = args.by
    title = "Judge cost by day" + ("" if by is None else f" and {by}") + f", {window}"
    table = Table(title=title, title_justify="left")
    left = ("day", *(() if by is None else (by,)), "metric", "model")
    for name in (*left, "scores", "prompt tok", "completion tok", "USD"):
        table.add_column(name, justify="left" if name in left else "right")
    for r in rows:
        money = _money(r)
        table.add_row(
            r.day.date().isoformat(),
            *(() if by is None else (_safe("(none)" if r.group is None else r.group),)),
            r.metric,
            _safe(r.model),
            str(r.scores),
            f"{r.prompt_tokens:,}",
            f"{r.completion_tokens:,}",
            money,
        )
    print_keyed(console, table, left)
    priced = [r.cost_usd for r in rows if r.cost_usd is not None]
    tokens = sum(r.prompt_tokens + r.completion_tokens for r in rows)
    total = f"{sum(priced):.4f} USD" if priced else "unknown USD"
    unpriced = sum(r.unpriced for r in rows)
    console.print(
        f"Total: {tokens:,} tokens, {total}"
        + (f"; {unpriced} result(s) without a cost: {_NO_COST}" if unpriced else "")
    )
    return EXIT_OK


# Why a result has no cost: the storage counts both cases as one number.
_NO_COST = (
    "those that made no judge call (skipped before asking it, e.g. no reference yet) and those "
    "whose model LiteLLM's price list does not price"
)


def _money(r: Any) -> str:
    """The USD cell of a cost row: a row whose results made no judge call says so."""
    if not r.prompt_tokens and not r.completion_tokens and r.cost_usd is None:
        return "no judge call"
    money = "unknown" if r.cost_usd is None else f"{r.cost_usd:.4f}"
    if r.cost_usd is not None and r.unpriced:
        money += f" (+{r.unpriced} without a cost)"
    return money


def _check_compare(
    engine: Engine,
    args: argparse.Namespace,
    metric: str,
    version: str | None,
    since: Any,
    until: Any,
) -> tuple[bool, str]:
    """``check --compare-to``: whether the traces selected by ``--where`` are not detectably
    worse than the reference ones, and the line saying so."""
    name, reference = args.compare_to
    candidates = [value for key, value in args.where if key == name]
    if len(candidates) != 1:
        raise CommandError(
            f"--compare-to {name}={reference} needs the traces to check named by the same "
            f"attribute: add --where {name}=VALUE"
        )
    candidate = candidates[0]
    history = _history(engine)
    lower, upper = _data_window(engine, since, until)
    selection: dict[str, Any] = {
        "metric": metric,
        "by": name,
        "since": lower,
        "until": upper,
        "app": args.app,
        "version": version,
        "where": [(key, value) for key, value in args.where if key != name],
    }
    try:
        groups = history.group_summaries(**selection)
        labelled = history.group_labels(**selection)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    mine_count, their_count = (
        groups[value].count if value in groups else 0 for value in (candidate, reference)
    )
    if min(mine_count, their_count) < args.min_traces:
        return False, (
            f"FAIL {metric}: too few scored traces to compare {name}={candidate} "
            f"({mine_count}) with {name}={reference} ({their_count}) for "
            f"{_window_text(since, until)}; --min-traces {args.min_traces} each"
        )
    result = compare_groups(
        {value: groups[value] for value in (reference, candidate)},
        baseline=reference,
        min_traces=args.min_traces,
        labelled=labelled,
    )
    pair = {g.group: g for g in result.groups}
    mine, theirs = pair[candidate], pair[reference]
    low, high = mine.difference_interval or (0.0, 0.0)
    text = (
        f"{metric} {name}={candidate}: mean {mine.mean:.4f} over {mine.traces} traces vs "
        f"{theirs.mean:.4f} over {theirs.traces} for {name}={reference}; difference "
        f"{(mine.difference or 0.0):+.4f}, 95% CI [{low:.4f}, {high:.4f}] "
        f"({mine.difference_method})"
    )
    if mine.corrected and theirs.corrected:
        text += (
            f"; corrected by {mine.labels} and {theirs.labels} labelled traces (the judge alone: "
            f"{mine.judge_mean:.4f} vs {theirs.judge_mean:.4f})"
        )
    if mine.verdict == "worse":
        return False, f"FAIL {text}: detectably worse"
    return True, f"OK {text}: {mine.verdict}"


def _cmd_check(args: argparse.Namespace) -> int:
    metric, version = _metric_version(args)
    assert metric is not None  # --metric is required
    if args.minimum is None and args.compare_to is None:
        raise CommandError("check needs --min X, --compare-to ATTR=VALUE, or both")
    since, until = _window(args)
    if args.compare_to is not None:
        with _database(args) as engine:
            ok, line = _check_compare(engine, args, metric, version, since, until)
        print(line, file=sys.stdout if ok else sys.stderr)
        if not ok:
            return EXIT_CHECK_FAILED
        if args.minimum is None:
            return EXIT_OK
    elif args.where:
        raise CommandError(
            "--where selects the traces of --compare-to; --min checks every trace of the window"
        )
    with _database(args) as engine:
        bounded = _data_window(engine, since, until)
        stats = _history(engine).window(
            metric=metric, since=bounded[0], until=bounded[1], app=args.app, version=version
        )
        hint = _nothing_hint(args, engine) if stats.count < args.min_count else ""
    scope = _window_text(since, until) + (f", app {args.app}" if args.app else "")
    if version is not None:
        scope += f", version {version}"
    if stats.count < args.min_count or stats.mean is None:
        print(
            f"FAIL {metric}: {stats.count} scored traces for {scope}, fewer than the "
            f"{args.min_count} required ({stats.skipped} skipped, {stats.failed} failed)"
            + (f"; {hint}" if hint else ""),
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
