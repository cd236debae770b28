"""Repository behaviour on real databases: SQLite and Postgres for the single-worker cases,
Postgres for concurrency."""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from recalltrace.scorers.catalog import CATALOG as ALL_VARIANTS
from recalltrace.storage.models import JobStatus, RetrievedContext, Score, ScoringJob, Trace
from recalltrace.storage.records import ReferenceUpdate, WriteResult
from recalltrace.storage.repository import Repository, TraceNotFound
from tests.support.factories import make_repository, make_trace


@dataclass(frozen=True)
class ScoreValue:
    metric: str
    value: float | None = 0.75
    status: str = "scored"
    reason: str = "Three of four claims are supported."
    details: dict[str, Any] = field(default_factory=lambda: {"claims": [1, 1, 1, 0]})
    model: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None
    latency_ms: float | None = 1.5
    version: str = "1"


CATALOG = {k: v for k, v in ALL_VARIANTS.items() if not v.job_spec.needs_pool}
"""The variants whose jobs every trace gets (a pooled one's job needs a stored pool)."""


def count(repo: Repository, stmt: Any) -> int:
    with repo.engine.connect() as conn:
        return int(conn.scalar(stmt) or 0)


def job_statuses(repo: Repository, trace_id: str) -> dict[str, str]:
    with repo.engine.connect() as conn:
        rows = conn.execute(
            select(ScoringJob.metric, ScoringJob.status).where(ScoringJob.trace_id == trace_id)
        ).all()
    return {metric: status for metric, status in rows}


def test_write_traces_stores_contexts_in_order_and_creates_jobs(repo: Repository) -> None:
    with_ref = make_trace(
        reference_contexts=["Paris is the capital."], reference_context_ids=["doc_0"]
    )
    without_ref = make_trace(reference=None)
    repo.write_traces([with_ref, without_ref])

    assert count(repo, select(func.count()).select_from(Trace)) == 2
    inputs = repo.load_inputs([with_ref.trace_id])[with_ref.trace_id]
    assert inputs.retrieved_contexts == [c.content for c in with_ref.retrieved_contexts]
    assert inputs.retrieved_context_ids == ["doc_0", "doc_1", "doc_2"]
    assert inputs.started_at == with_ref.started_at

    assert set(job_statuses(repo, with_ref.trace_id).values()) == {JobStatus.QUEUED}
    waiting = job_statuses(repo, without_ref.trace_id)
    assert len(waiting) == len(CATALOG)
    for key, info in CATALOG.items():
        expected = JobStatus.WAITING if info.needs_reference else JobStatus.QUEUED
        assert waiting[key] == expected, key


def test_write_traces_is_idempotent_on_trace_id(repo: Repository) -> None:
    first = make_trace()
    repo.write_traces([first])
    second = make_trace()
    # The resend of a batch whose commit was not confirmed, plus one new record.
    repo.write_traces([first, second, first])
    assert count(repo, select(func.count()).select_from(Trace)) == 2
    assert count(repo, select(func.count()).select_from(RetrievedContext)) == 6
    assert count(repo, select(func.count()).select_from(ScoringJob)) == 2 * len(CATALOG)


def test_another_request_under_a_stored_id_is_a_conflict_not_a_silent_success(
    repo: Repository,
) -> None:
    """Two processes that drew one id (uWSGI's workers did): the second request is not stored
    over the first, nor counted as stored; the write says which ids conflict. The same request
    sent again (a resend) is still a success."""
    first = make_trace()
    assert repo.write_traces([first]) == WriteResult(stored=1)
    other = dataclasses.replace(
        make_trace(trace_id=first.trace_id), started_at=first.started_at + timedelta(seconds=3)
    )
    fresh = make_trace()
    result = repo.write_traces([first, other, fresh])
    assert result == WriteResult(stored=2, conflicts=(first.trace_id,))
    # By COPY's fallback on Postgres too: a batch whose only record conflicts.
    assert repo.write_traces([other]) == WriteResult(stored=0, conflicts=(first.trace_id,))
    with repo.engine.connect() as conn:
        stored = conn.execute(
            select(Trace.started_at).where(Trace.trace_id == first.trace_id)
        ).scalar_one()
    assert abs((stored - first.started_at).total_seconds()) < 1e-3
    assert count(repo, select(func.count()).select_from(Trace)) == 2
    # Within one batch too.
    twin = make_trace()
    clash = dataclasses.replace(twin, app_name="another-app")
    assert repo.write_traces([twin, clash]) == WriteResult(stored=1, conflicts=(twin.trace_id,))


