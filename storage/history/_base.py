"""What every group of history queries shares: the engine, the catalog's versions, the dialect,
and how a query's arguments become one :class:`~.selection.Selection`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from sqlalchemy import Engine, select

from recalltrace.storage import _postgres, rollups
from recalltrace.storage._dialect import dialect_of
from recalltrace.storage.contracts import check_metric
from recalltrace.storage.history.selection import Selection, metric_versions
from recalltrace.storage.models import Score


class HistoryBase:
    """Read-only queries over the scores stored in one database (see :class:`History`)."""

    def __init__(self, engine: Engine, versions: Mapping[str, str]) -> None:
        self.engine = engine
        self.versions = dict(versions)
        self.dialect = dialect_of(engine)

    def check_metric(self, metric: str) -> str:
        """Return ``metric`` if it is known, else raise :class:`UnknownMetric` listing them."""
        return check_metric(metric, self.versions)

    def metric_versions(
        self, metric: str | None = None, version: str | None = None
    ) -> dict[str, str]:
        """The ``{metric: version}`` pairs a query reads (see :func:`metric_versions`)."""
        return metric_versions(self.versions, metric, version)

    def select(
        self,
        *,
        metric: str | None = None,
        version: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        app: str | None = None,
        where: Sequence[tuple[str, str]] = (),
        by: str | None = None,
    ) -> Selection:
        """The selection of a query's arguments: each metric (or ``metric``) at its current
        version or at ``version``, checked; the window and the app, checked."""
        versions = self.metric_versions(metric, version)
        return Selection(versions, since, until, app, tuple(where), by)

    def cached_scope(self, selection: Selection) -> tuple[str | None, dict[str, str]] | None:
        """:meth:`Selection.scope` where the caches are kept; ``None`` (read the scores)
        elsewhere."""
        return selection.scope() if self.dialect.keeps_caches else None

    # -- what exists, for hints ---------------------------------------------------------------
    def app_names(self, limit: int = 50) -> list[str]:
        """Names of apps with stored scores (at most ``limit``), for "did you mean" hints."""
        with self.engine.connect() as conn:
            return self.dialect.distinct_values(conn, Score.__table__.c.app_name, limit)

    def versions_of(self, metric: str, limit: int = 50) -> list[str]:
        """Versions of ``metric`` with stored scores (at most ``limit``)."""
        with self.engine.connect() as conn:
            return list(
                conn.scalars(
                    select(Score.version)
                    .distinct()
                    .where(Score.metric == self.check_metric(metric))
                    .order_by(Score.version)
                    .limit(limit)
                )
            )

    def few_tags(self) -> bool:
        """Whether traces carry few enough distinct tags (``rollups.MAX_ROLLED_TAGS``) for
        per-hour sums by tag: with one tag per customer, say, those would hold a row per tag
        per hour and outgrow the scores they sum, so such tags are summed from the scores.
        (Postgres: read where the caches are kept.)"""
        stmt = _postgres.count_distinct_upto("trace_tags", "tag")
        with self.engine.connect() as conn:
            found = conn.execute(stmt, {"most": rollups.MAX_ROLLED_TAGS + 1}).scalar_one()
        return int(found) <= rollups.MAX_ROLLED_TAGS
