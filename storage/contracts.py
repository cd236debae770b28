"""What storage needs from its callers, and what it hands back: the contracts of the layer.

Storage knows nothing of the variants: which jobs a trace gets (a metric, its version and the
inputs it waits for) is handed to it as :class:`JobSpec` values, and a score arrives as any
object shaped like :class:`ScoreLike`. This module imports nothing heavy, so the tracer and
the worker can name these types without loading SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

NOTIFY_CHANNEL = "recalltrace_jobs"
"""Postgres channel on which new due jobs are announced to idle workers (``LISTEN`` on it)."""

#: Inputs that can arrive after the trace was stored (``set_reference``): a job that needs one
#: of them waits for it instead of running.
REFERENCE_INPUTS: frozenset[str] = frozenset(
    {"reference", "reference_contexts", "reference_context_ids"}
)
#: Inputs a trace has only when a pool was retrieved for it (``@retrieval(pool=...)``): a job
#: that needs one is created when the pool is stored, never for a trace without one.
POOL_INPUTS: frozenset[str] = frozenset({"pool_contexts"})


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One variant as the job queue sees it: a job per (trace, metric, version)."""

    metric: str
    """The variant's key, stored in ``scoring_jobs.metric`` and ``scores.metric``."""
    version: str
    """The variant's current version; a new version gets new jobs beside the old scores."""
    needs: tuple[str, ...]
    """The scorer inputs the variant reads (``user_input``, ``reference``, ...)."""

    @property
    def waits_for(self) -> tuple[str, ...]:
        """The needed inputs that may arrive late: the job waits until they are stored."""
        return tuple(name for name in self.needs if name in REFERENCE_INPUTS)

    @property
    def needs_reference(self) -> bool:
        """True when the job may have to wait for ground truth."""
        return bool(self.waits_for)

    @property
    def needs_pool(self) -> bool:
        """True when the job exists only for traces with a stored pool."""
        return any(name in POOL_INPUTS for name in self.needs)


def spec_map(specs: Iterable[JobSpec]) -> dict[str, JobSpec]:
    """``specs`` keyed by metric; raises ``ValueError`` when a metric appears twice."""
    result: dict[str, JobSpec] = {}
    for spec in specs:
        if spec.metric in result:
            raise ValueError(f"two job specifications for metric {spec.metric!r}")
        result[spec.metric] = spec
    return result


class UnknownMetric(KeyError, ValueError):
    """A metric key no job specification names; the message lists the known keys."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def check_metric(metric: str, known: Mapping[str, Any]) -> str:
    """Return ``metric`` if ``known`` has it, else raise :class:`UnknownMetric` listing them."""
    if metric not in known:
        names = ", ".join(sorted(known))
        raise UnknownMetric(f"unknown metric {metric!r}; known metrics: {names}")
    return metric


class TraceNotFound(LookupError):
    """No trace is stored with the given id."""


class ScoreLike(Protocol):
    """What the repository reads from a scorer's result when it stores it."""

    @property
    def metric(self) -> str: ...
    @property
    def value(self) -> float | None: ...
    @property
    def status(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def details(self) -> Mapping[str, Any]: ...
    @property
    def model(self) -> str | None: ...
    @property
    def prompt_tokens(self) -> int | None: ...
    @property
    def completion_tokens(self) -> int | None: ...
    @property
    def cost_usd(self) -> float | None: ...
    @property
    def latency_ms(self) -> float | None: ...
    @property
    def version(self) -> str: ...


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job a worker holds a lease on."""

    id: int
    trace_id: str
    metric: str
    version: str
    attempts: int
    first_transient_at: datetime | None
    created_at: datetime


@dataclass(slots=True)
class TraceInputs:
    """A stored trace, shaped as scorer inputs."""

    trace_id: str
    app_name: str
    started_at: datetime
    user_input: str | None
    response: str | None
    retrieved_contexts: list[str] | None
    retrieved_context_ids: list[str] | None
    reference: str | None
    reference_contexts: list[str] | None
    reference_context_ids: list[str] | None
    otel_trace_id: str | None = None
    """The OpenTelemetry trace id the request ran in (``None`` for records stored before
    records had their own ids, whose ``trace_id`` is it)."""
    otel_span_id: str | None = None
    """The span id of the request's root span."""
    pool_contexts: list[str] | None = None
    """The texts of the request's pool in rank order (``None``: no pool was stored)."""
    pool_context_ids: list[str] | None = None
    """The ids of the pool's documents, position for position (``None`` when any lacks one)."""

    def scorer_inputs(self) -> dict[str, Any]:
        """Keyword inputs for ``Scorer.ascore`` (the spec's names)."""
        return {
            "user_input": self.user_input,
            "response": self.response,
            "retrieved_contexts": self.retrieved_contexts,
            "retrieved_context_ids": self.retrieved_context_ids,
            "reference": self.reference,
            "reference_contexts": self.reference_contexts,
            "reference_context_ids": self.reference_context_ids,
            "pool_contexts": self.pool_contexts,
            "pool_context_ids": self.pool_context_ids,
        }


@dataclass(frozen=True, slots=True)
class QueueStats:
    """The lag a user alerts on."""

    due: int
    running: int
    waiting: int
    failed: int
    oldest_due_age_s: float | None


@dataclass(frozen=True, slots=True)
class SkippedJob:
    """A job skipped without running: its reference did not arrive in time."""

    trace_id: str
    metric: str
    version: str
    app_name: str
    reason: str
    otel_trace_id: str | None = None
    otel_span_id: str | None = None


class JobStore(Protocol):
    """What a scoring worker needs of storage (:class:`~.repository.Repository` is one)."""

    async def wait_for_jobs(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` whenever new jobs may have become due, until cancelled; return at once
        if the backend announces nothing (the caller then polls)."""
        ...

    def claim_jobs(
        self,
        worker_id: str,
        *,
        limit: int,
        lease: timedelta,
        metrics: Sequence[str] | None = None,
        exclude: Sequence[int] = (),
    ) -> list[ClaimedJob]: ...
    def extend_leases(self, worker_id: str, job_ids: Sequence[int], lease: timedelta) -> int: ...
    def requeue_expired_leases(self) -> int: ...
    def release_jobs(self, worker_id: str, job_ids: Sequence[int]) -> int: ...
    def finish_jobs(self, outcomes: Sequence[tuple[ClaimedJob, ScoreLike]]) -> list[bool]: ...
    def reschedule_job(
        self,
        job: ClaimedJob,
        *,
        delay: timedelta,
        error: str,
        consume_attempt: bool,
        max_attempts: int | None = None,
    ) -> str: ...
    def fail_job(self, job: ClaimedJob, error: str, *, attempts: int | None = None) -> None: ...
    def expire_waiting_jobs(self, older_than: timedelta | None = None) -> int: ...
    def skip_expired_waits(self, older_than: timedelta | None = None) -> list[SkippedJob]: ...
    def load_inputs(self, trace_ids: Iterable[str]) -> dict[str, TraceInputs]: ...
    def queue_stats(self, metrics: Sequence[str] | None = None) -> QueueStats: ...
    def judge_spend(self, model: str, since: datetime) -> tuple[int, float]: ...
    def queue_stats_by_metric(self) -> dict[str, QueueStats]: ...
    def report_worker(
        self,
        worker_id: str,
        *,
        host: str,
        pid: int,
        metrics: Sequence[str],
        started_at: datetime,
        stopped: bool = False,
    ) -> None: ...
    def unserved_due(self, metrics_served_here: Sequence[str]) -> dict[str, int]: ...
    def dispose(self) -> None: ...
