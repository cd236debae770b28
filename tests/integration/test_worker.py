"""The worker in-process, on SQLite and Postgres, against the scripted judge over real HTTP."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from sqlalchemy import func, select, text

from recalltrace.scorers import JudgeConfig
from recalltrace.scorers._judge import LITELLM_HTTP_FLAG
from recalltrace.scorers.telemetry import SCORE_BUCKETS, WorkerTelemetry
from recalltrace.scorers.worker import Worker, WorkerOptions
from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.models import JobStatus, Score, ScoringJob
from recalltrace.storage.records import ReferenceUpdate
from tests.support.clocks import HANG_GUARD_S, wait_until
from tests.support.factories import make_repository, make_trace
from tests.support.judge_server import JudgeServer, Reply


@pytest.fixture
def judge() -> Iterator[JudgeServer]:
    with JudgeServer() as server:
        yield server


def judge_config(server: JudgeServer, **overrides: Any) -> JudgeConfig:
    options: dict[str, Any] = {
        "model": "openai/test-judge",
        "api_base": server.base_url,
        "api_key": "test",
        "timeout_s": 5.0,
        "max_retries": 3,
        "backoff_initial_s": 0.01,
        "backoff_max_s": 0.05,
        "max_retry_wait_s": 2.0,
    }
    options.update(overrides)
    return JudgeConfig(**options)


class Telemetry:
    """Real SDK providers with in-memory readers."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.logs = InMemoryLogRecordExporter()
        self.logger_provider = LoggerProvider()
        self.logger_provider.add_log_record_processor(SimpleLogRecordProcessor(self.logs))
        self.worker = WorkerTelemetry(self.meter_provider, self.logger_provider)

    def points(self, name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        found = []
        for rm in data.resource_metrics if data else []:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == name:
                        found.extend((metric, p) for p in metric.data.data_points)
        return found


def worker_for(url: str, telemetry: Telemetry | None = None, **options: Any) -> Worker:
    defaults: dict[str, Any] = {
        "database_url": url,
        "poll_interval_s": 0.05,
        "retry_backoff_s": 0.01,
        "retry_backoff_max_s": 0.05,
        "maintenance_interval_s": 0.2,
        "listen": False,
    }
    defaults.update(options)
    return Worker(
        WorkerOptions(**defaults),
        repository=make_repository(create_engine_from_url(url)),
        telemetry=(telemetry or Telemetry()).worker,
    )


def full_trace(**overrides: Any) -> Any:
    values: dict[str, Any] = {
        "reference_contexts": ["Paris is the capital and most populous city of France."],
        "reference_context_ids": ["doc_0", "doc_7"],
    }
    values.update(overrides)
    return make_trace(**values)


def scores_by_metric(url: str) -> dict[str, list[tuple[str, float | None]]]:
    engine = create_engine_from_url(url)
    with engine.connect() as conn:
        rows = conn.execute(select(Score.metric, Score.status, Score.value)).all()
    engine.dispose()
    found: dict[str, list[tuple[str, float | None]]] = {}
    for metric, status, value in rows:
        found.setdefault(metric, []).append((status, value))
    return found


def job_counts(url: str) -> dict[str, int]:
    engine = create_engine_from_url(url)
    with engine.connect() as conn:
        rows = conn.execute(
            select(ScoringJob.status, func.count()).group_by(ScoringJob.status)
        ).all()
    engine.dispose()
    return {status: n for status, n in rows}


def test_once_scores_every_variant_with_a_judge(database_url: str, judge: JudgeServer) -> None:
    repo = make_repository(create_engine_from_url(database_url))
    repo.write_traces([full_trace() for _ in range(5)])
    telemetry = Telemetry()
    worker = worker_for(database_url, telemetry, judge=judge_config(judge))
    stats = asyncio.run(worker.run(once=True))
    worker.close()

    assert stats.scored == 30 and stats.failed == 0
    scores = scores_by_metric(database_url)
    assert {k: len(v) for k, v in scores.items()} == {
        "llm_context_recall": 5,
        "non_llm_context_recall": 5,
        "id_based_context_recall": 5,
        "context_entity_recall": 5,
        "chunk_context_recall": 5,
        "judge_context_recall": 5,
    }
    assert scores["id_based_context_recall"][0] == ("scored", 0.5)  # doc_0 found, doc_7 not
    assert job_counts(database_url) == {JobStatus.DONE: 30}
    # One judge call per trace for each of the four LLM variants.
    assert judge.call_count == 20
    repo.dispose()


@pytest.mark.parametrize("litellm_http", [True, False])
def test_the_worker_skips_the_openai_sdk_unless_told_not_to(
    sqlite_url: str, judge: JudgeServer, monkeypatch: pytest.MonkeyPatch, litellm_http: bool
) -> None:
    monkeypatch.delenv(LITELLM_HTTP_FLAG, raising=False)
    repo = make_repository(create_engine_from_url(sqlite_url))
    repo.write_traces([full_trace()])
    worker = worker_for(
        sqlite_url,
        judge=judge_config(judge),
        metrics=["judge_context_recall"],
        litellm_http=litellm_http,
    )
    stats = asyncio.run(worker.run(once=True))
    worker.close()
    assert stats.scored == 1 and judge.call_count == 1
    # the OpenAI SDK marks each request it sends; LiteLLM's own HTTP handler does not
    assert ("x-stainless-lang" in judge.request_headers[0]) is not litellm_http
    repo.dispose()


def test_without_a_judge_only_non_llm_variants_are_claimed(sqlite_url: str) -> None:
    repo = make_repository(create_engine_from_url(sqlite_url))
    repo.write_traces([full_trace() for _ in range(3)])
    worker = worker_for(sqlite_url)
    assert worker.not_configured == [
        "llm_context_recall",
        "context_entity_recall",
        "chunk_context_recall",
        "judge_context_recall",
        "pooled_context_recall",
    ]
    stats = asyncio.run(worker.run(once=True))
    worker.close()
    assert stats.scored == 6
    assert job_counts(sqlite_url) == {JobStatus.DONE: 6, JobStatus.QUEUED: 12}
    repo.dispose()


def test_naming_an_llm_metric_without_a_judge_is_a_clear_error(sqlite_url: str) -> None:
    with pytest.raises(ValueError, match="need\\(s\\) a judge model"):
        worker_for(sqlite_url, metrics=["llm_context_recall"])
    with pytest.raises(KeyError, match="unknown metric 'recall_at_k'"):
        WorkerOptions(metrics=["recall_at_k"])


def test_rate_limit_storm_and_500s_end_in_scores(database_url: str) -> None:
    repo = make_repository(create_engine_from_url(database_url), metrics=["judge_context_recall"])
    repo.write_traces([full_trace() for _ in range(12)])
    with JudgeServer(rate_429=0.5, rate_500=0.2, seed=7) as server:
        telemetry = Telemetry()
        worker = worker_for(
            database_url,
            telemetry,
            metrics=["judge_context_recall"],
            judge=judge_config(server, max_retries=1),
            concurrency=4,
        )
        deadline = time.monotonic() + 60
        total = 0
        # Jobs rescheduled after a transient error become due again within milliseconds here.
        while time.monotonic() < deadline:
            total += asyncio.run(worker.run(once=True)).scored
            if total >= 12:
                break
            time.sleep(0.05)
        worker.close()
    assert total == 12
    counts = job_counts(database_url)
    assert counts == {JobStatus.DONE: 12}
    assert worker.stats.failed == 0
    assert server.call_count > 12  # the storm really happened
    errors = [
        p.attributes.get("error.type")
        for _, p in telemetry.points("gen_ai.client.operation.duration")
    ]
    assert "RateLimitError" in errors
    repo.dispose()


def test_bad_api_key_pauses_instead_of_failing_every_job(database_url: str) -> None:
    repo = make_repository(create_engine_from_url(database_url))
    repo.write_traces([full_trace() for _ in range(10)])
    with JudgeServer(
        handler=lambda _req: Reply.error(401, {"error": {"message": "Incorrect API key"}})
    ) as server:
        telemetry = Telemetry()
        worker = worker_for(database_url, telemetry, judge=judge_config(server), concurrency=2)
        stats = asyncio.run(worker.run(once=True))
        worker.close()
    assert stats.paused == 1
    assert stats.failed == 0
    assert server.call_count <= 2  # no burning through the queue
    counts = job_counts(database_url)
    assert counts.get(JobStatus.FAILED, 0) == 0
    assert counts[JobStatus.DONE] == 20  # the non-LLM variants went on
    assert counts[JobStatus.QUEUED] == 40  # every LLM job is still there to score later
    paused = telemetry.points("rag.judge.paused")
    assert [p.value for _, p in paused] == [1]
    repo.dispose()


def test_invalid_answers_consume_attempts_then_fail_with_reason(sqlite_url: str) -> None:
    repo = make_repository(create_engine_from_url(sqlite_url), metrics=["judge_context_recall"])
    repo.write_traces([full_trace()])
    with JudgeServer(handler=lambda _req: Reply.raw('{"context_recall_score": 7')) as server:
        worker = worker_for(
            sqlite_url,
            metrics=["judge_context_recall"],
            judge=judge_config(server),
            max_attempts=2,
        )
        for _ in range(20):
            asyncio.run(worker.run(once=True))
            if job_counts(sqlite_url).get(JobStatus.FAILED):
                break
            time.sleep(0.05)
        worker.close()
    assert job_counts(sqlite_url) == {JobStatus.FAILED: 1}
    # Two attempts, each one ask plus one re-ask.
    assert server.call_count == 4
    scores = scores_by_metric(sqlite_url)
    assert scores == {"judge_context_recall": [("failed", None)]}
    repo.dispose()


def test_late_reference_is_scored_after_it_arrives(database_url: str) -> None:
    repo = make_repository(
        create_engine_from_url(database_url), metrics=["id_based_context_recall"]
    )
    trace = make_trace(reference=None)
    repo.write_traces([trace])
    worker = worker_for(database_url, metrics=["id_based_context_recall"])
    assert asyncio.run(worker.run(once=True)).scored == 0
    repo.attach_reference(ReferenceUpdate(trace.trace_id, reference_context_ids=["doc_1"]))
    assert asyncio.run(worker.run(once=True)).scored == 1
    worker.close()
    assert scores_by_metric(database_url) == {"id_based_context_recall": [("scored", 1.0)]}
    repo.dispose()


def test_reference_ttl_ends_waiting_jobs_skipped(sqlite_url: str) -> None:
    repo = make_repository(create_engine_from_url(sqlite_url), metrics=["llm_context_recall"])
    repo.write_traces([make_trace(reference=None)])
    telemetry = Telemetry()
    worker = worker_for(
        sqlite_url, telemetry, metrics=["non_llm_context_recall"], reference_ttl_s=0.1
    )
    time.sleep(0.2)
    stats = asyncio.run(worker.run(once=True))
    worker.close()
    assert job_counts(sqlite_url) == {JobStatus.SKIPPED: 1}
    assert scores_by_metric(sqlite_url) == {"llm_context_recall": [("skipped", None)]}
    # The normal skip is counted like any outcome: the exit line, the metric, an event.
    assert stats.skipped == 1
    skipped = [
        p.value
        for _, p in telemetry.points("rag.worker.jobs")
        if p.attributes == {"rag.job.outcome": "skipped", "rag.metric": "llm_context_recall"}
    ]
    assert skipped == [1]
    events = [r.log_record for r in telemetry.logs.get_finished_logs()]
    (event,) = [e for e in events if e.event_name == "gen_ai.evaluation.result"]
    assert event.attributes["rag.score.status"] == "skipped"
    assert event.attributes["gen_ai.evaluation.name"] == "llm_context_recall"
    repo.dispose()


def test_metrics_names_units_attributes_and_events(sqlite_url: str, judge: JudgeServer) -> None:
    repo = make_repository(create_engine_from_url(sqlite_url))
    traces = [full_trace(app_name="faq-bot") for _ in range(3)]
    repo.write_traces(traces)
    telemetry = Telemetry()
    worker = worker_for(sqlite_url, telemetry, judge=judge_config(judge))
    asyncio.run(worker.run(once=True))
    worker.close()

    recall = telemetry.points("rag.context_recall")
    assert recall, "no rag.context_recall points"
    metric, _ = recall[0]
    assert metric.unit == "1"
    by_metric = {p.attributes["rag.metric"]: p for _, p in recall}
    assert set(by_metric) == {
        "llm_context_recall",
        "non_llm_context_recall",
        "id_based_context_recall",
        "context_entity_recall",
        "chunk_context_recall",
        "judge_context_recall",
    }
    id_point = by_metric["id_based_context_recall"]
    assert id_point.attributes["rag.app"] == "faq-bot"
    assert id_point.count == 3 and id_point.sum == pytest.approx(1.5)
    assert tuple(id_point.explicit_bounds) == SCORE_BUCKETS
    assert (
        by_metric["llm_context_recall"].attributes["gen_ai.request.model"] == "test-judge"
    )  # no LiteLLM prefix

    jobs = {
        (p.attributes["rag.job.outcome"], p.attributes["rag.metric"]): p.value
        for _, p in telemetry.points("rag.worker.jobs")
    }
    assert jobs[("scored", "chunk_context_recall")] == 3

    tokens = telemetry.points("gen_ai.client.token.usage")
    assert {m.unit for m, _ in tokens} == {"{token}"}
    types = {p.attributes["gen_ai.token.type"] for _, p in tokens}
    assert types == {"input", "output"}
    assert all(p.attributes["gen_ai.operation.name"] == "chat" for _, p in tokens)
    assert all(p.attributes["gen_ai.request.model"] == "test-judge" for _, p in tokens)
    duration = telemetry.points("gen_ai.client.operation.duration")
    assert {m.unit for m, _ in duration} == {"s"}
    assert sum(p.count for _, p in duration) == judge.call_count

    gauges = {p.attributes.get("rag.job.state") for _, p in telemetry.points("rag.queue.depth")}
    assert gauges == {"due", "running", "waiting", "failed"}
    assert telemetry.points("rag.queue.oldest_due_age")

    events = [r.log_record for r in telemetry.logs.get_finished_logs()]
    evaluations = [e for e in events if e.event_name == "gen_ai.evaluation.result"]
    assert len(evaluations) == 18
    first = evaluations[0]
    assert {t.trace_id for t in traces} == {f"{e.trace_id:032x}" for e in evaluations}
    assert first.attributes is not None
    assert first.attributes["gen_ai.evaluation.name"] in by_metric
    assert isinstance(first.attributes["gen_ai.evaluation.explanation"], str)
    assert 0.0 <= float(first.attributes["gen_ai.evaluation.score.value"]) <= 1.0
    repo.dispose()


def test_stop_gives_running_jobs_back_after_the_grace_period(database_url: str) -> None:
    repo = make_repository(create_engine_from_url(database_url), metrics=["judge_context_recall"])
    repo.write_traces([full_trace() for _ in range(4)])
    # The judge answers after a minute: a worker that waited for its calls (or for their
    # timeout) would only return once they were answered. No answer was sent when it returned,
    # however slow the machine (no clock is read).
    with JudgeServer(latency=60.0) as server:
        worker = worker_for(
            database_url,
            metrics=["judge_context_recall"],
            judge=judge_config(server, timeout_s=120.0),
            grace_period_s=0.3,
        )
        timer = threading.Timer(1.0, worker.request_stop)
        timer.start()
        stats = asyncio.run(worker.run())
        answered = server.answered
        worker.close()
    assert answered == 0
    assert stats.released == 4
    assert job_counts(database_url) == {JobStatus.QUEUED: 4}
    repo.dispose()


def test_queue_gauges_are_the_databases_by_variant_including_unserved_ones(
    sqlite_url: str,
) -> None:
    """Every worker reports the same figures (aggregate with max, not sum), labelled by
    variant, so that jobs of a variant no worker runs are visible."""
    repo = make_repository(create_engine_from_url(sqlite_url))
    repo.write_traces([full_trace() for _ in range(2)])
    telemetry = Telemetry()
    worker = worker_for(sqlite_url, telemetry)  # no judge: the LLM variants stay queued
    asyncio.run(worker.run(once=True))
    worker.close()
    due = {
        p.attributes["rag.metric"]: p.value
        for _, p in telemetry.points("rag.queue.depth")
        if p.attributes["rag.job.state"] == "due"
    }
    assert due == {
        "llm_context_recall": 2,
        "context_entity_recall": 2,
        "chunk_context_recall": 2,
        "judge_context_recall": 2,
        "non_llm_context_recall": 0,
        "id_based_context_recall": 0,
        "pooled_context_recall": 0,  # no trace has a pool, so no job
    }
    ages = {
        p.attributes["rag.metric"]: p.value for _, p in telemetry.points("rag.queue.oldest_due_age")
    }
    assert ages["non_llm_context_recall"] == 0.0 and ages["llm_context_recall"] > 0.0
    repo.dispose()


def test_malformed_stored_inputs_fail_at_once_with_the_reason(sqlite_url: str) -> None:
    repo = make_repository(create_engine_from_url(sqlite_url), metrics=["non_llm_context_recall"])
    trace = full_trace()
    trace.reference_contexts = ["Paris is the capital.", 42]  # type: ignore[list-item]
    repo.write_traces([trace])
    worker = worker_for(sqlite_url, metrics=["non_llm_context_recall"], max_attempts=3)
    stats = asyncio.run(worker.run(once=True))
    worker.close()
    assert (stats.failed, stats.retried) == (1, 0)
    engine = create_engine_from_url(sqlite_url)
    with engine.connect() as conn:
        status, reason = conn.execute(select(Score.status, Score.reason)).one()
    engine.dispose()
    assert status == "failed"
    assert "reference_contexts[1]" in reason
    repo.dispose()


def test_a_job_longer_than_its_lease_keeps_it(database_url: str) -> None:
    repo = make_repository(create_engine_from_url(database_url), metrics=["judge_context_recall"])
    repo.write_traces([full_trace()])
    sweeps: list[int] = []
    # The call outlasts its lease four times over; the lease is extended every third of it
    # (a second here, so a loaded machine does not let it lapse between two extensions).
    with JudgeServer(latency=12.0) as server:
        worker = worker_for(
            database_url,
            metrics=["judge_context_recall"],
            judge=judge_config(server, timeout_s=60.0),
            lease_s=3.0,
        )
        stop = threading.Event()

        def sweep() -> None:  # another worker's maintenance, looking for dead leases
            while not stop.is_set():
                sweeps.append(repo.requeue_expired_leases())
                time.sleep(0.1)

        sweeper = threading.Thread(target=sweep)
        sweeper.start()
        try:
            stats = asyncio.run(worker.run(once=True))
        finally:
            stop.set()
            sweeper.join()
            worker.close()
    assert stats.scored == 1
    assert len(sweeps) >= 10 and sum(sweeps) == 0  # the lease was never found expired
    assert server.call_count == 1
    repo.dispose()


@pytest.mark.postgres
def test_an_idle_worker_wakes_on_notify_not_on_its_poll_interval(pg_engine: Any) -> None:
    repo = make_repository(pg_engine, metrics=["id_based_context_recall"])
    url = pg_engine.url.render_as_string(hide_password=False)
    # Its poll interval is an hour: only the NOTIFY can wake it within a test.
    worker = worker_for(
        url, metrics=["id_based_context_recall"], poll_interval_s=3600.0, listen=True
    )
    runner = threading.Thread(target=lambda: asyncio.run(worker.run()))
    runner.start()
    try:
        # Idle: nothing to claim, and its LISTEN is in place (a notify before it is missed).
        wait_until(lambda: listening(pg_engine), "the worker never listened")
        repo.write_traces([full_trace() for _ in range(3)])
        wait_until(
            lambda: len(scores_by_metric(url).get("id_based_context_recall", [])) == 3,
            "the worker slept through the NOTIFY",
        )
    finally:
        worker.request_stop()
        runner.join(HANG_GUARD_S)
        worker.close()
    assert len(scores_by_metric(url)["id_based_context_recall"]) == 3


def listening(engine: Any) -> bool:
    """Whether a session of this database is listening for new jobs."""
    with engine.connect() as conn:
        count = conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND query ILIKE 'LISTEN%'"
            )
        ).scalar_one()
    return int(count) > 0


