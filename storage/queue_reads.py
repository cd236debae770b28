"""What the queue reads for its workers: the inputs of a batch, queue depth and lag, judge spend."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Engine,
    func,
    select,
)

from recalltrace.storage._dialect import Dialect
from recalltrace.storage.contracts import (
    JobSpec,
    QueueStats,
    TraceInputs,
)
from recalltrace.storage.models import JobStatus, RetrievedContext, Score, ScoringJob, Trace
from recalltrace.storage.pools import load_pools
from recalltrace.storage.records import ContextRecord


class QueueReads:
    """Reads of the queue (part of :class:`~.queue.JobQueue`)."""

    engine: Engine
    dialect: Dialect
    specs: Mapping[str, JobSpec]
    metrics: list[JobSpec]
    reference_ttl: timedelta
    max_attempts: int

    def load_inputs(self, trace_ids: Iterable[str]) -> dict[str, TraceInputs]:
        """Load the traces behind a batch of jobs, shaped as scorer inputs (two queries)."""
        ids = sorted(set(trace_ids))
        if not ids:
            return {}
        with self.engine.connect() as conn:
            traces = conn.execute(
                select(
                    Trace.trace_id,
                    Trace.app_name,
                    Trace.started_at,
                    Trace.user_input,
                    Trace.response,
                    Trace.reference,
                    Trace.reference_contexts,
                    Trace.reference_context_ids,
                    Trace.otel_trace_id,
                    Trace.otel_span_id,
                ).where(Trace.trace_id.in_(ids))
            ).all()
            contexts = conn.execute(
                select(
                    RetrievedContext.trace_id,
                    RetrievedContext.context_id,
                    RetrievedContext.content,
                    RetrievedContext.score,
                    RetrievedContext.metadata_,
                )
                .where(RetrievedContext.trace_id.in_(ids))
                .order_by(RetrievedContext.trace_id, RetrievedContext.position)
            ).all()
            pools = load_pools(conn, ids)
        by_trace: dict[str, list[ContextRecord]] = {}
        for c in contexts:
            by_trace.setdefault(c.trace_id, []).append(
                ContextRecord(content=c.content, id=c.context_id, score=c.score, metadata=c[4])
            )
        result = {}
        for t in traces:
            ctx = by_trace.get(t.trace_id, [])
            ids_known = [c.id for c in ctx if c.id is not None]
            # No contexts at all is an empty retrieval (recall 0); contexts without ids mean
            # the retriever gives no ids, so the id-based variant has nothing to compare.
            retrieved_ids: list[str] | None = ids_known if (ids_known or not ctx) else None
            # Contexts that all lack text (a span that gave ids only) are no contexts to read:
            # the variants needing them skip the trace instead of scoring empty documents 0.
            texts: list[str] | None = [c.content for c in ctx]
            if ctx and not any(texts or ()):
                texts = None
            result[t.trace_id] = TraceInputs(
                trace_id=t.trace_id,
                app_name=t.app_name,
                started_at=t.started_at,
                user_input=t.user_input,
                response=t.response,
                retrieved_contexts=texts,
                retrieved_context_ids=retrieved_ids,
                reference=t.reference,
                reference_contexts=t.reference_contexts,
                reference_context_ids=t.reference_context_ids,
                otel_trace_id=t.otel_trace_id,
                otel_span_id=t.otel_span_id,
            )
            pool = pools.get(t.trace_id)
            if pool is not None:
                inputs = result[t.trace_id]
                inputs.pool_contexts = [c.content for c in pool]
                pool_ids = [c.id for c in pool]
                inputs.pool_context_ids = None if None in pool_ids else pool_ids  # type: ignore[assignment]
        return result

    def queue_stats_by_metric(self) -> dict[str, QueueStats]:
        """:meth:`queue_stats` per metric, for every metric with jobs and every known one (at
        zero): the queue as a property of the database, whichever workers run."""
        states = [JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.WAITING, JobStatus.FAILED]
        counts: dict[str, dict[str, int]] = {metric: {} for metric in self.specs}
        oldest: dict[str, Any] = {}
        with self.engine.connect() as conn:
            for metric, status, number in conn.execute(
                select(ScoringJob.metric, ScoringJob.status, func.count())
                .where(ScoringJob.status.in_(states))
                .group_by(ScoringJob.metric, ScoringJob.status)
            ).tuples():
                counts.setdefault(metric, {})[status] = int(number)
            # Ages are measured on the clock that set the due times (the database's, on
            # Postgres), so a worker whose own clock is off reports the real lag.
            current = self.dialect.clock(conn)
            for metric, first in conn.execute(
                select(ScoringJob.metric, func.min(ScoringJob.run_at))
                .where(ScoringJob.status == JobStatus.QUEUED, ScoringJob.run_at <= current)
                .group_by(ScoringJob.metric)
            ).tuples():
                oldest[metric] = first
        result = {}
        for metric, by_state in counts.items():
            due_since: datetime | None = oldest.get(metric)
            age = None
            if due_since is not None:
                if due_since.tzinfo is None:
                    due_since = due_since.replace(tzinfo=timezone.utc)
                age = max(0.0, (current - due_since).total_seconds())
            result[metric] = QueueStats(
                due=by_state.get(JobStatus.QUEUED, 0),
                running=by_state.get(JobStatus.RUNNING, 0),
                waiting=by_state.get(JobStatus.WAITING, 0),
                failed=by_state.get(JobStatus.FAILED, 0),
                oldest_due_age_s=age,
            )
        return result

    def judge_spend(self, model: str, since: datetime) -> tuple[int, float]:
        """Prompt plus completion tokens, and US dollars, of the results judged by ``model``
        and stored since ``since`` (by every worker)."""
        with self.engine.connect() as conn:
            tokens, usd = conn.execute(
                select(
                    func.coalesce(
                        func.sum(
                            func.coalesce(Score.prompt_tokens, 0)
                            + func.coalesce(Score.completion_tokens, 0)
                        ),
                        0,
                    ),
                    func.coalesce(func.sum(Score.cost_usd), 0.0),
                ).where(Score.model == model, Score.scored_at >= since)
            ).one()
        return int(tokens or 0), float(usd or 0.0)

    def queue_stats(self, metrics: Sequence[str] | None = None) -> QueueStats:
        """Counts of due, running, waiting and failed jobs, and the oldest due job's age.

        ``metrics`` limits the figures to those variants (a worker reports the lag of what it
        scores, not of variants nobody is configured to score).
        """
        only: list[ColumnElement[bool]] = []
        if metrics is not None:
            only.append(ScoringJob.metric.in_(list(metrics)))
        with self.engine.connect() as conn:
            counts: dict[str, int] = {}
            for status, number in conn.execute(
                select(ScoringJob.status, func.count())
                .where(
                    ScoringJob.status.in_(
                        [
                            JobStatus.QUEUED,
                            JobStatus.RUNNING,
                            JobStatus.WAITING,
                            JobStatus.FAILED,
                        ]
                    ),
                    *only,
                )
                .group_by(ScoringJob.status)
            ).tuples():
                counts[status] = int(number)
            current = self.dialect.clock(conn)
            oldest = conn.scalar(
                select(func.min(ScoringJob.run_at)).where(
                    ScoringJob.status == JobStatus.QUEUED, ScoringJob.run_at <= current, *only
                )
            )
        age = None
        if oldest is not None:
            if oldest.tzinfo is None:
                oldest = oldest.replace(tzinfo=timezone.utc)
            age = max(0.0, (current - oldest).total_seconds())
        return QueueStats(
            due=int(counts.get(JobStatus.QUEUED, 0)),
            running=int(counts.get(JobStatus.RUNNING, 0)),
            waiting=int(counts.get(JobStatus.WAITING, 0)),
            failed=int(counts.get(JobStatus.FAILED, 0)),
            oldest_due_age_s=age,
        )
