"""``History.diagnose`` on SQLite and Postgres: planted causes are named and ranked first, and
traffic without a cause names nothing beyond the stated false-discovery rate."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import Engine

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.diagnose import Diagnosis
from recalltrace.storage.diagnose_stats import benjamini_hochberg, welch, wilson
from recalltrace.storage.history import History, UnknownMetric
from recalltrace.storage.migrate import upgrade
from tests.support.diagnose_data import ID_METRIC, LLM_METRIC, WARRANTY, score_all, traffic
from tests.support.factories import make_history, make_repository
from tests.support.postgres import truncate_all

PLANTED = "planted-app"
NULL_REPETITIONS = 40
NULL_TRACES = 160


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engine]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('diagnose') / 'history.db'}"
        upgrade(url)
    else:
        url = request.getfixturevalue("postgres_url")
    engine = create_engine_from_url(url)
    if request.param == "postgres":
        truncate_all(engine)
    repo = make_repository(engine, metrics=[ID_METRIC, LLM_METRIC])
    rng = random.Random(34)
    score_all(repo, traffic(rng, 1200, app=PLANTED, planted=True), rng, planted=True)
    records = []
    for repetition in range(NULL_REPETITIONS):
        records += traffic(rng, NULL_TRACES, app=f"null-{repetition:02d}", planted=False)
    score_all(repo, records, rng, planted=False)
    yield engine
    engine.dispose()


@pytest.fixture
def history(engine: Engine) -> History:
    return make_history(engine)


def since() -> datetime:
    return datetime.now(timezone.utc) - timedelta(days=1)


def test_planted_slices_are_named_and_ranked_first(history: History) -> None:
    found = history.diagnose(metric=ID_METRIC, since=since(), app=PLANTED)
    assert found.scored == 1200
    names = [(s.attribute, s.value) for s in found.slices]
    assert set(names[:2]) == {("tag", "legacy"), ("document.index", "v1-stale")}, names
    # Nothing else is worse than the rest: the planted causes' own mirror images (the other
    # index, the untagged-legacy traffic) are better, and only worse slices are shown.
    assert names[2:] == [], names
    legacy = found.slices[names.index(("tag", "legacy"))]
    assert legacy.significant and legacy.q_value <= 0.05
    assert legacy.interval[1] < 0 < legacy.rest_mean - legacy.mean
    assert legacy.impact == pytest.approx(legacy.count * (legacy.rest_mean - legacy.mean))
    assert legacy.where == (("tag", "legacy"),)
    stale = found.slices[names.index(("document.index", "v1-stale"))]
    assert stale.where is None and len(stale.example_trace_ids) == 3
    # Every trace has a user: the users are the clusters, not slices.
    assert found.clustering.startswith("clustered by user (")
    assert found.skipped_attributes.get("user_id", 0) > 300
    assert found.tested > 5


def test_every_slice_with_all(history: History) -> None:
    found = history.diagnose(
        metric=ID_METRIC, since=since(), app=PLANTED, all_slices=True, limit=100
    )
    assert len(found.slices) == found.tested
    assert {(s.attribute, s.value) for s in found.slices} >= {
        ("document.index", "v2"),
        ("release", "2.4.0"),
    }
    impacts = [s.impact for s in found.slices]
    assert impacts == sorted(impacts, reverse=True)
    better = [s for s in found.slices if s.difference > 0 and s.significant]
    assert {(s.attribute, s.value) for s in better} >= {("document.index", "v2")}


def test_never_retrieved_document_first_and_always_retrieved_never(history: History) -> None:
    found = history.diagnose(metric=ID_METRIC, since=since(), app=PLANTED, limit=50)
    assert found.missed is not None
    first = found.missed[0]
    assert first.reference == "kb-never" and first.kind == "id"
    assert first.retrieved == 0 and first.needed > 150
    assert first.needed_share == pytest.approx(first.needed / found.scored)
    assert first.interval[0] == 0.0 and first.interval[1] < 0.05
    assert len(first.example_trace_ids) == 3
    references = [m.reference for m in found.missed]
    assert "kb-always" not in references
    assert all(m.retrieved < m.needed for m in found.missed)
    missed = [m.missed for m in found.missed]
    assert missed == sorted(missed, reverse=True)
    assert found.missed_total == len(found.missed)
    detail = history.trace(first.example_trace_ids[0])
    assert "kb-never" in (detail.reference_context_ids or [])
    assert "kb-never" not in [c.context_id for c in detail.contexts]


def test_unsupported_claims_from_one_reference(history: History) -> None:
    found = history.diagnose(metric=LLM_METRIC, since=since(), app=PLANTED)
    assert found.claims is not None and found.missed is None
    top = found.claims[0]
    assert top.claim == WARRANTY
    assert top.unsupported_share > 0.8 and top.interval[0] > 0.75
    assert top.reference is not None and top.reference.startswith(WARRANTY)
    assert top.expected_documents and len(top.example_trace_ids) == 3
    # Every other claim is unsupported about once in ten.
    assert all(c.unsupported_share < 0.25 for c in found.claims[1:])


def test_no_cause_names_nothing_beyond_the_stated_rate(history: History) -> None:
    """Over 40 seeded repetitions of traffic without a cause, the repetitions where any slice
    is named stay within what a false-discovery rate of 5% allows (under no cause at all, the
    chance of any discovery is at most q: 2 expected; 5 is its binomial 98th percentile).
    Without the Benjamini-Hochberg step (a raw p < 0.05 per slice, about ten slices each), a
    third of the repetitions would name one."""
    named = 0
    raw = 0
    for repetition in range(NULL_REPETITIONS):
        found = history.diagnose(
            metric=ID_METRIC, since=since(), app=f"null-{repetition:02d}", all_slices=True
        )
        assert found.scored == NULL_TRACES and found.tested >= 3
        named += any(s.significant and s.difference < 0 for s in found.slices)
        raw += any(s.p_value < 0.05 for s in found.slices)
        assert found.missed is not None and "kb-never" not in [m.reference for m in found.missed]
    print(f"repetitions naming a slice: {named} (raw p < 0.05: {raw})")
    assert named <= 5, named
    assert raw > named  # the control is what keeps it down


def test_filters_narrow_and_bad_input_is_refused(history: History) -> None:
    found = history.diagnose(
        metric=ID_METRIC, since=since(), app=PLANTED, where=[("environment", "production")]
    )
    assert 0 < found.scored < 1200
    assert all(s.attribute != "environment" for s in found.slices)
    assert all(s.where and s.where[0] == ("environment", "production") for s in found.slices
               if not s.attribute.startswith("document."))  # fmt: skip
    with pytest.raises(UnknownMetric, match="unknown metric"):
        history.diagnose(metric="no_such_metric", since=since())
    with pytest.raises(ValueError, match="q must lie"):
        history.diagnose(metric=ID_METRIC, since=since(), q=1.5)


def test_an_empty_window_is_an_empty_diagnosis(history: History) -> None:
    long_ago = datetime(2020, 1, 1, tzinfo=timezone.utc)
    found = history.diagnose(metric=ID_METRIC, since=long_ago, until=long_ago + timedelta(days=1))
    assert isinstance(found, Diagnosis)
    assert found.scored == 0 and found.slices == [] and found.mean is None


def test_statistics() -> None:
    # Welch: equal groups give p = 1; the interval of a clear difference excludes zero.
    assert welch((50, 25.0, 25.0), (50, 25.0, 25.0))[2] == pytest.approx(1.0)
    difference, (low, high), p = welch((100, 20.0, 20.0), (100, 80.0, 80.0))
    assert difference == pytest.approx(-0.6) and high < 0 and p < 1e-9
    # Wilson of 0 of 200: from 0 to about 1.9%.
    low, high = wilson(0, 200)
    assert low == 0.0 and high == pytest.approx(0.01884, abs=1e-4)
    # Benjamini-Hochberg: the textbook example (q-values are monotone in the p-values).
    adjusted = benjamini_hochberg([0.01, 0.04, 0.03, 0.2])
    assert adjusted == pytest.approx([0.04, 0.04 * 4 / 3, 0.04 * 4 / 3, 0.2])


def test_missed_reference_contexts_of_the_string_variant(database_url: str) -> None:
    """``non_llm_context_recall``: the reference context never retrieved comes first, one
    always retrieved is never listed, by the real scorer's matches."""
    from recalltrace.scorers.variants.non_llm_context_recall import NonLLMContextRecall
    from recalltrace.storage.records import ContextRecord

    always = "Orders ship within two days from our warehouse in Lyon."
    never = "The warranty lasts two years and covers parts and labour."
    sometimes = "Returns are accepted for thirty days after delivery."
    engine = create_engine_from_url(database_url)
    repo = make_repository(engine, metrics=["non_llm_context_recall"])
    rng = random.Random(5)
    records = []
    for index in range(80):
        record = traffic(rng, 1, app="strings", planted=False)[0]
        record.trace_id = f"{index + 1:032x}"
        record.reference_contexts = [always, never, sometimes]
        shown = [always] + ([sometimes] if index % 2 else [])
        record.retrieved_contexts = [
            ContextRecord(content=text, id=f"c{i}") for i, text in enumerate(shown)
        ]
        records.append(record)
    repo.write_traces(records)
    scorer = NonLLMContextRecall()
    by_id = {r.trace_id: r for r in records}
    jobs = repo.claim_jobs("t", limit=1000, lease=timedelta(minutes=5))
    repo.finish_jobs(
        [
            (
                job,
                scorer.score(
                    reference_contexts=by_id[job.trace_id].reference_contexts,
                    retrieved_contexts=[c.content for c in by_id[job.trace_id].retrieved_contexts],
                ),
            )
            for job in jobs
        ]
    )
    found = make_history(engine).diagnose(metric="non_llm_context_recall", since=since())
    engine.dispose()
    assert found.scored == 80 and found.missed is not None
    assert [(m.reference, m.needed, m.retrieved) for m in found.missed] == [
        (never, 80, 0),
        (sometimes, 80, 40),
    ]
    assert found.missed[0].kind == "context" and len(found.missed[0].example_trace_ids) == 3
