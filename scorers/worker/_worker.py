"""The worker itself: the claim loop, running each job under a bounded concurrency, what each
outcome does to its job, and the loops beside it (leases, maintenance, wake-ups, deadline)."""

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
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

from recalltrace.scorers._base import Scorer
from recalltrace.scorers._cache import judge_call_scope
from recalltrace.scorers._errors import ScorerInputError, TerminalJudgeError, TransientJudgeError
from recalltrace.scorers._judge import JudgeCallRecord, JudgeClient
from recalltrace.scorers._result import ScoreResult
from recalltrace.scorers.catalog import CATALOG, NON_LLM_METRICS, metric_info, metrics_from_env
from recalltrace.scorers.phoenix import PhoenixAnnotations
from recalltrace.scorers.telemetry import WorkerTelemetry
from recalltrace.scorers.worker._answers import JudgeAnswerTable, StoredAnswers
from recalltrace.scorers.worker._budget import BudgetGate
from recalltrace.scorers.worker._decisions import (
    ClaimSizing,
    JudgeHold,
    attempt_left,
    backoff,
    given_back_cause,
    transient_action,
    transient_backoff_attempt,
)
from recalltrace.scorers.worker._options import WorkerOptions
from recalltrace.scorers.worker._outcomes import Outcomes
from recalltrace.scorers.worker._presence import Presence, StatusLine, combined, describe
from recalltrace.scorers.worker._stats import Finished, WorkerStats
from recalltrace.scorers.worker._warming import Warming
from recalltrace.scorers.worker._writer import ScoreWriter, failed_result
from recalltrace.storage.contracts import ClaimedJob, JobStore, TraceInputs

logger = logging.getLogger("recalltrace.scorers.worker")

T = TypeVar("T")


@dataclass
class _Running:
    job: ClaimedJob
    task: asyncio.Task[None]
    started: float


def default_worker_id() -> str:
    """``host:pid:random``, unique across hosts and restarts."""
    return f"{socket.gethostname()}:{os.getpid()}:{random.randrange(16**6):06x}"


