"""The ``recalltrace db`` and ``demo`` commands as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import cli


def run_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``recalltrace ARGS`` (in process) without ``$RECALLTRACE_DATABASE_URL``, plus ``env``."""
    full_env = {k: v for k, v in os.environ.items() if k != "RECALLTRACE_DATABASE_URL"}
    full_env.update(env or {})
    return cli.run_cli(*args, cwd=cwd, env=full_env)


def test_db_upgrade_and_current_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    # Asking about a file that does not exist does not create it (a mistyped path).
    missing = run_cli("db", "current", "--database-url", url)
    assert missing.returncode == 2 and "no database file at" in missing.stderr
    assert not (tmp_path / "cli.db").exists()
    (tmp_path / "cli.db").touch()
    before = run_cli("db", "current", "--database-url", url)
    assert before.returncode == 1
    assert "not migrated" in before.stdout
    up = run_cli("db", "upgrade", "--database-url", url)
    assert up.returncode == 0, up.stderr
    after = run_cli("db", "current", "--database-url", url)
    assert after.returncode == 0
    assert "up to date" in after.stdout


@pytest.mark.postgres
def test_db_upgrade_and_current_on_postgres(postgres_url: str) -> None:
    result = run_cli("db", "upgrade", "--database-url", postgres_url)
    assert result.returncode == 0, result.stderr
    assert "at revision" in result.stdout
    assert run_cli("db", "current", "--database-url", postgres_url).returncode == 0


def test_unreachable_database_is_one_line_without_password() -> None:
    url = "postgresql+psycopg://alice:hunter2-secret@127.0.0.1:1/nowhere"
    result = run_cli("db", "current", "--database-url", url)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "hunter2-secret" not in result.stderr + result.stdout
    assert result.stderr.startswith("recalltrace: error: cannot reach the database")


def test_unsupported_url_is_a_clear_error() -> None:
    result = run_cli("db", "upgrade", "--database-url", "mysql://bob:pw-xyz@host/db")
    assert result.returncode == 2
    assert "unsupported database backend 'mysql'" in result.stderr
    assert "pw-xyz" not in result.stderr


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "recalltrace"
    assert script.exists(), "the recalltrace console script is not installed beside python"
    result = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert result.stdout.startswith("recalltrace ")


def test_db_prune_reports_then_deletes_old_traces(tmp_path: Path) -> None:
    from datetime import datetime, timedelta, timezone

    from recalltrace import open_repository
    from tests.support.factories import make_trace

    url = f"sqlite:///{tmp_path / 'prune.db'}"
    repo = open_repository(url)
    now = datetime.now(timezone.utc)
    repo.write_traces(
        [make_trace(started_at=now - timedelta(days=100)) for _ in range(3)]
        + [make_trace(started_at=now - timedelta(days=1))]
    )
    repo.dispose()
    dry = run_cli("db", "prune", "--older-than", "90d", "--database-url", url)
    assert dry.returncode == 0, dry.stderr
    assert "3 traces started before" in dry.stdout and "--yes" in dry.stdout
    real = run_cli("db", "prune", "--older-than", "90d", "--yes", "--database-url", url)
    assert real.returncode == 0, real.stderr
    assert "deleted 3 traces" in real.stdout
    again = run_cli("db", "prune", "--older-than", "90d", "--database-url", url)
    assert "0 traces" in again.stdout
    bad = run_cli("db", "prune", "--older-than", "ninety", "--database-url", url)
    assert bad.returncode == 2
    assert "ninety" in bad.stderr and "Traceback" not in bad.stderr


