"""What each page of ``recalltrace ui`` reads: the history API the command line uses, and the
one query of its own (the ``/traces`` listing, ``scores worst``'s query with a score range, a
sort order and an offset). Nothing here writes; nothing here knows about HTTP.

A request's parameters arrive as text; :class:`Filters` checks them with the command line's
own rules and says what is wrong in one line (:class:`BadParameter`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select

from recalltrace._readings import DETAIL_ORDER

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from recalltrace.compare import Comparison
    from recalltrace.storage.contracts import QueueStats
    from recalltrace.storage.diagnose import Diagnosis
    from recalltrace.storage.history import History, SummaryRow, TraceDetail
    from recalltrace.storage.history_rows import JobCounts

DEFAULT_SINCE = "7d"
PAGE_SIZE = 50
MAX_PAGE = 10_000
SORTS = ("value", "-value", "time", "-time")
"""``/traces`` orders: lowest score first (the default, as ``scores worst``), highest first,
oldest first, newest first."""

FILTER_ATTRIBUTES = ("release", "environment", "tag", "user_id", "session_id", "service")
"""Request attributes ``/traces`` filters by (with ``app``, which has its own parameter)."""


class BadParameter(ValueError):
    """A page parameter that cannot be used; the message is one line naming it."""


@dataclass(frozen=True)
class Filters:
    """The checked parameters shared by the pages: window, app, metric, attribute filters."""

    since_text: str | None
    until_text: str | None
    since: datetime | None
    until: datetime | None
    app: str | None
    metric: str | None
    where: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(
        cls,
        params: Mapping[str, str],
        *,
        default_since: str | None = DEFAULT_SINCE,
        metric_required: bool = False,
    ) -> Filters:
        """Read ``since``, ``until``, ``app``, ``metric`` and the attribute filters."""
        from recalltrace.scorers.catalog import CATALOG
        from recalltrace.storage.history import (
            TimeSpecError,
            UnknownMetric,
            check_filter_text,
            check_metric,
            parse_time,
        )

        now = datetime.now(timezone.utc)
        since_text = params.get("since") or default_since
        until_text = params.get("until") or None
        try:
            since = None if since_text is None else parse_time(since_text, now=now)
            until = None if until_text is None else parse_time(until_text, now=now)
        except TimeSpecError as exc:
            raise BadParameter(str(exc)) from None
        if since is not None and until is not None and since >= until:
            raise BadParameter(f"since ({since_text}) must be before until ({until_text})")
        metric = params.get("metric") or None
        if metric is None and metric_required:
            raise BadParameter(f"metric is required: one of {', '.join(CATALOG)}")
        if metric is not None:
            try:
                metric = check_metric(metric, CATALOG)
            except UnknownMetric as exc:
                raise BadParameter(str(exc)) from None
        where: list[tuple[str, str]] = []
        try:
            app = params.get("app") or None
            if app is not None:
                check_filter_text("app", app)
            for name in FILTER_ATTRIBUTES:
                value = params.get(name)
                if value:
                    where.append((name, check_filter_text(name, value)))
        except ValueError as exc:
            raise BadParameter(str(exc)) from None
        return cls(since_text, until_text, since, until, app, metric, tuple(where))

    def bounded(self, engine: Engine) -> tuple[datetime | None, datetime | None]:
        """The window narrowed to the days holding traces (as the command line does)."""
        from recalltrace._readings import data_window

        return data_window(engine, self.since, self.until)

    def query(self) -> dict[str, str]:
        """These filters as page parameters (for links that keep them)."""
        out: dict[str, str] = {}
        if self.since_text is not None:
            out["since"] = self.since_text
        if self.until_text is not None:
            out["until"] = self.until_text
        if self.app is not None:
            out["app"] = self.app
        if self.metric is not None:
            out["metric"] = self.metric
        out.update(self.where)
        return out

    def cli_options(self, *, where: bool = True) -> list[str]:
        """These filters as the command line's options."""
        words: list[str] = []
        if self.since_text is not None:
            words += ["--since", self.since_text]
        if self.until_text is not None:
            words += ["--until", self.until_text]
        if self.app is not None:
            words += ["--app", self.app]
        if self.metric is not None:
            words += ["--metric", self.metric]
        if where:
            for name, value in self.where:
                words += ["--where", f"{name}={value}"]
        return words


