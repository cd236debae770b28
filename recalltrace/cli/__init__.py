"""The ``recalltrace`` command line.

Every subcommand imports what it needs when it runs, so ``recalltrace --help`` stays fast and
the tracer's import path stays light. Errors a user can fix (a wrong database URL, an
un-migrated database, a bad argument) end in one clear line and exit code 2, not a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2


class CommandError(Exception):
    """A problem the user can fix; printed as one line without a traceback."""


Handler = Callable[[argparse.Namespace], int]


def _add_database_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url",
        metavar="URL",
        default=None,
        help="database URL (default: $RECALLTRACE_DATABASE_URL or sqlite:///./recalltrace.db)",
    )


def _cmd_db_upgrade(args: argparse.Namespace) -> int:
    from recalltrace.storage.db import redact_url, resolve_database_url
    from recalltrace.storage.migrate import current_revision, upgrade

    url = resolve_database_url(args.database_url)
    upgrade(url, args.revision)
    print(f"{redact_url(url)}: at revision {current_revision(url)}")
    return EXIT_OK


def _cmd_db_current(args: argparse.Namespace) -> int:
    from recalltrace.storage.db import redact_url, resolve_database_url
    from recalltrace.storage.migrate import current_revision, head_revision

    url = resolve_database_url(args.database_url)
    current = current_revision(url)
    head = head_revision()
    if current is None:
        print(f"{redact_url(url)}: not migrated (run `recalltrace db upgrade`); head is {head}")
        return EXIT_CHECK_FAILED
    state = "up to date" if current == head else f"behind head {head}"
    print(f"{redact_url(url)}: at revision {current} ({state})")
    return EXIT_OK if current == head else EXIT_CHECK_FAILED


def _cmd_db_prune(args: argparse.Namespace) -> int:
    from datetime import datetime, timezone

    from sqlalchemy import func, select

    from recalltrace.storage.db import redact_url, resolve_database_url
    from recalltrace.storage.history import TimeSpecError, parse_duration
    from recalltrace.storage.models import Trace
    from recalltrace.storage.repository import open_repository

    try:
        age = parse_duration(args.older_than)
    except TimeSpecError as exc:
        raise CommandError(str(exc)) from None
    cutoff = datetime.now(timezone.utc) - age
    url = resolve_database_url(args.database_url)
    repo = open_repository(url, create_schema=False)
    try:
        if not args.yes:
            with repo.engine.connect() as conn:
                count = conn.scalar(
                    select(func.count()).select_from(Trace).where(Trace.started_at < cutoff)
                )
            print(
                f"{redact_url(url)}: {count} traces started before "
                f"{cutoff:%Y-%m-%d %H:%M} UTC would be deleted with their contexts, jobs and "
                "scores; run again with --yes to delete them"
            )
            return EXIT_OK
        deleted = repo.delete_traces_before(cutoff)
    finally:
        repo.dispose()
    print(
        f"{redact_url(url)}: deleted {deleted} traces started before {cutoff:%Y-%m-%d %H:%M} UTC "
        "with their contexts, jobs and scores"
    )
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from recalltrace.demo import run_demo

    return run_demo(args)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="recalltrace",
        description="Context-recall monitoring for production RAG: traces, scores, history.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more detail")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    db = sub.add_parser("db", help="database schema migrations and retention")
    db_sub = db.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    up = db_sub.add_parser("upgrade", help="migrate the database to the newest schema")
    _add_database_option(up)
    up.add_argument("--revision", default="head", help="target revision (default: head)")
    up.set_defaults(handler=_cmd_db_upgrade)
    cur = db_sub.add_parser("current", help="show the schema revision of the database")
    _add_database_option(cur)
    cur.set_defaults(handler=_cmd_db_current)
    prune = db_sub.add_parser(
        "prune", help="delete traces older than a duration, with their jobs and scores"
    )
    _add_database_option(prune)
    prune.add_argument("--older-than", required=True, metavar="DURATION", help="e.g. 90d, 12w, 36h")
    prune.add_argument(
        "--yes", action="store_true", help="delete (without it, only say how many would go)"
    )
    prune.set_defaults(handler=_cmd_db_prune)

    demo = sub.add_parser(
        "demo", help="run a small traced RAG app on the embedded database and score it"
    )
    _add_database_option(demo)
    from recalltrace.demo import add_demo_arguments

    add_demo_arguments(demo)
    demo.set_defaults(handler=_cmd_demo)

    from recalltrace.cli._history import register_history_commands

    register_history_commands(sub)
    from recalltrace.cli.worker import register_worker_commands

    register_worker_commands(sub)

    return parser


def _friendly(exc: BaseException) -> str | None:
    """A one-line message for errors a user can fix, or None for real bugs."""
    from recalltrace.storage.db import DatabaseURLError

    if isinstance(exc, (CommandError, DatabaseURLError)):
        return str(exc)
    try:
        from sqlalchemy.exc import OperationalError, ProgrammingError
    except ImportError:  # pragma: no cover - SQLAlchemy is a dependency
        return None
    if isinstance(exc, OperationalError):
        detail = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        if "no such table" in detail or ("does not exist" in detail and "relation" in detail):
            return "the database is not migrated: run `recalltrace db upgrade` first"
        return f"cannot reach the database: {detail}"
    if isinstance(exc, ProgrammingError):
        detail = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        if "does not exist" in detail:
            return "the database is not migrated: run `recalltrace db upgrade` first"
        return f"database error: {detail}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``recalltrace`` command."""
    import logging

    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.version:
        from importlib.metadata import version

        print(f"recalltrace {version('recalltrace')}")
        return EXIT_OK
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        message = _friendly(exc)
        if message is None:
            raise
        from recalltrace.storage.db import redact_url

        url = getattr(args, "database_url", None)
        if url:
            message = message.replace(url, redact_url(url))
        print(f"recalltrace: error: {message}", file=sys.stderr)
        return EXIT_USAGE
