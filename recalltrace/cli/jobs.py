"""``recalltrace jobs list|retry`` and ``recalltrace backfill``: the scoring jobs."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from recalltrace.cli._args import (
    EXIT_OK,
    CommandError,
    _add_database_option,
    _add_format,
    _add_job_filters,
    _database,
    _history,
    _metric,
    _metrics_arg,
    _piped,
    _positive_int,
    _stored_text,
    _window,
)
from recalltrace.cli._render import _console, _print_csv, _print_json, _safe, _short_when

if TYPE_CHECKING:
    from sqlalchemy import Engine


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``jobs list|retry`` and ``backfill``."""
    jobs = sub.add_parser("jobs", help="failed and stuck scoring jobs")
    jobs_sub = jobs.add_subparsers(dest="jobs_command", metavar="ACTION", required=True)
    jobs_list = jobs_sub.add_parser(
        "list",
        help="failed and stuck jobs, most recently changed first",
        description="Failed jobs and stuck ones: running past their lease (the worker died), "
        "queued and due for longer than --stuck-after (no worker is running), or waiting for "
        "a reference past its time-to-live. --since/--until filter on the job's last change.",
    )
    _add_database_option(jobs_list)
    _add_job_filters(jobs_list)
    jobs_list.add_argument("--since", default=None, metavar="WHEN", help="changed since")
    jobs_list.add_argument("--until", default=None, metavar="WHEN", help="changed before")
    jobs_list.add_argument(
        "--stuck-after",
        default="15m",
        metavar="DURATION",
        help="a queued job due for longer than this is stuck (default: 15m)",
    )
    jobs_list.add_argument(
        "--limit", type=_positive_int, default=100, metavar="N", help="rows (default: 100)"
    )
    _add_format(jobs_list)
    jobs_list.set_defaults(handler=_piped(_cmd_jobs_list))

    jobs_retry = jobs_sub.add_parser(
        "retry",
        help="queue failed jobs again (and jobs whose worker died)",
        description="Queue failed jobs again with fresh attempts. Without --id, jobs whose "
        "lease expired (their worker died or stalled) are given back to the queue as well.",
    )
    _add_database_option(jobs_retry)
    _add_job_filters(jobs_retry)
    jobs_retry.add_argument(
        "--id",
        dest="job_ids",
        type=_positive_int,
        action="append",
        metavar="JOB_ID",
        help="only this failed job (repeatable)",
    )
    jobs_retry.set_defaults(handler=_piped(_cmd_jobs_retry))

    backfill = sub.add_parser(
        "backfill",
        help="create scoring jobs for traces already stored (e.g. after a new variant version)",
    )
    _add_database_option(backfill)
    backfill.add_argument("--since", default=None, help="duration (7d) or timestamp")
    backfill.add_argument("--until", default=None, help="duration (1h) or timestamp")
    backfill.add_argument("--app", type=_stored_text, default=None, help="only traces of this app")
    backfill.add_argument(
        "--metric", action="append", metavar="KEY", help="variants (default: all six)"
    )
    backfill.set_defaults(handler=_cmd_backfill)


JOB_FIELDS = (
    "id",
    "metric",
    "problem",
    "status",
    "attempts",
    "updated_at",
    "trace_id",
    "last_error",
    "version",
    "run_at",
    "locked_by",
    "lease_expires_at",
)


