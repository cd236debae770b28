"""Process and database helpers of the fault-injection suite."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, func, select, text
from sqlalchemy.engine import make_url

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.models import JobStatus, Score, ScoringJob
from tests.support import ROOT


def with_application_name(url: str, name: str) -> str:
    """``url`` with ``application_name`` set, so a test can find these connections."""
    return (
        make_url(url)
        .update_query_dict({"application_name": name})
        .render_as_string(hide_password=False)
    )


def admin_engine(url: str) -> Engine:
    """An autocommit engine on the server's ``postgres`` database (to act on ``url``'s)."""
    return create_engine_from_url(
        make_url(url).set(database="postgres").render_as_string(hide_password=False),
        isolation_level="AUTOCOMMIT",
        pool_size=1,
        max_overflow=0,
    )


class ConnectionKiller:
    """Terminates the backends of one database whose ``application_name`` is in ``names``,
    and can refuse new connections to that database for a while (an outage that touches no
    other database of the shared server)."""

    def __init__(self, url: str, names: tuple[str, ...]) -> None:
        self.database = make_url(url).database
        self.names = names
        self.engine = admin_engine(url)
        self.killed = 0
        self.outages = 0
        self.hangs = 0

    def kill(self) -> int:
        with self.engine.connect() as conn:
            count = conn.scalar(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = :db AND application_name = ANY(:names)"
                    " AND pid <> pg_backend_pid()"
                ),
                {"db": self.database, "names": list(self.names)},
            )
        self.killed += int(count or 0)
        return int(count or 0)

    def allow_connections(self, allowed: bool) -> None:
        with self.engine.connect() as conn:
            conn.execute(
                text(
                    f'ALTER DATABASE "{self.database}" '
                    f"WITH ALLOW_CONNECTIONS {'true' if allowed else 'false'}"
                )
            )

    def outage(
        self, seconds: float, every: float = 0.1, until: Callable[[], bool] | None = None
    ) -> None:
        """Refuse connections and kill the open ones for ``seconds`` (or, given ``until``,
        until it returns true), then allow them."""
        self.allow_connections(False)
        self.outages += 1
        try:
            end = time.monotonic() + seconds
            while not until() if until is not None else time.monotonic() < end:
                self.kill()
                time.sleep(every)
        finally:
            self.allow_connections(True)

    def blips(self, seconds: float, every: float) -> None:
        """Kill the connections every ``every`` seconds for ``seconds``."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.kill()
            time.sleep(every)

    def hang(self, url: str, seconds: float, until: Callable[[], bool] | None = None) -> None:
        """Make every write to ``traces`` wait ``seconds`` (or, given ``until``, until it
        returns true): a transaction holds the table's ACCESS EXCLUSIVE lock (a database that
        hangs instead of failing)."""
        engine = create_engine_from_url(url, pool_size=1, max_overflow=0)
        try:
            with engine.begin() as conn:
                conn.execute(text("LOCK TABLE traces IN ACCESS EXCLUSIVE MODE"))
                self.hangs += 1
                if until is None:
                    time.sleep(seconds)
                else:
                    while not until():
                        time.sleep(0.01)
        finally:
            engine.dispose()

    def close(self) -> None:
        self.allow_connections(True)
        self.engine.dispose()


def python_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RECALLTRACE_DATABASE_URL", None)
    env.pop("PYTEST_CURRENT_TEST", None)
    env["OPENAI_API_KEY"] = "test-key"
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def spawn(args: list[str], **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env=python_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def start_judge(*args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.judge_server", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.match(r"READY (\S+)", line)
    assert match, f"judge server did not start: {line!r}"
    return proc, match.group(1)


def worker_args(url: str, *extra: str, judge_url: str | None = None) -> list[str]:
    args = ["-m", "recalltrace", "worker", "--database-url", url, "--no-progress"]
    if judge_url is not None:
        args += ["--judge-model", "openai/test-judge", "--judge-api-base", judge_url]
    return args + list(extra)


def last_json(output: str) -> dict[str, Any]:
    for line in reversed(output.strip().splitlines()):
        if line.startswith("{"):
            result: dict[str, Any] = json.loads(line)
            return result
    raise AssertionError(f"no JSON summary in the output:\n{output[-2000:]}")


def job_statuses(engine: Engine, metrics: list[str] | None = None) -> dict[str, int]:
    stmt = select(ScoringJob.status, func.count()).group_by(ScoringJob.status)
    if metrics is not None:
        stmt = stmt.where(ScoringJob.metric.in_(metrics))
    with engine.connect() as conn:
        return {status: int(n) for status, n in conn.execute(stmt)}


def score_keys(engine: Engine) -> list[tuple[str, str, str]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(select(Score.trace_id, Score.metric, Score.status))]


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def unfinished(engine: Engine, metrics: list[str] | None = None) -> int:
    statuses = job_statuses(engine, metrics)
    return sum(statuses.get(s, 0) for s in (JobStatus.QUEUED, JobStatus.RUNNING))


class Background(threading.Thread):
    """Runs ``target`` in a thread and re-raises its exception on ``join_checked``."""

    def __init__(self, target: Callable[[], None]) -> None:
        super().__init__(daemon=True)
        self._target_fn = target
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._target_fn()
        except BaseException as exc:
            self.error = exc

    def join_checked(self, timeout: float) -> None:
        self.join(timeout)
        assert not self.is_alive(), "background thread did not finish"
        if self.error is not None:
            raise self.error
