"""Every RQ job that ran a traced request is its own stored row, with its own late reference.

RQ's default ``Worker`` forks a work horse for each job; the horse runs the job and ends with
``os._exit(0)`` (``Worker.main_work_horse``), so neither ``atexit`` nor multiprocessing's exit
path runs in it. ``SpawnWorker`` starts each horse as a new interpreter (``posix_spawn``),
which runs the same ``main_work_horse`` and ends the same way. The jobs' module configures the
tracer at import: in each horse under the ``rq worker`` command, or in the worker's own process
when the application's script imports it before working (``rq_worker_program.py``).

Each case starts its own redis-server on a free port, enqueues jobs (each with a token of its
own), works them in burst mode, and reads each job's result (the record id it was traced under
and the horse's pid). A separate configured process then attaches each token as the late
reference of its record id. Every finished job must be a stored row of its own, with its own
reference, or a loss a tracer process said.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.support.answers import (
    Answer,
    Server,
    check,
    free_port,
    kill_group,
    require_tool,
    traced_env,
)

redis = pytest.importorskip("redis")
rq = pytest.importorskip("rq")

# The real-system stage (a redis-server and RQ workers).
pytestmark = pytest.mark.realsystem

HERE = Path(__file__).parent
QUEUE = "traced"
# Under ``rq worker`` each horse imports the jobs' module and configures the tracer, and a
# spawned horse is a new interpreter too: fewer jobs there.
CASES = {
    "worker": ("Worker", "rq worker", 60),
    "worker-configured-first": ("Worker", "script", 100),
    "spawn-worker": ("SpawnWorker", "rq worker", 20),
}


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A redis-server of this test's own, on a free port, without persistence."""
    server_path = require_tool("redis-server", "apt-get install redis-server")
    port = free_port()
    command = [server_path, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    command += ["--appendonly", "no", "--dir", str(tmp_path)]
    url = f"redis://127.0.0.1:{port}/0"
    with Server(command, cwd=tmp_path, env=dict(os.environ), log=tmp_path / "redis.log") as server:
        deadline = time.monotonic() + 30
        while True:
            assert server.alive(), server.output()[-2000:]
            try:
                with contextlib.closing(redis.Redis.from_url(url, socket_timeout=2)) as client:
                    if client.ping():
                        break
            except redis.exceptions.ConnectionError:
                pass
            assert time.monotonic() < deadline, f"redis-server did not start: {server.output()}"
            time.sleep(0.1)
        yield url
        server.stop(signal.SIGTERM, 30, "redis-server")


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_finished_job_is_its_own_stored_row(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    pg_engine: Engine,
    postgres_url: str,
    redis_url: str,
    case: str,
) -> None:
    worker_class, started_by, jobs = CASES[case]
    for name in ("traced_jobs.py", "rq_worker_program.py"):
        shutil.copy(HERE / name, tmp_path / name)
    env = traced_env(tmp_path, importable=tmp_path, TRACED_JOBS_DATABASE_URL=postgres_url)
    connection = redis.Redis.from_url(redis_url)
    request.addfinalizer(connection.close)
    queue = rq.Queue(QUEUE, connection=connection)
    tokens = [f"{case}-job{number}" for number in range(jobs)]
    enqueued = [queue.enqueue("traced_jobs.answer", token, result_ttl=3600) for token in tokens]
    if started_by == "rq worker":
        command = [sys.executable, "-m", "rq.cli", "worker", "--burst", "--url", redis_url]
        command += ["--quiet"]
        command += ["--worker-class", f"rq.worker.{worker_class}", QUEUE]
    else:
        command = [sys.executable, "rq_worker_program.py", redis_url, QUEUE, worker_class]
    worker = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, stderr = worker.communicate(timeout=240)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the burst worker did not end within 240 s ({case})") from exc
    finally:
        kill_group(worker)
    assert worker.returncode == 0, stderr[-3000:]
    answers = []
    for job in enqueued:
        job.refresh()
        if job.get_status() == rq.job.JobStatus.FINISHED:
            answers.append(Answer.from_json(job.return_value()))
    assert len(answers) == jobs, f"{len(answers)} of {jobs} jobs finished\n{stderr[-3000:]}"
    outcome, references = check(pg_engine, postgres_url, answers, stderr, env, tokens)
    problems = outcome.storage_up_problems()
    assert not problems, outcome.report(problems, stderr, references)
