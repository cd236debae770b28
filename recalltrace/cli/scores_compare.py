"""``recalltrace scores compare``: mean recall per group (release, environment, ...) with
its interval, each group against a baseline with a verdict."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from recalltrace.cli._args import (
    ATTRIBUTE_NAMES,
    EXIT_OK,
    CommandError,
    _add_common,
    _add_format,
    _add_where,
    _attribute_name,
    _data_window,
    _database,
    _history,
    _metric_version,
    _piped,
    _positive_int,
    _stored_text,
    _window,
)
from recalltrace.cli._render import (
    _console,
    _num,
    _print_csv,
    _print_json,
    _safe,
    _window_text,
    inert,
    print_keyed,
)
from recalltrace.cli._scores_query import nothing_hint
from recalltrace.compare import MIN_LABELS, MIN_TRACES, compare_groups

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from recalltrace.compare import Comparison, GroupComparison


def register(scores_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``scores compare``."""
    compare = scores_sub.add_parser(
        "compare",
        help="mean recall per release/environment/tag/... with 95%% intervals, each against a "
        "baseline with a verdict",
        description="For each group of traces (by --by), the number of scored traces and the "
        "mean of METRIC with its 95% confidence interval; for each group against the baseline, "
        "the difference with its 95% interval and a verdict: worse, better, no detectable "
        "difference, or too few traces. The interval method is named in the output.",
    )
    _add_common(compare, metric_help="the metric to compare", metric_required=True)
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


def _compare(
    engine: Engine,
    args: argparse.Namespace,
    metric: str,
    version: str | None,
    since: Any,
    until: Any,
) -> Comparison:
    from recalltrace.storage.diagnose_clusters import group_clusters

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
        clusters = group_clusters(history, **selection)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    if args.baseline is not None and args.baseline not in groups:
        known = ", ".join(inert(str(g)) for g in groups if g is not None) or "none"
        raise CommandError(
            f"--baseline {inert(args.baseline)!r}: no scored traces have {args.by}="
            f"{inert(args.baseline)} in the window; groups: {known}"
        )
    result = compare_groups(
        groups,
        baseline=args.baseline,
        min_traces=args.min_traces,
        order=list(groups),
        labelled=labelled,
        min_labels=args.min_labels,
        clusters=clusters,
    )
    return result


def _cmd_compare(args: argparse.Namespace) -> int:
    metric, version = _metric_version(args)
    assert metric is not None  # --metric is required
    since, until = _window(args)
    with _database(args) as engine:
        result = _compare(engine, args, metric, version, *_data_window(engine, since, until))
        hint = "" if result.groups else nothing_hint(args, engine)
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
    if result.clustering:
        console.print(f"Differences: {_safe(result.clustering)}.")
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
