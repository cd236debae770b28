"""Processes forked from C (uWSGI's workers) draw their own record ids and store their own
records, with no fork hook: the tracer notices a copied process by its pid.

Before, every such child drew the same record ids as its siblings (the id generator was
reseeded only in Python's fork hook), writes are idempotent on the id, and the records of all
but the first writer were discarded while counted as stored; late references landed on other
requests' records.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from recalltrace.storage.db import create_engine_from_url
from tests.support.ledger import said_dropped

PROGRAM = Path(__file__).with_name("c_fork_program.py")
ROOT = PROGRAM.parents[2]
CHILDREN = 4
PER_PROCESS = 60


def _run(url: str, end: str, tmp_path: Path) -> tuple[list[dict], str]:
    done = subprocess.run(
        [sys.executable, str(PROGRAM), url, str(CHILDREN), str(PER_PROCESS), end],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env={**_env(), "RECALLTRACE_RUN_DIR": str(tmp_path / "run")},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert lines[-1] == {"children_exit": [0] * CHILDREN}, done.stderr[-3000:]
    return lines[:-1], done.stderr


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}


@pytest.mark.parametrize("end", ["exit", "os_exit"])
def test_children_forked_from_c_store_every_request_under_its_own_id(
    tmp_path: Path, end: str, database_url: str
) -> None:
    url = database_url
    processes, stderr = _run(url, end, tmp_path)
    assert len(processes) == CHILDREN + 1
    assert len({p["pid"] for p in processes}) == CHILDREN + 1
    ran = {trace_id: question for p in processes for trace_id, question in p["requests"]}
    answered = sum(len(p["requests"]) for p in processes)
    # No id drawn twice, in any process.
    assert len(ran) == answered == (CHILDREN + 1) * PER_PROCESS
    engine = create_engine_from_url(url)
    try:
        with engine.connect() as conn:
            rows = dict(
                conn.execute(
                    text("SELECT trace_id, user_input FROM traces WHERE service_name = 'c-fork'")
                ).all()
            )
    finally:
        engine.dispose()
    # Every request answered is stored, under the id it ran under, and nothing was dropped.
    assert said_dropped(stderr) == 0, stderr[-3000:]
    assert rows == ran
