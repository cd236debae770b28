"""The result type, the registry, input validation, parsing helpers and the judge's error rules."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import pytest

from recalltrace import scorers
from recalltrace.scorers import JudgeConfig, ReferenceCache, ScoreResult
from recalltrace.scorers._cache import cache_key
from recalltrace.scorers._judge import _within, classify_error, retry_after_seconds
from recalltrace.scorers._llm import InvalidAnswer, gather_all, normalise_entity, parse_json_object
from recalltrace.scorers.catalog import CATALOG


def test_import_is_light_and_does_not_load_litellm() -> None:
    code = (
        "import sys\nfrom recalltrace import scorers\n"
        "print('litellm' in sys.modules, 'rapidfuzz' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_public_surface() -> None:
    for name in (
        "get",
        "available",
        "ScoreResult",
        "Scorer",
        "JudgeClient",
        "JudgeConfig",
        "JudgeCallRecord",
        "JudgeError",
        "TransientJudgeError",
        "TerminalJudgeError",
    ):
        assert name in scorers.__all__
    assert issubclass(scorers.TransientJudgeError, scorers.JudgeError)
    assert issubclass(scorers.TerminalJudgeError, scorers.JudgeError)


def test_available_lists_the_catalog_keys() -> None:
    assert scorers.available() == list(CATALOG)
    assert len(scorers.available()) == 7


def test_get_takes_identity_from_the_catalog() -> None:
    judge = scorers.JudgeClient(model="openai/test-judge")
    for key in scorers.available():
        scorer = scorers.get(key, judge=judge)
        info = CATALOG[key]
        assert isinstance(scorer, scorers.Scorer)
        assert (scorer.name, scorer.version, scorer.needs, scorer.uses_llm) == (
            info.key,
            info.version,
            info.needs,
            info.uses_llm,
        )


def test_llm_variant_without_a_judge_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="needs a judge model"):
        scorers.get("llm_context_recall")


def test_get_builds_a_judge_from_model_and_options() -> None:
    scorer = scorers.get("judge_context_recall", model="openai/x", timeout_s=3, samples=3)
    assert scorer.judge.config == JudgeConfig(model="openai/x", timeout_s=3)  # type: ignore[attr-defined]
    assert scorer.samples == 3  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        scorers.get("judge_context_recall", judge=scorer.judge, timeout_s=3)  # type: ignore[attr-defined]


def test_unknown_key_and_unknown_option() -> None:
    with pytest.raises(KeyError, match="known metrics"):
        scorers.get("recall_at_k")
    with pytest.raises(TypeError):
        scorers.get("id_based_context_recall", threshold=0.3)


def test_sync_score_refuses_to_nest_event_loops() -> None:
    scorer = scorers.get("id_based_context_recall")

    async def inside() -> None:
        scorer.score(retrieved_context_ids=["a"], reference_context_ids=["a"])

    judge_scorer = scorers.get("llm_context_recall", model="openai/x")

    async def inside_llm() -> None:
        judge_scorer.score(user_input="q", retrieved_contexts=["c"], reference="r")

    # The non-LLM variants are synchronous work and simply answer.
    asyncio.run(inside())
    with pytest.raises(RuntimeError, match="await ascore"):
        asyncio.run(inside_llm())


# --- ScoreResult ------------------------------------------------------------------------------


def test_result_round_trips_through_json() -> None:
    result = ScoreResult(
        metric="m", value=1, status="scored", reason="All found.", details={"a": [1]}
    )
    assert isinstance(result.value, float)
    data = result.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert list(data) == [
        "metric",
        "value",
        "status",
        "reason",
        "details",
        "model",
        "prompt_tokens",
        "completion_tokens",
        "cost_usd",
        "latency_ms",
        "version",
    ]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"value": math.nan, "status": "scored"},
        {"value": 1.5, "status": "scored"},
        {"value": None, "status": "scored"},
        {"value": 0.5, "status": "skipped"},
        {"value": None, "status": "done"},
        {"value": None, "status": "failed", "reason": " "},
    ],
)
def test_result_rejects_impossible_states(kwargs: dict[str, object]) -> None:
    kwargs.setdefault("reason", "Because.")
    with pytest.raises(ValueError):
        ScoreResult(metric="m", **kwargs)  # type: ignore[arg-type]


# --- parsing ----------------------------------------------------------------------------------


def test_parse_json_object_accepts_fences_and_surrounding_text() -> None:
    assert parse_json_object('```json\n{"a": 1}\n```') == {"a": 1}
    assert parse_json_object('Here you go: {"a": 1} done') == {"a": 1}


@pytest.mark.parametrize(
    ("content", "finish", "message"),
    [
        ('{"claims": [{"statement": "x"', "stop", "not valid JSON|not JSON"),
        ('{"a": 1}', "length", "cut off"),
        ("", "stop", "empty"),
        ("[1, 2]", "stop", "not an object"),
        ("no json here", "stop", "not JSON"),
    ],
)
def test_parse_json_object_rejects_bad_answers(content: str, finish: str, message: str) -> None:
    with pytest.raises(InvalidAnswer, match=message):
        parse_json_object(content, finish)


def test_entities_compare_case_folded_with_whitespace_collapsed() -> None:
    assert normalise_entity("  Eiffel\n  TOWER ") == normalise_entity("eiffel tower")
    assert normalise_entity("Straße") == normalise_entity("STRASSE")


# --- judge error rules ------------------------------------------------------------------------


class _Headers(dict):
    pass


class FakeError(Exception):
    def __init__(self, status: int | None, headers: dict[str, str] | None = None) -> None:
        super().__init__("boom")
        self.status_code = status
        self.litellm_response_headers = headers


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (429, "transient"),
        (408, "transient"),
        (409, "transient"),
        (500, "transient"),
        (503, "transient"),
        (401, "terminal"),
        (403, "terminal"),
        (404, "terminal"),
        (400, "terminal"),
    ],
)
def test_status_codes_are_classified(status: int, kind: str) -> None:
    assert classify_error(FakeError(status)) == kind


def test_timeouts_and_connection_errors_are_transient() -> None:
    assert classify_error(asyncio.TimeoutError()) == "transient"
    assert classify_error(ConnectionResetError()) == "transient"


def test_retry_after_in_seconds_milliseconds_and_http_date() -> None:
    assert retry_after_seconds(FakeError(429, {"retry-after": "3"})) == 3.0
    assert retry_after_seconds(FakeError(429, {"retry-after-ms": "250"})) == 0.25
    assert retry_after_seconds(FakeError(429, {})) is None
    assert retry_after_seconds(FakeError(429, None)) is None
    now = datetime(2026, 11, 26, 12, 0, 0, tzinfo=timezone.utc)
    when = format_datetime(now + timedelta(seconds=30), usegmt=True)
    hinted = FakeError(429, {"retry-after": when})
    assert retry_after_seconds(hinted, now=now.timestamp) == 30.0
    # A date already past asks for no wait at all.
    assert retry_after_seconds(hinted, now=(now + timedelta(minutes=5)).timestamp) == 0.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"model": ""},
        {"model": "m", "output_mode": "xml"},
        {"model": "m", "max_concurrency": 0},
        {"model": "m", "timeout_s": 0},
        {"model": "m", "requests_per_minute": -1},
    ],
)
def test_bad_judge_configuration_is_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        JudgeConfig(**kwargs)  # type: ignore[arg-type]


# --- reference cache --------------------------------------------------------------------------


def test_cache_key_depends_on_text_model_and_prompt_version() -> None:
    base = cache_key("claims", "m", "1", "text")
    assert base == cache_key("claims", "m", "1", "text")
    assert (
        len(
            {
                base,
                cache_key("claims", "m2", "1", "text"),
                cache_key("claims", "m", "2", "text"),
                cache_key("claims", "m", "1", "text2"),
            }
        )
        == 4
    )


def test_cache_computes_once_for_concurrent_callers_and_evicts_lru() -> None:
    cache = ReferenceCache(max_entries=2)
    calls = []

    async def compute() -> str:
        calls.append(1)
        await asyncio.sleep(0.01)
        return "value"

    async def main() -> list[tuple[str, bool]]:
        return list(await asyncio.gather(*(cache.get_or_compute("k", compute) for _ in range(5))))

    results = asyncio.run(main())
    assert len(calls) == 1
    assert [cached for _, cached in results].count(False) == 1
    assert cache.hits == 4 and cache.misses == 1
    asyncio.run(cache.get_or_compute("k2", compute))
    asyncio.run(cache.get_or_compute("k3", compute))
    assert cache.peek("k") is None and len(cache) == 2


def test_cache_keeps_nothing_when_the_computation_fails() -> None:
    cache = ReferenceCache()

    async def boom() -> str:
        raise RuntimeError("judge down")

    with pytest.raises(RuntimeError):
        asyncio.run(cache.get_or_compute("k", boom))
    assert cache.peek("k") is None


def test_every_result_carries_its_latency() -> None:
    skipped = scorers.get("non_llm_context_recall").score(retrieved_contexts=["a"])
    assert skipped.status == "skipped" and skipped.latency_ms is not None
    judge_skip = asyncio.run(
        scorers.get("llm_context_recall", model="openai/x").ascore(user_input="q", reference="r")
    )
    assert judge_skip.status == "skipped" and judge_skip.latency_ms is not None


def test_a_single_judge_call_stays_in_the_callers_task() -> None:
    # Each extra task costs trips through the event loop's queue, which under load wait for
    # everything else that is ready: one call with its deadline runs in the caller's task.
    async def main() -> None:
        outer = asyncio.current_task()

        async def where() -> asyncio.Task[object] | None:
            return asyncio.current_task()

        assert await gather_all([where()]) == [outer]
        two = await gather_all([where(), where()])
        assert outer not in two  # several calls still run concurrently, as tasks
        if sys.version_info >= (3, 11):
            assert await _within(where(), 5.0) is outer
        with pytest.raises(asyncio.TimeoutError):
            await _within(asyncio.sleep(5), 0.01)

    asyncio.run(main())


def test_the_test_judge_answers_every_task_of_every_variant_from_the_catalog() -> None:
    """A seventh variant's tasks reach the scripted judge through its module's TASKS."""
    import json

    from recalltrace.scorers.catalog import LLM_METRICS, judge_tasks, variant_module
    from tests.support.judge_server import auto_answer, detect_task

    tasks = judge_tasks()
    assert {t.name for key in LLM_METRICS for t in variant_module(key).TASKS} == set(tasks)
    user = "<reference>\nParis is in France.\n</reference>\n<context>\n[0] Paris.\n</context>"
    for name, task in tasks.items():
        for response_format in ({"json_schema": {"name": name}}, None):
            request = {
                "messages": [
                    {"role": "system", "content": task.system},
                    {"role": "user", "content": user},
                ],
                "response_format": response_format,
            }
            assert detect_task(request) == name
            reply = auto_answer(request)
            answer = json.loads(reply.content)
            assert set(answer) == set(task.schema["required"]), name


def test_result_labels_name_the_outcome() -> None:
    from recalltrace.scorers import ScoreResult

    def result(value: float | None, status: str = "scored") -> ScoreResult:
        return ScoreResult(metric="m", value=value, status=status, reason="r")  # type: ignore[arg-type]

    assert result(1.0).label == "complete"
    assert result(0.999).label == "partial"
    assert result(0.0).label == "none"
    assert result(None, "skipped").label == "skipped"
    assert result(None, "failed").label == "failed"
