"""``worker --once`` exit codes a scheduler can trust (cron, CI): 0 when the run did its work,
3 when the judge was paused, 4 when jobs failed for good."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import upgrade
from tests.support import ROOT
from tests.support.cli import run_cli
from tests.support.factories import make_repository, make_trace
from tests.support.judge_server import JudgeServer, Reply

METRIC = "judge_context_recall"


@pytest.fixture
def judge() -> Iterator[JudgeServer]:
    with JudgeServer() as server:
        yield server


def run_once(tmp_path: Path, judge: JudgeServer, *extra: str) -> subprocess.CompletedProcess[str]:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    upgrade(url)
    repo = make_repository(create_engine_from_url(url), metrics=[METRIC])
    repo.write_traces([make_trace() for _ in range(3)])
    repo.dispose()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    env["OPENAI_API_KEY"] = "test-key"
    command = ["worker", "--once", "--database-url", url]
    command += ["--metric", METRIC, "--no-progress", "--judge-model", "openai/test-judge"]
    command += ["--judge-api-base", judge.base_url, "--judge-max-retries", "0", *extra]
    return run_cli(*command, cwd=ROOT, env=env)


def test_a_clean_run_exits_0(tmp_path: Path, judge: JudgeServer) -> None:
    done = run_once(tmp_path, judge)
    assert done.returncode == 0, done.stderr
    assert "scored 3" in done.stdout


def test_a_paused_judge_exits_3(tmp_path: Path, judge: JudgeServer) -> None:
    def refuse(request: dict[str, Any]) -> Reply:
        return Reply.error(401)

    judge.handler = refuse
    done = run_once(tmp_path, judge)
    assert done.returncode == 3, done.stderr
    assert "exit 3: the judge was paused" in done.stderr


def test_jobs_failed_for_good_exit_4(tmp_path: Path, judge: JudgeServer) -> None:
    def nonsense(request: dict[str, Any]) -> Reply:
        return Reply.raw("this is not JSON")

    judge.handler = nonsense
    done = run_once(tmp_path, judge, "--max-attempts", "1")
    assert done.returncode == 4, done.stderr
    assert "exit 4: 3 job(s) failed for good" in done.stderr


def test_a_judge_nothing_listens_for_pauses_in_one_line_and_exits_3(tmp_path: Path) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again when the block ends: nothing listens

    class Nowhere:
        base_url = f"http://127.0.0.1:{port}/v1"

    # A worker that kept waiting would never return (the test's timeout ends it).
    done = run_once(tmp_path, Nowhere(), "--judge-timeout", "5")  # type: ignore[arg-type]
    assert done.returncode == 3, done.stderr
    paused = [line for line in done.stderr.splitlines() if "JUDGE PAUSED for" in line]
    assert len(paused) == 1
    assert "cannot reach the judge" in paused[0] and f"127.0.0.1:{port}" in paused[0]
