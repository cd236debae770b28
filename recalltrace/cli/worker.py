"""``recalltrace worker``: score stored traces, and the judge options it shares with the demo."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from recalltrace import _wiring
from recalltrace.cli._args import (
    DATABASE_WAIT_S,
    EXIT_OK,
    CommandError,
    _add_database_option,
    _metrics_arg,
    _non_negative_int,
    check_sqlite_target,
    require_current_schema,
    wait_for_database,
)
from recalltrace.scorers.worker import (
    Worker,
    WorkerOptions,
    non_negative_seconds,
    port,
    positive_number,
)

T = TypeVar("T")


def _argument_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """One of the worker's shared parsers as an argparse type (its ``ValueError`` becomes the
    usage error line)."""

    def convert(raw: str) -> T:
        try:
            return parse(raw)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__
    return convert


_positive_float = _argument_type(positive_number)
_port = _argument_type(port)
_non_negative_float = _argument_type(non_negative_seconds)


def _judge_default(name: str) -> Any:
    """A JudgeConfig field's default: the flags show and use the one written there."""
    import dataclasses

    from recalltrace.scorers import JudgeConfig

    return next(f.default for f in dataclasses.fields(JudgeConfig) if f.name == name)


def add_judge_arguments(parser: argparse.ArgumentParser) -> None:
    """The judge options shared by ``worker`` and ``demo``; defaults are JudgeConfig's."""
    timeout = _judge_default("timeout_s")
    retries = _judge_default("max_retries")
    group = parser.add_argument_group("judge (LLM variants)")
    group.add_argument(
        "--judge-model",
        default=os.environ.get("RECALLTRACE_JUDGE_MODEL"),
        metavar="MODEL",
        help="any LiteLLM model string, e.g. openai/gpt-4o-mini or ollama/llama3.1 "
        "(default: $RECALLTRACE_JUDGE_MODEL; without one only the non-LLM variants score)",
    )
    group.add_argument(
        "--judge-api-base",
        default=os.environ.get("RECALLTRACE_JUDGE_API_BASE"),
        metavar="URL",
        help="base URL of an OpenAI-compatible server (default: $RECALLTRACE_JUDGE_API_BASE)",
    )
    group.add_argument(
        "--judge-timeout", type=_positive_float, default=timeout, metavar="S",
        help=f"timeout of one judge call in seconds (default {timeout:g})",
    )  # fmt: skip
    group.add_argument(
        "--judge-rpm", type=_positive_float, default=None, metavar="N",
        help="requests per minute allowed to the judge model (default: no limit)",
    )  # fmt: skip
    group.add_argument(
        "--judge-tpm", type=_positive_float, default=None, metavar="N",
        help="tokens per minute allowed to the judge model (default: no limit)",
    )  # fmt: skip
    group.add_argument(
        "--judge-max-retries", type=_non_negative_int, default=retries, metavar="N",
        help=f"retries of rate limits, 5xx and timeouts per judge call (default {retries})",
    )  # fmt: skip


EXIT_JUDGE_PAUSED = 3
"""``worker --once``: jobs were left unscored because of the judge (paused by a configuration
error or an unreachable judge, failing on every retry, or too slow for the run's deadline)."""
EXIT_JOBS_FAILED = 4
"""``worker --once``: some jobs failed for good (after their attempts)."""
EXIT_PUSH_FAILED = 5
"""``worker --pushgateway``: the metrics could not be pushed (the scores are stored)."""


