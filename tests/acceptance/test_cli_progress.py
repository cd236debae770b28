"""Progress bars appear when the command runs on a terminal, and only then."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

from recalltrace import open_repository
from tests.support import ROOT
from tests.support.factories import make_trace


def run_on_terminal(*args: str) -> tuple[int, str]:
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "recalltrace", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=ROOT,
        env=env,
        close_fds=True,
    )
    os.close(slave)
    output = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed its side
            break
        if not chunk:
            break
        output += chunk
    os.close(master)
    return proc.wait(timeout=120), output.decode(errors="replace")


def test_worker_once_and_backfill_draw_a_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'progress.db'}"
    repo = open_repository(url, metrics=["id_based_context_recall"])
    repo.write_traces([make_trace(reference_context_ids=["doc_1"]) for _ in range(500)])
    repo.dispose()

    code, out = run_on_terminal(
        "worker", "--once", "--database-url", url, "--metric", "id_based_context_recall"
    )
    assert code == 0, out
    assert "━" in out and "500/500" in out  # the bar, counting this worker's due jobs
    assert "scored 500" in out
    assert "INFO" not in out

    code, out = run_on_terminal(
        "backfill", "--database-url", url, "--metric", "non_llm_context_recall"
    )
    assert code == 0, out
    assert "creating jobs" in out and "created 500 scoring jobs" in out

    piped = subprocess.run(
        [sys.executable, "-m", "recalltrace", "worker", "--once", "--database-url", url],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert piped.returncode == 0
    assert "━" not in piped.stdout + piped.stderr
