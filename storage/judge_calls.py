"""Judge answers kept across a worker's death: stored before they are used, read back by the
job that is taken again, deleted once they are no longer needed.

Storage treats everything here as opaque: ``key`` is the caller's digest of a request,
``scope`` names who paid for it (the worker uses its job), ``answer`` is the caller's JSON.
Writes are insert-or-ignore on ``key``: two writers of one key leave exactly one row, the
first one's. Rows go when their scope is forgotten (:meth:`JudgeCallStore.forget`) or when they
are older than a retention (:meth:`JudgeCallStore.purge`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, delete, func, select

from recalltrace.storage._dialect import dialect_of, utcnow
from recalltrace.storage.models import JudgeCall

__all__ = ["DEFAULT_RETENTION", "JudgeAnswers", "JudgeCallStore", "StoredAnswer"]

DEFAULT_RETENTION = timedelta(days=7)
"""How long a row whose scope was never forgotten is kept (a job cancelled or deleted while
its answers were stored, a worker killed between storing a result and forgetting)."""

_MAX_KEY = 64
_MAX_SCOPE = 200


@dataclass(frozen=True, slots=True)
class StoredAnswer:
    """One stored answer and who paid for it."""

    key: str
    scope: str
    answer: dict[str, Any]
    created_at: datetime


class JudgeCallStore:
    """The ``judge_calls`` table of one database."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._dialect = dialect_of(engine)

    def find(self, key: str) -> StoredAnswer | None:
        """The answer stored under ``key``, or ``None``."""
        with self.engine.connect() as conn:
            row = conn.execute(
                select(
                    JudgeCall.key, JudgeCall.scope, JudgeCall.answer, JudgeCall.created_at
                ).where(JudgeCall.key == key)
            ).first()
        if row is None:
            return None
        return StoredAnswer(row.key, row.scope, dict(row.answer), row.created_at)

    def keep(
        self, key: str, scope: str, answer: dict[str, Any], *, now: datetime | None = None
    ) -> bool:
        """Store ``answer`` under ``key`` unless a row has that key already; returns whether
        this call stored it (``False``: another writer's row was there first and is kept)."""
        if not key or len(key) > _MAX_KEY:
            raise ValueError(f"a judge call key is 1 to {_MAX_KEY} characters, got {len(key)}")
        if not scope or len(scope) > _MAX_SCOPE:
            raise ValueError(
                f"a judge call scope is 1 to {_MAX_SCOPE} characters, got {len(scope)}"
            )
        stmt = (
            self._dialect.insert(JudgeCall.__table__)
            .values(key=key, scope=scope, answer=answer, created_at=now or utcnow())
            .on_conflict_do_nothing(index_elements=["key"])
            .returning(JudgeCall.key)
        )
        with self.engine.begin() as conn:
            return conn.execute(stmt).first() is not None

    def forget(self, scopes: Iterable[str]) -> int:
        """Delete every row of ``scopes``; returns how many went."""
        wanted: Sequence[str] = sorted(set(scopes))
        if not wanted:
            return 0
        removed = 0
        with self.engine.begin() as conn:
            for start in range(0, len(wanted), 500):
                result = conn.execute(
                    delete(JudgeCall).where(JudgeCall.scope.in_(wanted[start : start + 500]))
                )
                removed += result.rowcount or 0
        return removed

    def purge(
        self, older_than: timedelta = DEFAULT_RETENTION, *, now: datetime | None = None
    ) -> int:
        """Delete the rows stored more than ``older_than`` ago; returns how many went."""
        if older_than < timedelta(0):
            raise ValueError("older_than must not be negative")
        cutoff = (now or utcnow()) - older_than
        with self.engine.begin() as conn:
            result = conn.execute(delete(JudgeCall).where(JudgeCall.created_at < cutoff))
        return result.rowcount or 0

    def count(self, scope: str | None = None) -> int:
        """Rows stored (of ``scope``, or all)."""
        stmt = select(func.count()).select_from(JudgeCall)
        if scope is not None:
            stmt = stmt.where(JudgeCall.scope == scope)
        with self.engine.connect() as conn:
            return int(conn.scalar(stmt) or 0)


class JudgeAnswers:
    """The judge answers of a repository's database (a mixin of
    :class:`~recalltrace.storage.repository.Repository`, which has ``engine``)."""

    engine: Engine

    def _judge_calls(self) -> JudgeCallStore:
        store: JudgeCallStore | None = getattr(self, "_judge_call_store", None)
        if store is None:
            store = JudgeCallStore(self.engine)
            self._judge_call_store = store
        return store

    def find_judge_answer(self, key: str) -> tuple[str, dict[str, Any]] | None:
        """Who paid for ``key`` and its stored answer, or ``None``."""
        found = self._judge_calls().find(key)
        return None if found is None else (found.scope, found.answer)

    def keep_judge_answer(self, key: str, scope: str, answer: dict[str, Any]) -> bool:
        """Store ``answer`` under ``key`` for ``scope`` unless ``key`` is stored already;
        returns whether this call stored it."""
        return self._judge_calls().keep(key, scope, answer)

    def forget_judge_answers(self, scopes: Iterable[str]) -> int:
        """Delete every stored answer of ``scopes``."""
        return self._judge_calls().forget(scopes)

    def purge_judge_answers(self, older_than: timedelta = DEFAULT_RETENTION) -> int:
        """Delete the answers stored more than ``older_than`` ago."""
        return self._judge_calls().purge(older_than)