def history_of(engine: Engine) -> History:
    """History queries on ``engine`` at the catalog's current versions."""
    from recalltrace._wiring import history

    return history(engine)


# -- the overview ------------------------------------------------------------------------------


@dataclass
class Series:
    """One variant's points over time, and its window figures per release."""

    metric: str
    version: str
    points: list[SummaryRow]
    releases: Comparison | None
    scored: int
    mean: float | None


@dataclass
class Overview:
    """What ``/`` shows."""

    bucket: str
    series: list[Series]
    release_marks: list[tuple[datetime, str]]
    """Where each release's first scores fall: (bucket start, release)."""
    queue: dict[str, QueueStats]
    counts: list[JobCounts]
    window: tuple[datetime, datetime] | None = None
    """The time axis: the window asked for, narrowed to the days holding traces."""

    def chart_data(self) -> dict[str, Any]:
        """The charts' data, for the page's script (times as UNIX seconds)."""
        return {
            "bucket": self.bucket,
            "window": None if self.window is None else [m.timestamp() for m in self.window],
            "releases": [[m.timestamp(), name] for m, name in self.release_marks],
            "series": [
                {
                    "metric": s.metric,
                    "x": [p.bucket_start.timestamp() for p in s.points],
                    "mean": [_finite(p.mean) for p in s.points],
                    "p10": [_finite(p.p10) for p in s.points],
                    "p90": [_finite(p.p90) for p in s.points],
                    "count": [p.count for p in s.points],
                }
                for s in self.series
            ],
        }


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else value


def overview(engine: Engine, filters: Filters, bucket: str) -> Overview:
    """Each variant's summary per bucket, its mean per release with 95% intervals, where
    each release starts, and the queue."""
    from recalltrace.compare import compare_groups
    from recalltrace.storage.history import group_by_metric

    history = history_of(engine)
    since, until = filters.bounded(engine)
    common: dict[str, Any] = {
        "since": since,
        "until": until,
        "app": filters.app,
        "where": filters.where,
    }
    rows = history.summary(bucket=bucket, metric=filters.metric, **common)  # type: ignore[arg-type]
    by_metric = group_by_metric(rows)
    marks: dict[str, datetime] = {}
    if rows:
        try:
            grouped = history.summary(
                bucket=bucket,  # type: ignore[arg-type]
                metric=filters.metric,
                by="release",
                **common,
            )
        except ValueError:  # more releases than a summary splits into: no markers
            grouped = []
        for r in grouped:
            if r.group is not None and r.count:
                marks[r.group] = min(marks.get(r.group, r.bucket_start), r.bucket_start)
    series: list[Series] = []
    for metric, points in by_metric.items():
        scored = sum(p.count for p in points)
        total = sum(p.count * p.mean for p in points if p.mean is not None)
        # Sums only (no values): Wilson intervals for 0/1 scores, else the normal approximation,
        # so the overview never runs a bootstrap per variant and release; /compare does, as
        # `scores compare` does.
        groups = history.group_summaries(metric=metric, by="release", max_values=0, **common)
        releases = compare_groups(groups, order=list(groups)) if groups else None
        series.append(
            Series(
                metric=metric,
                version=points[0].version,
                points=points,
                releases=releases,
                scored=scored,
                mean=total / scored if scored else None,
            )
        )
    ordered = sorted(marks.items(), key=lambda item: (item[1], item[0]))
    end = until or datetime.now(timezone.utc)
    return Overview(
        window=(since, end) if since is not None and since < end else None,
        bucket=bucket,
        series=series,
        release_marks=[(moment, name) for name, moment in ordered],
        queue=queue_stats(engine),
        counts=history.job_counts(app=filters.app),
    )


