"""A green-thread library that patches ``threading`` after the tracer started (as a gunicorn
``--preload`` master configures and each worker patches): requests in greenlets are stored,
through the writer thread and through a storage process, and the process ends at once.

gevent is patched after the tracer's writer thread, locks and storage connection exist.
eventlet's own patching of objects made before it breaks SQLAlchemy's connection pool (it says
to patch before importing anything, and its partial upgrade leaves the pool's condition
unusable), so with the writer thread it is patched first, as eventlet requires; the storage
process keeps SQLAlchemy out of the application, and there it is patched after.

Before, the tracer's locks and events made before the patch met a writer started as a greenlet
after it: the first traced request hung the process (gunicorn killed the workers on WORKER
TIMEOUT), and gevent's ``os.close`` deferred closing the storage process's pipe to its loop, so
the storage process never saw the end and was killed after 10 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT

PROGRAM = """
import sys
import recalltrace

url, library, storage, when = sys.argv[1], sys.argv[2], sys.argv[3] == "process", sys.argv[4]
if when == "before":
    import eventlet
    eventlet.monkey_patch()
recalltrace.configure(database_url=url, sample_rate=1.0, storage_process=storage)

@recalltrace.rag
def answer(question):
    return "ok"

answer("before the patch")  # the writer thread and its locks exist before the patch
assert recalltrace.flush(60)
if library == "gevent":
    from gevent import monkey
    monkey.patch_all()
    import gevent
    gevent.joinall([gevent.spawn(answer, f"q{i}") for i in range(50)])
else:
    import eventlet
    if when == "after":
        eventlet.monkey_patch()
    pool = eventlet.GreenPool()
    for i in range(50):
        pool.spawn_n(answer, f"q{i}")
    pool.waitall()
assert recalltrace.flush(60), "flush timed out"
ledger = recalltrace.ledger()
print(ledger.stored, ledger.seen, flush=True)
"""


@pytest.mark.parametrize(
    ("library", "storage", "when"),
    [
        ("gevent", "thread", "after"),
        ("gevent", "process", "after"),
        ("eventlet", "thread", "before"),
        ("eventlet", "process", "after"),
    ],
)
def test_requests_in_greenlets_are_stored(
    tmp_path: Path, library: str, storage: str, when: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    env["RECALLTRACE_RUN_DIR"] = str(tmp_path / "run")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            PROGRAM,
            f"sqlite:///{tmp_path / 'green.db'}",
            library,
            storage,
            when,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["51", "51"], done.stderr[-3000:]
    # The storage process saw its pipe close and ended (it was killed after 10 s before).
    assert "did not exit" not in done.stderr, done.stderr
