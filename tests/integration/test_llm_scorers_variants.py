"""The four LLM variants through LiteLLM against the scripted judge server.

Every test asserts the status, the reason and the number of judge calls made.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from recalltrace import scorers
from recalltrace.scorers import ReferenceCache, ScoreResult, TerminalJudgeError, TransientJudgeError
from tests.support.clocks import wait_until
from tests.support.judge_server import JudgeServer, Reply, auto_answer, detect_task

QUESTION = "Where is France and what is it's capital?"
GROUND_TRUTH = "France is in Western Europe and its capital is Paris."
LOW_RECALL_CONTEXT = (
    "France, in Western Europe, encompasses medieval cities, alpine villages and Mediterranean "
    "beaches. The country is also renowned for its wines and sophisticated cuisine. Lascaux's "
    "ancient cave drawings, Lyon's Roman theater and the vast Palace of Versailles attest to "
    "its rich history."
)
LOW_RECALL_VERDICTS = {
    "claims": [
        {"statement": "France is in Western Europe.", "reason": "Stated.", "attributed": 1},
        {"statement": "Its capital is Paris.", "reason": "Paris is not named.", "attributed": 0},
    ]
}


@pytest.fixture(scope="module")
def server() -> Iterator[JudgeServer]:
    with JudgeServer() as running:
        yield running


@pytest.fixture(autouse=True)
def _fresh(server: JudgeServer) -> None:
    server.reset()


def scorer(
    server: JudgeServer, key: str, judge_options: dict[str, Any] | None = None, **options: Any
) -> scorers.Scorer:
    settings: dict[str, Any] = {
        "model": "openai/test-judge",
        "api_base": server.base_url,
        "api_key": "test",
        "timeout_s": 2.0,
        "max_retries": 2,
        "max_retry_wait_s": 2.0,
        "backoff_initial_s": 0.01,
        "backoff_max_s": 0.05,
    }
    settings.update(judge_options or {})
    judge = scorers.JudgeClient(**settings)
    options.setdefault("cache", ReferenceCache())
    return scorers.get(key, judge=judge, **options)


def run(s: scorers.Scorer, **inputs: Any) -> ScoreResult:
    result = s.score(**inputs)
    json.dumps(result.to_dict())  # always serialisable
    return result


# --- llm_context_recall -----------------------------------------------------------------------

RECALL_INPUTS = {
    "user_input": QUESTION,
    "retrieved_contexts": [LOW_RECALL_CONTEXT],
    "reference": GROUND_TRUTH,
}


def test_low_recall_example_scores_one_half(server: JudgeServer) -> None:
    server.script(
        Reply.json(
            LOW_RECALL_VERDICTS,
            usage={"prompt_tokens": 300, "completion_tokens": 60, "total_tokens": 360},
        )
    )
    result = run(scorer(server, "llm_context_recall"), **RECALL_INPUTS)
    assert (result.status, result.value) == ("scored", 0.5)
    assert result.reason == "1 of 2 reference claims can be attributed to the retrieved contexts."
    assert [c["attributed"] for c in result.details["claims"]] == [1, 0]
    assert result.details["claims"][1]["reason"] == "Paris is not named."
    assert (result.prompt_tokens, result.completion_tokens, result.cost_usd) == (300, 60, None)
    assert result.model == "openai/test-judge" and result.latency_ms and result.latency_ms > 0
    assert server.call_count == 1
    user = server.requests[0]["messages"][1]["content"]
    assert GROUND_TRUTH in user and LOW_RECALL_CONTEXT in user and QUESTION in user


def test_documented_example_scores_one(server: JudgeServer) -> None:
    result = run(
        scorer(server, "llm_context_recall"),
        user_input="Where is the Eiffel Tower located?",
        retrieved_contexts=["Paris is the capital of France."],
        reference="The Eiffel Tower is located in Paris.",
    )
    assert (result.status, result.value) == ("scored", 1.0)
    assert server.call_count == 1


def test_verdicts_read_as_zero_or_one_in_any_spelling(server: JudgeServer) -> None:
    # 1, "0", true: all spellings of a verdict (other numbers are invalid, see
    # test_judge_hardening.py).
    server.script(
        Reply.json(
            {
                "claims": [
                    {"statement": "a", "reason": "", "attributed": 1},
                    {"statement": "b", "reason": "", "attributed": "0"},
                    {"statement": "c", "reason": "", "attributed": True},
                ]
            }
        )
    )
    result = run(scorer(server, "llm_context_recall"), **RECALL_INPUTS)
    assert result.value == pytest.approx(2 / 3)


def test_malformed_json_is_asked_again_with_the_problem(server: JudgeServer) -> None:
    server.script(
        Reply.raw("Sure! The claims are: France, Paris."), Reply.json(LOW_RECALL_VERDICTS)
    )
    result = run(scorer(server, "llm_context_recall"), **RECALL_INPUTS)
    assert (result.status, result.value) == ("scored", 0.5)
    assert server.call_count == 2
    retry = server.requests[1]["messages"]
    assert retry[2] == {"role": "assistant", "content": "Sure! The claims are: France, Paris."}
    assert "was not JSON" in retry[3]["content"]


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        (Reply.raw('{"claims": [{"statement": "France is in Western Europe.", "rea'), "not JSON"),
        (Reply.raw('{"claims": []}', finish_reason="length"), "cut off"),
        (Reply.json({"claims": []}), "no claims"),
        (Reply.json({"statements": ["x"]}), 'no "claims" list'),
        (Reply.json({"claims": [{"statement": "x", "reason": "y", "attributed": "maybe"}]}), "0/1"),
    ],
)
def test_invalid_twice_fails_with_the_reason(server: JudgeServer, bad: Reply, problem: str) -> None:
    server.script(bad, bad)
    result = run(scorer(server, "llm_context_recall"), **RECALL_INPUTS)
    assert result.status == "failed" and result.value is None
    assert result.reason.startswith("The judge gave no valid answer after one retry")
    assert problem in result.reason
    assert server.call_count == 2
    assert result.prompt_tokens is not None and result.prompt_tokens > 0


def test_empty_claims_once_then_good_is_scored(server: JudgeServer) -> None:
    server.script(Reply.json({"claims": []}), Reply.json(LOW_RECALL_VERDICTS))
    result = run(scorer(server, "llm_context_recall"), **RECALL_INPUTS)
    assert result.value == 0.5 and server.call_count == 2


def test_empty_reference_is_skipped_and_empty_retrieval_is_zero_without_a_call(
    server: JudgeServer,
) -> None:
    s = scorer(server, "llm_context_recall")
    skipped = run(s, **{**RECALL_INPUTS, "reference": "  "})
    assert skipped.status == "skipped" and "reference" in skipped.reason
    missing = run(s, user_input=QUESTION, retrieved_contexts=[LOW_RECALL_CONTEXT])
    assert missing.status == "skipped" and "reference" in missing.reason
    zero = run(s, **{**RECALL_INPUTS, "retrieved_contexts": []})
    assert (zero.status, zero.value) == ("scored", 0.0)
    assert "Nothing was retrieved" in zero.reason
    assert server.call_count == 0


def test_none_inside_contexts_is_an_input_error_before_any_call(server: JudgeServer) -> None:
    with pytest.raises(scorers.ScorerInputError, match=r"retrieved_contexts\[1\] is None"):
        run(
            scorer(server, "llm_context_recall"),
            **{**RECALL_INPUTS, "retrieved_contexts": ["a", None]},
        )
    with pytest.raises(scorers.ScorerInputError, match="reference must be a string"):
        run(scorer(server, "llm_context_recall"), **{**RECALL_INPUTS, "reference": ["a"]})
    assert server.call_count == 0


def test_split_claims_pays_for_a_reference_once(server: JudgeServer) -> None:
    s = scorer(server, "llm_context_recall", split_claims=True)
    first = run(s, **RECALL_INPUTS)
    assert first.value == 1.0 and first.details["reference_cache"] is False
    assert server.call_count == 2
    second = run(s, **{**RECALL_INPUTS, "retrieved_contexts": ["France is in Western Europe."]})
    assert second.details["reference_cache"] is True
    assert server.call_count == 3
    assert [detect_task(r) for r in server.requests] == [
        "reference_claims",
        "claim_verdicts",
        "claim_verdicts",
    ]
    assert second.prompt_tokens is not None and second.prompt_tokens < first.prompt_tokens


def test_split_claims_with_no_claims_twice_fails(server: JudgeServer) -> None:
    server.script(Reply.json({"claims": []}), Reply.json({"claims": []}))
    result = run(scorer(server, "llm_context_recall", split_claims=True), **RECALL_INPUTS)
    assert result.status == "failed" and "no claims" in result.reason
    assert [detect_task(r) for r in server.requests] == ["reference_claims"] * 2


@pytest.mark.parametrize(
    "key", ["llm_context_recall", "chunk_context_recall", "judge_context_recall"]
)
@pytest.mark.parametrize("question", [None, "", "  \n"])
def test_a_missing_or_empty_question_is_skipped_without_a_call(
    server: JudgeServer, key: str, question: str | None
) -> None:
    inputs = {**JUDGE_INPUTS, "user_input": question}
    if question is None:
        del inputs["user_input"]
    result = run(scorer(server, key), **inputs)
    assert result.status == "skipped" and result.value is None
    assert "user_input" in result.reason
    assert server.call_count == 0


def test_split_claims_rejects_wrong_claim_ids(server: JudgeServer) -> None:
    server.script(
        Reply.json({"claims": ["France is in Western Europe.", "Its capital is Paris."]}),
        Reply.json(
            {
                "verdicts": [
                    {"claim": 0, "reason": "", "attributed": 1},
                    {"claim": 7, "reason": "", "attributed": 1},
                ]
            }
        ),
        Reply.json({"verdicts": [{"claim": 0, "reason": "", "attributed": 1}]}),
    )
    result = run(scorer(server, "llm_context_recall", split_claims=True), **RECALL_INPUTS)
    assert result.status == "failed" and "[1] have no verdict" in result.reason
    assert "Claim id 7 does not exist" in server.requests[2]["messages"][-1]["content"]
    assert server.call_count == 3


def test_repeated_judging_takes_the_majority_and_records_agreement(server: JudgeServer) -> None:
    def verdicts(a: int, b: int) -> Reply:
        return Reply.json(
            {
                "verdicts": [
                    {"claim": 0, "reason": "r0", "attributed": a},
                    {"claim": 1, "reason": "r1", "attributed": b},
                ]
            }
        )

    server.script(
        Reply.json({"claims": ["France is in Western Europe.", "Its capital is Paris."]}),
        verdicts(1, 0),
        verdicts(1, 1),
        verdicts(1, 0),
    )
    result = run(scorer(server, "llm_context_recall", samples=3), **RECALL_INPUTS)
    assert result.value == 0.5
    assert [c["attributed"] for c in result.details["claims"]] == [1, 0]
    assert result.details["samples"] == 3
    assert result.details["agreement"] == pytest.approx((1 + 2 / 3) / 2, abs=1e-4)
    assert server.call_count == 4


# --- transport errors through a scorer ---------------------------------------------------------


def test_rate_limit_then_success_is_scored(server: JudgeServer) -> None:
    server.script(
        Reply.error(429), Reply.error(429, retry_after=0.1), Reply.json(LOW_RECALL_VERDICTS)
    )
    result = run(scorer(server, "llm_context_recall"), **RECALL_INPUTS)
    assert result.value == 0.5 and server.call_count == 3


def test_persistent_server_errors_raise_transient(server: JudgeServer) -> None:
    server.script(*(Reply.error(500) for _ in range(3)))
    with pytest.raises(TransientJudgeError):
        run(scorer(server, "judge_context_recall"), **JUDGE_INPUTS)
    assert server.call_count == 3


def test_timeouts_raise_transient(server: JudgeServer) -> None:
    server.handler = lambda request: Reply.json(
        {"context_recall_score": 0.8, "reason": "x"}, delay=3
    )
    with pytest.raises(TransientJudgeError):
        asyncio.run(
            scorer(server, "judge_context_recall", {"timeout_s": 0.3}).ascore(**JUDGE_INPUTS)
        )
    # The last attempt gave up after 0.3 s; on a loaded host the server may read its request
    # a moment later.
    wait_until(lambda: server.call_count >= 3, "the third attempt to reach the judge server")
    assert server.call_count == 3


def test_bad_credentials_raise_terminal_after_one_call(server: JudgeServer) -> None:
    server.script(Reply.error(401, "Incorrect API key provided"))
    with pytest.raises(TerminalJudgeError, match="AuthenticationError"):
        run(scorer(server, "chunk_context_recall"), **CHUNK_INPUTS)
    assert server.call_count == 1


def test_an_input_too_long_for_the_model_fails_that_trace(server: JudgeServer) -> None:
    server.script(
        Reply.error(
            400,
            "This model's maximum context length is 8192 tokens. However, your messages "
            "resulted in 9000 tokens.",
        )
    )
    result = run(scorer(server, "judge_context_recall"), **JUDGE_INPUTS)
    assert result.status == "failed" and "rejected this trace's input" in result.reason
    assert server.call_count == 1


# --- context_entity_recall --------------------------------------------------------------------

ENTITY_INPUTS = {
    "reference": "The Eiffel Tower, in Paris, opened in 1889.",
    "retrieved_contexts": ["PARIS is the capital of France.", "Gustave Eiffel built it."],
}


def _tag(user: str, name: str) -> str:
    return re.search(rf"<{name}>\n(.*?)\n</{name}>", user, re.S).group(1)  # type: ignore[union-attr]


def entity_handler(mapping: dict[str, list[str]]):
    """Answers both entity tasks from ``mapping`` (text -> its entities)."""

    def handle(request: dict[str, Any]) -> Reply:
        user = request["messages"][1]["content"]
        if detect_task(request) == "reference_and_context_entities":
            return Reply.json(
                {
                    "reference_entities": mapping[_tag(user, "reference")],
                    "context_entities": mapping[_tag(user, "context")],
                }
            )
        return Reply.json({"entities": mapping[_tag(user, "text")]})

    return handle


ENTITY_MAPPING = {
    ENTITY_INPUTS["reference"]: ["Eiffel Tower", "Paris", "1889", "paris"],
    "\n\n".join(ENTITY_INPUTS["retrieved_contexts"]): ["paris", "France", "Gustave  Eiffel"],
}


def test_entities_come_from_one_call_and_are_compared_case_folded(server: JudgeServer) -> None:
    server.handler = entity_handler(ENTITY_MAPPING)
    result = run(scorer(server, "context_entity_recall"), **ENTITY_INPUTS)
    assert (result.status, result.value) == ("scored", pytest.approx(1 / 3))
    assert result.reason == "1 of 3 reference entities appear in the retrieved contexts."
    assert result.details["mode"] == "one_call"
    assert result.details["reference_entities"] == ["Eiffel Tower", "Paris", "1889"]
    assert result.details["context_entities"] == ["paris", "France", "Gustave  Eiffel"]
    assert result.details["found_entities"] == ["Paris"]
    assert result.details["missing_entities"] == ["Eiffel Tower", "1889"]
    assert "reference_cache" not in result.details
    assert server.call_count == 1
    (request,) = server.requests
    assert detect_task(request) == "reference_and_context_entities"
    user = request["messages"][1]["content"]
    assert _tag(user, "reference") == ENTITY_INPUTS["reference"]
    assert _tag(user, "context") == "\n\n".join(ENTITY_INPUTS["retrieved_contexts"])


def test_split_reference_asks_twice_then_serves_the_reference_from_the_cache(
    server: JudgeServer,
) -> None:
    server.handler = entity_handler(
        {
            ENTITY_INPUTS["reference"]: ["Paris"],
            "\n\n".join(ENTITY_INPUTS["retrieved_contexts"]): ["Paris", "France"],
            "Paris again.": ["Paris"],
        }
    )
    s = scorer(server, "context_entity_recall", split_reference=True)
    first = run(s, **ENTITY_INPUTS)
    assert first.value == 1.0  # exactly 1.0, no epsilon in the denominator
    assert first.details["mode"] == "split_reference"
    assert first.details["reference_cache"] is False
    assert server.call_count == 2
    again = run(s, **{**ENTITY_INPUTS, "retrieved_contexts": ["Paris again."]})
    assert again.value == 1.0 and again.details["reference_cache"] is True
    assert server.call_count == 3
    assert {detect_task(r) for r in server.requests} == {"entities"}


def test_entity_samples_split_the_reference_and_take_the_majority(server: JudgeServer) -> None:
    contexts = "\n\n".join(ENTITY_INPUTS["retrieved_contexts"])
    answers = iter([["Paris"], ["Paris", "1889"], ["1889"]])

    def handle(request: dict[str, Any]) -> Reply:
        text = _tag(request["messages"][1]["content"], "text")
        if text == contexts:
            return Reply.json({"entities": next(answers)})
        return Reply.json({"entities": ["Paris", "1889"]})

    server.handler = handle
    result = run(scorer(server, "context_entity_recall", samples=3), **ENTITY_INPUTS)
    # Paris: 2 of 3 samples, 1889: 2 of 3 samples -> both found.
    assert (result.status, result.value) == ("scored", 1.0)
    assert result.details["mode"] == "split_reference"
    assert result.details["samples"] == 3
    assert result.details["agreement"] == pytest.approx(2 / 3, abs=1e-4)
    assert server.call_count == 4


def test_an_entity_answer_missing_a_list_is_asked_again_then_fails(server: JudgeServer) -> None:
    server.script(
        Reply.json({"reference_entities": ["Paris"]}),
        Reply.json({"reference_entities": ["Paris"], "context_entities": "Paris"}),
    )
    result = run(scorer(server, "context_entity_recall"), **ENTITY_INPUTS)
    assert result.status == "failed"
    assert 'no "context_entities" list' in result.reason
    assert server.call_count == 2
    assert 'no "context_entities" list' in server.requests[1]["messages"][-1]["content"]


@pytest.mark.parametrize("split_reference", [False, True])
def test_reference_without_entities_is_skipped(server: JudgeServer, split_reference: bool) -> None:
    server.handler = entity_handler({"it is nice.": [], "x": ["X"]})
    result = run(
        scorer(server, "context_entity_recall", split_reference=split_reference),
        reference="it is nice.",
        retrieved_contexts=["x"],
    )
    assert result.status == "skipped" and "no entities" in result.reason
    assert result.details["reference_entities"] == []
    assert server.call_count == (2 if split_reference else 1)


def test_entities_with_nothing_retrieved_score_zero(server: JudgeServer) -> None:
    server.handler = entity_handler({ENTITY_INPUTS["reference"]: ["Paris"]})
    result = run(
        scorer(server, "context_entity_recall"),
        reference=ENTITY_INPUTS["reference"],
        retrieved_contexts=[],
    )
    assert (result.status, result.value) == ("scored", 0.0)
    # The reference alone is asked about: a reference without entities would be skipped.
    assert [detect_task(r) for r in server.requests] == ["entities"]
    assert result.details == {
        "mode": "split_reference",
        "reference_cache": False,
        "reference_entities": ["Paris"],
        "retrieved_contexts": 0,
    }


def test_an_empty_reference_names_no_entities_and_is_skipped_without_a_call(
    server: JudgeServer,
) -> None:
    s = scorer(server, "context_entity_recall")
    for reference in ("", "  "):
        result = run(s, **{**ENTITY_INPUTS, "reference": reference})
        assert result.status == "skipped" and "reference is empty" in result.reason
    assert run(s, retrieved_contexts=["x"]).status == "skipped"
    assert server.call_count == 0


# --- chunk_context_recall ---------------------------------------------------------------------

CHUNK_INPUTS = {
    "user_input": "How do I relieve a stuffy nose?",
    "response": "Drink fluids and rest.",
    "retrieved_contexts": [
        "Fluids and rest help.",
        "Saline nasal sprays relieve congestion.",
        "Colds are viral.",
    ],
}
RAG_EVALS_EXAMPLE = {
    "evaluated_chunks": [
        {"id_chunk": 0, "is_relevant": True, "is_included": True, "missing_info": None},
        {
            "id_chunk": 1,
            "is_relevant": True,
            "is_included": False,
            "missing_info": "Information about saline nasal sprays for congestion relief",
        },
        {"id_chunk": 2, "is_relevant": False, "is_included": True, "missing_info": None},
    ]
}


def test_rag_evals_example_scores_one_half(server: JudgeServer) -> None:
    server.script(Reply.json(RAG_EVALS_EXAMPLE))
    result = run(scorer(server, "chunk_context_recall"), **CHUNK_INPUTS)
    assert (result.status, result.value) == ("scored", 0.5)
    assert result.reason == "The answer reflects 1 of 2 relevant chunks."
    assert result.details["missing_information"] == [
        {
            "chunk_id": 1,
            "missing_info": "Information about saline nasal sprays for congestion relief",
        }
    ]
    assert len(result.details["evaluated_chunks"]) == 3
    assert server.call_count == 1


@pytest.mark.parametrize(
    ("chunks", "problem"),
    [
        ([0, 1, 5], "Chunk id 5 does not exist"),
        ([0, 1, 1], "Chunk id 1 was evaluated twice"),
        ([0, 1], "Chunk ids [2] were not evaluated"),
    ],
)
def test_wrong_chunk_ids_are_asked_again_then_fail(
    server: JudgeServer, chunks: list[int], problem: str
) -> None:
    bad = Reply.json(
        {
            "evaluated_chunks": [
                {"id_chunk": i, "is_relevant": True, "is_included": True, "missing_info": None}
                for i in chunks
            ]
        }
    )
    server.script(bad, bad)
    result = run(scorer(server, "chunk_context_recall"), **CHUNK_INPUTS)
    assert result.status == "failed" and problem in result.reason
    assert server.call_count == 2


def test_wrong_chunk_ids_once_then_right_is_scored(server: JudgeServer) -> None:
    server.script(Reply.json({"evaluated_chunks": []}), Reply.json(RAG_EVALS_EXAMPLE))
    result = run(scorer(server, "chunk_context_recall"), **CHUNK_INPUTS)
    assert result.value == 0.5 and server.call_count == 2


def test_no_relevant_chunk_is_one_by_definition(server: JudgeServer) -> None:
    server.script(
        Reply.json(
            {
                "evaluated_chunks": [
                    {
                        "id_chunk": i,
                        "is_relevant": False,
                        "is_included": False,
                        "missing_info": None,
                    }
                    for i in range(3)
                ]
            }
        )
    )
    result = run(scorer(server, "chunk_context_recall"), **CHUNK_INPUTS)
    assert result.value == 1.0 and "by definition" in result.reason


def test_chunks_need_a_response_and_retrieved_chunks(server: JudgeServer) -> None:
    s = scorer(server, "chunk_context_recall")
    assert run(s, **{**CHUNK_INPUTS, "response": ""}).status == "skipped"
    assert run(s, **{**CHUNK_INPUTS, "retrieved_contexts": []}).status == "skipped"
    assert run(s, user_input="q", retrieved_contexts=["c"]).status == "skipped"
    blank = run(s, **{**CHUNK_INPUTS, "retrieved_contexts": ["", "  "]})
    assert blank.status == "skipped" and "Nothing was retrieved" in blank.reason
    assert server.call_count == 0


def test_chunk_majority_vote(server: JudgeServer) -> None:
    def answer(included: bool) -> Reply:
        return Reply.json(
            {
                "evaluated_chunks": [
                    {"id_chunk": 0, "is_relevant": True, "is_included": True, "missing_info": None},
                    {
                        "id_chunk": 1,
                        "is_relevant": True,
                        "is_included": included,
                        "missing_info": None if included else "sprays",
                    },
                    {
                        "id_chunk": 2,
                        "is_relevant": False,
                        "is_included": False,
                        "missing_info": None,
                    },
                ]
            }
        )

    server.script(answer(False), answer(True), answer(False))
    result = run(scorer(server, "chunk_context_recall", samples=3), **CHUNK_INPUTS)
    assert result.value == 0.5
    assert result.details["missing_information"] == [{"chunk_id": 1, "missing_info": "sprays"}]
    assert result.details["agreement"] == pytest.approx((5 + 2 / 3) / 6, abs=1e-4)
    assert server.call_count == 3


# --- judge_context_recall ---------------------------------------------------------------------

JUDGE_INPUTS = {
    "user_input": "What is the capital of France?",
    "response": "The capital of France is Paris. It is famous for its iconic Eiffel Tower.",
    "reference": "Paris",
    "retrieved_contexts": ["France is a country in Western Europe. Its capital is Paris."],
}


def test_judge_score_and_reason(server: JudgeServer) -> None:
    server.script(Reply.json({"context_recall_score": 0.9, "reason": "The response names Paris"}))
    result = run(scorer(server, "judge_context_recall"), **JUDGE_INPUTS)
    assert (result.status, result.value) == ("scored", 0.9)
    assert result.reason == "The response names Paris."
    assert server.call_count == 1


@pytest.mark.parametrize("bad", [1.5, -0.1, "high", None, True, "NaN", "Infinity"])
def test_out_of_range_or_missing_scores_fail_after_a_retry(
    server: JudgeServer, bad: object
) -> None:
    if bad in ("NaN", "Infinity"):  # bare JSON tokens, which Python's json module reads as floats
        reply = Reply.raw(f'{{"context_recall_score": {bad}, "reason": "r"}}')
    else:
        reply = Reply.json({"context_recall_score": bad, "reason": "r"})
    server.script(reply, reply)
    result = run(scorer(server, "judge_context_recall"), **JUDGE_INPUTS)
    assert result.status == "failed" and result.value is None
    # NaN and Infinity are refused when the JSON is read, before the field is looked at.
    assert "context_recall_score" in result.reason or "not a JSON number" in result.reason
    assert server.call_count == 2


def test_out_of_range_once_then_valid_is_scored(server: JudgeServer) -> None:
    server.script(
        Reply.json({"context_recall_score": 8, "reason": "r"}),
        Reply.json({"context_recall_score": 0.7, "reason": "ok"}),
    )
    result = run(scorer(server, "judge_context_recall"), **JUDGE_INPUTS)
    assert result.value == 0.7 and server.call_count == 2
    assert "outside [0, 1]" in server.requests[1]["messages"][-1]["content"]


def test_judge_samples_take_the_median(server: JudgeServer) -> None:
    server.script(
        *(Reply.json({"context_recall_score": v, "reason": f"r{v}"}) for v in (0.9, 0.4, 0.8))
    )
    result = run(scorer(server, "judge_context_recall", samples=3), **JUDGE_INPUTS)
    assert result.value == 0.8 and result.reason == "r0.8."
    assert sorted(result.details["scores"]) == [0.4, 0.8, 0.9]
    assert result.details["agreement"] == pytest.approx(0.5)
    assert server.call_count == 3


def test_judge_skips_and_zero(server: JudgeServer) -> None:
    s = scorer(server, "judge_context_recall")
    assert run(s, **{**JUDGE_INPUTS, "reference": ""}).status == "skipped"
    assert run(s, **{**JUDGE_INPUTS, "response": " "}).status == "skipped"
    zero = run(s, **{**JUDGE_INPUTS, "retrieved_contexts": []})
    assert (zero.status, zero.value) == ("scored", 0.0)
    assert server.call_count == 0


# --- auto_answer ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["json_object", "json_schema"])
def test_auto_answer_serves_every_variant_in_both_output_modes(
    server: JudgeServer, mode: str
) -> None:
    judge = scorers.JudgeClient(
        model="openai/test-judge", api_base=server.base_url, api_key="t", output_mode=mode
    )
    inputs = {
        "user_input": "Where is the Eiffel Tower?",
        "response": "In Paris. It opened in 1889.",
        "reference": "The Eiffel Tower is in Paris. It opened in 1889.",
        "retrieved_contexts": ["The Eiffel Tower stands in Paris.", "It opened in 1889."],
    }
    for key in (
        "llm_context_recall",
        "context_entity_recall",
        "chunk_context_recall",
        "judge_context_recall",
    ):
        result = scorers.get(key, judge=judge, cache=None).score(**inputs)
        assert result.status == "scored", (key, result.reason)
    split = scorers.get("llm_context_recall", judge=judge, split_claims=True, cache=None).score(
        **inputs
    )
    assert split.value == 1.0
    entities = scorers.get(
        "context_entity_recall", judge=judge, split_reference=True, cache=None
    ).score(**inputs)
    assert entities.value == 1.0
    assert {detect_task(r) for r in server.requests} == {
        "claims_with_verdicts",
        "reference_and_context_entities",
        "entities",
        "chunk_recall",
        "judge_recall",
        "reference_claims",
        "claim_verdicts",
    }
    assert auto_answer({"messages": []}).status == 400


def test_opik_documented_inputs_reach_the_judge_and_its_score_is_kept(server: JudgeServer) -> None:
    server.script(
        Reply.json({"context_recall_score": 1.0, "reason": "The response names Paris as asked."})
    )
    result = run(
        scorer(server, "judge_context_recall"),
        user_input="What is the capital of France?",
        response="The capital of France is Paris. It is famous for its iconic Eiffel Tower and "
        "rich cultural heritage.",
        reference="Paris",
        retrieved_contexts=[
            "France is a country in Western Europe. Its capital is Paris, which is known for "
            "landmarks like the Eiffel Tower."
        ],
    )
    assert (result.status, result.value) == ("scored", 1.0)
    user = server.requests[0]["messages"][1]["content"]
    assert "<expected_answer>\nParis\n</expected_answer>" in user
    assert "context_recall_score" in server.requests[0]["messages"][0]["content"]
    assert server.call_count == 1