def queue_stats(engine: Engine) -> dict[str, QueueStats]:
    """Per variant: due, running, waiting and failed jobs and the oldest due job's age."""
    from recalltrace._wiring import repository

    return repository(engine).queue_stats_by_metric()


# -- /traces -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceRow:
    """One scored result in the ``/traces`` listing."""

    trace_id: str
    metric: str
    version: str
    value: float
    reason: str
    app_name: str
    started_at: datetime
    question: str | None


@dataclass
class TracePage:
    """One page of ``/traces``."""

    rows: list[TraceRow]
    total: int
    page: int
    pages: int
    sort: str


def score_range(params: Mapping[str, str]) -> tuple[float | None, float | None]:
    """``min`` and ``max``: numbers in [0, 1], ``min`` at most ``max``."""
    bounds: list[float | None] = []
    for name in ("min", "max"):
        text = params.get(name) or ""
        if not text:
            bounds.append(None)
            continue
        try:
            value = float(text)
        except ValueError:
            raise BadParameter(f"{name} must be a number from 0 to 1, not {text!r}") from None
        if not 0.0 <= value <= 1.0:
            raise BadParameter(f"{name} must be a number from 0 to 1, not {text!r}")
        bounds.append(value)
    low, high = bounds
    if low is not None and high is not None and low > high:
        raise BadParameter(f"min ({low:g}) must not be above max ({high:g})")
    return low, high


def page_number(params: Mapping[str, str]) -> int:
    """``page``: a whole number from 1."""
    text = params.get("page") or "1"
    if not text.isdigit() or not 1 <= int(text) <= MAX_PAGE:
        raise BadParameter(f"page must be a whole number from 1 to {MAX_PAGE}, not {text!r}")
    return int(text)


def sort_order(params: Mapping[str, str]) -> str:
    """``sort``: one of :data:`SORTS`."""
    text = params.get("sort") or "value"
    if text not in SORTS:
        raise BadParameter(f"sort must be one of {', '.join(SORTS)}, not {text!r}")
    return text


def traces(
    engine: Engine,
    filters: Filters,
    *,
    low: float | None,
    high: float | None,
    sort: str,
    page: int,
    size: int = PAGE_SIZE,
) -> TracePage:
    """The scored results matching ``filters`` and the score range, ordered and cut into pages
    by the database (``scores worst``'s selection: each metric at its current version)."""
    from recalltrace.storage.models import Score, Trace

    history = history_of(engine)
    since, until = filters.bounded(engine)
    chosen = history.select(
        metric=filters.metric, since=since, until=until, app=filters.app, where=filters.where
    )
    conditions = chosen.conditions()
    conditions.append(Score.status == "scored")
    if low is not None:
        conditions.append(Score.value >= low)
    if high is not None:
        conditions.append(Score.value <= high)
    with engine.connect() as conn:
        counted = chosen.joined(select(func.count()).select_from(Score)).where(*conditions)
        total = int(conn.execute(counted).scalar_one())
        pages = max(1, math.ceil(total / size))
        order = {
            "value": (Score.value, Score.trace_started_at.desc()),
            "-value": (Score.value.desc(), Score.trace_started_at.desc()),
            "time": (Score.trace_started_at, Score.value),
            "-time": (Score.trace_started_at.desc(), Score.value),
        }[sort]
        question = (
            select(Trace.user_input)
            .where(Trace.trace_id == Score.trace_id)
            .correlate(Score)
            .scalar_subquery()
        )
        stmt = chosen.joined(
            select(
                Score.trace_id,
                Score.metric,
                Score.version,
                Score.value,
                Score.reason,
                Score.app_name,
                Score.trace_started_at,
                question.label("question"),
            ).select_from(Score)
        )
        stmt = (
            stmt.where(*conditions)
            .order_by(*order, Score.trace_id, Score.metric)
            .offset((page - 1) * size)
            .limit(size)
        )
        rows = [
            TraceRow(
                trace_id=r.trace_id,
                metric=r.metric,
                version=r.version,
                value=float(r.value),
                reason=r.reason,
                app_name=r.app_name,
                started_at=_utc(r.trace_started_at),
                question=r.question,
            )
            for r in conn.execute(stmt)
        ]
    return TracePage(rows=rows, total=total, page=page, pages=pages, sort=sort)


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment


