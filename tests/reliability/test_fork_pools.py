"""Requests answered in multiprocessing children are stored, however the children end.

A pool worker ends with ``os._exit`` (``atexit`` never runs), by a SIGTERM from
``Pool.terminate()`` (what ``with Pool()`` does), or after ``maxtasksperchild`` tasks; a
``Process`` child returns without calling ``flush()``. Each case runs the real program
(``fork_program.py``) in a subprocess, against SQLite and the test Postgres, and checks that
every request answered in a child is a stored row, or a drop the tracer counted and said.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import upgrade
from recalltrace.storage.models import Trace
from tests.support.ledger import said_dropped

# The real-system stage (fork pools whose children end every way).
pytestmark = pytest.mark.realsystem

PROGRAM = Path(__file__).with_name("fork_program.py")
ROOT = PROGRAM.parents[2]
# What a child gave up at its exit is said once, in its ledger line.
DROP_LINE = re.compile(r"recalltrace at exit: \d+ request\(s\) seen: [^;]*? (\d+) dropped")

FORK_SCENARIOS = [
    "with",
    "close_join",
    "terminate",
    "maxtasksperchild",
    "imap_unordered",
    "process",
]
CASES = [("fork", scenario) for scenario in FORK_SCENARIOS] + [
    (method, scenario)
    for method in ("forkserver", "spawn")
    for scenario in ("with", "close_join", "process")
]


def ledger(engine: Engine, report: dict[str, int], stderr: str) -> tuple[int, int]:
    """(stored rows, records counted as dropped): the parent's counts from the tracer, plus
    the exact numbers each child said in its one drop line (a child's counts end with it)."""
    with engine.connect() as conn:
        stored = int(conn.scalar(select(func.count()).select_from(Trace)) or 0)
    said = said_dropped(stderr)
    return stored, int(report["dropped"]) + said


def run_program(
    url: str, method: str, scenario: str, env: dict[str, str] | None = None
) -> tuple[dict[str, int], str]:
    done = subprocess.run(
        [sys.executable, str(PROGRAM), url, scenario, method],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return report, done.stderr


def check(
    engine: Engine, url: str, method: str, scenario: str, env: dict[str, str] | None = None
) -> None:
    report, stderr = run_program(url, method, scenario, env)
    stored, dropped = ledger(engine, report, stderr)
    assert report["answered"] >= 50
    # Storage is up: nothing may be given up, and every answered request is a row.
    assert (stored, dropped) == (report["answered"], 0), stderr[-3000:]


@pytest.mark.parametrize(("method", "scenario"), CASES)
def test_children_records_are_stored_sqlite(tmp_path: Path, method: str, scenario: str) -> None:
    url = f"sqlite:///{tmp_path / 'pools.db'}"
    upgrade(url)
    engine = create_engine_from_url(url)
    try:
        check(engine, url, method, scenario)
    finally:
        engine.dispose()


@pytest.mark.parametrize(("method", "scenario"), CASES)
def test_children_records_are_stored_postgres(
    pg_engine: Engine, postgres_url: str, method: str, scenario: str
) -> None:
    check(pg_engine, postgres_url, method, scenario)


@pytest.mark.parametrize("scenario", ["with", "terminate", "maxtasksperchild", "process"])
def test_children_records_are_stored_through_storage_processes(
    pg_engine: Engine, postgres_url: str, scenario: str
) -> None:
    """Each forked child starts its own storage process, which outlives the child's drain."""
    env = {**os.environ, "RECALLTRACE_STORAGE_PROCESS": "1"}
    check(pg_engine, postgres_url, "fork", scenario, env)


@pytest.mark.parametrize("shutdown_timeout", ["0.01", "1"])
def test_exit_drain_is_bounded_and_counts_what_it_gives_up(
    tmp_path: Path, shutdown_timeout: str
) -> None:
    """Storage unreachable: each child still ends (the drain waits ``shutdown_timeout``, not
    forever) and says exactly how many records it gave up, as ``shutdown``, wherever its writer
    was when the drain gave up (still queued, being assembled, or awaiting a retry): a short
    timeout gives up while the writer is still at work, as a long one does on a loaded host."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Nothing listens on the port: every connection attempt is refused at once.
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/nowhere"
    done = subprocess.run(
        [sys.executable, str(PROGRAM), url, "process", "fork", shutdown_timeout],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,  # only turns a drain that never ends into a failure
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    said = [int(n) for n in DROP_LINE.findall(done.stderr)]
    assert report["answered"] == 100
    # One line per child, each with its exact number, all of them as shutdown.
    assert said == [25, 25, 25, 25], done.stderr[-3000:]
    assert done.stderr.count("(shutdown 25)") == 4, done.stderr[-3000:]


INTERRUPTED = """
import signal, sys
import recalltrace
from recalltrace.tracer import _runtime

recalltrace.configure(database_url=sys.argv[1], sample_rate=1.0, shutdown_timeout=1)


@recalltrace.rag
def answer(question: str) -> str:
    return "an answer"


for number in range(20):
    answer(f"q{number}")
# A pool worker told to stop by Pool.terminate() while it is inside the tracer (queuing a
# record): the handler runs in this very thread, which holds the writer's lock.
with _runtime.current.writer._lock:
    signal.raise_signal(signal.SIGTERM)
"""


def test_a_signal_interrupting_the_tracer_itself_does_not_hang_the_process(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'interrupted.db'}"
    upgrade(url)
    program = tmp_path / "interrupted.py"
    program.write_text(INTERRUPTED)
    try:
        done = subprocess.run(
            [sys.executable, str(program), url],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError("the process hung in its exit drain") from exc
    # It ends as it would have: by SIGTERM.
    assert done.returncode == -signal.SIGTERM, done.stderr[-3000:]
