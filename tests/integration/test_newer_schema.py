"""A SQLite file migrated by a newer recalltrace: the tracer stores into it as it stands (as it
does on a Postgres it never migrates), said in one line, where it dropped every record with an
Alembic "Can't locate revision" error; a worker refuses it in one line naming the cause."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import text

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import VERSION_TABLE, upgrade
from tests.support.cli import run_cli

PROGRAM = """
import sys
import recalltrace
recalltrace.configure(database_url=sys.argv[1], sample_rate=1.0)

@recalltrace.rag("newer-app")
def answer(question):
    return "ok"

for index in range(3):
    answer(f"question {index}")
assert recalltrace.flush(60)
recalltrace.shutdown(60)
"""


def _newer_database(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'newer.db'}"
    upgrade(url)
    engine = create_engine_from_url(url)
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '0999'"))
    engine.dispose()
    return url


def _traces(url: str) -> int:
    engine = create_engine_from_url(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM traces")).scalar_one())
    finally:
        engine.dispose()


def test_the_tracer_stores_into_a_newer_schema_and_says_so_once(tmp_path: Path) -> None:
    url = _newer_database(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, url],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert _traces(url) == 3, done.stderr
    said = [line for line in done.stderr.splitlines() if "newer than this recalltrace" in line]
    assert len(said) == 1, done.stderr
    assert "revision 0999" in said[0]
    assert "Can't locate revision" not in done.stderr and "dropped" not in done.stderr


def test_a_worker_refuses_a_newer_schema_in_one_line(tmp_path: Path) -> None:
    url = _newer_database(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "RECALLTRACE_DATABASE_URL"}
    done = run_cli("worker", "--once", "--database-url", url, env=env)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "newer than this recalltrace" in lines[0], done.stderr
    assert "Traceback" not in done.stderr
