"""``recalltrace jobs list|counts|cancel|retry`` and ``recalltrace backfill``: the scoring jobs."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from recalltrace.cli._args import (
    EXIT_OK,
    MAX_ROWS,
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
    check_sqlite_target,
    int_range,
    require_current_schema,
)
from recalltrace.cli._render import _console, _print_csv, _print_json, _safe, _short_when

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from recalltrace.storage.history_rows import JobCounts, JobRow


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``jobs list|counts|cancel|retry`` and ``backfill``."""
    jobs = sub.add_parser("jobs", help="scoring jobs: counts per variant, problems, retry, cancel")
    jobs_sub = jobs.add_subparsers(dest="jobs_command", metavar="ACTION", required=True)
    jobs_list = jobs_sub.add_parser(
        "list",
        help="jobs per variant, then failed and stuck jobs, most recently changed first",
        description="The jobs of each variant by state (as `jobs counts`), then failed jobs "
        "and stuck ones: running past their lease (the worker died), queued and due for longer "
        "than --stuck-after although a worker for their variant ran ('overdue'), queued with "
        "no worker for their variant seen in that time ('unserved'), or waiting for a "
        "reference past its time-to-live. --since/--until filter on the job's last change. "
        "JSON and CSV list the problem jobs only.",
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
        "--limit",
        type=int_range(1, MAX_ROWS),
        default=100,
        metavar="N",
        help=f"rows (default: 100, at most {MAX_ROWS})",
    )
    _add_format(jobs_list)
    jobs_list.set_defaults(handler=_piped(_cmd_jobs_list))

    jobs_counts = jobs_sub.add_parser(
        "counts",
        help="jobs per variant by state, and the workers that serve each variant",
        description="For every variant with unfinished or cancelled jobs: how many wait for a "
        "reference, are queued, running, failed or cancelled, and how many running workers "
        "score it (or when one was last seen). A variant no worker serves is 'unserved': its "
        "jobs wait until a worker is started for it, or `recalltrace jobs cancel` ends them.",
    )
    _add_database_option(jobs_counts)
    jobs_counts.add_argument(
        "--app", type=_stored_text, default=None, metavar="NAME", help="only this app's traces"
    )
    _add_format(jobs_counts)
    jobs_counts.set_defaults(handler=_piped(_cmd_jobs_counts))

    jobs_cancel = jobs_sub.add_parser(
        "cancel",
        help="end waiting, queued and failed jobs without scoring them",
        description="End jobs that should never run (e.g. of a variant no worker will score): "
        "they stop counting as pending in `jobs list`, the queue metrics and the workers' "
        "status lines, and `backfill` does not create them again. Running jobs are left to "
        "finish. Give --metric, --app or --id to choose the jobs, or --all for every one.",
    )
    _add_database_option(jobs_cancel)
    jobs_cancel.add_argument(
        "--metric",
        action="append",
        default=None,
        metavar="METRIC",
        help="only this metric (repeatable)",
    )
    jobs_cancel.add_argument(
        "--app", type=_stored_text, default=None, metavar="NAME", help="only this app's traces"
    )
    jobs_cancel.add_argument(
        "--id",
        dest="job_ids",
        type=_positive_int,
        action="append",
        metavar="JOB_ID",
        help="only this job (repeatable)",
    )
    jobs_cancel.add_argument(
        "--all",
        dest="cancel_all",
        action="store_true",
        help="cancel every waiting, queued and failed job (needed when no filter is given)",
    )
    jobs_cancel.set_defaults(handler=_piped(_cmd_jobs_cancel))

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
        "--metric", action="append", metavar="KEY", help="variants (default: all seven)"
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
        counts = [] if args.format != "table" else _history(engine).job_counts(app=args.app)
    if args.format == "json":
        _print_json([r.as_dict() for r in rows])
    elif args.format == "csv":
        _print_csv(JOB_FIELDS, [r.as_dict() for r in rows])
    else:
        _print_jobs(rows, [c for c in counts if metric is None or c.metric == metric])
    return EXIT_OK