def judge_config_from_args(args: argparse.Namespace, concurrency: int) -> Any:
    """A ``scorers.JudgeConfig`` from the judge options, or ``None`` without a model."""
    if not args.judge_model:
        return None
    from recalltrace.scorers import JudgeConfig
    from recalltrace.scorers._judge import JudgeBackendMissing, require_judge_backend

    try:
        require_judge_backend()
    except JudgeBackendMissing as exc:
        raise CommandError(str(exc)) from None

    try:
        return JudgeConfig(
            model=args.judge_model,
            api_base=args.judge_api_base,
            timeout_s=args.judge_timeout,
            requests_per_minute=args.judge_rpm,
            tokens_per_minute=args.judge_tpm,
            max_retries=args.judge_max_retries,
            max_concurrency=concurrency,
        )
    except ValueError as exc:
        raise CommandError(f"bad judge configuration: {exc}") from None


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``worker`` and ``backfill`` to the command line."""
    worker = sub.add_parser(
        "worker",
        help="score stored traces continuously (or once) and export metrics",
        description="Claim due scoring jobs, score them, store each score with its reason, "
        "and export OpenTelemetry metrics. Run one per laptop, or many against Postgres.",
    )
    _add_database_option(worker)
    worker.add_argument(
        "--metric", action="append", metavar="KEY",
        help="variant to score (repeat or comma-separate; default: all that can run)",
    )  # fmt: skip
    worker.add_argument(
        "--once", action="store_true", help="score everything due, then exit (cron, tests)"
    )
    _add_option_flags(worker)
    worker.add_argument(
        "--prometheus-host", default="127.0.0.1", metavar="HOST",
        help="address the scrape port binds (default 127.0.0.1, this host only; 0.0.0.0 for "
        "every interface, e.g. in a container scraped from outside)",
    )  # fmt: skip
    worker.add_argument(
        "--prometheus-port", type=_port, default=None, metavar="PORT",
        help="serve Prometheus metrics on this port (0: any free port; default: no scrape "
        "endpoint)",
    )  # fmt: skip
    worker.add_argument(
        "--pushgateway", default=None, metavar="URL",
        help="when the worker ends, push its metrics to this Prometheus Pushgateway (e.g. "
        "http://127.0.0.1:9091), grouped by job recalltrace_worker and instance (this host); "
        "for --once runs from cron (default: no push)",
    )  # fmt: skip
    worker.add_argument(
        "--console-metrics", action="store_true", help="print metrics and events to stdout"
    )
    worker.add_argument(
        "--no-progress", action="store_true", help="no progress bar even on a terminal"
    )
    worker.add_argument(
        "--database-wait", type=_non_negative_float, default=None, metavar="S",
        help="at start, wait this long for a database server that does not answer (starting, "
        "restarting), saying so once a minute, then exit 2; a database that answers but "
        "refuses (no such database, wrong password) exits 2 at once (default "
        f"{DATABASE_WAIT_S:g}; 0 with --once, which a scheduler runs again)",
    )  # fmt: skip
    add_judge_arguments(worker)
    worker.set_defaults(handler=_cmd_worker)


def _add_option_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of the WorkerOptions fields that declare one, with their parser and default."""
    for option in dataclasses.fields(WorkerOptions):
        flag = option.metadata.get("flag")
        if flag is None:
            continue
        default = option.default
        shown = "" if default is None else f" (default: {default:g})"
        parser.add_argument(
            flag,
            dest=option.name,
            type=_argument_type(option.metadata["parse"]),
            default=default,
            metavar=option.metadata["metavar"],
            help=option.metadata["help"] + shown,
        )


def _option_values(args: argparse.Namespace) -> dict[str, Any]:
    return {
        option.name: getattr(args, option.name)
        for option in dataclasses.fields(WorkerOptions)
        if "flag" in option.metadata
    }


