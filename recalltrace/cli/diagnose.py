"""``recalltrace scores diagnose``: which slices, reference documents and claims lose recall.

Prints the three sections of :func:`recalltrace.storage.diagnose.diagnose` as tables, one JSON
document or CSV (one row per finding, its section in the first column); every row names the
command that shows its traces (``scores worst --where ...`` or ``trace show ID``)."""

from __future__ import annotations

import argparse
import shlex
import sys
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from recalltrace.cli._args import (
    EXIT_OK,
    MAX_ROWS,
    CommandError,
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
    _print_csv,
    _print_json,
    _safe,
    _shorten,
    _window_text,
    inert,
    print_keyed,
)

if TYPE_CHECKING:
    from recalltrace.storage.diagnose import Diagnosis

DEFAULT_Q = 0.05
DEFAULT_MIN_COUNT = 30
DEFAULT_LIMIT = 10

CSV_FIELDS = (
    "section",
    "attribute",
    "value",
    "traces",
    "mean",
    "rest_mean",
    "difference",
    "low",
    "high",
    "q_value",
    "significant",
    "impact",
    "needed",
    "retrieved",
    "unsupported",
    "judged",
    "share",
    "reference",
    "examples",
    "drill",
)


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a rate between 0 and 1 (e.g. 0.05), got {inert(text)!r}"
        ) from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(
            f"expected a rate between 0 and 1 (e.g. 0.05), got {inert(text)!r}"
        )
    return value


