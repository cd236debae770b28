"""Which scores a history query reads: one :class:`Selection` value, and the checks of its parts.

A selection is the window of trace starts (``[since, until)``), the app, the (metric, version)
pairs read, the request-attribute filters (``where``) and the attribute to group by (``by``).
It turns itself into SQL conditions, says whether the traces must be joined, and whether it can
be read from the caches (:meth:`Selection.scope`). All filter values travel as bound parameters.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, func, or_, select
from sqlalchemy.engine import Connection

from recalltrace.storage._dialect import Dialect, as_utc
from recalltrace.storage._storable import UNSTORABLE_TEXT
from recalltrace.storage.contracts import check_metric
from recalltrace.storage.history_rows import Bucket
from recalltrace.storage.models import Score, Trace, TraceTag

MAX_SUMMARY_GROUPS = 50
"""The most groups a summary split by an attribute shows."""

#: The request attributes history can filter and group by.
ATTRIBUTES: tuple[str, ...] = (
    "release",
    "environment",
    "user_id",
    "session_id",
    "tag",
    "app",
    "service",
)

# Attributes the scores keep themselves (copied from the trace when written).
_ON_SCORES: dict[str, Any] = {
    "release": Score.release,
    "environment": Score.environment,
    "app": Score.app_name,
}

# Attributes kept on the score rows that a cached summary can be scoped by (app is the
# cache's own column).
SCOPED = ("release", "environment")


def unstorable_character(value: str) -> str | None:
    """What in ``value`` no stored text can hold, and where, or ``None`` if nothing.

    The repository replaces NUL and lone surrogates before storing text (Postgres refuses
    them), so a filter containing one could never match, on either backend.
    """
    match = UNSTORABLE_TEXT.search(value)
    if match is None:
        return None
    char = match.group()
    if char == "\x00":
        what = "a NUL character"
    elif "\udc80" <= char <= "\udcff":  # how Python decodes a non-UTF-8 byte of argv or a file
        what = f"the byte 0x{ord(char) - 0xDC00:02x} (not UTF-8)"
    else:
        what = f"a lone surrogate (U+{ord(char):04X})"
    return (
        f"{value!r} holds {what} at position {match.start()}; stored text never holds such a "
        "character, so nothing could match"
    )


def check_filter_text(name: str, value: str) -> str:
    """Return ``value``, or raise ``ValueError`` if it holds a character no stored text holds."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, not {type(value).__name__}")
    problem = unstorable_character(value)
    if problem is not None:
        raise ValueError(f"{name} {problem}")
    return value


def metric_versions(
    current: Mapping[str, str], metric: str | None = None, version: str | None = None
) -> dict[str, str]:
    """Which version of which metric a history query reads, as ``{metric: version}``.

    ``current`` maps every known metric to its current version (the caller's catalog). Without
    ``version``: every metric (or just ``metric``) at its current version. ``version`` reads
    another one, an older version after a backfill to a new one, say; it needs ``metric``,
    since versions are numbered per metric.
    """
    if version is None:
        keys = [check_metric(metric, current)] if metric is not None else list(current)
        return {key: current[key] for key in keys}
    if metric is None:
        raise ValueError("a version belongs to one metric: give the metric as well")
    if not check_filter_text("version", version).strip():
        raise ValueError("version must not be empty")
    return {check_metric(metric, current): version}


def check_attribute(name: str) -> str:
    """Return ``name`` if history can group by it, else raise ``ValueError`` naming those."""
    if name not in ATTRIBUTES:
        raise ValueError(f"unknown attribute {name!r}; use one of: {', '.join(ATTRIBUTES)}")
    return name


def attribute_column(name: str) -> Any:
    """The traces' column of attribute ``name``; ``ValueError`` naming the known ones."""
    columns = {
        "release": Trace.release,
        "environment": Trace.environment,
        "user_id": Trace.user_id,
        "session_id": Trace.session_id,
        "app": Trace.app_name,
        "service": Trace.service_name,
    }
    if name not in columns:
        raise ValueError(f"unknown attribute {name!r}; use one of: {', '.join(ATTRIBUTES)}")
    return columns[name]


def too_many_groups(by: str | None) -> ValueError:
    """The error of a grouping with more than :data:`MAX_SUMMARY_GROUPS` values."""
    return ValueError(
        f"more than {MAX_SUMMARY_GROUPS} values of {by} in the window; narrow it "
        "with --since/--until or --where"
    )


