"""Pooled recall end to end: an application with ``@retrieval(pool=...)`` traced into SQLite and
Postgres, the pool run off the request path, and a real worker scoring ``pooled_context_recall``
through LiteLLM against the scripted judge over HTTP."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from alembic import command
from opentelemetry.sdk.trace import TracerProvider
from sqlalchemy import Engine, delete, func, inspect, select
from sqlalchemy.orm import Session

import recalltrace
from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import (
    alembic_config,
    current_revision,
    head_revision,
    hold_migration_lock,
    upgrade_engine,
)
from recalltrace.storage.models import JobStatus, Judgment, PoolDocument, Score, ScoringJob
from recalltrace.storage.records import ContextRecord, ReferenceUpdate
from recalltrace.tracer import _runtime
from recalltrace.tracer._pool import wait_for_pools
from tests.integration.test_migrations import _diff, empty_postgres_url  # noqa: F401
from tests.integration.test_worker import judge_config, worker_for
from tests.support.factories import make_repository, make_trace
from tests.support.judge_server import JudgeServer, Reply, _items, _tags

METRIC = "pooled_context_recall"

# A corpus whose relevant documents are known: the judge below grades by it.
DOCS = [
    "A refund needs the order number.",
    "Refunds are paid within 14 days of the return.",
    "Refunds go back to the original payment card.",
]
OTHER = ["Our office is in Lyon.", "Shipping is free above 50 euros."]
RELEVANT = set(DOCS)
"""What the judge grades relevant (a test may empty it)."""


def grading_judge(request: dict[str, Any]) -> Reply:
    """Grade 2 the planted relevant documents and 0 the others, with a reason each."""
    user = next(m["content"] for m in request["messages"] if m["role"] == "user")
    docs = _items(_tags(user).get("context", ""))
    return Reply.json(
        {
            "grades": [
                {
                    "id": i,
                    "grade": 2 if doc.strip() in RELEVANT else 0,
                    "reason": "About refunds." if doc.strip() in RELEVANT else "Off topic.",
                }
                for i, doc in enumerate(docs)
            ]
        }
    )


@pytest.fixture
def traced(database_url: str) -> Iterator[str]:
    recalltrace.configure(
        database_url=database_url,
        tracer_provider=TracerProvider(),
        service_name="pool-test",
        sample_rate=1.0,
        flush_interval=0.05,
        retry_backoff=0.05,
        reference_wait=5.0,
        shutdown_timeout=5.0,
    )
    yield database_url
    recalltrace.shutdown(5)


release_pool = threading.Event()
pool_log: list[tuple[str, float]] = []


def deep_search(query: str, k: int = 2) -> list[dict[str, Any]]:
    """The pool: every relevant document and the others, once the test lets it run."""
    assert release_pool.wait(10), "the test never released the pool"
    pool_log.append((query, time.monotonic()))
    ranked = DOCS + OTHER
    return [{"id": f"d{i}", "content": text} for i, text in enumerate(ranked)]


@recalltrace.retrieval(pool=deep_search)
def search(query: str, k: int = 2) -> list[dict[str, Any]]:
    return [{"id": "d0", "content": DOCS[0]}, {"id": "d3", "content": OTHER[0]}]


@recalltrace.rag("refund-bot")
def ask(question: str) -> str:
    search(question)
    return "Within 14 days."


def failing_pool(query: str) -> list[str]:
    raise RuntimeError("the index is down")


@recalltrace.retrieval(pool=failing_pool)
def flaky_search(query: str) -> list[str]:
    return ["Our office is in Lyon."]


@recalltrace.rag("flaky-bot")
def ask_flaky(question: str) -> str:
    flaky_search(question)
    return "Lyon."


def _count(engine: Engine, table: Any, *where: Any) -> int:
    with engine.connect() as conn:
        return int(conn.scalar(select(func.count()).select_from(table).where(*where)) or 0)


def _pooled_jobs_queued(engine: Engine, count: int, timeout: float = 10.0) -> None:
    """Wait until ``count`` pooled-recall jobs are queued: a pool that returns after its
    request's record was taken is attached to the stored trace by the writer's next tries,
    which flush() does not wait for (as for a late reference whose record is not stored yet)."""
    queued = (ScoringJob.metric == METRIC, ScoringJob.status == JobStatus.QUEUED)
    deadline = time.monotonic() + timeout
    while _count(engine, ScoringJob, *queued) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _count(engine, ScoringJob, *queued) == count


def test_pool_runs_after_the_request_and_is_stored_with_its_trace(traced: str) -> None:
    release_pool.clear()
    pool_log.clear()
    started = time.monotonic()
    assert ask("How are refunds paid?") == "Within 14 days."
    returned = time.monotonic()
    assert returned - started < 2.0
    assert pool_log == []  # the pool waits on the event: the request did not
    assert recalltrace.flush(10)  # the record is stored: its pool is attached to the trace
    release_pool.set()
    assert wait_for_pools(10)
    assert recalltrace.flush(10)
    assert len(pool_log) == 1 and pool_log[0][1] > returned
    ledger = recalltrace.ledger()
    assert ledger.pool["calls"] >= 1 and ledger.pool["seconds"] > 0
    engine = create_engine_from_url(traced)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(
                    PoolDocument.position, PoolDocument.context_id, PoolDocument.source
                ).order_by(PoolDocument.position)
            ).all()
        assert [(r.position, r.context_id) for r in rows] == [(i, f"d{i}") for i in range(5)]
        assert {r.source for r in rows} == {"search"}
        assert _count(engine, ScoringJob, ScoringJob.metric == METRIC) == 1
    finally:
        engine.dispose()


def test_a_pool_that_raises_is_counted_not_raised(traced: str) -> None:
    before = dict(recalltrace.ledger().pool)
    assert ask_flaky("Where is the office?") == "Lyon."
    assert wait_for_pools(10)
    assert recalltrace.flush(10)
    after = recalltrace.ledger().pool
    assert after.get("failed", 0) - before.get("failed", 0) == 1
    engine = create_engine_from_url(traced)
    try:
        # No pool stored, so no pooled job: the other variants' jobs are there as usual.
        assert _count(engine, PoolDocument) == 0
        assert _count(engine, ScoringJob, ScoringJob.metric == METRIC) == 0
        assert _count(engine, ScoringJob) > 0
    finally:
        engine.dispose()


def _score_once(url: str, judge: JudgeServer) -> Any:
    worker = worker_for(url, metrics=[METRIC], judge=judge_config(judge))
    return asyncio.run(worker.run(once=True))


def test_worker_scores_pooled_recall_caches_judgments_and_skips(traced: str) -> None:
    release_pool.set()
    ask("How are refunds paid?")
    assert wait_for_pools(10)
    assert recalltrace.flush(10)
    engine = create_engine_from_url(traced)
    try:
        _pooled_jobs_queued(engine, 1)
        with JudgeServer(handler=grading_judge) as judge:
            stats = _score_once(traced, judge)
            assert stats.scored == 1
            # Five distinct documents (the retrieved two are in the pool), five per call.
            assert judge.call_count == 1
            with Session(engine) as session:
                score = session.scalars(select(Score).where(Score.metric == METRIC)).one()
            assert score.status == "scored"
            assert score.value == pytest.approx(1 / 3)
            missed = score.details["missed"]
            assert [(m["pool_rank"], m["id"]) for m in missed] == [(2, "d1"), (3, "d2")]
            assert all(m["reason"] == "About refunds." for m in missed)
            assert score.prompt_tokens and score.prompt_tokens > 0
            assert _count(engine, Judgment) == 5
            # What the judge budget reads: the stored result's tokens count against it.
            repo = make_repository(engine)
            since = datetime.now(timezone.utc) - timedelta(hours=1)
            spent, _ = repo.judge_spend("openai/test-judge", since)
            assert spent == score.prompt_tokens + (score.completion_tokens or 0)

            # The same documents again (another request): every judgment is kept, no call.
            ask("How are refunds paid?")
            assert wait_for_pools(10)
            assert recalltrace.flush(10)
            _pooled_jobs_queued(engine, 1)
            calls = judge.call_count
            assert _score_once(traced, judge).scored == 1
            assert judge.call_count == calls
            with engine.connect() as conn:
                values = conn.scalars(select(Score.value).where(Score.metric == METRIC)).all()
            assert values == [pytest.approx(1 / 3)] * 2

        # A judge that finds nothing relevant: skipped, with the reason.
        RELEVANT_BACKUP = set(RELEVANT)
        try:
            RELEVANT.clear()
            with JudgeServer(handler=grading_judge) as judge:
                ask("A question asked in a new way?")
                assert wait_for_pools(10)
                assert recalltrace.flush(10)
                _pooled_jobs_queued(engine, 1)
                assert _score_once(traced, judge).skipped == 1
                assert judge.call_count == 1
        finally:
            RELEVANT.update(RELEVANT_BACKUP)
        with Session(engine) as session:
            skipped = session.scalars(
                select(Score).where(Score.metric == METRIC, Score.status == "skipped")
            ).one()
        assert "no relevant document" in skipped.reason
    finally:
        engine.dispose()


def _pool_migration_down_and_up(url: str) -> None:
    engine = create_engine_from_url(url)
    try:
        upgrade_engine(engine, "0011")
        assert "pool_documents" not in inspect(engine).get_table_names()
        upgrade_engine(engine, "0012")
        assert {"pool_documents", "judgments"} <= set(inspect(engine).get_table_names())
        cfg = alembic_config(engine)
        with engine.begin() as conn:
            hold_migration_lock(conn, 30)
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0011")
        names = set(inspect(engine).get_table_names())
        assert "pool_documents" not in names and "judgments" not in names
        upgrade_engine(engine)
    finally:
        engine.dispose()
    assert current_revision(url) == head_revision()
    assert _diff(url) == []


@pytest.mark.postgres
def test_pool_migration_up_down_up_on_postgres(empty_postgres_url: str) -> None:  # noqa: F811
    _pool_migration_down_and_up(empty_postgres_url)


def test_pool_migration_up_down_up_on_sqlite(tmp_path: object) -> None:
    _pool_migration_down_and_up(f"sqlite:///{tmp_path}/pool.db")


def test_pooled_jobs_exist_only_for_traces_with_a_pool(database_url: str) -> None:
    repo = make_repository(create_engine_from_url(database_url))
    try:
        plain, pooled, late = make_trace(), make_trace(), make_trace()
        pooled.pool_contexts = [ContextRecord("Refunds take 14 days.", id="d9", score=0.5)]
        pooled.pool_source = "bm25"
        repo.write_traces([plain, pooled, late])
        with repo.engine.connect() as conn:
            metrics = {
                trace.trace_id: set(
                    conn.scalars(
                        select(ScoringJob.metric).where(ScoringJob.trace_id == trace.trace_id)
                    )
                )
                for trace in (plain, pooled, late)
            }
        assert METRIC in metrics[pooled.trace_id]
        assert METRIC not in metrics[plain.trace_id] | metrics[late.trace_id]
        # A pool arriving after its trace creates the job, once, and replaces a pool sent again.
        update = ReferenceUpdate(
            late.trace_id, pool_contexts=[ContextRecord("A.")], pool_source="x"
        )
        assert repo.attach_reference(update) == 1
        assert repo.attach_reference(update) == 0
        inputs = repo.load_inputs([pooled.trace_id, late.trace_id, plain.trace_id])
        assert inputs[pooled.trace_id].pool_contexts == ["Refunds take 14 days."]
        assert inputs[pooled.trace_id].pool_context_ids == ["d9"]
        assert inputs[late.trace_id].pool_contexts == ["A."]
        assert inputs[late.trace_id].pool_context_ids is None
        assert inputs[plain.trace_id].pool_contexts is None
        # A backfill creates pooled jobs only where a pool is stored.
        with repo.engine.begin() as conn:
            conn.execute(delete(ScoringJob).where(ScoringJob.metric == METRIC))
        assert repo.create_jobs(metrics=[METRIC]) == 2
    finally:
        repo.dispose()


entered = threading.Event()
leave = threading.Event()


def email_pool(query: str) -> list[str]:
    entered.set()
    assert leave.wait(10)
    return ["Write to refunds.desk@example.com for a refund.", "Refunds take 14 days."]


@recalltrace.retrieval(pool=email_pool, pool_queue_size=1)
def email_search(query: str) -> list[str]:
    return ["Refunds take 14 days."]


@recalltrace.rag("email-bot")
def ask_waiting(question: str) -> str:
    """A request that ends only once its pool ran: the pool merges into the open request."""
    email_search(question)
    assert entered.wait(10)
    leave.set()
    state = _runtime.current_state()
    assert state is not None
    deadline = time.monotonic() + 10
    while state.pool is None:  # merged into the open request by the pool's thread
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return "14 days."


@pytest.mark.parametrize("storage_process", [False, True], ids=["thread", "process"])
def test_a_pool_merged_into_its_open_request_is_scrubbed(
    sqlite_url: str, storage_process: bool
) -> None:
    recalltrace.configure(
        database_url=sqlite_url,
        storage_process=storage_process,
        tracer_provider=TracerProvider(),
        sample_rate=1.0,
        flush_interval=0.05,
        shutdown_timeout=5.0,
    )
    try:
        entered.clear()
        leave.clear()
        assert ask_waiting("How do I get a refund?") == "14 days."
        assert recalltrace.flush(10)
        engine = create_engine_from_url(sqlite_url)
        try:
            with engine.connect() as conn:
                texts = conn.scalars(
                    select(PoolDocument.content).order_by(PoolDocument.position)
                ).all()
            assert len(texts) == 2
            assert "refunds.desk@example.com" not in texts[0] and "[REDACTED]" in texts[0]
            assert _count(engine, ScoringJob, ScoringJob.metric == METRIC) == 1
        finally:
            engine.dispose()
    finally:
        recalltrace.shutdown(5)


def test_unsampled_requests_get_no_pool_and_a_full_queue_drops(sqlite_url: str) -> None:
    recalltrace.configure(
        database_url=sqlite_url,
        tracer_provider=TracerProvider(),
        sample_rate=0.0,
        flush_interval=0.05,
        shutdown_timeout=5.0,
    )
    try:
        before = dict(recalltrace.ledger().pool)
        entered.clear()
        leave.clear()
        assert ask_flaky("Where is the office?") == "Lyon."
        assert wait_for_pools(5)
        assert recalltrace.ledger().pool == before  # not sampled: no pool queued or run
        recalltrace.configure(
            database_url=sqlite_url,
            tracer_provider=TracerProvider(),
            sample_rate=1.0,
            flush_interval=0.05,
            shutdown_timeout=5.0,
        )

        @recalltrace.rag("queue-bot")
        def ask_quick(question: str) -> str:
            email_search(question)
            return "ok"

        ask_quick("first")  # taken by the pool's thread, which waits
        assert entered.wait(10)
        ask_quick("second")  # waits in the queue (size 1)
        ask_quick("third")  # finds it full: dropped, counted
        after = recalltrace.ledger().pool
        assert after.get("dropped_queue_full", 0) - before.get("dropped_queue_full", 0) == 1
        assert after.get("queued", 0) - before.get("queued", 0) == 2
        leave.set()
        assert wait_for_pools(10)
    finally:
        leave.set()
        recalltrace.shutdown(5)


def slow_pool(query: str) -> list[str]:
    time.sleep(0.3)
    return ["Refunds take 14 days."]


def empty_pool(query: str) -> list[str]:
    return []


@recalltrace.retrieval(pool=slow_pool, pool_timeout=0.1)
def slow_search(query: str) -> list[str]:
    return ["Refunds take 14 days."]


@recalltrace.retrieval(pool=empty_pool)
def empty_search(query: str) -> list[str]:
    return ["Refunds take 14 days."]


@recalltrace.rag("late-bot")
def ask_late(question: str) -> str:
    slow_search(question)
    empty_search(question)
    return "14 days."


def test_a_late_or_empty_pool_is_counted_and_stores_nothing(sqlite_url: str) -> None:
    recalltrace.configure(
        database_url=sqlite_url,
        tracer_provider=TracerProvider(),
        sample_rate=1.0,
        flush_interval=0.05,
        shutdown_timeout=5.0,
    )
    try:
        before = dict(recalltrace.ledger().pool)
        started = time.monotonic()
        assert ask_late("How long do refunds take?") == "14 days."
        assert time.monotonic() - started < 0.25  # the slow pool is not in the request
        assert wait_for_pools(10)
        assert recalltrace.flush(10)
        after = recalltrace.ledger().pool
        assert after.get("timed_out", 0) - before.get("timed_out", 0) == 1
        assert after.get("empty", 0) - before.get("empty", 0) == 1
        assert after.get("calls", 0) - before.get("calls", 0) == 2
        engine = create_engine_from_url(sqlite_url)
        try:
            assert _count(engine, PoolDocument) == 0
            assert _count(engine, ScoringJob, ScoringJob.metric == METRIC) == 0
        finally:
            engine.dispose()
    finally:
        recalltrace.shutdown(5)


def test_bad_pool_options_are_refused_in_one_line() -> None:
    with pytest.raises(TypeError, match="pool must be a callable"):
        recalltrace.retrieval(pool="bm25")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pool_share must be a number from 0 to 1"):
        recalltrace.retrieval(pool=empty_pool, pool_share=1.5)
    with pytest.raises(ValueError, match="pool_concurrency must be a positive integer"):
        recalltrace.retrieval(pool=empty_pool, pool_concurrency=0)
    with pytest.raises(ValueError, match="pool_timeout must be a positive number"):
        recalltrace.retrieval(pool=empty_pool, pool_timeout=-1)
