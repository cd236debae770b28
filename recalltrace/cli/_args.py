"""Argument parsing shared by the command groups: option builders, value types, and the
checked reading of windows, metrics and versions (one clear line for a bad value)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from recalltrace._readings import data_window
from recalltrace._readings import read_only_refusal as read_only_refusal
from recalltrace.cli._render import _when, inert

# The window narrowed to the days holding traces (shared with the web UI: ``_readings``).
_data_window = data_window

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from recalltrace.storage.history import History

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2

Handler = Callable[[argparse.Namespace], int]


class CommandError(Exception):
    """A problem the user can fix; printed as one line without a traceback."""


def _add_database_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url",
        metavar="URL",
        default=None,
        help="database URL (default: $RECALLTRACE_DATABASE_URL or sqlite:///./recalltrace.db)",
    )


FORMATS = ("table", "json", "csv")


DEFAULT_WINDOW = "7d"


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


def _add_common(
    parser: argparse.ArgumentParser, *, metric_help: str, metric_required: bool = False
) -> None:
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
    parser.add_argument(
        "--metric", default=None, metavar="METRIC", help=metric_help, required=metric_required
    )
    _add_version(parser)


def version_misplaced(parser: argparse.ArgumentParser, extras: list[str]) -> str | None:
    """The one-line error for ``--version`` given after a command (it is recalltrace's own
    version, asked before any command), or ``None`` when ``extras`` has no ``--version``."""
    if not any(item.partition("=")[0] == "--version" for item in extras):
        return None
    own = "--version is recalltrace's own version: run `recalltrace --version`"
    has_metric_version = any("--metric-version" in a.option_strings for a in parser._actions)
    if has_metric_version:
        return f"{own}; the version of a metric is --metric-version V"
    return f"{own} (before any command)"


def _add_version(parser: argparse.ArgumentParser) -> None:
    # ``--version`` is recalltrace's own version only (``recalltrace --version``); a metric's is
    # ``--metric-version`` (its old spelling ``--version V`` is refused by ``version_misplaced``).
    parser.add_argument(
        "--metric-version",
        dest="metric_version",
        type=_stored_text,
        default=None,
        metavar="V",
        help="read version V of --metric (default: each metric's current version; the scores "
        "of other versions, kept after a backfill, are never pooled with them); not "
        "recalltrace's version, which `recalltrace --version` prints",
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


ATTRIBUTE_NAMES = ("release", "environment", "user_id", "session_id", "tag", "app", "service")


def _attribute_name(text: str) -> str:
    """A request attribute to group by."""
    if text not in ATTRIBUTE_NAMES:
        raise argparse.ArgumentTypeError(
            f"unknown attribute {text!r}; use one of: {', '.join(ATTRIBUTE_NAMES)}"
        )
    return text


def _attribute_filter(text: str) -> tuple[str, str]:
    """``name=value`` of a request attribute."""
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not value:
        raise argparse.ArgumentTypeError(
            f"expected ATTRIBUTE=VALUE (e.g. release=2.4.1), got {text!r}"
        )
    _attribute_name(name)
    return name, _stored_text(value)


def _add_where(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--where",
        type=_attribute_filter,
        action="append",
        default=[],
        metavar="ATTR=VALUE",
        help="only traces whose attribute has this value (repeat to require several); "
        f"attributes: {', '.join(ATTRIBUTE_NAMES)}",
    )


def int_range(
    low: int, high: int = _MAX_INT, *, what: str = "a whole number"
) -> Callable[[str], int]:
    """The one parser of every integer option: a whole number from ``low`` to ``high``, or one
    line naming the value and the range (never a traceback, never a value the database or the
    machine cannot hold)."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip(), 10)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {what} from {low} to {high}, got {inert(text)!r}"
            ) from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"expected {what} from {low} to {high}, got {inert(text)!r}"
            )
        return value

    parse.__name__ = f"int_{low}_{high}"
    return parse


_positive_int = int_range(1)
_non_negative_int = int_range(0)

# Most rows a listing command prints: beyond this a table is unreadable and the query slow; use
# --format csv with a narrower window to export more.
MAX_ROWS = 10_000


def _unit_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return value


_SQLITE_HEADER = b"SQLite format 3\x00"


