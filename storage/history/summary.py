"""Summaries: per bucket and metric, the scored count, mean, percentiles, skips and failures.

Postgres does the statistics itself: percentiles with ``percentile_cont(...) WITHIN GROUP
(ORDER BY value)``, one small aggregate per UTC hour or day bucket (see
:func:`storage._postgres.summary_sql` for why not one GROUP BY), read by index-only scans of
``ix_scores_metric_version_started``, ended buckets read through the summary cache. SQLite has
no ordered-set aggregates, so there the rows of the window are fetched and the same statistics
(linear interpolation between the closest ranks, as ``percentile_cont`` does) are computed in
Python; that is fine for the laptop-sized databases SQLite is meant for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from sqlalchemy import func, literal, select, union_all
from sqlalchemy.engine import Connection

from recalltrace.storage import _postgres, diagnose_rollups, rollups, summary_cache
from recalltrace.storage._dialect import as_utc
from recalltrace.storage.history._base import HistoryBase
from recalltrace.storage.history.selection import (
    BUCKET_STEP,
    MAX_SUMMARY_GROUPS,
    SCOPED,
    Selection,
    as_float,
    check_attribute,
    group_order,
    scope_key,
    too_many_groups,
    truncate,
)
from recalltrace.storage.history_rows import (
    BUCKETS,
    PERCENTILES,
    Bucket,
    SummaryRow,
    WindowStats,
    percentile,
)
from recalltrace.storage.models import Score


def _empty_row(bucket_start: datetime, metric: str, version: str) -> SummaryRow:
    """What the summary cache stores for an ended bucket without any result (never shown)."""
    return SummaryRow(bucket_start, metric, version, 0, None, None, None, None, 0, 0)


class SummaryQueries(HistoryBase):
    """:meth:`summary` and what it is made of; :meth:`warm_summaries` for the workers."""

    def summary(
        self,
        *,
        bucket: Bucket = "day",
        since: datetime | None = None,
        until: datetime | None = None,
        app: str | None = None,
        metric: str | None = None,
        version: str | None = None,
        where: Sequence[tuple[str, str]] = (),
        by: str | None = None,
    ) -> list[SummaryRow]:
        """Per bucket and metric: scored count, mean, p10/p50/p90, skipped and failed counts.

        ``where`` keeps the traces whose request attributes have the given values (see
        :data:`ATTRIBUTES`). On Postgres, filters on ``release``, ``environment`` and ``app``
        (kept on the score rows) are summarised like the unfiltered ones, ended buckets from
        the summary cache; other attributes are computed from the scores each time.

        Each metric is read at its current catalog version, or at ``version`` (which needs
        ``metric``; see :func:`metric_versions`). Rows come ordered by bucket, then metric;
        buckets without any result are absent, and so are metrics no longer in the catalog. A
        window starting mid-bucket makes its first bucket partial.

        With ``by`` (one of :data:`ATTRIBUTES`), each bucket and metric is split by the value
        of that attribute (rows carry ``by`` and ``group``; ``None`` is the group of traces
        without it; a trace with several tags is in each tag's group), groups in name order,
        the group without the attribute last. On Postgres, grouping by release, environment or
        app reads each group's summary like a filter on it, from the summary cache; at most
        ``MAX_SUMMARY_GROUPS`` groups are shown (more is a ``ValueError`` saying so).
        """
        if bucket not in BUCKETS:
            raise ValueError(f"bucket must be one of {', '.join(BUCKETS)}, not {bucket!r}")
        chosen = self.select(
            metric=metric, version=version, since=since, until=until, app=app, where=where, by=by
        )
        if by is not None:
            return self._summary_by(bucket, chosen, check_attribute(by))
        scope = self.cached_scope(chosen)
        if scope is not None:
            scoped_app, attributes = scope
            return self._summary_cached(
                bucket, since, until, scoped_app, chosen.versions, attributes
            )
        return self._summary_python(bucket, chosen)

    def _summary_by(self, bucket: Bucket, chosen: Selection, by: str) -> list[SummaryRow]:
        scope = self.cached_scope(chosen)
        if scope is not None and by in (*SCOPED, "app") and by not in scope[1]:
            scoped_app, attributes = scope
            if by == "app" and scoped_app is not None:
                groups: list[str | None] = [scoped_app]
            else:
                groups = self._groups_in_window(by, chosen.since, chosen.until)
            rows: list[SummaryRow] = []
            for group in groups:
                scoped: Mapping[str, str | None]
                if by == "app":
                    app, scoped = group, attributes
                else:
                    app, scoped = scoped_app, {**attributes, by: group}
                part = self._summary_cached(
                    bucket, chosen.since, chosen.until, app, chosen.versions, scoped
                )
                rows.extend(replace(r, by=by, group=group) for r in part)
            rows.sort(key=lambda r: (r.bucket_start, r.metric, *group_order(r.group)))
            return rows
        return self._summary_python(bucket, chosen)

    def window(
        self,
        *,
        metric: str,
        since: datetime | None = None,
        until: datetime | None = None,
        app: str | None = None,
        version: str | None = None,
        where: Sequence[tuple[str, str]] = (),
    ) -> WindowStats:
        """Count and mean of one metric's scored results over one window (plus skips, fails),
        at the metric's current catalog version or at ``version``; ``where`` keeps the traces
        whose request attributes have the given values (as for :meth:`summary`)."""
        chosen = self.select(
            metric=metric, version=version, since=since, until=until, app=app, where=where
        )
        conditions = chosen.conditions()
        scored = Score.status == "scored"
        stmt = chosen.joined(
            select(
                func.count().filter(scored),
                func.avg(Score.value).filter(scored),
                func.count().filter(Score.status == "skipped"),
                func.count().filter(Score.status == "failed"),
            ).select_from(Score)
        ).where(*conditions)
        with self.engine.connect() as conn:
            count, mean, skipped, failed = conn.execute(stmt).one()
        return WindowStats(
            metric=metric,
            version=chosen.versions[metric],
            since=since,
            until=until,
            app=app,
            count=int(count or 0),
            mean=as_float(mean) if count else None,
            skipped=int(skipped or 0),
            failed=int(failed or 0),
        )

    def _groups_in_window(
        self, by: str, since: datetime | None, until: datetime | None
    ) -> list[str | None]:
        """The values of ``by`` (release, environment or app) that traces started in the
        window have, the missing value (``None``) included when some trace lacks it: a skip
        scan of the (attribute, start) index, one probe per distinct value (Postgres)."""
        table, column, started = {
            "release": ("traces", "release", "started_at"),
            "environment": ("traces", "environment", "started_at"),
            "app": ("scores", "app_name", "trace_started_at"),
        }[by]
        stmt, missing = _postgres.values_in_window(
            table, column, started, since is not None, until is not None
        )
        params = {"since": since, "until": until, "most": MAX_SUMMARY_GROUPS + 1}
        with self.engine.connect() as conn:
            values: list[str | None] = list(conn.execute(stmt, params).scalars())
            if len(values) > MAX_SUMMARY_GROUPS:
                raise too_many_groups(by)
            if by != "app" and conn.execute(missing, params).scalar_one():
                values.append(None)
        return values

    def warm_summaries(
        self,
        *,
        days: int = 31,
        hours: int = 48,
        apps: int = 20,
        releases: int = 5,
        environments: int = 5,
        now: datetime | None = None,
    ) -> int:
        """Compute and store the summary rows of complete buckets that are not stored yet, so
        no user query pays for them: day buckets of the last ``days`` days and hour buckets of
        the last ``hours`` hours, for every app together and for each of (at most ``apps``)
        apps, every metric at its version; the hourly rollups of the last ``days`` days that
        ``scores compare`` by release, environment or tag, ``scores diagnose`` and ``scores
        cost`` read (every app together); and the summaries and costs filtered by each of the
        ``releases`` releases and ``environments`` environments seen most recently. Postgres
        only (elsewhere nothing is cached; returns 0). Returns how many summary rows those
        windows hold plus the rollup rows it computed. Workers call this in the background;
        when everything is stored already it reads the stored rows and a few index probes per
        scope."""
        if not self.dialect.keeps_caches:
            return 0
        if now is None:
            with self.engine.connect() as conn:
                now = as_utc(self.dialect.clock(conn))
        scopes: list[str | None] = [None, *self.app_names(limit=apps)]
        looked = 0
        windows: tuple[tuple[Bucket, int], ...] = (("day", days), ("hour", hours))
        for bucket, count in windows:
            step = BUCKET_STEP[bucket]
            until = truncate(now, bucket)  # every bucket before it has ended
            since = until - count * step
            for app in scopes:
                looked += len(self._summary_cached(bucket, since, until, app, self.versions))
        # The hourly rollups of ``scores compare`` (every app, grouped by release, environment
        # and tag) and of ``scores cost``, over the same days.
        until = truncate(now, "hour")
        since = until - timedelta(days=days)
        grouped = [by for by in rollups.GROUPED if by != "tag" or self.few_tags()]
        for key, key_version in self.versions.items():
            for by in grouped:
                looked += len(
                    rollups.group_hours(
                        self.engine,
                        self.dialect,
                        metric=key,
                        version=key_version,
                        by=by,
                        scope="",
                        app=None,
                        attributes={},
                        lower=since,
                        upper=until,
                        now=now,
                        fill_only=True,
                    )
                )

        def cost_of(attributes: Mapping[str, str]) -> int:
            hours = rollups.cost_hours(
                self.engine,
                self.dialect,
                scope=scope_key(None, attributes),
                app=None,
                attributes=attributes,
                metric=None,
                lower=since,
                upper=until,
                now=now,
            )
            return len(hours)

        looked += cost_of({})
        # Summaries filtered by the releases and environments seen most recently (read from
        # the rollups just filled), the filters people use.
        with self.engine.connect() as conn:
            recent = {
                name: rollups.recent_groups(conn, name, since, most)
                for name, most in (("release", releases), ("environment", environments))
            }
        for name, values in recent.items():
            for value in values:
                looked += cost_of({name: value})
                for bucket, count in windows:
                    end = truncate(now, bucket)
                    looked += len(
                        self._summary_cached(
                            bucket,
                            end - count * BUCKET_STEP[bucket],
                            end,
                            None,
                            self.versions,
                            {name: value},
                        )
                    )
        # The hourly rollups of ``scores diagnose`` (every app), over the same days, last: on a
        # large history their first fill is the longest part, and the rest is not held up by it
        # (it stores the newest hours first, so the usual week is served early).
        looked += diagnose_rollups.fill(
            self.engine, self.dialect, versions=self.versions, lower=since, upper=until, now=now
        )
        return looked

    def _summary_cached(
        self,
        bucket: Bucket,
        since: datetime | None,
        until: datetime | None,
        app: str | None,
        versions: Mapping[str, str],
        attributes: Mapping[str, str | None] | None = None,
    ) -> list[SummaryRow]:
        """Cached rows for complete buckets in the past, live aggregates for the rest (of the
        scores with the given ``attributes``: release and environment values, ``None`` for
        the scores of traces without it).

        A bucket is complete when the window covers all of it and it has ended; its rows are
        computed once, stored in ``summary_cache`` and dropped by the repository whenever a
        score of that bucket is written or deleted. The bucket still filling up and the
        partial buckets at the window's edges are always computed live.
        """
        step = BUCKET_STEP[bucket]
        attributes = dict(attributes or {})
        app_key = scope_key(app, attributes)
        window = Selection(versions, since, until, app)
        with self.engine.connect() as conn:
            # Per metric, the first and last start time in the window: two index probes each.
            # Not narrowed by the attributes: a release absent from most of the window would
            # make each probe walk that part of the index. Buckets without its scores are
            # stored empty once they have ended, so they cost nothing the next time.
            parts = [
                select(
                    func.min(Score.trace_started_at).label("first"),
                    func.max(Score.trace_started_at).label("last"),
                ).where(*window.of(key, version).score_conditions())
                for key, version in versions.items()
            ]
            bounds = union_all(*parts).subquery()
            first, last = conn.execute(
                select(func.min(bounds.c.first), func.max(bounds.c.last))
            ).one()
            if first is None:
                return []
            now = as_utc(self.dialect.clock(conn))
            starts: list[datetime] = []
            cursor = truncate(first, bucket)
            while cursor <= as_utc(last):
                starts.append(cursor)
                cursor += step
            complete = {
                start
                for start in starts
                if (since is None or start >= since)
                and (until is None or start + step <= until)
                and start + step <= now
            }
            params = {
                "step": step,
                "lower": since if since is not None else first,
                "upper": until if until is not None else last + timedelta(microseconds=1),
                "app": app,
                "fractions": list(PERCENTILES),
                **{f"attr_{name}": value for name, value in attributes.items()},
            }
            compute = partial(
                _aggregate, versions=versions, params=params, app=app, attributes=attributes
            )

            def read(
                c: Connection, pairs: list[tuple[datetime, str]]
            ) -> tuple[list[SummaryRow], set[tuple[datetime, str]]]:
                stored = summary_cache.read(c, bucket, app_key, versions, sorted(complete))
                shown = [r for r in stored.values() if r.count or r.skipped or r.failed]
                return shown, set(stored)

            def store(
                c: Connection, pairs: list[tuple[datetime, str]], rows: list[SummaryRow]
            ) -> None:
                found = {(r.bucket_start, r.metric) for r in rows}
                empty = [_empty_row(b, m, versions[m]) for b, m in pairs if (b, m) not in found]
                summary_cache.store(c, self.dialect, bucket, app_key, [*rows, *empty], now)

            pairs = [(b, m) for b in starts for m in versions]
            rows = summary_cache.read_through(
                self.engine,
                self.dialect,
                summary_cache.CachedRead(read=read, compute=compute, store=store),
                [p for p in pairs if p[0] in complete],
                [p for p in pairs if p[0] not in complete],
                conn=conn,
            )
        rows.sort(key=lambda r: (r.bucket_start, r.metric))
        return rows

    def _summary_python(self, bucket: Bucket, chosen: Selection) -> list[SummaryRow]:
        """The summary computed from the score rows; with ``by``, per group too."""
        conditions = chosen.conditions()
        group = chosen.group_column()
        stmt = select(
            Score.trace_started_at,
            Score.metric,
            Score.status,
            Score.value,
            literal(None) if group is None else group,
        ).select_from(Score)
        stmt = chosen.joined(stmt).where(*conditions)
        groups: dict[tuple[datetime, str, str | None], tuple[list[float], list[int]]] = {}
        with self.engine.connect() as conn:
            for started_at, metric, status, value, name in conn.execute(stmt):
                values, counts = groups.setdefault(
                    (truncate(started_at, bucket), metric, name), ([], [0, 0])
                )
                # The same rules as the Postgres query: a value means a scored result.
                if value is not None:
                    values.append(float(value))
                if status == "skipped":
                    counts[0] += 1
                elif status == "failed":
                    counts[1] += 1
        if group is not None and len({key[2] for key in groups}) > MAX_SUMMARY_GROUPS:
            raise too_many_groups(chosen.by)
        result = []
        ordered = sorted(groups.items(), key=lambda item: (*item[0][:2], *group_order(item[0][2])))
        for (bucket_start, metric, name), (values, (skipped, failed)) in ordered:
            values.sort()
            p10, p50, p90 = (percentile(values, p) for p in PERCENTILES)
            result.append(
                SummaryRow(
                    bucket_start=bucket_start,
                    metric=metric,
                    version=chosen.versions[metric],
                    count=len(values),
                    mean=math.fsum(values) / len(values) if values else None,
                    p10=p10,
                    p50=p50,
                    p90=p90,
                    skipped=skipped,
                    failed=failed,
                    by=chosen.by,
                    group=name,
                )
            )
        return result


def _aggregate(
    conn: Connection,
    pairs: list[tuple[datetime, str]],
    *,
    versions: Mapping[str, str],
    params: dict[str, Any],
    app: str | None,
    attributes: Mapping[str, str | None],
) -> list[SummaryRow]:
    """Live aggregates of (bucket, metric) pairs, each metric at the version ``versions``
    gives; pairs without any result are left out."""
    if not pairs:
        return []
    conn.execute(_postgres.JIT_OFF)
    rows = conn.execute(
        _postgres.summary_sql(
            with_app=app is not None,
            attributes=sorted(k for k, v in attributes.items() if v is not None),
            missing=sorted(k for k, v in attributes.items() if v is None),
        ),
        {
            **params,
            "starts": [b for b, _m in pairs],
            "metrics": [m for _b, m in pairs],
            "versions": [versions[m] for _b, m in pairs],
        },
    ).all()
    return [
        SummaryRow(
            bucket_start=as_utc(r.bucket_start),
            metric=r.metric,
            version=versions[r.metric],
            count=int(r.n_scored),
            mean=as_float(r.mean),
            p10=None if r.percentiles is None else as_float(r.percentiles[0]),
            p50=None if r.percentiles is None else as_float(r.percentiles[1]),
            p90=None if r.percentiles is None else as_float(r.percentiles[2]),
            skipped=int(r.n_skipped),
            failed=int(r.n_failed),
        )
        for r in rows
        if r.n_scored + r.n_skipped + r.n_failed > 0
    ]
