"""The command line under hostile input, and the database password kept out of every output.

Hostile values go through every filter of every history and job command, in process (the real
``recalltrace.cli.main``) so that hundreds of combinations stay fast: each ends with a result or a
one-line error (exit 0, 1 or 2), never an exception; the tables are unchanged afterwards; and a
value that looks like SQL is matched literally, as data. Then the installed entry point is run with
a password in the URL, against a database that works and against ones that do not: the password
appears in no output and no log line."""

from __future__ import annotations

import itertools
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.engine import make_url

from recalltrace.cli import main
from recalltrace.scorers import ScoreResult
from recalltrace.storage.migrate import upgrade
from recalltrace.storage.models import Score, ScoringJob, Trace
from recalltrace.storage.repository import Repository
from tests.reliability.helpers import ROOT, python_env
from tests.support import cli
from tests.support.factories import make_repository, make_trace

pytestmark = pytest.mark.postgres

HOSTILE_APP = "x' OR '1'='1"
HOSTILE = [
    HOSTILE_APP,
    "'; DROP TABLE traces; --",
    '" OR ""="',
    ") UNION SELECT rolpassword FROM pg_authid --",
    "%",
    "_",
    "\\",
    "$1",
    ":app",
    "a\nb",
    "\u202e-rtl\u200b",
    "x" * 5000,
    "a\udcffb",  # a non-UTF-8 byte in argv, as Python decodes it
    # numbers where numbers go, out of every range
    "-1",
    "0",
    "nan",
    "inf",
    "1e309",
    "99999999999999999999",
]
FILTERS: dict[str, list[str]] = {
    "scores summary": ["--app", "--metric", "--since", "--until", "--bucket", "--format"],
    "scores worst": ["--app", "--metric", "--since", "--until", "--limit", "--format"],
    "check": ["--app", "--metric", "--since", "--until", "--min", "--min-count"],
    "jobs list": ["--app", "--metric", "--since", "--until", "--stuck-after", "--limit"],
    "jobs retry": ["--app", "--metric", "--id"],
    "backfill": ["--app", "--metric", "--since", "--until"],
}
REQUIRED = {"check": {"--metric": "id_based_context_recall", "--min": "0.5"}}


