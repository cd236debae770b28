"""The hourly rollups behind ``scores compare`` and ``scores cost`` (Postgres): what they return
equals what the scores say, before and after the scores change, whatever the window."""

from __future__ import annotations

import math
import random
import time
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text

from recalltrace.scorers import ScoreResult
from recalltrace.storage.models import CostCache, GroupCache
from recalltrace.storage.repository import Repository
from tests.support.factories import make_history, make_repository, make_trace

pytestmark = pytest.mark.postgres

METRIC = "id_based_context_recall"


def store(repo: Repository, plan: list[tuple[datetime, str | None, str, list[str], float]]) -> None:
    """Traces (start, release, environment, tags) scored with the given values."""
    traces = []
    for started_at, release, environment, tags, _value in plan:
        trace = make_trace(started_at=started_at, reference_context_ids=["doc_1"])
        trace.release, trace.environment, trace.tags = release, environment, tags
        traces.append(trace)
    repo.write_traces(traces)
    jobs = {j.trace_id: j for j in repo.claim_jobs("w", limit=10_000, lease=timedelta(minutes=5))}
    repo.finish_jobs(
        [
            (
                jobs[t.trace_id],
                ScoreResult(metric=METRIC, value=p[4], status="scored", reason="ids"),
            )
            for t, p in zip(traces, plan, strict=True)
        ]
    )


def expected(
    plan: list[tuple[datetime, str | None, str, list[str], float]],
    by: str,
    since: datetime | None,
    where: dict[str, str],
) -> dict[str | None, tuple[int, float, float, int]]:
    sums: dict[str | None, list[Any]] = defaultdict(lambda: [0, 0.0, 0.0, 0])
    for started_at, release, environment, tags, value in plan:
        attributes = {"release": release, "environment": environment}
        if since is not None and started_at < since:
            continue
        if any(attributes[name] != wanted for name, wanted in where.items()):
            continue
        groups: list[str | None] = (tags or [None]) if by == "tag" else [attributes[by]]
        for group in groups:
            into = sums[group]
            into[0] += 1
            into[1] += value
            into[2] += value * value
            into[3] += value not in (0.0, 1.0)
    return {group: tuple(v) for group, v in sums.items()}  # type: ignore[misc]


def got(history: Any, by: str, since: datetime | None, where: dict[str, str]) -> dict:
    sums = history.group_summaries(
        metric=METRIC, by=by, since=since, where=list(where.items()), max_values=0
    )
    return {g: (s.count, s.total, s.total_squares, s.fractional) for g, s in sums.items()}


def same(left: dict, right: dict) -> bool:
    return left.keys() == right.keys() and all(
        left[k][0] == right[k][0]
        and left[k][3] == right[k][3]
        and math.isclose(left[k][1], right[k][1], abs_tol=1e-9)
        and math.isclose(left[k][2], right[k][2], abs_tol=1e-9)
        for k in left
    )


def group_rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.scalar(select(func.count()).select_from(GroupCache)) or 0)


def test_compare_sums_from_the_hourly_rollups_equal_the_scores(pg_engine: Engine) -> None:
    repo = make_repository(pg_engine, metrics=[METRIC])
    history = make_history(pg_engine)
    rng = random.Random(3)
    now = datetime.now(timezone.utc)
    plan = [
        (
            now - timedelta(minutes=rng.randrange(1, 5 * 24 * 60)),
            rng.choice(["2.4.0", "2.4.1", None]),
            rng.choice(["production", "staging"]),
            rng.choice([[], ["beta"], ["beta", "eu"]]),
            rng.choice([0.0, 1.0, 0.25, 0.5, 0.75]),
        )
        for _ in range(300)
    ]
    store(repo, plan)
    windows = [None, now - timedelta(days=2, minutes=17)]  # all, and one starting mid-hour
    filters: list[dict[str, str]] = [{}, {"environment": "production"}]
    for by in ("release", "environment", "tag"):
        for since in windows:
            for where in filters:
                want = expected(plan, by, since, where)
                assert same(got(history, by, since, where), want), (by, since, where)
                # Now from the cache: the same answer.
                assert same(got(history, by, since, where), want), (by, since, where)
    assert group_rows(pg_engine) > 0
    # Groups come in the order of their first trace.
    first = min(plan, key=lambda p: p[0])
    assert next(iter(got(history, "release", None, {}))) == first[1]

    # A score written into an hour already rolled up shows at once.
    late = [(now - timedelta(days=3, minutes=5), "2.4.1", "staging", ["beta"], 0.0)]
    store(repo, late)
    plan += late
    for by in ("release", "tag"):
        assert same(got(history, by, None, {}), expected(plan, by, None, {})), by

    # Retention: the deleted traces leave every rolled-up hour they were in.
    cutoff = now - timedelta(days=2, minutes=30)
    repo.delete_traces_before(cutoff)
    kept = [p for p in plan if p[0] >= cutoff]
    for by in ("release", "environment", "tag"):
        assert same(got(history, by, None, {}), expected(kept, by, None, {})), by