def _cmd_jobs_list(args: argparse.Namespace) -> int:
    from recalltrace.storage.history import TimeSpecError, parse_duration

    metric = _metric(args.metric)
    since, until = _window(args)
    try:
        stuck_after = parse_duration(args.stuck_after)
    except TimeSpecError as exc:
        raise CommandError(str(exc)) from None
    with _database(args) as engine:
        rows = _history(engine).problem_jobs(
            metric=metric,
            app=args.app,
            since=since,
            until=until,
            stuck_after=stuck_after,
            limit=args.limit,
        )
    if args.format == "json":
        _print_json([r.as_dict() for r in rows])
    elif args.format == "csv":
        _print_csv(JOB_FIELDS, [r.as_dict() for r in rows])
    else:
        from rich.table import Table

        console = _console()
        if not rows:
            console.print("No failed or stuck jobs.")
            return EXIT_OK
        table = Table(title="Failed and stuck jobs", title_justify="left", show_lines=True)
        table.add_column("id", justify="right", no_wrap=True)
        table.add_column("metric", overflow="fold")
        table.add_column("problem", no_wrap=True)
        table.add_column("attempts", justify="right", no_wrap=True)
        table.add_column("updated (UTC)")
        table.add_column("trace id / last error", ratio=1, min_width=32)
        for r in rows:
            table.add_row(
                str(r.id),
                r.metric,
                r.problem or r.status,
                str(r.attempts),
                _short_when(r.updated_at),
                f"{r.trace_id}\n{_safe(r.last_error or '-')}",
            )
        console.print(table)
        console.print(
            "Retry failed jobs and jobs whose worker died with `recalltrace jobs retry`; "
            "overdue jobs need a running worker."
        )
    return EXIT_OK


def _cmd_jobs_retry(args: argparse.Namespace) -> int:
    from recalltrace._wiring import repository

    metric = _metric(args.metric)
    # Expired leases are given back only when no filter narrows the retry.
    everything = args.job_ids is None and args.app is None and metric is None
    with _database(args) as engine:
        repo = repository(engine)
        job_ids = list(args.job_ids) if args.job_ids else None
        if args.app is not None:
            job_ids = _jobs_of_app(engine, args.app, metric, job_ids)
        failed = 0 if job_ids == [] else repo.retry_jobs(job_ids=job_ids, metric=metric)
        leases = repo.requeue_expired_leases() if everything else 0
    message = f"queued again: {failed} failed job{'s' if failed != 1 else ''}"
    if everything:
        message += f", {leases} job{'s' if leases != 1 else ''} whose lease had expired"
    print(message)
    if args.job_ids and failed < len(set(args.job_ids)):
        missing = len(set(args.job_ids)) - failed
        raise CommandError(
            f"{missing} of the given job ids {'were' if missing != 1 else 'was'} not failed "
            "jobs, so not queued again (see `recalltrace jobs list`)"
        )
    return EXIT_OK


def _jobs_of_app(
    engine: Engine, app: str, metric: str | None, job_ids: list[int] | None
) -> list[int]:
    """Ids of failed jobs whose trace belongs to ``app`` (narrowed to ``job_ids`` if given)."""
    from sqlalchemy import select

    from recalltrace.storage.models import JobStatus, ScoringJob, Trace

    stmt = select(ScoringJob.id).where(
        ScoringJob.status == JobStatus.FAILED,
        ScoringJob.trace_id.in_(select(Trace.trace_id).where(Trace.app_name == app)),
    )
    if metric is not None:
        stmt = stmt.where(ScoringJob.metric == metric)
    if job_ids is not None:
        stmt = stmt.where(ScoringJob.id.in_(job_ids))
    with engine.connect() as conn:
        return list(conn.scalars(stmt))


def _cmd_backfill(args: argparse.Namespace) -> int:
    import contextlib

    from rich.progress import Progress

    from recalltrace._wiring import open_repository

    since, until = _window(args)
    metrics = _metrics_arg(args.metric)
    repo = open_repository(args.database_url)
    progress = Progress(transient=True) if sys.stdout.isatty() else None
    try:
        keys = metrics or [spec.metric for spec in repo.metrics]
        total = 0
        with progress or contextlib.nullcontext():
            task = progress.add_task("creating jobs", total=len(keys)) if progress else None
            for key in keys:
                total += repo.create_jobs(
                    metrics=[key], since=since, until=until, app_name=args.app
                )
                if progress is not None and task is not None:
                    progress.advance(task)
    finally:
        repo.dispose()
    print(f"created {total} scoring jobs for {', '.join(keys)}")
    return 0
