"""A traced function called in the children of one multiprocessing process model.

Run by ``tests/reliability/test_fork_pools.py``::

    python tests/reliability/fork_program.py DATABASE_URL SCENARIO START_METHOD [SHUTDOWN_TIMEOUT]

``configure()`` runs at import: a forked child inherits the parent's configuration, a ``spawn``
or ``forkserver`` child runs it again when it imports this file. No child calls ``flush()`` or
``shutdown()``. The last line printed is one JSON object: the requests answered in the children
(as the parent saw them returned) and the parent's tracer counts of dropped records.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import sys
from typing import Any

import recalltrace

URL, SCENARIO, METHOD = sys.argv[1], sys.argv[2], sys.argv[3]
# Generous by default: a child's first write opens its own storage connection, on a busy machine.
SHUTDOWN_TIMEOUT = float(sys.argv[4]) if len(sys.argv) > 4 else 60.0
TASKS = 200
PER_CHILD = 25

recalltrace.configure(
    database_url=URL, sample_rate=1.0, service_name="pools", shutdown_timeout=SHUTDOWN_TIMEOUT
)


@recalltrace.rag
def answer(question: str) -> str:
    return f"answer to {question}"


def task(number: int) -> int:
    answer(f"q{number}")
    return 1


def child(first: int) -> None:
    for number in range(first, first + PER_CHILD):
        answer(f"p{number}")


def run(scenario: str, ctx: Any) -> int:
    """Requests answered in the children, counted from what they handed back."""
    if scenario == "with":
        with ctx.Pool(4) as pool:
            return sum(pool.map(task, range(TASKS)))
    if scenario == "close_join":
        pool = ctx.Pool(4)
        done = sum(pool.map(task, range(TASKS)))
        pool.close()
        pool.join()
        return done
    if scenario == "terminate":
        pool = ctx.Pool(4)
        done = sum(pool.map(task, range(TASKS)))
        pool.terminate()
        pool.join()
        return done
    if scenario == "maxtasksperchild":
        with ctx.Pool(2, maxtasksperchild=1) as pool:
            return sum(pool.map(task, range(TASKS // 4)))
    if scenario == "imap_unordered":
        with ctx.Pool(4) as pool:
            return sum(pool.imap_unordered(task, range(TASKS), chunksize=7))
    if scenario == "process":
        children = [ctx.Process(target=child, args=(n * PER_CHILD,)) for n in range(4)]
        for process in children:
            process.start()
        for process in children:
            process.join(120)
        return sum(PER_CHILD for process in children if process.exitcode == 0)
    raise SystemExit(f"unknown scenario {scenario!r}")


if __name__ == "__main__":
    answered = run(SCENARIO, mp.get_context(METHOD))
    ledger = recalltrace.ledger()
    dropped = ledger.dropped_total + sum(ledger.other_dropped.values())
    print(json.dumps({"answered": answered, "dropped": dropped}))
