"""Pools and kept judgments: documents retrieved after a request, and answers by digest.

A pool is what a second retrieval (``@retrieval(pool=...)``) returned for a request, run after
it: storage keeps its documents in rank order with the pool's name and hands them back as
scorer inputs, knowing nothing of how they are scored. A job whose specification needs
``pool_contexts`` exists only for traces that have a pool (:data:`~.contracts.POOL_INPUTS`).

``judgments`` keeps answers that depend only on their inputs under the caller's digest of them
(opaque JSON here); writes are insert-or-ignore, so two writers of one key leave the first row.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, delete, insert, select

from recalltrace.storage._dialect import dialect_of, utcnow
from recalltrace.storage._storable import storable_json
from recalltrace.storage.models import Judgment, PoolDocument
from recalltrace.storage.records import ContextRecord

__all__ = ["JudgmentStore", "attach_pool", "load_pools", "pool_rows", "write_pools"]

_MAX_KEY = 64
_MAX_SOURCE = 200


def pool_rows(
    trace_id: str, contexts: Sequence[ContextRecord], source: str | None
) -> list[dict[str, Any]]:
    """The ``pool_documents`` rows of one trace's pool, in rank order."""
    shown = None if source is None else source[:_MAX_SOURCE]
    return [
        {
            "trace_id": trace_id,
            "position": index,
            "context_id": None if c.id is None else storable_json(str(c.id))[0][:500],
            "content": storable_json(c.content)[0],
            "score": c.score if c.score is None or math.isfinite(c.score) else None,
            "source": shown,
        }
        for index, c in enumerate(contexts)
    ]


def write_pools(conn: Connection, records: Iterable[Any]) -> int:
    """Store the pools of freshly written ``records`` (those whose ``pool_contexts`` is not
    ``None``) in the caller's transaction; returns how many documents were written."""
    rows: list[dict[str, Any]] = []
    for record in records:
        contexts = getattr(record, "pool_contexts", None)
        if contexts:
            rows.extend(pool_rows(record.trace_id, contexts, record.pool_source))
    if rows:
        conn.execute(insert(PoolDocument), rows)
    return len(rows)


def attach_pool(
    conn: Connection, trace_id: str, contexts: Sequence[ContextRecord], source: str | None
) -> None:
    """Put ``contexts`` in place of the stored pool of ``trace_id`` (a pool sent again
    replaces the first one, so a resend stores it once)."""
    conn.execute(delete(PoolDocument).where(PoolDocument.trace_id == trace_id))
    rows = pool_rows(trace_id, contexts, source)
    if rows:
        conn.execute(insert(PoolDocument), rows)


def load_pools(conn: Connection, trace_ids: Sequence[str]) -> dict[str, list[ContextRecord]]:
    """The stored pools of ``trace_ids`` (traces without one are absent), in rank order."""
    found: dict[str, list[ContextRecord]] = {}
    for start in range(0, len(trace_ids), 500):
        rows = conn.execute(
            select(
                PoolDocument.trace_id,
                PoolDocument.context_id,
                PoolDocument.content,
                PoolDocument.score,
            )
            .where(PoolDocument.trace_id.in_(list(trace_ids[start : start + 500])))
            .order_by(PoolDocument.trace_id, PoolDocument.position)
        ).all()
        for row in rows:
            found.setdefault(row.trace_id, []).append(
                ContextRecord(content=row.content, id=row.context_id, score=row.score)
            )
    return found


class JudgmentStore:
    """The ``judgments`` table of one database: answers kept by the caller's digest."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._dialect = dialect_of(engine)

    def find(self, keys: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The answers stored under ``keys`` (keys not stored are absent)."""
        wanted = sorted(set(keys))
        found: dict[str, dict[str, Any]] = {}
        with self.engine.connect() as conn:
            for start in range(0, len(wanted), 500):
                for row in conn.execute(
                    select(Judgment.key, Judgment.answer).where(
                        Judgment.key.in_(wanted[start : start + 500])
                    )
                ):
                    found[row.key] = dict(row.answer)
        return found

    def keep(self, answers: Mapping[str, dict[str, Any]]) -> int:
        """Store each answer under its key unless that key is stored already; returns how many
        were stored now."""
        for key in answers:
            if not key or len(key) > _MAX_KEY:
                raise ValueError(f"a judgment key is 1 to {_MAX_KEY} characters, got {len(key)}")
        if not answers:
            return 0
        now = utcnow()
        stored = 0
        with self.engine.begin() as conn:
            for key, answer in answers.items():
                stmt = (
                    self._dialect.insert(Judgment.__table__)
                    .values(key=key, answer=answer, created_at=now)
                    .on_conflict_do_nothing(index_elements=["key"])
                    .returning(Judgment.key)
                )
                stored += conn.execute(stmt).first() is not None
        return stored
