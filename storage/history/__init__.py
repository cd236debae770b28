"""History queries over stored scores: summaries, worst traces, one trace in full, job health.

Every query reads one :class:`~.selection.Selection` of scores: the window of
``scores.trace_started_at`` (when the request happened, not when it was scored), optionally an
app, the metrics read and their versions, request-attribute filters and a grouping. Score rows
carry the app name, start time, release and environment, so most queries never join
``traces``. Each metric is read at one version: the catalog's current one unless another is
asked for. After a version change, a backfill stores the new version's scores beside the old
ones, and the two are never pooled.

Where the backend keeps read caches (Postgres), ended buckets and hours are read through them
(``storage.summary_cache``, ``storage.rollups``); elsewhere everything is computed from the
scores. The queries live in one module per kind: :mod:`.summary`, :mod:`.groups`,
:mod:`.cost`, :mod:`.worst`, :mod:`.records`, :mod:`.jobs`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recalltrace.storage.contracts import TraceNotFound, UnknownMetric, check_metric
from recalltrace.storage.history.cost import CostQueries
from recalltrace.storage.history.groups import GroupQueries
from recalltrace.storage.history.jobs import DEFAULT_STUCK_AFTER, JobQueries
from recalltrace.storage.history.records import RecordQueries
from recalltrace.storage.history.selection import (
    ATTRIBUTES,
    MAX_SUMMARY_GROUPS,
    Selection,
    check_filter_text,
    metric_versions,
    unstorable_character,
)
from recalltrace.storage.history.summary import SummaryQueries
from recalltrace.storage.history.worst import WorstQueries
from recalltrace.storage.history_rows import (
    BUCKETS,
    Bucket,
    ContextRow,
    JobRow,
    ScoreDetail,
    SummaryRow,
    TraceDetail,
    WindowStats,
    WorstRow,
    group_by_metric,
    percentile,
)
from recalltrace.storage.timespec import TimeSpecError, parse_duration, parse_time

__all__ = [
    "ATTRIBUTES",
    "BUCKETS",
    "DEFAULT_STUCK_AFTER",
    "MAX_SUMMARY_GROUPS",
    "Bucket",
    "ContextRow",
    "History",
    "JobRow",
    "ScoreDetail",
    "Selection",
    "SummaryRow",
    "TimeSpecError",
    "TraceDetail",
    "TraceNotFound",
    "UnknownMetric",
    "WindowStats",
    "WorstRow",
    "check_filter_text",
    "check_metric",
    "group_by_metric",
    "metric_versions",
    "parse_duration",
    "parse_time",
    "percentile",
    "unstorable_character",
]

if TYPE_CHECKING:
    from recalltrace.storage.diagnose import Diagnosis


class History(SummaryQueries, GroupQueries, CostQueries, WorstQueries, RecordQueries, JobQueries):
    """Read-only queries over the scores stored in one database.

    ``since`` is inclusive and ``until`` exclusive; both must be timezone-aware. ``app`` and
    ``metric`` narrow to one app name and one catalog metric.
    """

    def diagnose(self, *, metric: str, **options: Any) -> Diagnosis:
        """Which slices, reference documents and claims lose ``metric``'s recall in a window:
        see :func:`storage.diagnose.diagnose` for the options (window, app, version, where,
        q, min_count, max_values, all_slices, limit)."""
        from recalltrace.storage.diagnose import diagnose

        where = options.get("where") or ()
        options["where"] = tuple((name, check_filter_text(name, value)) for name, value in where)
        if options.get("app") is not None:
            check_filter_text("app", options["app"])
        return diagnose(self, metric=metric, **options)
