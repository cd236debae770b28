"""Judge answers stored by request before they are used: the table on both backends, and the
judge client reading them back through LiteLLM against the scripted server."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from recalltrace import scorers
from recalltrace.scorers import JudgeClient
from recalltrace.scorers._cache import JudgeCallScope, judge_call_scope, request_key
from recalltrace.scorers.catalog import judge_tasks
from recalltrace.scorers.worker._answers import StoredAnswers, scope_of
from recalltrace.storage.contracts import ClaimedJob
from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.judge_calls import JudgeCallStore
from tests.support.clocks import HANG_GUARD_S
from tests.support.factories import make_repository
from tests.support.judge_server import JudgeServer, Reply

GOOD = {"context_recall_score": 0.8, "reason": "Fine."}
USAGE = {"prompt_tokens": 120, "completion_tokens": 15, "total_tokens": 135}


@pytest.fixture
def store(database_url: str) -> Iterator[JudgeCallStore]:
    engine = create_engine_from_url(database_url)
    yield JudgeCallStore(engine)
    engine.dispose()


@pytest.fixture(scope="module")
def server() -> Iterator[JudgeServer]:
    with JudgeServer() as running:
        yield running


@pytest.fixture(autouse=True)
def _fresh(server: JudgeServer) -> None:
    server.reset()


def test_the_first_answer_of_a_key_is_kept(store: JudgeCallStore) -> None:
    assert store.keep("k1", "job:1", {"content": "first"}) is True
    assert store.keep("k1", "job:2", {"content": "second"}) is False
    found = store.find("k1")
    assert found is not None
    assert (found.scope, found.answer) == ("job:1", {"content": "first"})
    assert store.find("k2") is None


def test_forget_takes_only_its_scopes_and_purge_only_old_rows(store: JudgeCallStore) -> None:
    old = datetime.now(timezone.utc) - timedelta(days=8)
    store.keep("a", "job:1", {"content": "a"})
    store.keep("b", "job:1", {"content": "b"})
    store.keep("c", "job:2", {"content": "c"})
    store.keep("d", "job:3", {"content": "d"}, now=old)
    assert store.forget(["job:1", "job:9"]) == 2
    assert store.count() == 2 and store.count("job:2") == 1
    assert store.purge(timedelta(days=7)) == 1
    assert store.find("d") is None and store.find("c") is not None


def test_bad_keys_and_scopes_are_refused_in_one_line(store: JudgeCallStore) -> None:
    with pytest.raises(ValueError, match="key is 1 to 64 characters"):
        store.keep("x" * 65, "job:1", {})
    with pytest.raises(ValueError, match="scope is 1 to 200 characters"):
        store.keep("k", "", {})
    with pytest.raises(ValueError, match="must not be negative"):
        store.purge(timedelta(days=-1))


@pytest.mark.postgres
def test_racing_writers_of_one_key_store_it_once(postgres_url: str) -> None:
    engine = create_engine_from_url(postgres_url, pool_size=8)
    store = JudgeCallStore(engine)
    store.forget([f"job:{i}" for i in range(8)])
    barrier = threading.Barrier(8)
    won: list[bool] = []

    def write(index: int) -> None:
        barrier.wait()
        won.append(store.keep("raced", f"job:{index}", {"content": str(index)}))

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert sorted(won) == [False] * 7 + [True]
        found = store.find("raced")
        assert found is not None and found.scope == f"job:{found.answer['content']}"
    finally:
        store.forget([f"job:{i}" for i in range(8)])
        engine.dispose()


# ---------------------------------------------------------------------------------------------
# the judge client reading stored answers back


def judge(server: JudgeServer) -> JudgeClient:
    return JudgeClient(
        model="openai/test-judge",
        api_base=server.base_url,
        api_key="test",
        timeout_s=HANG_GUARD_S,
        max_retries=0,
    )


def answers(store: JudgeCallStore) -> StoredAnswers:
    """The worker's view of the answers, through the repository as the worker has it."""

    async def db_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    return StoredAnswers(make_repository(store.engine), db_call)


def job(job_id: int, trace_id: str = "t1") -> ClaimedJob:
    now = datetime.now(timezone.utc)
    return ClaimedJob(job_id, trace_id, "judge_context_recall", "1", 1, None, now)


INPUTS = {
    "user_input": "What is the capital of France?",
    "response": "Paris.",
    "reference": "Paris is the capital of France.",
    "retrieved_contexts": ["Paris is the capital and largest city of France."],
}


def score_in(scope: JudgeCallScope, scorer: Any) -> Any:
    async def run() -> Any:
        with judge_call_scope(scope):
            return await scorer.ascore(**INPUTS)

    return asyncio.run(run())


def test_a_job_taken_again_reads_its_answers_and_pays_nothing_more(
    server: JudgeServer, store: JudgeCallStore
) -> None:
    stored = answers(store)
    scorer = scorers.get("judge_context_recall", judge=judge(server))
    server.script(Reply.json(GOOD, usage=USAGE))
    first = score_in(stored.scope(job(1)), scorer)
    assert server.call_count == 1 and store.count(scope_of(job(1))) == 1
    # The worker died before the score was stored: the same job, run again, calls nobody and
    # carries the tokens it paid for once.
    again_scope = stored.scope(job(1))
    again = score_in(again_scope, scorer)
    assert server.call_count == 1 and again_scope.replayed == 1
    assert (again.value, again.reason) == (first.value, first.reason)
    assert (again.prompt_tokens, again.completion_tokens) == (120, 15)
    # Another job asking the very same request asks the judge itself: a job reads back only
    # what it paid for.
    server.script(Reply.json(GOOD, usage=USAGE))
    other_scope = stored.scope(job(2))
    other = score_in(other_scope, scorer)
    assert server.call_count == 2 and other_scope.replayed == 0
    assert (other.prompt_tokens, other.completion_tokens) == (120, 15)
    # Once the job's score is stored its answers go; a later run asks the judge again.
    asyncio.run(stored.forget([job(1)]))
    assert store.count(scope_of(job(1))) == 0 and store.count(scope_of(job(2))) == 1
    server.script(Reply.json(GOOD, usage=USAGE))
    score_in(stored.scope(job(1)), scorer)
    assert server.call_count == 3


def test_samples_of_one_request_keep_one_answer_each(
    server: JudgeServer, store: JudgeCallStore
) -> None:
    stored = answers(store)
    scorer = scorers.get("judge_context_recall", judge=judge(server), samples=3)
    server.script(*(Reply.json({**GOOD, "context_recall_score": v}) for v in (0.2, 0.8, 0.6)))
    first = score_in(stored.scope(job(3)), scorer)
    assert server.call_count == 3 and store.count(scope_of(job(3))) == 3
    again = score_in(stored.scope(job(3)), scorer)
    assert server.call_count == 3
    assert again.value == first.value == 0.6  # the median of the three stored answers


def test_the_key_ignores_what_does_not_change_the_answer() -> None:
    params: dict[str, Any] = {
        "model": "openai/m",
        "messages": [{"role": "user", "content": "q"}],
        "temperature": 0.0,
        "response_format": {"type": "json_object"},
        "timeout": 60.0,
        "api_key": "secret",
    }
    same = {**params, "timeout": 5.0, "api_key": "other", "max_retries": 0}
    assert request_key(params) == request_key(same)
    for change in ({"temperature": 0.5}, {"model": "openai/n"}, {"seed": 1}):
        assert request_key({**params, **change}) != request_key(params)
    schema = judge_tasks()["judge_recall"].schema
    assert request_key({**params, "response_format": schema}) != request_key(params)