# -- /traces/<id> ------------------------------------------------------------------------------


@dataclass
class TraceView:
    """What ``/traces/<id>`` shows of one request."""

    detail: TraceDetail
    reference_ranks: list[tuple[str, int | None]]
    """Each reference document id and the rank it was retrieved at (``None``: missed)."""
    context_matches: dict[int, str] | None
    """Per reference context: the retrieved context that matched it."""
    labels: list[dict[str, Any]] = field(default_factory=list)
    pending: list[Any] = field(default_factory=list)
    """Jobs of metrics with no stored result yet."""


def normalised_trace_id(text: str) -> str | None:
    """The 32 lower-case hex digits of a trace id (dashes and ``0x`` allowed), else ``None``."""
    value = text.strip().lower().removeprefix("0x").replace("-", "")
    if len(value) != 32 or any(c not in "0123456789abcdef" for c in value):
        return None
    return value


def trace_view(engine: Engine, trace_id: str) -> TraceView:
    """One stored trace with its scores, reference ranks and people's labels; raises
    ``TraceNotFound``."""
    from recalltrace._readings import context_matches, reference_ranks
    from recalltrace.storage.models import Label

    detail = history_of(engine).trace(trace_id)
    with engine.connect() as conn:
        labels = [
            {
                "metric": r.metric,
                "labeller": r.labeller,
                "value": float(r.value),
                "note": r.note,
                "claims": r.claims,
            }
            for r in conn.execute(
                select(Label.metric, Label.labeller, Label.value, Label.note, Label.claims)
                .where(Label.trace_id == trace_id)
                .order_by(Label.metric, Label.labeller)
            )
        ]
    scored = {s.metric for s in detail.scores}
    return TraceView(
        detail=detail,
        reference_ranks=reference_ranks(detail),
        context_matches=context_matches(detail),
        labels=labels,
        pending=[j for j in detail.jobs if j.metric not in scored],
    )


def evidence(details: Mapping[str, Any]) -> list[tuple[str, Any, bool]]:
    """A score's evidence as (label, value, is a list of records) in the shown order."""
    keys = [k for k in DETAIL_ORDER if k in details]
    keys += sorted(k for k in details if k not in DETAIL_ORDER)
    out = []
    for key in keys:
        value = details[key]
        records = isinstance(value, list) and bool(value)
        records = records and all(isinstance(v, dict) for v in value)
        out.append((key.replace("_", " "), value, records))
    return out


