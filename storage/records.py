"""Plain records exchanged between the tracer, storage and the worker.

This module imports nothing heavy: the tracer builds these on its background thread and hands
them to storage; the worker reads them back. They are the contracts of the architecture doc.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(slots=True)
class ContextRecord:
    """One retrieved context, in retrieval order."""

    content: str
    """The text the retriever returned."""
    id: str | None = None
    """The document or chunk id, if the retriever gave one (compared as a string)."""
    score: float | None = None
    """The retriever's own relevance score, if any."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """JSON-serialisable metadata of the document."""


@dataclass(slots=True)
class TraceRecord:
    """One finished RAG request, as the tracer hands it to storage."""

    trace_id: str
    """The record's own id, 32 lowercase hex digits: one per RAG request (an OpenTelemetry trace
    may hold several requests, each stored as its own record)."""
    app_name: str
    """The name of the root (``@tracer.rag``) span."""
    service_name: str
    """The OpenTelemetry ``service.name`` of the process that served the request."""
    started_at: datetime
    """Start time of the root span (timezone-aware, UTC)."""
    duration_ms: float
    """Duration of the root span in milliseconds."""
    user_input: str | None = None
    response: str | None = None
    retrieved_contexts: list[ContextRecord] = field(default_factory=list)
    reference: str | None = None
    reference_contexts: list[str] | None = None
    reference_context_ids: list[str] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    """Free-form JSON-serialisable metadata (user tags, span attributes worth keeping)."""
    error: bool = False
    """True when the root function raised."""
    notes: list[str] = field(default_factory=list)
    """What was changed on the way in (scrubbed keys, truncated documents), one line each."""
    otel_trace_id: str | None = None
    """The OpenTelemetry trace id of the request (32 hex digits), for finding it in a viewer."""
    otel_span_id: str | None = None
    """The span id of the request's root span (16 hex digits)."""
    release: str | None = None
    """The application's release (version) that served the request."""
    environment: str | None = None
    """The deployment environment (``production``, ``staging``, ...)."""
    user_id: str | None = None
    """The end user the request served, as the application names them."""
    session_id: str | None = None
    """The conversation or session the request belongs to."""
    tags: list[str] = field(default_factory=list)
    """Free-form labels to filter and group history by."""
    pool_contexts: list[ContextRecord] | None = None
    """The documents of the request's pool (``@retrieval(pool=...)``, retrieved after the
    request), in the pool's rank order; ``None`` when no pool was retrieved."""
    pool_source: str | None = None
    """The name of the pool that returned ``pool_contexts``."""


@dataclass(slots=True)
class ReferenceUpdate:
    """Ground truth that arrives after the trace was stored (``tracer.set_reference``), or a
    pool retrieved after the request (``@retrieval(pool=...)``): both travel the same way."""

    trace_id: str
    reference: str | None = None
    reference_contexts: list[str] | None = None
    reference_context_ids: list[str] | None = None
    pool_contexts: list[ContextRecord] | None = None
    """A pool retrieved after the request (``@retrieval(pool=...)``), stored with the trace."""
    pool_source: str | None = None
    """The name of that pool."""


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What a sink did with a batch of records (``TraceSink.write_traces`` returns it).

    Every record of the batch is in exactly one of: stored (``stored``, which counts records
    written now and records a resend found stored already with the same identity), ``conflicts``
    or ``unassembled``. A sink that returns ``None`` stored every record.
    """

    stored: int = 0
    """Records the batch stored, or found stored with the same identity (a resend)."""
    conflicts: tuple[str, ...] = ()
    """Ids of records not stored because another record is stored under the same id (same
    id, a different request: its start, duration, app or OpenTelemetry ids differ). Each is a
    loud error: two processes drew one id, or a record was changed and sent again."""
    unassembled: tuple[str, ...] = ()
    """Ids of plain traces a storage process could not assemble into records (not stored)."""

    @property
    def refused(self) -> int:
        """Records of the batch not stored."""
        return len(self.conflicts) + len(self.unassembled)
