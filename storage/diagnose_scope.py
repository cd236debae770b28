"""The scored results one diagnosis or comparison reads (:mod:`storage.diagnose`,
:mod:`storage.diagnose_clusters`): the metric at a version in a window, an app, and the request
attributes' filters, as conditions on the scores (joined to the traces where a filter needs
it)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, select

from recalltrace.storage.models import Score, Trace, TraceTag

REQUEST_ATTRIBUTES = ("release", "environment", "tag", "app", "service", "user_id", "session_id")
"""The request attributes sliced, in this order."""


_ON_SCORES: dict[str, Any] = {
    "release": Score.release,
    "environment": Score.environment,
    "app": Score.app_name,
}
_ON_TRACES: dict[str, Any] = {
    "user_id": Trace.user_id,
    "session_id": Trace.session_id,
    "service": Trace.service_name,
}


class Scope:
    """The scored results a diagnosis reads: conditions on the scores, and whether they need
    the traces joined."""

    def __init__(
        self,
        metric: str,
        version: str,
        since: datetime | None,
        until: datetime | None,
        app: str | None,
        where: Sequence[tuple[str, str]],
    ) -> None:
        conditions: list[ColumnElement[bool]] = [
            Score.metric == metric,
            Score.version == version,
            Score.status == "scored",
        ]
        if app is not None:
            conditions.append(Score.app_name == app)
        if since is not None:
            conditions.append(Score.trace_started_at >= since)
        if until is not None:
            conditions.append(Score.trace_started_at < until)
        self.joins = False
        for name, value in where:
            if name == "tag":
                conditions.append(
                    Score.trace_id.in_(select(TraceTag.trace_id).where(TraceTag.tag == value))
                )
            elif name in _ON_SCORES:
                conditions.append(_ON_SCORES[name] == value)
            elif name in _ON_TRACES:
                conditions.append(_ON_TRACES[name] == value)
                self.joins = True
            else:
                raise ValueError(
                    f"unknown attribute {name!r}; use one of: {', '.join(REQUEST_ATTRIBUTES)}"
                )
        self.conditions = conditions

    def select(self, *columns: Any, trace: bool = False) -> Select[Any]:
        """``SELECT columns FROM scores`` (joined to traces when a filter or ``trace`` needs
        it) under the scope's conditions."""
        stmt = select(*columns).select_from(Score)
        if self.joins or trace:
            stmt = stmt.join(Trace, Trace.trace_id == Score.trace_id)
        return stmt.where(*self.conditions)
