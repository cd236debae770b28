"""The Postgres summary cache: complete buckets are stored, and a score written into a bucket
always shows in the next summary."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import Engine, delete, func, select

from recalltrace.scorers import ScoreResult
from recalltrace.storage import summary_cache
from recalltrace.storage.models import CostCache, SummaryCache
from recalltrace.storage.repository import Repository
from tests.support.factories import make_history, make_repository, make_trace

pytestmark = pytest.mark.postgres

METRIC = "id_based_context_recall"


def Result(metric: str, value: float) -> ScoreResult:
    return ScoreResult(
        metric=metric, value=value, status="scored", reason="Some reference ids were retrieved."
    )


def score_traces(
    repo: Repository, started_at: datetime, values: list[float], release: str | None = None
) -> None:
    traces = [make_trace(started_at=started_at, reference_context_ids=["doc_1"]) for _ in values]
    for trace in traces:
        trace.release = release
    repo.write_traces(traces)
    jobs = {j.trace_id: j for j in repo.claim_jobs("w", limit=1000, lease=timedelta(minutes=5))}
    repo.finish_jobs(
        [(jobs[t.trace_id], Result(METRIC, v)) for t, v in zip(traces, values, strict=True)]
    )


def cache_rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.scalar(select(func.count()).select_from(SummaryCache)) or 0)


def test_complete_buckets_are_cached_and_a_new_score_invalidates_them(pg_engine: Engine) -> None:
    repo = make_repository(pg_engine, metrics=[METRIC])
    history = make_history(pg_engine)
    day = datetime.now(timezone.utc).replace(hour=10, minute=0, second=0, microsecond=0)
    three_days_ago = day - timedelta(days=3)
    score_traces(repo, three_days_ago, [0.0, 0.5, 1.0])

    first = history.summary(bucket="day", metric=METRIC)
    assert [(r.count, r.mean, r.p50) for r in first] == [(3, 0.5, 0.5)]
    assert cache_rows(pg_engine) == 1
    assert history.summary(bucket="day", metric=METRIC) == first  # served from the cache

    score_traces(repo, three_days_ago + timedelta(hours=5), [1.0])
    assert cache_rows(pg_engine) == 0  # the write dropped the bucket's row
    second = history.summary(bucket="day", metric=METRIC)
    assert [(r.count, r.mean, r.p50) for r in second] == [(4, 0.625, 0.75)]


def test_cached_and_live_summaries_agree(pg_engine: Engine) -> None:
    repo = make_repository(pg_engine, metrics=[METRIC])
    history = make_history(pg_engine)
    now = datetime.now(timezone.utc)
    for days in range(6):
        score_traces(repo, now - timedelta(days=days, hours=1), [0.1 * days, 0.2, 0.9])
    for bucket in ("day", "hour"):
        warm = history.summary(bucket=bucket, since=now - timedelta(days=7))  # type: ignore[arg-type]
        cached = history.summary(bucket=bucket, since=now - timedelta(days=7))  # type: ignore[arg-type]
        with pg_engine.begin() as conn:
            conn.execute(delete(SummaryCache))
        cold = history.summary(bucket=bucket, since=now - timedelta(days=7))  # type: ignore[arg-type]
        assert warm == cached == cold
    # A window that starts mid-bucket computes that bucket live over the window only.
    partial = history.summary(bucket="day", since=now - timedelta(hours=12), metric=METRIC)
    assert sum(r.count for r in partial) == 3


def test_the_bucket_still_filling_is_never_cached(pg_engine: Engine) -> None:
    repo = make_repository(pg_engine, metrics=[METRIC])
    score_traces(repo, datetime.now(timezone.utc) - timedelta(seconds=5), [1.0])
    make_history(pg_engine).summary(bucket="day", metric=METRIC)
    assert cache_rows(pg_engine) == 0


def test_a_fill_waits_for_a_score_being_written_into_its_bucket(
    pg_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the lock, the fill could store a row computed before the score committed."""
    repo = make_repository(pg_engine, metrics=[METRIC])
    history = make_history(pg_engine)
    past = datetime.now(timezone.utc) - timedelta(days=2)
    score_traces(repo, past, [1.0])
    late = make_trace(started_at=past, reference_context_ids=["doc_1"])
    repo.write_traces([late])
    (job,) = repo.claim_jobs("w", limit=1, lease=timedelta(minutes=5))

    results: list[Any] = []
    writer_inside = threading.Event()
    release_writer = threading.Event()
    original = summary_cache.invalidate

    def slow_invalidate(conn: Any, dialect: Any, *args: Any) -> None:
        original(conn, dialect, *args)
        writer_inside.set()
        release_writer.wait(10)  # hold the transaction (and the shared lock) open

    monkeypatch.setattr(summary_cache, "invalidate", slow_invalidate)
    writer = threading.Thread(target=repo.finish_jobs, args=([(job, Result(METRIC, 0.0))],))
    writer.start()
    assert writer_inside.wait(10)
    reader = threading.Thread(
        target=lambda: results.append(history.summary(bucket="day", metric=METRIC))
    )
    reader.start()
    time.sleep(0.5)
    assert reader.is_alive(), "the cache fill did not wait for the uncommitted score"
    release_writer.set()
    writer.join(10)
    reader.join(10)
    (rows,) = results
    assert [(r.count, r.mean) for r in rows] == [(2, 0.5)]
    assert [(r.count, r.mean) for r in history.summary(bucket="day", metric=METRIC)] == [(2, 0.5)]


