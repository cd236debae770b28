"""A scripted OpenAI-compatible judge server for tests and benchmarks.

It serves ``POST /v1/chat/completions`` and ``GET /v1/models`` on 127.0.0.1, on a free port, from
an asyncio loop in a background thread, so it can hold many slow requests at once. Drive it
through LiteLLM with ``model="openai/<any name>"``, ``api_base=server.base_url`` and
``api_key="test"``.

In a test::

    with JudgeServer() as server:
        server.script(Reply.json({"claims": []}), Reply.error(429, retry_after=1))
        ...                               # scripted replies are used first, in order
        server.handler = auto_answer      # then this answers (the default)
        assert server.call_count == 2
        server.requests[0]["messages"]    # every JSON body received, in order

From a shell (for multi-process tests and benchmarks)::

    python -m tests.support.judge_server --port 0 --latency 0.2 [--rate-429 0.3] [--rate-500 0.1]

prints ``READY http://127.0.0.1:PORT/v1`` on one line, then answers with ``auto_answer`` until
it is killed.

``auto_answer`` gives a valid answer for every judge task of the LLM variants (the tasks come
from the variants' own modules through the catalog): every claim attributed, every chunk
relevant and included, the capitalised words of a text as its entities, a judge score of
0.8, and every pooled document graded relevant (2). It recognises the request from the schema
name in ``response_format`` or, in JSON mode, from the task's system prompt.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from recalltrace.scorers.catalog import judge_tasks
from tests.support.clocks import HANG_GUARD_S

__all__ = ["JudgeServer", "Reply", "auto_answer", "detect_task"]


@dataclass
class Reply:
    """One scripted answer of the server.

    Build it with the class methods: :meth:`json` (a valid completion whose message content is
    the given object serialised), :meth:`raw` (any content string: garbage, truncated JSON) or
    :meth:`error` (an HTTP error status with a body and headers). ``delay`` seconds are waited
    before answering; ``slow_body`` sends the body one byte at a time over that many seconds.
    """

    status: int = 200
    content: str | None = None
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    usage: dict[str, int] | None = None
    finish_reason: str = "stop"
    slow_body: float = 0.0

    @classmethod
    def json(cls, data: Any, *, delay: float = 0.0, usage: dict[str, int] | None = None) -> Reply:
        """A 200 completion whose ``choices[0].message.content`` is ``json.dumps(data)``."""
        return cls(content=json.dumps(data), delay=delay, usage=usage)

    @classmethod
    def raw(
        cls,
        content: str,
        *,
        delay: float = 0.0,
        finish_reason: str = "stop",
        usage: dict[str, int] | None = None,
    ) -> Reply:
        """A 200 completion with this exact content string (e.g. broken JSON)."""
        return cls(content=content, delay=delay, finish_reason=finish_reason, usage=usage)

    @classmethod
    def error(
        cls,
        status: int,
        message: str = "scripted error",
        *,
        retry_after: float | str | None = None,
        headers: dict[str, str] | None = None,
        delay: float = 0.0,
    ) -> Reply:
        """An HTTP error in OpenAI's error shape; ``retry_after`` sets ``Retry-After``."""
        all_headers = dict(headers or {})
        if retry_after is not None:
            all_headers["Retry-After"] = str(retry_after)
        kinds = {
            401: "invalid_api_key",
            403: "permission_denied",
            404: "model_not_found",
            429: "rate_limit_exceeded",
        }
        body = {
            "error": {
                "message": message,
                "type": kinds.get(status, "server_error"),
                "code": kinds.get(status),
            }
        }
        return cls(status=status, body=body, headers=all_headers, delay=delay)


# ---------------------------------------------------------------------------------------------
# auto_answer: valid answers for the four LLM variants

_TAG = re.compile(r"<(\w+)>\n(.*?)\n</\1>", re.S)
_ITEM = re.compile(r"^\[(\d+)\] ", re.M)
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_ENTITY = re.compile(r"\b(?:[A-Z][\w'-]*(?:\s+[A-Z][\w'-]*)*|\d[\d,.]*)\b")


def _tags(text: str) -> dict[str, str]:
    return {name: body for name, body in _TAG.findall(text)}


def _items(block: str) -> list[str]:
    """Split a ``[0] a\\n[1] b`` block back into its items."""
    marks = list(_ITEM.finditer(block))
    return [
        block[m.end() : marks[i + 1].start() if i + 1 < len(marks) else len(block)].rstrip("\n")
        for i, m in enumerate(marks)
    ]


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(text.strip()) if s.strip()]


def _entities(text: str) -> list[str]:
    return list(dict.fromkeys(m.group(0).rstrip(".,") for m in _ENTITY.finditer(text)))


