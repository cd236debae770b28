"""Traced requests in processes that end with ``os._exit(0)``, never flushing.

Run by ``tests/reliability/test_process_exits.py``::

    python tests/reliability/exit_program.py DATABASE_URL SCENARIO OUT_DIR

``configure()`` runs at import, in the program's own process. ``fork-children``: the process
forks four children with ``os.fork()``; each answers 100 requests and ends with
``os._exit(0)`` (what a hand-written pre-fork server or a job runner's child does); the parent
waits for them and returns. ``exit-script``: the process answers 500 requests and ends with
``os._exit(0)``. Every answer is written to OUT_DIR as one JSON line (token, record id, pid)
before the process ends.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import recalltrace

URL, SCENARIO, OUT_DIR = sys.argv[1], sys.argv[2], Path(sys.argv[3])
CHILDREN = 4
PER_CHILD = 100
SCRIPT_REQUESTS = 500

recalltrace.configure(database_url=URL, sample_rate=1.0, service_name="exits", shutdown_timeout=60)


@recalltrace.rag
def answer(question: str) -> dict[str, Any]:
    return {"token": question, "trace_id": recalltrace.current_trace_id(), "pid": os.getpid()}


def serve(prefix: str, count: int) -> None:
    """Answer ``count`` requests, write the answers, and end without any exit path."""
    with open(OUT_DIR / f"{prefix}.jsonl", "w") as out:
        for number in range(count):
            out.write(json.dumps(answer(f"{prefix}-n{number}")) + "\n")
    os._exit(0)


def main() -> None:
    if SCENARIO == "exit-script":
        serve("script", SCRIPT_REQUESTS)
    if SCENARIO != "fork-children":
        raise SystemExit(f"unknown scenario {SCENARIO!r}")
    children = []
    for number in range(CHILDREN):
        pid = os.fork()
        if pid == 0:
            serve(f"child{number}", PER_CHILD)
        children.append(pid)
    for pid in children:
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"child {pid} ended with status {status}")


if __name__ == "__main__":
    main()
