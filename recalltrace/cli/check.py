"""``recalltrace check``: exit 1 when a metric's mean falls below a threshold, or when the
selected traces are detectably worse than others (for cron and CI)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from recalltrace.cli._args import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    CommandError,
    _add_database_option,
    _add_version,
    _add_where,
    _attribute_filter,
    _data_window,
    _database,
    _history,
    _metric_version,
    _piped,
    _positive_int,
    _stored_text,
    _unit_float,
    _window,
)
from recalltrace.cli._render import (
    _window_text,
    inert,
)
from recalltrace.cli._scores_query import nothing_hint
from recalltrace.compare import MIN_TRACES, compare_groups

if TYPE_CHECKING:
    from sqlalchemy import Engine


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``check``."""
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
        help="lowest mean of the traces selected by --where (all of the window's without it); "
        "required unless --compare-to is given",
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
        "--since",
        default="1h",
        metavar="WHEN",
        help="window start: a duration before now (30m, 1h, 7d) or an ISO timestamp "
        "(2026-11-01T10:00:00Z); default: 1h",
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
    from recalltrace.storage.diagnose_clusters import group_clusters

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
        clusters = group_clusters(history, **selection)
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
        clusters=clusters,
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
    if mine.verdict == "too few traces":
        return False, f"FAIL {text}: cannot be judged"
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
    with _database(args) as engine:
        bounded = _data_window(engine, since, until)
        stats = _history(engine).window(
            metric=metric,
            since=bounded[0],
            until=bounded[1],
            app=args.app,
            version=version,
            where=args.where,
        )
        hint = nothing_hint(args, engine) if stats.count < args.min_count else ""
    scope = _window_text(since, until) + (f", app {args.app}" if args.app else "")
    if version is not None:
        scope += f", version {version}"
    if args.where:
        scope += ", " + " ".join(f"{key}={inert(value)}" for key, value in args.where)
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
