"""Scores grouped by a request attribute: the sums ``scores compare`` tests, and people's labels
beside the judge's scores."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, case, func, or_, select

from recalltrace.storage import rollups
from recalltrace.storage._dialect import as_utc
from recalltrace.storage.history._base import HistoryBase
from recalltrace.storage.history.selection import (
    Selection,
    attribute_column,
    scope_key,
    where_conditions,
    window_bounds,
)
from recalltrace.storage.history_rows import GroupSums
from recalltrace.storage.models import Label, Score, Trace, TraceTag


class GroupQueries(HistoryBase):
    """:meth:`group_summaries` and :meth:`group_labels`."""

    def group_summaries(
        self,
        *,
        metric: str,
        by: str,
        since: datetime | None = None,
        until: datetime | None = None,
        app: str | None = None,
        version: str | None = None,
        where: Sequence[tuple[str, str]] = (),
        max_values: int = 1000,
    ) -> dict[str | None, GroupSums]:
        """The scored values of ``metric`` (one per trace) grouped by the request attribute
        ``by`` (one of :data:`ATTRIBUTES`; ``None`` is the group of traces without it; a trace
        with several tags is in each tag's group), among the traces matching every
        ``(attribute, value)`` of ``where``, aggregated in the database: per group the count,
        the sum and the sum of squares of the values and how many are neither 0 nor 1, with
        the values themselves only for groups of at most ``max_values`` (for a bootstrap).
        Groups come in the order of their first trace in the window."""
        chosen, conditions, column = self._grouping(metric, by, since, until, app, version, where)
        scope = self.cached_scope(chosen) if by in rollups.GROUPED else None
        if scope is not None and (by != "tag" or self.few_tags()):
            sums = self._rolled_group_sums(chosen, metric, by, *scope)
            return self._with_small_values(sums, chosen, conditions, column, max_values)
        fractional = func.sum(case((Score.value.in_((0.0, 1.0)), 0), else_=1))
        stmt = (
            select(
                column,
                func.count(),
                func.sum(Score.value),
                func.sum(Score.value * Score.value),
                fractional,
                func.min(Score.trace_started_at),
            )
            .select_from(Score)
            .where(*conditions)
            .group_by(column)
        )
        stmt = chosen.joined(stmt)
        with self.engine.connect() as conn:
            rows = sorted(conn.execute(stmt).all(), key=lambda r: as_utc(r[5]))
            sums = {
                r[0]: GroupSums(int(r[1]), float(r[2] or 0.0), float(r[3] or 0.0), int(r[4] or 0))
                for r in rows
            }
        return self._with_small_values(sums, chosen, conditions, column, max_values)

    def _rolled_group_sums(
        self,
        chosen: Selection,
        metric: str,
        by: str,
        app: str | None,
        attributes: Mapping[str, str],
    ) -> dict[str | None, GroupSums]:
        """:meth:`group_summaries`' sums from the hourly rollups (``storage.rollups``):
        ended hours from ``group_cache``, the window's partial edges live."""
        # Bounds not narrowed by the attributes (see _summary_cached): empty hours are stored
        # as such.
        window = Selection(chosen.versions, chosen.since, chosen.until, app)
        with self.engine.connect() as conn:
            now, bounds = window_bounds(
                conn,
                self.dialect,
                Score.trace_started_at,
                chosen.since,
                chosen.until,
                window.score_conditions(),
            )
        if bounds is None:
            return {}
        lower, upper = bounds
        hours = rollups.group_hours(
            self.engine,
            self.dialect,
            metric=metric,
            version=chosen.versions[metric],
            by=by,
            scope=scope_key(app, attributes),
            app=app,
            attributes=attributes,
            lower=lower,
            upper=upper,
            now=now,
        )
        merged: dict[str | None, list[Any]] = {}
        for hour in hours:
            into = merged.setdefault(hour.group, [0, 0.0, 0.0, 0, hour.first_started])
            into[0] += hour.count
            into[1] += hour.total
            into[2] += hour.total_squares
            into[3] += hour.fractional
            into[4] = min(into[4], hour.first_started)
        ordered = sorted(merged.items(), key=lambda item: (item[1][4], str(item[0])))
        return {
            group: GroupSums(n, total, squares, frac)
            for group, (n, total, squares, frac, _f) in ordered
        }

    def _with_small_values(
        self,
        sums: dict[str | None, GroupSums],
        chosen: Selection,
        conditions: list[ColumnElement[bool]],
        column: Any,
        max_values: int,
    ) -> dict[str | None, GroupSums]:
        """``sums`` with the values of each group of at most ``max_values`` (for a bootstrap),
        read in trace order so the same values come in the same order every time."""
        by, since, until = chosen.by, chosen.since, chosen.until
        joins = chosen.joins_traces
        with self.engine.connect() as conn:
            small = [group for group, g in sums.items() if g.count <= max_values]
            if small:
                named = [group for group in small if group is not None]
                matches = [column.in_(named)] if named else []
                if None in small:
                    matches.append(column.is_(None))
                values = (
                    select(column, Score.value)
                    .select_from(Score)
                    .where(*conditions, or_(*matches))
                    .order_by(Score.trace_id)  # the same values in the same order every time
                )
                if by in ("release", "environment") and not joins:
                    # A canary's few hundred traces among millions: find them by the traces'
                    # (attribute, start) index, not by reading every score of the window. The
                    # scores keep their trace's value, so the groups are the same.
                    on_trace = attribute_column(by)
                    found = [on_trace.in_(named)] if named else []
                    if None in small:
                        found.append(on_trace.is_(None))
                    window = [Trace.started_at >= since] if since is not None else []
                    if until is not None:
                        window.append(Trace.started_at < until)
                    values = (
                        values.select_from(Trace)
                        .join(Score, Score.trace_id == Trace.trace_id)
                        .where(or_(*found), *window)
                    )
                elif joins:
                    values = values.join(Trace, Trace.trace_id == Score.trace_id)
                if by == "tag":
                    values = values.outerjoin(TraceTag, TraceTag.trace_id == Score.trace_id)
                collected: dict[str | None, list[float]] = {group: [] for group in small}
                for group, value in conn.execute(values):
                    collected[group].append(float(value))
                for group, got in collected.items():
                    sums[group] = replace(sums[group], values=tuple(got))
        return sums

    def group_labels(
        self,
        *,
        metric: str,
        by: str,
        since: datetime | None = None,
        until: datetime | None = None,
        app: str | None = None,
        version: str | None = None,
        where: Sequence[tuple[str, str]] = (),
    ) -> dict[str | None, list[tuple[float, float]]]:
        """Per group of :meth:`group_summaries` (the same traces, grouped the same way): the
        (people's label, judge score) pair of every scored trace people labelled for
        ``metric``, the label being the mean of its labellers' labels."""
        chosen, conditions, column = self._grouping(metric, by, since, until, app, version, where)
        stmt = (
            select(column, Score.trace_id, Score.value, func.avg(Label.value))
            .select_from(Score)
            .join(Label, (Label.trace_id == Score.trace_id) & (Label.metric == Score.metric))
            .where(*conditions)
            .group_by(column, Score.trace_id, Score.value)
            .order_by(Score.trace_id)
        )
        stmt = chosen.joined(stmt)
        groups: dict[str | None, list[tuple[float, float]]] = {}
        with self.engine.connect() as conn:
            for group, _trace, score, label in conn.execute(stmt):
                groups.setdefault(group, []).append((float(label), float(score)))
        return groups

    def _grouping(
        self,
        metric: str,
        by: str,
        since: datetime | None,
        until: datetime | None,
        app: str | None,
        version: str | None,
        where: Sequence[tuple[str, str]],
    ) -> tuple[Selection, list[ColumnElement[bool]], Any]:
        """The selection, the conditions on the scored results of ``metric`` and the column to
        group by."""
        chosen = self.select(
            metric=metric, version=version, since=since, until=until, app=app, where=where, by=by
        )
        conditions = chosen.score_conditions()
        conditions.append(Score.status == "scored")
        where_conditions(chosen.where, conditions)
        return chosen, conditions, chosen.group_column()
