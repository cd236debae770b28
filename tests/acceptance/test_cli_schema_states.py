"""Each state a database's schema can be in, as the command line says it: at an older revision
(every command names ``recalltrace db upgrade --database-url ...``), at a revision this version
does not know (a newer recalltrace migrated it: reads say so once on stderr, writes and
``db upgrade`` refuse in one line, ``db current`` says newer), and ``db upgrade --revision``
given something that is not a revision (one line naming the known ones)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from recalltrace.storage.db import create_engine_from_url
from recalltrace.storage.migrate import (
    current_revision,
    head_revision,
    is_known_revision,
    schema_state,
    shipped_revisions,
    upgrade,
)
from tests.support.cli import run_cli
from tests.support.databases import copied_postgres_database, migrated_sqlite

OLDER = "0004"
NEWER = "0099"
TRACE_ID = "0709543d8c0c427cb63000a4351ea4f9"

READS = [
    ("scores", "summary"),
    ("scores", "worst"),
    ("scores", "compare", "--metric", "id_based_context_recall", "--by", "tag"),
    ("scores", "diagnose", "--metric", "id_based_context_recall"),
    ("scores", "cost"),
    ("scores", "agreement", "--metric", "id_based_context_recall"),
    ("scores", "plot", "--out", "chart.svg"),
    ("trace", "show", TRACE_ID),
    ("check", "--metric", "id_based_context_recall", "--min", "0.1"),
    ("doctor",),
    ("jobs", "list"),
    ("jobs", "counts"),
    ("db", "prune", "--older-than", "30d"),
]


def _set_revision(url: str, revision: str) -> None:
    engine = create_engine_from_url(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE recalltrace_alembic_version SET version_num = :r"), {"r": revision}
            )
    finally:
        engine.dispose()


def test_the_shipped_revisions_are_alembic_s() -> None:
    revisions = shipped_revisions()
    assert revisions[-1] == head_revision()
    assert all(is_known_revision(revision) for revision in revisions)
    assert list(revisions) == sorted(revisions) and revisions[0] == "0001"


@pytest.fixture
def older(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'older.db'}"
    upgrade(url, OLDER)
    return url


@pytest.mark.parametrize("command", READS, ids=lambda c: " ".join(c[:2]))
def test_an_older_schema_names_db_upgrade(
    older: str, command: tuple[str, ...], tmp_path: Path
) -> None:
    done = run_cli(*command, "--database-url", older, cwd=tmp_path)
    assert done.returncode == 2, done.stdout
    assert done.stderr == (
        f"recalltrace: error: {older} is at schema revision {OLDER}, behind this recalltrace's "
        f"{head_revision()}: run `recalltrace db upgrade --database-url {older}` first\n"
    )
    assert done.stdout == ""


def test_db_upgrade_takes_the_older_schema_to_head_and_the_reads_work(older: str) -> None:
    assert run_cli("db", "current", "--database-url", older).stdout.endswith(
        f"({'behind head ' + head_revision()}: run `recalltrace db upgrade`)\n"
    )
    done = run_cli("db", "upgrade", "--database-url", older)
    assert done.returncode == 0, done.stderr
    shown = run_cli("scores", "summary", "--database-url", older)
    assert shown.returncode == 0 and shown.stderr == "", shown.stderr


@pytest.fixture(params=["sqlite", "postgres"])
def newer(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        url = migrated_sqlite(tmp_path / "newer.db")
        _set_revision(url, NEWER)
        yield url
        return
    request.getfixturevalue("postgres_url")  # skips (or fails under CI) without Postgres
    with copied_postgres_database(f"rt_newer_{uuid.uuid4().hex[:10]}") as url:
        _set_revision(url, NEWER)
        yield url


def _newer_line(url: str) -> str:
    return (
        f"{url} is at schema revision {NEWER}, newer than this recalltrace knows (its newest "
        f"is {head_revision()})"
    )


@pytest.mark.parametrize("command", READS, ids=lambda c: " ".join(c[:2]))
def test_a_newer_schema_is_read_with_one_warning_line(
    newer: str, command: tuple[str, ...], tmp_path: Path
) -> None:
    done = run_cli(*command, "--database-url", newer, cwd=tmp_path)
    assert "Traceback" not in done.stderr, done.stderr
    warning = (
        f"recalltrace: warning: {_newer_line(newer)}: results may be incomplete; upgrade "
        "recalltrace to read everything it stores\n"
    )
    assert done.stderr.startswith(warning), done.stderr
    assert done.stderr.count("newer than this recalltrace") == 1
    # What the command says of an empty database follows, as at head (trace show: not found;
    # check: too few traces).
    expected = 1 if command[0] in ("check",) else 2 if command[0] == "trace" else 0
    assert done.returncode == expected, done.stderr


def test_db_upgrade_and_current_on_a_newer_schema(newer: str) -> None:
    upgraded = run_cli("db", "upgrade", "--database-url", newer)
    assert upgraded.returncode == 2
    assert upgraded.stderr == (
        f"recalltrace: error: {_newer_line(newer)}: a newer recalltrace migrated it; upgrade "
        "recalltrace to use it (this one cannot downgrade it)\n"
    )
    assert current_revision(newer) == NEWER  # left as it was
    current = run_cli("db", "current", "--database-url", newer)
    assert current.returncode == 1
    assert current.stdout == (
        f"{newer}: at revision {NEWER} (newer than this recalltrace, whose newest is "
        f"{head_revision()}: a newer recalltrace migrated it; upgrade recalltrace)\n"
    )
    engine = create_engine_from_url(newer)
    try:
        assert schema_state(engine).state == "newer"
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    "command", [("jobs", "cancel", "--all"), ("db", "prune", "--older-than", "30d", "--yes")]
)
def test_a_write_on_a_newer_schema_is_refused(newer: str, command: tuple[str, ...]) -> None:
    done = run_cli(*command, "--database-url", newer)
    assert done.returncode == 2
    assert done.stderr == (
        f"recalltrace: error: {_newer_line(newer)}: {' '.join(command[:2])} would write to a "
        "schema it does not know; upgrade recalltrace (or use the version that migrated the "
        "database)\n"
    )


@pytest.mark.parametrize("revision", ["", "zz", "0099", "heads"])
def test_db_upgrade_names_the_known_revisions(tmp_path: Path, revision: str) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    done = run_cli("db", "upgrade", "--database-url", url, "--revision", revision)
    assert done.returncode == 2
    known = ", ".join(shipped_revisions())
    assert done.stderr == (
        f"recalltrace: error: --revision {revision!r} is not a revision of this recalltrace: "
        f"give head (the newest, {head_revision()}) or one of {known}\n"
    )
    assert not (tmp_path / "new.db").exists()


def test_db_upgrade_to_a_revision_behind_the_database_refuses(older: str) -> None:
    done = run_cli("db", "upgrade", "--database-url", older, "--revision", "0002")
    assert done.returncode == 2
    assert done.stderr == (
        f"recalltrace: error: {older} is at schema revision {OLDER}, past --revision 0002: "
        "db upgrade never goes back\n"
    )
    reached = run_cli("db", "upgrade", "--database-url", older, "--revision", "0006")
    assert reached.returncode == 0, reached.stderr
    assert current_revision(older) == "0006"
