"""A WSGI application whose every ``/ask?q=TOKEN`` is one traced RAG request.

Served by real servers in the tests (uWSGI, gunicorn with its sync and gevent workers), which
copy this file beside the server as ``traced_app.py``. ``configure()`` runs at import: in the
server's master when it loads the application before forking its workers, in each worker
otherwise. Each answer is JSON: the token asked, the record id the request was traced under
and the pid of the process that served it. ``/ping`` is not traced (readiness checks).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs

import recalltrace

recalltrace.configure(
    database_url=os.environ["TRACED_APP_DATABASE_URL"],
    sample_rate=1.0,
    service_name="traced-app",
    # Generous: each worker's first write opens its own connections on a busy machine.
    shutdown_timeout=60,
)


@recalltrace.retrieval
def search(query: str) -> list[dict[str, str]]:
    return [{"id": "kb-1", "content": "Reset your password from the sign-in page."}]


@recalltrace.rag
def answer(question: str) -> dict[str, Any]:
    search(question)
    return {
        "answer": "Use the sign-in page.",
        "token": question,
        "trace_id": recalltrace.current_trace_id(),
        "pid": os.getpid(),
    }


def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    if environ.get("PATH_INFO") == "/ping":
        body = b"pong"
    else:
        question = parse_qs(environ.get("QUERY_STRING", "")).get("q", [""])[0]
        body = json.dumps(answer(question)).encode()
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    start_response("200 OK", headers)
    return [body]
