"""The scoring worker: claims due jobs, scores them with bounded concurrency, writes the scores.

One worker per laptop on SQLite, or any number of processes on any number of hosts against one
Postgres: claims are ``FOR UPDATE SKIP LOCKED`` with a lease, finished scores are unique on
(trace, metric, version), and a job whose worker died comes back when its lease expires.

Outcomes of a job:

- a result (``scored``, ``skipped``, or ``failed`` on the last attempt) is written together with
  the job's new status in one transaction;
- a ``failed`` result before the last attempt, or an unexpected error, consumes an attempt and
  reschedules the job with backoff;
- a :class:`~scorers.TransientJudgeError` (rate limits, 5xx, timeouts that outlasted the judge
  client's own retries) reschedules without consuming an attempt, until the job's transient
  errors are older than ``transient_max_age_s``;
- a :class:`~scorers.TerminalJudgeError` (bad key, unknown model) gives the job back and pauses
  every variant that uses that judge for ``terminal_pause_s``, with a loud log line and the
  ``rag.judge.paused`` metric, instead of failing every job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

from recalltrace.scorers._errors import ScorerInputError, TerminalJudgeError, TransientJudgeError
from recalltrace.scorers._judge import JudgeCallRecord, JudgeClient, JudgeConfig
from recalltrace.scorers._result import ScoreResult
from recalltrace.scorers.budget import JudgeBudget
from recalltrace.scorers.catalog import (
    CATALOG,
    NON_LLM_METRICS,
    job_specs,
    metric_info,
    metrics_from_env,
)
from recalltrace.scorers.phoenix import AnnotationStats, PhoenixAnnotations
from recalltrace.scorers.telemetry import WorkerTelemetry
from recalltrace.storage.contracts import NOTIFY_CHANNEL, JobStore, QueueStats
from recalltrace.storage.errors import is_database_unavailable

logger = logging.getLogger("recalltrace.worker")

T = TypeVar("T")


def positive_int(raw: str) -> int:
    """Parse a whole number of at least 1 (``ValueError`` naming the problem otherwise)."""
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"expected a whole number, got {raw!r}") from None
    if value < 1:
        raise ValueError(f"expected a whole number of at least 1, got {raw!r}")
    return value


def positive_seconds(raw: str) -> float:
    """Parse a positive, finite number of seconds (``ValueError`` otherwise)."""
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"expected a number of seconds, got {raw!r}") from None
    if not 0 < value < 1e9:  # also refuses nan and inf
        raise ValueError(f"expected a positive number of seconds, got {raw!r}")
    return value


def http_url(raw: str) -> str:
    """Parse an ``http://`` or ``https://`` URL with a host (``ValueError`` otherwise)."""
    from urllib.parse import urlsplit

    parts = urlsplit(raw.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http:// or https:// URL with a host, got {raw!r}")
    return raw.strip()


def flag_option(
    default: Any,
    *,
    flag: str,
    parse: Callable[[str], Any],
    metavar: str,
    help: str,
) -> Any:
    """A :class:`WorkerOptions` field that is also a ``recalltrace worker`` flag: the command
    line is built from these (name, parser, default and help are written here only)."""
    return field(
        default=default,
        metadata={"flag": flag, "parse": parse, "metavar": metavar, "help": help},
    )


@dataclass
class WorkerOptions:
    """How a worker runs. Every field has a default fit for one laptop or one of many hosts.

    The fields made with :func:`flag_option` are the worker's command-line flags too.
    """

    database_url: str | None = None
    """Database URL; ``None`` means ``$RECALLTRACE_DATABASE_URL`` or the SQLite default."""
    metrics: Sequence[str] | None = None
    """Variants to score; default: all six with a judge, the non-LLM ones without."""
    judge: JudgeConfig | None = None
    """The judge of the LLM variants (any LiteLLM model); ``None`` leaves them unscored."""
    scorer_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Extra options per variant key, passed to ``scorers.get`` (e.g. a threshold)."""
    concurrency: int = flag_option(
        16,
        flag="--concurrency",
        parse=positive_int,
        metavar="N",
        help="most jobs scored at once by this process",
    )
    """Most jobs being scored at once by this process."""
    batch_size: int = flag_option(
        32,
        flag="--batch-size",
        parse=positive_int,
        metavar="N",
        help="most jobs claimed in one statement",
    )
    """Most jobs claimed in one statement."""
    lease_s: float = flag_option(
        120.0,
        flag="--lease",
        parse=positive_seconds,
        metavar="S",
        help="seconds a claimed job is held; extended while it runs, given back if the worker dies",
    )
    """Lease of a claimed job; extended every third of it while the job runs."""
    poll_interval_s: float = flag_option(
        2.0,
        flag="--poll-interval",
        parse=positive_seconds,
        metavar="S",
        help="longest sleep when no job is due (Postgres wakes the worker earlier)",
    )
    """Longest sleep when no job is due (Postgres wakes earlier through LISTEN/NOTIFY)."""
    max_attempts: int = flag_option(
        3,
        flag="--max-attempts",
        parse=positive_int,
        metavar="N",
        help="attempts (invalid answers, errors) before a job is failed for good",
    )
    """Attempts (invalid answers, errors) before a job is failed for good."""
    retry_backoff_s: float = 5.0
    """First retry delay; doubled per attempt with jitter, capped at ``retry_backoff_max_s``."""
    retry_backoff_max_s: float = 600.0
    transient_max_age_s: float = 6 * 3600.0
    """How long a job may keep failing transiently before it is failed."""
    terminal_pause_s: float = 300.0
    """How long the variants of a judge stay paused after a terminal (configuration) error."""
    once_deadline_s: float = flag_option(
        900.0,
        flag="--deadline",
        parse=positive_seconds,
        metavar="S",
        help="with --once: after S seconds stop claiming, let running jobs finish within the "
        "grace period, give back the rest and exit, counting what is left unscored",
    )
    """A one-shot run's longest time before it stops claiming (plus ``grace_period_s``)."""
    grace_period_s: float = flag_option(
        30.0,
        flag="--grace-period",
        parse=positive_seconds,
        metavar="S",
        help="on SIGTERM/SIGINT, seconds running jobs may take to finish before the rest is "
        "given back",
    )
    """On SIGTERM/SIGINT: how long running jobs may finish before the rest is given back."""
    reference_ttl_s: float | None = flag_option(
        None,
        flag="--reference-ttl",
        parse=positive_seconds,
        metavar="S",
        help="skip jobs that waited longer than S seconds for a late reference (default: the "
        "deadline set when the trace was stored, one day unless configured)",
    )
    """Skip jobs that have waited longer than this for a late reference; ``None`` keeps the
    deadline each job was created with (the writer's ``reference_ttl``, one day by default)."""
    maintenance_interval_s: float = 5.0
    """How often expired leases and expired waits are swept and the queue gauges refreshed."""
    summaries_interval_s: float | None = flag_option(
        60.0,
        flag="--summaries-interval",
        parse=positive_seconds,
        metavar="S",
        help="every S seconds, store the history summaries of the hour and day buckets that "
        "have ended (Postgres), so no `scores summary` run computes them",
    )
    """How often the summaries of ended buckets are stored in the background (see
    ``History.warm_summaries``); ``None`` leaves them to the first query that reads them."""
    status_interval_s: float | None = flag_option(
        60.0,
        flag="--status-interval",
        parse=positive_seconds,
        metavar="S",
        help="a long-running worker logs one status line (scored, skipped, failed, queue, lag) "
        "every S seconds",
    )
    judge_budget: JudgeBudget | None = flag_option(  # noqa: RUF009 (a dataclass field)
        None,
        flag="--judge-budget",
        parse=JudgeBudget.parse,
        metavar="LIMIT",
        help="most the judge model may spend per period, across all workers on this database: "
        "50/day (US dollars, LiteLLM's prices), 200k tokens/day, 2.5/hour; when reached, LLM "
        "variants pause until the next period and non-LLM variants go on (default: no limit)",
    )
    """A cap on the judge model's spend per period, shared by every worker through the
    database (see :mod:`recalltrace.scorers.budget`)."""
    phoenix_url: str | None = flag_option(
        None,
        flag="--phoenix",
        parse=http_url,
        metavar="URL",
        help="post every score to this Arize Phoenix server (e.g. http://127.0.0.1:6006) as an "
        "annotation of the request's span; PHOENIX_API_KEY, when set, is sent as a bearer token "
        "(default: no annotations)",
    )
    """Post every stored score to this Phoenix server as a span annotation (see
    :class:`~recalltrace.scorers.phoenix.PhoenixAnnotations`)."""
    phoenix_api_key: str | None = None
    """Bearer token for Phoenix; ``None`` reads ``PHOENIX_API_KEY``."""
    listen: bool = True
    """Wake on Postgres LISTEN/NOTIFY when new jobs arrive."""
    worker_id: str | None = None
    """Name of this worker in leases; default ``host:pid:random``."""
    freeze_gc: bool = True
    """With a judge: freeze the objects alive after LiteLLM's import out of the garbage
    collector's generations (see :func:`scorers.load_judge_backend`). Turn off when the worker
    runs inside a process that must keep collecting reference cycles among objects it
    created before the worker started."""
    litellm_http: bool = True
    """With a judge: send OpenAI and OpenAI-compatible chat requests through LiteLLM's own
    HTTP handler instead of the OpenAI SDK, for about a third less CPU per judge call (see
    :func:`scorers.load_judge_backend`). Process-wide; a value of
    ``EXPERIMENTAL_OPENAI_BASE_LLM_HTTP_HANDLER`` already in the environment wins."""

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if self.lease_s <= 0 or self.poll_interval_s <= 0:
            raise ValueError("lease_s and poll_interval_s must be positive")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.metrics is not None:
            for key in self.metrics:
                metric_info(key)  # raises with the list of known keys
        if self.phoenix_url is not None:
            http_url(self.phoenix_url)


@dataclass
class WorkerStats:
    """What a worker did during :meth:`Worker.run`."""

    scored: int = 0
    skipped: int = 0
    failed: int = 0
    retried: int = 0
    released: int = 0
    paused: int = 0
    db_seconds: float = 0.0
    """Wall time spent in database calls (claims, loads, writes, leases, maintenance)."""
    budget_reached: int = 0
    """Periods in which the judge budget was reached (LLM variants paused until the next)."""
    annotations: AnnotationStats | None = None
    """What was posted to Phoenix (with ``phoenix_url``), counted when the run ends."""
    deadline_reached: bool = False
    """A one-shot run stopped at its deadline (``once_deadline_s``)."""
    left_unscored: int = 0
    """A one-shot run: jobs of the variants it scores still queued when it ended."""
    left_reasons: dict[str, int] = field(default_factory=dict)
    """Why this run's claimed jobs were left unscored (last cause each), e.g. ``judge failing``."""
    possibly_billed_tokens: float = 0.0
    """Estimated tokens of judge calls that timed out after being sent (they may be billed;
    they count against the judge budget)."""

    @property
    def left_by_judge(self) -> bool:
        """Whether jobs were left unscored because of the judge (failing, paused, too slow for
        the deadline); a budget reached is the run doing what it was told, not counted here."""
        return self.deadline_reached or any(r != LEFT_BUDGET for r in self.left_reasons)

    @property
    def finished(self) -> int:
        """Jobs that ended with a stored score."""
        return self.scored + self.skipped + self.failed


LEFT_BUDGET = "the judge budget was reached"
"""Why a claimed job was given back untouched: the budget of its period was spent."""


@dataclass
class _Running:
    job: Any
    task: asyncio.Task[None]
    started: float


def default_worker_id() -> str:
    """``host:pid:random``, unique across hosts and restarts."""
    return f"{socket.gethostname()}:{os.getpid()}:{random.randrange(16**6):06x}"


class Worker:
    """An asyncio scoring worker over any :class:`~recalltrace.storage.contracts.JobStore`."""

    def __init__(
        self,
        options: WorkerOptions | None = None,
        *,
        repository: JobStore | None = None,
        telemetry: WorkerTelemetry | None = None,
        on_progress: Callable[[WorkerStats], None] | None = None,
    ) -> None:
        self.options = options or WorkerOptions()
        if repository is None:
            from recalltrace.storage.repository import open_repository

            repository = open_repository(
                self.options.database_url, specs=job_specs(), metrics=metrics_from_env()
            )
        self.repo: JobStore = repository
        self._reference_ttl = (
            None
            if self.options.reference_ttl_s is None
            else timedelta(seconds=self.options.reference_ttl_s)
        )
        self.telemetry = telemetry or WorkerTelemetry()
        self.on_progress = on_progress
        self.worker_id = self.options.worker_id or default_worker_id()
        self.stats = WorkerStats()
        self._judge: JudgeClient | None = None
        self._scorers: dict[str, Any] = {}
        self._not_configured: list[str] = []
        self._build_scorers()
        self.telemetry.initialise(
            self._scorers, self.options.judge.model if self.options.judge is not None else None
        )
        self._paused_until = 0.0
        self._next_summaries = 0.0
        self._summaries_failing = False
        self._budget_until = 0.0
        self._budget_said: datetime | None = None
        self._unpriced_said = False
        self._once = False
        # A one-shot run claims a job that failed transiently once only (the judge client has
        # retried it already); the next run takes it again.
        self._once_excluded: set[int] = set()
        self._left_cause: dict[int, str] = {}
        # Judge calls that timed out after being sent: (when, estimated tokens, US dollars).
        self._possibly_billed: deque[tuple[datetime, float, float]] = deque()
        self._budget_stale = False
        self._next_status = 0.0
        self._running: dict[int, _Running] = {}
        # Claimed jobs with their traces loaded, waiting for a free slot: a slot that frees up
        # starts the next job at once instead of waiting for a claim round trip.
        self._ready: deque[tuple[Any, Any]] = deque()
        self._pending_finish: list[tuple[Any, ScoreResult, str, float]] = []
        self._flush_lock = asyncio.Lock()
        self._flush_now = asyncio.Event()
        self._closing = False
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._stop_requested = threading.Event()
        self.stopped_by: str | None = None
        """The signal that stopped the last run (``SIGINT``, ``SIGTERM``), if one did."""
        self._db: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._annotations: PhoenixAnnotations | None = None

    # -- set-up -------------------------------------------------------------------------
    def _build_scorers(self) -> None:
        from recalltrace import scorers

        opts = self.options
        if opts.judge is not None:
            self._judge = JudgeClient(opts.judge, on_call=self._on_judge_call)
            # Import LiteLLM now (seconds): on the event loop it would stall every job,
            # the lease extensions and the signal handlers. The worker owns its process, so it
            # also freezes LiteLLM's long-lived heap out of the collector's way and skips the
            # OpenAI SDK's per-request work.
            from recalltrace.scorers._judge import load_judge_backend

            load_judge_backend(freeze_gc=opts.freeze_gc, litellm_http=opts.litellm_http)
        if opts.metrics is not None:
            keys = list(opts.metrics)
        else:
            keys = metrics_from_env() or list(CATALOG)
        for key in keys:
            info = metric_info(key)
            extra = dict(opts.scorer_options.get(key, {}))
            if info.uses_llm:
                if self._judge is None:
                    self._not_configured.append(key)
                    continue
                self._scorers[key] = scorers.get(key, judge=self._judge, **extra)
            else:
                self._scorers[key] = scorers.get(key, **extra)
        if self._not_configured and opts.metrics is not None:
            raise ValueError(
                f"{', '.join(self._not_configured)} need(s) a judge model "
                "(set --judge-model, or WorkerOptions.judge)"
            )

    @property
    def metrics(self) -> list[str]:
        """The variants this worker scores."""
        return list(self._scorers)

    @property
    def not_configured(self) -> list[str]:
        """LLM variants left out because no judge model is configured."""
        return list(self._not_configured)

    def _on_judge_call(self, record: JudgeCallRecord) -> None:
        self.telemetry.record_call(record)
        if record.possibly_billed_tokens > 0:
            usd = 0.0
            if self._judge is not None:
                usd = self._judge.estimate_cost(record.possibly_billed_tokens) or 0.0
            self.stats.possibly_billed_tokens += record.possibly_billed_tokens
            self._possibly_billed.append(
                (datetime.now(timezone.utc), record.possibly_billed_tokens, usd)
            )
            self._budget_stale = True

    def _llm_held(self) -> bool:
        """Whether the LLM variants are held back (judge paused or budget reached)."""
        now = time.monotonic()
        return self._paused_until > now or self._budget_until > now

    def _claimable_metrics(self) -> list[str]:
        if self._llm_held():
            return [k for k in self._scorers if k in NON_LLM_METRICS]
        return list(self._scorers)

    async def _check_budget(self) -> None:
        """Before claiming: read the judge model's spend this period (every worker's stored
        results and this worker's unwritten ones) and pause the LLM variants until the period
        ends once it reaches the budget."""
        budget, judge = self.options.judge_budget, self.options.judge
        if budget is None or judge is None:
            return
        if not any(k not in NON_LLM_METRICS for k in self._scorers):
            return
        now_m = time.monotonic()
        if now_m < self._budget_until:
            return
        now = datetime.now(timezone.utc)
        start = budget.period_start(now)
        try:
            tokens, usd = await self._db_call(self.repo.judge_spend, judge.model, start)
        except Exception as exc:
            logger.error("reading the judge's spend failed (%s); trying again", _describe(exc))
            return
        # This worker's results not written yet count too, and so do its calls that timed out
        # after being sent (the provider may bill them; no result of theirs is stored).
        for _job, result, _app, _duration in self._pending_finish:
            if result.model == judge.model:
                tokens += (result.prompt_tokens or 0) + (result.completion_tokens or 0)
                usd += result.cost_usd or 0.0
        while self._possibly_billed and self._possibly_billed[0][0] < start:
            self._possibly_billed.popleft()
        for _when, billed_tokens, billed_usd in self._possibly_billed:
            tokens += int(billed_tokens)
            usd += billed_usd
        spent = budget.spent(tokens, usd)
        if spent < budget.amount:
            if self._budget_until:
                self._budget_until = 0.0
                logger.warning(
                    "judge budget: a new %s began (%s spent of %s); LLM variants resume",
                    budget.period,
                    _amount(spent, budget.unit),
                    budget.describe(),
                )
            return
        end = budget.period_end(now)
        self._budget_until = now_m + max((end - now).total_seconds(), 0.0)
        if self._budget_said != start:
            self._budget_said = start
            self.stats.budget_reached += 1
            self.telemetry.record_budget_reached(judge.model, budget.unit, spent, budget.amount)
            logger.error(
                "JUDGE BUDGET REACHED: %s spent of %s by %s (every worker on this database); "
                "LLM variants are not claimed until %s UTC, jobs already claimed finish; "
                "non-LLM variants go on.",
                _amount(spent, budget.unit),
                budget.describe(),
                judge.model,
                end.strftime("%Y-%m-%d %H:%M"),
            )

    # -- plumbing -----------------------------------------------------------------------
    async def _db_call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()

        def timed() -> T:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.stats.db_seconds += time.perf_counter() - started

        if self._db is None:
            self._db = ThreadPoolExecutor(max_workers=4, thread_name_prefix="recalltrace-db")
        return await loop.run_in_executor(self._db, timed)

    def request_stop(self) -> None:
        """Stop claiming; running jobs get the grace period to finish. Thread-safe."""
        self._stop_requested.set()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._stop.set)
            loop.call_soon_threadsafe(self._wake.set)

    def _install_signal_handlers(self) -> list[int]:
        if threading.current_thread() is not threading.main_thread():
            return []
        loop = asyncio.get_running_loop()
        installed: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
                installed.append(sig)
            except (NotImplementedError, RuntimeError):
                # Event loops without signal support (Windows' proactor) leave stopping to
                # request_stop() and KeyboardInterrupt.
                continue
        return installed

    def _on_signal(self, sig: int) -> None:
        self.stopped_by = signal.Signals(sig).name
        logger.warning(
            "received %s: no new jobs; finishing running ones within %.0f s",
            signal.Signals(sig).name,
            self.options.grace_period_s,
        )
        self.request_stop()

    # -- the loop -----------------------------------------------------------------------
    async def run(self, *, once: bool = False) -> WorkerStats:
        """Score until stopped (or, with ``once``, until nothing is due), then return stats."""
        self._loop = asyncio.get_running_loop()
        self.stats = WorkerStats()
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._flush_now = asyncio.Event()
        self._closing = False
        self._once = once
        self._next_status = 0.0
        self._started_at = datetime.now(timezone.utc)
        self._unserved_said: set[str] = set()
        # The OpenTelemetry ids of the requests being scored, for their evaluation events.
        self._otel_ids: dict[int, tuple[str, str | None]] = {}
        if self._stop_requested.is_set():
            self._stop.set()
        if self.options.phoenix_url:
            self._annotations = PhoenixAnnotations(
                self.options.phoenix_url,
                api_key=self.options.phoenix_api_key or os.environ.get("PHOENIX_API_KEY"),
            )
        signals = self._install_signal_handlers()
        self._once_excluded = set()
        self._left_cause = {}
        if self._not_configured:
            logger.warning(
                "no judge model configured: %s are not scored (set --judge-model)",
                ", ".join(self._not_configured),
            )
        logger.info("worker %s scoring %s", self.worker_id, ", ".join(self._scorers) or "nothing")
        finisher = asyncio.create_task(self._finish_loop(), name="recalltrace-finish")
        helpers = [
            asyncio.create_task(self._maintenance_loop(), name="recalltrace-maintenance"),
            asyncio.create_task(self._lease_loop(), name="recalltrace-leases"),
        ]
        if self.options.listen and self.repo.is_postgres and not once:
            helpers.append(asyncio.create_task(self._listen_loop(), name="recalltrace-listen"))
        if once:
            helpers.append(asyncio.create_task(self._deadline_loop(), name="recalltrace-deadline"))
        try:
            await self._maintain_once()
            await self._claim_loop(once)
            await self._drain()
            if once:
                # The final export of a one-shot run reports the queue it leaves behind, not
                # the one it found (a cron user's lag alert would fire after every good run).
                await self._flush_finished()
                await self._maintain_once()
                await self._count_left_unscored()
        finally:
            # Scores already computed are written before anything else stops; the finisher
            # is never cancelled in the middle of a write.
            self._closing = True
            self._flush_now.set()
            with contextlib.suppress(Exception):
                await finisher
            await self._report_presence(stopped=True)
            if self._annotations is not None:
                annotations, self._annotations = self._annotations, None
                self.stats.annotations = await asyncio.to_thread(
                    annotations.close, self.options.grace_period_s
                )
            for task in helpers:
                task.cancel()
            for task in helpers:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            loop = asyncio.get_running_loop()
            for sig in signals:
                loop.remove_signal_handler(sig)
            if self._db is not None:
                self._db.shutdown(wait=True)
                self._db = None
        return self.stats

    async def _deadline_loop(self) -> None:
        """A one-shot run stops claiming at its deadline; running jobs get the grace period."""
        await asyncio.sleep(self.options.once_deadline_s)
        if self._stop.is_set():
            return
        self.stats.deadline_reached = True
        logger.warning(
            "the run reached its deadline of %g s: no new jobs; finishing running ones within "
            "%g s, then giving back the rest",
            self.options.once_deadline_s,
            self.options.grace_period_s,
        )
        self._stop.set()
        self._wake.set()

    async def _count_left_unscored(self) -> None:
        """A one-shot run's account of what it leaves: the queued jobs of the variants it
        scores, and why the ones it claimed are among them."""
        causes: dict[str, int] = {}
        for cause in self._left_cause.values():
            causes[cause] = causes.get(cause, 0) + 1
        self.stats.left_reasons = causes
        try:
            left = await self._db_call(self.repo.queue_stats, list(self._scorers))
        except Exception as exc:
            logger.error("counting the jobs left unscored failed (%s)", _describe(exc))
            self.stats.left_unscored = sum(causes.values())
            return
        self.stats.left_unscored = left.due + left.running

    async def _claim_loop(self, once: bool) -> None:
        opts = self.options
        # Keep up to half the concurrency claimed ahead, and claim when a quarter of that room
        # (or a batch) is free, not after every finished job: each claim and trace load is a
        # round trip, and one per job would cap throughput.
        prefetch = max(1, min(opts.batch_size, opts.concurrency // 2))
        refill_at = max(1, min(opts.batch_size, opts.concurrency // 4))
        claim_failures = 0
        while not self._stop.is_set():
            # Cleared before the state is read, not when waiting: a job that finishes in
            # between sets it again, and the wait then returns at once (no lost wake-up).
            self._wake.clear()
            self._launch_ready()
            room = opts.concurrency + prefetch - len(self._running) - len(self._ready)
            idle = not self._running and not self._ready
            claimed: list[Any] = []
            await self._check_budget()
            metrics = self._claimable_metrics()
            if metrics and room > 0 and (room >= refill_at or idle):
                try:
                    claimed = await self._db_call(
                        self.repo.claim_jobs,
                        self.worker_id,
                        limit=min(opts.batch_size, room),
                        lease=timedelta(seconds=opts.lease_s),
                        metrics=metrics,
                        exclude=sorted(self._once_excluded),
                    )
                except Exception as exc:
                    claim_failures += 1
                    if once and claim_failures >= 3:
                        # A one-shot run (cron, CI) reports an unreachable database instead of
                        # waiting for it forever; a long-running worker keeps trying.
                        raise
                    logger.error("claiming jobs failed (%s); retrying", _describe(exc))
                    await self._sleep(min(opts.poll_interval_s, 5.0))
                    continue
                claim_failures = 0
                if claimed:
                    await self._prepare(claimed)
                    continue
            if once and not claimed and idle:
                if not self._writes_outstanding():
                    return
                # Only the last scores are left to write: have them written now and look
                # again soon, rather than idling a poll interval at the end of every run.
                self._flush_now.set()
                await self._sleep(0.02)
                continue
            await self._wait_for_work()

    async def _wait_for_work(self) -> None:
        waiters: list[asyncio.Future[Any]] = [asyncio.ensure_future(self._wake.wait())]
        waiters.extend(r.task for r in self._running.values())
        await asyncio.wait(
            waiters, timeout=self.options.poll_interval_s, return_when=asyncio.FIRST_COMPLETED
        )
        waiters[0].cancel()

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)

    async def _prepare(self, jobs: Sequence[Any]) -> None:
        """Load the traces of claimed jobs and queue them for a free slot."""
        try:
            inputs = await self._db_call(self.repo.load_inputs, [j.trace_id for j in jobs])
        except Exception as exc:
            logger.error("loading traces failed (%s); giving the jobs back", _describe(exc))
            with contextlib.suppress(Exception):
                await self._db_call(self.repo.release_jobs, self.worker_id, [j.id for j in jobs])
            await self._sleep(1.0)
            return
        for job in jobs:
            self._ready.append((job, inputs.get(job.trace_id)))
        self._launch_ready()

    def _launch_ready(self) -> None:
        """Start ready jobs while slots are free (not after a stop was requested)."""
        while self._ready and len(self._running) < self.options.concurrency:
            if self._stop.is_set():
                return
            job, trace = self._ready.popleft()
            task = asyncio.create_task(self._process(job, trace), name=f"recalltrace-job-{job.id}")
            self._running[job.id] = _Running(job, task, time.monotonic())
            task.add_done_callback(self._forget(job.id))

    def _forget(self, job_id: int) -> Callable[[asyncio.Task[None]], None]:
        def done(_task: asyncio.Task[None]) -> None:
            self._running.pop(job_id, None)
            self._launch_ready()
            self._wake.set()

        return done

    async def _process(self, job: Any, trace: Any) -> None:
        started = time.monotonic()
        app = trace.app_name if trace is not None else ""
        scorer = self._scorers.get(job.metric)
        if scorer is not None and scorer.uses_llm and self._budget_stale:
            # A judge call timed out since the spend was last read: it may be billed, so the
            # budget is read again before another call is sent.
            self._budget_stale = False
            await self._check_budget()
        if scorer is not None and scorer.uses_llm and self._llm_held():
            # Claimed before the judge was paused or the budget was reached: give it back
            # untouched.
            if self._budget_until > time.monotonic():
                self._left_cause[job.id] = LEFT_BUDGET
            await self._give_back(job)
            return
        if trace is not None and trace.otel_trace_id:
            self._otel_ids[job.id] = (trace.otel_trace_id, trace.otel_span_id)
        try:
            if scorer is None:
                raise RuntimeError(f"no scorer for metric {job.metric!r} in this worker")
            if trace is None:
                raise LookupError(f"trace {job.trace_id} is no longer stored")
            result: ScoreResult = await scorer.ascore(**trace.scorer_inputs())
        except asyncio.CancelledError:
            raise
        except TransientJudgeError as exc:
            await self._on_transient(job, exc, app)
            return
        except TerminalJudgeError as exc:
            await self._on_terminal(job, exc)
            return
        except ScorerInputError as exc:
            # The stored inputs are malformed; another attempt would see the same data.
            self._finish_failed(job, f"The trace's inputs are invalid: {exc}", started, app)
            return
        except Exception as exc:
            await self._on_error(job, exc, started, app)
            return
        if result.status == "failed" and job.attempts + 1 < self.options.max_attempts:
            await self._retry(job, result.reason, consume_attempt=True)
            return
        self._queue_finish(job, result, app, time.monotonic() - started)

    def _backoff(self, attempt: int, hint: float | None = None) -> timedelta:
        opts = self.options
        delay = min(opts.retry_backoff_max_s, opts.retry_backoff_s * 2 ** max(0, attempt))
        delay = delay / 2 + random.random() * delay / 2
        if hint is not None:
            delay = max(delay, hint)
        return timedelta(seconds=delay)

    async def _retry(
        self, job: Any, error: str, *, consume_attempt: bool, delay: timedelta | None = None
    ) -> None:
        try:
            status = await self._db_call(
                self.repo.reschedule_job,
                job,
                delay=self._backoff(job.attempts) if delay is None else delay,
                error=error,
                consume_attempt=consume_attempt,
                max_attempts=self.options.max_attempts,
            )
        except Exception as exc:
            logger.error("rescheduling job %s failed (%s)", job.id, _describe(exc))
            return
        if status == "failed":
            self.stats.failed += 1
            self.telemetry.record_job("failed", job.metric)
        else:
            self.stats.retried += 1
            self.telemetry.record_job("retried", job.metric)

    async def _on_transient(self, job: Any, exc: TransientJudgeError, app: str) -> None:
        if exc.unreachable:
            # Nothing answered at all after the client's retries (nothing listening, a wrong
            # host): waiting job by job would hang silently; pause as a bad key does.
            await self._pause(job, exc, "cannot reach the judge")
            return
        now = datetime.now(timezone.utc)
        first = job.first_transient_at or now
        if (now - first).total_seconds() > self.options.transient_max_age_s:
            self._finish_failed(
                job,
                f"The judge kept failing transiently for too long: {exc}",
                time.monotonic(),
                app,
            )
            return
        delay = self._backoff(min(job.attempts + 1, 6), exc.retry_after_s)
        if self._once:
            self._once_excluded.add(job.id)
            self._left_cause[job.id] = "the judge kept failing"
        await self._retry(job, f"transient: {exc}", consume_attempt=False, delay=delay)

    async def _on_terminal(self, job: Any, exc: TerminalJudgeError) -> None:
        await self._pause(job, exc, "fix the judge configuration (API key, model name, budget)")

    async def _pause(self, job: Any, exc: Exception, advice: str) -> None:
        self._left_cause[job.id] = "the judge was paused"
        already_paused = self._paused_until > time.monotonic()
        self._paused_until = time.monotonic() + self.options.terminal_pause_s
        model = getattr(exc, "model", None)
        if not already_paused:
            self.stats.paused += 1
            self.telemetry.record_pause(model or "unknown", getattr(exc, "error_type", None))
            judge = self.options.judge
            where = f" at {judge.api_base}" if judge is not None and judge.api_base else ""
            logger.error(
                "JUDGE PAUSED for %.0f s: %s: %s (model %s%s). LLM variants are not claimed "
                "until then; non-LLM variants go on.",
                self.options.terminal_pause_s,
                advice,
                exc,
                model,
                where,
            )
        await self._give_back(job)

    async def _give_back(self, job: Any) -> None:
        try:
            self.stats.released += await self._db_call(
                self.repo.release_jobs, self.worker_id, [job.id]
            )
        except Exception as exc:
            logger.error("giving back job %s failed (%s)", job.id, _describe(exc))

    async def _on_error(self, job: Any, exc: BaseException, started: float, app: str) -> None:
        message = f"{type(exc).__name__}: {exc}"
        logger.warning("job %s (%s) raised %s", job.id, job.metric, message)
        if job.attempts + 1 >= self.options.max_attempts:
            self._finish_failed(job, f"Scoring raised {message}", started, app)
        else:
            await self._retry(job, message, consume_attempt=True)

    def _finish_failed(self, job: Any, reason: str, started: float, app: str) -> None:
        self._queue_finish(job, _failed_result(job, reason), app, time.monotonic() - started)

    def _queue_finish(self, job: Any, result: ScoreResult, app: str, duration: float) -> None:
        self._left_cause.pop(job.id, None)
        self._pending_finish.append((job, result, app, duration))
        if len(self._pending_finish) >= self.options.batch_size:
            self._flush_now.set()

    def _writes_outstanding(self) -> bool:
        return bool(self._pending_finish) or self._flush_lock.locked()

    def _say_unpriced(self, result: ScoreResult) -> None:
        """A budget in dollars cannot hold for a model LiteLLM has no price for: say so once."""
        budget = self.options.judge_budget
        if (
            budget is None
            or budget.unit != "usd"
            or self._unpriced_said
            or result.model is None
            or result.cost_usd is not None
        ):
            return
        self._unpriced_said = True
        logger.error(
            "JUDGE BUDGET CANNOT HOLD: LiteLLM's price list has no price for %s, so its spend "
            "in US dollars counts as 0; give the budget in tokens (e.g. --judge-budget "
            "'2m tokens/day')",
            result.model,
        )

    async def _flush_finished(self) -> None:
        async with self._flush_lock:
            while self._pending_finish:
                batch = self._pending_finish[: self.options.batch_size]
                del self._pending_finish[: len(batch)]
                if not await self._write_batch(batch):
                    return

    async def _write_batch(self, batch: list[tuple[Any, ScoreResult, str, float]]) -> bool:
        outcomes = [(job, result) for job, result, _app, _d in batch]
        delay = 0.5
        give_up_at: float | None = None
        failures = 0
        while True:
            try:
                written = await self._db_call(self.repo.finish_jobs, outcomes)
                # Counted are the scores stored now: not those of traces deleted while they
                # were scored, nor a second finish of a job another worker already stored.
                for entry, new in zip(batch, written, strict=True):
                    if not new:
                        self._otel_ids.pop(entry[0].id, None)
                batch = [entry for entry, new in zip(batch, written, strict=True) if new]
                break
            except Exception as exc:
                failures += 1
                if failures >= _ISOLATE_AFTER and not is_database_unavailable(exc):
                    # Storage refuses something this batch holds (it is not down): retrying
                    # the batch as it is would hold every score behind it forever.
                    batch = await self._write_one_by_one(batch)
                    break
                now = time.monotonic()
                if self._closing:
                    give_up_at = give_up_at or now + self.options.grace_period_s
                    if now >= give_up_at:
                        # The leases expire and another worker scores these again; the
                        # unique key keeps that from doubling anything.
                        logger.error(
                            "could not store %d scores before exit (%s)",
                            len(batch),
                            _describe(exc),
                        )
                        return False
                logger.error("storing scores failed (%s); retrying", _describe(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
        for job, result, app, duration in batch:
            outcome = result.status
            setattr(self.stats, outcome, getattr(self.stats, outcome) + 1)
            self.telemetry.record_job(outcome, job.metric)
            otel_trace_id, otel_span_id = self._otel_ids.pop(job.id, (None, None))
            self.telemetry.record_score(
                result,
                app_name=app,
                trace_id=job.trace_id,
                judge_model=result.model,
                duration_s=duration,
                otel_trace_id=otel_trace_id,
                otel_span_id=otel_span_id,
            )
            if self._annotations is not None:
                self._annotations.send(
                    result, record_id=job.trace_id, app_name=app, otel_span_id=otel_span_id
                )
            self._say_unpriced(result)
        if self.on_progress is not None:
            self.on_progress(self.stats)
        return True

    async def _write_one_by_one(
        self, batch: list[tuple[Any, ScoreResult, str, float]]
    ) -> list[tuple[Any, ScoreResult, str, float]]:
        """Store a refused batch score by score; a score storage refuses fails its job with
        the reason. Returns the scores stored; if the database goes away meanwhile, the rest
        goes back to the pending scores."""
        finished = []
        for index, (job, result, app, duration) in enumerate(batch):
            try:
                if (await self._db_call(self.repo.finish_jobs, [(job, result)]))[0]:
                    finished.append((job, result, app, duration))
                continue
            except Exception as exc:
                if is_database_unavailable(exc):
                    self._pending_finish[:0] = batch[index:]
                    return finished
                reason = f"The score could not be stored: {_describe(exc)}"
            logger.error("job %s (%s): %s", job.id, job.metric, reason)
            failed = _failed_result(job, reason)
            try:
                if (await self._db_call(self.repo.finish_jobs, [(job, failed)]))[0]:
                    finished.append((job, failed, app, duration))
            except Exception:
                try:
                    await self._db_call(self.repo.fail_job, job, reason)
                except Exception as fail_exc:
                    logger.error(
                        "could not fail job %s (%s); its lease will expire",
                        job.id,
                        _describe(fail_exc),
                    )
        return finished

    async def _finish_loop(self) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._flush_now.wait(), timeout=0.05)
            self._flush_now.clear()
            if self._pending_finish:
                await self._flush_finished()
            if self._closing and not self._pending_finish:
                return

    async def _drain(self) -> None:
        """Give back jobs not started; wait for running ones up to the grace period, then
        give back the rest."""
        if self._ready:
            waiting = [job.id for job, _trace in self._ready]
            self._ready.clear()
            try:
                self.stats.released += await self._db_call(
                    self.repo.release_jobs, self.worker_id, waiting
                )
            except Exception as exc:
                logger.error(
                    "could not give back %d jobs (%s); their leases will expire",
                    len(waiting),
                    _describe(exc),
                )
        if not self._running:
            return
        tasks = [r.task for r in self._running.values()]
        grace = self.options.grace_period_s if self._stop.is_set() else None
        _done, pending = await asyncio.wait(tasks, timeout=grace)
        if pending:
            held = [r.job.id for r in list(self._running.values()) if r.task in pending]
            cause = "given back at the deadline" if self.stats.deadline_reached else "stopped"
            for job_id in held:
                self._left_cause[job_id] = cause
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            try:
                released = await self._db_call(self.repo.release_jobs, self.worker_id, held)
                self.stats.released += released
                logger.warning("gave back %d unfinished jobs", released)
            except Exception as exc:
                logger.error(
                    "could not give back %d jobs (%s); their leases will expire",
                    len(held),
                    _describe(exc),
                )

    async def _lease_loop(self) -> None:
        interval = max(0.05, self.options.lease_s / 3)
        lease = timedelta(seconds=self.options.lease_s)
        while True:
            await asyncio.sleep(interval)
            held = [job_id for job_id in self._running]
            held.extend(job.id for job, _trace in self._ready)
            held.extend(job.id for job, *_ in self._pending_finish)
            if not held:
                continue
            try:
                await self._db_call(self.repo.extend_leases, self.worker_id, held, lease)
            except Exception as exc:
                logger.warning("extending leases failed (%s)", _describe(exc))

    async def _maintain_once(self) -> None:
        try:
            requeued = await self._db_call(self.repo.requeue_expired_leases)
            if requeued:
                logger.warning("took back %d jobs whose worker's lease expired", requeued)
            skipped = await self._db_call(self.repo.skip_expired_waits, self._reference_ttl)
            self._count_skipped_waits(skipped)
            queues = await self._db_call(self.repo.queue_stats_by_metric)
        except Exception as exc:
            logger.warning("queue maintenance failed (%s)", _describe(exc))
            return
        await self._report_presence()
        stats = _combined(queues[m] for m in self.metrics if m in queues)
        self.telemetry.queue = stats
        self.telemetry.queues = queues
        self._log_status(stats)

    async def _report_presence(self, *, stopped: bool = False) -> None:
        """Keep this worker's row in ``workers`` fresh (the variants it serves), and name the
        due jobs of variants no running worker serves, once per variant."""
        try:
            await self._db_call(
                self.repo.report_worker,
                self.worker_id,
                host=socket.gethostname(),
                pid=os.getpid(),
                metrics=list(self._scorers),
                started_at=self._started_at,
                stopped=stopped,
            )
            if stopped:
                return
            unserved = await self._db_call(self.repo.unserved_due, list(self._scorers))
        except Exception as exc:
            logger.warning("reporting this worker's variants failed (%s)", _describe(exc))
            return
        new = {m: n for m, n in unserved.items() if m not in self._unserved_said}
        if new:
            self._unserved_said.update(new)
            logger.warning(
                "%d queued job%s of variant%s no running worker serves: %s; start a worker "
                "with --metric for them, or end them with `recalltrace jobs cancel --metric KEY`",
                sum(new.values()),
                "s" if sum(new.values()) != 1 else "",
                "s" if len(new) != 1 else "",
                ", ".join(f"{m} ({n})" for m, n in sorted(new.items())),
            )

    def _log_status(self, queue: Any) -> None:
        """One line every ``status_interval_s`` on a long-running worker, instead of silence."""
        interval = self.options.status_interval_s
        now = time.monotonic()
        if interval is None or self._once or now < self._next_status:
            return
        if self._next_status == 0.0:  # the first refresh of a run: the start line says enough
            self._next_status = now + interval
            return
        self._next_status = now + interval
        lag = "-" if queue.oldest_due_age_s is None else f"{queue.oldest_due_age_s:.0f} s"
        s = self.stats
        logger.info(
            "status: scored %d, skipped %d, failed %d, retried %d since start; queue %d due, "
            "%d running, %d waiting, %d failed; lag %s%s",
            s.scored,
            s.skipped,
            s.failed,
            s.retried,
            queue.due,
            queue.running,
            queue.waiting,
            queue.failed,
            lag,
            "; judge paused" if self._paused_until > now else "",
        )

    def _count_skipped_waits(self, skipped: Sequence[Any]) -> None:
        """Jobs skipped because their reference never came are outcomes like any other: in
        the stats (the exit line), ``rag.worker.jobs`` and one evaluation event each."""
        for job in skipped:
            self.stats.skipped += 1
            self.telemetry.record_job("skipped", job.metric)
            result = ScoreResult(
                metric=job.metric,
                value=None,
                status="skipped",
                reason=job.reason,
                details={"skipped_by": "reference_ttl"},
                version=job.version,
            )
            self.telemetry.emit_evaluation(
                result,
                app_name=job.app_name,
                trace_id=job.trace_id,
                otel_trace_id=job.otel_trace_id,
                otel_span_id=job.otel_span_id,
            )
            if self._annotations is not None:
                self._annotations.send(
                    result,
                    record_id=job.trace_id,
                    app_name=job.app_name,
                    otel_span_id=job.otel_span_id,
                )

    async def _maintenance_loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.maintenance_interval_s)
            await self._maintain_once()
            await self._store_summaries_when_due()

    async def _store_summaries_when_due(self) -> None:
        """Store the summaries of history buckets that have ended, every
        ``summaries_interval_s`` (workers on one database share the work: a bucket stored by
        one is found stored by the others)."""
        interval = self.options.summaries_interval_s
        engine = getattr(self.repo, "engine", None)
        if interval is None or engine is None or time.monotonic() < self._next_summaries:
            return
        self._next_summaries = time.monotonic() + interval
        from recalltrace.scorers.catalog import current_versions
        from recalltrace.storage.history import History

        try:
            await self._db_call(History(engine, current_versions()).warm_summaries)
        except Exception as exc:
            if not self._summaries_failing:
                logger.warning(
                    "storing history summaries failed (%s); queries compute them until it "
                    "works again (said once)",
                    _describe(exc),
                )
            self._summaries_failing = True
            return
        if self._summaries_failing:
            logger.info("storing history summaries works again")
        self._summaries_failing = False

    async def _listen_loop(self) -> None:
        """Wake the claim loop on NOTIFY; reconnect after errors; polling covers the gaps."""
        import psycopg

        dsn = self.repo.notify_dsn()
        if dsn is None:
            return
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
                async with conn:
                    await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    self._wake.set()
                    async for _notify in conn.notifies():
                        self._wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("LISTEN connection lost (%s); polling meanwhile", _describe(exc))
                await asyncio.sleep(5.0)

    def close(self) -> None:
        """Release the database connections."""
        if self._db is not None:
            self._db.shutdown(wait=False)
            self._db = None
        self.repo.dispose()


# Failed writes of one batch before its scores are stored one by one (when the database is
# reachable but refuses the batch).
_ISOLATE_AFTER = 3


def _amount(value: float, unit: str) -> str:
    return f"{value:,.0f} tokens" if unit == "tokens" else f"{value:.4f} USD"


def _combined(parts: Iterable[QueueStats]) -> QueueStats:
    """The queue of several variants from theirs: counts add up, the lag is the oldest."""
    parts = list(parts)
    ages = [q.oldest_due_age_s for q in parts if q.oldest_due_age_s is not None]
    return QueueStats(
        due=sum(q.due for q in parts),
        running=sum(q.running for q in parts),
        waiting=sum(q.waiting for q in parts),
        failed=sum(q.failed for q in parts),
        oldest_due_age_s=max(ages) if ages else None,
    )


def _failed_result(job: Any, reason: str) -> ScoreResult:
    """The ``failed`` score a job ends with when no scorer result can be stored."""
    return ScoreResult(
        metric=job.metric,
        value=None,
        status="failed",
        reason=reason,
        details={"error": reason},
        version=job.version,
    )


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def run_worker(
    options: WorkerOptions | None = None,
    *,
    once: bool = False,
    telemetry: WorkerTelemetry | None = None,
    on_progress: Callable[[WorkerStats], None] | None = None,
) -> WorkerStats:
    """Run a worker in this process until stopped (or until nothing is due, with ``once``)."""
    worker = Worker(options, telemetry=telemetry, on_progress=on_progress)
    try:
        return asyncio.run(worker.run(once=once))
    finally:
        worker.close()