def test_recalltrace_metrics_limits_the_jobs_a_trace_gets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy import select

    from recalltrace import open_repository
    from recalltrace.storage.models import ScoringJob
    from tests.support.factories import make_trace

    url = f"sqlite:///{tmp_path / 'metrics.db'}"
    script = (
        "import recalltrace\n"
        "@recalltrace.rag\n"
        "def answer(question: str) -> str:\n"
        "    return 'fine'\n"
        "answer('hello')\n"
        "recalltrace.flush()\n"
    )
    env = {"RECALLTRACE_DATABASE_URL": url, "RECALLTRACE_METRICS": "id_based_context_recall"}
    result = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    repo = open_repository(url, metrics=["id_based_context_recall"])
    with repo.engine.connect() as conn:
        assert conn.scalars(select(ScoringJob.metric)).all() == ["id_based_context_recall"]
    repo.write_traces([make_trace()])
    repo.dispose()
    monkeypatch.setenv("RECALLTRACE_METRICS", "recall_at_k")
    with pytest.raises(ValueError, match="unknown metric 'recall_at_k'"):
        open_repository(url)


def test_worker_once_reports_an_unreachable_database_instead_of_waiting() -> None:
    url = "postgresql+psycopg://alice:hunter2-secret@127.0.0.1:1/nowhere"
    result = run_cli("worker", "--once", "--poll-interval", "0.2", "--database-url", url)
    assert result.returncode == 2
    assert "recalltrace: error: cannot reach the database" in result.stderr
    assert "Traceback" not in result.stderr
    assert "hunter2-secret" not in result.stdout + result.stderr


@pytest.mark.postgres
@pytest.mark.realsystem  # eleven processes at once
def test_concurrent_upgrades_of_a_fresh_database_all_succeed() -> None:
    """Eleven ``recalltrace db upgrade`` processes started at once on an empty database (a
    deployment whose replicas all run the upgrade): one migrates under the migration lock, the
    others wait for it and find the schema up to date. Every one exits 0, none prints a
    traceback, and the schema is at head."""
    from recalltrace.storage.migrate import current_revision, head_revision
    from tests.support.postgres import empty_database

    env = {k: v for k, v in os.environ.items() if k != "RECALLTRACE_DATABASE_URL"}
    with empty_database("rt_upgrade_race") as url:
        runners = [
            subprocess.Popen(
                [sys.executable, "-m", "recalltrace", "db", "upgrade", "--database-url", url],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for _ in range(11)
        ]
        results = [(*runner.communicate(timeout=300), runner.returncode) for runner in runners]
        for out, err, code in results:
            assert "Traceback" not in err, err
            assert code == 0, err
            assert "at revision" in out, out
        assert current_revision(url) == head_revision()


@pytest.mark.postgres
def test_upgrade_waits_a_bounded_time_for_another_upgrade_then_says_so() -> None:
    """Another process holds the migration lock (a long migration): ``db upgrade`` waits
    ``--wait`` seconds, then says so in one line, without a traceback, and exits 2."""
    from sqlalchemy import func, select

    from recalltrace.storage.db import create_engine_from_url
    from recalltrace.storage.migrate import MIGRATION_LOCK_KEY, current_revision
    from tests.support.postgres import empty_database

    with empty_database("rt_upgrade_locked") as url:
        engine = create_engine_from_url(url)
        try:
            with engine.begin() as conn:
                assert conn.scalar(select(func.pg_try_advisory_xact_lock(MIGRATION_LOCK_KEY)))
                blocked = run_cli("db", "upgrade", "--database-url", url, "--wait", "1")
            assert blocked.returncode == 2
            assert "Traceback" not in blocked.stderr
            assert blocked.stderr.count("\n") == 1, blocked.stderr
            assert "already being upgraded by another process" in blocked.stderr
            assert current_revision(url) is None
            # Once the lock is free, the same command migrates.
            done = run_cli("db", "upgrade", "--database-url", url, "--wait", "1")
            assert done.returncode == 0, done.stderr
        finally:
            engine.dispose()
    bad = run_cli("db", "upgrade", "--database-url", url, "--wait", "inf")
    assert bad.returncode == 2 and "--wait must be" in bad.stderr
