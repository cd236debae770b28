"""The rows history queries return, and the statistics helpers they share.

Plain frozen dataclasses with ``as_dict`` for JSON output; nothing here touches the database.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

Bucket = Literal["hour", "day"]
BUCKETS: tuple[Bucket, ...] = ("hour", "day")

PERCENTILES = (0.1, 0.5, 0.9)


def percentile(sorted_values: Sequence[float], fraction: float) -> float | None:
    """The ``fraction`` percentile of ascending ``sorted_values``, as ``percentile_cont``.

    Linear interpolation between the two closest ranks; ``None`` for no values.
    """
    if not sorted_values:
        return None
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must lie in [0, 1], not {fraction!r}")
    position = fraction * (len(sorted_values) - 1)
    lower = math.floor(position)
    upper = min(lower + 1, len(sorted_values) - 1)
    weight = position - lower
    return sorted_values[lower] + (sorted_values[upper] - sorted_values[lower]) * weight


# -- rows --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SummaryRow:
    """The scores of one metric in one time bucket."""

    bucket_start: datetime
    """Start of the bucket (UTC, truncated to the hour or the day)."""
    metric: str
    version: str
    """The metric's version these scores were computed by."""
    count: int
    """Number of ``scored`` results; the statistics below are over these."""
    mean: float | None
    p10: float | None
    p50: float | None
    p90: float | None
    skipped: int
    """Results that had nothing to score (a missing input, a reference that never came)."""
    failed: int
    """Results where the judge could not produce a valid answer."""
    by: str | None = None
    """With a summary grouped by a request attribute: its name."""
    group: str | None = None
    """With ``by``: the attribute's value (``None`` for the traces without it)."""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (the bucket as an ISO 8601 string; with ``by``, the group
        under the attribute's name after the bucket)."""
        grouped = {} if self.by is None else {self.by: self.group}
        return {
            "bucket_start": self.bucket_start.isoformat(),
            **grouped,
            "metric": self.metric,
            "version": self.version,
            "count": self.count,
            "mean": self.mean,
            "p10": self.p10,
            "p50": self.p50,
            "p90": self.p90,
            "skipped": self.skipped,
            "failed": self.failed,
        }


@dataclass(frozen=True, slots=True)
class WorstRow:
    """One low-scoring trace."""

    trace_id: str
    metric: str
    version: str
    value: float
    reason: str
    app_name: str
    trace_started_at: datetime
    scored_at: datetime
    question: str | None = None
    """With ``per_question``: the question (the lowest trace stands for every trace of it)."""
    traces_with_question: int | None = None
    """With ``per_question``: the scored traces of the window that asked the same question."""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (times as ISO 8601 strings)."""
        result = {
            "trace_id": self.trace_id,
            "metric": self.metric,
            "version": self.version,
            "value": self.value,
            "reason": self.reason,
            "app_name": self.app_name,
            "trace_started_at": self.trace_started_at.isoformat(),
            "scored_at": self.scored_at.isoformat(),
        }
        if self.traces_with_question is not None:
            result["question"] = self.question
            result["traces_with_question"] = self.traces_with_question
        return result


@dataclass(frozen=True, slots=True)
class GroupSums:
    """One group's scored values, aggregated: enough for a mean, a variance and a 0/1 test."""

    count: int
    total: float
    total_squares: float
    fractional: int
    """Values that are neither 0 nor 1."""
    values: tuple[float, ...] | None = None
    """The values themselves, for small groups."""


@dataclass(frozen=True, slots=True)
class CostRow:
    """What the judge cost on one UTC day (by the time scores were stored), for one variant
    and one judge model."""

    day: datetime
    metric: str
    model: str
    scores: int
    """Stored results that called the judge (scored, skipped or failed)."""
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None
    """The sum of the priced results; ``None`` when none had a price."""
    unpriced: int
    """Results whose cost LiteLLM's price list did not know (not in ``cost_usd``)."""
    by: str | None = None
    """With a cost grouped by a request attribute: its name."""
    group: str | None = None
    """With ``by``: the attribute's value (``None`` for the traces without it)."""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (with ``by``, the group under the attribute's name after
        the day)."""
        grouped = {} if self.by is None else {self.by: self.group}
        return {
            "day": self.day.date().isoformat(),
            **grouped,
            "metric": self.metric,
            "model": self.model,
            "scores": self.scores,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost_usd": self.cost_usd,
            "unpriced": self.unpriced,
        }


@dataclass(frozen=True, slots=True)
class WindowStats:
    """Scores of one metric over one time window (what ``recalltrace check`` tests)."""

    metric: str
    version: str
    """The metric's version these scores were computed by."""
    since: datetime | None
    until: datetime | None
    app: str | None
    count: int
    """Number of ``scored`` results."""
    mean: float | None
    skipped: int
    failed: int


@dataclass(frozen=True, slots=True)
class ContextRow:
    """One retrieved context of a trace, in retrieval order."""

    position: int
    context_id: str | None
    content: str
    score: float | None
    metadata: Mapping[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary."""
        return {
            "position": self.position,
            "context_id": self.context_id,
            "content": self.content,
            "score": self.score,
            "metadata": dict(self.metadata),
        }


@dataclass(frozen=True, slots=True)
class ScoreDetail:
    """One stored result with its reason, evidence and judge accounting."""

    metric: str
    version: str
    status: str
    value: float | None
    reason: str
    details: Mapping[str, Any]
    """The variant's evidence, as stored (see the metrics spec for each variant's keys)."""
    model: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cost_usd: float | None
    latency_ms: float | None
    scored_at: datetime

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary."""
        return {
            "metric": self.metric,
            "version": self.version,
            "status": self.status,
            "value": self.value,
            "reason": self.reason,
            "details": dict(self.details),
            "model": self.model,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost_usd": self.cost_usd,
            "latency_ms": self.latency_ms,
            "scored_at": self.scored_at.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class JobCounts:
    """The jobs of one variant by state, and the workers that serve it."""

    metric: str
    waiting: int
    queued: int
    running: int
    failed: int
    cancelled: int
    live_workers: int
    """Running workers that score this variant (seen within the last two minutes)."""
    last_worker_seen_at: datetime | None
    """When a worker scoring this variant was last seen; ``None``: none in the last week."""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary."""
        return {
            "metric": self.metric,
            "waiting": self.waiting,
            "queued": self.queued,
            "running": self.running,
            "failed": self.failed,
            "cancelled": self.cancelled,
            "live_workers": self.live_workers,
            "last_worker_seen_at": (
                None if self.last_worker_seen_at is None else self.last_worker_seen_at.isoformat()
            ),
        }


@dataclass(frozen=True, slots=True)
class JobRow:
    """A scoring job, as ``recalltrace jobs list`` shows it."""

    id: int
    trace_id: str
    metric: str
    version: str
    status: str
    """The stored ``scoring_jobs.status``."""
    problem: str | None
    """``failed``, ``lease_expired`` (its worker died or stalled), ``overdue`` (due for long
    although a worker scoring its variant ran in that time), ``unserved`` (due for long and no
    worker seen in that time scores its variant), ``reference_expired`` (the reference wait ran
    out but nobody closed the job), or ``None`` for a healthy job."""
    attempts: int
    last_error: str | None
    run_at: datetime
    locked_by: str | None
    lease_expires_at: datetime | None
    updated_at: datetime

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (times as ISO 8601 strings)."""
        return {
            "id": self.id,
            "trace_id": self.trace_id,
            "metric": self.metric,
            "version": self.version,
            "status": self.status,
            "problem": self.problem,
            "attempts": self.attempts,
            "last_error": self.last_error,
            "run_at": self.run_at.isoformat(),
            "locked_by": self.locked_by,
            "lease_expires_at": (
                None if self.lease_expires_at is None else self.lease_expires_at.isoformat()
            ),
            "updated_at": self.updated_at.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class TraceDetail:
    """One stored trace in full: inputs, contexts, answer, reference, scores and jobs."""

    trace_id: str
    app_name: str
    service_name: str
    started_at: datetime
    duration_ms: float
    user_input: str | None
    response: str | None
    reference: str | None
    reference_contexts: Sequence[str] | None
    reference_context_ids: Sequence[str] | None
    metadata: Mapping[str, Any]
    error: bool
    notes: Sequence[str]
    contexts: tuple[ContextRow, ...]
    scores: tuple[ScoreDetail, ...]
    """Every stored result, by metric then version."""
    jobs: tuple[JobRow, ...]
    """Every scoring job of the trace, including those not finished yet."""
    otel_trace_id: str | None = None
    """The OpenTelemetry trace id the request ran in (records stored before 0005: none)."""
    otel_span_id: str | None = None
    """The span id of the request's root span."""
    attributes: Mapping[str, Any] = field(default_factory=dict)
    """The request's attributes that are set: ``release``, ``environment``, ``user_id``,
    ``session_id``, ``tags``."""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary."""
        return {
            "trace_id": self.trace_id,
            "otel_trace_id": self.otel_trace_id,
            "otel_span_id": self.otel_span_id,
            "attributes": dict(self.attributes),
            "app_name": self.app_name,
            "service_name": self.service_name,
            "started_at": self.started_at.isoformat(),
            "duration_ms": self.duration_ms,
            "user_input": self.user_input,
            "response": self.response,
            "reference": self.reference,
            "reference_contexts": (
                None if self.reference_contexts is None else list(self.reference_contexts)
            ),
            "reference_context_ids": (
                None if self.reference_context_ids is None else list(self.reference_context_ids)
            ),
            "metadata": dict(self.metadata),
            "error": self.error,
            "notes": list(self.notes),
            "contexts": [c.as_dict() for c in self.contexts],
            "scores": [s.as_dict() for s in self.scores],
            "jobs": [j.as_dict() for j in self.jobs],
        }


def group_by_metric(rows: Iterable[SummaryRow]) -> dict[str, list[SummaryRow]]:
    """Summary rows split by metric, each list in bucket order (for charts)."""
    series: dict[str, list[SummaryRow]] = {}
    for row in sorted(rows, key=lambda r: (r.metric, r.bucket_start)):
        series.setdefault(row.metric, []).append(row)
    return series
