"""Workers forked from C, as uWSGI forks its workers: Python's at-fork hooks never run in them.

Run by ``tests/reliability/test_c_fork.py``::

    python tests/reliability/c_fork_program.py DATABASE_URL CHILDREN PER_PROCESS END

The parent configures the tracer and traces first (its writer thread, locks, connections and
ledger file exist when the children are made), then forks ``CHILDREN`` children with libc's
``fork()`` called while holding the GIL. Each child traces ``PER_PROCESS`` requests and ends by
``END``: ``exit`` (``sys.exit``, so ``atexit`` runs) or ``os_exit`` (``os._exit(0)``, as RQ's work
horses end), without calling ``flush()``. Every process prints one JSON line: its pid and, per
request, the record id the request ran under and its question.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

import recalltrace

URL, CHILDREN, PER_PROCESS, END = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

recalltrace.configure(database_url=URL, sample_rate=1.0, service_name="c-fork", shutdown_timeout=60)


@recalltrace.rag
def answer(question: str) -> str:
    return recalltrace.current_trace_id() or ""


def serve(name: str) -> None:
    asked = [f"{name}-{i}" for i in range(PER_PROCESS)]
    ran = [(answer(question), question) for question in asked]
    sys.stdout.write(json.dumps({"pid": os.getpid(), "requests": ran}) + "\n")
    sys.stdout.flush()


serve("parent")
recalltrace.flush(60)
fork = ctypes.PyDLL(None).fork  # the C library's fork: no Python fork hook runs
children = []
for number in range(CHILDREN):
    pid = fork()
    if pid == 0:
        serve(f"child{number}")
        if END == "os_exit":
            os._exit(0)
        sys.exit(0)
    children.append(pid)
codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
sys.stdout.write(json.dumps({"children_exit": codes}) + "\n")