def register(scores_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``scores diagnose`` to the ``scores`` command group."""
    diagnose = scores_sub.add_parser(
        "diagnose",
        help="which slices, reference documents and claims lose recall, each with the "
        "command that shows its traces",
        description="Three sections for one metric in a window. Slices: each value of a "
        "request attribute (release, environment, tag, app, service, user, session) and of "
        "the retrieved documents' metadata (document.KEY) with at most 50 values, against the "
        "rest: mean, difference with its 95% interval (Welch, Student's t), false-discovery "
        "rate controlled across every slice tested (Benjamini-Hochberg), ranked by impact "
        "(traces x recall lost); only the significant ones below the rest unless --all. "
        "Missed references (id_based_context_recall, non_llm_context_recall): each reference "
        "document or context needed and not retrieved, the most missed first. Unsupported "
        "claims (llm_context_recall): the claims the retrieved contexts most often did not "
        "support.",
    )
    _add_common(
        diagnose,
        metric_help="the metric to diagnose (e.g. id_based_context_recall)",
        metric_required=True,
    )
    _add_where(diagnose)
    diagnose.add_argument(
        "--q",
        type=_rate,
        default=DEFAULT_Q,
        metavar="RATE",
        help=f"false-discovery rate of the slices named (default: {DEFAULT_Q})",
    )
    diagnose.add_argument(
        "--min-count",
        type=int_range(2, 1_000_000),
        default=DEFAULT_MIN_COUNT,
        metavar="N",
        help="slices (or their rests) with fewer scored traces are not tested "
        f"(default: {DEFAULT_MIN_COUNT})",
    )
    diagnose.add_argument(
        "--all",
        dest="all_slices",
        action="store_true",
        help="every slice tested, significant or not, better or worse",
    )
    diagnose.add_argument(
        "--limit",
        type=int_range(1, MAX_ROWS),
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"rows per section (default: {DEFAULT_LIMIT})",
    )
    _add_format(diagnose)
    diagnose.set_defaults(handler=_piped(_cmd_diagnose))


def _iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Drill:
    """The commands that show a row's traces, with the diagnosis' own window and filters."""

    def __init__(self, args: argparse.Namespace, since: datetime | None, until: datetime | None):
        common = []
        if args.database_url is not None:
            from recalltrace.storage.db import redact_url

            common += ["--database-url", redact_url(args.database_url)]
        self.common = common
        window = ["--metric", args.metric]
        if args.metric_version is not None:
            window += ["--metric-version", args.metric_version]
        if since is not None:
            window += ["--since", _iso(since)]
        if until is not None:
            window += ["--until", _iso(until)]
        if args.app is not None:
            window += ["--app", args.app]
        self.window = window

    def worst(self, where: Any) -> str:
        filters = [part for name, value in where for part in ("--where", f"{name}={value}")]
        return self._join(["recalltrace", "scores", "worst", *self.window, *filters])

    def trace(self, trace_ids: Any) -> str:
        if not trace_ids:
            return ""
        return self._join(["recalltrace", "trace", "show", trace_ids[0]])

    def _join(self, words: list[str]) -> str:
        return inert(" ".join(_quote(w) for w in [*words, *self.common]))


def _quote(word: str) -> str:
    """A shell word; one holding an invisible or look-alike character as bash's ``$'...'``
    with that character escaped, so the command reads apart from its look-alike and runs."""
    shown = visible(word)
    if shown == word:
        return shlex.quote(word)
    escaped = visible(word.replace("\\", "\\\\").replace("'", "\\'"))
    return f"$'{escaped}'"


def _cmd_diagnose(args: argparse.Namespace) -> int:
    metric, version = _metric_version(args)
    assert metric is not None  # --metric is required
    since, until = _window(args)
    with _database(args) as engine:
        lower, upper = _data_window(engine, since, until)
        try:
            found = _history(engine).diagnose(
                metric=metric,
                since=lower,
                until=upper,
                app=args.app,
                version=version,
                where=args.where,
                q=args.q,
                min_count=args.min_count,
                all_slices=args.all_slices,
                limit=args.limit,
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
    drill = _Drill(args, since, until)
    window = _window_text(since, until) + "".join(f", {n}={v}" for n, v in args.where)
    if args.format == "json":
        document = found.as_dict()
        document["window"] = window
        for row, out in zip(found.slices, document["slices"], strict=True):
            out["drill"] = (
                drill.worst(row.where)
                if row.where is not None
                else drill.trace(row.example_trace_ids)
            )
        for missed, out in zip(
            found.missed or [], document["missed_references"] or [], strict=True
        ):
            out["drill"] = drill.trace(missed.example_trace_ids)
        for claim, out in zip(
            found.claims or [], document["unsupported_claims"] or [], strict=True
        ):
            out["drill"] = drill.trace(claim.example_trace_ids)
        _print_json(document)
        return EXIT_OK
    if args.format == "csv":
        _print_csv(CSV_FIELDS, _csv_rows(found, drill))
        if not found.scored:
            print(f"recalltrace: no scored results of {metric} for {window}", file=sys.stderr)
        return EXIT_OK
    _print_tables(found, drill, window, every=args.all_slices)
    return EXIT_OK


def _csv_rows(found: Diagnosis, drill: _Drill) -> list[dict[str, Any]]:
    blank = dict.fromkeys(CSV_FIELDS)
    rows = []
    for s in found.slices:
        rows.append(
            {
                **blank,
                "section": "slice",
                "attribute": s.attribute,
                "value": s.value,
                "traces": s.count,
                "mean": s.mean,
                "rest_mean": s.rest_mean,
                "difference": s.difference,
                "low": s.interval[0],
                "high": s.interval[1],
                "q_value": s.q_value,
                "significant": s.significant,
                "impact": s.impact,
                "examples": " ".join(s.example_trace_ids),
                "drill": drill.worst(s.where)
                if s.where is not None
                else drill.trace(s.example_trace_ids),
            }
        )
    for m in found.missed or []:
        rows.append(
            {
                **blank,
                "section": "missed_reference",
                "attribute": m.kind,
                "value": m.reference,
                "needed": m.needed,
                "retrieved": m.retrieved,
                "share": m.retrieved_share,
                "low": m.interval[0],
                "high": m.interval[1],
                "examples": " ".join(m.example_trace_ids),
                "drill": drill.trace(m.example_trace_ids),
            }
        )
    for c in found.claims or []:
        rows.append(
            {
                **blank,
                "section": "unsupported_claim",
                "value": c.claim,
                "unsupported": c.unsupported,
                "judged": c.judged,
                "share": c.unsupported_share,
                "low": c.interval[0],
                "high": c.interval[1],
                "reference": c.reference,
                "examples": " ".join(c.example_trace_ids),
                "drill": drill.trace(c.example_trace_ids),
            }
        )
    return rows


def _pct(value: float) -> str:
    return f"{100 * value:.0f}%"


def _interval(interval: tuple[float, float], signed: bool = False) -> str:
    low, high = interval
    return f"[{low:+.3f}, {high:+.3f}]" if signed else f"[{_pct(low)}, {_pct(high)}]"


def _q_text(value: float) -> str:
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def _print_tables(found: Diagnosis, drill: _Drill, window: str, *, every: bool) -> None:
    from rich.table import Table

    console = _console()
    head = f"{found.metric} (version {_safe(found.version)}), {_safe(window)}"
    if not found.scored:
        console.print(f"No scored results of {head}.", soft_wrap=True)
        return
    console.print(
        f"[bold]Diagnosis of {head}[/]: {found.scored:,} scored traces, mean {found.mean:.3f}",
        soft_wrap=True,
    )
    # -- slices
    console.print(f"\n[bold]Slices[/]: {_safe(found.clustering)}.", soft_wrap=True)
    if not found.tested:
        console.print(_too_little(found), soft_wrap=True)
    else:
        console.print(
            f"{found.significant_below} of {found.tested} tested are significantly below the "
            f"rest ({found.significant - found.significant_below} above), at a false-discovery "
            f"rate of {found.q:g} (Benjamini-Hochberg).",
            soft_wrap=True,
        )
    for line in _untested(found):
        console.print(line, soft_wrap=True)
    commands: list[str] = []
    if found.slices:
        title = "Every slice tested" if every else "Slices significantly below the rest"
        table = Table(title=f"{title}, by impact", title_justify="left")
        for name in ("#", "slice", "traces", "mean", "rest", "difference [95% CI]", "q", "impact"):
            table.add_column(name, justify="left" if name == "slice" else "right")
        for number, s in enumerate(found.slices, 1):
            table.add_row(
                str(number),
                _safe(visible(f"{s.attribute}={s.value}")),
                f"{s.count:,}",
                f"{s.mean:.3f}",
                f"{s.rest_mean:.3f}",
                f"{s.difference:+.3f} {_interval(s.interval, signed=True)}",
                _q_text(s.q_value),
                f"{s.impact:.1f}",
            )
            commands.append(
                drill.worst(s.where) if s.where is not None else drill.trace(s.example_trace_ids)
            )
        print_keyed(console, table, ("#", "slice"))
        _print_commands(console, commands)
    elif found.tested:
        console.print(
            "No slice was tested." if every else "No slice is significantly below the rest."
        )
    # -- missed references
    if found.missed is not None:
        kind = "documents" if found.metric == "id_based_context_recall" else "contexts"
        console.print(
            f"\n[bold]Missed reference {kind}[/]: {found.missed_total} needed and not always "
            "retrieved"
            + (f"; the first {len(found.missed)}" if found.missed_total > len(found.missed) else "")
            + "."
        )
        if found.missed:
            table = Table(title_justify="left")
            for name in ("#", "reference", "needed by", "retrieved", "retrieved [95% CI]"):
                table.add_column(name, justify="left" if name == "reference" else "right")
            commands = []
            for number, m in enumerate(found.missed, 1):
                table.add_row(
                    str(number),
                    _safe(_shorten(m.reference, 80)),
                    f"{m.needed:,} ({_pct(m.needed_share)})",
                    f"{m.retrieved:,}",
                    f"{_pct(m.retrieved_share)} {_interval(m.interval)}",
                )
                commands.append(drill.trace(m.example_trace_ids))
            print_keyed(console, table, ("#", "reference"))
            _print_commands(console, commands)
    # -- unsupported claims
    if found.claims is not None:
        console.print(f"\n[bold]Unsupported claims[/]: the {len(found.claims)} most frequent.")
        if found.claims:
            table = Table(title_justify="left")
            for name in ("#", "claim", "unsupported", "of judged [95% CI]", "expected documents"):
                table.add_column(
                    name, justify="left" if name in ("claim", "expected documents") else "right"
                )
            commands = []
            for number, c in enumerate(found.claims, 1):
                table.add_row(
                    str(number),
                    _safe(_shorten(c.claim, 100)),
                    f"{c.unsupported:,}",
                    f"{_pct(c.unsupported_share)} of {c.judged:,} {_interval(c.interval)}",
                    _safe(", ".join(c.expected_documents) or "-"),
                )
                commands.append(drill.trace(c.example_trace_ids))
            console.print(table)
            _print_commands(console, commands)


def _too_little(found: Diagnosis) -> str:
    """The line for a window where no slice could be tested: never an all-clear."""
    return (
        f"Too little traffic to test any slice: {found.scored:,} scored traces. A slice and the "
        f"rest each need at least {found.min_count} scored traces"
        + ("" if found.clustering.startswith("traces treated") else " from two clusters or more")
        + f", so at least {found.needed:,} in all, split by an attribute. Nothing was ruled "
        "out: widen the window (--since) or lower --min-count."
    )


def _named(slices: list[tuple[str, str, int]], total: int) -> str:
    names = ", ".join(f"{_safe(visible(f'{a}={v}'))} ({n:,})" for a, v, n in slices)
    more = total - len(slices)
    return names + (f" and {more:,} more" if more > 0 else "")


def _untested(found: Diagnosis) -> list[str]:
    """What was not tested, by name, and how to test it."""
    lines = []
    if found.skipped_small:
        lines.append(
            f"Not tested, fewer than {found.min_count} traces in the slice or its rest: "
            f"{_named(found.small_slices, found.skipped_small)}; test smaller slices with "
            "--min-count N (at least 2; fewer traces, wider intervals)."
        )
    if found.skipped_one_cluster:
        lines.append(
            "Not tested, the slice or its rest within a single cluster (it cannot be told from "
            f"that user's or session's own level): "
            f"{_named(found.one_cluster_slices, found.skipped_one_cluster)}."
        )
    if found.skipped_attributes:
        listed = ", ".join(
            f"{_safe(a)} ({n:,} values)" for a, n in sorted(found.skipped_attributes.items())
        )
        lines.append(
            f"Not sliced, the clusters themselves: {listed}; see one with --where NAME=VALUE."
        )
    return lines


# Characters that print as nothing, or as another character: format characters (zero-width
# space and joiners, word joiner, soft hyphen), controls, unassigned and private-use ones,
# separators other than the space, combining marks, and what compatibility normalisation
# changes (fullwidth and mathematical letters, ligatures).
_HIDDEN_CATEGORIES = frozenset({"Cf", "Cc", "Co", "Cn", "Cs", "Zl", "Zp", "Zs", "Mn", "Me"})
_LOOKALIKE_SCRIPTS = ("CYRILLIC", "GREEK", "ARMENIAN", "CHEROKEE", "COPTIC")


def visible(text: str) -> str:
    """``text`` with every invisible or look-alike character written as its escape
    (``web\\u200b``), so two values that differ only by one never print alike. Letters of
    scripts that mimic Latin (Cyrillic, Greek, ...) are escaped in a value that also holds
    Latin letters (``tag=wеb`` with a Cyrillic e)."""
    import unicodedata

    if text.isascii():
        return text
    latin = any("a" <= c.lower() <= "z" for c in text)
    out = []
    for c in text:
        if c.isascii():
            out.append(c)
            continue
        hidden = (unicodedata.category(c) in _HIDDEN_CATEGORIES) or (
            unicodedata.normalize("NFKC", c) != c
        )
        lookalike = latin and unicodedata.name(c, "").startswith(_LOOKALIKE_SCRIPTS)
        if hidden or lookalike:
            code = ord(c)
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
        else:
            out.append(c)
    return "".join(out)


def _print_commands(console: Any, commands: list[str]) -> None:
    console.print("See the traces:")
    for number, command in enumerate(commands, 1):
        console.print(f"  {number}. {_safe(command)}", soft_wrap=True)
