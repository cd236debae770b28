"""History queries on real databases (SQLite and Postgres), seeded through the repository."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import Engine, func, insert, literal, select

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.history import History, SummaryRow, TraceNotFound, UnknownMetric
from recalltrace.storage.models import JobStatus, Score
from recalltrace.storage.records import TraceRecord
from recalltrace.storage.repository import Repository
from tests.support.factories import make_history, make_repository, make_trace
from tests.support.postgres import truncate_all

METRICS = ("llm_context_recall", "id_based_context_recall", "chunk_context_recall")
T0 = datetime(2026, 11, 10, tzinfo=timezone.utc)


@dataclass(frozen=True)
class Result:
    """A scorer result as the repository takes it."""

    metric: str
    value: float | None
    status: str = "scored"
    reason: str = "Some of the reference is supported by the retrieved contexts."
    details: Mapping[str, Any] = field(default_factory=dict)
    model: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None
    latency_ms: float | None = None
    version: str = "1"


def scored(metric: str, value: float, **kwargs: Any) -> Result:
    return Result(metric=metric, value=value, **kwargs)


def skipped(metric: str) -> Result:
    return Result(metric=metric, value=None, status="skipped", reason="No reference was given.")


def failed(metric: str) -> Result:
    return Result(metric=metric, value=None, status="failed", reason="The judge gave no answer.")


def trace_at(started_at: datetime, app: str = "support-bot") -> TraceRecord:
    return make_trace(started_at=started_at, app_name=app, reference_context_ids=["doc_0", "doc_9"])


def seed(repo: Repository, plan: list[tuple[TraceRecord, list[Result]]]) -> None:
    """Store the traces, then score each planned (trace, metric) the way a worker does."""
    repo.write_traces([t for t, _ in plan])
    wanted = {(t.trace_id, r.metric): r for t, results in plan for r in results}
    jobs = repo.claim_jobs("seed", limit=100_000, lease=timedelta(minutes=5))
    unplanned = []
    for job in jobs:
        result = wanted.pop((job.trace_id, job.metric), None)
        if result is None:
            unplanned.append(job.id)
        else:
            repo.finish_job(job, result)
    repo.release_jobs("seed", unplanned)
    assert not wanted, f"jobs were not claimable for {sorted(wanted)}"


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = create_engine_from_url(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def repo(engine: Engine) -> Repository:
    return make_repository(engine, metrics=METRICS)


@pytest.fixture
def history(engine: Engine) -> History:
    return make_history(engine)


def test_daily_summary_counts_means_and_percentiles(repo: Repository, history: History) -> None:
    day1 = [0.0, 0.25, 0.5, 1.0]
    plan = [
        (
            trace_at(T0 + timedelta(hours=i + 1)),
            [scored("llm_context_recall", v)]
            + ([scored("id_based_context_recall", 1.0)] if i < 2 else []),
        )
        for i, v in enumerate(day1)
    ]
    plan.append((trace_at(T0 + timedelta(hours=6)), [skipped("llm_context_recall")]))
    plan.append((trace_at(T0 + timedelta(hours=7)), [failed("llm_context_recall")]))
    plan.append((trace_at(T0 + timedelta(days=1, hours=5)), [scored("llm_context_recall", 0.8)]))
    seed(repo, plan)

    rows = history.summary(bucket="day", since=T0 - timedelta(days=1))

    assert [(r.bucket_start, r.metric) for r in rows] == [
        (T0, "id_based_context_recall"),
        (T0, "llm_context_recall"),
        (T0 + timedelta(days=1), "llm_context_recall"),
    ]
    ids, llm, llm2 = rows
    assert (ids.count, ids.mean, ids.p10, ids.p50, ids.p90) == (2, 1.0, 1.0, 1.0, 1.0)
    assert (llm.count, llm.skipped, llm.failed) == (4, 1, 1)
    # percentile_cont interpolates linearly between ranks: position p * (n - 1).
    assert llm.mean == pytest.approx(0.4375)
    assert llm.p10 == pytest.approx(0.0 + 0.3 * 0.25)
    assert llm.p50 == pytest.approx(0.25 + 0.5 * 0.25)
    assert llm.p90 == pytest.approx(0.5 + 0.7 * 0.5)
    assert (llm2.count, llm2.mean, llm2.p10, llm2.p90, llm2.skipped) == (1, 0.8, 0.8, 0.8, 0)
    assert all(r.bucket_start.tzinfo is not None for r in rows)


def test_a_bucket_with_only_skipped_results_has_no_statistics(
    repo: Repository, history: History
) -> None:
    seed(repo, [(trace_at(T0 + timedelta(hours=3)), [skipped("llm_context_recall")])])
    (row,) = history.summary(since=T0)
    assert row == SummaryRow(
        bucket_start=T0,
        metric="llm_context_recall",
        version="1",
        count=0,
        mean=None,
        p10=None,
        p50=None,
        p90=None,
        skipped=1,
        failed=0,
    )


def test_hour_buckets_split_exactly_at_the_hour(repo: Repository, history: History) -> None:
    ten = T0 + timedelta(hours=10)
    seed(
        repo,
        [
            (
                trace_at(ten + timedelta(minutes=59, seconds=59)),
                [scored("llm_context_recall", 0.2)],
            ),
            (trace_at(ten + timedelta(hours=1)), [scored("llm_context_recall", 0.6)]),
            (trace_at(ten + timedelta(hours=1, minutes=30)), [scored("llm_context_recall", 0.8)]),
        ],
    )
    rows = history.summary(bucket="hour", since=T0, metric="llm_context_recall")
    assert [(r.bucket_start, r.count, r.mean) for r in rows] == [
        (ten, 1, pytest.approx(0.2)),
        (ten + timedelta(hours=1), 2, pytest.approx(0.7)),
    ]


def test_since_is_inclusive_and_until_exclusive(repo: Repository, history: History) -> None:
    since, until = T0 + timedelta(hours=1), T0 + timedelta(hours=2)
    seed(
        repo,
        [
            (trace_at(since - timedelta(microseconds=1)), [scored("llm_context_recall", 0.1)]),
            (trace_at(since), [scored("llm_context_recall", 0.3)]),
            (trace_at(until - timedelta(microseconds=1)), [scored("llm_context_recall", 0.5)]),
            (trace_at(until), [scored("llm_context_recall", 0.9)]),
        ],
    )
    stats = history.window(metric="llm_context_recall", since=since, until=until)
    assert (stats.count, stats.mean) == (2, pytest.approx(0.4))
    (row,) = history.summary(since=since, until=until)
    assert (row.count, row.mean) == (2, pytest.approx(0.4))
    worst = history.worst(metric="llm_context_recall", since=since, until=until)
    assert [w.value for w in worst] == [0.3, 0.5]
    with pytest.raises(ValueError, match="before"):
        history.summary(since=until, until=since)


def test_app_and_metric_filters_and_hostile_values(repo: Repository, history: History) -> None:
    seed(
        repo,
        [
            (trace_at(T0 + timedelta(hours=1), app="alpha"), [scored("llm_context_recall", 0.2)]),
            (
                trace_at(T0 + timedelta(hours=2), app="beta"),
                [scored("llm_context_recall", 0.9), scored("id_based_context_recall", 0.5)],
            ),
        ],
    )
    assert [(r.metric, r.count) for r in history.summary(since=T0, app="alpha")] == [
        ("llm_context_recall", 1)
    ]
    assert [r.metric for r in history.summary(since=T0, metric="id_based_context_recall")] == [
        "id_based_context_recall"
    ]
    hostile = "alpha' OR '1'='1"
    assert history.summary(since=T0, app=hostile) == []
    assert history.worst(app=hostile) == []
    assert history.window(metric="llm_context_recall", app=hostile).count == 0
    assert history.problem_jobs(app=hostile) == []
    with history.engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(Score)) == 3
    for call in (
        lambda: history.summary(metric="recall'; DROP TABLE scores; --"),
        lambda: history.worst(metric="nope"),
        lambda: history.window(metric="nope"),
    ):
        with pytest.raises(UnknownMetric, match="known metrics: chunk_context_recall"):
            call()


def test_filters_with_characters_stored_text_never_holds_are_refused(
    repo: Repository, history: History
) -> None:
    seed(repo, [(trace_at(T0 + timedelta(hours=1), app="alpha"), [scored(METRICS[0], 0.5)])])
    calls = {
        "summary": lambda v: history.summary(since=T0, app=v),
        "worst": lambda v: history.worst(app=v),
        "window": lambda v: history.window(metric=METRICS[0], app=v),
        "problem_jobs": lambda v: history.problem_jobs(app=v),
        "trace": lambda v: history.trace(v),
    }
    cases = {"al\x00pha": "a NUL character", "al\udcffpha": "the byte 0xff", "\ud800": r"U\+D800"}
    for name, call in calls.items():
        for value, what in cases.items():
            with pytest.raises(ValueError, match=what) as caught:
                call(value)
            assert "nothing could match" in str(caught.value), name
    assert [r.count for r in history.summary(since=T0, app="alpha")] == [1]


def test_worst_lists_lowest_scored_results_first(repo: Repository, history: History) -> None:
    plan = [
        (
            trace_at(T0 + timedelta(minutes=i)),
            [
                scored("llm_context_recall", v, reason=f"llm reason {v}"),
                scored("id_based_context_recall", min(1.0, v + 0.05)),
            ],
        )
        for i, v in enumerate([0.9, 0.1, 0.5, 0.0, 0.7])
    ]
    plan.append((trace_at(T0 + timedelta(minutes=9)), [failed("llm_context_recall")]))
    seed(repo, plan)

    rows = history.worst(metric="llm_context_recall", limit=3)
    assert [(r.value, r.reason) for r in rows] == [
        (0.0, "llm reason 0.0"),
        (0.1, "llm reason 0.1"),
        (0.5, "llm reason 0.5"),
    ]
    assert rows[0].trace_id == plan[3][0].trace_id
    assert rows[0].trace_started_at == plan[3][0].started_at

    merged = history.worst(limit=4)
    assert [(r.metric, r.value) for r in merged] == [
        ("llm_context_recall", 0.0),
        ("id_based_context_recall", 0.05),
        ("llm_context_recall", 0.1),
        ("id_based_context_recall", pytest.approx(0.15)),
    ]
    with pytest.raises(ValueError):
        history.worst(limit=0)


def _store_old_version(engine: Engine, metric: str, version: str, value: float) -> None:
    """Copy every stored score of ``metric`` as ``version`` with ``value``: the scores an
    earlier version of the variant left behind before a backfill to the current one."""
    columns = [c for c in Score.__table__.c if c.name != "id"]
    source = select(
        *(
            literal(version).label("version")
            if c.name == "version"
            else literal(value).label("value")
            if c.name == "value"
            else c
            for c in columns
        )
    ).where(Score.metric == metric)
    with engine.begin() as conn:
        conn.execute(insert(Score).from_select([c.name for c in columns], source))


def test_history_reads_one_version_of_each_metric(
    repo: Repository, history: History, engine: Engine
) -> None:
    """After a version change and a backfill, old and new scores of the same traces are never
    pooled: every query reads the current catalog version unless asked for another."""
    seed(
        repo,
        [(trace_at(T0 + timedelta(hours=h)), [scored("llm_context_recall", 0.6)]) for h in (1, 2)],
    )
    _store_old_version(engine, "llm_context_recall", "0", 0.1)
    since, until = T0, T0 + timedelta(days=1)

    for _ in range(2):  # on Postgres the second read of the complete day comes from the cache
        (current,) = history.summary(since=since, until=until)
        assert (current.metric, current.version, current.count, current.mean) == (
            "llm_context_recall",
            "1",
            2,
            pytest.approx(0.6),
        )
        (old,) = history.summary(since=since, until=until, metric="llm_context_recall", version="0")
        assert (old.version, old.count, old.mean) == ("0", 2, pytest.approx(0.1))
    assert history.summary(since=since, metric="llm_context_recall", version="7") == []

    stats = history.window(metric="llm_context_recall", since=since, until=until)
    assert (stats.version, stats.count, stats.mean) == ("1", 2, pytest.approx(0.6))
    stats = history.window(metric="llm_context_recall", since=since, until=until, version="0")
    assert (stats.version, stats.count, stats.mean) == ("0", 2, pytest.approx(0.1))

    assert {(w.version, w.value) for w in history.worst()} == {("1", 0.6)}
    assert {(w.version, w.value) for w in history.worst(metric="llm_context_recall")} == {
        ("1", 0.6)
    }
    old_worst = history.worst(metric="llm_context_recall", version="0")
    assert [(w.version, w.value) for w in old_worst] == [("0", 0.1), ("0", 0.1)]

    with pytest.raises(ValueError, match="give the metric as well"):
        history.summary(version="0")
    with pytest.raises(ValueError, match="give the metric as well"):
        history.worst(version="0")
    with pytest.raises(ValueError, match="empty"):
        history.window(metric="llm_context_recall", version=" ")
    with pytest.raises(ValueError, match="NUL"):
        history.summary(metric="llm_context_recall", version="1\x00")


def test_trace_detail_has_everything_stored(repo: Repository, history: History) -> None:
    trace = trace_at(T0)
    claims = {
        "claims": [
            {"statement": "Paris is the capital.", "reason": "Context 0.", "attributed": 1},
            {"statement": "It has 2M people.", "reason": "Not said.", "attributed": 0},
        ]
    }
    seed(
        repo,
        [
            (
                trace,
                [
                    scored("llm_context_recall", 0.5, details=claims, model="judge-1"),
                    scored(
                        "id_based_context_recall",
                        0.5,
                        details={"found_ids": ["doc_0"], "missing_ids": ["doc_9"]},
                    ),
                ],
            )
        ],
    )
    detail = history.trace(trace.trace_id)

    assert detail.user_input == trace.user_input
    assert detail.response == trace.response
    assert detail.reference == trace.reference
    assert detail.reference_context_ids == ["doc_0", "doc_9"]
    assert [c.content for c in detail.contexts] == [c.content for c in trace.retrieved_contexts]
    assert [c.context_id for c in detail.contexts] == ["doc_0", "doc_1", "doc_2"]
    by_metric = {s.metric: s for s in detail.scores}
    assert set(by_metric) == {"llm_context_recall", "id_based_context_recall"}
    assert by_metric["llm_context_recall"].details == claims
    assert by_metric["llm_context_recall"].model == "judge-1"
    assert by_metric["id_based_context_recall"].details["missing_ids"] == ["doc_9"]
    jobs = {j.metric: j.status for j in detail.jobs}
    assert jobs == {
        "llm_context_recall": JobStatus.DONE,
        "id_based_context_recall": JobStatus.DONE,
        "chunk_context_recall": JobStatus.QUEUED,
    }
    assert json.loads(json.dumps(detail.as_dict()))["scores"][0]["metric"] == (
        "id_based_context_recall"
    )

    with pytest.raises(TraceNotFound):
        history.trace("0" * 32)


def test_problem_jobs_finds_failed_and_stuck_jobs(engine: Engine, history: History) -> None:
    repo = make_repository(engine, metrics=["id_based_context_recall"])
    traces = [trace_at(T0 + timedelta(minutes=i), app=f"app{i}") for i in range(4)]
    repo.write_traces(traces)
    jobs = {j.trace_id: j for j in repo.claim_jobs("w", limit=10, lease=timedelta(minutes=5))}
    repo.fail_job(jobs[traces[0].trace_id], "judge said nothing useful")
    repo.finish_job(jobs[traces[1].trace_id], scored("id_based_context_recall", 1.0))
    repo.release_jobs("w", [jobs[traces[3].trace_id].id])
    # traces[2]'s job stays running; its worker "dies" when the lease runs out.
    dead = repo.claim_jobs("dead", limit=1, lease=timedelta(milliseconds=50))
    assert [j.trace_id for j in dead] == [traces[3].trace_id]
    waiting_repo = make_repository(
        engine, metrics=["llm_context_recall"], reference_ttl=timedelta(milliseconds=50)
    )
    no_reference = make_trace(reference=None, started_at=T0, app_name="app9")
    waiting_repo.write_traces([no_reference])
    time.sleep(0.15)

    problems = {(j.trace_id, j.metric): j for j in history.problem_jobs()}
    assert {k: j.problem for k, j in problems.items()} == {
        (traces[0].trace_id, "id_based_context_recall"): "failed",
        (traces[3].trace_id, "id_based_context_recall"): "lease_expired",
        (no_reference.trace_id, "llm_context_recall"): "reference_expired",
    }
    assert problems[(traces[0].trace_id, "id_based_context_recall")].last_error == (
        "judge said nothing useful"
    )
    assert [j.problem for j in history.problem_jobs(app="app0")] == ["failed"]
    assert [j.problem for j in history.problem_jobs(metric="llm_context_recall")] == [
        "reference_expired"
    ]
    assert len(history.problem_jobs(limit=1)) == 1

    # A queued job nobody takes becomes overdue once it has been due for stuck_after.
    # traces[2]'s job is still leased to a live worker: healthy, never listed.
    assert repo.requeue_expired_leases() == 1
    assert traces[2].trace_id not in {j.trace_id for j in history.problem_jobs()}
    assert traces[3].trace_id not in {j.trace_id for j in history.problem_jobs()}
    time.sleep(0.01)
    # No worker that scores the variant was seen: nobody will take it ("unserved"). Once one
    # has reported itself, the job is merely late ("overdue").
    late = history.problem_jobs(stuck_after=timedelta(milliseconds=1))
    assert (traces[3].trace_id, "unserved") in {(j.trace_id, j.problem) for j in late}
    repo.report_worker(
        "w-elsewhere",
        host="other-host",
        pid=1,
        metrics=["id_based_context_recall"],
        started_at=datetime.now(timezone.utc),
    )
    overdue = history.problem_jobs(stuck_after=timedelta(milliseconds=1))
    assert (traces[3].trace_id, "overdue") in {(j.trace_id, j.problem) for j in overdue}


def test_sqlite_and_postgres_give_the_same_summary(sqlite_url: str, postgres_url: str) -> None:
    rng = random.Random(6)
    plan = []
    for _ in range(80):
        started = T0 + timedelta(seconds=rng.uniform(0, 3 * 86400))
        results: list[Result] = []
        for metric in METRICS:
            roll = rng.random()
            if roll < 0.1:
                results.append(skipped(metric))
            elif roll < 0.15:
                results.append(failed(metric))
            else:
                results.append(scored(metric, round(rng.random(), 3)))
        plan.append((trace_at(started, app=rng.choice(["a", "b"])), results))

    summaries: dict[str, list[list[SummaryRow]]] = {}
    for url in (sqlite_url, postgres_url):
        engine = create_engine_from_url(url)
        truncate_all(engine)
        seed(make_repository(engine, metrics=METRICS), plan)
        history = make_history(engine)
        summaries[engine.dialect.name] = [
            history.summary(bucket="day"),
            history.summary(bucket="hour", app="a", since=T0 + timedelta(hours=5)),
            history.summary(bucket="day", metric="chunk_context_recall", until=T0 + timedelta(2)),
        ]
        engine.dispose()

    for lite, pg in zip(summaries["sqlite"], summaries["postgresql"], strict=True):
        assert len(lite) == len(pg) > 0
        for a, b in zip(lite, pg, strict=True):
            assert (a.bucket_start, a.metric, a.count, a.skipped, a.failed) == (
                b.bucket_start,
                b.metric,
                b.count,
                b.skipped,
                b.failed,
            )
            for x, y in ((a.mean, b.mean), (a.p10, b.p10), (a.p50, b.p50), (a.p90, b.p90)):
                assert x == pytest.approx(y, abs=1e-12)


def test_tags_release_and_environment_never_join_the_traces(
    repo: Repository, history: History, engine: Engine
) -> None:
    """Scores carry release and environment, and tags have their own table: grouping and
    filtering by them reads no trace row (joining every score of the window to its trace cost
    most of such a query)."""
    from sqlalchemy import event

    metric = "id_based_context_recall"
    now = datetime.now(timezone.utc)
    plan = []
    for index in range(4):
        trace = trace_at(now - timedelta(hours=index + 1))
        trace.release = "2.4.1" if index % 2 else "2.5.0"
        trace.tags = ["beta"] if index < 2 else []
        plan.append((trace, [scored(metric, index / 4)]))
    seed(repo, plan)
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", seen)
    try:
        by_tag = history.group_summaries(metric=metric, by="tag", where=[("release", "2.5.0")])
        assert {group: sums.count for group, sums in by_tag.items()} == {"beta": 1, None: 1}
        assert history.group_labels(metric=metric, by="tag") == {}
        rows = history.summary(bucket="day", metric=metric, where=[("tag", "beta")])
        assert sum(r.count for r in rows) == 2
        worst = history.worst(metric=metric, where=[("tag", "beta"), ("release", "2.4.1")])
        assert len(worst) == 1
        assert not [s for s in statements if "JOIN traces" in s], statements
        history.group_summaries(metric=metric, by="user_id")
        assert "JOIN traces" in statements[-1] or any("JOIN traces" in s for s in statements)
    finally:
        event.remove(engine, "before_cursor_execute", seen)


def test_worst_per_question_agrees_with_ranking_every_result(
    repo: Repository, history: History
) -> None:
    """One question holds the 70 lowest results, so the first reads find nothing else; the
    answer must still be each question's lowest trace with the count of its scored traces in
    the window, as ranking every result of the window gives (traces without a question and
    with an empty one are one question)."""
    rng = random.Random(5)
    metric = "llm_context_recall"
    plan = []
    questions: list[str | None] = []
    for index in range(150):
        if index < 70:
            question: str | None = "Why is my invoice late?"
            value = round(index / 1000, 3)
        else:
            question = rng.choice([f"Question {index % 9}?", None, "", "Long? " + "x" * 4000])
            value = round(0.1 + rng.random() * 0.9, 3)
        trace = trace_at(T0 + timedelta(minutes=index))
        trace.user_input = question
        questions.append(question)
        plan.append((trace, [scored(metric, value)]))
    # Out of the window: must count for nothing.
    old = trace_at(T0 - timedelta(days=3))
    old.user_input = "Why is my invoice late?"
    plan.append((old, [scored(metric, 0.0)]))
    seed(repo, plan)

    since = T0 - timedelta(hours=1)
    rows = history.worst(metric=metric, limit=4, since=since, per_question=True)

    # The reference: rank every result of the window, keep each question's first.
    window = [
        (result.value, -trace.started_at.timestamp(), trace.trace_id, question or "")
        for (trace, (result,)), question in zip(plan, [*questions, None], strict=True)
        if trace.started_at >= since
    ]
    window.sort()
    first: dict[str, str] = {}
    for *_order, trace_id, question in window:
        first.setdefault(question, trace_id)
    counts = {q: sum(1 for *_rest, other in window if other == q) for q in first}
    assert [(r.trace_id, r.question or "", r.traces_with_question) for r in rows] == [
        (trace_id, q, counts[q]) for q, trace_id in list(first.items())[:4]
    ]
    assert rows[0].question == "Why is my invoice late?" and rows[0].traces_with_question == 70


def test_summary_by_an_attribute_is_each_group_filtered(repo: Repository, history: History) -> None:
    """Split by release, each group's rows equal the summary filtered by it (on Postgres from
    the summary cache), and the traces without a release form their own group, last."""
    metric = "id_based_context_recall"
    now = datetime.now(timezone.utc)
    plan = []
    for index in range(24):
        trace = trace_at(now - timedelta(days=index % 3, hours=index))
        trace.release = [None, "2.4.1", "2.5.0"][index % 3]
        trace.environment = "staging" if index % 4 == 0 else "production"
        plan.append((trace, [scored(metric, (index % 5) / 4)]))
    seed(repo, plan)
    for by in ("release", "environment", "app", "user_id"):
        rows = history.summary(bucket="day", metric=metric, by=by)
        groups = [r.group for r in rows]
        assert all(r.by == by for r in rows)
        assert sum(r.count for r in rows) == 24
        for group in {g for g in groups if g is not None}:
            alone = history.summary(bucket="day", metric=metric, where=[(by, group)])
            assert [replace(r, by=by, group=group) for r in alone] == [
                r for r in rows if r.group == group
            ]
    rows = history.summary(bucket="day", metric=metric, by="release")
    assert sum(r.count for r in rows if r.group is None) == 8
    first_day = [r.group for r in rows if r.bucket_start == rows[0].bucket_start]
    assert first_day == sorted(g for g in first_day if g is not None) + [None] * (None in first_day)
    assert rows[0].as_dict()["release"] == rows[0].group
    with pytest.raises(ValueError, match="unknown attribute"):
        history.summary(by="colour")


def test_small_groups_carry_their_values_in_trace_order(repo: Repository, history: History) -> None:
    """A canary's values (for its bootstrap) are found through the traces' release index; they
    must be exactly its scored values, in trace order, the group without a release too."""
    metric = "id_based_context_recall"
    now = datetime.now(timezone.utc)
    plan = []
    for index in range(9):
        trace = trace_at(now - timedelta(hours=2 + index))
        trace.release = ["2.5.0-canary", None, "2.4.1"][index % 3]
        plan.append((trace, [scored(metric, round(index / 10, 2))]))
    old = trace_at(now - timedelta(days=9))  # before the window
    old.release = "2.5.0-canary"
    plan.append((old, [scored(metric, 1.0)]))
    seed(repo, plan)
    since = now - timedelta(days=1)
    sums = history.group_summaries(metric=metric, by="release", since=since)
    for release in ("2.5.0-canary", None, "2.4.1"):
        expected = tuple(
            result.value
            for trace, (result,) in sorted(plan, key=lambda p: p[0].trace_id)
            if trace.release == release and trace.started_at >= since
        )
        assert sums[release].values == expected, release
        assert sums[release].count == 3