def test_claim_finish_and_same_score_twice_leaves_one_row(repo: Repository) -> None:
    trace = make_trace(reference_contexts=["Paris."], reference_context_ids=["doc_1"])
    repo.write_traces([trace])
    jobs = repo.claim_jobs("w1", limit=100, lease=timedelta(minutes=5))
    assert len(jobs) == len(CATALOG)
    assert repo.claim_jobs("w2", limit=100, lease=timedelta(minutes=5)) == []

    job = next(j for j in jobs if j.metric == "id_based_context_recall")
    assert repo.finish_job(job, ScoreValue(metric=job.metric)) is True
    assert repo.finish_job(job, ScoreValue(metric=job.metric, value=0.1)) is False
    with repo.engine.connect() as conn:
        rows = conn.execute(select(Score.value, Score.app_name)).all()
    assert rows == [(0.75, trace.app_name)]
    assert job_statuses(repo, trace.trace_id)[job.metric] == JobStatus.DONE


def test_one_batch_mixes_new_duplicate_and_replaced_skipped_scores(repo: Repository) -> None:
    repo.write_traces([make_trace() for _ in range(3)])
    jobs = repo.claim_jobs(
        "w", limit=100, lease=timedelta(minutes=5), metrics=["llm_context_recall"]
    )
    first, second, third = sorted(jobs, key=lambda j: j.id)
    assert repo.finish_jobs(
        [(first, ScoreValue(first.metric)), (second, ScoreValue(second.metric, None, "skipped"))]
    ) == [True, True]
    # first: already scored (kept); second: skipped, now scored (replaced); third: new.
    written = repo.finish_jobs(
        [
            (first, ScoreValue(first.metric, 0.1)),
            (second, ScoreValue(second.metric, 0.2)),
            (third, ScoreValue(third.metric, 0.3)),
        ]
    )
    assert written == [False, True, True]
    with repo.engine.connect() as conn:
        values = dict(
            conn.execute(
                select(Score.trace_id, Score.value).where(Score.metric == first.metric)
            ).all()
        )
    assert values == {first.trace_id: 0.75, second.trace_id: 0.2, third.trace_id: 0.3}


def test_a_retried_failed_job_replaces_its_failed_result(repo: Repository) -> None:
    """`jobs retry` must lead somewhere: the job's next result replaces the failure it stored,
    while a scored result stays final and a second identical failure changes nothing."""
    repo.write_traces([make_trace() for _ in range(2)])
    lease = timedelta(minutes=5)
    retried, scored = sorted(
        repo.claim_jobs("w", limit=100, lease=lease, metrics=["llm_context_recall"]),
        key=lambda j: j.id,
    )
    broken = ScoreValue(retried.metric, None, "failed", reason="The judge answered nonsense.")
    assert repo.finish_jobs([(retried, broken), (scored, ScoreValue(scored.metric))]) == [
        True,
        True,
    ]
    assert repo.finish_job(retried, broken) is False  # the same failure twice: stored once

    assert repo.retry_jobs() == 1
    (again,) = repo.claim_jobs("w", limit=100, lease=lease, metrics=["llm_context_recall"])
    assert again.id == retried.id
    assert repo.finish_job(again, ScoreValue(again.metric, 0.4, reason="Now it answered.")) is True
    # A scored result is final, whatever comes later for the same (trace, metric, version).
    assert repo.finish_job(scored, broken) is False
    with repo.engine.connect() as conn:
        rows = dict(
            (trace_id, (status, value, reason))
            for trace_id, status, value, reason in conn.execute(
                select(Score.trace_id, Score.status, Score.value, Score.reason)
            )
        )
    assert rows == {
        retried.trace_id: ("scored", 0.4, "Now it answered."),
        scored.trace_id: ("scored", 0.75, "Three of four claims are supported."),
    }
    assert job_statuses(repo, retried.trace_id)[retried.metric] == JobStatus.DONE


