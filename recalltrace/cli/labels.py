"""``recalltrace labels import``: human labels from CSV or JSON Lines.

Each row names a trace (``trace_id``), a variant (``metric``, or ``--metric`` for all), a
score in [0, 1] (``value``), and optionally ``note`` and, in JSON Lines, ``claims`` (per-claim
verdicts). The file is checked whole before anything is stored: one bad row is one line naming
it, and nothing is imported. What people typed (note, labeller, the claims' text) is scrubbed
with the scrubbing the environment configures (``RECALLTRACE_SCRUBBING=0`` stores it as typed),
as the tracer scrubs records.
"""

from __future__ import annotations

import argparse
import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recalltrace.cli._args import (
    EXIT_OK,
    CommandError,
    _add_database_option,
    _database,
    _metric,
    _piped,
    _stored_text,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``labels import``."""
    labels = sub.add_parser("labels", help="human labels to measure the judge against")
    labels_sub = labels.add_subparsers(dest="labels_command", metavar="ACTION", required=True)
    importer = labels_sub.add_parser(
        "import",
        help="import labels from a CSV or JSON Lines file",
        description="Import human labels: CSV with a header row (trace_id, metric, value, "
        "note) or JSON Lines (the same keys, plus claims: per-claim verdicts). A label replaces "
        "the same labeller's earlier label of the trace and variant. The file is checked whole "
        "first: a bad row is reported by line and nothing is imported.",
    )
    _add_database_option(importer)
    importer.add_argument("file", metavar="FILE", help="FILE.csv or FILE.jsonl")
    importer.add_argument(
        "--labeller", required=True, type=_stored_text, metavar="NAME", help="who labelled"
    )
    importer.add_argument(
        "--metric", default=None, metavar="METRIC", help="the variant of rows that name none"
    )
    importer.set_defaults(handler=_piped(_cmd_import))


def _rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CommandError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise CommandError(f"{path} is not UTF-8 text") from None
    if path.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        rows = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CommandError(f"{path} line {number}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise CommandError(f"{path} line {number}: expected a JSON object")
            rows.append((number, row))
        return rows
    reader = csv.DictReader(text.splitlines())
    if not reader.fieldnames or "trace_id" not in reader.fieldnames:
        raise CommandError(
            f"{path}: expected a CSV header row with trace_id, value (and metric, note), or a "
            ".jsonl file"
        )
    return [(number, dict(row)) for number, row in enumerate(reader, start=2)]


def _scrubbing() -> Callable[[Any, str], Any]:
    """Scrubs a label's text (strings inside lists and dicts too) with the scrubbing options
    of the environment, as ``configure()`` reads them; the identity when scrubbing is off."""
    from recalltrace.tracer._config import TracerConfig
    from recalltrace.tracer._scrub import build_scrubber

    scrubber = build_scrubber(TracerConfig.from_env().scrubbing)
    if scrubber is None:
        return lambda value, where: value
    return lambda value, where: scrubber.scrub_value(value, where, None)


def _cmd_import(args: argparse.Namespace) -> int:
    from recalltrace.storage.labels import LabelInput, LabelStore

    path = Path(args.file)
    default_metric = _metric(args.metric)
    scrub = _scrubbing()
    labeller = scrub(args.labeller, "labeller")
    labels = []
    for number, row in _rows(path):
        where = f"{path} line {number}"
        metric = row.get("metric") or default_metric
        if not metric:
            raise CommandError(f"{where}: no metric (add a metric column or --metric)")
        metric = _metric(str(metric))
        raw = row.get("value")
        try:
            value = float(raw) if not isinstance(raw, bool) and raw not in (None, "") else None
        except (TypeError, ValueError):
            value = None
        if value is None:
            raise CommandError(f"{where}: value {raw!r} is not a number in [0, 1]")
        claims = row.get("claims")
        if claims is not None and not isinstance(claims, list):
            raise CommandError(f"{where}: claims must be a list of per-claim verdicts")
        label = LabelInput(
            trace_id=str(row.get("trace_id") or "").strip().lower().replace("-", ""),
            metric=str(metric),
            value=value,
            labeller=labeller,
            note=None if row.get("note") in (None, "") else scrub(str(row["note"]), "note"),
            claims=None if claims is None else scrub(claims, "claims"),
        )
        problem = label.problem()
        if problem is not None:
            raise CommandError(f"{where}: {problem}; nothing was imported")
        labels.append(label)
    if not labels:
        raise CommandError(f"{path} holds no labels")
    with _database(args) as engine:
        try:
            count = LabelStore(engine).write(labels)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
    print(f"imported {count} label(s) by {labeller} from {path}")
    return EXIT_OK
