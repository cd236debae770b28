"""``recalltrace trace show``: one stored trace with every score and its evidence."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from recalltrace._readings import DETAIL_ORDER as _DETAIL_ORDER
from recalltrace._readings import context_matches as _context_matches
from recalltrace._readings import reference_ranks
from recalltrace.cli._args import (
    EXIT_OK,
    CommandError,
    _add_database_option,
    _database,
    _history,
    _piped,
    _stored_text,
    int_range,
)
from recalltrace.cli._render import (
    _console,
    _label,
    _num,
    _plain,
    _print_json,
    _records_table,
    _safe,
    _shorten,
    _when,
)

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from recalltrace.storage.history import ScoreDetail, TraceDetail


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``trace show``."""
    trace = sub.add_parser("trace", help="inspect one stored trace")
    trace_sub = trace.add_subparsers(dest="trace_command", metavar="ACTION", required=True)
    show = trace_sub.add_parser(
        "show",
        help="a trace's question, contexts, answer, reference and every score with evidence",
    )
    _add_database_option(show)
    show.add_argument(
        "trace_id",
        type=_stored_text,
        metavar="TRACE_ID",
        help="the trace's 32 hex digits (dashes allowed), the first 8 or more of them, or the "
        "OpenTelemetry trace id of a one-request trace",
    )
    show.add_argument("--format", choices=("table", "json"), default="table", help="output format")
    show.add_argument(
        "--max-chars",
        type=int_range(0, 10_000_000),
        default=800,
        metavar="N",
        help="shorten each context to N characters in tables (0: never; default: 800)",
    )
    show.set_defaults(handler=_piped(_cmd_trace_show))


def _cmd_trace_show(args: argparse.Namespace) -> int:
    from recalltrace.storage.repository import TraceNotFound

    trace_id = args.trace_id.strip().lower().removeprefix("0x").replace("-", "")
    if not trace_id or any(c not in "0123456789abcdef" for c in trace_id) or len(trace_id) > 32:
        raise CommandError(
            f"{args.trace_id!r} is not a trace id: give the 32 hex digits (dashes allowed), "
            "or at least the first 8 of them"
        )
    if len(trace_id) < 8:
        raise CommandError(f"{args.trace_id!r} is too short: give at least 8 hex digits")
    with _database(args) as engine:
        history = _history(engine)
        if len(trace_id) < 32:
            matches = history.record_ids_starting_with(trace_id)
            if not matches:
                raise CommandError(f"no trace is stored with an id starting {trace_id}")
            if len(matches) > 1:
                raise CommandError(
                    f"{len(matches)}{'+' if len(matches) == 20 else ''} traces start with "
                    f"{trace_id}: {', '.join(matches[:5])}{' ...' if len(matches) > 5 else ''}; "
                    "give more digits"
                )
            trace_id = matches[0]
        try:
            detail = history.trace(trace_id)
        except TraceNotFound as exc:
            raise CommandError(str(exc)) from None
    if args.format == "json":
        document = detail.as_dict()
        document["reference_retrieval"] = [
            {"id": doc, "retrieved": rank is not None, "rank": rank}
            for doc, rank in reference_ranks(detail)
        ]
        _print_json(document)
        return EXIT_OK
    _render_trace(_console(), detail, max_chars=args.max_chars)
    return EXIT_OK


def _render_trace(console: Console, detail: TraceDetail, *, max_chars: int) -> None:
    from rich.panel import Panel
    from rich.table import Table

    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("trace", detail.trace_id)
    if detail.otel_trace_id:
        head.add_row(
            "OpenTelemetry",
            f"trace {detail.otel_trace_id}, span {detail.otel_span_id or '(unknown)'}",
        )
    head.add_row("app", _safe(f"{detail.app_name} (service {detail.service_name})"))
    head.add_row("started", f"{_when(detail.started_at)}, took {detail.duration_ms:.0f} ms")
    for name, value in detail.attributes.items():
        shown = ", ".join(value) if isinstance(value, list) else str(value)
        head.add_row(name.replace("_", " "), _safe(shown))
    if detail.error:
        head.add_row("error", "the traced function raised")
    for note in detail.notes:
        head.add_row("note", _safe(note))
    if detail.metadata:
        head.add_row("metadata", _safe(json.dumps(dict(detail.metadata), ensure_ascii=False)))
    console.print(Panel(head, title="Trace", title_align="left"))

    def text_panel(title: str, value: str | None) -> None:
        body = "(none)" if value is None else _safe(value) or "(empty)"
        console.print(Panel(body, title=title, title_align="left"))

    text_panel("Question", detail.user_input)

    contexts = Table(title="Retrieved contexts", title_justify="left", show_lines=True)
    contexts.add_column("#", justify="right")
    contexts.add_column("id")
    contexts.add_column("retriever score", justify="right")
    contexts.add_column("content", ratio=1)
    for c in detail.contexts:
        content = _safe(_shorten(c.content, max_chars))
        if c.metadata:
            # The document's own metadata (source, page, section...), as the JSON output has it.
            shown = json.dumps(dict(c.metadata), ensure_ascii=False, default=str)
            content += "\n[dim]metadata " + _safe(_shorten(shown, max_chars)) + "[/]"
        contexts.add_row(str(c.position), _safe(c.context_id or "-"), _num(c.score), content)
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
        ref.add_row("answer", "(none)" if reference is None else _safe(reference))
        matched = _context_matches(detail)
        if detail.reference_contexts is not None:
            for i, ctx in enumerate(detail.reference_contexts):
                mark = "" if matched is None else f" [bold]({matched.get(i, 'not matched')})[/]"
                ref.add_row(f"context {i}", _safe(_shorten(ctx, max_chars)) + mark)
        if detail.reference_context_ids is not None:
            if not detail.reference_context_ids:
                ref.add_row("context ids", "(none)")
            for doc, rank in reference_ranks(detail):
                where = (
                    "NOT retrieved" if rank is None else f"retrieved at rank {rank} (#{rank - 1})"
                )
                ref.add_row("context id", f"{_safe(doc)}  [bold]{where}[/]")
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
            jobs.add_row(j.metric, status, str(j.attempts), _safe(j.last_error or "-"))
        console.print(jobs)
    if not detail.scores and not pending:
        console.print("No scores and no scoring jobs are stored for this trace.")


def _score_panel(score: ScoreDetail) -> RenderableType:
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table

    parts: list[RenderableType] = [_safe(score.reason)]
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
            facts.add_row(_safe(_label(key)), _safe(_plain(value)))
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
    facts.add_row("scoring", _safe(", ".join(accounting)))
    parts.append(facts)
    value = "" if score.value is None else f" {score.value:.3f}"
    title = f"{score.metric} v{score.version}: {score.status}{value}"
    return Panel(Group(*parts), title=_safe(title), title_align="left")
