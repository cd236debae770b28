"""``recalltrace db upgrade|current|prune``: the schema and retention."""

from __future__ import annotations

import argparse

from recalltrace.cli._args import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    CommandError,
    _add_database_option,
    check_schema,
    check_sqlite_target,
    read_only_refusal,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``db upgrade``, ``db current`` and ``db prune``."""
    db = sub.add_parser("db", help="database schema migrations and retention")
    db_sub = db.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    up = db_sub.add_parser("upgrade", help="migrate the database to the newest schema")
    _add_database_option(up)
    up.add_argument(
        "--revision",
        default="head",
        help="target revision: head (the newest) or one of this version's, e.g. 0009 "
        "(default: head)",
    )
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
    from recalltrace.storage.access import read_only
    from recalltrace.storage.db import (
        create_engine_from_url,
        redact_url,
        resolve_database_url,
    )
    from recalltrace.storage.migrate import (
        MigrationLocked,
        current_revision,
        schema_state,
        shipped_revisions,
        upgrade,
    )

    if not 0 <= args.wait < float("inf"):
        raise CommandError(f"--wait must be a number of seconds, 0 or more, got {args.wait:g}")
    url = resolve_database_url(args.database_url)
    shown = redact_url(url)
    revisions = shipped_revisions()
    if args.revision != "head" and args.revision not in revisions:
        raise CommandError(
            f"--revision {args.revision!r} is not a revision of this recalltrace: give head "
            f"(the newest, {revisions[-1]}) or one of {', '.join(revisions)}"
        )
    target = revisions[-1] if args.revision == "head" else args.revision
    check_sqlite_target(url, creating=True, into_existing=args.into_existing)
    engine = create_engine_from_url(url)
    try:
        state = schema_state(engine)
        if state.state == "newer":
            raise CommandError(
                f"{shown} is at schema revision {state.revision}, newer than this recalltrace "
                f"knows (its newest is {state.head}): a newer recalltrace migrated it; upgrade "
                "recalltrace to use it (this one cannot downgrade it)"
            )
        at = revisions.index(state.revision) if state.revision is not None else -1
        if at > revisions.index(target):
            raise CommandError(
                f"{shown} is at schema revision {state.revision}, past --revision {target}: "
                "db upgrade never goes back"
            )
        if at < revisions.index(target) and read_only(engine):
            raise CommandError(read_only_refusal("db upgrade"))
    finally:
        engine.dispose()
    try:
        # The migration command: Alembic's own lines are shown with --verbose, as they were.
        upgrade(url, target, wait=args.wait, quiet=False, into_existing=args.into_existing or None)
    except MigrationLocked as exc:
        raise CommandError(f"{shown}: {exc}") from None
    print(f"{shown}: at revision {current_revision(url)}")
    return EXIT_OK


def _cmd_db_current(args: argparse.Namespace) -> int:
    from recalltrace.storage.db import redact_url, resolve_database_url
    from recalltrace.storage.migrate import current_revision, head_revision, shipped_revisions

    url = resolve_database_url(args.database_url)
    check_sqlite_target(url, creating=False, into_existing=True)
    current = current_revision(url)
    head = head_revision()
    if current is None:
        print(f"{redact_url(url)}: not migrated (run `recalltrace db upgrade`); head is {head}")
        return EXIT_CHECK_FAILED
    if current == head:
        state = "up to date"
    elif current in shipped_revisions():
        state = f"behind head {head}: run `recalltrace db upgrade`"
    else:
        state = (
            f"newer than this recalltrace, whose newest is {head}: a newer recalltrace "
            "migrated it; upgrade recalltrace"
        )
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
        check_schema(repo.engine, url, args)
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
