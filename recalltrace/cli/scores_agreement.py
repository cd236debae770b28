"""``recalltrace scores agreement``: how far the judge is from people's labels, and with
``--judge-model`` how far another judge would be."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from recalltrace.cli._args import (
    EXIT_OK,
    MAX_ROWS,
    CommandError,
    _add_database_option,
    _data_window,
    _database,
    _metric,
    _piped,
    _unit_float,
    _window,
    int_range,
)
from recalltrace.cli._render import (
    _console,
    _print_json,
    _safe,
    _window_text,
)
from recalltrace.cli.worker import add_judge_arguments, judge_config_from_args

if TYPE_CHECKING:
    from datetime import datetime


def register(scores_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``scores agreement``."""
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
