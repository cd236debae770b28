"""``worker --once`` against a judge that hangs, trickles or always fails: the run ends within
its deadline, each job is sent to the judge a bounded number of times, what is left unscored is
counted in the exit line, and calls that may have been billed (timed out after the request was
sent) count against ``--judge-budget``.

The worker runs as the ``recalltrace`` command, against the scripted OpenAI-compatible server
over real HTTP through LiteLLM.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import upgrade
from tests.support import ROOT
from tests.support.factories import make_repository, make_trace
from tests.support.judge_server import JudgeServer, Reply, auto_answer

METRIC = "judge_context_recall"
JOBS = 4


@pytest.fixture
def judge() -> Iterator[JudgeServer]:
    with JudgeServer() as server:
        yield server


def run_once(tmp_path: Path, judge: JudgeServer, *extra: str) -> subprocess.CompletedProcess[str]:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    upgrade(url)
    repo = make_repository(create_engine_from_url(url), metrics=[METRIC])
    repo.write_traces([make_trace() for _ in range(JOBS)])
    repo.dispose()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    env["OPENAI_API_KEY"] = "test-key"
    command = [sys.executable, "-m", "recalltrace", "worker", "--once", "--database-url", url]
    command += ["--metric", METRIC, "--no-progress", "--judge-model", "openai/test-judge"]
    command += ["--judge-api-base", judge.base_url, *extra]
    # Only turns a run that does not end into a failure: the judge below answers after ten
    # minutes at the earliest, and its timeout is as long, so only the deadline ends the run.
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def unscored(done: subprocess.CompletedProcess[str]) -> int:
    found = re.search(r"left unscored (\d+)", done.stdout)
    assert found, done.stdout + done.stderr
    return int(found.group(1))


def test_an_always_failing_judge_gets_each_job_a_bounded_number_of_times(
    tmp_path: Path, judge: JudgeServer
) -> None:
    judge.handler = lambda request: Reply.error(500)
    done = run_once(tmp_path, judge, "--judge-max-retries", "1")
    assert done.returncode == 3, done.stdout + done.stderr
    # One claim a run for a job that failed transiently: at most 1 + retries calls each.
    assert judge.call_count <= JOBS * 2, judge.call_count
    assert unscored(done) == JOBS
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("shape", ["hangs", "trickles"])
def test_a_hanging_or_trickling_judge_ends_the_run_at_its_deadline(
    tmp_path: Path, judge: JudgeServer, shape: str
) -> None:
    def slow(request: dict[str, Any]) -> Reply:
        answer = auto_answer(request)
        if shape == "hangs":
            return Reply(content=answer.content, delay=600)
        return Reply(content=answer.content, slow_body=600)

    judge.handler = slow
    done = run_once(
        tmp_path, judge, "--judge-timeout", "600", "--deadline", "6", "--grace-period", "2"
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert unscored(done) == JOBS
    assert "deadline" in done.stdout
    assert "Traceback" not in done.stderr


def test_calls_that_time_out_count_against_the_budget(tmp_path: Path, judge: JudgeServer) -> None:
    def hang(request: dict[str, Any]) -> Reply:
        return Reply(content=auto_answer(request).content, delay=600)

    judge.handler = hang
    done = run_once(
        tmp_path,
        judge,
        "--judge-timeout", "2", "--judge-max-retries", "0", "--concurrency", "1",
        "--judge-budget", "100 tokens/day",
    )  # fmt: skip
    # Each timed-out call was sent and may be billed: the first one spends the budget, so the
    # run stops sending after it instead of timing out once per job. (On a loaded machine the
    # one call may time out before it reaches the server.)
    assert judge.call_count <= 1, judge.call_count
    assert re.search(r"possibly billed ~[\d,]+ tokens", done.stdout), done.stdout
    assert unscored(done) == JOBS
