"""What a newcomer trips on in the first hour with the command line: global options before the
subcommand, a mistyped option, out-of-range numbers, ``jobs retry`` on a job that is not
failed, the worker's start, a missing database, an unreachable judge in the demo, and
``set_reference`` under a refused configuration. Each ends in a result or one line naming the
problem, never a traceback, never a hang."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import textwrap
from contextlib import redirect_stderr, redirect_stdout
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.engine import make_url

from recalltrace.cli import main
from recalltrace.scorers import ScoreResult
from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import upgrade
from recalltrace.storage.models import Trace
from tests.support import ROOT
from tests.support.cli import run_cli
from tests.support.factories import make_repository, make_trace
from tests.support.judge_server import JudgeServer, Reply

pytestmark = pytest.mark.timeout(300)


def cli(*args: str) -> tuple[int, str, str]:
    """``recalltrace ARGS`` in this process: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse refusing an argument
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "error:" in line]


def closed_port() -> int:
    """A 127.0.0.1 port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def subprocess_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}


@pytest.fixture
def stored(tmp_path: Path) -> tuple[str, list[int], str]:
    """A SQLite database with two scored traces: its URL, the ids of two done jobs, and one
    trace id."""
    url = f"sqlite:///{tmp_path / 'first.db'}"
    upgrade(url)
    repo = make_repository(create_engine_from_url(url), metrics=["id_based_context_recall"])
    traces = [make_trace(reference_context_ids=["doc_0"]) for _ in range(2)]
    repo.write_traces(traces)
    jobs = repo.claim_jobs("w", limit=10, lease=timedelta(minutes=1))
    for job in jobs:
        result: Any = ScoreResult(metric=job.metric, value=1.0, status="scored", reason="ok")
        repo.finish_job(job, result)
    repo.dispose()
    return url, [job.id for job in jobs], traces[0].trace_id


def test_the_database_url_may_come_before_the_subcommand(
    stored: tuple[str, list[int], str],
) -> None:
    url, _jobs, _trace = stored
    code, out, err = cli("--database-url", url, "scores", "summary", "--format", "json")
    assert code == 0, err
    assert '"count": 2' in out
    # The subcommand's own option wins when both are given.
    code, _out, err = cli("--database-url", "sqlite:///nowhere.db", "jobs", "counts",
                          "--database-url", url)  # fmt: skip
    assert code == 0, err


def test_a_metric_version_has_a_name_of_its_own(stored: tuple[str, list[int], str]) -> None:
    url, _jobs, _trace = stored
    metric = ["--metric", "id_based_context_recall", "--format", "json"]
    by_name = cli("scores", "summary", *metric, "--metric-version", "1", "--database-url", url)
    assert by_name[0] == 0 and json.loads(by_name[1]), by_name
    # The old spelling is refused, in one line naming the new one: --version is the program's.
    old_code, old_out, old_err = cli(
        "scores", "summary", *metric, "--version", "1", "--database-url", url
    )
    assert old_code == 2 and old_out == ""
    assert "the version of a metric is --metric-version V" in error_lines(old_err)[0]
    code, out, _err = cli("--version")
    assert code == 0 and out.startswith("recalltrace "), out


def test_a_mistyped_option_is_named_by_its_subcommand(stored: tuple[str, list[int], str]) -> None:
    url, _jobs, _trace = stored
    code, _out, err = cli("worker", "--once", "--metrics", "id_based_context_recall",
                          "--database-url", url)  # fmt: skip
    assert code == 2
    (line,) = error_lines(err)
    assert line.startswith("recalltrace worker: error:"), line
    assert "--metrics" in line and "did you mean --metric" in line
    assert "usage: recalltrace worker" in err  # the subcommand's usage, not the top level's


@pytest.mark.parametrize(
    "argv",
    [
        ["trace", "show", "TRACE", "--max-chars", "-1"],
        ["doctor", "--limit", "-1"],
        ["doctor", "--limit", "9223372036854775808"],
        ["scores", "worst", "--limit", "10000000"],
        ["jobs", "list", "--limit", "0"],
        ["demo", "--top-k", "0"],
    ],
)
def test_numbers_out_of_range_are_one_line(
    argv: list[str], stored: tuple[str, list[int], str]
) -> None:
    url, _jobs, trace_id = stored
    argv = [trace_id if item == "TRACE" else item for item in argv]
    code, _out, err = cli(*argv, "--database-url", url)
    assert code == 2, err
    (line,) = error_lines(err)
    assert "expected a whole number from" in line, line
    assert "Traceback" not in err


def test_retrying_a_job_that_is_not_failed_names_its_state(
    stored: tuple[str, list[int], str],
) -> None:
    url, jobs, _trace = stored
    code, _out, err = cli("jobs", "retry", "--id", str(jobs[0]), "--id", "987654",
                          "--database-url", url)  # fmt: skip
    assert code == 2
    (line,) = error_lines(err)
    assert f"job {jobs[0]} is done, not failed" in line, line
    assert "job 987654 does not exist" in line, line
    assert "was not failed jobs" not in line


def test_the_worker_says_its_start_once(stored: tuple[str, list[int], str]) -> None:
    url, _jobs, _trace = stored
    done = run_cli("worker", "--once", "--no-progress", "--database-url", url,
                   cwd=ROOT, env=subprocess_env())  # fmt: skip
    assert done.returncode == 0, done.stderr
    both = done.stdout + done.stderr
    assert both.count(" scoring ") == 1, both
    assert both.count("judge_context_recall") == 1, both  # "not configured: ..." once


def test_a_worker_on_a_missing_database_exits_with_one_line(postgres_url: str) -> None:
    missing = make_url(postgres_url).set(database="rt_no_such_database_anywhere")
    done = run_cli("worker", "--no-progress",
                   "--database-url", missing.render_as_string(hide_password=False),
                   cwd=ROOT, env=subprocess_env())  # fmt: skip
    assert done.returncode == 2, done.stderr
    (line,) = error_lines(done.stderr)
    assert "does not exist" in line and "check --database-url" in line, line
    assert "Traceback" not in done.stderr


def test_a_worker_waits_for_a_database_that_does_not_answer_then_exits() -> None:
    url = f"postgresql+psycopg://postgres@127.0.0.1:{closed_port()}/recalltrace"
    done = run_cli("worker", "--no-progress", "--database-wait", "3", "--database-url", url,
                   cwd=ROOT, env=subprocess_env())  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2, done.stderr  # one "waiting" line (a minute did not pass), one error
    assert lines[0].startswith("waiting for the database at"), lines
    assert "cannot reach the database" in lines[1] and "the worker did not start" in lines[1], lines


def _count_traces(url: str) -> int:
    engine = create_engine_from_url(url)
    try:
        with engine.connect() as conn:
            if not conn.execute(text("SELECT name FROM sqlite_master WHERE name='traces'")).all():
                return 0
            return int(conn.scalar(select(func.count()).select_from(Trace)) or 0)
    finally:
        engine.dispose()


def test_the_demo_refuses_an_unreachable_judge_before_tracing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    done = run_cli("demo", "--database-url", url, "--judge-model", "openai/llama3.1",
                   "--judge-api-base", f"http://127.0.0.1:{closed_port()}/v1",
                   cwd=ROOT, env={**subprocess_env(), "OPENAI_API_KEY": "test"})  # fmt: skip
    assert done.returncode != 0, done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert "cannot reach the judge" in last and "127.0.0.1" in last, done.stderr
    assert _count_traces(url) == 0  # nothing was traced for a run that could not score


def test_the_demo_exits_non_zero_when_its_judge_was_paused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    with JudgeServer() as judge:
        judge.handler = lambda _body: Reply.error(401)
        env = {**subprocess_env(), "OPENAI_API_KEY": "test", "COLUMNS": "200"}
        done = run_cli("demo", "--database-url", url, "--judge-model", "openai/gpt-4o-mini",
                       "--judge-api-base", judge.base_url, cwd=ROOT, env=env)  # fmt: skip
    assert done.returncode == 3, (done.stdout[-2000:], done.stderr[-2000:])
    last = done.stdout.strip().splitlines()[-1]
    assert "The judge was paused" in last and "LLM variants are not scored" in last, last


def test_set_reference_never_raises_a_refused_configuration(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import logging
        import recalltrace
        from recalltrace.tracer import _api

        logging.basicConfig()

        @recalltrace.rag
        def answer(question):
            recalltrace.set_reference("ab" * 16, reference="the reference")
            recalltrace.set_reference("cd" * 16, reference="another")
            return "answered"

        print(answer("q"))
        print("ignored", _api.references_ignored)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**subprocess_env(), "RECALLTRACE_SAMPLE_RATE": "2",
             "RECALLTRACE_DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["answered", "ignored", "2"], done.stdout
    assert "Traceback" not in done.stderr
    assert done.stderr.count("set_reference() ignores references") == 1, done.stderr