def record_columns(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The keys of a list of evidence records, in first-seen order."""
    return list(dict.fromkeys(key for record in records for key in record))


# -- /compare, /diagnose, /jobs ----------------------------------------------------------------


@dataclass
class CompareView:
    """What ``/compare`` shows: one comparison per variant (or the one asked)."""

    by: str
    groups: list[str | None]
    """Every group value in the window, for the pickers."""
    comparisons: list[tuple[str, Comparison]]


def compare(
    engine: Engine,
    filters: Filters,
    *,
    by: str,
    baseline: str | None,
    candidate: str | None,
) -> CompareView:
    """Each variant's groups by ``by`` with 95% intervals, the candidate (or every group)
    against the baseline with a verdict (``scores compare``)."""
    from recalltrace.compare import compare_groups
    from recalltrace.scorers.catalog import CATALOG

    history = history_of(engine)
    since, until = filters.bounded(engine)
    metrics = [filters.metric] if filters.metric else list(CATALOG)
    seen: dict[str | None, None] = {}
    found: list[tuple[str, Comparison]] = []
    for metric in metrics:
        selection: dict[str, Any] = {
            "metric": metric,
            "by": by,
            "since": since,
            "until": until,
            "app": filters.app,
            "where": filters.where,
        }
        try:
            groups = history.group_summaries(**selection)
            labelled = history.group_labels(**selection)
        except ValueError as exc:
            raise BadParameter(str(exc)) from None
        seen.update(dict.fromkeys(groups))
        if not groups:
            continue
        chosen = dict(groups)
        if candidate is not None:
            chosen = {k: v for k, v in groups.items() if k in (baseline, candidate)}
        if baseline is not None and baseline not in chosen:
            continue
        if not chosen:
            continue
        order = [g for g in groups if g in chosen]
        found.append(
            (
                metric,
                compare_groups(chosen, baseline=baseline, order=order, labelled=labelled),
            )
        )
    return CompareView(by=by, groups=list(seen), comparisons=found)


def diagnose(engine: Engine, filters: Filters) -> Diagnosis:
    """``scores diagnose`` of ``filters.metric`` in the window."""
    assert filters.metric is not None
    since, until = filters.bounded(engine)
    try:
        return history_of(engine).diagnose(
            metric=filters.metric,
            since=since,
            until=until,
            app=filters.app,
            where=filters.where,
        )
    except ValueError as exc:
        raise BadParameter(str(exc)) from None


@dataclass
class JobsView:
    """What ``/jobs`` shows."""

    counts: list[JobCounts]
    queue: dict[str, QueueStats]
    problems: list[Any]
    cost: list[Any]
    budget: Any | None
    """The ``--judge-budget`` the UI was started with (a ``JudgeBudget``), or ``None``."""
    spent: list[tuple[str, float]]
    """With a budget: per judge model, what its current period has spent."""
    period_start: datetime | None


def jobs(engine: Engine, filters: Filters, budget: Any | None) -> JobsView:
    """The queue per variant, the failed and stuck jobs, the judge's cost per day and, with a
    budget, the current period's spend against it (``jobs list``, ``scores cost``)."""
    from recalltrace._wiring import repository

    history = history_of(engine)
    # As ``jobs list`` and ``scores cost``: the window is of the jobs' last change and of the
    # scoring times, not of the traces.
    since, until = filters.since, filters.until
    problems = history.problem_jobs(
        metric=filters.metric, app=filters.app, since=since, until=until, limit=100
    )
    cost = history.cost(since=since, until=until, app=filters.app, metric=filters.metric)
    spent: list[tuple[str, float]] = []
    period_start = None
    if budget is not None:
        now = datetime.now(timezone.utc)
        period_start = budget.period_start(now)
        reads = repository(engine)
        models = sorted({row.model for row in cost} | _recent_models(engine, period_start))
        for model in models:
            tokens, usd = reads.judge_spend(model, period_start)
            spent.append((model, budget.spent(tokens, usd)))
    return JobsView(
        counts=history.job_counts(app=filters.app),
        queue=queue_stats(engine),
        problems=problems,
        cost=cost,
        budget=budget,
        spent=spent,
        period_start=period_start,
    )


def _recent_models(engine: Engine, since: datetime) -> set[str]:
    from recalltrace.storage.models import Score

    with engine.connect() as conn:
        return {
            m
            for m in conn.scalars(
                select(Score.model)
                .distinct()
                .where(Score.model.is_not(None), Score.scored_at >= since)
            )
            if m
        }


def agreement(engine: Engine, filters: Filters, threshold: float) -> list[Any]:
    """``scores agreement`` of ``filters.metric``: per judge model and variant version, how far
    the stored scores are from people's labels (``recalltrace.agreement.Agreement``)."""
    from recalltrace.agreement import agreement as measure
    from recalltrace.storage.labels import LabelStore

    assert filters.metric is not None
    since, until = filters.bounded(engine)
    pairs = LabelStore(engine).agreement_pairs(filters.metric, since=since, until=until)
    return measure(pairs, threshold=threshold, worst=10)


def unit_number(params: Mapping[str, str], name: str, default: float) -> float:
    """A parameter in [0, 1]."""
    text = params.get(name) or ""
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise BadParameter(f"{name} must be a number from 0 to 1, not {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise BadParameter(f"{name} must be a number from 0 to 1, not {text!r}")
    return value


def age_text(seconds: float | None) -> str:
    """``3m``, ``2h``, ``1d`` (``-`` for none)."""
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"
