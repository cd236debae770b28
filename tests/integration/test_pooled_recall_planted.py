"""``pooled_context_recall`` on a planted corpus, through LiteLLM against the scripted judge over
HTTP: each question's relevant documents are known, the retriever finds about 60% of them, and
the estimate is checked against the planted recall, with the pool holding every relevant
document and with a pool that misses some (the documented upward bias)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from typing import Any

import pytest

from recalltrace import scorers
from recalltrace.scorers.variants.pooled_context_recall import MemoryJudgments
from tests.support.judge_server import JudgeServer, Reply, _items, _tags

QUESTIONS = 20
RELEVANT_PER_QUESTION = 5
DISTRACTORS = 10


def _doc(question: int, index: int, relevant: bool) -> str:
    kind = "fact" if relevant else "aside"
    return f"Topic {question} {kind} {index}: a sentence about subject {question}-{index}."


RELEVANT_TEXTS = {_doc(q, i, True) for q in range(QUESTIONS) for i in range(RELEVANT_PER_QUESTION)}


def planted_judge(request: dict[str, Any]) -> Reply:
    user = next(m["content"] for m in request["messages"] if m["role"] == "user")
    docs = _items(_tags(user).get("context", ""))
    return Reply.json(
        {
            "grades": [
                {
                    "id": i,
                    "grade": 2 if doc.strip() in RELEVANT_TEXTS else 0,
                    "reason": "States a fact asked for."
                    if doc.strip() in RELEVANT_TEXTS
                    else "Aside.",
                }
                for i, doc in enumerate(docs)
            ]
        }
    )


@pytest.fixture(scope="module")
def server() -> Iterator[JudgeServer]:
    with JudgeServer(handler=planted_judge) as running:
        yield running


def _scorer(server: JudgeServer) -> Any:
    judge = scorers.JudgeClient(
        model="openai/test-judge", api_base=server.base_url, api_key="test", timeout_s=5.0
    )
    return scorers.get("pooled_context_recall", judge=judge, judgments=MemoryJudgments())


def _cases(pool_misses: int, seed: int = 7) -> list[dict[str, Any]]:
    """Per question: the retrieved documents (3 of the 5 relevant, 2 asides, shuffled ids), the
    pool (the relevant ones but the last ``pool_misses``, and the asides), the planted truth."""
    rng = random.Random(seed)
    cases = []
    for q in range(QUESTIONS):
        relevant = [(f"q{q}-r{i}", _doc(q, i, True)) for i in range(RELEVANT_PER_QUESTION)]
        asides = [(f"q{q}-a{i}", _doc(q, i, False)) for i in range(DISTRACTORS)]
        found = rng.sample(relevant, 3)
        retrieved = found + asides[:2]
        pooled = [d for d in relevant if d in found or relevant.index(d) < 5 - pool_misses]
        pool = pooled + asides
        rng.shuffle(pool)
        cases.append(
            {
                "retrieved": retrieved,
                "pool": pool,
                "missed": sorted(d[0] for d in relevant if d not in found and d in pool),
                "true_recall": len(found) / len(relevant),
                "pooled_recall": len(found) / len(pooled),
            }
        )
    return cases


async def _score_all(server: JudgeServer, cases: list[dict[str, Any]]) -> list[Any]:
    scorer = _scorer(server)
    return [
        await scorer.ascore(
            user_input=f"What are the facts about topic {q}?",
            retrieved_contexts=[t for _, t in case["retrieved"]],
            retrieved_context_ids=[i for i, _ in case["retrieved"]],
            pool_contexts=[t for _, t in case["pool"]],
            pool_context_ids=[i for i, _ in case["pool"]],
        )
        for q, case in enumerate(cases)
    ]


def test_estimate_matches_the_planted_recall_and_names_the_missed(server: JudgeServer) -> None:
    cases = _cases(pool_misses=0)
    results = asyncio.run(_score_all(server, cases))
    assert all(r.status == "scored" for r in results)
    mean = sum(r.value for r in results) / len(results)
    truth = sum(c["true_recall"] for c in cases) / len(cases)
    assert abs(mean - truth) <= 0.05
    named = sum(
        sorted(m["id"] for m in r.details["missed"]) == c["missed"]
        for r, c in zip(results, cases, strict=True)
    )
    assert named / len(cases) >= 0.9
    # 15 distinct documents a question (5 relevant, 10 asides), 5 a call.
    assert server.call_count == QUESTIONS * 3


def test_a_pool_missing_relevant_documents_biases_upward_as_documented(
    server: JudgeServer,
) -> None:
    cases = _cases(pool_misses=2)
    results = asyncio.run(_score_all(server, cases))
    for result, case in zip(results, cases, strict=True):
        # Relative to the pool: r / (r + m), not r / (r + m + u).
        assert result.value == pytest.approx(case["pooled_recall"])
        assert result.value >= case["true_recall"]
    assert sum(r.value for r in results) > sum(c["true_recall"] for c in cases)
