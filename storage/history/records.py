"""One stored record in full, and finding records by id prefix or OpenTelemetry trace id."""

from __future__ import annotations

from sqlalchemy import select

from recalltrace.storage._dialect import as_utc
from recalltrace.storage.contracts import TraceNotFound
from recalltrace.storage.history._base import HistoryBase
from recalltrace.storage.history.jobs import DEFAULT_STUCK_AFTER, JOB_COLUMNS, job_rows
from recalltrace.storage.history.selection import as_float, check_filter_text
from recalltrace.storage.history_rows import ContextRow, ScoreDetail, TraceDetail
from recalltrace.storage.models import RetrievedContext, Score, ScoringJob, Trace


class RecordQueries(HistoryBase):
    """:meth:`trace` and the lookups that find a record's id."""

    def record_ids_starting_with(self, prefix: str, limit: int = 20) -> list[str]:
        """Stored record ids that start with ``prefix`` (lowercase hex), at most ``limit``."""
        check_filter_text("prefix", prefix)
        if not prefix or any(c not in "0123456789abcdef" for c in prefix):
            raise ValueError(f"{prefix!r} is not the start of a record id (lowercase hex)")
        with self.engine.connect() as conn:
            return list(
                conn.scalars(
                    select(Trace.trace_id)
                    .where(Trace.trace_id >= prefix, Trace.trace_id < prefix + "g")
                    .order_by(Trace.trace_id)
                    .limit(limit)
                )
            )

    def records_of_otel_trace(self, otel_trace_id: str) -> list[str]:
        """The ids of the records stored for one OpenTelemetry trace id, oldest first (a
        trace may hold several requests)."""
        check_filter_text("otel_trace_id", otel_trace_id)
        with self.engine.connect() as conn:
            return list(
                conn.scalars(
                    select(Trace.trace_id)
                    .where(Trace.otel_trace_id == otel_trace_id)
                    .order_by(Trace.started_at, Trace.trace_id)
                )
            )

    def trace(self, trace_id: str) -> TraceDetail:
        """Everything stored about one record, by its id or by the OpenTelemetry trace id it
        ran in when that trace holds this one record; raises :class:`TraceNotFound` if there
        is none, naming the records when the trace id matches several."""
        check_filter_text("trace_id", trace_id)
        with self.engine.connect() as conn:
            found = conn.scalar(select(Trace.trace_id).where(Trace.trace_id == trace_id))
        if found is None:
            records = self.records_of_otel_trace(trace_id)
            if len(records) > 1:
                raise TraceNotFound(
                    f"the OpenTelemetry trace {trace_id} holds {len(records)} requests; show "
                    f"one of their records: {', '.join(records)}"
                )
            if records:
                trace_id = records[0]
        with self.engine.connect() as conn:
            trace = conn.execute(
                select(
                    Trace.trace_id,
                    Trace.app_name,
                    Trace.service_name,
                    Trace.started_at,
                    Trace.duration_ms,
                    Trace.user_input,
                    Trace.response,
                    Trace.reference,
                    Trace.reference_contexts,
                    Trace.reference_context_ids,
                    Trace.metadata_,
                    Trace.error,
                    Trace.notes,
                    Trace.otel_trace_id,
                    Trace.otel_span_id,
                    Trace.release,
                    Trace.environment,
                    Trace.user_id,
                    Trace.session_id,
                    Trace.tags,
                ).where(Trace.trace_id == trace_id)
            ).one_or_none()
            if trace is None:
                raise TraceNotFound(f"no trace is stored with id {trace_id!r}")
            contexts = conn.execute(
                select(
                    RetrievedContext.position,
                    RetrievedContext.context_id,
                    RetrievedContext.content,
                    RetrievedContext.score,
                    RetrievedContext.metadata_,
                )
                .where(RetrievedContext.trace_id == trace_id)
                .order_by(RetrievedContext.position)
            ).all()
            scores = conn.execute(
                select(
                    Score.metric,
                    Score.version,
                    Score.status,
                    Score.value,
                    Score.reason,
                    Score.details,
                    Score.model,
                    Score.prompt_tokens,
                    Score.completion_tokens,
                    Score.cost_usd,
                    Score.latency_ms,
                    Score.scored_at,
                )
                .where(Score.trace_id == trace_id)
                .order_by(Score.metric, Score.version)
            ).all()
            jobs = job_rows(
                conn,
                self.dialect,
                select(*JOB_COLUMNS)
                .where(ScoringJob.trace_id == trace_id)
                .order_by(ScoringJob.metric, ScoringJob.version),
                stuck_after=DEFAULT_STUCK_AFTER,
            )
        return TraceDetail(
            trace_id=trace.trace_id,
            app_name=trace.app_name,
            service_name=trace.service_name,
            started_at=as_utc(trace.started_at),
            duration_ms=float(trace.duration_ms),
            user_input=trace.user_input,
            response=trace.response,
            reference=trace.reference,
            reference_contexts=trace.reference_contexts,
            reference_context_ids=trace.reference_context_ids,
            metadata=trace[10] or {},
            error=bool(trace.error),
            notes=trace.notes or [],
            otel_trace_id=trace.otel_trace_id,
            otel_span_id=trace.otel_span_id,
            attributes={
                name: value
                for name, value in (
                    ("release", trace.release),
                    ("environment", trace.environment),
                    ("user_id", trace.user_id),
                    ("session_id", trace.session_id),
                    ("tags", trace.tags),
                )
                if value
            },
            contexts=tuple(
                ContextRow(
                    position=c.position,
                    context_id=c.context_id,
                    content=c.content,
                    score=c.score,
                    metadata=c[4] or {},
                )
                for c in contexts
            ),
            scores=tuple(
                ScoreDetail(
                    metric=s.metric,
                    version=s.version,
                    status=s.status,
                    value=as_float(s.value),
                    reason=s.reason,
                    details=s.details or {},
                    model=s.model,
                    prompt_tokens=s.prompt_tokens,
                    completion_tokens=s.completion_tokens,
                    cost_usd=s.cost_usd,
                    latency_ms=s.latency_ms,
                    scored_at=as_utc(s.scored_at),
                )
                for s in scores
            ),
            jobs=tuple(jobs),
        )
