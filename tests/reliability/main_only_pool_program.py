"""A spawn or forkserver pool whose program configures the tracer only under ``__main__``.

Run by ``tests/reliability/test_process_exits.py``::

    python tests/reliability/main_only_pool_program.py DATABASE_URL METHOD SCENARIO OUT_DIR

``configure(database_url=...)`` runs under ``if __name__ == "__main__":`` only, as a script's
set-up often does: the pool's children import this file as ``__mp_main__`` and never run it,
so their first traced call configures the tracer from the environment. Two children answer
200 requests (``with Pool()``, which ends them with ``terminate()``, or ``close()`` and
``join()``); the parent writes every answer (token, record id, pid) to OUT_DIR as JSON lines.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
from pathlib import Path
from typing import Any

import recalltrace

TASKS = 200


@recalltrace.rag
def answer(question: str) -> dict[str, Any]:
    return {"token": question, "trace_id": recalltrace.current_trace_id(), "pid": os.getpid()}


def task(number: int) -> dict[str, Any]:
    return answer(f"pool-n{number}")


def run(method: str, scenario: str) -> list[dict[str, Any]]:
    ctx = mp.get_context(method)
    if scenario == "with":
        with ctx.Pool(2) as pool:
            return pool.map(task, range(TASKS))
    if scenario == "close-join":
        pool = ctx.Pool(2)
        answers = pool.map(task, range(TASKS))
        pool.close()
        pool.join()
        return answers
    raise SystemExit(f"unknown scenario {scenario!r}")


if __name__ == "__main__":
    url, method, scenario, out_dir = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
    recalltrace.configure(
        database_url=url, sample_rate=1.0, service_name="pool", shutdown_timeout=60
    )
    answers = run(method, scenario)
    with open(out_dir / "answers.jsonl", "w") as out:
        out.writelines(json.dumps(value) + "\n" for value in answers)
