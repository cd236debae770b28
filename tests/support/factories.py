"""Builders of realistic test records."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import Engine

from recalltrace.scorers.catalog import current_versions, job_specs
from recalltrace.storage.history import History
from recalltrace.storage.records import ContextRecord, TraceRecord
from recalltrace.storage.repository import Repository


def new_trace_id() -> str:
    """A random 32-hex-digit trace id, as OpenTelemetry makes them."""
    return os.urandom(16).hex()


def make_trace(
    *,
    trace_id: str | None = None,
    app_name: str = "support-bot",
    contexts: int = 3,
    context_chars: int = 120,
    reference: str | None = "Paris is the capital of France.",
    reference_contexts: list[str] | None = None,
    reference_context_ids: list[str] | None = None,
    started_at: datetime | None = None,
    response: str | None = "The capital of France is Paris.",
) -> TraceRecord:
    """A trace record with ``contexts`` retrieved documents of ``context_chars`` characters."""
    body = "Paris is the capital and most populous city of France. " * (context_chars // 50 + 1)
    return TraceRecord(
        trace_id=trace_id or new_trace_id(),
        app_name=app_name,
        service_name="test-service",
        started_at=started_at or datetime.now(timezone.utc) - timedelta(seconds=1),
        duration_ms=42.0,
        user_input="What is the capital of France?",
        response=response,
        retrieved_contexts=[
            ContextRecord(
                content=f"[{i}] " + body[:context_chars],
                id=f"doc_{i}",
                score=1.0 - i / 10,
                metadata={"source": f"kb/{i}.md"},
            )
            for i in range(contexts)
        ],
        reference=reference,
        reference_contexts=reference_contexts,
        reference_context_ids=reference_context_ids,
        metadata={"user_tier": "pro"},
    )


def make_repository(engine: Engine, **options: Any) -> Repository:
    """A repository on ``engine`` that knows every variant of the catalog."""
    return Repository(engine, specs=job_specs(), **options)


def make_history(engine: Engine) -> History:
    """History queries on ``engine`` at the catalog's current versions."""
    return History(engine, current_versions())