def test_a_retried_job_that_fails_again_stores_its_new_reason(repo: Repository) -> None:
    repo.write_traces([make_trace() for _ in range(2)])
    lease = timedelta(minutes=5)
    jobs = repo.claim_jobs("w", limit=100, lease=lease, metrics=["llm_context_recall"])
    first = ScoreValue("llm_context_recall", None, "failed", reason="The judge refused the key.")
    assert repo.finish_jobs([(job, first) for job in jobs]) == [True, True]
    kept, retried = sorted(jobs, key=lambda j: j.id)

    assert repo.retry_jobs(job_ids=[retried.id]) == 1
    with repo.engine.connect() as conn:
        # the retried job's failure is gone until it runs again; the other one stays
        assert conn.execute(select(Score.trace_id)).scalars().all() == [kept.trace_id]
    (again,) = repo.claim_jobs("w", limit=100, lease=lease, metrics=["llm_context_recall"])
    second = ScoreValue("llm_context_recall", None, "failed", reason="The judge timed out.")
    assert repo.finish_job(again, second) is True
    assert repo.finish_job(again, second) is False  # finished twice: stored once
    with repo.engine.connect() as conn:
        reasons = dict(conn.execute(select(Score.trace_id, Score.reason)).all())
    assert reasons == {
        kept.trace_id: "The judge refused the key.",
        retried.trace_id: "The judge timed out.",
    }
    assert repo.retry_jobs() == 2  # both failed jobs; their results are cleared
    with repo.engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(Score)) == 0


def test_retrying_more_failed_jobs_than_one_delete_takes_clears_every_failure(
    repo: Repository,
) -> None:
    narrow = make_repository(repo.engine, metrics=["llm_context_recall"])
    narrow.write_traces([make_trace(contexts=1, context_chars=20) for _ in range(1203)])
    jobs = narrow.claim_jobs("w", limit=2000, lease=timedelta(minutes=5))
    failure = ScoreValue("llm_context_recall", None, "failed", reason="No judge.")
    assert sum(narrow.finish_jobs([(job, failure) for job in jobs])) == 1203
    assert narrow.retry_jobs() == 1203
    with repo.engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(Score)) == 0
    assert len(narrow.claim_jobs("w", limit=2000, lease=timedelta(minutes=5))) == 1203


def test_expired_lease_comes_back_to_another_worker(repo: Repository) -> None:
    repo.write_traces([make_trace() for _ in range(3)])
    crashed = repo.claim_jobs("crashed", limit=5, lease=timedelta(milliseconds=200))
    assert len(crashed) == 5
    assert repo.requeue_expired_leases() == 0  # still leased
    time.sleep(0.5)
    assert repo.requeue_expired_leases() == 5
    taken = repo.claim_jobs("survivor", limit=100, lease=timedelta(minutes=5))
    assert {j.id for j in crashed} <= {j.id for j in taken}


def test_extend_lease_keeps_a_long_job(repo: Repository) -> None:
    repo.write_traces([make_trace()])
    jobs = repo.claim_jobs("slow", limit=1, lease=timedelta(milliseconds=300))
    assert repo.extend_leases("slow", [j.id for j in jobs], timedelta(minutes=5)) == 1
    assert repo.extend_leases("someone-else", [j.id for j in jobs], timedelta(minutes=5)) == 0
    time.sleep(0.4)
    assert repo.requeue_expired_leases() == 0


def test_release_gives_jobs_back(repo: Repository) -> None:
    repo.write_traces([make_trace()])
    jobs = repo.claim_jobs("w", limit=2, lease=timedelta(minutes=5))
    assert repo.release_jobs("w", [j.id for j in jobs]) == 2
    again = repo.claim_jobs("w2", limit=10, lease=timedelta(minutes=5))
    assert {j.id for j in jobs} <= {j.id for j in again}


