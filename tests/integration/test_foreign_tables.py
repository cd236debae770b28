"""recalltrace never adds its tables to a SQLite file holding another application's tables
unless told to (``RECALLTRACE_INTO_EXISTING=1``, or ``recalltrace db upgrade --into-existing``
once): the tracer says so in one WARNING line and counts the records it did not store, the
demo refuses in one line, and the file is left as it was."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from recalltrace.storage.migrate import INTO_EXISTING_ENV, ForeignTablesError, upgrade
from tests.support.cli import run_cli

PROGRAM = """
import sys
import recalltrace
from recalltrace import tracer

recalltrace.configure(database_url=sys.argv[1], sample_rate=1.0)


@tracer.rag
def answer(question: str) -> str:
    return "Refunds take a week."


for _ in range(3):
    answer("how do refunds work?")
recalltrace.shutdown(10)
ledger = recalltrace.ledger()
print(sorted(ledger.dropped.items()), sorted(ledger.other_dropped.items()))
"""


def _application_file(path: Path) -> Path:
    """A SQLite file of another application: one table, one row."""
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    connection.execute("INSERT INTO invoices VALUES (1, 9.5)")
    connection.commit()
    connection.close()
    return path


def _tables(path: Path) -> list[str]:
    connection = sqlite3.connect(path)
    try:
        return sorted(
            row[0]
            for row in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        )
    finally:
        connection.close()


def _run(program: Path, url: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLTRACE_")}
    env.update(extra)
    return subprocess.run(
        [sys.executable, str(program), url],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def program(tmp_path: Path) -> Path:
    path = tmp_path / "app_program.py"
    path.write_text(PROGRAM)
    return path


def test_the_tracer_refuses_another_application_s_file_in_one_warning(
    tmp_path: Path, program: Path
) -> None:
    file = _application_file(tmp_path / "app.db")
    done = _run(program, f"sqlite:///{file}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[('storage_error', 3)] []"
    refusals = [line for line in done.stderr.splitlines() if "another application" in line]
    assert refusals == [
        f"recalltrace writer: sqlite:///{file} holds another application's tables (invoices) "
        "and no recalltrace schema: recalltrace does not add its tables to it unasked; give "
        f"recalltrace a database file of its own, or allow it with {INTO_EXISTING_ENV}=1 (or "
        "once: `recalltrace db upgrade --into-existing`); the trace records are not stored "
        "(counted as dropped, storage_error)"
    ], done.stderr
    assert "Traceback" not in done.stderr
    assert _tables(file) == ["invoices"]


def test_the_environment_variable_lets_the_tracer_add_its_tables(
    tmp_path: Path, program: Path
) -> None:
    file = _application_file(tmp_path / "app.db")
    done = _run(program, f"sqlite:///{file}", **{INTO_EXISTING_ENV: "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] []", done.stderr
    assert "invoices" in _tables(file) and "traces" in _tables(file)
    connection = sqlite3.connect(file)
    try:
        assert connection.execute("SELECT count(*) FROM traces").fetchone() == (3,)
        assert connection.execute("SELECT total FROM invoices").fetchone() == (9.5,)
    finally:
        connection.close()


def test_the_demo_refuses_another_application_s_file_in_one_line(tmp_path: Path) -> None:
    file = _application_file(tmp_path / "app.db")
    done = run_cli("demo", "--database-url", f"sqlite:///{file}", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "another application's tables (invoices)" in (
        done.stderr
    ), done.stderr
    assert f"{INTO_EXISTING_ENV}=1" in done.stderr
    assert _tables(file) == ["invoices"]


def test_storage_upgrade_refuses_unless_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(INTO_EXISTING_ENV, raising=False)
    file = _application_file(tmp_path / "app.db")
    with pytest.raises(ForeignTablesError, match=r"another application's tables \(invoices\)"):
        upgrade(f"sqlite:///{file}")
    assert _tables(file) == ["invoices"]
    upgrade(f"sqlite:///{file}", into_existing=True)
    assert "traces" in _tables(file)
    # Once recalltrace's tables are there, later upgrades go on without being told again.
    upgrade(f"sqlite:///{file}")


def test_an_empty_file_and_a_new_one_are_created_as_before(tmp_path: Path) -> None:
    (tmp_path / "empty.db").write_bytes(b"")
    for name in ("empty.db", "new.db"):
        upgrade(f"sqlite:///{tmp_path / name}")
        assert "traces" in _tables(tmp_path / name)
