"""Every request a real gunicorn ``--preload`` server answered is stored, however its workers end.

``configure()`` runs in the master (``--preload``); each worker is forked from it and then sets
up its own signal handlers, replacing the tracer's. Under load from a bounded client, the
workers are replaced by a graceful reload (SIGHUP to the master), stopped (SIGTERM to the
master), or recycled after 50 requests (``--max-requests``); sync workers and uvicorn's worker
class. Every request the client saw answered 200 must be a stored row, or a drop the tracer
counted and said in its one line.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from recalltrace.storage.models import Trace
from tests.support.ledger import said_dropped

pytest.importorskip("gunicorn")
pytest.importorskip("uvicorn")

# The real-system stage (gunicorn, with uvicorn workers too, restarted under load).
pytestmark = pytest.mark.realsystem

APP = """
import recalltrace

# shutdown_timeout: generous, as each worker's first write opens its own connections on a
# busy machine; the bound itself is checked in tests/reliability/test_fork_pools.py.
recalltrace.configure(
    database_url={url!r}, sample_rate=1.0, service_name="gunicorn-app", shutdown_timeout=60
)


@recalltrace.retrieval
def search(query: str) -> list[dict]:
    return [{{"id": "kb-1", "content": "Reset your password from the sign-in page."}}]


@recalltrace.rag
def answer(question: str) -> str:
    search(question)
    return "Use the sign-in page."


def wsgi(environ, start_response):
    body = answer(environ.get("QUERY_STRING", "")).encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


async def asgi(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({{"type": "lifespan.startup.complete"}})
            elif message["type"] == "lifespan.shutdown":
                await send({{"type": "lifespan.shutdown.complete"}})
                return
    body = answer(scope.get("query_string", b"").decode()).encode()
    await send({{"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]}})
    await send({{"type": "http.response.body", "body": body}})
"""

WORKERS = {
    "sync": ["app:wsgi"],
    "uvicorn": ["app:asgi", "-k", "uvicorn.workers.UvicornWorker"],
}
CLIENTS = 4
PER_CLIENT = 150


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(port: int, query: str) -> int | None:
    """The status of one request on a new connection, None when none came."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("GET", f"/ask?{query}")
            response = conn.getresponse()
            response.read()
            return response.status
        finally:
            conn.close()
    except (OSError, http.client.HTTPException):
        return None


def wait_ready(port: int, server: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert server.poll() is None, server.communicate()[1][-3000:]
        if get(port, "q=warmup") == 200:
            return
        time.sleep(0.2)
    raise AssertionError("gunicorn did not start")


def ledger(engine: Engine, stderr: str) -> tuple[int, int]:
    """(stored rows, records counted as dropped): the workers' counts end with them, so what
    each said in its one drop line, with the exact number."""
    with engine.connect() as conn:
        stored = int(conn.scalar(select(func.count()).select_from(Trace)) or 0)
    return stored, said_dropped(stderr)


CASES = [
    (worker, event, "thread")
    for worker in sorted(WORKERS)
    for event in ("sighup", "sigterm", "max_requests")
] + [
    # Through a storage process per worker (storage_process=True): started in each forked
    # worker, never the master's; still running while the worker drains on its way out.
    # (Not with --max-requests 50: a worker replaced every few seconds pays an interpreter
    # start for its storage process each time, which docs/tracing.md says to avoid.)
    ("sync", "sighup", "process"),
    ("sync", "sigterm", "process"),
    ("uvicorn", "sigterm", "process"),
]


@pytest.mark.parametrize(("worker", "event", "storage"), CASES)
def test_every_answered_request_is_stored(
    tmp_path: Path, pg_engine: Engine, postgres_url: str, worker: str, event: str, storage: str
) -> None:
    port = free_port()
    (tmp_path / "app.py").write_text(textwrap.dedent(APP.format(url=postgres_url)))
    command = [sys.executable, "-m", "gunicorn", "--preload", "--workers", "2"]
    command += ["--bind", f"127.0.0.1:{port}", "--graceful-timeout", "60", "--timeout", "60"]
    command += ["--log-level", "warning", *WORKERS[worker]]
    if event == "max_requests":
        command += ["--max-requests", "50"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    if storage == "process":
        env["RECALLTRACE_STORAGE_PROCESS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    server = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    answered = [1]  # the warm-up request
    lock = threading.Lock()
    signalled = threading.Event()
    try:
        wait_ready(port, server)
        milestone = CLIENTS * PER_CLIENT // 3

        def client(number: int) -> None:
            for sent in range(PER_CLIENT):
                status = get(port, f"q=c{number}-{sent}")
                if status is None and server.poll() is not None:
                    return
                if status != 200:
                    continue
                with lock:
                    answered[0] += 1
                    due = answered[0] >= milestone and not signalled.is_set()
                    if due:
                        signalled.set()
                if due and event == "sighup":
                    server.send_signal(signal.SIGHUP)
                if due and event == "sigterm":
                    server.send_signal(signal.SIGTERM)

        clients = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join(120)
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
        _, stderr = server.communicate(timeout=90)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert server.returncode == 0, stderr[-3000:]
    stored, dropped = ledger(pg_engine, stderr)
    assert answered[0] >= 100
    # Storage is up: nothing may be given up, and every answered request is a row.
    assert (stored, dropped) == (answered[0], 0), stderr[-3000:]