def check_sqlite_target(url: str, *, creating: bool, into_existing: bool = False) -> None:
    """Refuse, in one line, a SQLite file recalltrace must not use: a missing file (a typo'd
    path would silently become an empty database; only ``creating`` commands make one), a file
    that is not SQLite, and another application's database (tables but no recalltrace schema;
    ``into_existing`` allows adding recalltrace's tables to it). Other URLs pass."""
    import sqlite3

    from recalltrace.storage.db import VERSION_TABLE, redact_url

    if not url.startswith("sqlite"):
        return
    from sqlalchemy.engine import make_url

    path = make_url(url).database
    if not path or path == ":memory:" or str(path).startswith("file:"):
        return
    shown = redact_url(url)
    file = Path(path)
    if not file.exists():
        if creating:
            return
        raise CommandError(
            f"no database file at {shown}: check --database-url, or create it with "
            "`recalltrace db upgrade`"
        )
    if file.is_dir():
        raise CommandError(f"{shown} is a directory, not a database file: check --database-url")
    try:
        with file.open("rb") as handle:
            header = handle.read(len(_SQLITE_HEADER))
    except OSError as exc:
        raise CommandError(f"cannot read {shown}: {exc.strerror or exc}") from None
    if not header:
        return  # an empty file is a new SQLite database
    if header != _SQLITE_HEADER:
        raise CommandError(
            f"{shown} is not a SQLite database file (or it is damaged): check --database-url"
        )
    try:
        connection = sqlite3.connect(f"file:{file}?mode=ro", uri=True)
        try:
            tables = [
                row[0]
                for row in connection.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' "
                    "AND name NOT LIKE 'sqlite_%' ORDER BY name"
                )
            ]
        finally:
            connection.close()
    except sqlite3.DatabaseError as exc:
        raise CommandError(f"{shown} cannot be read as a SQLite database ({exc})") from None
    if tables and VERSION_TABLE not in tables and not into_existing:
        listed = ", ".join(tables[:5]) + (" ..." if len(tables) > 5 else "")
        raise CommandError(
            f"{shown} holds another application's tables ({listed}) and no recalltrace schema: "
            "give recalltrace a file of its own, or add its tables to this one with "
            "`recalltrace db upgrade --into-existing`"
        )


def require_current_schema(url: str) -> None:
    """Refuse, in one line, a database whose schema is not this version's: a worker or a
    backfill on it would fail on every query, or quietly do nothing."""
    from sqlalchemy.exc import OperationalError

    from recalltrace.storage.db import create_engine_from_url, redact_url
    from recalltrace.storage.migrate import current_revision_of, head_revision, is_known_revision

    engine = create_engine_from_url(url)
    try:
        current = current_revision_of(engine)
    except OperationalError:
        return  # not reachable now: the worker waits for it and says so (not a schema problem)
    finally:
        engine.dispose()
    head = head_revision()
    if current is None:
        raise CommandError(f"{redact_url(url)} is not migrated: run `recalltrace db upgrade` first")
    if current != head and not is_known_revision(current):
        raise CommandError(
            f"{redact_url(url)} is at schema revision {current}, newer than this recalltrace "
            f"(it knows up to {head}): a newer recalltrace migrated it; run that one here"
        )
    if current != head:
        raise CommandError(
            f"{redact_url(url)} is at schema revision {current}, this recalltrace needs {head}: "
            f"run `recalltrace db upgrade --database-url {shlex.quote(redact_url(url))}`"
        )


DATABASE_WAIT_S = 300.0
"""How long a starting worker or ``collect`` waits for a database server that does not answer."""

# What a server that answered says when the URL names something it does not have: waiting
# would never help.
_REFUSALS = (
    "does not exist",
    "password authentication failed",
    "no password supplied",
    "authentication failed",
    "no pg_hba.conf entry",
    "permission denied",
)


def wait_for_database(
    url: str,
    limit_s: float,
    *,
    pause_s: float = 2.0,
    who: str = "the worker",
    create_hint: str = "or create the database, then `recalltrace db upgrade`",
) -> None:
    """Return once the database answers a query. A server that refuses the URL (no such
    database, wrong credentials) is one line at once; one that does not answer is waited for
    up to ``limit_s``, with one line a minute, then one line saying ``who`` gives up."""
    import time

    from sqlalchemy import text
    from sqlalchemy.exc import OperationalError

    from recalltrace.storage.db import create_engine_from_url, redact_url

    shown = redact_url(url)
    engine = create_engine_from_url(url)
    started = time.monotonic()
    said_at: float | None = None
    try:
        while True:
            try:
                with engine.connect() as conn:
                    conn.execute(text("SELECT 1"))
            except OperationalError as exc:
                detail = str(exc.orig if exc.orig is not None else exc).strip()
                detail = " ".join(detail.split())[:300]
                if any(refusal in detail for refusal in _REFUSALS):
                    raise CommandError(
                        f"the database at {shown} refuses {who}: {detail}; check "
                        f"--database-url ({create_hint})"
                    ) from None
                now = time.monotonic()
                waited = now - started
                if waited >= limit_s:
                    raise CommandError(
                        f"cannot reach the database at {shown} ({detail}; waited "
                        f"{waited:.0f} s); {who} did not start (--database-wait sets how "
                        "long it waits)"
                    ) from None
                if said_at is None or now - said_at >= 60:
                    print(
                        f"waiting for the database at {shown}: {detail} (a line each minute; "
                        f"giving up after {limit_s:g} s)",
                        file=sys.stderr,
                        flush=True,
                    )
                    said_at = now
                time.sleep(min(pause_s, max(limit_s - waited, 0.0)))
                continue
            if said_at is not None:
                print(f"the database at {shown} answers: starting", file=sys.stderr, flush=True)
            return
    finally:
        engine.dispose()