def test_reschedule_consumes_attempts_until_failed(repo: Repository) -> None:
    repo = make_repository(repo.engine, metrics=["id_based_context_recall"], max_attempts=2)
    repo.write_traces([make_trace(reference_context_ids=["doc_1"])])
    (job,) = repo.claim_jobs("w", limit=1, lease=timedelta(minutes=1))
    status = repo.reschedule_job(job, delay=timedelta(0), error="bad answer", consume_attempt=True)
    assert status == JobStatus.QUEUED
    (job,) = repo.claim_jobs("w", limit=1, lease=timedelta(minutes=1))
    assert job.attempts == 1
    status = repo.reschedule_job(job, delay=timedelta(0), error="bad again", consume_attempt=True)
    assert status == JobStatus.FAILED
    with repo.engine.connect() as conn:
        assert conn.execute(select(ScoringJob.status, ScoringJob.last_error)).one() == (
            JobStatus.FAILED,
            "bad again",
        )
    assert repo.retry_jobs() == 1
    (job,) = repo.claim_jobs("w", limit=1, lease=timedelta(minutes=1))
    assert job.attempts == 0


def test_transient_reschedule_keeps_attempts_and_respects_backoff(repo: Repository) -> None:
    repo = make_repository(repo.engine, metrics=["id_based_context_recall"])
    repo.write_traces([make_trace(reference_context_ids=["doc_1"])])
    (job,) = repo.claim_jobs("w", limit=1, lease=timedelta(minutes=1))
    repo.reschedule_job(job, delay=timedelta(seconds=60), error="429", consume_attempt=False)
    assert repo.claim_jobs("w", limit=1, lease=timedelta(minutes=1)) == []
    stats = repo.queue_stats()
    assert (stats.due, stats.running) == (1, 0)
    assert stats.oldest_due_age_s is None  # not due yet
    with repo.engine.connect() as conn:
        attempts, first = conn.execute(
            select(ScoringJob.attempts, ScoringJob.first_transient_at)
        ).one()
    assert attempts == 0 and first is not None


def test_late_reference_creates_waiting_jobs(repo: Repository) -> None:
    trace = make_trace(reference=None)
    repo.write_traces([trace])
    claimed = {j.metric for j in repo.claim_jobs("w", limit=100, lease=timedelta(minutes=5))}
    assert claimed == {k for k, v in CATALOG.items() if not v.needs_reference}

    released = repo.attach_reference(
        ReferenceUpdate(trace.trace_id, reference="Paris is the capital of France.")
    )
    assert released == 3  # llm, entity and judge recall needed only the reference text
    released = repo.attach_reference(
        ReferenceUpdate(
            trace.trace_id, reference_contexts=["Paris..."], reference_context_ids=["doc_2"]
        )
    )
    assert released == 2
    later = {j.metric for j in repo.claim_jobs("w", limit=100, lease=timedelta(minutes=5))}
    assert later == {k for k, v in CATALOG.items() if v.needs_reference}
    inputs = repo.load_inputs([trace.trace_id])[trace.trace_id]
    assert inputs.reference_context_ids == ["doc_2"]


def test_unknown_trace_reference_is_an_error(repo: Repository) -> None:
    with pytest.raises(TraceNotFound, match="no trace is stored"):
        repo.attach_reference(ReferenceUpdate("0" * 32, reference="x"))


def test_reference_ttl_skips_then_a_late_reference_still_scores(database_url: str) -> None:
    from recalltrace.storage.db import create_engine_from_url

    repo = make_repository(
        create_engine_from_url(database_url),
        metrics=["llm_context_recall"],
        reference_ttl=timedelta(milliseconds=200),
    )
    trace = make_trace(reference=None)
    repo.write_traces([trace])
    assert repo.expire_waiting_jobs() == 0
    time.sleep(0.4)
    assert repo.expire_waiting_jobs() == 1
    with repo.engine.connect() as conn:
        status, value, reason = conn.execute(select(Score.status, Score.value, Score.reason)).one()
    assert (status, value) == ("skipped", None)
    assert "time-to-live" in reason

    assert repo.attach_reference(ReferenceUpdate(trace.trace_id, reference="Paris.")) == 1
    (job,) = repo.claim_jobs("w", limit=5, lease=timedelta(minutes=1))
    assert repo.finish_job(job, ScoreValue(metric=job.metric, value=1.0)) is True
    with repo.engine.connect() as conn:
        assert conn.execute(select(Score.status, Score.value)).all() == [("scored", 1.0)]
    repo.dispose()


