"""``recalltrace scores cost``: judge tokens and money per day, variant and judge model."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from recalltrace.cli._args import (
    ATTRIBUTE_NAMES,
    EXIT_OK,
    CommandError,
    _add_database_option,
    _add_format,
    _add_where,
    _attribute_name,
    _data_window,
    _database,
    _history,
    _metric,
    _piped,
    _stored_text,
    _window,
)
from recalltrace.cli._render import (
    _console,
    _print_csv,
    _print_json,
    _safe,
    _window_text,
    print_keyed,
)

if TYPE_CHECKING:
    pass


def register(scores_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``scores cost``."""
    cost = scores_sub.add_parser(
        "cost",
        help="judge tokens and money per day, variant and judge model",
        description="Per UTC day (when the results were stored), variant and judge model: the "
        "results that called the judge, their prompt and completion tokens, and their cost in "
        "US dollars from LiteLLM's price list (results it had no price for are counted apart).",
    )
    _add_database_option(cost)
    cost.add_argument(
        "--since",
        default="30d",
        metavar="WHEN",
        help="stored from: a duration before now (1d, 30d) or an ISO timestamp "
        "(2026-11-01); default: 30d",
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
