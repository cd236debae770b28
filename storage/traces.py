"""Trace writes: a batch of finished records, their contexts and their jobs in one transaction.

On Postgres a batch goes in through binary ``COPY`` (several times faster than INSERTs); a batch
that is partly stored already (a writer resending what it could not confirm) falls back to row
inserts that skip what exists. SQLite always uses the row inserts.

A record whose id is stored already is compared with the stored row by its identity (start,
duration, app name, OpenTelemetry ids): the same request sent again is a success (the write is
idempotent), another request under the same id is a conflict, returned in the
:class:`~recalltrace.storage.records.WriteResult` and never stored over the first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import Engine, delete, insert, select

from recalltrace.storage import _postgres, summary_cache
from recalltrace.storage._dialect import NOTIFY_CHANNEL, Dialect
from recalltrace.storage._storable import json_safe, json_text, storable_record
from recalltrace.storage.contracts import JobSpec
from recalltrace.storage.db import engine_notes
from recalltrace.storage.errors import is_schema_missing
from recalltrace.storage.models import (
    JobStatus,
    RetrievedContext,
    ScoringJob,
    Trace,
    TraceTag,
)
from recalltrace.storage.pools import write_pools
from recalltrace.storage.queue_intake import job_rows
from recalltrace.storage.records import TraceRecord, WriteResult


class _DuplicateTrace(Exception):
    """A COPY hit a trace id that is already stored."""


class TraceWrites:
    """Writing and deleting traces (mixed into :class:`~.repository.Repository`)."""

    engine: Engine
    dialect: Dialect
    metrics: list[JobSpec]
    reference_ttl: timedelta

    def write_traces(self, records: Sequence[TraceRecord]) -> WriteResult:
        """Write a batch of trace records, their contexts and their jobs in one transaction.

        Idempotent on ``trace_id``: a record already stored with the same identity is left as
        it is, so a writer may resend a batch whose commit it could not confirm. A record whose
        id holds another request is not written: its id is in the result's ``conflicts``.
        """
        if not records:
            return WriteResult()
        try:
            return self._write_traces(records)
        except Exception as exc:
            # A SQLite file deleted or replaced in use is reopened (storage.db); the new file
            # has no tables. Where this repository may create the schema, it does, once.
            info = engine_notes(self.engine)
            if not (
                info.get("recreate_schema")
                and info.get("sqlite_reopened", 0) > info.get("sqlite_recreated", 0)
                and is_schema_missing(exc)
            ):
                raise
            from recalltrace.storage.migrate import upgrade_engine

            info["sqlite_recreated"] = info.get("sqlite_reopened", 0)
            upgrade_engine(self.engine)
            return self._write_traces(records)

    def _write_traces(self, records: Sequence[TraceRecord]) -> WriteResult:
        unique: dict[str, TraceRecord] = {}
        conflicts: list[str] = []
        for record in records:
            first = unique.setdefault(record.trace_id, record)
            if first is not record and _identity(first) != _identity(record):
                conflicts.append(record.trace_id)
        batch = [storable_record(record) for record in unique.values()]
        existing = self.dialect.write_traces(
            batch, by_rows=self._write_traces_rows, by_copy=self._write_traces_postgres
        )
        if existing:
            conflicts.extend(self._differing(batch, existing))
        return WriteResult(stored=len(records) - len(conflicts), conflicts=tuple(conflicts))

    def stored_ids(self, trace_ids: Sequence[str]) -> set[str]:
        """Which of ``trace_ids`` are stored."""
        table = Trace.__table__
        found: set[str] = set()
        with self.engine.connect() as conn:
            for start in range(0, len(trace_ids), 500):
                chunk = list(trace_ids[start : start + 500])
                found.update(
                    conn.scalars(select(table.c.trace_id).where(table.c.trace_id.in_(chunk)))
                )
        return found

    def _differing(self, batch: Sequence[TraceRecord], existing: set[str]) -> list[str]:
        """The ids of ``existing`` (records of ``batch`` found stored) under which another
        request is stored."""
        table = Trace.__table__
        with self.engine.connect() as conn:
            stored = {
                row.trace_id: row
                for row in conn.execute(
                    select(
                        table.c.trace_id,
                        table.c.app_name,
                        table.c.started_at,
                        table.c.duration_ms,
                        table.c.otel_trace_id,
                        table.c.otel_span_id,
                    ).where(table.c.trace_id.in_(sorted(existing)))
                )
            }
        differing = []
        for record in batch:
            row = stored.get(record.trace_id)
            if row is not None and _identity(record) != _identity(row):
                differing.append(record.trace_id)
        return differing

    def _trace_rows(self, batch: Sequence[TraceRecord], now: datetime) -> list[dict[str, Any]]:
        return [
            {
                "trace_id": r.trace_id,
                "app_name": r.app_name,
                "service_name": r.service_name,
                "started_at": r.started_at,
                "duration_ms": r.duration_ms,
                "user_input": r.user_input,
                "response": r.response,
                "reference": r.reference,
                "reference_contexts": r.reference_contexts,
                "reference_context_ids": r.reference_context_ids,
                "metadata": json_safe(r.metadata),
                "error": r.error,
                "notes": list(r.notes),
                "created_at": now,
                "otel_trace_id": r.otel_trace_id,
                "otel_span_id": r.otel_span_id,
                "release": r.release,
                "environment": r.environment,
                "user_id": r.user_id,
                "session_id": r.session_id,
                "tags": list(r.tags) or None,
            }
            for r in batch
        ]

    @staticmethod
    def _tag_rows(batch: Sequence[TraceRecord]) -> list[dict[str, Any]]:
        return [{"trace_id": r.trace_id, "tag": tag} for r in batch for tag in r.tags]

    @staticmethod
    def _context_rows(batch: Sequence[TraceRecord]) -> list[dict[str, Any]]:
        return [
            {
                "trace_id": r.trace_id,
                "position": i,
                "context_id": None if c.id is None else str(c.id),
                "content": c.content,
                "score": c.score if c.score is None or math.isfinite(c.score) else None,
                "metadata": json_safe(c.metadata),
            }
            for r in batch
            for i, c in enumerate(r.retrieved_contexts)
        ]

    def _write_traces_postgres(self, batch: Sequence[TraceRecord]) -> set[str]:
        try:
            self._copy_batch(batch)
        except _DuplicateTrace:
            # Some of the batch is stored already (a resend): write the rest row by row
            # through INSERT ... ON CONFLICT, which skips what exists.
            return self._write_traces_rows(batch)
        return set()

    def _copy_batch(self, batch: Sequence[TraceRecord]) -> None:
        from psycopg import errors as pg_errors
        from psycopg.types.json import Jsonb

        def jsonb(value: Any) -> Any:
            return None if value is None else Jsonb(value, json_text)

        with self.engine.begin() as conn:
            # Due times and reference deadlines come from the database's clock: an application
            # whose clock runs ahead would otherwise park its jobs until then.
            now = self.dialect.clock(conn)
            jobs = job_rows(self.metrics, batch, now, self.reference_ttl)
            cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
            try:
                with cursor.copy(_postgres.COPY_TRACES) as copy:
                    copy.set_types(_postgres.TRACE_COPY_TYPES)
                    for r in batch:
                        copy.write_row(
                            (
                                r.trace_id,
                                r.app_name,
                                r.service_name,
                                r.started_at,
                                float(r.duration_ms),
                                r.user_input,
                                r.response,
                                r.reference,
                                jsonb(r.reference_contexts),
                                jsonb(r.reference_context_ids),
                                Jsonb(json_safe(r.metadata), json_text),
                                bool(r.error),
                                Jsonb(list(r.notes), json_text),
                                now,
                                r.otel_trace_id,
                                r.otel_span_id,
                                r.release,
                                r.environment,
                                r.user_id,
                                r.session_id,
                                jsonb(list(r.tags) or None),
                            )
                        )
            except pg_errors.UniqueViolation:
                raise _DuplicateTrace() from None
            with cursor.copy(_postgres.COPY_CONTEXTS) as copy:
                copy.set_types(_postgres.CONTEXT_COPY_TYPES)
                for c in self._context_rows(batch):
                    copy.write_row(
                        (
                            c["trace_id"],
                            c["position"],
                            c["context_id"],
                            c["content"],
                            c["score"],
                            Jsonb(c["metadata"], json_text),
                        )
                    )
            write_pools(conn, batch)
            tags = self._tag_rows(batch)
            if tags:
                with cursor.copy(_postgres.COPY_TAGS) as copy:
                    for row in tags:
                        copy.write_row((row["trace_id"], row["tag"]))
            if jobs:
                with cursor.copy(_postgres.COPY_JOBS) as copy:
                    copy.set_types(_postgres.JOB_COPY_TYPES)
                    for j in jobs:
                        copy.write_row(
                            (
                                j["trace_id"],
                                j["metric"],
                                j["version"],
                                j["status"],
                                0,
                                j["run_at"],
                                j["expires_at"],
                                j["created_at"],
                                j["updated_at"],
                            )
                        )
                if any(j["status"] == JobStatus.QUEUED for j in jobs):
                    cursor.execute(_postgres.NOTIFY_RAW, (NOTIFY_CHANNEL,))

    def _write_traces_rows(self, batch: Sequence[TraceRecord]) -> set[str]:
        """Row inserts that skip stored trace ids: the SQLite path, and the Postgres path for a
        batch that is partly stored already. Returns the ids found stored already."""
        with self.engine.begin() as conn:
            now = self.dialect.clock(conn)
            inserted = set(
                conn.scalars(
                    self.dialect.insert(Trace.__table__)
                    .on_conflict_do_nothing(index_elements=["trace_id"])
                    .returning(Trace.__table__.c.trace_id),
                    self._trace_rows(batch, now),
                )
            )
            fresh = [r for r in batch if r.trace_id in inserted]
            contexts = self._context_rows(fresh)
            if contexts:
                conn.execute(insert(RetrievedContext), contexts)
            write_pools(conn, fresh)
            tags = self._tag_rows(fresh)
            if tags:
                conn.execute(insert(TraceTag), tags)
            jobs = job_rows(self.metrics, fresh, now, self.reference_ttl)
            if jobs:
                conn.execute(
                    self.dialect.insert(ScoringJob.__table__).on_conflict_do_nothing(), jobs
                )
                self.dialect.notify(conn)
        return {r.trace_id for r in batch} - inserted

    def delete_traces_before(self, cutoff: datetime) -> int:
        """Delete traces (and, by cascade, their contexts, jobs and scores) older than cutoff."""
        with self.engine.begin() as conn, summary_cache.score_writes(conn, self.dialect) as changes:
            deleted = conn.execute(delete(Trace).where(Trace.started_at < cutoff)).rowcount or 0
            if deleted:
                # Every bucket that starts before the cutoff may have lost scores.
                changes.deleted_before = cutoff
            return deleted

    def dispose(self) -> None:
        """Close every pooled connection (call in a forked child or at exit)."""
        self.engine.dispose()


def _identity(record: Any) -> tuple[Any, ...]:
    """What tells one request from another under the same id (a record or a stored row)."""
    started = record.started_at
    if started is not None and started.tzinfo is not None:
        started = started.astimezone(timezone.utc).replace(tzinfo=None)
    return (
        record.app_name,
        started,
        None if record.duration_ms is None else float(record.duration_ms),
        record.otel_trace_id,
        record.otel_span_id,
    )
