"""A rolling restart of a real uvicorn server under load loses no record.

uvicorn catches SIGTERM for its graceful shutdown, then restores the default action and raises
the signal again, so ``atexit`` never runs. Every request answered 200 before the server went
away must be a stored record, whether the app is served by the ``uvicorn`` command (which
imports the app, and so runs ``configure()``, after installing its own handlers) or by
``uvicorn.run()`` called after ``configure()``.
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
from sqlalchemy import func, select

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.models import Trace

pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")

# The real-system stage (uvicorn restarted under load).
pytestmark = pytest.mark.realsystem

APP = """
import recalltrace
from fastapi import FastAPI

recalltrace.configure(database_url={url!r}, sample_rate=1.0, service_name="api")
app = FastAPI()


@recalltrace.retrieval
def search(query: str) -> list[dict]:
    return [{{"id": "kb-1", "content": "Reset your password from the sign-in page."}}]


@recalltrace.rag
def answer(question: str) -> str:
    search(question)
    return "Use the sign-in page."


@app.get("/ask")
def ask(q: str) -> dict:
    return {{"answer": answer(q)}}


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port={port}, log_level="warning")
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(port: int, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/ask?q=warmup")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("the server did not start")


@pytest.mark.parametrize("served_by", ["uvicorn command", "uvicorn.run"])
def test_every_answered_request_is_stored_across_sigterm(tmp_path: Path, served_by: str) -> None:
    url = f"sqlite:///{tmp_path / 'api.db'}"
    port = free_port()
    (tmp_path / "app.py").write_text(textwrap.dedent(APP.format(url=url, port=port)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    if served_by == "uvicorn command":
        command = [sys.executable, "-m", "uvicorn", "app:app", "--port", str(port)]
        command += ["--host", "127.0.0.1", "--log-level", "warning"]
    else:
        command = [sys.executable, "app.py"]
    server = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_ready(port, server)
        answered = [1]  # the warm-up request
        lock = threading.Lock()
        stop = threading.Event()

        def client(number: int) -> None:
            sent = 0
            while not stop.is_set():
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                    conn.request("GET", f"/ask?q=c{number}-{sent}")
                    status = conn.getresponse().status
                    conn.close()
                except OSError:
                    if server.poll() is not None:
                        return
                    continue
                sent += 1
                if status == 200:
                    with lock:
                        answered[0] += 1

        clients = [threading.Thread(target=client, args=(n,)) for n in range(4)]
        for thread in clients:
            thread.start()
        time.sleep(1.5)  # under load
        server.send_signal(signal.SIGTERM)
        server.wait(60)
        stop.set()
        for thread in clients:
            thread.join(30)
    finally:
        if server.poll() is None:
            server.kill()
    # uvicorn ends the way it does without recalltrace: by the re-raised SIGTERM.
    assert server.returncode in (-signal.SIGTERM, 0), server.stderr.read() if server.stderr else ""
    engine = create_engine_from_url(url)
    with engine.connect() as conn:
        stored = int(conn.scalar(select(func.count()).select_from(Trace)) or 0)
    engine.dispose()
    assert answered[0] > 50
    assert stored == answered[0]