def command_name(args: argparse.Namespace) -> str:
    """The command as typed, without its options: ``jobs retry``, ``worker``."""
    words = [getattr(args, "command", None)]
    for dest in ("db_command", "jobs_command", "labels_command", "scores_command", "trace_command"):
        words.append(getattr(args, dest, None))
    return " ".join(str(word) for word in words if word)


# The commands that write to the database (db prune only with --yes, doctor only with
# --release-parked; db upgrade says so itself: at the newest revision it has nothing to write).
_WRITING = {"worker", "backfill", "jobs retry", "jobs cancel", "labels import", "collect"}


def writes(args: argparse.Namespace) -> bool:
    """Whether the command ``args`` were parsed for writes to the database."""
    name = command_name(args)
    return (
        name in _WRITING
        or (name == "db prune" and bool(getattr(args, "yes", False)))
        or (name == "doctor" and bool(getattr(args, "release_parked", False)))
    )


def check_schema(engine: Engine, url: str, args: argparse.Namespace) -> None:
    """The one check of the schema's revision when a command opens the database (one query,
    no Alembic). At an older revision than this version's, a command is refused in one line
    naming ``recalltrace db upgrade --database-url ...`` (reads of an older schema fail on a
    missing column or, worse, find nothing). At a revision this version does not know (a
    newer recalltrace migrated it, and this one is older), a read goes on after one line on
    stderr saying its results may be incomplete; a command that writes is refused. A
    database never migrated is left to the command (it says so in its own words)."""
    from recalltrace.storage.db import redact_url
    from recalltrace.storage.migrate import schema_state

    state = schema_state(engine)
    shown = redact_url(url)
    if state.state == "behind":
        raise CommandError(
            f"{shown} is at schema revision {state.revision}, behind this recalltrace's "
            f"{state.head}: run `recalltrace db upgrade --database-url {shown}` first"
        )
    if state.state != "newer":
        return
    newer = (
        f"{shown} is at schema revision {state.revision}, newer than this recalltrace knows "
        f"(its newest is {state.head})"
    )
    if writes(args):
        raise CommandError(
            f"{newer}: {command_name(args)} would write to a schema it does not know; "
            "upgrade recalltrace (or use the version that migrated the database)"
        )
    print(
        f"recalltrace: warning: {newer}: results may be incomplete; upgrade recalltrace to "
        "read everything it stores",
        file=sys.stderr,
        flush=True,
    )


@contextmanager
def _database(args: argparse.Namespace) -> Iterator[Engine]:
    """An engine on ``--database-url``; refuses to create a SQLite file that does not exist."""
    from recalltrace.storage.db import create_engine_from_url, resolve_database_url

    url = resolve_database_url(args.database_url)
    engine = create_engine_from_url(url)
    try:
        # SQLite would silently create an empty file for a mistyped path, or read a file that
        # is not a database; reading another application's file finds "not migrated" below.
        check_sqlite_target(url, creating=False, into_existing=True)
        check_schema(engine, url, args)
        yield engine
    finally:
        engine.dispose()


def _history(engine: Engine) -> History:
    from recalltrace._wiring import history

    return history(engine)


def _metric(value: str | None) -> str | None:
    from recalltrace.scorers.catalog import CATALOG
    from recalltrace.storage.contracts import UnknownMetric, check_metric

    if value is None:
        return None
    try:
        return check_metric(value, CATALOG)
    except UnknownMetric as exc:
        raise CommandError(str(exc)) from None


def _metric_version(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """``--metric`` and ``--metric-version``, checked by History's own rule, in the flags' words."""
    from recalltrace.scorers.catalog import current_versions
    from recalltrace.storage.history import metric_versions

    metric = _metric(args.metric)
    version: str | None = args.metric_version
    if version is not None and metric is None:
        raise CommandError("--metric-version needs --metric: versions are numbered per metric")
    try:
        metric_versions(current_versions(), metric, version)
    except ValueError as exc:
        raise CommandError(f"--metric-version: {exc}") from None
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
    if since is not None and since > now:
        raise CommandError(
            f"--since ({_when(since)}) is in the future: nothing can have been scored since then"
        )
    return since, until


def _metrics_arg(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    from recalltrace.scorers.catalog import metric_info

    keys: list[str] = []
    for value in values:
        for key in value.split(","):
            key = key.strip()
            if not key:
                continue
            try:
                metric_info(key)
            except KeyError as exc:
                raise CommandError(str(exc.args[0])) from None
            keys.append(key)
    return keys