def detect_task(request: dict[str, Any]) -> str:
    """Which judge task a request is, by the variants' own task list
    (:func:`recalltrace.scorers.catalog.judge_tasks`): the ``response_format`` schema name,
    else, in JSON mode, the system prompt of the task. ``unknown`` when neither matches."""
    tasks = judge_tasks()
    response_format = request.get("response_format") or {}
    name = (response_format.get("json_schema") or {}).get("name")
    if name:
        return str(name)
    system = " ".join(
        str(m.get("content", "")) for m in request.get("messages", []) if m.get("role") == "system"
    )
    for task in tasks.values():
        if task.system in system:
            return task.name
    return "unknown"


def auto_answer(request: dict[str, Any]) -> Reply:
    """A valid answer for whichever variant's prompt ``request`` carries."""
    task = detect_task(request)
    user = next(
        (str(m.get("content", "")) for m in request.get("messages", []) if m.get("role") == "user"),
        "",
    )
    tags = _tags(user)
    if task == "claims_with_verdicts":
        claims = _sentences(tags.get("reference", "")) or ["The reference states nothing."]
        return Reply.json(
            {
                "claims": [
                    {"statement": c, "reason": "The context states this.", "attributed": 1}
                    for c in claims
                ]
            }
        )
    if task == "reference_claims":
        return Reply.json({"claims": _sentences(tags.get("reference", ""))})
    if task == "claim_verdicts":
        return Reply.json(
            {
                "verdicts": [
                    {"claim": i, "reason": "The context states this.", "attributed": 1}
                    for i, _ in enumerate(_items(tags.get("claims", "")))
                ]
            }
        )
    if task == "entities":
        return Reply.json({"entities": _entities(tags.get("text", ""))})
    if task == "reference_and_context_entities":
        return Reply.json(
            {
                "reference_entities": _entities(tags.get("reference", "")),
                "context_entities": _entities(tags.get("context", "")),
            }
        )
    if task == "chunk_recall":
        return Reply.json(
            {
                "evaluated_chunks": [
                    {"id_chunk": i, "is_relevant": True, "is_included": True, "missing_info": None}
                    for i, _ in enumerate(_items(tags.get("context", "")))
                ]
            }
        )
    if task == "document_relevance":
        return Reply.json(
            {
                "grades": [
                    {"id": i, "grade": 2, "reason": "It bears on the question."}
                    for i, _ in enumerate(_items(tags.get("context", "")))
                ]
            }
        )
    if task == "judge_recall":
        return Reply.json(
            {"context_recall_score": 0.8, "reason": "The response matches the expected answer."}
        )
    return Reply.error(400, f"the scripted server does not recognise this request ({task})")


# ---------------------------------------------------------------------------------------------
# the server


