"""Where a job's final outcome goes besides storage: the run's :class:`WorkerStats`, the
worker's telemetry (``rag.worker.jobs``, the score histogram, one evaluation event per score)
and, when configured, a Phoenix annotation."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from recalltrace.scorers._result import ScoreResult
from recalltrace.scorers.budget import JudgeBudget
from recalltrace.scorers.phoenix import PhoenixAnnotations
from recalltrace.scorers.telemetry import WorkerTelemetry
from recalltrace.scorers.worker._stats import Finished, WorkerStats
from recalltrace.storage.contracts import SkippedJob

logger = logging.getLogger("recalltrace.scorers.worker")


class Outcomes:
    """One worker's account of its jobs' outcomes, renewed per run by :meth:`start`."""

    def __init__(self, telemetry: WorkerTelemetry, budget: JudgeBudget | None) -> None:
        self._telemetry = telemetry
        self._budget = budget
        self._unpriced_said = False
        self.stats = WorkerStats()
        self.annotations: PhoenixAnnotations | None = None
        self.otel_ids: dict[int, tuple[str, str | None]] = {}
        """The OpenTelemetry ids of the requests being scored, by job id, for their events."""

    def start(self, annotations: PhoenixAnnotations | None) -> WorkerStats:
        """Begin a run: fresh stats (returned), the run's annotations, no ids held."""
        self.stats = WorkerStats()
        self.annotations = annotations
        self.otel_ids = {}
        return self.stats

    def rescheduled(self, status: str, metric: str) -> None:
        """A job was put back in the queue (``retried``) or failed for good by it."""
        if status == "failed":
            self.stats.failed += 1
            self._telemetry.record_job("failed", metric)
        else:
            self.stats.retried += 1
            self._telemetry.record_job("retried", metric)

    def stored(self, entries: Sequence[Finished]) -> None:
        """Count, export and annotate scores just stored."""
        for entry in entries:
            job, result = entry.job, entry.result
            self.stats.count(result.status)
            self._telemetry.record_job(result.status, job.metric)
            otel_trace_id, otel_span_id = self.otel_ids.pop(job.id, (None, None))
            self._telemetry.record_score(
                result,
                app_name=entry.app_name,
                trace_id=job.trace_id,
                judge_model=result.model,
                duration_s=entry.duration_s,
                otel_trace_id=otel_trace_id,
                otel_span_id=otel_span_id,
            )
            if self.annotations is not None:
                self.annotations.send(
                    result,
                    record_id=job.trace_id,
                    app_name=entry.app_name,
                    otel_span_id=otel_span_id,
                )
            self._say_unpriced(result)

    def skipped_waits(self, skipped: Sequence[SkippedJob]) -> None:
        """Jobs skipped because their reference never came are outcomes like any other: in
        the stats (the exit line), ``rag.worker.jobs`` and one evaluation event each."""
        for job in skipped:
            self.stats.skipped += 1
            self._telemetry.record_job("skipped", job.metric)
            result = ScoreResult(
                metric=job.metric,
                value=None,
                status="skipped",
                reason=job.reason,
                details={"skipped_by": "reference_ttl"},
                version=job.version,
            )
            self._telemetry.emit_evaluation(
                result,
                app_name=job.app_name,
                trace_id=job.trace_id,
                otel_trace_id=job.otel_trace_id,
                otel_span_id=job.otel_span_id,
            )
            if self.annotations is not None:
                self.annotations.send(
                    result,
                    record_id=job.trace_id,
                    app_name=job.app_name,
                    otel_span_id=job.otel_span_id,
                )

    def _say_unpriced(self, result: ScoreResult) -> None:
        """A budget in dollars cannot hold for a model LiteLLM has no price for: say so once."""
        budget = self._budget
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
