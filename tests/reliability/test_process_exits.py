"""Requests answered in processes that end without any exit path are stored, or said lost.

Each case runs a real program in a subprocess with a run directory of its own
(``RECALLTRACE_RUN_DIR``), reads the answers it wrote (token, record id, pid), then attaches
each token as the late reference of its record id from a separate configured process, and
checks the rows: every answered request is its own stored row with its own reference, or a
drop or loss a tracer process said (storage being up, none is expected).

- ``os.fork()`` children ending with ``os._exit(0)`` (no flush, no ``atexit``, no
  multiprocessing finalizer), configured in the parent (``exit_program.py``);
- a script ending with ``os._exit(0)`` after its requests (``exit_program.py``);
- ``spawn`` and ``forkserver`` pools of a program that configures the tracer with the database
  URL only under ``if __name__ == "__main__":`` (``main_only_pool_program.py``): the children
  never run that ``configure()``. Their records belong where the parent's go, and no
  ``recalltrace.db`` may appear in the working directory.
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from recalltrace.storage.db import create_engine_from_url
from tests.support.answers import Answer, check, kill_group, read_answer_files, traced_env

# The real-system stage (processes ending every way).
pytestmark = pytest.mark.realsystem

HERE = Path(__file__).parent
EXIT_PROGRAM = HERE / "exit_program.py"
POOL_PROGRAM = HERE / "main_only_pool_program.py"


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest) -> Iterator[tuple[str, Engine]]:
    """(url, engine) of a fresh migrated database on each backend."""
    if request.param == "sqlite":
        url = str(request.getfixturevalue("sqlite_url"))
        engine = create_engine_from_url(url)
        try:
            yield url, engine
        finally:
            engine.dispose()
        return
    yield str(request.getfixturevalue("postgres_url")), request.getfixturevalue("pg_engine")


def run(
    tmp_path: Path, program: Path, *args: str
) -> tuple[list[Answer], str, dict[str, str], Path]:
    """Run ``program`` in a working directory of its own; its answers, its stderr, the
    environment it ran with and that directory."""
    out, work = tmp_path / "answers", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    env = traced_env(tmp_path)
    process = subprocess.Popen(
        [sys.executable, str(program), *args, str(out)],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, stderr = process.communicate(timeout=180)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{program.name} {args} did not end within 180 s") from exc
    finally:
        kill_group(process)  # children it left behind
    assert process.returncode == 0, stderr[-3000:]
    return read_answer_files(out), stderr, env, work


def rows_in(folder: Path) -> str:
    """How many traces a ``recalltrace.db`` left in ``folder`` holds, said for a message."""
    path = folder / "recalltrace.db"
    if not path.exists():
        return ""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
            return f" ({conn.execute('SELECT count(*) FROM traces').fetchone()[0]} traces in it)"
    except sqlite3.Error as exc:
        return f" ({exc})"


def assert_all_stored(
    engine: Engine,
    url: str,
    answers: list[Answer],
    stderr: str,
    env: dict[str, str],
    more: tuple[str, ...] = (),
) -> None:
    outcome, references = check(engine, url, answers, stderr, env)
    problems = [*outcome.storage_up_problems(), *more]
    assert not problems, outcome.report(problems, stderr, references)


def test_forked_children_ending_with_os_exit(tmp_path: Path, database: tuple[str, Engine]) -> None:
    url, engine = database
    answers, stderr, env, _ = run(tmp_path, EXIT_PROGRAM, url, "fork-children")
    assert len(answers) == 400
    assert_all_stored(engine, url, answers, stderr, env)


def test_script_ending_with_os_exit(tmp_path: Path, database: tuple[str, Engine]) -> None:
    url, engine = database
    answers, stderr, env, _ = run(tmp_path, EXIT_PROGRAM, url, "exit-script")
    assert len(answers) == 500
    assert_all_stored(engine, url, answers, stderr, env)


@pytest.mark.parametrize("scenario", ["with", "close-join"])
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_pool_children_of_a_program_configured_under_main(
    tmp_path: Path, pg_engine: Engine, postgres_url: str, method: str, scenario: str
) -> None:
    answers, stderr, env, work = run(tmp_path, POOL_PROGRAM, postgres_url, method, scenario)
    assert len(answers) == 200
    strays = sorted(path.name for path in work.iterdir())
    wrote = ()
    if strays:
        wrote = (f"the children wrote {strays} in the working directory{rows_in(work)}",)
    assert_all_stored(pg_engine, postgres_url, answers, stderr, env, wrote)
