"""A SQLite file deleted or replaced while the application and a worker use it: both notice,
reopen the file now at the path, say so once, and what they write from then on is there (before,
they kept writing into the unlinked file and every record was lost, with flush() saying True)."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

import recalltrace
from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import upgrade
from tests.support import ROOT
from tests.support.tracer_helpers import make_traced


@recalltrace.retrieval
def search(query: str) -> list[dict[str, Any]]:
    return [{"id": "doc_0", "content": "Paris is the capital of France."}]


@recalltrace.rag("replaced", reference_context_ids_param="ids")
def answer(question: str, ids: list[str]) -> str:
    search(question)
    return "Paris."


def count(url: str, table: str, where: str = "") -> int:
    engine = create_engine_from_url(url)
    try:
        with engine.connect() as conn:
            return int(conn.scalar(text(f"SELECT count(*) FROM {table} {where}")) or 0)
    finally:
        engine.dispose()


def wait_for(check: Any, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def test_the_app_and_a_worker_follow_a_deleted_then_replaced_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    path = tmp_path / "recalltrace.db"
    url = f"sqlite:///{path}"
    upgrade(url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    worker = subprocess.Popen(
        [sys.executable, "-m", "recalltrace", "worker", "--database-url", url, "--metric",
         "id_based_context_recall", "--poll-interval", "0.2", "--no-progress"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    make_traced(open_storage=True, database_url=url, flush_interval=0.1)
    try:
        for _ in range(20):
            answer("What is the capital of France?", ["doc_0"])
        assert recalltrace.flush(15.0)
        assert wait_for(lambda: count(url, "scores") == 20)

        # Deleted (with its journal files): the next records go to a new file at the path,
        # with the schema recreated, and the worker scores them there.
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        for _ in range(15):
            answer("What is the capital of France?", ["doc_0"])
        assert recalltrace.flush(15.0)
        assert path.exists()
        assert count(url, "traces") == 15
        assert wait_for(lambda: count(url, "scores") == 15), "the worker did not follow"

        # Replaced by another recalltrace database moved over it.
        other = tmp_path / "other.db"
        upgrade(f"sqlite:///{other}")
        os.replace(other, path)
        for suffix in ("-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        for _ in range(10):
            answer("What is the capital of France?", ["doc_0"])
        assert recalltrace.flush(15.0)
        assert count(url, "traces") == 10
        assert wait_for(lambda: count(url, "scores") == 10), "the worker did not follow"
    finally:
        recalltrace.shutdown(5.0)
        worker.send_signal(signal.SIGTERM)
        _, worker_err = worker.communicate(timeout=60)
    said = [
        r.getMessage() for r in caplog.records if "while in use; reopening it" in r.getMessage()
    ]
    # Each change is said once: the deletion (as "replaced" when the worker recreated the file
    # before the app's writer looked, on a loaded host) and the replacement.
    deleted = [line for line in said if "was deleted while in use" in line]
    assert len(deleted) <= 1 and len(said) == 2, caplog.text
    assert any("was replaced while in use" in line for line in said)
    # The worker sees the file the app recreated first, or the gap before it: either way it
    # says it reopened the file.
    assert "while in use; reopening it" in worker_err, worker_err
    shutil.rmtree(tmp_path, ignore_errors=True)
