"""Human labels: a person's score for a trace and variant, stored beside the judge's.

Labels are keyed by (trace, variant, labeller): importing the same labeller's label again
replaces it. :meth:`LabelStore.agreement_pairs` pairs each label with the stored judge score
of the same trace and variant, for agreement figures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, delete, insert, select

from recalltrace.storage._dialect import dialect_of, utcnow
from recalltrace.storage.models import Label, Score, Trace


@dataclass(frozen=True)
class LabelInput:
    """One label to store."""

    trace_id: str
    metric: str
    value: float
    labeller: str
    note: str | None = None
    claims: list[Any] | None = None

    def problem(self) -> str | None:
        """Why this label cannot be stored, or ``None``."""
        if not isinstance(self.value, (int, float)) or isinstance(self.value, bool):
            return f"value {self.value!r} is not a number"
        if math.isnan(self.value) or not 0.0 <= self.value <= 1.0:
            return f"value {self.value!r} is outside [0, 1]"
        if not self.trace_id:
            return "no trace_id"
        if not self.labeller:
            return "no labeller"
        return None


@dataclass(frozen=True)
class AgreementPair:
    """A label and the judge's stored score of the same trace and variant."""

    trace_id: str
    labeller: str
    label: float
    note: str | None
    score: float
    reason: str
    model: str | None
    version: str


class LabelStore:
    """Labels on an engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.dialect = dialect_of(engine)

    def write(self, labels: Sequence[LabelInput]) -> int:
        """Store ``labels`` in one transaction (replacing a labeller's earlier label of the
        same trace and variant). Raises ``ValueError`` naming the first bad label, and the
        number of bad ones, before storing anything."""
        problems = [(i, label.problem()) for i, label in enumerate(labels)]
        bad = [(i, p) for i, p in problems if p is not None]
        if bad:
            index, problem = bad[0]
            raise ValueError(f"label {index + 1}: {problem} ({len(bad)} bad label(s) in all)")
        ids = sorted({label.trace_id for label in labels})
        with self.engine.begin() as conn:
            known: set[str] = set()
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                known.update(conn.scalars(select(Trace.trace_id).where(Trace.trace_id.in_(chunk))))
            unknown = [i for i in ids if i not in known]
            if unknown:
                raise ValueError(
                    f"no trace is stored with id {unknown[0]!r} ({len(unknown)} unknown trace "
                    "id(s) in all); nothing was imported"
                )
            now = utcnow()
            for label in labels:
                conn.execute(
                    delete(Label).where(
                        Label.trace_id == label.trace_id,
                        Label.metric == label.metric,
                        Label.labeller == label.labeller,
                    )
                )
            if labels:
                conn.execute(
                    insert(Label),
                    [
                        {
                            "trace_id": label.trace_id,
                            "metric": label.metric,
                            "labeller": label.labeller,
                            "value": float(label.value),
                            "claims": label.claims,
                            "note": label.note,
                            "created_at": now,
                        }
                        for label in labels
                    ],
                )
        return len(labels)

    def agreement_pairs(
        self,
        metric: str,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[AgreementPair]:
        """Every label of ``metric`` with the judge's scored result of the same trace (every
        stored version of the variant), for traces started in ``[since, until)``."""
        conditions = [Label.metric == metric, Score.status == "scored"]
        if since is not None:
            conditions.append(Score.trace_started_at >= since)
        if until is not None:
            conditions.append(Score.trace_started_at < until)
        stmt = (
            select(
                Label.trace_id,
                Label.labeller,
                Label.value,
                Label.note,
                Score.value,
                Score.reason,
                Score.model,
                Score.version,
            )
            .select_from(Label)
            .join(Score, (Score.trace_id == Label.trace_id) & (Score.metric == Label.metric))
            .where(*conditions)
            .order_by(Label.trace_id, Label.labeller, Score.version)
        )
        with self.engine.connect() as conn:
            return [
                AgreementPair(
                    trace_id=row[0],
                    labeller=row[1],
                    label=float(row[2]),
                    note=row[3],
                    score=float(row[4]),
                    reason=row[5],
                    model=row[6],
                    version=row[7],
                )
                for row in conn.execute(stmt)
            ]

    def labelled(
        self,
        metric: str,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[tuple[str, str, float, str | None]]:
        """Every label of ``metric`` on a stored trace started in ``[since, until)``, as
        (trace id, labeller, value, note), whether or not the judge scored the trace."""
        conditions = [Label.metric == metric]
        if since is not None:
            conditions.append(Trace.started_at >= since)
        if until is not None:
            conditions.append(Trace.started_at < until)
        stmt = (
            select(Label.trace_id, Label.labeller, Label.value, Label.note)
            .join(Trace, Trace.trace_id == Label.trace_id)
            .where(*conditions)
            .order_by(Label.trace_id, Label.labeller)
        )
        with self.engine.connect() as conn:
            return [(row[0], row[1], float(row[2]), row[3]) for row in conn.execute(stmt)]