def _usage(request: dict[str, Any], content: str) -> dict[str, int]:
    # About four characters a token: close enough for accounting tests.
    prompt = sum(len(str(m.get("content", ""))) for m in request.get("messages", []))
    prompt_tokens = prompt // 4 + 1
    completion_tokens = len(content) // 4 + 1
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class JudgeServer:
    """The server; use it as a context manager (``with JudgeServer() as server``).

    Attributes:
        base_url: ``http://127.0.0.1:PORT/v1``, for LiteLLM's ``api_base``.
        requests: every chat request body received, in arrival order.
        request_headers: the HTTP headers of those requests (names in lower case), same order.
        handler: answers when the script is empty; ``auto_answer`` by default.
        latency: seconds added before every answer (on top of a reply's own ``delay``).
    """

    def __init__(
        self,
        *,
        handler: Callable[[dict[str, Any]], Reply] = auto_answer,
        latency: float = 0.0,
        rate_429: float = 0.0,
        rate_500: float = 0.0,
        port: int = 0,
        seed: int | None = None,
    ) -> None:
        self.handler = handler
        self.latency = latency
        self.rate_429 = rate_429
        self.rate_500 = rate_500
        self.requests: list[dict[str, Any]] = []
        self.request_headers: list[dict[str, str]] = []
        self._script: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self._port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self.port = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.answered = 0
        """How many chat requests got their whole answer (a request its client gave up on
        before the answer was sent is not counted)."""
        self.hold_until: Callable[[], bool] | None = None
        """When set, each request, counted in flight, waits until it returns true (at most
        ``HANG_GUARD_S``) before its answer: requests are made to overlap without timing."""

    # scripting ---------------------------------------------------------------------------
    def script(self, *replies: Reply) -> None:
        """Queue replies, answered in order before ``handler`` takes over."""
        with self._lock:
            self._script.extend(replies)

    def reset(self) -> None:
        """Forget received requests and queued replies; restore ``auto_answer``."""
        with self._lock:
            self._script.clear()
            self.requests.clear()
            self.request_headers.clear()
            self.handler = auto_answer
            self.hold_until = None
            self.max_in_flight = 0
            self.answered = 0

    @property
    def call_count(self) -> int:
        """How many chat requests arrived."""
        with self._lock:
            return len(self.requests)

    @property
    def pending(self) -> int:
        """Scripted replies not used yet."""
        with self._lock:
            return len(self._script)

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL, ending in ``/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    # lifecycle ---------------------------------------------------------------------------
    def start(self) -> JudgeServer:
        """Start serving in a background thread; returns when the port is open."""
        self._thread = threading.Thread(target=self._run, name="judge-server", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self._startup_error is not None:
            raise RuntimeError("the judge server did not start") from self._startup_error
        return self

    def stop(self) -> None:
        """Stop serving and join the thread."""
        if self._loop is not None and self._runner is not None:
            future = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
            try:
                future.result(5)
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> JudgeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._start_app())
        except BaseException as exc:  # reported to the starting thread
            self._startup_error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _start_app(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self._port))
        sock.listen(1024)
        self.port = sock.getsockname()[1]
        site = web.SockSite(self._runner, sock)
        await site.start()

    # handlers ----------------------------------------------------------------------------
    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": "test-judge", "object": "model", "owned_by": "test"}],
            }
        )

    def _next_reply(self, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        with self._lock:
            self.requests.append(body)
            self.request_headers.append(headers)
            if self._script:
                return self._script.popleft()
            handler = self.handler
            roll = self._random.random()
        if roll < self.rate_429:
            return Reply.error(429, "rate limited (random)")
        if roll < self.rate_429 + self.rate_500:
            return Reply.error(500, "server error (random)")
        return handler(body)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return web.json_response({"error": {"message": "body is not JSON"}}, status=400)
        reply = self._next_reply(body, {k.lower(): v for k, v in request.headers.items()})
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            hold = self.hold_until
            if hold is not None:
                deadline = time.monotonic() + HANG_GUARD_S
                while not hold() and time.monotonic() < deadline:
                    await asyncio.sleep(0.005)
            wait = self.latency + reply.delay
            if wait > 0:
                await asyncio.sleep(wait)
            response = await self._respond(request, body, reply)
            with self._lock:
                self.answered += 1
            return response
        finally:
            with self._lock:
                self.in_flight -= 1

    async def _respond(
        self, request: web.Request, body: dict[str, Any], reply: Reply
    ) -> web.StreamResponse:
        if reply.status != 200:
            return web.json_response(reply.body, status=reply.status, headers=reply.headers)
        content = reply.content or ""
        payload = {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "test-judge"),
            "system_fingerprint": "fp_test",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": reply.finish_reason,
                }
            ],
            "usage": reply.usage or _usage(body, content),
        }
        data = json.dumps(payload).encode()
        if reply.slow_body <= 0:
            return web.Response(body=data, content_type="application/json", headers=reply.headers)
        response = web.StreamResponse(headers={"Content-Type": "application/json", **reply.headers})
        response.content_length = len(data)
        await response.prepare(request)
        step = reply.slow_body / max(len(data), 1)
        for index in range(len(data)):
            await response.write(data[index : index + 1])
            await asyncio.sleep(step)
        await response.write_eof()
        return response


def start_process(*args: str) -> tuple[subprocess.Popen[str], str]:
    """Run the server in its own process (``python -m tests.support.judge_server *args``).

    Returns the process and its base URL once it is listening; stop it with ``terminate()``.
    """
    from tests.support import ROOT as root

    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.judge_server", *args],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        proc.kill()
        raise RuntimeError(f"the judge server did not start: {line!r}")
    return proc, line.split()[1]


def main(argv: list[str] | None = None) -> None:
    """Serve ``auto_answer`` until killed; print ``READY <base_url>`` once listening."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="port (0 picks a free one)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each answer")
    parser.add_argument("--rate-429", type=float, default=0.0, help="share answered with 429")
    parser.add_argument("--rate-500", type=float, default=0.0, help="share answered with 500")
    parser.add_argument("--seed", type=int, default=None, help="seed of the failure draws")
    args = parser.parse_args(argv)
    server = JudgeServer(
        latency=args.latency,
        rate_429=args.rate_429,
        rate_500=args.rate_500,
        port=args.port,
        seed=args.seed,
    ).start()
    # SIGTERM (what Popen.terminate sends) exits through the finally below, like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"READY {server.base_url}", flush=True)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