def _print_jobs(rows: list[JobRow], counts: list[JobCounts]) -> None:
    """The per-variant counts, then the problem jobs grouped by variant; fits 80 columns."""
    from rich.table import Table

    from recalltrace.scorers.worker._presence import unserved_fix

    console = _console()
    if counts:
        console.print(_counts_table(counts))
        # Queued jobs no running worker takes: say how to score them (or end them).
        idle = [c.metric for c in counts if c.queued and not c.live_workers]
        if idle:
            console.print(
                _safe(f"No running worker scores {', '.join(idle)}: {unserved_fix(idle)}") + "."
            )
    if not rows:
        console.print("No failed or stuck jobs.")
        return
    by_metric: dict[str, list[JobRow]] = {}
    for r in rows:
        by_metric.setdefault(r.metric, []).append(r)
    for metric_key, jobs in by_metric.items():
        problems: dict[str, int] = {}
        for r in jobs:
            problems[r.problem or r.status] = problems.get(r.problem or r.status, 0) + 1
        title = f"{metric_key}: " + ", ".join(f"{n} {p}" for p, n in sorted(problems.items()))
        table = Table(
            title=_safe(title), title_justify="left", box=None, pad_edge=False, header_style="bold"
        )
        table.add_column("job", justify="right", no_wrap=True)
        table.add_column("problem", no_wrap=True)
        table.add_column("tries", justify="right", no_wrap=True)
        table.add_column("updated (UTC)", no_wrap=True)
        table.add_column("trace", no_wrap=True)
        table.add_column("last error", ratio=1, overflow="fold")
        for r in jobs:
            table.add_row(
                str(r.id),
                r.problem or r.status,
                str(r.attempts),
                _short_when(r.updated_at),
                r.trace_id[:12],
                _safe(r.last_error or "-"),
            )
        console.print()
        console.print(table)
    console.print()
    hints = ["`recalltrace jobs retry` queues failed jobs and jobs whose worker died again"]
    if any(r.problem == "unserved" for r in rows):
        from recalltrace.scorers.worker._presence import unserved_fix

        unserved = sorted({r.metric for r in rows if r.problem == "unserved"})
        hints.append(f"unserved jobs: {unserved_fix(unserved)}")
    if any(r.problem == "overdue" for r in rows):
        hints.append("overdue jobs wait for a worker that scores their variant to run")
    for hint in hints:
        console.print(_safe(hint) + ".")


