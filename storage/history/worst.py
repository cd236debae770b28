"""The lowest scored results with their reasons, optionally one per question."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, func, or_, select, union_all
from sqlalchemy.engine import Connection

from recalltrace.storage._dialect import as_utc
from recalltrace.storage.history._base import HistoryBase
from recalltrace.storage.history.selection import Selection
from recalltrace.storage.history_rows import WorstRow
from recalltrace.storage.models import Score, Trace

# The score columns a ``worst`` row is built from (:func:`_worst_row`).
_WORST_COLUMNS = (
    Score.trace_id,
    Score.metric,
    Score.version,
    Score.value,
    Score.reason,
    Score.app_name,
    Score.trace_started_at,
    Score.scored_at,
)


def _worst_row(r: Any, **extra: Any) -> WorstRow:
    """A :class:`WorstRow` from a result row of the score columns ``worst`` selects."""
    return WorstRow(
        trace_id=r.trace_id,
        metric=r.metric,
        version=r.version,
        value=float(r.value),
        reason=r.reason,
        app_name=r.app_name,
        trace_started_at=as_utc(r.trace_started_at),
        scored_at=as_utc(r.scored_at),
        **extra,
    )


class WorstQueries(HistoryBase):
    """:meth:`worst`."""

    def worst(
        self,
        *,
        metric: str | None = None,
        limit: int = 10,
        since: datetime | None = None,
        until: datetime | None = None,
        app: str | None = None,
        version: str | None = None,
        where: Sequence[tuple[str, str]] = (),
        per_question: bool = False,
    ) -> list[WorstRow]:
        """The ``limit`` lowest scored results, lowest first, with their reasons (among the
        traces whose request attributes match ``where``). With ``per_question``, one row per
        question (its lowest trace, with how many scored traces asked it), so one question
        asked a hundred times does not fill the list.

        Each metric is read at its current catalog version, or at ``version`` (which needs
        ``metric``). With no ``metric`` the lowest of every catalog metric are merged; each
        metric's part is read in value order from the partial index on (metric, version,
        value).
        """
        if limit < 1:
            raise ValueError("limit must be at least 1")
        chosen = self.select(
            metric=metric, version=version, since=since, until=until, app=app, where=where
        )
        if per_question:
            return self._worst_per_question(chosen, limit)
        parts = []
        for key, key_version in chosen.versions.items():
            one = chosen.of(key, key_version)
            part = one.joined(select(*_WORST_COLUMNS).select_from(Score))
            parts.append(
                part.where(Score.status == "scored", *one.conditions())
                .order_by(Score.value, Score.trace_started_at.desc(), Score.trace_id)
                .limit(limit)
            )
        with self.engine.connect() as conn:
            if len(parts) == 1:
                rows = conn.execute(parts[0]).all()
            else:
                merged = union_all(*(p.subquery().select() for p in parts)).subquery()
                rows = conn.execute(
                    select(merged)
                    .order_by(
                        merged.c.value,
                        merged.c.trace_started_at.desc(),
                        merged.c.trace_id,
                        merged.c.metric,
                    )
                    .limit(limit)
                ).all()
        return [_worst_row(r) for r in rows]

    def _worst_per_question(self, chosen: Selection, limit: int) -> list[WorstRow]:
        """Per metric: read the lowest results in value order (the partial value index),
        a few times ``limit`` at a time and eight times more each round, until ``limit``
        questions are found; then count each found question's scored traces through the
        hash index on the question. Only what the answer needs is read, however many results
        the window holds."""
        rows: list[WorstRow] = []
        for key, key_version in chosen.versions.items():
            conditions = chosen.of(key, key_version).conditions()
            conditions.append(Score.status == "scored")
            lowest = (
                select(*_WORST_COLUMNS, Trace.user_input.label("question"))
                .select_from(Score)
                .join(Trace, Trace.trace_id == Score.trace_id)
                .where(*conditions)
                .order_by(Score.value, Score.trace_started_at.desc(), Score.trace_id)
            )
            fetch = 4 * limit
            with self.engine.connect() as conn:
                while True:
                    batch = conn.execute(lowest.limit(fetch)).all()
                    first: dict[str, Any] = {}
                    for r in batch:
                        # A trace without a question and one with an empty question are the
                        # same "question".
                        first.setdefault(r.question or "", r)
                        if len(first) == limit:
                            break
                    if len(first) == limit or len(batch) < fetch:
                        break
                    fetch *= 8
                asked = self._count_questions(conn, conditions, list(first))
            rows.extend(
                _worst_row(r, question=r.question, traces_with_question=asked.get(question, 0))
                for question, r in first.items()
            )
        rows.sort(key=lambda r: (r.value, -r.trace_started_at.timestamp(), r.trace_id, r.metric))
        return rows[:limit]

    @staticmethod
    def _count_questions(
        conn: Connection, conditions: Sequence[ColumnElement[bool]], questions: list[str]
    ) -> dict[str, int]:
        """How many results matching ``conditions`` belong to traces asking each question
        (``""`` stands for no question)."""
        counted: dict[str, int] = {}
        asked = [q for q in questions if q]
        if asked:
            counted.update(
                (question, int(n))
                for question, n in conn.execute(
                    select(Trace.user_input, func.count())
                    .select_from(Score)
                    .join(Trace, Trace.trace_id == Score.trace_id)
                    .where(*conditions, Trace.user_input.in_(asked))
                    .group_by(Trace.user_input)
                )
            )
        if "" in questions:
            counted[""] = int(
                conn.execute(
                    select(func.count())
                    .select_from(Score)
                    .join(Trace, Trace.trace_id == Score.trace_id)
                    .where(*conditions, or_(Trace.user_input.is_(None), Trace.user_input == ""))
                ).scalar_one()
            )
        return counted
