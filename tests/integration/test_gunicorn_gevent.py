"""Every request a real gunicorn with gevent workers answered is its own stored row.

gunicorn's gevent worker monkey-patches the standard library (``threading`` included) in each
worker, after the fork. With ``--preload`` the application, and so ``configure()``, was loaded
in the master before that, unpatched; without it, each worker loads it after patching. Four
client threads send 200 requests (each with a token of its own), gunicorn is stopped with
SIGTERM, and a separate configured process attaches each token as the late reference of its
record id. Every request must be answered and stored as its own row with its own reference,
and every worker must end by itself on SIGTERM (``Worker exiting``), not be killed by the
master when ``--graceful-timeout`` runs out. ``--timeout 10``: a worker that hangs is killed
(WORKER TIMEOUT) within seconds, and each client gives up after two requests in a row went
unanswered, so a hang fails the test fast.
"""

from __future__ import annotations

import re
import shutil
import signal
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.support.answers import (
    Load,
    Server,
    check,
    free_port,
    gunicorn_options,
    traced_env,
    wait_ready,
)

pytest.importorskip("gunicorn")
pytest.importorskip("gevent")

# The real-system stage (gunicorn with gevent workers, under load).
pytestmark = pytest.mark.realsystem

APP = Path(__file__).with_name("traced_app.py")
CLIENTS = 4
PER_CLIENT = 50
BOOTED = re.compile(r"Booting worker with pid: (\d+)")
EXITED = re.compile(r"Worker exiting \(pid: (\d+)\)")


@pytest.mark.parametrize("preload", [True, False], ids=["preload", "no-preload"])
def test_every_request_is_answered_and_stored(
    tmp_path: Path, pg_engine: Engine, postgres_url: str, preload: bool
) -> None:
    shutil.copy(APP, tmp_path / "traced_app.py")
    port = free_port()
    env = traced_env(tmp_path, importable=tmp_path, TRACED_APP_DATABASE_URL=postgres_url)
    command = [sys.executable, "-m", "gunicorn", *(["--preload"] if preload else [])]
    command += ["--workers", "2", "-k", "gevent", "--bind", f"127.0.0.1:{port}"]
    command += ["--timeout", "10", "--graceful-timeout", "30", "--log-level", "info"]
    command += gunicorn_options()
    command += ["traced_app:application"]
    with Server(command, cwd=tmp_path, env=env, log=tmp_path / "gunicorn.log") as server:
        wait_ready(port, server)
        load = Load(port, "gevent", CLIENTS, PER_CLIENT, timeout=15, alive=server.alive)
        load.run()
        if load.unanswered or len(load.answers) != CLIENTS * PER_CLIENT:
            # Hung workers: no graceful stop to wait for (it would wait out --graceful-timeout).
            server.kill()
            stderr = server.output()
            raise AssertionError(
                f"{len(load.answers)} of {CLIENTS * PER_CLIENT} answered, {load.unanswered} "
                f"unanswered, {stderr.count('WORKER TIMEOUT')} worker timeout(s)\n"
                f"{stderr[-3000:]}"
            )
        server.stop(signal.SIGTERM, 120, "gunicorn")
    stderr = server.output()
    assert server.returncode == 0, stderr[-3000:]
    outcome, references = check(pg_engine, postgres_url, load.answers, stderr, env)
    problems = outcome.storage_up_problems()
    booted, exited = set(BOOTED.findall(stderr)), set(EXITED.findall(stderr))
    if not booted or booted != exited:
        problems.append(
            f"workers {sorted(booted - exited)} did not end by themselves on SIGTERM (the master "
            "killed them when --graceful-timeout ran out)"
        )
    assert not problems, outcome.report(problems, stderr, references)