def run_cli(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse refusing a value
        return int(exc.code or 0)


def counts(repo: Repository) -> dict[str, int]:
    with repo.engine.connect() as conn:
        return {
            model.__tablename__: int(conn.scalar(select(func.count()).select_from(model)) or 0)
            for model in (Trace, ScoringJob, Score)
        }


@pytest.fixture
def stored(pg_engine: Any) -> Repository:
    repo = make_repository(pg_engine, metrics=["id_based_context_recall"])
    traces = [make_trace(app_name=name, reference_context_ids=["doc_0"]) for name in
              ("support-bot", "support-bot", HOSTILE_APP)]  # fmt: skip
    repo.write_traces(traces)
    jobs = repo.claim_jobs("w", limit=10, lease=__import__("datetime").timedelta(minutes=5))
    repo.finish_jobs(
        [
            (
                job,
                ScoreResult(
                    metric=job.metric,
                    value=1.0 / 3,
                    status="scored",
                    reason="r",
                    version=job.version,
                ),
            )
            for job in jobs
        ]
    )
    return repo


def test_hostile_values_through_every_filter(
    stored: Repository, postgres_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = counts(stored)
    outcomes: dict[int, int] = {}
    for (command, options), value in itertools.product(FILTERS.items(), HOSTILE):
        for option in options:
            required = {**REQUIRED.get(command, {}), option: value}
            argv = [*command.split(), "--database-url", postgres_url]
            argv += [part for pair in required.items() for part in pair]
            code = run_cli(argv)
            assert code in (0, 1, 2), (argv, code)
            outcomes[code] = outcomes.get(code, 0) + 1
    # The worker's numbers: each value here must be refused before anything starts (a worker
    # given one of them would otherwise run, or crash on its first lease).
    worker_options = ["--lease", "--poll-interval", "--grace-period", "--judge-timeout",
                      "--concurrency", "--batch-size", "--max-attempts"]  # fmt: skip
    for option, value in itertools.product(worker_options, ["nan", "inf", "1e309", "-1", "0"]):
        argv = ["worker", "--once", "--database-url", postgres_url, option, value]
        assert run_cli(argv) == 2, argv
    # trace show takes the id itself.
    for value in HOSTILE:
        assert run_cli(["trace", "show", value, "--database-url", postgres_url]) == 2
    output = capsys.readouterr()
    assert "Traceback" not in output.out + output.err
    # Only ``backfill --app "x' OR '1'='1"`` changed anything: it matched that app's one trace
    # literally and created its five missing jobs.
    assert counts(stored) == {**before, "scoring_jobs": before["scoring_jobs"] + 5}
    with stored.engine.connect() as conn:
        apps = conn.scalars(
            select(Trace.app_name)
            .join(ScoringJob, ScoringJob.trace_id == Trace.trace_id)
            .where(ScoringJob.metric != "id_based_context_recall")
        ).all()
    assert apps == [HOSTILE_APP] * 5
    assert outcomes.get(0, 0) > 0 and outcomes.get(2, 0) > 0, outcomes


def test_sql_looking_values_match_literally(
    stored: Repository, postgres_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    argv = ["scores", "summary", "--database-url", postgres_url, "--format", "json"]
    assert run_cli([*argv, "--app", HOSTILE_APP]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["count"] for row in _rows(rows)] == [1]
    for pattern in ("%", "_", "' OR 1=1 --"):
        assert run_cli([*argv, "--app", pattern]) == 0
        assert _rows(json.loads(capsys.readouterr().out)) == []


def _rows(document: Any) -> list[dict[str, Any]]:
    if isinstance(document, dict):
        for key in ("rows", "buckets", "summary", "metrics"):
            if isinstance(document.get(key), list):
                return list(document[key])
    return list(document)


PASSWORD = "Zx9-SuperSecret-Pw"


def with_password(url: str, **parts: Any) -> str:
    return make_url(url).set(password=PASSWORD, **parts).render_as_string(hide_password=False)


def test_the_database_password_appears_in_no_output(
    stored: Repository, postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    working = with_password(postgres_url)  # trust authentication accepts any password
    urls = [
        working,
        with_password(postgres_url, database="rt_no_such_database"),
        with_password(postgres_url, port=1),
        working.replace(":5432/", ":notaport/"),
        working.replace("postgresql+psycopg", "mysql"),
    ]
    commands = [
        ["db", "current"],
        ["scores", "summary"],
        ["jobs", "list"],
        ["trace", "show", "0" * 31 + "1"],
        ["check", "--metric", "id_based_context_recall", "--min", "0.1"],
    ]
    caplog.set_level(logging.DEBUG)
    for url, command in itertools.product(urls, commands):
        proc = cli.run_cli("-v", *command, "--database-url", url, cwd=ROOT, env=python_env())
        shown = proc.stdout + proc.stderr
        assert PASSWORD not in shown, (command, url, shown)
        assert "Traceback" not in shown, (command, url, shown)
        assert proc.returncode in (0, 1, 2), (command, url, shown)
    # The worker names a database that refuses it at start in one line, and ends.
    worker = cli.run_cli("-v", "worker", "--poll-interval", "0.2",
                         "--metric", "id_based_context_recall", "--database-url", urls[1],
                         cwd=ROOT, env=python_env())  # fmt: skip
    assert worker.returncode == 2, worker.stderr
    assert "does not exist" in worker.stderr  # it did meet the failure...
    assert PASSWORD not in worker.stdout + worker.stderr  # ...and did not show the password
    assert "Traceback" not in worker.stderr, worker.stderr
    # In process as well (the tracer's writer logging a storage failure).
    for url in urls:
        run_cli(["scores", "summary", "--database-url", url])
    with pytest.raises(Exception) as failure:
        from recalltrace.storage.db import create_engine_from_url

        with create_engine_from_url(urls[1]).connect() as conn:
            conn.execute(text("SELECT 1"))
    assert PASSWORD not in str(failure.value)
    assert PASSWORD not in caplog.text


def test_a_busy_prometheus_port_is_one_line(tmp_path: Path) -> None:
    import socket

    url = f"sqlite:///{tmp_path / 'busy.db'}"
    upgrade(url)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "recalltrace", "worker", "--once", "--database-url", url,
             "--prometheus-port", str(port)],
            cwd=ROOT, env=python_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(
        f"recalltrace: error: cannot serve Prometheus metrics on 127.0.0.1:{port}"
    )
    assert "choose another --prometheus-port" in line