class Worker:
    """An asyncio scoring worker over any :class:`~recalltrace.storage.contracts.JobStore`.

    ``warm`` is called every ``summaries_interval_s`` in a database thread to store what later
    queries would otherwise compute: ``recalltrace worker`` hands in
    ``History.warm_summaries`` (in Python: ``warm=recalltrace.open_history(url).warm_summaries``);
    ``None`` stores nothing, and queries compute the summaries they read.
    """

    def __init__(
        self,
        options: WorkerOptions | None = None,
        *,
        repository: JobStore | None = None,
        telemetry: WorkerTelemetry | None = None,
        on_progress: Callable[[WorkerStats], None] | None = None,
        warm: Callable[[], object] | None = None,
    ) -> None:
        self.options = options or WorkerOptions()
        if repository is None:
            from recalltrace.scorers.catalog import job_specs
            from recalltrace.storage.repository import open_repository

            repository = open_repository(
                self.options.database_url, specs=job_specs(), metrics=metrics_from_env()
            )
        self.repo: JobStore = repository
        self._warming = Warming(warm, self.options.summaries_interval_s)
        self._reference_ttl = (
            None
            if self.options.reference_ttl_s is None
            else timedelta(seconds=self.options.reference_ttl_s)
        )
        self.telemetry = telemetry or WorkerTelemetry()
        self.on_progress = on_progress
        self.worker_id = self.options.worker_id or default_worker_id()
        self._outcomes = Outcomes(self.telemetry, self.options.judge_budget)
        self._judge: JudgeClient | None = None
        self._scorers: dict[str, Scorer] = {}
        self._not_configured: list[str] = []
        self._build_scorers()
        judge = self.options.judge
        self.telemetry.initialise(self._scorers, judge.model if judge is not None else None)
        self._hold = JudgeHold()
        budget = self.options.judge_budget
        self._budget = (
            BudgetGate(budget, judge.model) if budget is not None and judge is not None else None
        )
        self._once = False
        # A one-shot run claims a job that failed transiently once only (the judge client has
        # retried it already); the next run takes it again.
        self._once_excluded: set[int] = set()
        self._left_cause: dict[int, str] = {}
        self._running: dict[int, _Running] = {}
        # Claimed jobs with their traces loaded, waiting for a free slot: a slot that frees up
        # starts the next job at once instead of waiting for a claim round trip.
        self._ready: deque[tuple[ClaimedJob, TraceInputs | None]] = deque()
        self._answers = self._stored_answers()
        self._writer = ScoreWriter(
            self.repo,
            self._db_call,
            batch_size=self.options.batch_size,
            grace_period_s=self.options.grace_period_s,
            on_stored=self._on_stored,
            on_not_stored=self._on_not_stored,
            after_written=None if self._answers is None else self._answers.forget,
        )
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._stop_requested = threading.Event()
        self.stopped_by: str | None = None
        """The signal that stopped the last run (``SIGINT``, ``SIGTERM``), if one did."""
        self._db: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._presence: Presence | None = None
        self._status = StatusLine(None)

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
            bind = getattr(self._scorers.get(key), "bind_storage", None)
            if bind is not None:
                bind(self.repo, self._db_call)  # judgments kept in the worker's database
        if self._not_configured and opts.metrics is not None:
            raise ValueError(
                f"{', '.join(self._not_configured)} need(s) a judge model "
                "(set --judge-model, or WorkerOptions.judge)"
            )

    def _stored_answers(self) -> StoredAnswers | None:
        """Judge answers kept in the worker's database, when it judges and its job store
        keeps them (the repository does)."""
        if self._judge is None or not isinstance(self.repo, JudgeAnswerTable):
            return None
        return StoredAnswers(self.repo, self._db_call)

    @property
    def stats(self) -> WorkerStats:
        """What the current (or last) run did."""
        return self._outcomes.stats

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
            if self._budget is not None:
                self._budget.note_possibly_billed(
                    datetime.now(timezone.utc), record.possibly_billed_tokens, usd
                )

    def _claimable_metrics(self) -> list[str]:
        if self._hold.held(time.monotonic()):
            return [k for k in self._scorers if k in NON_LLM_METRICS]
        return list(self._scorers)

    async def _check_budget(self) -> None:
        """Before claiming: hold the judge model's spend this period against the budget, and
        hold the LLM variants back until the period ends once it is reached."""
        gate = self._budget
        if gate is None or not any(k not in NON_LLM_METRICS for k in self._scorers):
            return

        async def read_spend(model: str, since: datetime) -> tuple[int, float]:
            return await self._db_call(self.repo.judge_spend, model, since)

        checked = await gate.check(
            read_spend, lambda: [entry.result for entry in self._writer.pending], self._hold
        )
        if checked is not None and checked[0] == "reached":
            self.stats.budget_reached += 1
            budget = gate.budget
            self.telemetry.record_budget_reached(gate.model, budget.unit, checked[1], budget.amount)

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
        annotations = None
        if self.options.phoenix_url:
            annotations = PhoenixAnnotations(
                self.options.phoenix_url,
                api_key=self.options.phoenix_api_key or os.environ.get("PHOENIX_API_KEY"),
            )
        self._outcomes.start(annotations)
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._writer.reset()
        self._once = once
        self._status = StatusLine(None if once else self.options.status_interval_s)
        self._presence = Presence(
            self.repo,
            self._db_call,
            worker_id=self.worker_id,
            metrics=list(self._scorers),
            started_at=datetime.now(timezone.utc),
        )
        if self._stop_requested.is_set():
            self._stop.set()
        signals = self._install_signal_handlers()
        self._once_excluded = set()
        self._left_cause = {}
        if self._not_configured:
            logger.warning(
                "no judge model configured: %s are not scored (set --judge-model)",
                ", ".join(self._not_configured),
            )
        logger.info("worker %s scoring %s", self.worker_id, ", ".join(self._scorers) or "nothing")
        finisher = asyncio.create_task(self._writer.run(), name="recalltrace-finish")
        helpers = [
            asyncio.create_task(self._maintenance_loop(), name="recalltrace-maintenance"),
            asyncio.create_task(self._lease_loop(), name="recalltrace-leases"),
        ]
        if self.options.listen and not once:
            helpers.append(
                asyncio.create_task(
                    self.repo.wait_for_jobs(self._wake.set), name="recalltrace-listen"
                )
            )
        if once:
            helpers.append(asyncio.create_task(self._deadline_loop(), name="recalltrace-deadline"))
        try:
            await self._maintain_once()
            await self._claim_loop(once)
            await self._drain()
            if once:
                # The final export of a one-shot run reports the queue it leaves behind, not
                # the one it found (a cron user's lag alert would fire after every good run).
                await self._writer.flush()
                await self._maintain_once()
                await self._count_left_unscored()
        finally:
            # Scores already computed are written before anything else stops; the finisher
            # is never cancelled in the middle of a write.
            self._writer.close_soon()
            with contextlib.suppress(Exception):
                await finisher
            await self._presence.report(stopped=True)
            if self._outcomes.annotations is not None:
                annotations, self._outcomes.annotations = self._outcomes.annotations, None
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
            logger.error("counting the jobs left unscored failed (%s)", describe(exc))
            self.stats.left_unscored = sum(causes.values())
            return
        self.stats.left_unscored = left.due + left.running

    async def _claim_loop(self, once: bool) -> None:
        opts = self.options
        sizing = ClaimSizing(concurrency=opts.concurrency, batch_size=opts.batch_size)
        claim_failures = 0
        while not self._stop.is_set():
            # Cleared before the state is read, not when waiting: a job that finishes in
            # between sets it again, and the wait then returns at once (no lost wake-up).
            self._wake.clear()
            self._launch_ready()
            limit = sizing.limit(running=len(self._running), ready=len(self._ready))
            idle = not self._running and not self._ready
            claimed: list[ClaimedJob] = []
            await self._check_budget()
            metrics = self._claimable_metrics()
            if metrics and limit > 0:
                try:
                    claimed = await self._db_call(
                        self.repo.claim_jobs,
                        self.worker_id,
                        limit=limit,
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
                    logger.error("claiming jobs failed (%s); retrying", describe(exc))
                    await self._sleep(min(opts.poll_interval_s, 5.0))
                    continue
                claim_failures = 0
                if claimed:
                    await self._prepare(claimed)
                    continue
            if once and not claimed and idle:
                if not self._writer.outstanding():
                    return
                # Only the last scores are left to write: have them written now and look
                # again soon, rather than idling a poll interval at the end of every run.
                self._writer.flush_soon()
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

    async def _prepare(self, jobs: Sequence[ClaimedJob]) -> None:
        """Load the traces of claimed jobs and queue them for a free slot."""
        try:
            inputs = await self._db_call(self.repo.load_inputs, [j.trace_id for j in jobs])
        except Exception as exc:
            logger.error("loading traces failed (%s); giving the jobs back", describe(exc))
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

    # -- one job ------------------------------------------------------------------------
    async def _process(self, job: ClaimedJob, trace: TraceInputs | None) -> None:
        started = time.monotonic()
        app = trace.app_name if trace is not None else ""
        scorer = self._scorers.get(job.metric)
        uses_llm = scorer is not None and scorer.uses_llm
        if uses_llm and self._budget is not None and self._budget.stale:
            # A judge call timed out since the spend was last read: it may be billed, so the
            # budget is read again before another call is sent.
            self._budget.stale = False
            await self._check_budget()
        give_back, cause = self._hold.give_back(uses_llm=uses_llm, now=time.monotonic())
        if give_back:
            # Claimed before the judge was paused or the budget was reached: give it back
            # untouched.
            if cause is not None:
                self._left_cause[job.id] = cause
            await self._give_back(job)
            return
        if trace is not None and trace.otel_trace_id:
            self._outcomes.otel_ids[job.id] = (trace.otel_trace_id, trace.otel_span_id)
        try:
            if scorer is None:
                raise RuntimeError(f"no scorer for metric {job.metric!r} in this worker")
            if trace is None:
                raise LookupError(f"trace {job.trace_id} is no longer stored")
            if uses_llm and self._answers is not None:
                # Every judge answer is stored before it is used: taken again after this
                # worker dies, the job reads them instead of paying for the calls again.
                with judge_call_scope(self._answers.scope(job)) as kept:
                    try:
                        result: ScoreResult = await scorer.ascore(**trace.scorer_inputs())
                    finally:
                        self.stats.judge_answers_replayed += kept.replayed
            else:
                result = await scorer.ascore(**trace.scorer_inputs())
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
        if result.status == "failed" and attempt_left(job.attempts, self.options.max_attempts):
            if uses_llm and self._answers is not None:
                await self._answers.forget([job])  # the next attempt asks the judge afresh
            await self._retry(job, result.reason, consume_attempt=True)
            return
        self._queue_finish(Finished(job, result, app, time.monotonic() - started))

    def _backoff(self, attempt: int, hint: float | None = None) -> timedelta:
        opts = self.options
        return backoff(
            attempt, base_s=opts.retry_backoff_s, max_s=opts.retry_backoff_max_s, hint_s=hint
        )

    async def _retry(
        self,
        job: ClaimedJob,
        error: str,
        *,
        consume_attempt: bool,
        delay: timedelta | None = None,
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
            logger.error("rescheduling job %s failed (%s)", job.id, describe(exc))
            return
        self._outcomes.rescheduled(status, job.metric)

    async def _on_transient(self, job: ClaimedJob, exc: TransientJudgeError, app: str) -> None:
        action = transient_action(
            unreachable=exc.unreachable,
            first_transient_at=job.first_transient_at,
            now=datetime.now(timezone.utc),
            max_age_s=self.options.transient_max_age_s,
        )
        if action == "pause":
            # Nothing answered at all after the client's retries (nothing listening, a wrong
            # host): waiting job by job would hang silently; pause as a bad key does.
            await self._pause(job, exc, "cannot reach the judge")
            return
        if action == "fail":
            self._finish_failed(
                job,
                f"The judge kept failing transiently for too long: {exc}",
                time.monotonic(),
                app,
            )
            return
        delay = self._backoff(transient_backoff_attempt(job.attempts), exc.retry_after_s)
        if self._once:
            self._once_excluded.add(job.id)
            self._left_cause[job.id] = "the judge kept failing"
        await self._retry(job, f"transient: {exc}", consume_attempt=False, delay=delay)

    async def _on_terminal(self, job: ClaimedJob, exc: TerminalJudgeError) -> None:
        await self._pause(job, exc, "fix the judge configuration (API key, model name, budget)")

    async def _pause(self, job: ClaimedJob, exc: Exception, advice: str) -> None:
        self._left_cause[job.id] = "the judge was paused"
        model = getattr(exc, "model", None)
        if self._hold.pause(time.monotonic(), self.options.terminal_pause_s):
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

    async def _give_back(self, job: ClaimedJob) -> None:
        try:
            self.stats.released += await self._db_call(
                self.repo.release_jobs, self.worker_id, [job.id]
            )
        except Exception as exc:
            logger.error("giving back job %s failed (%s)", job.id, describe(exc))

    async def _on_error(
        self, job: ClaimedJob, exc: BaseException, started: float, app: str
    ) -> None:
        message = f"{type(exc).__name__}: {exc}"
        logger.warning("job %s (%s) raised %s", job.id, job.metric, message)
        if attempt_left(job.attempts, self.options.max_attempts):
            await self._retry(job, message, consume_attempt=True)
        else:
            self._finish_failed(job, f"Scoring raised {message}", started, app)

    def _finish_failed(self, job: ClaimedJob, reason: str, started: float, app: str) -> None:
        result = failed_result(job, reason)
        self._queue_finish(Finished(job, result, app, time.monotonic() - started))

    def _queue_finish(self, finished: Finished) -> None:
        self._left_cause.pop(finished.job.id, None)
        self._writer.add(finished)

    # -- stored scores ------------------------------------------------------------------
    def _on_stored(self, stored: list[Finished]) -> None:
        self._outcomes.stored(stored)
        if self.on_progress is not None:
            self.on_progress(self.stats)

    def _on_not_stored(self, entry: Finished) -> None:
        self._outcomes.otel_ids.pop(entry.job.id, None)

    # -- stopping -----------------------------------------------------------------------
    async def _drain(self) -> None:
        """Give back jobs not started; wait for running ones up to the grace period, then
        give back the rest."""
        if self._ready:
            waiting = [job.id for job, _trace in self._ready]
            self._ready.clear()
            await self._release(waiting)
        if not self._running:
            return
        tasks = [r.task for r in self._running.values()]
        grace = self.options.grace_period_s if self._stop.is_set() else None
        _done, pending = await asyncio.wait(tasks, timeout=grace)
        if pending:
            held = [r.job.id for r in list(self._running.values()) if r.task in pending]
            cause = given_back_cause(deadline_reached=self.stats.deadline_reached)
            for job_id in held:
                self._left_cause[job_id] = cause
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            released = await self._release(held)
            if released is not None:
                logger.warning("gave back %d unfinished jobs", released)

    async def _release(self, job_ids: list[int]) -> int | None:
        try:
            released = await self._db_call(self.repo.release_jobs, self.worker_id, job_ids)
        except Exception as exc:
            logger.error(
                "could not give back %d jobs (%s); their leases will expire",
                len(job_ids),
                describe(exc),
            )
            return None
        self.stats.released += released
        return released

    # -- beside the loop ----------------------------------------------------------------
    async def _lease_loop(self) -> None:
        interval = max(0.05, self.options.lease_s / 3)
        lease = timedelta(seconds=self.options.lease_s)
        while True:
            await asyncio.sleep(interval)
            held = list(self._running)
            held.extend(job.id for job, _trace in self._ready)
            held.extend(entry.job.id for entry in self._writer.pending)
            if not held:
                continue
            try:
                await self._db_call(self.repo.extend_leases, self.worker_id, held, lease)
            except Exception as exc:
                logger.warning("extending leases failed (%s)", describe(exc))

    async def _maintain_once(self) -> None:
        try:
            requeued = await self._db_call(self.repo.requeue_expired_leases)
            if requeued:
                logger.warning("took back %d jobs whose worker's lease expired", requeued)
            skipped = await self._db_call(self.repo.skip_expired_waits, self._reference_ttl)
            self._outcomes.skipped_waits(skipped)
            queues = await self._db_call(self.repo.queue_stats_by_metric)
        except Exception as exc:
            logger.warning("queue maintenance failed (%s)", describe(exc))
            return
        if self._answers is not None:
            await self._answers.purge_when_due()
        if self._presence is not None:
            await self._presence.report()
        stats = combined([queues[m] for m in self.metrics if m in queues])
        self.telemetry.queue = stats
        self.telemetry.queues = queues
        now = time.monotonic()
        if self._status.due(now):
            self._status.log(self.stats, stats, paused=self._hold.paused(now))

    async def _maintenance_loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.maintenance_interval_s)
            await self._maintain_once()
            await self._warming.when_due(self._db_call)

    def close(self) -> None:
        """Release the database connections."""
        if self._db is not None:
            self._db.shutdown(wait=False)
            self._db = None
        self.repo.dispose()


def run_worker(
    options: WorkerOptions | None = None,
    *,
    once: bool = False,
    telemetry: WorkerTelemetry | None = None,
    on_progress: Callable[[WorkerStats], None] | None = None,
    warm: Callable[[], object] | None = None,
) -> WorkerStats:
    """Run a worker in this process until stopped (or until nothing is due, with ``once``);
    ``warm`` as for :class:`Worker`."""
    worker = Worker(options, telemetry=telemetry, on_progress=on_progress, warm=warm)
    try:
        return asyncio.run(worker.run(once=once))
    finally:
        worker.close()
