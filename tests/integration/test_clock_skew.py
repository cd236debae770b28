"""An application whose clock runs a day ahead (a container with a bad clock) traces into
Postgres; a worker with a correct clock must score every job at once.

Due times come from the database's clock, not from the writing process's: the app runs under
libfaketime (``faketime -f +1d``), a real skew of the whole process, and the worker and
``recalltrace doctor`` run with the machine's clock.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import upgrade
from recalltrace.storage.models import Score, ScoringJob, Trace
from tests.support import ROOT
from tests.support.postgres import empty_database

# The real-system stage (an app run under faketime).
pytestmark = [pytest.mark.postgres, pytest.mark.realsystem]

METRIC = "id_based_context_recall"
REQUESTS = 12

APP = textwrap.dedent(
    """
    import recalltrace

    recalltrace.configure(service_name="skewed-api", sample_rate=1.0, flush_interval=0.05)


    @recalltrace.retrieval
    def search(query):
        return [{"id": "kb-1", "content": "Refunds within 30 days."}, {"id": "kb-2"}]


    @recalltrace.rag("skewed-app", reference_context_ids_param="expected_ids")
    def answer(question, expected_ids=None):
        return search(question)[0]["content"]


    for index in range(int(__import__("sys").argv[1])):
        answer(f"question {index}", expected_ids=["kb-1"])
    assert recalltrace.flush(60), "flush did not complete"
    print("traced")
    """
)


def faketime() -> str:
    path = shutil.which("faketime")
    if path is None:
        message = "faketime is not installed (apt-get install faketime)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def environment(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKETIME")}
    env.update(
        RECALLTRACE_DATABASE_URL=url,
        RECALLTRACE_METRICS=METRIC,
        PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
    )
    return env


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "recalltrace", *args, "--database-url", url],
        capture_output=True,
        text=True,
        env=environment(url),
        cwd=ROOT,
        timeout=180,
    )


@pytest.fixture
def migrated_database() -> Iterator[str]:
    with empty_database("rt_skew") as url:
        upgrade(url)
        yield url


def test_jobs_of_an_app_a_day_ahead_are_due_now(migrated_database: str, tmp_path: Path) -> None:
    url = migrated_database
    script = tmp_path / "skewed_app.py"
    script.write_text(APP)
    skewed = subprocess.run(
        [faketime(), "-f", "+1d", sys.executable, str(script), str(REQUESTS)],
        capture_output=True,
        text=True,
        env=environment(url),
        cwd=tmp_path,
        timeout=180,
    )
    assert skewed.returncode == 0 and "traced" in skewed.stdout, skewed.stderr

    engine = create_engine_from_url(url)
    try:
        with engine.connect() as conn:
            # The skew is real: the app stamped its requests a day ahead of the database.
            ahead = conn.scalar(
                select(func.count())
                .select_from(Trace)
                .where(Trace.started_at > func.now() + func.make_interval(0, 0, 0, 0, 20))
            )
            assert ahead == REQUESTS
            # The jobs are due by the database's clock, not by the app's.
            parked = conn.scalar(
                select(func.count()).select_from(ScoringJob).where(ScoringJob.run_at > func.now())
            )
            assert parked == 0

        worker = cli(url, "worker", "--once", "--metric", METRIC, "--no-progress")
        assert worker.returncode == 0, worker.stderr
        with engine.connect() as conn:
            scored = conn.scalar(
                select(func.count())
                .select_from(Score)
                .where(Score.metric == METRIC, Score.status == "scored")
            )
            left = conn.scalar(
                select(func.count())
                .select_from(ScoringJob)
                .where(ScoringJob.status.in_(["queued", "running"]))
            )
        assert (scored, left) == (REQUESTS, 0)
    finally:
        engine.dispose()

    # doctor names the skew: traces stamped ahead of the database's clock, with the count and
    # what to do.
    doctor = cli(url, "doctor")
    assert doctor.returncode == 0, doctor.stderr
    assert "Traceback" not in doctor.stderr
    lines = [line for line in doctor.stdout.splitlines() if "ahead of the database" in line]
    assert len(lines) == 1, doctor.stdout
    assert f"{REQUESTS} trace(s)" in lines[0] and "clock" in lines[0]


def test_doctor_names_parked_jobs_and_releases_them(migrated_database: str) -> None:
    """Jobs an older recalltrace parked a day ahead (it took due times from the application's
    clock): doctor counts them and says what to run; ``--release-parked`` makes them due."""
    from tests.support.factories import make_repository, make_trace

    url = migrated_database
    engine = create_engine_from_url(url)
    try:
        repo = make_repository(engine, metrics=[METRIC])
        repo.write_traces(
            [
                make_trace(trace_id=f"t{index}", reference_context_ids=["doc_0"])
                for index in range(5)
            ]
        )
        with engine.begin() as conn:
            conn.execute(
                ScoringJob.__table__.update()
                .where(ScoringJob.trace_id.in_(["t0", "t1", "t2"]))
                .values(run_at=func.now() + func.make_interval(0, 0, 0, 1))
            )
        clean = cli(url, "doctor")
        assert clean.returncode == 0, clean.stderr
        lines = [line for line in clean.stdout.splitlines() if "parked" in line]
        assert len(lines) == 1, clean.stdout
        assert lines[0].startswith("clock: 3 queued job(s)")
        assert "recalltrace doctor --release-parked" in lines[0]

        as_json = cli(url, "doctor", "--format", "json")
        assert as_json.returncode == 0 and as_json.stdout.lstrip().startswith("{")
        assert "clock: 3 queued job(s)" in as_json.stderr

        released = cli(url, "doctor", "--release-parked")
        assert "clock: made 3 parked job(s) due now" in released.stdout, released.stdout
        with engine.connect() as conn:
            parked = conn.scalar(
                select(func.count()).select_from(ScoringJob).where(ScoringJob.run_at > func.now())
            )
        assert parked == 0
        again = cli(url, "doctor")
        assert "clock: no trace or queued job is ahead of the database's clock" in again.stdout
    finally:
        engine.dispose()
