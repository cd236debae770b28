"""``recalltrace doctor``: per app, which fields the records captured from spans carried and
which the spans lacked (the variants needing a missing field skip those traces); traces or
queued jobs ahead of the database's clock (a host whose clock runs ahead); and, from this host's
run directory, the processes that ended without running their exit code while they held
records (killed), with how many each held."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from recalltrace.cli._args import (
    DEFAULT_WINDOW,
    EXIT_OK,
    _add_database_option,
    _database,
    _piped,
    _window,
    int_range,
)
from recalltrace.cli._render import inert, inert_json

# The records read to count fields: enough to see every app of a busy week, few enough to
# answer in seconds.
MAX_DOCTOR_RECORDS = 1_000_000

if TYPE_CHECKING:
    from sqlalchemy import Engine

FIELDS = (
    "user_input",
    "response",
    "retrieved_contexts",
    "retrieved_context_ids",
    "retrieved_context_content",
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``doctor``."""
    parser = sub.add_parser(
        "doctor",
        help="per app, which fields the records captured from spans carried and which were "
        "missing; traces and jobs ahead of the database's clock",
    )
    _add_database_option(parser)
    parser.add_argument(
        "--since", default=DEFAULT_WINDOW, help="look at records since (default: 7d)"
    )
    parser.add_argument("--until", default=None, help="and until (default: now)")
    parser.add_argument(
        "--limit",
        type=int_range(1, MAX_DOCTOR_RECORDS),
        default=10_000,
        metavar="N",
        help="look at the N most recent records at most (default: 10000, at most "
        f"{MAX_DOCTOR_RECORDS})",
    )
    parser.add_argument(
        "--run-dir",
        default=None,
        metavar="DIR",
        help="the tracer's run directory to look in for processes that ended holding records "
        "(default: $RECALLTRACE_RUN_DIR, else $XDG_RUNTIME_DIR/recalltrace, else "
        "recalltrace-<uid> in the temporary directory)",
    )
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument(
        "--release-parked",
        action="store_true",
        help="make queued jobs due more than an hour ahead of the database's clock due now",
    )
    parser.set_defaults(handler=_piped(_cmd_doctor))


def field_report(rows: list[tuple[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """``{app: {"records": n, "from_spans": n, "missing": {field: n}}}`` from
    ``(app_name, metadata)`` rows."""
    report: dict[str, dict[str, Any]] = {}
    for app, metadata in rows:
        entry = report.setdefault(
            app, {"records": 0, "from_spans": 0, "missing": dict.fromkeys(FIELDS, 0)}
        )
        entry["records"] += 1
        if not isinstance(metadata, dict) or metadata.get("captured_from") != "spans":
            continue
        entry["from_spans"] += 1
        for name in metadata.get("capture_missing") or ():
            if name in entry["missing"]:
                entry["missing"][name] += 1
    return report


def _span(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{max(1, round(seconds / 60))} min"


def clock_lines(engine: Engine, *, release_parked: bool = False) -> list[str]:
    """The clock check: traces stamped ahead of the database's clock (per app) and queued jobs
    parked far ahead, each with its count and what to do; ``release_parked`` makes those jobs
    due now."""
    from recalltrace.storage.queue import JOBS_DUE_AFTER, clock_report, release_parked_jobs

    report = clock_report(engine)
    lines = []
    for app in sorted(report.traces_ahead):
        ahead = report.traces_ahead[app]
        lines.append(
            f"clock: {ahead.count} trace(s) of {app} started ahead of the database's clock (up "
            f"to {_span(ahead.most_s)}): the clock of the host running {app} runs ahead; set it "
            "right (NTP). Their jobs are due on the database's clock; only their start times "
            "are off"
        )
    parked = report.jobs_parked
    due_after = _span(JOBS_DUE_AFTER.total_seconds())
    if parked.count and release_parked:
        released = release_parked_jobs(engine)
        lines.append(f"clock: made {released} parked job(s) due now")
    elif parked.count:
        lines.append(
            f"clock: {parked.count} queued job(s) are due more than {due_after} after the "
            f"database's now (up to {_span(parked.most_s)} ahead), parked by a clock that ran "
            "ahead; run `recalltrace doctor --release-parked` to make them due now"
        )
    if not lines:
        lines.append("clock: no trace or queued job is ahead of the database's clock")
    return lines


# The ended processes listed at most (the newest); the count says how many there were.
MAX_ENDED_SHOWN = 20


def process_lines(run_dir: str | None) -> list[str]:
    """What this host's run directory says: the processes that ended holding records (newest
    last, at most :data:`MAX_ENDED_SHOWN`), and what the running ones hold."""
    from pathlib import Path

    from recalltrace.tracer._process_ledger import (
        default_run_dir,
        ended_processes,
        live_processes,
    )

    directory = Path(run_dir) if run_dir else default_run_dir()
    ended = ended_processes(directory)
    lines = []
    if len(ended) > MAX_ENDED_SHOWN:
        lines.append(
            f"processes: {len(ended)} process(es) ended holding records; the newest "
            f"{MAX_ENDED_SHOWN}:"
        )
    for item in ended[-MAX_ENDED_SHOWN:]:
        found = f" (found by process {item.found_by} at {item.found_at})" if item.found_by else ""
        lines.append("processes: " + item.line().removeprefix("recalltrace: ") + found)
    if not ended:
        lines.append(
            f"processes: no process that kept its ledger in {directory} ended holding records"
        )
    live = live_processes(directory)
    if live:
        held = sum(pending for _, pending, _ in live)
        lines.append(
            f"processes: {len(live)} running process(es) keep their ledger in {directory}, "
            f"holding {held} record(s) not stored yet"
        )
    return lines


def _cmd_doctor(args: argparse.Namespace) -> int:
    from sqlalchemy import select

    from recalltrace.storage.models import Trace

    since, until = _window(args)
    with _database(args) as engine:
        query = select(Trace.app_name, Trace.metadata_).order_by(Trace.started_at.desc())
        if since is not None:
            query = query.where(Trace.started_at >= since)
        if until is not None:
            query = query.where(Trace.started_at < until)
        with engine.connect() as conn:
            rows = [(app, meta or {}) for app, meta in conn.execute(query.limit(args.limit))]
        clock = clock_lines(engine, release_parked=args.release_parked)
    clock = process_lines(args.run_dir) + clock
    report = field_report(rows)
    if args.format == "json":
        print(inert_json(json.dumps(report, indent=2, sort_keys=True)))
        # stdout stays one JSON object; the clock check goes to stderr.
        for line in clock:
            print(inert(line), file=sys.stderr)
        return EXIT_OK
    for line in clock:
        print(inert(line))
    if not report:
        print("no records in this window")
        return EXIT_OK
    for app in sorted(report):
        entry = report[app]
        spans = entry["from_spans"]
        print(f"{inert(app)}: {entry['records']} record(s), {spans} captured from spans")
        if not spans:
            continue
        for name in FIELDS:
            missing = entry["missing"][name]
            state = "carried by all" if not missing else f"missing in {missing} of {spans}"
            print(f"  {name:<26} {state}")
    return EXIT_OK
