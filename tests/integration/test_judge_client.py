"""The judge client through LiteLLM against the scripted local server: retries, limits, errors."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from recalltrace.scorers import (
    JudgeCallRecord,
    JudgeClient,
    TerminalJudgeError,
    TransientJudgeError,
)
from recalltrace.scorers._judge import LITELLM_HTTP_FLAG
from recalltrace.scorers.catalog import judge_tasks
from tests.support import ROOT
from tests.support.clocks import HANG_GUARD_S, VirtualTime, finishes
from tests.support.judge_server import JudgeServer, Reply

MESSAGES = [
    {
        "role": "system",
        "content": judge_tasks()["judge_recall"].system,
    },
    {"role": "user", "content": "<question>\nq\n</question>"},
]
GOOD = {"context_recall_score": 0.8, "reason": "Fine."}


@pytest.fixture(scope="module")
def server() -> Iterator[JudgeServer]:
    with JudgeServer() as running:
        yield running


@pytest.fixture(autouse=True)
def _fresh(server: JudgeServer) -> None:
    server.reset()


# LiteLLM reaches an OpenAI-compatible server through the OpenAI SDK, or through its own HTTP
# handler when its switch is on (what `recalltrace worker` does): every behaviour the client
# relies on is checked on both.
ROUTES = {"openai-sdk": "false", "litellm-http": "true"}


@pytest.fixture(params=list(ROUTES))
def route(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(LITELLM_HTTP_FLAG, ROUTES[request.param])
    return str(request.param)


def client(
    server: JudgeServer, records: list[JudgeCallRecord] | None = None, **options: object
) -> JudgeClient:
    settings: dict[str, object] = {
        "model": "openai/test-judge",
        "api_base": server.base_url,
        "api_key": "test",
        "timeout_s": HANG_GUARD_S,  # only a hang guard here; the timeout tests set their own
        "max_retries": 2,
        "max_retry_wait_s": 3.0,
        "backoff_initial_s": 0.01,
        "backoff_max_s": 0.05,
    }
    settings.update(options)
    return JudgeClient(on_call=records.append if records is not None else None, **settings)


def on_virtual_time(judge: JudgeClient) -> VirtualTime:
    """Make ``judge`` wait on a clock that moves only by its own waits (no real time)."""
    clock = VirtualTime()
    judge.clock = clock
    judge.sleep = clock.sleep
    return clock


def chat(judge: JudgeClient):
    return asyncio.run(
        judge.chat(
            MESSAGES, schema_name="judge_recall", schema=judge_tasks()["judge_recall"].schema
        )
    )


@pytest.mark.usefixtures("route")
def test_a_good_answer_is_returned_with_its_accounting(server: JudgeServer) -> None:
    records: list[JudgeCallRecord] = []
    server.script(
        Reply.json(GOOD, usage={"prompt_tokens": 120, "completion_tokens": 15, "total_tokens": 135})
    )
    reply = chat(client(server, records))
    assert reply.content == '{"context_recall_score": 0.8, "reason": "Fine."}'
    assert (reply.prompt_tokens, reply.completion_tokens) == (120, 15)
    assert reply.cost_usd is None  # the test model has no price
    assert reply.attempts == 1 and reply.latency_s > 0
    assert server.call_count == 1
    [record] = records
    assert record.error_type is None and record.operation == "chat"
    assert (record.model, record.provider) == ("openai/test-judge", "openai")
    assert (record.prompt_tokens, record.completion_tokens) == (120, 15)


def test_both_routes_send_the_same_request_and_read_the_same_reply(
    server: JudgeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = {}
    for name, value in ROUTES.items():
        monkeypatch.setenv(LITELLM_HTTP_FLAG, value)
        server.reset()
        server.script(
            Reply.json(
                GOOD, usage={"prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100}
            )
        )
        reply = chat(client(server, model="openai/gpt-4o-mini"))
        assert server.call_count == 1
        seen[name] = (server.requests[0], server.request_headers[0], reply)
    (sdk_body, sdk_headers, sdk_reply), (http_body, http_headers, http_reply) = seen.values()
    assert http_body == sdk_body
    assert http_body["response_format"]["type"] == "json_schema"
    assert sdk_headers["authorization"] == http_headers["authorization"] == "Bearer test"
    # the OpenAI SDK marks its requests; LiteLLM's own handler does not use the SDK at all
    assert "x-stainless-lang" in sdk_headers
    assert "x-stainless-lang" not in http_headers
    assert http_reply.content == sdk_reply.content
    assert (http_reply.prompt_tokens, http_reply.completion_tokens) == (1000, 100)
    assert http_reply.cost_usd == sdk_reply.cost_usd and sdk_reply.cost_usd is not None


@pytest.mark.usefixtures("route")
def test_base_url_and_key_come_from_the_usual_environment_variables(
    server: JudgeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "from-the-environment")
    server.script(Reply.json(GOOD))
    judge = JudgeClient(model="openai/test-judge", timeout_s=2.0, max_retries=0)
    assert chat(judge).content
    assert server.call_count == 1
    assert server.request_headers[0]["authorization"] == "Bearer from-the-environment"


@pytest.mark.usefixtures("route")
def test_request_carries_temperature_seed_and_json_mode_for_unknown_models(
    server: JudgeServer,
) -> None:
    server.script(Reply.json(GOOD))
    chat(client(server))
    body = server.requests[0]
    assert body["temperature"] == 0 and body["seed"] == 0
    assert body["response_format"] == {"type": "json_object"}
    assert body["messages"] == MESSAGES


@pytest.mark.usefixtures("route")
def test_schema_mode_sends_the_json_schema(server: JudgeServer) -> None:
    server.script(Reply.json(GOOD))
    chat(client(server, output_mode="json_schema"))
    fmt = server.requests[0]["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["name"] == "judge_recall"
    assert fmt["json_schema"]["schema"] == judge_tasks()["judge_recall"].schema


@pytest.mark.usefixtures("route")
def test_known_model_gets_structured_output_and_a_cost(server: JudgeServer) -> None:
    server.script(
        Reply.json(
            GOOD, usage={"prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100}
        )
    )
    reply = chat(client(server, model="openai/gpt-4o-mini"))
    assert server.requests[0]["response_format"]["type"] == "json_schema"
    assert reply.cost_usd is not None and reply.cost_usd > 0


@pytest.mark.usefixtures("route")
def test_429_with_retry_after_is_honoured(server: JudgeServer) -> None:
    records: list[JudgeCallRecord] = []
    server.script(Reply.error(429, retry_after=0.4), Reply.json(GOOD))
    judge = client(server, records)
    clock = on_virtual_time(judge)
    reply = chat(judge)
    assert clock.waits == [0.4]  # the retry waited what the server asked, once
    assert reply.attempts == 2 and server.call_count == 2
    assert [r.error_type for r in records] == ["RateLimitError", None]
    assert records[0].status_code == 429


@pytest.mark.usefixtures("route")
def test_429_without_retry_after_backs_off_and_retries(server: JudgeServer) -> None:
    server.script(Reply.error(429), Reply.error(429), Reply.json(GOOD))
    reply = chat(client(server))
    assert reply.attempts == 3 and server.call_count == 3


@pytest.mark.usefixtures("route")
def test_425_too_early_is_retried(server: JudgeServer) -> None:
    server.script(Reply.error(425), Reply.json(GOOD))
    reply = chat(client(server))
    assert reply.attempts == 2 and server.call_count == 2


def test_a_spent_litellm_budget_is_terminal() -> None:
    import litellm

    from recalltrace.scorers._judge import classify_error

    error = litellm.BudgetExceededError(current_cost=2.0, max_budget=1.0)
    assert classify_error(error) == "terminal"


@pytest.mark.usefixtures("route")
def test_500_is_retried_until_the_budget_is_spent(server: JudgeServer) -> None:
    server.script(*(Reply.error(500) for _ in range(5)))
    with pytest.raises(TransientJudgeError) as info:
        chat(client(server, max_retries=2))
    assert server.call_count == 3
    assert info.value.status_code == 500 and info.value.attempts == 3


@pytest.mark.usefixtures("route")
def test_retry_after_beyond_the_wait_budget_gives_up_at_once(server: JudgeServer) -> None:
    server.script(Reply.error(429, retry_after=30))
    with pytest.raises(TransientJudgeError) as info:
        chat(client(server, max_retry_wait_s=1.0))
    assert server.call_count == 1
    assert info.value.retry_after_s == 30


@pytest.mark.usefixtures("route")
@pytest.mark.parametrize(
    ("status", "error_type"),
    [(401, "AuthenticationError"), (403, "PermissionDeniedError"), (404, "NotFoundError")],
)
def test_auth_permission_and_unknown_model_are_terminal(
    server: JudgeServer, status: int, error_type: str
) -> None:
    records: list[JudgeCallRecord] = []
    server.script(Reply.error(status))
    with pytest.raises(TerminalJudgeError) as info:
        chat(client(server, records))
    assert server.call_count == 1
    assert info.value.status_code == status
    # LiteLLM reports some statuses (403 for OpenAI) as a generic APIError.
    assert [r.error_type for r in records] in ([error_type], ["APIError"])
    assert records[0].status_code == status


@pytest.mark.usefixtures("route")
def test_a_slow_response_past_the_timeout_is_transient(server: JudgeServer) -> None:
    records: list[JudgeCallRecord] = []
    # Answers that would come after ten minutes: the call ends only if the timeout cuts them.
    server.script(Reply.json(GOOD, delay=600), Reply.json(GOOD, delay=600))
    judge = client(server, records, timeout_s=0.4, max_retries=1)
    with pytest.raises(TransientJudgeError):
        finishes(lambda: chat(judge), "a judge call past its timeout")
    # Two attempts, each cut at the timeout. The server sees the second one only if it was
    # sent within its 0.4 s: on a loaded machine LiteLLM's own preparation of the request can
    # use the whole timeout, so the count the server saw is not what this test is about.
    assert all(r.error_type is not None for r in records) and len(records) == 2
    assert 1 <= server.call_count <= 2


@pytest.mark.usefixtures("route")
def test_a_slow_body_counts_against_the_timeout(server: JudgeServer) -> None:
    # A body trickled over ten minutes, then a prompt answer (within even a loaded host's 3 s).
    server.script(
        Reply(content='{"context_recall_score": 0.8, "reason": "x"}', slow_body=600),
        Reply.json(GOOD),
    )
    reply = finishes(lambda: chat(client(server, timeout_s=3.0)), "a trickled answer")
    assert reply.attempts == 2 and server.call_count == 2


def test_concurrency_limit_holds(server: JudgeServer) -> None:
    judge = client(server, max_concurrency=3)

    def every_call_sent_or_queued() -> bool:
        # Each of the nine calls is answered, in flight here, or queued for a slot in the
        # client (its semaphore's waiters): every call that holds a slot has arrived.
        queued = sum(
            len(limits.semaphore._waiters or ()) for limits in list(judge._limits.values())
        )
        return server.answered + server.in_flight + queued >= 9

    # Each request is answered only once every call holding a slot in the client has arrived:
    # as many are in flight as the client lets out at once, however slowly they come.
    server.hold_until = every_call_sent_or_queued

    async def many() -> None:
        await asyncio.gather(
            *(
                judge.chat(
                    MESSAGES,
                    schema_name="judge_recall",
                    schema=judge_tasks()["judge_recall"].schema,
                )
                for _ in range(9)
            )
        )

    asyncio.run(many())
    assert server.call_count == 9
    assert server.max_in_flight == 3


def test_requests_per_minute_limit_spaces_requests(server: JudgeServer) -> None:
    judge = client(server, requests_per_minute=60)  # a burst of 10, then one a second
    clock = on_virtual_time(judge)

    async def many() -> None:
        await asyncio.gather(
            *(
                judge.chat(
                    MESSAGES,
                    schema_name="judge_recall",
                    schema=judge_tasks()["judge_recall"].schema,
                )
                for _ in range(11)
            )
        )

    asyncio.run(many())
    # The eleventh request waited for the bucket to refill one request: a second.
    assert sum(clock.waits) == pytest.approx(1.0)
    assert server.call_count == 11


def test_tokens_per_minute_limit_waits_for_tokens(server: JudgeServer) -> None:
    # 600 tokens a minute: a burst of 100 tokens, then 10 a second; each call is estimated
    # at about 30 prompt tokens plus max_tokens=20, so the third call must wait.
    judge = client(server, tokens_per_minute=600, max_tokens=20)
    clock = on_virtual_time(judge)

    async def many() -> None:
        for _ in range(3):
            await judge.chat(
                MESSAGES, schema_name="judge_recall", schema=judge_tasks()["judge_recall"].schema
            )

    asyncio.run(many())
    assert len(clock.waits) >= 1 and sum(clock.waits) >= 0.5


def test_on_call_hook_errors_do_not_break_calls(server: JudgeServer) -> None:
    def broken(record: JudgeCallRecord) -> None:
        raise RuntimeError("metrics exporter down")

    server.script(Reply.json(GOOD))
    judge = client(server)
    judge.on_call = broken
    assert chat(judge).content


def test_the_local_cost_map_flag_is_set_before_litellm_loads(server: JudgeServer) -> None:
    code = (
        "import os, sys, asyncio\nfrom recalltrace import scorers\n"
        "assert 'litellm' not in sys.modules\n"
        "print(os.environ['LITELLM_LOCAL_MODEL_COST_MAP'])\n"
        f"j = scorers.JudgeClient(model='openai/x', api_base='{server.base_url}', api_key='t')\n"
        "asyncio.run(j.chat([{'role': 'user', 'content': 'JSON'}], schema_name='x', schema={}))\n"
        "print(os.environ['LITELLM_LOCAL_MODEL_COST_MAP'])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "LITELLM_LOCAL_MODEL_COST_MAP"}
    server.script(Reply.json(GOOD))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["True", "True"]
    assert server.call_count == 1


def test_a_flag_the_user_set_is_kept() -> None:
    code = (
        "import os\nfrom recalltrace import scorers\n"
        "print(os.environ['LITELLM_LOCAL_MODEL_COST_MAP'])"
    )
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "False"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == "False"


def test_load_judge_backend_imports_litellm_and_freezes_only_when_asked() -> None:
    code = (
        "import gc, sys\nfrom recalltrace import scorers\n"
        "assert 'litellm' not in sys.modules\n"
        "before = gc.get_freeze_count()\n"
        "scorers.load_judge_backend()\n"
        "print('litellm' in sys.modules, gc.get_freeze_count() == before)\n"
        "scorers.load_judge_backend(freeze_gc=True)\n"
        "import litellm\n"
        "print(gc.get_freeze_count() > before + 100000, gc.is_tracked(litellm.model_cost))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    # LiteLLM's module state is in the hundreds of thousands of objects: all of it frozen.
    assert out.stdout.split() == ["True", "True", "True", "True"]


@pytest.mark.parametrize(("preset", "expected"), [(None, "true"), ("false", "false")])
def test_load_judge_backend_switches_litellm_to_its_own_http_handler_unless_told(
    preset: str | None, expected: str
) -> None:
    code = (
        "import os\nfrom recalltrace import scorers\n"
        f"print(os.environ.get({LITELLM_HTTP_FLAG!r}, '-'))\n"
        "scorers.load_judge_backend()\n"
        f"print(os.environ.get({LITELLM_HTTP_FLAG!r}, '-'))\n"
        "scorers.load_judge_backend(litellm_http=True)\n"
        f"print(os.environ.get({LITELLM_HTTP_FLAG!r}, '-'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != LITELLM_HTTP_FLAG}
    if preset is not None:
        env[LITELLM_HTTP_FLAG] = preset
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    before = preset or "-"
    assert out.stdout.split() == [before, before, expected]


def test_the_server_runs_as_a_separate_process() -> None:
    import json
    import urllib.request

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.judge_server",
            "--port",
            "0",
            "--latency",
            "0.05",
            "--rate-429",
            "1.0",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line[0] == "READY" and line[1].startswith("http://127.0.0.1:")
        with urllib.request.urlopen(line[1] + "/models", timeout=10) as response:
            assert json.load(response)["data"][0]["id"] == "test-judge"
        judge = JudgeClient(
            model="openai/test-judge",
            api_base=line[1],
            api_key="t",
            max_retries=1,
            backoff_initial_s=0.01,
        )
        with pytest.raises(TransientJudgeError) as info:
            chat(judge)
        assert info.value.status_code == 429 and info.value.attempts == 2
    finally:
        proc.terminate()
        proc.wait(10)


# LiteLLM leaves one of its own coroutines unawaited when a call is cancelled.
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
def test_a_cancelled_call_gives_its_concurrency_slot_back(server: JudgeServer) -> None:
    server.script(Reply.json(GOOD, delay=5), Reply.json(GOOD))
    judge = client(server, max_concurrency=1)

    async def main() -> str:
        slow = asyncio.ensure_future(
            judge.chat(
                MESSAGES, schema_name="judge_recall", schema=judge_tasks()["judge_recall"].schema
            )
        )
        await asyncio.sleep(0.3)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        reply = await asyncio.wait_for(
            judge.chat(
                MESSAGES, schema_name="judge_recall", schema=judge_tasks()["judge_recall"].schema
            ),
            3,
        )
        return reply.content

    assert asyncio.run(main())
    assert server.call_count == 2