def test_once_does_not_wait_a_poll_interval_after_its_last_job(sqlite_url: str) -> None:
    """A job that finished between the loop's look at the state and its wait used to be a
    lost wake-up: the run idled a whole poll interval before ending (an hour here)."""
    repo = make_repository(create_engine_from_url(sqlite_url), metrics=["id_based_context_recall"])
    repo.write_traces([make_trace(reference_context_ids=["doc_0"]) for _ in range(5)])
    worker = worker_for(sqlite_url, metrics=["id_based_context_recall"], poll_interval_s=3600)

    async def bounded() -> Any:
        return await asyncio.wait_for(worker.run(once=True), timeout=60)

    stats = asyncio.run(bounded())
    worker.close()
    assert stats.scored == 5
    repo.dispose()


def test_once_leaves_the_queue_gauges_of_the_queue_it_leaves(sqlite_url: str) -> None:
    repo = make_repository(create_engine_from_url(sqlite_url), metrics=["id_based_context_recall"])
    repo.write_traces([make_trace(reference_context_ids=["doc_0"]) for _ in range(4)])
    telemetry = Telemetry()
    worker = worker_for(sqlite_url, telemetry, metrics=["id_based_context_recall"])
    asyncio.run(worker.run(once=True))
    worker.close()
    depth = {
        p.attributes["rag.job.state"]: p.value
        for _, p in telemetry.points("rag.queue.depth")
        if p.attributes["rag.metric"] == "id_based_context_recall"
    }
    assert depth["due"] == 0  # the run emptied the queue; it found 4 due
    repo.dispose()


def test_a_long_running_worker_says_what_it_does(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    import logging
    import threading

    repo = make_repository(create_engine_from_url(sqlite_url), metrics=["id_based_context_recall"])
    repo.write_traces([make_trace(reference_context_ids=["doc_0"]) for _ in range(3)])
    worker = worker_for(
        sqlite_url,
        metrics=["id_based_context_recall"],
        maintenance_interval_s=0.05,
        status_interval_s=0.1,
    )
    with caplog.at_level(logging.INFO, logger="recalltrace.scorers.worker"):
        thread = threading.Thread(target=lambda: asyncio.run(worker.run()), daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not any("status: scored 3" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
            time.sleep(0.05)
        worker.request_stop()
        thread.join(30)
    worker.close()
    line = next(r.getMessage() for r in caplog.records if "status: scored 3" in r.getMessage())
    assert "queue 0 due" in line and "lag -" in line
    repo.dispose()