def _counts_table(counts: list[JobCounts]) -> Any:
    from rich.table import Table

    table = Table(
        title="Jobs by variant (wait: for a reference)",
        title_justify="left",
        box=None,
        pad_edge=False,
        header_style="bold",
    )
    table.add_column("variant", no_wrap=True)
    # Short headers keep the table within 80 columns beside the longest variant name.
    for name in ("wait", "queued", "run", "failed", "cancel"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("workers", no_wrap=True)
    for c in counts:
        table.add_row(
            c.metric,
            str(c.waiting),
            str(c.queued),
            str(c.running),
            str(c.failed),
            str(c.cancelled),
            _served_text(c),
        )
    return table


def _served_text(c: JobCounts) -> str:
    if c.live_workers:
        return f"{c.live_workers} running"
    if c.last_worker_seen_at is None:
        return "unserved"
    age = (datetime.now(timezone.utc) - c.last_worker_seen_at).total_seconds()
    return f"last {_age(age)} ago"


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


COUNT_FIELDS = (
    "metric",
    "waiting",
    "queued",
    "running",
    "failed",
    "cancelled",
    "live_workers",
    "last_worker_seen_at",
)


def _cmd_jobs_counts(args: argparse.Namespace) -> int:
    with _database(args) as engine:
        counts = _history(engine).job_counts(app=args.app)
    if args.format == "json":
        _print_json([c.as_dict() for c in counts])
    elif args.format == "csv":
        _print_csv(COUNT_FIELDS, [c.as_dict() for c in counts])
    elif not counts:
        _console().print("No waiting, queued, running, failed or cancelled jobs.")
    else:
        _console().print(_counts_table(counts))
    return EXIT_OK


def _require_stored_app(engine: Engine, app: str | None) -> None:
    """Refuse an ``--app`` no stored trace has (a mistyped name selected nothing and the command
    said it did nothing, exit 0), naming the apps there are and the closest one."""
    if app is None:
        return
    from sqlalchemy import select

    from recalltrace.cli._render import inert, known_names
    from recalltrace.storage.models import Trace

    with engine.connect() as conn:
        if conn.scalar(select(Trace.trace_id).where(Trace.app_name == app).limit(1)) is not None:
            return
        apps = sorted(conn.scalars(select(Trace.app_name).distinct().limit(200)))
    raise CommandError(f"no stored trace has app {inert(app)!r}; apps: {known_names(app, apps)}")


def _cmd_jobs_cancel(args: argparse.Namespace) -> int:
    from recalltrace._wiring import repository

    metrics = [_metric(name) for name in dict.fromkeys(args.metric or ())]
    if not metrics and args.app is None and args.job_ids is None and not args.cancel_all:
        raise CommandError(
            "say which jobs to cancel: --metric KEY, --app NAME or --id JOB_ID, "
            "or --all for every waiting, queued and failed job"
        )
    cancelled: dict[str, int] = {}
    with _database(args) as engine:
        _require_stored_app(engine, args.app)
        repo = repository(engine)
        for metric in metrics or [None]:
            for key, count in repo.cancel_jobs(
                metric=metric, job_ids=args.job_ids, trace_ids_of_app=args.app
            ).items():
                cancelled[key] = cancelled.get(key, 0) + count
    total = sum(cancelled.values())
    detail = ", ".join(f"{m}: {n}" for m, n in sorted(cancelled.items()))
    print(f"cancelled {total} job{'s' if total != 1 else ''}" + (f" ({detail})" if detail else ""))
    if args.job_ids and total < len(set(args.job_ids)):
        missing = len(set(args.job_ids)) - total
        raise CommandError(
            f"{missing} of the given job ids {'were' if missing != 1 else 'was'} not waiting, "
            "queued or failed, so not cancelled (see `recalltrace jobs list`)"
        )
    return EXIT_OK


def _cmd_jobs_retry(args: argparse.Namespace) -> int:
    from recalltrace._wiring import repository

    metric = _metric(args.metric)
    # Expired leases are given back only when no filter narrows the retry.
    everything = args.job_ids is None and args.app is None and metric is None
    with _database(args) as engine:
        _require_stored_app(engine, args.app)
        repo = repository(engine)
        before = _job_states(engine, args.job_ids) if args.job_ids else {}
        job_ids = list(args.job_ids) if args.job_ids else None
        if args.app is not None:
            job_ids = _jobs_of_app(engine, args.app, metric, job_ids)
        failed = 0 if job_ids == [] else repo.retry_jobs(job_ids=job_ids, metric=metric)
        leases = repo.requeue_expired_leases() if everything else 0
        after = _job_states(engine, args.job_ids) if args.job_ids else {}
    message = f"queued again: {failed} failed job{'s' if failed != 1 else ''}"
    if everything:
        message += f", {leases} job{'s' if leases != 1 else ''} whose lease had expired"
    print(message)
    if args.job_ids:
        left = [
            _not_requeued(job_id, before.get(job_id), args)
            for job_id in sorted(set(args.job_ids))
            if not (before.get(job_id) == "failed" and after.get(job_id) != "failed")
        ]
        if left:
            more = f"; and {len(left) - 10} more" if len(left) > 10 else ""
            shown = "; ".join(left[:10]) + more
            raise CommandError(
                f"not queued again (only failed jobs are): {shown} (see `recalltrace jobs list`)"
            )
    return EXIT_OK


def _job_states(engine: Engine, job_ids: list[int]) -> dict[int, str]:
    """The status of each of ``job_ids`` that exists."""
    from sqlalchemy import select

    from recalltrace.storage.models import ScoringJob

    with engine.connect() as conn:
        rows = conn.execute(
            select(ScoringJob.id, ScoringJob.status).where(ScoringJob.id.in_(set(job_ids)))
        )
        return {int(job_id): str(status) for job_id, status in rows}


def _not_requeued(job_id: int, state: str | None, args: argparse.Namespace) -> str:
    """Why one job given by ``--id`` was not queued again, in a few words."""
    if state is None:
        return f"job {job_id} does not exist"
    if state != "failed":
        return f"job {job_id} is {state}, not failed"
    chosen = " and ".join(
        f"--{name} {value}" for name, value in (("app", args.app), ("metric", args.metric)) if value
    )
    return f"job {job_id} is failed but not selected by {chosen or 'the filters'}"


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
    from recalltrace.storage.db import resolve_database_url

    since, until = _window(args)
    metrics = _metrics_arg(args.metric)
    check_sqlite_target(resolve_database_url(args.database_url), creating=False)
    require_current_schema(resolve_database_url(args.database_url))
    repo = open_repository(args.database_url)
    progress = Progress(transient=True) if sys.stdout.isatty() else None
    try:
        _require_stored_app(repo.engine, args.app)
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