def test_backfill_creates_missing_jobs_once(repo: Repository) -> None:
    narrow = make_repository(repo.engine, metrics=["chunk_context_recall"])
    traces = [make_trace() for _ in range(4)]
    narrow.write_traces(traces)
    assert count(repo, select(func.count()).select_from(ScoringJob)) == 4
    created = repo.create_jobs(metrics=["id_based_context_recall", "llm_context_recall"])
    assert created == 8
    assert repo.create_jobs(metrics=["id_based_context_recall"]) == 0
    statuses = job_statuses(repo, traces[0].trace_id)
    # The factory's traces carry a reference text but no reference ids.
    assert statuses["llm_context_recall"] == JobStatus.QUEUED
    assert statuses["id_based_context_recall"] == JobStatus.WAITING


def test_backfill_after_a_version_change_skips_traces_that_have_the_new_version(
    repo: Repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "chunk_context_recall"
    narrow = make_repository(repo.engine, metrics=[key])
    traces = [make_trace() for _ in range(3)]
    narrow.write_traces(traces)  # jobs of version 1
    monkeypatch.setitem(ALL_VARIANTS, key, dataclasses.replace(ALL_VARIANTS[key], version="2"))
    # A worker already on version 2 scores one of the version-1 jobs: the score is version 2.
    (job,) = narrow.claim_jobs("w", limit=1, lease=timedelta(minutes=1))
    assert narrow.finish_job(job, ScoreValue(metric=key, value=0.5, version="2")) is True

    # The deploy that brings version 2 opens its repository with the new catalog.
    upgraded = make_repository(repo.engine)
    assert upgraded.create_jobs(metrics=[key]) == 2
    with repo.engine.connect() as conn:
        new_jobs = conn.execute(
            select(ScoringJob.trace_id).where(ScoringJob.version == "2")
        ).scalars()
        assert sorted(new_jobs) == sorted(t.trace_id for t in traces if t.trace_id != job.trace_id)
    assert repo.create_jobs(metrics=[key]) == 0


def test_nan_score_is_refused(repo: Repository) -> None:
    repo.write_traces([make_trace()])
    job = repo.claim_jobs("w", limit=1, lease=timedelta(minutes=1))[0]
    with pytest.raises(ValueError, match="finite"):
        repo.finish_job(job, ScoreValue(metric=job.metric, value=float("nan")))


@pytest.mark.postgres
def test_eight_concurrent_claimers_take_every_job_exactly_once(pg_repo: Repository) -> None:
    repo = make_repository(pg_repo.engine, metrics=["chunk_context_recall"])
    traces = [make_trace(contexts=1, context_chars=20) for _ in range(5000)]
    for start in range(0, len(traces), 1000):
        repo.write_traces(traces[start : start + 1000])
    assert count(repo, select(func.count()).select_from(ScoringJob)) == 5000

    claimed: dict[str, list[int]] = {f"w{i}": [] for i in range(8)}
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def claimer(name: str) -> None:
        try:
            barrier.wait()
            while True:
                jobs = repo.claim_jobs(name, limit=37, lease=timedelta(minutes=5))
                if not jobs:
                    return
                claimed[name].extend(j.id for j in jobs)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(name,)) for name in claimed]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    every = [job_id for ids in claimed.values() for job_id in ids]
    assert len(every) == 5000
    assert len(set(every)) == 5000
    assert sum(1 for ids in claimed.values() if ids) >= 2  # the work really was shared
    with repo.engine.connect() as conn:
        owners = dict(
            conn.execute(
                select(ScoringJob.locked_by, func.count()).group_by(ScoringJob.locked_by)
            ).all()
        )
    assert owners == {name: len(ids) for name, ids in claimed.items() if ids}
