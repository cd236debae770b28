"""``recalltrace db upgrade|current|prune``: the schema and retention."""

from __future__ import annotations

import argparse

from recalltrace.cli._args import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    CommandError,
    _add_database_option,
    check_sqlite_target,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``db upgrade``, ``db current`` and ``db prune``."""
    db = sub.add_parser("db", help="database schema migrations and retention")
    db_sub = db.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    up = db_sub.add_parser("upgrade", help="migrate the database to the newest schema")
    _add_database_option(up)
    up.add_argument("--revision", default="head", help="target revision (default: head)")
    up.add_argument(
        "--into-existing",
        action="store_true",
        help="add recalltrace's tables to a SQLite file that already holds another "
        "application's tables (refused without it)",
    )
    up.add_argument(
        "--wait",
        type=float,
        default=300.0,
        metavar="S",
        help="seconds to wait while another process upgrades the same database (Postgres: "
        "runs started together migrate one after the other) (default: %(default)g)",
    )
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


def _cmd_db_upgrade(args: argparse.Namespace) -> int:
    from recalltrace.storage.db import redact_url, resolve_database_url
    from recalltrace.storage.migrate import MigrationLocked, current_revision, upgrade

    if not 0 <= args.wait < float("inf"):
        raise CommandError(f"--wait must be a number of seconds, 0 or more, got {args.wait:g}")
    url = resolve_database_url(args.database_url)
    check_sqlite_target(url, creating=True, into_existing=args.into_existing)
    try:
        # The migration command: Alembic's own lines are shown with --verbose, as they were.
        upgrade(url, args.revision, wait=args.wait, quiet=False)
    except MigrationLocked as exc:
        raise CommandError(f"{redact_url(url)}: {exc}") from None
    print(f"{redact_url(url)}: at revision {current_revision(url)}")
    return EXIT_OK


def _cmd_db_current(args: argparse.Namespace) -> int:
    from recalltrace.storage.db import redact_url, resolve_database_url
    from recalltrace.storage.migrate import current_revision, head_revision

    url = resolve_database_url(args.database_url)
    check_sqlite_target(url, creating=False, into_existing=True)
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

    from recalltrace._wiring import open_repository
    from recalltrace.storage.db import redact_url, resolve_database_url
    from recalltrace.storage.history import TimeSpecError, parse_duration
    from recalltrace.storage.models import Trace

    try:
        age = parse_duration(args.older_than)
    except TimeSpecError as exc:
        raise CommandError(str(exc)) from None
    cutoff = datetime.now(timezone.utc) - age
    url = resolve_database_url(args.database_url)
    check_sqlite_target(url, creating=False, into_existing=True)
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