def test_an_hour_without_results_is_rolled_up_once(pg_engine: Engine) -> None:
    """Empty hours are stored as such: a long window of few results is not recomputed."""
    repo = make_repository(pg_engine, metrics=[METRIC])
    history = make_history(pg_engine)
    now = datetime.now(timezone.utc)
    store(repo, [(now - timedelta(days=20), "2.4.0", "production", [], 0.5)])
    since = now - timedelta(days=21)
    assert got(history, "release", since, {}) == {"2.4.0": (1, 0.5, 0.25, 1)}
    stored = group_rows(pg_engine)
    # One row per ended hour up to the last result, most of them marks of empty hours.
    assert stored >= 23
    statements: list[str] = []
    from sqlalchemy import event

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    event.listen(pg_engine, "before_cursor_execute", seen)
    try:
        assert got(history, "release", since, {}) == {"2.4.0": (1, 0.5, 0.25, 1)}
    finally:
        event.remove(pg_engine, "before_cursor_execute", seen)
    assert group_rows(pg_engine) == stored
    assert not [s for s in statements if "INSERT INTO group_cache" in s]


def scored_at(engine: Engine, failed: datetime, others: datetime) -> None:
    """Move the stored results' scoring times to the past (failed ones earlier)."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE scores SET scored_at = CASE status WHEN 'failed' THEN :failed "
                "ELSE :others END"
            ),
            {"failed": failed, "others": others},
        )


def cost_by_sql(engine: Engine, since: datetime) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text(
                    """
                    SELECT date_trunc('day', scored_at AT TIME ZONE 'UTC'), metric, model,
                        count(*), coalesce(sum(prompt_tokens), 0),
                        coalesce(sum(completion_tokens), 0), sum(cost_usd),
                        count(*) FILTER (WHERE cost_usd IS NULL)
                    FROM scores WHERE model IS NOT NULL AND scored_at >= :since
                    GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
                    """
                ),
                {"since": since},
            )
        ]


def as_tuples(rows: list[Any]) -> list[tuple[Any, ...]]:
    return [
        (
            r.day.replace(tzinfo=None),
            r.metric,
            r.model,
            r.scores,
            r.prompt_tokens,
            r.completion_tokens,
            None if r.cost_usd is None else pytest.approx(r.cost_usd),
            r.unpriced,
        )
        for r in rows
    ]


def test_cost_from_the_hourly_rollups_follows_retried_and_replaced_results(
    pg_engine: Engine,
) -> None:
    metric = "llm_context_recall"
    repo = make_repository(pg_engine, metrics=[metric])
    history = make_history(pg_engine)
    now = datetime.now(timezone.utc)
    traces = [make_trace(started_at=now - timedelta(days=3)) for _ in range(6)]
    repo.write_traces(traces)
    jobs = repo.claim_jobs("w", limit=10, lease=timedelta(minutes=5))
    repo.finish_jobs(
        [
            (
                job,
                ScoreResult(
                    metric=metric,
                    value=None if index < 2 else 0.5,
                    status="failed" if index < 2 else "scored",
                    reason="judge",
                    model="gpt-a" if index % 2 else "gpt-b",
                    prompt_tokens=100 * (index + 1),
                    completion_tokens=10,
                    cost_usd=None if index == 5 else 0.001 * (index + 1),
                ),
            )
            for index, job in enumerate(jobs)
        ]
    )
    scored_at(pg_engine, now - timedelta(days=2), now - timedelta(days=1))
    since = now - timedelta(days=4, minutes=7)
    want = cost_by_sql(pg_engine, since)
    assert as_tuples(history.cost(since=since)) == want
    with pg_engine.connect() as conn:  # the hour of the failed results is stored
        assert conn.scalar(select(func.count()).select_from(CostCache).where(CostCache.n > 0))
    assert as_tuples(history.cost(since=since)) == want  # from the cache
    assert as_tuples(history.cost(since=since, metric=metric)) == want
    assert history.cost(since=since, app="no-such-app") == []

    # Retrying the failed results deletes them from the hour they were stored in; their new
    # results land in the current hour.
    assert repo.retry_jobs(metric=metric) == 2
    again = repo.claim_jobs("w", limit=10, lease=timedelta(minutes=5))
    repo.finish_jobs(
        [
            (
                job,
                ScoreResult(
                    metric=metric,
                    value=1.0,
                    status="scored",
                    reason="judge",
                    model="gpt-c",
                    prompt_tokens=7,
                    completion_tokens=1,
                    cost_usd=0.5,
                ),
            )
            for job in again
        ]
    )
    want = cost_by_sql(pg_engine, since)
    assert [r[2] for r in want].count("gpt-c") == 1
    assert as_tuples(history.cost(since=since)) == want

    # A failed result replaced by another run of the same job (the first run's lease ran out
    # while it ran) leaves the hour it was stored in.
    trace = make_trace(started_at=now - timedelta(days=3))
    repo.write_traces([trace])
    (slow_run,) = repo.claim_jobs("w1", limit=1, lease=timedelta(milliseconds=1))
    time.sleep(0.05)
    assert repo.requeue_expired_leases() == 1
    (fast_run,) = repo.claim_jobs("w2", limit=1, lease=timedelta(minutes=5))
    failure = ScoreResult(
        metric=metric, value=None, status="failed", reason="judge", model="gpt-d", cost_usd=0.2
    )
    repo.finish_jobs([(fast_run, failure)])
    with pg_engine.begin() as conn:
        conn.execute(
            text("UPDATE scores SET scored_at = :m WHERE trace_id = :t"),
            {"m": now - timedelta(days=2, hours=3), "t": trace.trace_id},
        )
        # Moved by hand: drop what the cache held, as storing it then would have.
        conn.execute(text("DELETE FROM cost_cache"))
    assert as_tuples(history.cost(since=since)) == cost_by_sql(pg_engine, since)
    success = ScoreResult(
        metric=metric, value=1.0, status="scored", reason="judge", model="gpt-e", cost_usd=0.3
    )
    repo.finish_jobs([(slow_run, success)])
    want = cost_by_sql(pg_engine, since)
    assert "gpt-d" not in [r[2] for r in want]
    assert as_tuples(history.cost(since=since)) == want


def test_cost_filtered_by_release_is_rolled_up_in_its_own_scope(pg_engine: Engine) -> None:
    metric = "llm_context_recall"
    repo = make_repository(pg_engine, metrics=[metric])
    history = make_history(pg_engine)
    now = datetime.now(timezone.utc)
    traces = [make_trace(started_at=now - timedelta(days=3)) for _ in range(5)]
    for index, trace in enumerate(traces):
        trace.release = "2.5.0" if index % 2 else "2.4.1"
    repo.write_traces(traces)
    jobs = repo.claim_jobs("w", limit=10, lease=timedelta(minutes=5))
    repo.finish_jobs(
        [
            (
                job,
                ScoreResult(
                    metric=metric, value=0.5, status="scored", reason="judge", model="gpt-a",
                    prompt_tokens=10 * (index + 1), completion_tokens=1, cost_usd=0.01,
                ),
            )
            for index, job in enumerate(jobs)
        ]
    )  # fmt: skip
    scored_at(pg_engine, now, now - timedelta(days=2))
    since = now - timedelta(days=4)

    def by_sql(release: str) -> int:
        with pg_engine.connect() as conn:
            return int(
                conn.scalar(
                    text("SELECT sum(prompt_tokens) FROM scores WHERE release = :r"),
                    {"r": release},
                )
            )

    for release in ("2.5.0", "2.4.1"):
        for _ in range(2):  # computed, then from the cache
            rows = history.cost(since=since, until=now, where=[("release", release)])
            assert sum(r.prompt_tokens for r in rows) == by_sql(release)
    with pg_engine.connect() as conn:
        scopes = set(conn.scalars(select(CostCache.scope).where(CostCache.n > 0)))
    assert scopes == {"\x1frelease=2.5.0", "\x1frelease=2.4.1"}


def test_many_distinct_tags_are_summed_from_the_scores_not_rolled_up(pg_engine: Engine) -> None:
    """A tag per customer would make the hourly sums outgrow the scores: past 200 distinct
    tags, grouping by tag reads the scores, stores nothing, and still agrees with them."""
    repo = make_repository(pg_engine, metrics=[METRIC])
    history = make_history(pg_engine)
    now = datetime.now(timezone.utc)
    plan = [
        (now - timedelta(hours=5 + index % 48), "2.4.1", "production", [f"customer-{index}"], 1.0)
        for index in range(230)
    ]
    store(repo, plan)
    assert same(got(history, "tag", None, {}), expected(plan, "tag", None, {}))
    history.warm_summaries()
    with pg_engine.connect() as conn:
        attributes = set(conn.scalars(select(GroupCache.attribute).distinct()))
    assert "tag" not in attributes and "release" in attributes