@dataclass(frozen=True, slots=True)
class Selection:
    """The scores one history query reads.

    ``versions`` maps each metric read to its version; ``since`` (inclusive) and ``until``
    (exclusive) bound the trace start times, timezone-aware; ``app`` narrows to one app name;
    ``where`` keeps the traces whose request attributes (:data:`ATTRIBUTES`) have the given
    values; ``by`` names the attribute to group by. Built by :meth:`History.select`, which
    checks the metric and version; constructing one checks the window and the app.
    """

    versions: Mapping[str, str]
    since: datetime | None = None
    until: datetime | None = None
    app: str | None = None
    where: tuple[tuple[str, str], ...] = field(default=())
    by: str | None = None

    def __post_init__(self) -> None:
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ValueError(
                f"since ({self.since.isoformat()}) must be before until ({self.until.isoformat()})"
            )
        if self.app is not None:
            check_filter_text("app", self.app)

    def of(self, metric: str, version: str) -> Selection:
        """The same selection of one metric at one version."""
        return replace(self, versions={metric: version})

    def score_conditions(self) -> list[ColumnElement[bool]]:
        """Conditions on scores: the (metric, version) pairs, the app and the window."""
        conditions: list[ColumnElement[bool]] = [
            or_(
                *(
                    and_(Score.metric == key, Score.version == version)
                    for key, version in self.versions.items()
                )
            )
        ]
        if self.app is not None:
            conditions.append(Score.app_name == self.app)
        if self.since is not None:
            conditions.append(Score.trace_started_at >= self.since)
        if self.until is not None:
            conditions.append(Score.trace_started_at < self.until)
        return conditions

    def conditions(self) -> list[ColumnElement[bool]]:
        """:meth:`score_conditions` and the ``where`` filters."""
        conditions = self.score_conditions()
        where_conditions(self.where, conditions)
        return conditions

    def group_column(self) -> Any:
        """The column to group by (``None`` without ``by``).

        Release, environment and app are kept on the scores too, and tags have their own
        table: grouping and filtering by them reads no trace (an index on Postgres), so the
        traces are joined only for the other attributes (see :attr:`joins_traces`)."""
        return group_column(self.by)

    @property
    def joins_traces(self) -> bool:
        """Whether grouping by ``by`` and filtering by ``where`` needs the traces' own columns
        (user, session, service), not only the scores' and the tags'."""
        names = [name for name, _value in self.where] + ([self.by] if self.by else [])
        return any(name not in _ON_SCORES and name != "tag" for name in names)

    def scope(self) -> tuple[str | None, dict[str, str]] | None:
        """``(app, {release/environment: value})`` when every ``where`` filter is on the score
        rows (each attribute once, app agreeing with ``app``); ``None`` when a summary must
        join the traces instead."""
        app = self.app
        attributes: dict[str, str] = {}
        for name, value in self.where:
            value = check_filter_text(name, value)
            if name == "app":
                if app is not None and app != value:
                    return None
                app = value
            elif name in SCOPED and name not in attributes:
                attributes[name] = value
            else:
                return None
        return app, attributes

    def joined(self, stmt: Any) -> Any:
        """``stmt`` (selecting from scores) joined to what the filters and grouping read."""
        if self.joins_traces:
            stmt = stmt.join(Trace, Trace.trace_id == Score.trace_id)
        if self.by == "tag":
            stmt = stmt.outerjoin(TraceTag, TraceTag.trace_id == Score.trace_id)
        return stmt


def where_conditions(
    where: Sequence[tuple[str, str]], conditions: list[ColumnElement[bool]]
) -> None:
    """Add the conditions of the ``where`` filters to ``conditions``."""
    for name, value in where:
        if name == "tag":
            conditions.append(
                Score.trace_id.in_(
                    select(TraceTag.trace_id).where(TraceTag.tag == check_filter_text("tag", value))
                )
            )
        else:
            on_scores = _ON_SCORES.get(name)
            column = on_scores if on_scores is not None else attribute_column(name)
            conditions.append(column == check_filter_text(name, value))


def group_column(by: str | None) -> Any:
    """The column of attribute ``by`` a query groups by (``None`` for no grouping)."""
    if by is None:
        return None
    if by == "tag":
        return TraceTag.tag
    column = _ON_SCORES.get(by)
    return column if column is not None else attribute_column(by)


def scope_key(app: str | None, attributes: Mapping[str, str | None]) -> str:
    """The caches' key of a scope: the app name ("" for all apps), then each attribute
    filter; a key too long for the column is replaced by a digest of it."""
    key = app or ""
    for name, value in sorted(attributes.items()):
        # No value (the traces without the attribute) has no "=": no value collides with it.
        key += f"\x1f{name}" if value is None else f"\x1f{name}={value}"
    if len(key) <= 200:
        return key
    return "#" + hashlib.sha256(key.encode("utf-8")).hexdigest()


# -- time ------------------------------------------------------------------------------------
BUCKET_STEP: dict[str, timedelta] = {"hour": timedelta(hours=1), "day": timedelta(hours=24)}


def truncate(value: datetime, bucket: Bucket) -> datetime:
    """The start of the UTC ``bucket`` holding ``value``."""
    value = as_utc(value)
    if bucket == "day":
        return value.replace(hour=0, minute=0, second=0, microsecond=0)
    return value.replace(minute=0, second=0, microsecond=0)


def window_bounds(
    conn: Connection,
    dialect: Dialect,
    column: Any,
    since: datetime | None,
    until: datetime | None,
    conditions: Sequence[ColumnElement[bool]],
) -> tuple[datetime, tuple[datetime, datetime] | None]:
    """The database's time, and ``[since, until)`` with an open end closed at the first or
    last ``column`` of the rows matching ``conditions`` (two index probes); ``None`` for an
    empty window."""
    now = as_utc(dialect.clock(conn))
    lower, upper = since, until
    if lower is None or upper is None:
        first, last = conn.execute(
            select(func.min(column), func.max(column)).where(*conditions)
        ).one()
        if first is None:
            return now, None
        lower = lower if lower is not None else as_utc(first)
        upper = upper if upper is not None else as_utc(last) + timedelta(microseconds=1)
    return now, ((lower, upper) if lower < upper else None)


def group_order(group: str | None) -> tuple[bool, str]:
    """Groups in name order, the group without the attribute last."""
    return (group is None, group or "")


def as_float(value: Any) -> float | None:
    """``value`` as a float, ``None`` kept."""
    return None if value is None else float(value)