def _cmd_worker(args: argparse.Namespace) -> int:
    from recalltrace.storage.db import redact_url, resolve_database_url

    logging.getLogger("recalltrace").setLevel(logging.INFO)
    url = resolve_database_url(args.database_url)
    check_sqlite_target(url, creating=False)
    wait = args.database_wait
    if wait is None:
        wait = 0.0 if args.once else DATABASE_WAIT_S
    wait_for_database(url, wait)
    require_current_schema(url)
    metrics = _metrics_arg(args.metric)
    judge = judge_config_from_args(args, args.concurrency)
    try:
        options = WorkerOptions(
            database_url=url, metrics=metrics, judge=judge, **_option_values(args)
        )
    except (ValueError, KeyError) as exc:
        raise CommandError(str(exc)) from None

    from recalltrace.scorers.telemetry import WorkerTelemetry, setup_telemetry
    from recalltrace.tracer._otlp import environment_exporter

    try:
        setup = setup_telemetry(
            prometheus_port=args.prometheus_port,
            prometheus_host=args.prometheus_host,
            console=args.console_metrics,
            pushgateway=args.pushgateway,
            otlp_exporters=environment_exporter,
        )
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(
            f"cannot serve Prometheus metrics on {args.prometheus_host}:{args.prometheus_port}: "
            f"{exc.strerror or exc}; choose another --prometheus-port (0 picks a free one)"
        ) from None
    telemetry = WorkerTelemetry(setup.meter_provider, setup.logger_provider)
    if setup.prometheus_port is not None:
        print(
            f"Prometheus metrics on port {setup.prometheus_port} ({args.prometheus_host})",
            flush=True,
        )
    repository = _wiring.open_repository(url)
    try:
        worker = Worker(
            options,
            repository=repository,
            telemetry=telemetry,
            warm=_wiring.history(repository.engine).warm_summaries,
        )
    except ValueError as exc:
        repository.dispose()
        setup.shutdown()
        raise CommandError(str(exc)) from None
    print(
        f"recalltrace worker {worker.worker_id} on {redact_url(url)}: "
        f"scoring {', '.join(worker.metrics) or 'nothing'}",
        flush=True,
    )
    if worker.not_configured:
        print(
            f"not configured: {', '.join(worker.not_configured)} "
            "(add --judge-model MODEL, any LiteLLM model string)",
            flush=True,
        )
    # The worker logs both facts when it starts; said above, they are said once.
    logging.getLogger("recalltrace.scorers.worker").addFilter(_said_at_start)
    import asyncio

    if args.pushgateway is not None:
        _push_baseline(setup, args.pushgateway)
    show_progress = args.once and sys.stdout.isatty() and not args.no_progress
    try:
        if show_progress:
            stats = _run_with_progress(worker)
        else:
            stats = asyncio.run(worker.run(once=args.once))
        pushed = _push(setup, args.pushgateway)
    finally:
        worker.close()
        setup.shutdown()
    handled = stats.finished + stats.retried
    per_job = f"{stats.db_seconds * 1000 / handled:.2f} ms" if handled else "-"
    print(
        f"scored {stats.scored}, skipped {stats.skipped}, failed {stats.failed}, "
        f"retried {stats.retried}, given back {stats.released}; database time per job {per_job}",
        flush=True,
    )
    if args.once:
        _say_what_is_left(stats)
    if not pushed:
        return EXIT_PUSH_FAILED
    if not args.once:
        return EXIT_OK
    # A scheduler (cron, a CI job) must be able to tell a run that did its work from one that
    # did not: the judge paused (a bad key, an unreachable judge) or jobs failed for good.
    if stats.paused:
        print(
            f"exit {EXIT_JUDGE_PAUSED}: the judge was paused {stats.paused} time(s); see the "
            "JUDGE PAUSED line above",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_JUDGE_PAUSED
    if stats.left_by_judge:
        print(
            f"exit {EXIT_JUDGE_PAUSED}: {stats.left_unscored} job(s) left unscored by the "
            "judge; the next run takes them again",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_JUDGE_PAUSED
    if stats.failed:
        print(
            f"exit {EXIT_JOBS_FAILED}: {stats.failed} job(s) failed for good; "
            "see recalltrace jobs list",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_JOBS_FAILED
    return EXIT_OK


def _say_what_is_left(stats: Any) -> None:
    """One line for a one-shot run that leaves work behind: how many jobs, and why."""
    billed = ""
    if stats.possibly_billed_tokens:
        billed = (
            f"; possibly billed ~{stats.possibly_billed_tokens:,.0f} tokens by judge calls that "
            "timed out (counted against --judge-budget)"
        )
    if not stats.left_unscored and not billed:
        return
    why = [f"{reason} {count}" for reason, count in sorted(stats.left_reasons.items())]
    if stats.deadline_reached:
        why.append("the run reached its --deadline")
    reasons = f" ({'; '.join(why)})" if why else ""
    print(f"left unscored {stats.left_unscored}{reasons}{billed}", flush=True)


def _push_baseline(setup: Any, url: str) -> None:
    """A group the gateway has never held starts at zero, so the first run is counted too."""
    import socket

    try:
        setup.push_baseline(
            job="recalltrace_worker", grouping_key={"instance": socket.gethostname()}
        )
    except Exception as exc:
        # The push at the end says it (exit 5); scoring goes on.
        logging.getLogger(__name__).debug("the baseline push to the Pushgateway failed: %s", exc)


_START_MESSAGES = frozenset(
    {
        "worker %s scoring %s",
        "no judge model configured: %s are not scored (set --judge-model)",
    }
)


def _said_at_start(record: Any) -> bool:
    """A logging filter: drop the worker's own start lines, which the command has printed."""
    return record.msg not in _START_MESSAGES


def _push(setup: Any, url: str | None) -> bool:
    """Push the run's metrics (queue gauges as the run left them) to the Pushgateway; False,
    with one line saying why, when that failed."""
    if url is None:
        return True
    import socket

    from recalltrace.storage.db import redact_url

    try:
        setup.push(job="recalltrace_worker", grouping_key={"instance": socket.gethostname()})
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(
            f"exit {EXIT_PUSH_FAILED}: could not push metrics to the Pushgateway at "
            f"{redact_url(url) if '://' in url else url}: {reason}",
            file=sys.stderr,
            flush=True,
        )
        return False
    print(f"pushed metrics to the Pushgateway at {url}", flush=True)
    return True


def _run_with_progress(worker: Any) -> Any:
    import asyncio
    import logging

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    # Log lines on the same terminal would tear the bar apart; warnings still show.
    logging.getLogger("recalltrace").setLevel(logging.WARNING)
    due = worker.repo.queue_stats(worker.metrics).due
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        transient=True,
    ) as progress:
        task = progress.add_task("scoring", total=max(due, 1))

        def update(stats: Any) -> None:
            progress.update(task, completed=stats.finished + stats.retried)

        worker.on_progress = update
        return asyncio.run(worker.run(once=True))
