"""``scores diagnose`` read through its hourly rollups (Postgres) says exactly what the scores
say: the same traffic stored on SQLite (which keeps no rollup) and on Postgres diagnoses the
same, from stored hours, from hours computed live, and after results in a stored hour are
retried and rewritten."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import Engine, select

from recalltrace.scorers import ScoreResult
from recalltrace.scorers.variants.id_based_context_recall import IDBasedContextRecall
from recalltrace.scorers.variants.non_llm_context_recall import NonLLMContextRecall
from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.history import History
from recalltrace.storage.models import DiagnoseCache
from recalltrace.storage.records import TraceRecord
from recalltrace.storage.repository import Repository
from tests.support.diagnose_data import ID_METRIC, LLM_METRIC, claims_result, traffic
from tests.support.factories import make_history, make_repository

pytestmark = pytest.mark.postgres

STRING_METRIC = "non_llm_context_recall"
APP = "rolled-app"
HOURS = 4
PER_HOUR = 300


def result(record: TraceRecord, metric: str, *, failed: bool = False) -> ScoreResult:
    """The result a worker stores, the same on both databases (drawn per trace)."""
    if failed:
        return ScoreResult(metric=metric, value=None, status="failed", reason="judge timed out")
    if metric == STRING_METRIC:
        return NonLLMContextRecall().score(
            reference_contexts=record.reference_contexts,
            retrieved_contexts=[c.content for c in record.retrieved_contexts],
        )
    if metric == ID_METRIC:
        return IDBasedContextRecall().score(
            reference_context_ids=record.reference_context_ids,
            retrieved_context_ids=[c.id for c in record.retrieved_contexts],
        )
    return claims_result(record, random.Random(record.trace_id), planted=True)


def score(repo: Repository, records: Sequence[TraceRecord], failing: set[str]) -> dict[Any, Any]:
    """Score every due job; the jobs of ``failing`` traces store a failed result. Returns the
    jobs by (trace id, metric)."""
    by_id = {r.trace_id: r for r in records}
    claimed = {}
    while jobs := repo.claim_jobs("rollup-test", limit=5000, lease=timedelta(minutes=5)):
        repo.finish_jobs(
            [
                (job, result(by_id[job.trace_id], job.metric, failed=job.trace_id in failing))
                for job in jobs
            ]
        )
        claimed.update({(job.trace_id, job.metric): job for job in jobs})
    return claimed


def same(left: Any, right: Any, path: str = "") -> list[str]:
    """Where two ``Diagnosis.as_dict()`` differ (floats to 1e-9: sums added up in another
    order)."""
    if isinstance(left, float) and isinstance(right, float):
        return [] if math.isclose(left, right, rel_tol=1e-9, abs_tol=1e-12) else [path]
    if isinstance(left, dict) and isinstance(right, dict):
        if left.keys() != right.keys():
            return [f"{path} keys"]
        return [d for k in left for d in same(left[k], right[k], f"{path}.{k}")]
    if isinstance(left, list) and isinstance(right, list):
        if len(left) != len(right):
            return [f"{path} length {len(left)} != {len(right)}"]
        return [
            d
            for i, (a, b) in enumerate(zip(left, right, strict=True))
            for d in same(a, b, f"{path}[{i}]")
        ]
    return [] if left == right else [f"{path}: {left!r} != {right!r}"]


CASES: list[dict[str, Any]] = [
    {"metric": ID_METRIC, "all_slices": True, "limit": 50},
    {"metric": LLM_METRIC, "all_slices": True, "limit": 50},
    {"metric": STRING_METRIC, "all_slices": True, "limit": 50},
    {"metric": ID_METRIC, "app": APP, "where": [("environment", "production")]},
    {"metric": ID_METRIC, "where": [("release", "2.4.1")], "min_count": 5},
]


def check_equal(pg: History, lite: History, since: datetime) -> None:
    for case in CASES:
        rolled = pg.diagnose(since=since, **case).as_dict()
        scored = lite.diagnose(since=since, **case).as_dict()
        assert rolled["scored"] > 0 and rolled["slices_tested"] > 0, case
        assert rolled["missed_references"] or rolled["unsupported_claims"], case
        assert same(rolled, scored) == [], case


def stored_hours(engine: Engine) -> set[datetime]:
    with engine.connect() as conn:
        return set(
            conn.scalars(
                select(DiagnoseCache.bucket_start).where(
                    DiagnoseCache.section == "hour",
                    DiagnoseCache.metric == ID_METRIC,
                    DiagnoseCache.scope == "",
                )
            )
        )


def test_rolled_up_diagnosis_equals_the_scores(pg_engine: Engine, sqlite_url: str) -> None:
    lite_engine = create_engine_from_url(sqlite_url)
    metrics = [ID_METRIC, LLM_METRIC, STRING_METRIC]
    pg_repo = make_repository(pg_engine, metrics=metrics)
    lite_repo = make_repository(lite_engine, metrics=metrics)
    now = datetime.now(timezone.utc)
    first_hour = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=HOURS - 1)
    rng = random.Random(34)
    records: list[TraceRecord] = []
    for hour in range(HOURS):  # three ended hours and the current one
        start = min(first_hour + timedelta(hours=hour, minutes=59), now - timedelta(seconds=1))
        batch = traffic(rng, PER_HOUR, app=APP, planted=True, start=start)
        for record in batch:
            record.started_at = max(record.started_at, first_hour + timedelta(hours=hour))
            # Reference contexts for the string variant, the first retrieved half the time.
            record.reference_contexts = (record.reference or "").split(". ")
            if rng.random() < 0.5:
                record.retrieved_contexts[0].content = record.reference_contexts[0]
        records += batch
    # A quarter of the oldest hour's results fail first; they are retried later.
    oldest = [r for r in records if r.started_at < first_hour + timedelta(hours=1)]
    failing = {r.trace_id for r in oldest[: len(oldest) // 4]}
    pg_repo.write_traces(records)
    lite_repo.write_traces(records)
    pg_jobs = score(pg_repo, records, failing)
    lite_jobs = score(lite_repo, records, failing)
    pg, lite = make_history(pg_engine), make_history(lite_engine)
    since = first_hour - timedelta(minutes=30)

    # Nothing stored yet: every section read from the scores in one pass.
    assert stored_hours(pg_engine) == set()
    check_equal(pg, lite, since)

    # The workers' fill stores the ended hours; the current one is still computed (and the
    # app and release scopes, never stored, read from the scores).
    pg.warm_summaries()
    ended = {first_hour + timedelta(hours=h) for h in range(HOURS - 1)}
    assert stored_hours(pg_engine) >= ended
    assert first_hour + timedelta(hours=HOURS - 1) not in stored_hours(pg_engine)
    check_equal(pg, lite, since)

    # Retried: the failed results are deleted and scored again; the oldest hour is dropped.
    retried = [repo.retry_jobs() for repo in (pg_repo, lite_repo)]
    assert retried[0] == retried[1] >= 2 * len(failing)
    assert first_hour not in stored_hours(pg_engine)
    check_equal(pg, lite, since)
    for repo in (pg_repo, lite_repo):
        score(repo, records, set())
    check_equal(pg, lite, since)
    pg.warm_summaries()
    assert first_hour in stored_hours(pg_engine)
    check_equal(pg, lite, since)

    # A result rewritten in a stored hour: a worker whose lease ran out finishes late, after
    # another one stored the job's result, and its result replaces it.
    rewritten = oldest[-1]
    assert rewritten.trace_id not in failing
    late = ScoreResult(metric=ID_METRIC, value=0.0, status="scored", reason="rewritten")
    for repo, jobs in ((pg_repo, pg_jobs), (lite_repo, lite_jobs)):
        repo.finish_jobs([(jobs[(rewritten.trace_id, ID_METRIC)], late)])
    assert first_hour not in stored_hours(pg_engine)
    check_equal(pg, lite, since)
    pg.warm_summaries()
    check_equal(pg, lite, since)

    # An ended hour without results is stored as empty by the fill; results arriving in it
    # later (a late trace) drop it, and it is read from the scores, then stored again.
    quiet = first_hour - timedelta(hours=5)
    assert quiet in stored_hours(pg_engine)
    late_traffic = traffic(rng, 12, app=APP, planted=True, start=quiet + timedelta(minutes=59))
    for record in late_traffic:
        record.started_at = max(record.started_at, quiet)
    for repo in (pg_repo, lite_repo):
        repo.write_traces(late_traffic)
        score(repo, late_traffic, set())
    assert quiet not in stored_hours(pg_engine)
    check_equal(pg, lite, quiet - timedelta(minutes=30))
    pg.warm_summaries()
    assert quiet in stored_hours(pg_engine)
    check_equal(pg, lite, quiet - timedelta(minutes=30))
    lite_engine.dispose()
