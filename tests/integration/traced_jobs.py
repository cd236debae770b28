"""RQ jobs, each one traced RAG request (``answer(TOKEN)``).

Copied beside the worker as ``traced_jobs.py`` by ``tests/integration/test_rq.py``.
``configure()`` runs at import: in each work horse that imports this module to run a job (the
``rq worker`` command imports nothing of the application before it forks), or in the worker's
own process when ``rq_worker_program.py`` imports it first. A job hands back the token asked,
the record id it was traced under and the pid of the process that ran it.
"""

from __future__ import annotations

import os
from typing import Any

import recalltrace

recalltrace.configure(
    database_url=os.environ["TRACED_JOBS_DATABASE_URL"],
    sample_rate=1.0,
    service_name="traced-jobs",
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
