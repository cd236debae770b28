"""Judge cost: tokens and money per UTC day of scoring, variant and judge model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import ColumnElement, func, literal, select

from recalltrace.storage import rollups
from recalltrace.storage.history._base import HistoryBase
from recalltrace.storage.history.selection import (
    MAX_SUMMARY_GROUPS,
    Selection,
    check_attribute,
    check_filter_text,
    group_order,
    scope_key,
    too_many_groups,
    where_conditions,
    window_bounds,
)
from recalltrace.storage.history_rows import CostRow
from recalltrace.storage.models import Score


class CostQueries(HistoryBase):
    """:meth:`cost`."""

    def cost(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        app: str | None = None,
        metric: str | None = None,
        where: Sequence[tuple[str, str]] = (),
        by: str | None = None,
    ) -> list[CostRow]:
        """Judge tokens and money per UTC day (when the results were stored), variant and
        judge model, over the results stored in ``[since, until)`` of the traces matching
        ``where``; ordered by day, variant, model. With ``by`` (one of :data:`ATTRIBUTES`),
        also per value of that attribute (rows carry ``by`` and ``group``), at most
        ``MAX_SUMMARY_GROUPS`` values.

        On Postgres, without ``by`` and with ``where`` on release, environment or app only,
        the ended hours come from ``cost_cache`` (see ``storage.rollups``)."""
        if by is not None:
            check_attribute(by)
        conditions: list[ColumnElement[bool]] = [Score.model.is_not(None)]
        if since is not None:
            conditions.append(Score.scored_at >= since)
        if until is not None:
            conditions.append(Score.scored_at < until)
        if app is not None:
            conditions.append(Score.app_name == check_filter_text("app", app))
        if metric is not None:
            conditions.append(Score.metric == self.check_metric(metric))
        # The window here is of scoring times: the selection only carries the filters.
        chosen = Selection(self.versions, app=app, where=tuple(where), by=by)
        scope = self.cached_scope(chosen) if by is None else None
        if scope is not None:
            scoped_app, attributes = scope
            return self._rolled_cost(conditions, since, until, scoped_app, metric, attributes)
        where_conditions(chosen.where, conditions)
        group = chosen.group_column()
        day = self.dialect.utc_day(Score.scored_at)
        keys = [day, Score.metric, Score.model, literal(None) if group is None else group]
        stmt = (
            select(
                *keys,
                func.count(),
                func.coalesce(func.sum(Score.prompt_tokens), 0),
                func.coalesce(func.sum(Score.completion_tokens), 0),
                func.sum(Score.cost_usd),
                func.count().filter(Score.cost_usd.is_(None)),
            )
            .select_from(Score)
            .where(*conditions)
            .group_by(*keys[:3], *keys[3:] if group is not None else ())
        )
        stmt = chosen.joined(stmt)
        rows = []
        with self.engine.connect() as conn:
            for when, key, model, name, n, prompt, completion, cost, unpriced in conn.execute(stmt):
                if isinstance(when, str):
                    when = datetime.fromisoformat(when[:10]).replace(tzinfo=timezone.utc)
                else:
                    when = when.replace(tzinfo=timezone.utc)
                rows.append(
                    CostRow(
                        when,
                        key,
                        model,
                        int(n),
                        int(prompt),
                        int(completion),
                        None if cost is None else float(cost),
                        int(unpriced or 0),
                        by=by,
                        group=name,
                    )
                )
        if by is not None and len({r.group for r in rows}) > MAX_SUMMARY_GROUPS:
            raise too_many_groups(by)
        rows.sort(key=lambda r: (r.day, r.metric, r.model, *group_order(r.group)))
        return rows

    def _rolled_cost(
        self,
        conditions: list[ColumnElement[bool]],
        since: datetime | None,
        until: datetime | None,
        app: str | None,
        metric: str | None,
        attributes: Mapping[str, str],
    ) -> list[CostRow]:
        """:meth:`cost` from the hourly rollups (``storage.rollups``): ended hours of scoring
        from ``cost_cache``, the window's partial edges live, summed into UTC days."""
        with self.engine.connect() as conn:
            now, window = window_bounds(
                conn, self.dialect, Score.scored_at, since, until, conditions
            )
        if window is None:
            return []
        lower, upper = window
        days: dict[tuple[datetime, str, str], list[Any]] = {}
        for hour in rollups.cost_hours(
            self.engine,
            self.dialect,
            scope=scope_key(app, attributes),
            app=app,
            attributes=attributes,
            metric=metric,
            lower=lower,
            upper=upper,
            now=now,
        ):
            day = hour.hour.replace(hour=0)
            into = days.setdefault((day, hour.metric, hour.model), [0, 0, 0, None, 0])
            into[0] += hour.count
            into[1] += hour.prompt_tokens
            into[2] += hour.completion_tokens
            if hour.cost_usd is not None:
                into[3] = (into[3] or 0.0) + hour.cost_usd
            into[4] += hour.unpriced
        return [
            CostRow(day, key, model, n, prompt, completion, cost, unpriced)
            for (day, key, model), (n, prompt, completion, cost, unpriced) in sorted(days.items())
        ]