def test_deleting_old_traces_drops_their_cached_buckets(pg_engine: Engine) -> None:
    repo = make_repository(pg_engine, metrics=[METRIC])
    history = make_history(pg_engine)
    hour = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    hour -= timedelta(days=3)
    score_traces(repo, hour.replace(minute=10), [1.0])
    score_traces(repo, hour.replace(minute=50), [0.0])
    since = hour - timedelta(days=1)
    assert [(r.count, r.mean) for r in history.summary(bucket="hour", since=since)] == [(2, 0.5)]
    assert [r.count for r in history.summary(bucket="day", metric=METRIC)] == [2]
    # The cutoff falls inside the hour: the bucket keeps one score of two.
    assert repo.delete_traces_before(hour.replace(minute=30)) == 1
    assert [(r.count, r.mean) for r in history.summary(bucket="hour", since=since)] == [(1, 0.0)]
    assert [(r.count, r.mean) for r in history.summary(bucket="day", metric=METRIC)] == [(1, 0.0)]


def cached_keys(engine: Engine) -> set[tuple[str, datetime, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(SummaryCache.bucket, SummaryCache.bucket_start, SummaryCache.app_name)
        ).all()
    return {(bucket, start.astimezone(timezone.utc), app) for bucket, start, app in rows}


def test_ended_buckets_are_summarised_in_the_background_before_anyone_asks(
    pg_engine: Engine,
) -> None:
    """A worker stores the summaries of ended hour and day buckets (for all apps together and
    for each app), so the first ``scores summary`` after a restart reads them instead of
    computing them; the buckets still filling are never stored."""
    import asyncio

    from recalltrace.scorers.worker import Worker, WorkerOptions

    repo = make_repository(pg_engine, metrics=[METRIC])
    now = datetime.now(timezone.utc)
    old, recent = now - timedelta(days=3), now - timedelta(hours=3)
    score_traces(repo, old, [0.0, 1.0])
    score_traces(repo, recent, [0.5], release="2.5.0")
    assert cache_rows(pg_engine) == 0

    worker = Worker(
        WorkerOptions(
            metrics=[METRIC],
            poll_interval_s=0.05,
            maintenance_interval_s=0.05,
            summaries_interval_s=0.1,
            listen=False,
        ),
        repository=repo,
        warm=make_history(pg_engine).warm_summaries,
    )
    thread = threading.Thread(target=lambda: asyncio.run(worker.run()), daemon=True)
    thread.start()
    day = old.replace(hour=0, minute=0, second=0, microsecond=0)
    hour = recent.replace(minute=0, second=0, microsecond=0)
    wanted = {
        ("day", day, ""),
        ("day", day, "support-bot"),
        ("hour", hour, ""),
        ("hour", hour, "support-bot"),
        # The release seen recently, filtered: its hour bucket.
        ("hour", hour, "\x1frelease=2.5.0"),
    }
    deadline = time.monotonic() + 30
    try:
        while not wanted <= cached_keys(pg_engine):
            assert time.monotonic() < deadline, cached_keys(pg_engine)
            time.sleep(0.05)
    finally:
        worker.request_stop()
        thread.join(30)
        worker.close()
    this_hour = now.replace(minute=0, second=0, microsecond=0)
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    stored = cached_keys(pg_engine)
    # Still filling: this hour's and today's buckets. (An hour bucket starting at midnight is
    # an ended one from 01:00 on, though its start equals today's.)
    filling = {("hour", this_hour), ("day", today)}
    assert not {key for key in stored if key[:2] in filling}
    with pg_engine.connect() as conn:  # the judge-cost hours too, of every app and the release
        scopes = set(conn.scalars(select(CostCache.scope).distinct()))
    assert scopes == {"", "\x1frelease=2.5.0"}

    # A user's query over ended buckets now finds them all stored: it stores nothing more,
    # and its figures are the scores' own.
    before = cache_rows(pg_engine)
    history = make_history(pg_engine)
    rows = history.summary(bucket="day", metric=METRIC, since=day, until=day + timedelta(days=1))
    assert [(r.count, r.mean) for r in rows] == [(2, 0.5)]
    rows = history.summary(
        bucket="hour", metric=METRIC, since=hour, until=hour + timedelta(hours=1),
        where=[("release", "2.5.0")],
    )  # fmt: skip
    assert [(r.count, r.mean) for r in rows] == [(1, 0.5)]
    assert cache_rows(pg_engine) == before
    assert history.warm_summaries() > 0  # a second pass finds everything stored
    assert cache_rows(pg_engine) == before


def test_summaries_filtered_by_release_are_cached_scoped_and_dropped_with_their_bucket(
    pg_engine: Engine,
) -> None:
    repo = make_repository(pg_engine, metrics=[METRIC])
    history = make_history(pg_engine)
    day = datetime.now(timezone.utc).replace(hour=10, minute=0, second=0, microsecond=0)
    started = day - timedelta(days=3)

    def score(release: str, environment: str, values: list[float]) -> None:
        traces = [make_trace(started_at=started, reference_context_ids=["doc_1"]) for _ in values]
        for trace in traces:
            trace.release, trace.environment = release, environment
        repo.write_traces(traces)
        jobs = {j.trace_id: j for j in repo.claim_jobs("w", limit=100, lease=timedelta(minutes=5))}
        repo.finish_jobs(
            [(jobs[t.trace_id], Result(METRIC, v)) for t, v in zip(traces, values, strict=True)]
        )

    score("2.4.1", "production", [0.0, 1.0])
    score("2.5.0", "production", [0.5])
    score("2.5.0", "staging", [1.0])

    def summary(*where: tuple[str, str]) -> list[tuple[int, float | None]]:
        rows = history.summary(bucket="day", metric=METRIC, where=list(where))
        return [(r.count, r.mean) for r in rows]

    assert summary(("release", "2.4.1")) == [(2, 0.5)]
    assert summary(("release", "2.5.0")) == [(2, 0.75)]
    assert summary(("release", "2.5.0"), ("environment", "production")) == [(1, 0.5)]
    assert summary(("environment", "staging"), ("app", "support-bot")) == [(1, 1.0)]
    assert summary(("release", "9.9")) == []
    with pg_engine.connect() as conn:
        keys = set(conn.scalars(select(SummaryCache.app_name)))
    assert keys == {
        "\x1frelease=2.4.1",
        "\x1frelease=2.5.0",
        "\x1frelease=9.9",  # its ended bucket is stored empty: not computed again
        "\x1fenvironment=production\x1frelease=2.5.0",
        "support-bot\x1fenvironment=staging",
    }
    assert summary(("release", "2.4.1")) == [(2, 0.5)]  # from the cache, the same
    # A filter the score rows do not carry still joins the traces, and agrees.
    assert (
        history.summary(bucket="day", metric=METRIC, where=[("service", "test-service")])[0].count
        == 4
    )

    score("2.4.1", "production", [1.0])  # a new score of the bucket drops every scope's row
    assert cache_rows(pg_engine) == 0
    assert summary(("release", "2.4.1")) == [(3, pytest.approx(2 / 3))]
