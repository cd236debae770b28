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

Where it lives: ``_options`` (:class:`WorkerOptions` and the parsers the command line shares),
``_worker`` (the loop), ``_decisions`` (retry, pause, give-back and claim decisions, without a
database), ``_budget`` (the judge budget gate), ``_writer`` (storing scores), ``_outcomes``
(stats, telemetry and annotations of each outcome), ``_presence`` (the ``workers`` row, the
status line), ``_warming`` (background work handed in by the composition root).
"""

from recalltrace.scorers.worker._options import (
    WorkerOptions,
    flag_option,
    http_url,
    non_negative_seconds,
    port,
    positive_int,
    positive_number,
    positive_seconds,
)
from recalltrace.scorers.worker._stats import LEFT_BUDGET, Finished, WorkerStats
from recalltrace.scorers.worker._worker import Worker, default_worker_id, run_worker
from recalltrace.storage.contracts import ClaimedJob, TraceInputs

__all__ = [
    "LEFT_BUDGET",
    "ClaimedJob",
    "Finished",
    "TraceInputs",
    "Worker",
    "WorkerOptions",
    "WorkerStats",
    "default_worker_id",
    "flag_option",
    "http_url",
    "non_negative_seconds",
    "port",
    "positive_int",
    "positive_number",
    "positive_seconds",
    "run_worker",
]
